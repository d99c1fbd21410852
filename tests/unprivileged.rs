//! What a normal user gets: oomguard as uid 65534 (`setpriv`), at default
//! settings, in a memory cgroup root made — it can neither create a cgroup
//! of its own nor register the kernel's v1 usage thresholds, and its PSI
//! trigger must use a 2 s window. The fast leak of `benches/shapes.py` (two
//! processes faulting pages in as fast as they can) must still be stopped
//! before the kernel in at least 9 of 10 runs, in cgroups of 1, 2 and
//! 4 GiB: the cheap loop over the limit's usage counter
//! (`src/runtime/cheap.rs`) wakes the loop at the crossing.
//!
//! Each run must also say (`run_end.wakeups`) that the kernel refused the
//! usage threshold, with why, and that the cheap loop woke the loop: with
//! `--without cheap-loop` every run fails that, and the same runs were
//! stopped in 0–2 of 10 in 1 and 2 GiB (design.md, *Controls*).
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::shapes;

use std::os::unix::fs::PermissionsExt;

use common::{require, serial};

const GIB: u64 = 1 << 30;
const RUNS: u64 = 10;

fn fast_leak_as_nobody(limit: u64) {
    if !require(
        shapes::available(),
        "needs root and a cgroup v1 memory hierarchy",
    ) {
        return;
    }
    if !require(
        std::path::Path::new("/usr/bin/setpriv").exists(),
        "needs setpriv (util-linux)",
    ) {
        return;
    }
    let _lock = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut prevented = 0;
    let mut failures = Vec::new();
    for seed in 1..=RUNS {
        let log = dir.path().join(format!("fast-{seed}.ndjson"));
        let run = shapes::run(&shapes::Spec {
            unprivileged: true,
            ..shapes::Spec::new("fast", seed, limit, &log)
        })
        .expect("a memory cgroup for the shape");
        assert!(!run.timed_out, "{run:?}");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // The run really was unprivileged: no cgroup of its own.
        assert!(text.contains(r#""owned":false"#), "{text}");
        let lines = common::read_log(&log);
        let w = common::schema::run_end(&lines)
            .wakeups
            .as_ref()
            .unwrap_or_else(|| panic!("no run_end.wakeups\n{text}"));
        // The kernel refused the usage threshold to a user who does not own
        // the cgroup, and the log says why.
        assert!(
            !w.usage_threshold.armed
                && w.usage_threshold
                    .refused
                    .as_deref()
                    .is_some_and(|r| r.contains("cgroup.event_control")),
            "{w:?}"
        );
        // Stopped, and by the cheap loop's reads: without them (or with
        // the threshold somehow armed) the run does not count.
        if run.kills == 0 && run.exit == Some(75) && w.cheap_loop.woke > 0 {
            prevented += 1;
        } else {
            failures.push(format!(
                "seed {seed}: {run:?}, cheap loop {:?}",
                w.cheap_loop
            ));
        }
    }
    eprintln!(
        "unprivileged fast leak, {} GiB: {prevented}/{RUNS} stopped before the kernel",
        limit / GIB
    );
    assert!(
        prevented >= 9,
        "{prevented}/{RUNS} prevented in {} GiB:\n{}",
        limit / GIB,
        failures.join("\n")
    );
}

/// `--cgroup off` took effect: no cgroup of its own (`owned: false`, no
/// `oomguard-*` directory ever appeared), and the footprint is the PSS sum
/// on every sample.
fn assert_cgroup_off(log: &str, run: &shapes::ShapeRun) {
    assert!(
        run.cgroups_made.iter().all(|c| !c.starts_with("oomguard-")),
        "{run:?}"
    );
    let mut samples = 0;
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["event"] == "run_start" {
            assert_eq!(v["cgroup"]["owned"], false, "{line}");
        }
        if v["event"] == "sample" {
            samples += 1;
            assert_eq!(
                v["tree"]["footprint_bytes"], v["tree"]["pss_bytes"],
                "the footprint is not the PSS sum: {line}"
            );
            assert_ne!(v["cgroup"]["owned"], true, "{line}");
        }
    }
    assert!(samples > 0, "{log}");
}

/// A normal user's `--cgroup off`: a linear leak in a cgroup root made is
/// stopped before the kernel (exit 75), with the flag in effect.
#[test]
fn serial_unprivileged_cgroup_off_leak_is_stopped_on_the_pss_footprint() {
    if !require(
        shapes::available(),
        "needs root and a cgroup v1 memory hierarchy",
    ) {
        return;
    }
    let _lock = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    for seed in 1..=2 {
        let log = dir.path().join(format!("linear-{seed}.ndjson"));
        let run = shapes::run(&shapes::Spec {
            cgroup: "off",
            unprivileged: true,
            ..shapes::Spec::new("linear", seed, GIB, &log)
        })
        .expect("a memory cgroup for the shape");
        assert_eq!((run.exit, run.kills), (Some(75), 0), "{run:?}");
        assert_cgroup_off(&std::fs::read_to_string(&log).unwrap(), &run);
    }
}

#[test]
fn serial_unprivileged_fast_leak_in_1_gib_is_stopped_before_the_kernel() {
    fast_leak_as_nobody(GIB);
}

#[test]
fn serial_unprivileged_fast_leak_in_2_gib_is_stopped_before_the_kernel() {
    fast_leak_as_nobody(2 * GIB);
}

#[test]
fn serial_unprivileged_fast_leak_in_4_gib_is_stopped_before_the_kernel() {
    fast_leak_as_nobody(4 * GIB);
}

/// The kernel kills a normal user's leak (`--policy none`): with
/// `kernel.dmesg_restrict=1` uid 65534 cannot read the kernel's report, so
/// the kill is attributed from the OOM-kill counter and the tree, and the
/// event says so (a `reason`, no constraint, no `kill` record), while the
/// tests of the report's path (policy, lifecycle, restart, the VM's G3)
/// require the opposite.
#[test]
fn serial_unprivileged_kill_is_attributed_from_the_counter_when_the_kernel_log_is_closed() {
    if !require(
        shapes::available(),
        "needs root and a cgroup v1 memory hierarchy",
    ) {
        return;
    }
    let restricted =
        std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").is_ok_and(|v| v.trim() == "1");
    if !require(restricted, "needs kernel.dmesg_restrict=1") {
        return;
    }
    let _lock = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let log = dir.path().join("killed.ndjson");
    let run = shapes::run(&shapes::Spec {
        unprivileged: true,
        flags: &["--policy", "none"],
        ..shapes::Spec::new("linear", 3, GIB, &log)
    })
    .expect("a memory cgroup for the shape");
    assert!(run.kills > 0, "the kernel killed nothing: {run:?}");
    let lines = common::read_log(&log);
    let kill =
        common::first_oom_kill(&lines).unwrap_or_else(|| panic!("no oom_kill event: {run:?}"));
    assert!(
        kill["reason"]
            .as_str()
            .is_some_and(|r| r.contains("attributed from the OOM-kill counter")),
        "{kill}"
    );
    assert!(
        kill["constraint"].is_null() && kill["kill"].is_null(),
        "{kill}"
    );
    assert_eq!(common::schema::run_end(&lines).outcome, "oom_killed");
}
