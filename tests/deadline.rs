//! The test harness's deadline (`common::deadline`): a test that hangs is
//! failed with its name, and the processes it started are killed, instead
//! of hanging the run.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

/// Hangs on purpose: an oomguard supervising `sleep 613` (a length no
/// other test sleeps, so that the check below finds only its own), with a 3 s
/// deadline. Run only by the test below (or by hand with `--ignored`).
#[test]
#[ignore = "hangs on purpose; run by the_deadline_fails_a_hung_test_by_name"]
fn deadline_self_test_hangs_on_purpose() {
    common::deadline::arm_for(Duration::from_secs(3));
    let mut child = common::oomguard()
        .args(["run", "-q", "--", "sleep", "613"])
        .spawn()
        .unwrap();
    let _ = child.wait();
}

#[test]
fn the_deadline_fails_a_hung_test_by_name() {
    let _machine = common::machine::beside();
    let started = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .env(common::machine::CHILD, "1")
        .args([
            "--ignored",
            "--exact",
            "deadline::deadline_self_test_hangs_on_purpose",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(101), "{err}");
    assert!(
        err.contains(
            "test 'deadline::deadline_self_test_hangs_on_purpose' passed its deadline of 3 s"
        ),
        "{err}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
    // Its processes were killed with it: no `sleep 613` of ours is left
    // (`sleep 600` is also another test's, run beside this one: a CI run
    // found it and failed here).
    let left = Command::new("pgrep")
        .args(["-f", "^sleep 613$"])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "left running: {:?}", left);
}
