//! `--torch-stats` end to end: real `python3` jobs with the injected
//! environment and the stub `torch` package from `tests/fixtures/stub-torch`.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use oomguard::engine::probe::torch_stats::{TorchDeviceStats, TorchStatsReader};
use oomguard::job::inject::TorchStatsInjector;

fn stub_torch() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stub-torch")
}

/// A job: `python3 script` with the injector's environment on top of a clean
/// one. `pythonpath` is what the job's PYTHONPATH would be without oomguard.
fn job(
    injector: Option<&TorchStatsInjector>,
    dir: &Path,
    script: &str,
    pythonpath: &[&Path],
    extra: &[(&str, &str)],
) -> Command {
    let script_path = dir.join("job.py");
    fs::write(&script_path, script).expect("write the job script");
    let existing = std::env::join_paths(pythonpath).expect("join PYTHONPATH");
    common::deadline::arm();
    let mut cmd = Command::new("python3");
    cmd.arg(&script_path)
        .current_dir(dir)
        .env_remove("PYTHONSTARTUP")
        .env_remove("PYTHONSAFEPATH")
        // Keep __pycache__ out of the stub package in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONPATH", &existing)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(injector) = injector {
        let existing = (!existing.is_empty()).then_some(existing.as_os_str());
        for (key, value) in injector.env(existing) {
            cmd.env(key, value);
        }
    }
    for (key, value) in extra {
        cmd.env(key, value);
    }
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `<tag> <pid>` lines a script printed.
fn printed_pids(output: &Output, tag: &str) -> Vec<u32> {
    text(&output.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(tag)?.trim().parse().ok())
        .collect()
}

/// One reader state of a pid: (device, allocated, reserved, max, retries).
type Snapshot = Vec<(u32, u64, u64, u64, u64)>;

/// Every distinct snapshot each pid had.
type Seen = HashMap<u32, BTreeSet<Snapshot>>;

/// Runs `cmd`, polling the reader while it runs, and returns the output and
/// every distinct (pid, devices) the reader held at some point.
fn run_and_watch(mut cmd: Command, reader: &mut TorchStatsReader) -> (Output, Seen) {
    let mut seen = Seen::new();
    let mut record = |reader: &TorchStatsReader| {
        for (pid, devices) in reader.latest() {
            let key = devices
                .iter()
                .map(|d: &TorchDeviceStats| {
                    (
                        d.device,
                        d.allocated_bytes,
                        d.reserved_bytes,
                        d.max_allocated_bytes,
                        d.alloc_retries,
                    )
                })
                .collect();
            seen.entry(*pid).or_default().insert(key);
        }
    };
    let mut child = cmd.spawn().expect("python3 starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        reader.poll().expect("poll");
        record(reader);
        if child.try_wait().expect("try_wait").is_some() || Instant::now() > deadline {
            break;
        }
        sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("job output");
    reader.poll().expect("poll");
    record(reader);
    (output, seen)
}

/// The trainer initialises "CUDA", forks a DataLoader-like worker, and
/// changes its figures once it has seen its own first reports (it reads the
/// stats file itself, so no timing is guessed). The worker lives through
/// several intervals.
const TRAINER: &str = r#"
import json, os, sys, time
import torch

stats_path = os.environ["OOMGUARD_TORCH_STATS"]

def wait_for(pred, what):
    deadline = time.time() + 20
    while time.time() < deadline:
        with open(stats_path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        if pred([l for l in lines if l["pid"] == os.getpid()]):
            return lines
        time.sleep(0.02)
    sys.exit("timed out waiting for " + what)

torch.cuda.init()
torch.cuda._stub_set(0, 1000, 5000, 3000, 2)
print("trainer", os.getpid(), flush=True)
child = os.fork()
if child == 0:
    print("worker", os.getpid(), flush=True)
    time.sleep(30)
    os._exit(0)

wait_for(lambda mine: any(r["devices"] and r["devices"][0]["allocated_bytes"] == 1000 for r in mine), "first figures")
torch.cuda._stub_set(0, 2000, 8000, 4000, 3)
torch.cuda._stub_set(1, 10, 20, 30, 0)
lines = wait_for(lambda mine: len([r for r in mine if len(r["devices"]) == 2]) >= 3, "second figures")
os.kill(child, 9)
os.waitpid(child, 0)
print("pids", sorted({l["pid"] for l in lines}), flush=True)
"#;

#[test]
fn the_trainer_reports_and_its_forked_worker_does_not() {
    let _machine = common::machine::beside();
    let tmp = tempfile::tempdir().expect("tempdir");
    let injector =
        TorchStatsInjector::new_in(tmp.path(), Duration::from_millis(100), None).expect("injector");
    let mut reader = injector.reader().expect("reader");
    let cmd = job(
        Some(&injector),
        tmp.path(),
        TRAINER,
        &[&stub_torch()],
        // A slow `import torch`: the reporter must wait for it to finish.
        &[("STUB_TORCH_IMPORT_DELAY", "0.3")],
    );
    let (output, seen) = run_and_watch(cmd, &mut reader);
    assert!(
        output.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    assert_eq!(text(&output.stderr), "", "the reporter printed nothing");
    let trainer = printed_pids(&output, "trainer ")[0];
    let worker = printed_pids(&output, "worker ")[0];
    assert_ne!(trainer, worker);

    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        vec![trainer],
        "only the trainer reported"
    );
    let trainer_seen = &seen[&trainer];
    assert!(
        trainer_seen.contains(&vec![(0, 1000, 5000, 3000, 2)]),
        "{trainer_seen:?}"
    );
    assert!(
        trainer_seen.contains(&vec![(0, 2000, 8000, 4000, 3), (1, 10, 20, 30, 0)]),
        "{trainer_seen:?}"
    );
    assert_eq!(
        reader.latest()[&trainer],
        vec![
            TorchDeviceStats {
                device: 0,
                allocated_bytes: 2000,
                reserved_bytes: 8000,
                max_allocated_bytes: 4000,
                alloc_retries: 3
            },
            TorchDeviceStats {
                device: 1,
                allocated_bytes: 10,
                reserved_bytes: 20,
                max_allocated_bytes: 30,
                alloc_retries: 0
            },
        ]
    );
    assert_eq!(reader.latest()[&trainer][0].fragmentation_bytes(), 6000);
    assert_eq!(reader.skipped_lines(), 0);
    assert!(
        reader.reported_at(trainer).is_some(),
        "reports carry a timestamp"
    );
    // The script read the whole file too: no line from the worker ever.
    assert!(
        text(&output.stdout).contains(&format!("pids [{trainer}]")),
        "{}",
        text(&output.stdout)
    );
}

#[test]
fn a_child_forked_before_cuda_init_reports_for_itself() {
    let _machine = common::machine::beside();
    // A fork-based launcher: the parent imports torch but never touches CUDA;
    // its child does. The child is a trainer and must be seen.
    let script = r#"
import os, time
import torch
child = os.fork()
if child == 0:
    torch.cuda.init()
    torch.cuda._stub_set(0, 77, 88, 99, 0)
    print("child", os.getpid(), flush=True)
    time.sleep(1.0)
    os._exit(0)
print("parent", os.getpid(), flush=True)
os.waitpid(child, 0)
"#;
    let tmp = tempfile::tempdir().expect("tempdir");
    let injector =
        TorchStatsInjector::new_in(tmp.path(), Duration::from_millis(100), None).expect("injector");
    let mut reader = injector.reader().expect("reader");
    let cmd = job(Some(&injector), tmp.path(), script, &[&stub_torch()], &[]);
    let (output, seen) = run_and_watch(cmd, &mut reader);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stderr), "");
    let child = printed_pids(&output, "child ")[0];
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![child]);
    assert_eq!(
        reader.latest()[&child],
        vec![TorchDeviceStats {
            device: 0,
            allocated_bytes: 77,
            reserved_bytes: 88,
            max_allocated_bytes: 99,
            alloc_retries: 0
        }]
    );
}

#[test]
fn a_job_without_torch_is_untouched() {
    let _machine = common::machine::beside();
    let script = r#"
import sys, threading, time
time.sleep(0.5)
print("threads", threading.active_count())
print("torch loaded", "torch" in sys.modules)
print("oomguard on sys.path", any("oomguard-torch" in p for p in sys.path))
"#;
    let tmp = tempfile::tempdir().expect("tempdir");
    let injector =
        TorchStatsInjector::new_in(tmp.path(), Duration::from_millis(50), None).expect("injector");
    let with = job(Some(&injector), tmp.path(), script, &[&stub_torch()], &[])
        .output()
        .expect("python3 runs");
    let without = job(None, tmp.path(), script, &[&stub_torch()], &[])
        .output()
        .expect("python3 runs");
    assert!(with.status.success(), "{}", text(&with.stderr));
    assert_eq!(
        text(&with.stdout),
        "threads 1\ntorch loaded False\noomguard on sys.path False\n"
    );
    assert_eq!(with.stdout, without.stdout);
    assert_eq!(text(&with.stderr), "");
    assert_eq!(
        fs::metadata(injector.stats_path()).expect("stats").len(),
        0,
        "no output at all"
    );
}

#[test]
fn an_existing_sitecustomize_still_runs() {
    let _machine = common::machine::beside();
    let tmp = tempfile::tempdir().expect("tempdir");
    let user_site = tmp.path().join("user-site");
    fs::create_dir(&user_site).expect("mkdir");
    fs::write(
        user_site.join("sitecustomize.py"),
        "import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n",
    )
    .expect("write sitecustomize");
    let script = r#"
import os, sys, time
import sitecustomize
print("user sitecustomize", os.environ.get("USER_SITECUSTOMIZE"))
print("module", os.path.basename(os.path.dirname(sitecustomize.__file__)))
import torch
torch.cuda.init()
torch.cuda._stub_set(1, 5, 6, 7, 8)
time.sleep(0.5)
"#;
    let injector =
        TorchStatsInjector::new_in(tmp.path(), Duration::from_millis(50), None).expect("injector");
    let mut reader = injector.reader().expect("reader");
    let output = job(
        Some(&injector),
        tmp.path(),
        script,
        &[&user_site, &stub_torch()],
        &[],
    )
    .output()
    .expect("python3 runs");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "user sitecustomize ran\nmodule user-site\n"
    );
    assert_eq!(text(&output.stderr), "");
    reader.poll().expect("poll");
    let reports: Vec<_> = reader.latest().values().cloned().collect();
    assert_eq!(
        reports,
        vec![vec![TorchDeviceStats {
            device: 1,
            allocated_bytes: 5,
            reserved_bytes: 6,
            max_allocated_bytes: 7,
            alloc_retries: 8
        }]],
        "the reporter works alongside it"
    );
}

#[test]
fn a_failing_sitecustomize_fails_as_it_would_without_oomguard() {
    let _machine = common::machine::beside();
    let tmp = tempfile::tempdir().expect("tempdir");
    let user_site = tmp.path().join("user-site");
    fs::create_dir(&user_site).expect("mkdir");
    fs::write(user_site.join("sitecustomize.py"), "1 / 0\n").expect("write sitecustomize");
    let script = "print('job ran')\n";
    let injector =
        TorchStatsInjector::new_in(tmp.path(), Duration::from_millis(50), None).expect("injector");
    let with = job(Some(&injector), tmp.path(), script, &[&user_site], &[])
        .output()
        .expect("python3 runs");
    let without = job(None, tmp.path(), script, &[&user_site], &[])
        .output()
        .expect("python3 runs");
    assert_eq!(with.status.code(), without.status.code());
    assert_eq!(text(&with.stdout), "job ran\n");
    assert!(
        text(&without.stderr).contains("Error in sitecustomize"),
        "{}",
        text(&without.stderr)
    );
    assert_eq!(text(&with.stderr), text(&without.stderr));
}

#[test]
fn a_reporter_whose_torch_calls_raise_leaves_the_job_alone() {
    let _machine = common::machine::beside();
    let script = r#"
import time
import torch
torch.cuda.init()
torch.cuda._stub_set(0, 1, 2, 3, 4)
time.sleep(0.6)
print("job output")
raise SystemExit(3)
"#;
    for mode in ["all", "memory"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let injector = TorchStatsInjector::new_in(tmp.path(), Duration::from_millis(50), None)
            .expect("injector");
        let output = job(
            Some(&injector),
            tmp.path(),
            script,
            &[&stub_torch()],
            &[("STUB_TORCH_RAISE", mode)],
        )
        .output()
        .expect("python3 runs");
        assert_eq!(
            output.status.code(),
            Some(3),
            "{mode}: {}",
            text(&output.stderr)
        );
        assert_eq!(text(&output.stdout), "job output\n", "{mode}");
        assert_eq!(text(&output.stderr), "", "{mode}");
        assert_eq!(
            fs::metadata(injector.stats_path()).expect("stats").len(),
            0,
            "{mode}: nothing reported"
        );
    }
}

#[test]
fn an_unwritable_stats_path_leaves_the_job_alone() {
    let _machine = common::machine::beside();
    let script = r#"
import time
import torch
torch.cuda.init()
torch.cuda._stub_set(0, 1, 2, 3, 4)
time.sleep(0.4)
print("fine")
"#;
    let tmp = tempfile::tempdir().expect("tempdir");
    let injector =
        TorchStatsInjector::new_in(tmp.path(), Duration::from_millis(50), None).expect("injector");
    let mut cmd = job(Some(&injector), tmp.path(), script, &[&stub_torch()], &[]);
    let gone: OsString = tmp.path().join("no/such/dir/stats").into_os_string();
    cmd.env("OOMGUARD_TORCH_STATS", gone);
    let output = cmd.output().expect("python3 runs");
    assert!(output.status.success());
    assert_eq!(text(&output.stdout), "fine\n");
    assert_eq!(text(&output.stderr), "");
}

/// End to end: `oomguard run --torch-stats` puts the trainer's allocator
/// figures on the sample lines, and nothing for its forked worker.
#[test]
fn run_with_torch_stats_logs_the_trainers_allocator() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let job = "import os, time, torch\n\
               torch.cuda.init()\n\
               torch.cuda._stub_set(0, 3 << 30, 5 << 30, 4 << 30, 2)\n\
               pid = os.fork()\n\
               if pid == 0:\n    time.sleep(2.5)\n    os._exit(0)\n\
               print(os.getpid(), pid, flush=True)\n\
               time.sleep(2.5)\n\
               os.waitpid(pid, 0)\n";
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "-q", "--interval", "250ms", "--torch-stats", "--log"])
        .arg(&log)
        .args(["--", "python3", "-c", job])
        .env("PYTHONPATH", stub_torch())
        .env("STUB_TORCH_DEVICES", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut ids = stdout.split_whitespace().map(|x| x.parse::<u64>().unwrap());
    let (trainer, worker) = (ids.next().unwrap(), ids.next().unwrap());
    let text = std::fs::read_to_string(&log).unwrap();
    let mut seen = false;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for t in v["torch"].as_array().into_iter().flatten() {
            assert_ne!(t["pid"], worker, "a forked worker reported: {line}");
            if t["pid"] == trainer {
                let d = &t["devices"][0];
                assert_eq!(d["allocated_bytes"], 3u64 << 30);
                assert_eq!(d["reserved_bytes"], 5u64 << 30);
                assert_eq!(d["alloc_retries"], 2);
                seen = true;
            }
        }
    }
    assert!(seen, "no sample carried the trainer's torch stats:\n{text}");
}
