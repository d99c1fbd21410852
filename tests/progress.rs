//! Training progress read from a real job's output: a job that prints a
//! Lightning-style bar with `\r` updates (and a validation phase that holds
//! on to memory) is stopped by `--budget`; the stop must name the step, epoch
//! and phase the job was really at, which the job records in its signal
//! handler.

use crate::common;

use std::fs;
use std::process::Stdio;

use common::{MemCgroup, read_log, schema};

const JOB: &str = r#"
import json, signal, sys, time
out = sys.argv[1]
state = {"epoch": 0, "step": 0, "phase": "train"}
def on_term(sig, frame):
    with open(out, "w") as f:
        json.dump(state, f)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
hog = []
TOTAL = 400
for epoch in range(1, 50):
    state["epoch"] = epoch
    for step in range(1, TOTAL + 1):
        # The bar names a step before the step's memory is taken: the
        # step the job is at when memory crosses is one it printed.
        state.update(step=step, phase="train")
        sys.stderr.write(f"\rEpoch {epoch}: {100 * step // TOTAL:3d}%|###       | {step}/{TOTAL} [00:01<00:02, 50.00it/s, loss=0.1]")
        sys.stderr.flush()
        hog.append(b"t" * (1 << 20))
        if step % 10 == 0:
            print(f"INFO step done, loss=0.{step}", flush=True)
        time.sleep(0.01)
        if step % 60 == 0:
            sys.stderr.write("\n")
            # Validation keeps its predictions: 4 MiB a batch.
            for v in range(1, 41):
                state.update(step=v, phase="validation")
                sys.stderr.write(f"\rValidation DataLoader 0: {100 * v // 40:3d}%|##        | {v}/40 [00:00<00:01, 40.00it/s]")
                sys.stderr.flush()
                hog.append(b"v" * (4 << 20))
                time.sleep(0.02)
            sys.stderr.write("\n")
"#;

#[test]
fn serial_the_stop_names_the_step_epoch_and_phase_the_job_was_at() {
    let _serial = common::serial();
    let Some(cg) = MemCgroup::or_skip("progress", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.py");
    fs::write(&job, JOB).unwrap();
    let state = dir.path().join("state.json");
    let log = dir.path().join("run.ndjson");
    let out = cg
        .command(
            std::path::Path::new(env!("CARGO_BIN_EXE_oomguard")),
            &[
                "run",
                "--log",
                log.to_str().unwrap(),
                "--budget",
                "320MiB",
                "--",
                "python3",
                job.to_str().unwrap(),
                state.to_str().unwrap(),
            ],
        )
        // The stop's end record goes beside the job, not into the checkout.
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "stderr:\n{err}");
    let lines = read_log(&log);
    schema::check_envelope(&lines);

    let real: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&state).expect("the job recorded its state"))
            .unwrap();
    let stop = lines
        .iter()
        .find(|l| matches!(&l.event, schema::Event::Action(a) if a.action == "stop"))
        .expect("a stop action");
    let p = stop.progress.as_ref().expect("the stop carries progress");
    let real_step = real["step"].as_u64().unwrap();
    let step = p.step.unwrap();
    let tolerance = (real_step / 50).max(5);
    assert!(
        step.abs_diff(real_step) <= tolerance,
        "logged step {step}, the job was at {real_step}"
    );
    assert_eq!(
        p.epoch.as_deref(),
        real["epoch"].as_u64().map(|e| e.to_string()).as_deref()
    );
    assert_eq!(
        p.phase.as_deref(),
        real["phase"].as_str(),
        "{p:?} vs {real}"
    );
    // The budget is only reached while validation holds its predictions.
    assert_eq!(p.phase.as_deref(), Some("validation"));
    assert_eq!(p.total, Some(40));

    // run_end carries it too, and samples carried it when it moved.
    let end = lines.last().unwrap();
    assert!(end.progress.is_some());
    let with = lines
        .iter()
        .filter(|l| l.progress.is_some() && matches!(l.event, schema::Event::Sample(_)))
        .count();
    assert!(with >= 2, "{with} samples carry progress");
    // Training grew memory ~1 MiB per step; it was measured.
    let per_step = lines
        .iter()
        .filter_map(|l| l.progress.as_ref().and_then(|p| p.bytes_per_step))
        .next_back();
    assert!(
        per_step.is_some_and(|b| (512 << 10..4 << 20).contains(&b)),
        "bytes per step {per_step:?}"
    );
    // The summary says where it stopped.
    let epoch = p.epoch.clone().unwrap();
    assert!(
        err.contains(&format!("stopped at epoch {epoch}, validation step ")),
        "stderr:\n{err}"
    );
}

const DYING_WORKER: &str = r#"
import os, sys, time
if os.environ.get("OOMGUARD_ATTEMPT") == "2":
    print("resumed", flush=True)
    sys.exit(0)
hog = []
for step in range(1, 40):
    if step <= 17:
        hog.append(b"x" * (10 << 20))
    sys.stderr.write(f"step {step}/100\n")
    time.sleep(0.2 if step <= 17 else 0.05)
sys.stderr.write("RuntimeError: DataLoader worker (pid 4321) is killed by signal: Killed.\n")
sys.stderr.write("RuntimeError: DataLoader worker (pid(s) 4321) exited unexpectedly\n")
sys.stderr.flush()
time.sleep(0.3)
sys.exit(1)
"#;

#[test]
fn serial_a_worker_sigkilled_at_the_warn_level_restarts_the_job() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("workerkill", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.py");
    fs::write(&job, DYING_WORKER).unwrap();
    let log = dir.path().join("run.ndjson");
    let out = cg
        .command(
            std::path::Path::new(env!("CARGO_BIN_EXE_oomguard")),
            &[
                "run",
                "--log",
                log.to_str().unwrap(),
                "--budget",
                "1000MiB",
                "--warn-at",
                "15%",
                "--on-critical",
                "restart",
                "--restart-delay",
                "100ms",
                "--",
                "python3",
                job.to_str().unwrap(),
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let deaths: Vec<_> = lines
        .iter()
        .filter(|l| matches!(l.event, schema::Event::WorkerDied(_)))
        .collect();
    // Two lines, one death.
    assert_eq!(deaths.len(), 1, "stderr:\n{err}");
    assert_eq!(deaths[0].progress.as_ref().and_then(|p| p.step), Some(39));
    let restart = lines
        .iter()
        .find_map(|l| match &l.event {
            schema::Event::Restart(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no restart; stderr:\n{err}"));
    assert!(
        restart["reason"].as_str().unwrap_or("").contains("SIGKILL"),
        "{restart}"
    );
    assert_eq!(out.status.code(), Some(0), "stderr:\n{err}");
}
