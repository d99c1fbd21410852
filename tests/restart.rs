//! Restarting from checkpoints with degradation, against real processes
//! and the real kernel OOM killer in small memory cgroups.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::schema::{self, Event};
use common::*;

fn train_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jobs/train.py")
        .display()
        .to_string()
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_oomguard"))
}

/// The restart events, with the envelope's attempt (the attempt each one
/// starts) put back as `attempt`.
fn restarts(lines: &[schema::Line]) -> Vec<serde_json::Value> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Restart(v) => {
                let mut v = v.clone();
                v["attempt"] = l.attempt.into();
                Some(v)
            }
            _ => None,
        })
        .collect()
}

fn newest_step(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let n = e.file_name().into_string().ok()?;
                    n.strip_prefix("step-")?.strip_suffix(".ckpt")?.parse().ok()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// The job of the issue: checkpoints every 25 steps, resumes from the newest
/// one, and its workers copy a shared dataset page by page as they serve
/// batches (copy-on-read), so memory grows with NUM_WORKERS × steps.
fn cow_job(ckpt: &Path, steps: u32) -> Vec<String> {
    [
        "python3",
        &train_py(),
        "--steps",
        &steps.to_string(),
        "--cow-dataset-mib",
        "200",
        "--period",
        "0.01",
        "--ckpt-every",
        "25",
        "--ckpt-dir",
        &ckpt.display().to_string(),
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

#[test]
fn serial_restart_with_fewer_workers_completes_what_the_kernel_would_kill() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("restart", 768 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Without oomguard: the kernel OOM killer ends it.
    let bare_ckpt = dir.path().join("bare");
    let job = cow_job(&bare_ckpt, 900);
    let watch = OomWatch::start(&cg);
    let st = cg
        .command(
            Path::new(&job[0]),
            &job[1..].iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .env("NUM_WORKERS", "4")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_ne!(st.code(), Some(0), "the bare job should not survive");
    // The bare job runs in the test cgroup itself, where its kills count;
    // the watch also covers any cgroup below it.
    assert!(watch.kills() > 0, "the kernel never killed the bare job");
    cg.kill_all();
    drop(cg);

    let cg = MemCgroup::new("restart2", 768 << 20).unwrap();
    let ckpt = dir.path().join("ckpt");
    let log = dir.path().join("run.ndjson");
    let mut cmd = cg.command(
        bin(),
        &[
            "run",
            "--on-critical",
            "restart",
            "--restart-delay",
            "200ms",
        ],
    );
    cmd.arg("--checkpoint-dir")
        .arg(&ckpt)
        .args(["--checkpoint-glob", "step-*.ckpt"]);
    cmd.args(["--degrade", "NUM_WORKERS=half,min=1", "--log"])
        .arg(&log)
        .arg("--");
    cmd.args(cow_job(&ckpt, 900))
        .env("NUM_WORKERS", "4")
        .stdout(Stdio::piped());
    let watch = OomWatch::start(&cg);
    let out = cmd.output().unwrap();
    let kills = watch.kills();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("done at step 900"), "{stdout}");
    assert_eq!(newest_step(&ckpt), 900);
    assert_eq!(kills, 0, "the kernel killed something in the job's cgroup");
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let rs = restarts(&lines);
    assert!(!rs.is_empty(), "no restart");
    assert_eq!(
        rs[0]["degraded"]["NUM_WORKERS"],
        serde_json::json!(["4", "2"])
    );
    assert!(
        rs[0]["checkpoint"].as_str().unwrap().contains("step-"),
        "{}",
        rs[0]
    );
    assert!(
        lines
            .iter()
            .filter_map(|l| l.sample())
            .all(|s| s.cgroup.as_ref().unwrap().oom_kill_count == Some(0))
    );
    let end = schema::run_end(&lines);
    assert_eq!(
        (end.outcome.as_str(), end.restarts as usize),
        ("exited", rs.len())
    );
    // Every line after a restart carries the new attempt number.
    assert_eq!(lines.last().unwrap().attempt as usize, rs.len() + 1);
    // Attempt 2 resumed where attempt 1 checkpointed.
    assert!(
        stdout.contains("start at step 0 with 4 workers (attempt 1)"),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("start at step")
            && l.contains("with 2 workers (attempt 2)")
            && !l.contains("step 0 ")),
        "{stdout}"
    );
}

#[test]
fn serial_restart_after_a_real_kernel_oom_kill_of_a_worker() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("killed", 512 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let log = dir.path().join("run.ndjson");
    // No policy acts: the kernel kills a worker, the trainer fails, and
    // oomguard restarts it because --restart-on oom-kill.
    let mut cmd = cg.command(
        bin(),
        &["run", "--policy", "none", "--restart-on", "oom-kill"],
    );
    cmd.args(["--restart-delay", "100ms", "--checkpoint-dir"])
        .arg(&ckpt);
    cmd.args(["--degrade", "NUM_WORKERS=half", "--log"])
        .arg(&log)
        .arg("--");
    cmd.args(cow_job(&ckpt, 600))
        .env("NUM_WORKERS", "4")
        .stdout(Stdio::piped());
    // On cgroup v1 a kill counts only in the victim's own cgroup: oomguard's
    // `oomguard-<pid>` child, never the test cgroup above it.
    let watch = OomWatch::start(&cg);
    let out = cmd.output().unwrap();
    let kills = watch.kills();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(kills > 0, "the kernel killed nothing in the job's cgroup");
    let lines = read_log(&log);
    assert!(
        lines.iter().filter_map(|l| l.sample()).any(|s| s
            .cgroup
            .as_ref()
            .unwrap()
            .oom_kill_count
            .unwrap_or(0)
            > 0),
        "the samples' cgroup.oom_kill_count never rose"
    );
    let rs = restarts(&lines);
    assert!(!rs.is_empty());
    assert_eq!(rs[0]["reason"], "kernel OOM kill");
    let kill = common::first_oom_kill(&lines).expect("an oom_kill event");
    common::assert_from_the_kernels_report(&kill);
    assert!(stdout.contains("done at step 600"), "{stdout}");
}

#[test]
fn restart_limit_backoff_and_degradation_floors() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("limit", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let mut cmd = cg.command(
        bin(),
        &["run", "-q", "--budget", "96MiB", "--on-critical", "restart"],
    );
    cmd.args([
        "--max-restarts",
        "3",
        "--restart-delay",
        "100ms",
        "--grace",
        "2s",
    ]);
    cmd.args([
        "--degrade",
        "NUM_WORKERS=half,min=1",
        "--degrade",
        "BATCH=dec,min=30",
        "--degrade",
        "MODE=safe",
    ]);
    cmd.arg("--log").arg(&log).arg("--");
    cmd.args([
        "python3",
        &train_py(),
        "--leak-in",
        "trainer",
        "--chunk-mib",
        "2",
        "--period",
        "0.02",
    ]);
    cmd.env("NUM_WORKERS", "4")
        .env("BATCH", "31")
        .env_remove("MODE")
        .stdout(Stdio::null());
    let st = cmd.status().unwrap();
    assert_eq!(st.code(), Some(75));
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let end = schema::run_end(&lines);
    assert_eq!((end.outcome.as_str(), end.restarts), ("restart_limit", 3));
    let rs = restarts(&lines);
    let delays: Vec<f64> = rs
        .iter()
        .map(|r| r["delay_seconds"].as_f64().unwrap())
        .collect();
    assert_eq!(delays, [0.1, 0.2, 0.4]);
    let workers: Vec<&serde_json::Value> =
        rs.iter().map(|r| &r["degraded"]["NUM_WORKERS"]).collect();
    assert_eq!(
        workers,
        [
            &serde_json::json!(["4", "2"]),
            &serde_json::json!(["2", "1"]),
            &serde_json::json!(["1", "1"])
        ]
    );
    assert_eq!(rs[2]["degraded"]["BATCH"], serde_json::json!(["30", "30"]));
    assert_eq!(rs[0]["degraded"]["MODE"], serde_json::json!([null, "safe"]));
    let attempts: Vec<u32> = rs
        .iter()
        .map(|r| r["attempt"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(attempts, [2, 3, 4]);
}

#[test]
fn a_long_clean_attempt_resets_the_restart_count() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("reset", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let mut cmd = cg.command(
        bin(),
        &["run", "-q", "--budget", "96MiB", "--on-critical", "restart"],
    );
    cmd.args([
        "--max-restarts",
        "1",
        "--restart-delay",
        "100ms",
        "--restart-reset",
        "500ms",
    ]);
    cmd.arg("--log").arg(&log).arg("--");
    // Each attempt runs > 0.5 s before it needs a restart; attempt 4 is clean.
    cmd.args([
        "python3",
        &train_py(),
        "--leak-in",
        "trainer",
        "--chunk-mib",
        "0.5",
        "--period",
        "0.01",
    ]);
    cmd.args(["--leak-attempts", "3", "--steps", "400"])
        .env("NUM_WORKERS", "0")
        .stdout(Stdio::null());
    let st = cmd.status().unwrap();
    let lines = read_log(&log);
    assert_eq!(st.code(), Some(0), "{:?}", schema::run_end(&lines));
    assert_eq!(
        restarts(&lines).len(),
        3,
        "max-restarts 1, but each long attempt reset the count"
    );
}

#[test]
fn resume_command_gets_the_checkpoint_and_the_environment() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("resume", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck pt");
    let out = dir.path().join("resumed.txt");
    let resume = format!(
        "printf '%s\\n' {{checkpoint}} > '{}'; env | grep ^OOMGUARD_ | sort >> '{}'",
        out.display(),
        out.display()
    );
    let mut cmd = cg.command(
        bin(),
        &["run", "-q", "--budget", "96MiB", "--on-critical", "restart"],
    );
    cmd.args(["--restart-delay", "100ms", "--checkpoint-dir"])
        .arg(&ckpt);
    cmd.args(["--resume-cmd", &resume, "--"]);
    cmd.args([
        "python3",
        &train_py(),
        "--leak-in",
        "trainer",
        "--chunk-mib",
        "2",
        "--period",
        "0.02",
    ]);
    cmd.args(["--ckpt-every", "5", "--ckpt-dir"])
        .arg(&ckpt)
        .env("NUM_WORKERS", "0")
        .stdout(Stdio::null());
    assert_eq!(cmd.status().unwrap().code(), Some(0));
    let text = fs::read_to_string(&out).unwrap();
    let first = text.lines().next().unwrap();
    let step = newest_step(&ckpt);
    let want: PathBuf = ckpt.join(format!("step-{step}.ckpt"));
    assert_eq!(first, want.display().to_string(), "{text}");
    assert!(text.contains("OOMGUARD_ATTEMPT=2"), "{text}");
    assert!(
        text.contains(&format!("OOMGUARD_CHECKPOINT={}", want.display())),
        "{text}"
    );
}

#[test]
fn checkpoint_confirmation_waits_for_a_slow_writer() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("slowckpt", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let log = dir.path().join("run.ndjson");
    let mut cmd = cg.command(
        bin(),
        &[
            "run",
            "-q",
            "--budget",
            "128MiB",
            "--grace",
            "20s",
            "--checkpoint-dir",
        ],
    );
    cmd.arg(&ckpt).arg("--log").arg(&log).arg("--");
    cmd.args([
        "python3",
        &train_py(),
        "--leak-in",
        "workers",
        "--chunk-mib",
        "1",
        "--period",
        "0.02",
    ]);
    cmd.args(["--ckpt-seconds", "3", "--ckpt-dir"])
        .arg(&ckpt)
        .env("NUM_WORKERS", "2")
        .stdout(Stdio::piped());
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(75));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("checkpoint saved at step"),
        "the trainer was cut off mid-write: {stdout}"
    );
    let lines = read_log(&log);
    let ck = lines
        .iter()
        .find_map(|l| match &l.event {
            Event::Checkpoint(v) => Some(v.clone()),
            _ => None,
        })
        .expect("checkpoint event");
    assert_eq!(ck["confirmed"], true, "{ck}");
    assert!(ck["waited_seconds"].as_f64().unwrap() >= 3.0, "{ck}");
    assert!(ck["path"].as_str().unwrap().ends_with(".ckpt"));
}

#[test]
fn no_checkpoint_is_reported_when_the_trainer_never_writes_one() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("nockpt", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    fs::create_dir(&ckpt).unwrap();
    let log = dir.path().join("run.ndjson");
    let mut cmd = cg.command(
        bin(),
        &[
            "run",
            "-q",
            "--budget",
            "128MiB",
            "--grace",
            "1s",
            "--kill-after",
            "1s",
        ],
    );
    cmd.arg("--checkpoint-dir")
        .arg(&ckpt)
        .arg("--log")
        .arg(&log)
        .arg("--");
    cmd.args([
        "python3",
        &train_py(),
        "--leak-in",
        "trainer",
        "--chunk-mib",
        "2",
        "--period",
        "0.02",
        "--ignore-signal",
    ]);
    cmd.env("NUM_WORKERS", "1").stdout(Stdio::null());
    assert_eq!(cmd.status().unwrap().code(), Some(75));
    let lines = read_log(&log);
    let ck = lines
        .iter()
        .find_map(|l| match &l.event {
            Event::Checkpoint(v) => Some(v.clone()),
            _ => None,
        })
        .expect("checkpoint event");
    assert_eq!(ck["confirmed"], false, "{ck}");
    assert!(ck["path"].is_null());
}

#[test]
fn restart_on_cuda_oom_adds_expandable_segments_when_fragmented() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch-errors");
    // A 2.x message where PyTorch held more reserved-but-unallocated memory
    // than the failed request: fragmentation.
    let frag = fs::read_dir(&fixture)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("08-torch2.2"))
        .unwrap();
    let text: String = fs::read_to_string(&frag)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("# source"))
        .map(|l| format!("{l}\n"))
        .collect();
    let msg = dir.path().join("oom.txt");
    fs::write(&msg, text).unwrap();
    let log = dir.path().join("run.ndjson");
    let script = format!(
        "if [ \"$OOMGUARD_ATTEMPT\" = 1 ]; then cat '{}' >&2; exit 1; fi; echo \"conf=$PYTORCH_CUDA_ALLOC_CONF\"",
        msg.display()
    );
    let out = oomguard()
        .args([
            "run",
            "-q",
            "--restart-on",
            "cuda-oom",
            "--restart-delay",
            "100ms",
            "--log",
        ])
        .arg(&log)
        .args(["--", "sh", "-c", &script])
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("conf=expandable_segments:True"));
    let lines = read_log(&log);
    assert!(lines.iter().any(|l| matches!(&l.event, Event::CudaOom(_))));
    let rs = restarts(&lines);
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0]["reason"], "CUDA out of memory");
    assert_eq!(
        rs[0]["degraded"]["PYTORCH_CUDA_ALLOC_CONF"],
        serde_json::json!([null, "expandable_segments:True"])
    );
}

/// An attempt that ends before the first `--procs-interval` (and where no
/// rule fires) still has its workers in the log, read twice, and in the
/// report: its early process list comes 10 s in, when a trainer has long
/// started them. Without it the report said "workers 0" for such attempts.
#[test]
fn a_short_attempt_still_shows_its_workers() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    // Attempt 1 leaks in the trainer (at most 400 MiB, so it is safe
    // outside a cgroup) and is restarted; attempt 2 (MODE=calm) holds its
    // two workers for 13 s and ends cleanly.
    let job = dir.path().join("job.py");
    fs::write(
        &job,
        r#"
import os, time, multiprocessing as mp
def work():
    time.sleep(30)
if __name__ == "__main__":
    ws = [mp.Process(target=work) for _ in range(int(os.environ["NUM_WORKERS"]))]
    for w in ws:
        w.start()
    if os.environ.get("MODE") != "calm":
        held = []
        while len(held) < 50:
            held.append(b"x" * (8 << 20))
            time.sleep(0.05)
    time.sleep(13)
    for w in ws:
        w.terminate()
"#,
    )
    .unwrap();
    let log = dir.path().join("run.ndjson");
    let st = oomguard()
        .args(["run", "-q", "--cgroup", "off", "--budget", "200MiB"])
        .args(["--on-critical", "restart", "--max-restarts", "1"])
        .args(["--restart-delay", "100ms", "--grace", "2s"])
        .args(["--degrade", "MODE=calm", "--log"])
        .arg(&log)
        .arg("--")
        .arg("python3")
        .arg(&job)
        .env("NUM_WORKERS", "2")
        .env_remove("MODE")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let second = lines
        .iter()
        .find(|l| l.attempt == 2)
        .expect("no second attempt")
        .t;
    let workers_at: Vec<f64> = lines
        .iter()
        .filter(|l| l.attempt == 2)
        .filter_map(|l| {
            let procs = l.sample()?.procs.as_ref()?;
            let n = procs.iter().filter(|p| p.role == "worker").count();
            (n == 2).then_some(l.t - second)
        })
        .collect();
    assert!(
        workers_at.iter().any(|&t| (10.0..13.0).contains(&t)),
        "attempt 2's workers were listed at {workers_at:?} s only"
    );
    let report = oomguard()
        .arg("report")
        .arg(&log)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let workers: Vec<u64> = v["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["max_workers"].as_u64().unwrap())
        .collect();
    assert_eq!(workers, [2, 2], "the report's workers per attempt");
}

/// One restart is one restart in the summary (as in `run_end.restarts`),
/// and the last attempt, ended by a `restart` with none left, says so.
#[test]
fn one_restart_reads_as_one_and_the_refused_one_as_the_limit() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    // Leaks in the trainer (at most 400 MiB, safe outside a cgroup) on
    // every attempt.
    let job = script(
        dir.path(),
        "job.py",
        r#"
import time
held = []
while len(held) < 50:
    held.append(b"x" * (8 << 20))
    time.sleep(0.05)
time.sleep(30)
"#,
    );
    let log = dir.path().join("run.ndjson");
    let out = oomguard()
        .args(["run", "--no-tui", "--cgroup", "off", "--budget", "200MiB"])
        .args(["--on-critical", "restart", "--max-restarts", "1"])
        .args(["--restart-delay", "100ms", "--grace", "2s", "--log"])
        .arg(&log)
        .arg("--")
        .arg("python3")
        .arg(&job)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(75), "{err}");
    let lines = read_log(&log);
    let end = schema::run_end(&lines);
    assert_eq!((end.outcome.as_str(), end.restarts), ("restart_limit", 1));
    // The log counts both `restart` decisions, as documented.
    assert_eq!(end.actions.get("restart").copied(), Some(2), "{err}");
    let actions = err
        .lines()
        .find(|l| l.starts_with("oomguard: actions: "))
        .unwrap_or_else(|| panic!("no actions line\n{err}"));
    assert!(actions.contains("restart ×1"), "{actions}");
    assert!(!actions.contains("restart ×2"), "{actions}");
    let last = err
        .lines()
        .find(|l| l.starts_with("oomguard: attempt 2: "))
        .unwrap_or_else(|| panic!("no line for attempt 2\n{err}"));
    assert!(
        last.contains("stopped by oomguard (critical-")
            && last.contains("; --max-restarts reached)"),
        "{last}"
    );
}
