//! What a normal user gets: oomguard as uid 65534 (`setpriv`), at default
//! settings, in a memory cgroup root made — it can neither create a cgroup
//! of its own nor register the kernel's v1 usage thresholds, and its PSI
//! trigger must use a 2 s window. The fast leak of `benches/shapes.py` (two
//! processes faulting pages in as fast as they can) must still be stopped
//! before the kernel in at least 9 of 10 runs, in cgroups of 1, 2 and
//! 4 GiB: the cheap loop over the limit's usage counter
//! (`src/runtime/cheap.rs`) wakes the loop at the crossing.
//!
//! Breaking the mechanism fails it: with `OOMGUARD_CHEAP_LOOP=off` the same
//! runs were stopped in 0–2 of 10 (design.md, *Controls*).
#![allow(clippy::unwrap_used)]

mod common;
#[path = "support/shapes.rs"]
mod shapes;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{require, serial};

const GIB: u64 = 1 << 30;
const RUNS: u64 = 10;

fn fast_leak_as_nobody(limit: u64) {
    let Some(parent) = shapes::own_memcg() else {
        require(false, "needs root and a cgroup v1 memory hierarchy");
        return;
    };
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
        let run = shapes::run(
            &parent,
            &shapes::Spec {
                shape: "fast",
                seed,
                limit,
                cgroup: "auto",
                flags: &[],
                log: &log,
                deadline: Duration::from_secs(60),
                unprivileged: true,
            },
        );
        assert!(!run.timed_out, "{run:?}");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // The run really was unprivileged: no cgroup of its own.
        assert!(text.contains(r#""owned":false"#), "{text}");
        if run.kills == 0 && run.exit == Some(75) {
            prevented += 1;
        } else {
            failures.push(format!("seed {seed}: {run:?}"));
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
