//! Signals reach only processes proven to be in the tree *now*: a pid that a
//! dead worker left behind and an unrelated process took over is never
//! throttled, paused or terminated (design.md §3, "never signal a pid that
//! is not in the tree").
//!
//! The reuse is forced, not hoped for: as root, `/proc/sys/kernel/ns_last_pid`
//! is set so that the next process created gets the dead worker's pid.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::schema;
use common::*;

const JOB: &str = r#"
import os, signal, sys, time
pid_file = sys.argv[1]
workers = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        cache = []
        while True:
            b = bytearray(1 << 20)
            for j in range(0, len(b), 4096):
                b[j] = 1
            cache.append(b)
            time.sleep(0.05)
    workers.append(pid)
with open(pid_file + ".tmp", "w") as f:
    f.write(" ".join(map(str, workers)))
os.rename(pid_file + ".tmp", pid_file)

def reap(*_):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

signal.signal(signal.SIGCHLD, reap)
stopping = False
def on_term(*_):
    global stopping
    stopping = True
signal.signal(signal.SIGTERM, on_term)
while not stopping:
    time.sleep(0.05)
# A slow checkpoint: the stop waits for it while the workers are throttled.
end = time.time() + 8
while time.time() < end:
    time.sleep(0.05)
"#;

/// Starts `sleep` as the process with pid `want`, through `ns_last_pid`.
/// None when another process on the machine took the pid first.
fn spawn_with_pid(want: u32) -> Option<Child> {
    for _ in 0..50 {
        fs::write("/proc/sys/kernel/ns_last_pid", (want - 1).to_string()).ok()?;
        let mut c = Command::new("sleep")
            .arg("1000")
            .stdin(Stdio::null())
            .spawn()
            .ok()?;
        if c.id() == want {
            return Some(c);
        }
        let _ = c.kill();
        let _ = c.wait();
        if Path::new(&format!("/proc/{want}")).exists() {
            return None;
        }
    }
    None
}

fn can_set_last_pid() -> bool {
    fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|v| fs::write("/proc/sys/kernel/ns_last_pid", v.to_string()).is_ok())
}

#[test]
fn serial_pid_reuse_during_a_throttled_stop_is_met_and_refused() {
    let _serial = serial();
    if !require(
        can_set_last_pid(),
        "needs root to write /proc/sys/kernel/ns_last_pid",
    ) {
        return;
    }
    let Some(cg) = MemCgroup::or_skip("pid-reuse", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "job.py", JOB);
    let pids_file = dir.path().join("workers");
    let log = dir.path().join("run.ndjson");
    let mut og = cg
        .command(
            Path::new(env!("CARGO_BIN_EXE_oomguard")),
            &[
                "run",
                "--log",
                log.to_str().unwrap(),
                "--budget",
                "150MiB",
                "--grace",
                "20s",
                "--kill-after",
                "2s",
                "--",
                "python3",
                job.to_str().unwrap(),
                pids_file.to_str().unwrap(),
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let og_pid = og.id();
    assert!(
        wait_for(Duration::from_secs(30), || fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(
                |l| l.contains(r#""event":"action""#) && l.contains(r#""action":"stop""#)
            )),
        "no graceful stop started"
    );
    let workers: Vec<u32> = fs::read_to_string(&pids_file)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // The throttle holds the growing workers (its `pause` action is
    // logged when it first holds them): only a held pid can be met again.
    // Waited for, not timed: on a busy machine 400 ms was not always enough.
    assert!(
        wait_for(Duration::from_secs(10), || fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(
                |l| l.contains(r#""action":"pause""#) && l.contains("throttle")
            )),
        "the throttle never held the growing workers"
    );
    std::thread::sleep(Duration::from_millis(100));

    // For each worker: with oomguard held still (so no scan sees the gap),
    // kill it, let the trainer reap it, and give its pid to an outsider.
    let mut outsiders: Vec<Child> = Vec::new();
    for &w in &workers {
        send(og_pid, "STOP");
        send(w, "KILL");
        let gone = wait_for(Duration::from_secs(2), || {
            !Path::new(&format!("/proc/{w}")).exists()
        });
        if gone && let Some(c) = spawn_with_pid(w) {
            outsiders.push(c);
        }
        send(og_pid, "CONT");
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(
        !outsiders.is_empty(),
        "could not make any outsider take a worker's pid"
    );

    let mut stopped_seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(40);
    while og.try_wait().unwrap().is_none() && Instant::now() < end {
        for c in &outsiders {
            if proc_state(c.id()) == Some('T') && !stopped_seen.contains(&c.id()) {
                stopped_seen.push(c.id());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = og.wait().unwrap();
    let mut alive = Vec::new();
    for c in outsiders.iter_mut() {
        alive.push((c.id(), c.try_wait().unwrap().is_none(), proc_state(c.id())));
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(
        stopped_seen.is_empty(),
        "oomguard stopped outsiders that took a dead worker's pid: {stopped_seen:?}"
    );
    assert!(
        alive.iter().all(|&(_, a, st)| a && st != Some('T')),
        "an outsider was signalled (pid, alive, state): {alive:?}"
    );
    let mut stderr = String::new();
    if let Some(mut e) = og.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert_eq!(status.code(), Some(75), "oomguard's stderr:\n{stderr}");
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    // The outsiders were met, not merely missed: oomguard went to signal a
    // held worker's pid and refused, because its start time had changed.
    let refused = schema::run_end(&lines).reused_pids_refused.unwrap_or(0);
    assert!(
        refused >= 1,
        "no reused pid was met and refused (workers {workers:?}, outsiders {:?})",
        outsiders.iter().map(Child::id).collect::<Vec<_>>()
    );
}
