//! `oomguard demo` end to end, with the Python job and with the job built
//! into the binary (what a machine without python3 runs).

#![allow(clippy::unwrap_used)]

use crate::common;

use common::schema::Event;
use common::*;

fn demo(builtin: bool) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("demo.ndjson");
    // The demo's workers leak without bound: where a memory cgroup can be
    // made (root, as in CI), a 2 GiB one holds them should oomguard fail;
    // elsewhere the test's deadline does.
    let cg = MemCgroup::new("demo", 2 << 30);
    let mut cmd = match &cg {
        Some(cg) => cg.command(std::path::Path::new(env!("CARGO_BIN_EXE_oomguard")), &[]),
        None => oomguard(),
    };
    if builtin {
        cmd.env("OOMGUARD_DEMO_JOB", "builtin");
    } else {
        cmd.env_remove("OOMGUARD_DEMO_JOB");
    }
    let out = cmd
        .args(["demo", "--no-tui", "--log"])
        .arg(&log)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("stopped before the kernel OOM killer (1 checkpoint saved)"),
        "{err}"
    );
    assert!(stdout.contains("checkpoint saved at step"), "{stdout}");
    let argv0 = if builtin { "demo-job" } else { "python3" };
    let lines = read_log(&log);
    let start = lines.iter().find_map(|l| match &l.event {
        Event::RunStart(s) => Some(s.argv.join(" ")),
        _ => None,
    });
    assert!(start.unwrap().contains(argv0));
    let stopped = lines
        .iter()
        .any(|l| matches!(&l.event, Event::Action(a) if a.action == "stop"));
    assert!(stopped, "no stop action in the log");
}

#[test]
fn serial_demo_without_python_uses_the_builtin_job() {
    let _serial = common::machine::beside();
    demo(true);
}

#[test]
fn serial_demo_with_python() {
    let _serial = common::machine::beside();
    if !require(
        std::process::Command::new("python3")
            .arg("-c")
            .arg("")
            .status()
            .is_ok(),
        "python3 not installed",
    ) {
        return;
    }
    demo(false);
}
