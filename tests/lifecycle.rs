//! How a run ends: the job does not outlive a killed oomguard, and the log
//! ends the way the contract says (design.md §4.1, `run_end` last).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::schema;
use common::*;

/// A quiet job: it prints nothing and would run for an hour.
const QUIET: &str = r#"
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(3600)
"#;

/// `oomguard run --no-tui --cgroup off -- python3 JOB PID_FILE`, started;
/// returns once the job has written its pid file.
fn start_quiet_run(job: &Path, pid_file: &Path, stdout: Stdio, stderr: Stdio) -> Child {
    let og = oomguard()
        .args(["run", "-q", "--no-tui", "--cgroup", "off", "--", "python3"])
        .arg(job)
        .arg(pid_file)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    // Written, not just created: the job creates the file, then writes.
    let written = || fs::read_to_string(pid_file).is_ok_and(|s| !s.trim().is_empty());
    assert!(wait_for(Duration::from_secs(10), written));
    og
}

#[test]
fn the_job_gets_a_death_signal_when_oomguard_is_killed() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "quiet.py", QUIET);
    let pid_file = dir.path().join("job.pid");
    let mut og = start_quiet_run(&job, &pid_file, Stdio::null(), Stdio::null());
    let job_pid: u32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(proc_state(job_pid).is_some());
    og.kill().unwrap();
    og.wait().unwrap();
    let ended = wait_for(Duration::from_secs(5), || {
        proc_state(job_pid).is_none_or(|s| s == 'Z')
    });
    if !ended {
        send(job_pid, "KILL");
    }
    assert!(ended, "the job kept running after oomguard was killed");
}

#[test]
fn a_killed_oomguard_leaves_the_trainer_its_output_to_checkpoint() {
    let _machine = common::machine::beside();
    // stdout to a file, stderr to a pipe: the two kinds of channel. Without
    // the keeper the trainer's first print after the death signal fails
    // (EPIPE) inside its handler, and no checkpoint is written.
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "trainer.py", SAVES_ON_TERM);
    let pid_file = dir.path().join("job.pid");
    let out_path = dir.path().join("out.txt");
    let out = Stdio::from(fs::File::create(&out_path).unwrap());
    let mut og = start_quiet_run(&job, &pid_file, out, Stdio::piped());
    let mut err_pipe = og.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err_pipe, &mut s);
        s
    });
    std::thread::sleep(Duration::from_millis(300));
    let keeper = keeper_of(og.id()).expect("no output keeper while oomguard runs");
    og.kill().unwrap();
    og.wait().unwrap();
    let ckpt = dir.path().join("ckpt");
    assert!(
        wait_for(Duration::from_secs(10), || ckpt.exists()),
        "no checkpoint after oomguard was killed: {}",
        fs::read_to_string(&out_path).unwrap_or_default()
    );
    // The keeper passes the rest on and leaves when the trainer has.
    let err = reader.join().unwrap();
    assert!(err.contains("saving the checkpoint (stderr)"), "{err}");
    assert!(!err.contains("Error"), "{err}");
    let out = fs::read_to_string(&out_path).unwrap();
    assert!(out.contains("saving the checkpoint\nsaved\n"), "{out}");
    assert!(
        wait_for(Duration::from_secs(5), || proc_state(keeper)
            .is_none_or(|s| s == 'Z')),
        "the keeper outlived the job"
    );
}

/// oomguard killed while it holds the job stopped (a pause, a throttle,
/// the last-resort freeze): the death signal would wait forever behind the
/// stop, so the keeper lets the held processes run, and the trainer
/// checkpoints as it would had nothing been held.
#[test]
fn a_killed_oomguard_lets_a_paused_trainer_checkpoint() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "trainer.py", SAVES_ON_TERM);
    let pid_file = dir.path().join("job.pid");
    // A rule that always holds: the job is paused 10 s in (by then its
    // handler is set: it writes its pid file after). 3 s was once too
    // short for python3 to start while the suite kept both cores busy:
    // paused before its pid file, the trainer never wrote it.
    let cfg = dir.path().join("pause.toml");
    fs::write(
        &cfg,
        "[[rule]]\nname = \"always\"\nmetric = \"headroom_percent\"\nbelow = \"100%\"\nfor = \"10s\"\naction = \"pause\"\n",
    )
    .unwrap();
    let mut og = oomguard()
        .args([
            "run",
            "-q",
            "--no-tui",
            "--cgroup",
            "off",
            "--interval",
            "100ms",
        ])
        .arg("--config")
        .arg(&cfg)
        .args(["--", "python3"])
        .arg(&job)
        .arg(&pid_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let written = || fs::read_to_string(&pid_file).is_ok_and(|s| !s.trim().is_empty());
    assert!(wait_for(Duration::from_secs(10), written));
    let job_pid: u32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || proc_state(job_pid) == Some('T')),
        "the job was never paused"
    );
    // In oomguard's session, the paused job's group would be orphaned by
    // oomguard's death and sent SIGHUP before the death signal (it kills
    // this trainer unsaved when it wins the race with the keeper's
    // SIGCONT, about 1 run in 5).
    assert_ne!(
        session_of(job_pid),
        session_of(og.id()),
        "the job shares oomguard's session"
    );
    og.kill().unwrap();
    og.wait().unwrap();
    let ckpt = dir.path().join("ckpt");
    let saved = wait_for(Duration::from_secs(10), || ckpt.exists());
    let state = proc_state(job_pid);
    if state.is_some() {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &job_pid.to_string()])
            .status();
    }
    assert!(saved, "no checkpoint: the trainer's state is {state:?}");
}

#[test]
fn a_run_that_ends_leaves_no_keeper_behind() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "quiet.py", QUIET);
    let pid_file = dir.path().join("job.pid");
    let mut og = start_quiet_run(&job, &pid_file, Stdio::piped(), Stdio::null());
    let keeper = keeper_of(og.id()).expect("no output keeper while oomguard runs");
    // Not part of the job: a SIGTERM to oomguard ends the job, then the
    // keeper, and the job's pipe is closed for good.
    send(og.id(), "TERM");
    let status = og.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut og.stdout.take().unwrap(), &mut rest).unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || proc_state(keeper).is_none()),
        "the keeper outlived its oomguard"
    );
}

/// A trainer whose worker leaks until the kernel kills it; the trainer then
/// fails with exit code 1 (as PyTorch does when a DataLoader worker dies).
const WORKER_KILLED: &str = r#"
import os, sys, time
pid = os.fork()
if pid == 0:
    cache = []
    while True:
        b = bytearray(8 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        cache.append(b)
_, status = os.waitpid(pid, 0)
sys.exit(1)
"#;

#[test]
fn serial_a_worker_killed_by_the_kernel_makes_the_outcome_oom_killed() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("oom-outcome", 256 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "job.py", WORKER_KILLED);
    let log = dir.path().join("run.ndjson");
    // The premise, counted where the kernel counts it (oomguard's own
    // `oomguard-<pid>` cgroup below the test's).
    let watch = OomWatch::start(&cg);
    let out = cg
        .command(
            std::path::Path::new(env!("CARGO_BIN_EXE_oomguard")),
            &[
                "run",
                "--policy",
                "none",
                "--log",
                log.to_str().unwrap(),
                "--",
                "python3",
                job.to_str().unwrap(),
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(watch.kills() > 0, "the kernel killed nothing");
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    // The trainer's own exit code is kept; the outcome says why.
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(schema::run_end(&lines).outcome, "oom_killed");
    let kill = common::first_oom_kill(&lines).expect("an oom_kill event");
    common::assert_from_the_kernels_report(&kill);
}

/// Ignores SIGTERM, so only oomguard's SIGKILL after --kill-after ends it.
const STUBBORN: &str = r#"
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"#;

#[test]
fn every_signal_oomguard_sends_while_ending_is_an_action() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "stubborn.py", STUBBORN);
    let log = dir.path().join("run.ndjson");
    let mut og = oomguard()
        .args(["run", "--no-tui", "--kill-after", "1s", "--log"])
        .arg(&log)
        .args(["--", "python3"])
        .arg(&job)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = [0u8; 5];
    std::io::Read::read_exact(og.stdout.as_mut().unwrap(), &mut first).unwrap();
    send(og.id(), "TERM");
    let status = og.wait().unwrap();
    assert_eq!(status.code(), Some(137));
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let acts: Vec<(String, Option<String>)> = lines
        .iter()
        .filter_map(|l| match &l.event {
            schema::Event::Action(a) => Some((a.action.clone(), a.signal.clone())),
            _ => None,
        })
        .collect();
    assert!(
        acts.contains(&("stop".into(), Some("SIGTERM".into()))),
        "{acts:?}"
    );
    assert!(
        acts.contains(&("kill".into(), Some("SIGKILL".into()))),
        "the SIGKILL after --kill-after is not an action: {acts:?}"
    );
    let end = schema::run_end(&lines);
    assert_eq!(end.actions.get("kill"), Some(&1));
}

/// Removes itself, then grows 8 MiB every 50 ms: the first attempt runs,
/// and a relaunch finds no command.
const VANISHING: &str = r#"#!/bin/sh
rm -f "$0"
exec python3 -c '
import time
keep = []
while True:
    keep.append(bytearray(8 << 20))
    time.sleep(0.05)
'
"#;

/// A relaunch that cannot start is oomguard failing at what it was asked
/// to do after the job started: exit 70 and `run_end` (`internal_error`,
/// with `error`) last, not the stop that led to the restart (exit 75).
#[test]
fn serial_a_relaunch_that_cannot_start_ends_with_internal_error() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("relaunch-fails", 512 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.sh");
    fs::write(&job, VANISHING).unwrap();
    fs::set_permissions(&job, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let log = dir.path().join("run.ndjson");
    let out = cg
        .command(
            std::path::Path::new(env!("CARGO_BIN_EXE_oomguard")),
            &[
                "run",
                "--no-tui",
                "--cgroup",
                "off",
                "--budget",
                "150MiB",
                "--on-critical",
                "restart",
                "--restart-delay",
                "100ms",
                "--log",
                log.to_str().unwrap(),
                "--",
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
    assert!(
        matches!(lines[0].event, schema::Event::RunStart(_)),
        "run_start is not first"
    );
    assert!(
        lines
            .iter()
            .any(|l| matches!(l.event, schema::Event::Restart(_))),
        "the first attempt was never stopped for a restart; stderr:\n{err}"
    );
    let end = schema::run_end(&lines);
    assert_eq!(
        (end.outcome.as_str(), end.exit_code),
        ("internal_error", 70),
        "stderr:\n{err}"
    );
    let error = end.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("cannot restart") && error.contains("job.sh"),
        "run_end.error: {error:?}"
    );
    assert_eq!(out.status.code(), Some(70), "stderr:\n{err}");
}

/// The hard limit on open files of `pid`, from `/proc/PID/limits`.
fn hard_nofile(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let hard = line.split_whitespace().nth(4)?;
    Some(hard.parse().unwrap_or(u64::MAX))
}

/// oomguard's own failure after the job started, forced from outside: while
/// it waits to restart the job (a CUDA OOM, `--restart-on cuda-oom`), its
/// open-file limit is lowered so far that the next attempt gets no pipes. The run must end as the contract says: exit 70, `run_end` last
/// with `outcome: internal_error` and the `error`.
#[test]
fn a_relaunch_that_gets_no_pipes_ends_with_internal_error() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch-errors/04-torch1.4-1.9-reserved-in-total.txt");
    let text: String = fs::read_to_string(&fixture)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("# source"))
        .map(|l| format!("{l}\n"))
        .collect();
    let msg = dir.path().join("oom.txt");
    fs::write(&msg, text).unwrap();
    let log = dir.path().join("run.ndjson");
    let err_file = dir.path().join("stderr.txt");
    let mut og = oomguard()
        .args([
            "run",
            "--no-tui",
            "--cgroup",
            "off",
            "--restart-on",
            "cuda-oom",
            "--restart-delay",
            "3s",
            "--log",
        ])
        .arg(&log)
        .args(["--", "sh", "-c"])
        .arg(format!("cat '{}' >&2; exit 1", msg.display()))
        .stdout(Stdio::null())
        .stderr(fs::File::create(&err_file).unwrap())
        .spawn()
        .unwrap();
    let pid = og.id();
    // The restart line is written once the first attempt's tree is gone,
    // before the relaunch (3 s later).
    let planned = wait_for(Duration::from_secs(20), || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(r#""event":"restart""#)
    });
    if !planned {
        let _ = og.kill();
        let _ = og.wait();
        panic!(
            "no restart was planned; stderr:\n{}",
            fs::read_to_string(&err_file).unwrap_or_default()
        );
    }
    let hard = hard_nofile(pid).unwrap();
    // A new descriptor takes the lowest free number, and must be below the
    // limit: with the limit at 3 (stdin, stdout and stderr are open), no
    // new descriptor can be had, whatever oomguard closes meanwhile.
    let lowered = rustix::process::prlimit(
        rustix::process::Pid::from_raw(pid as i32),
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(3),
            maximum: (hard != u64::MAX).then_some(hard),
        },
    );
    if lowered.is_err() {
        let _ = og.kill();
        let _ = og.wait();
    }
    lowered.unwrap();
    let ended = wait_for(Duration::from_secs(20), || og.try_wait().unwrap().is_some());
    if !ended {
        let _ = og.kill();
    }
    let status = og.wait().unwrap();
    let err = fs::read_to_string(&err_file).unwrap_or_default();
    assert!(ended, "oomguard did not end; stderr:\n{err}");
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    assert!(
        matches!(lines[0].event, schema::Event::RunStart(_)),
        "run_start is not first"
    );
    let end = schema::run_end(&lines);
    assert_eq!(
        (end.outcome.as_str(), end.exit_code),
        ("internal_error", 70),
        "stderr:\n{err}"
    );
    let error = end.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("cannot restart") && error.contains("Too many open files"),
        "run_end.error: {error:?}"
    );
    assert_eq!(status.code(), Some(70), "stderr:\n{err}");
}

/// Out of file descriptors before the job starts is oomguard's own failure,
/// whatever it was opening (the runtime, the relay's pipes, the job's
/// descriptors): exit 70, never 2 (a usage error) or a panic's 101, and a
/// log that was opened ends with `run_end` (`internal_error`). How many
/// descriptors a run needs depends on what the test inherits, so the
/// limits span from too few to open the log to enough to run.
#[test]
fn running_out_of_descriptors_at_start_is_an_internal_error() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let mut logged_failures = 0;
    let mut failures = 0;
    // Every limit, so the one where only the job's own spawn runs short
    // (a few descriptors below enough) is among them whatever is inherited.
    for limit in (6..=40).chain([64]) {
        let log = dir.path().join(format!("fd{limit}.ndjson"));
        let script = format!(
            "ulimit -n {limit} && exec \"$0\" run --no-tui --cgroup off --log '{}' -- true",
            log.display()
        );
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&script)
            .arg(env!("CARGO_BIN_EXE_oomguard"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        assert!(
            code == Some(70) || code == Some(0),
            "limit {limit}: exit {code:?}: {err}"
        );
        // A shortage is reported as one, not as a crash.
        assert!(!err.contains("panicked"), "limit {limit}: {err}");
        let Ok(text) = fs::read_to_string(&log) else {
            assert_eq!(code, Some(70), "limit {limit}: a run without its log");
            failures += 1;
            continue;
        };
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let last = lines.last().expect("an opened log is never empty");
        assert_eq!(last["event"], "run_end", "limit {limit}: {text}");
        let want = if code == Some(70) {
            "internal_error"
        } else {
            "exited"
        };
        assert_eq!(last["outcome"], want, "limit {limit}");
        if code == Some(70) {
            failures += 1;
            logged_failures += 1;
        }
    }
    assert!(
        failures >= 2,
        "the limits never ran oomguard out of descriptors"
    );
    assert!(
        logged_failures >= 1,
        "no failure came after the log was opened"
    );
    let code = std::process::Command::new(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "--no-tui", "--cgroup", "off", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap()
        .status
        .code();
    assert_eq!(code, Some(0), "with no limit the same run succeeds");
}

/// The session id in /proc/PID/stat (the fourth field after the name).
fn session_of(pid: u32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}
