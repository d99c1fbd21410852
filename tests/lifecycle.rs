//! How a run ends: the job does not outlive a killed oomguard, and the log
//! ends the way the contract says (design.md §4.1, `run_end` last).

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// A quiet job: it prints nothing and would run for an hour.
const QUIET: &str = r#"
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(3600)
"#;

#[test]
fn the_job_gets_a_death_signal_when_oomguard_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "quiet.py", QUIET);
    let pid_file = dir.path().join("job.pid");
    let mut og = oomguard()
        .args(["run", "--no-tui", "--cgroup", "off", "--", "python3"])
        .arg(&job)
        .arg(&pid_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || pid_file.exists()));
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
