//! The memory shapes of `benches/shapes.py` as real processes under the
//! default policy, inside a memory cgroup with a limit, with `--cgroup auto`
//! and `--cgroup off`: every healthy shape (a fast load to a plateau, epoch
//! stairs, validation spikes, allocator sawtooth, re-forked workers, a
//! checkpoint buffer) exits 0 with no pause, stop or kill; every leaking
//! shape (linear, creep, burst, step, fast) is stopped before the kernel
//! (exit 75, 0 OOM kills). Three seeds per shape and mode, each with other
//! levels, rates and ceilings.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::shapes;

use common::{require, serial};

const MIB: u64 = 1 << 20;
/// Seeds per shape and mode; each seed draws other levels and rates, and
/// picks one of the ceilings.
const SEEDS: u64 = 3;
const LIMITS: [u64; 3] = [768 * MIB, 1024 * MIB, 1536 * MIB];

/// The stopping actions a log holds (`pause`, `stop`, `restart`, `kill`),
/// with their rules.
fn stops(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "action")
        .filter(|v| {
            ["pause", "stop", "restart", "kill"].contains(&v["action"].as_str().unwrap_or(""))
        })
        .map(|v| format!("{} ({}) at {}", v["action"], v["reason"], v["t"]))
        .collect()
}

/// `lock`: what the runs need of the machine (`common::machine`). A healthy
/// shape's runs wait beside other tests (every test that makes the kernel
/// kill runs alone, so the machine's OOM-kill count cannot rise under
/// them); a leak races the kernel and runs alone.
fn each_run(
    shape: &str,
    lock: fn() -> common::machine::Held,
    check: impl Fn(&shapes::ShapeRun, &[String], &str),
) {
    if !require(
        shapes::available(),
        "needs root and a cgroup v1 memory hierarchy",
    ) {
        return;
    }
    let _lock = lock();
    let dir = tempfile::tempdir().unwrap();
    for mode in ["auto", "off"] {
        for seed in 1..=SEEDS {
            let log = dir.path().join(format!("{shape}-{mode}-{seed}.ndjson"));
            let limit = LIMITS[(seed as usize) % LIMITS.len()];
            let run = shapes::run(&shapes::Spec {
                cgroup: mode,
                ..shapes::Spec::new(shape, seed, limit, &log)
            })
            .expect("a memory cgroup for the shape");
            let what = format!(
                "{shape} --cgroup {mode} seed {seed} limit {} MiB ({:.1} s): {run:?}",
                limit / MIB,
                run.seconds
            );
            assert!(!run.timed_out, "{what}");
            check(&run, &stops(&log), &what);
        }
    }
}

fn healthy(shape: &str) {
    each_run(shape, common::machine::beside, |run, stops, what| {
        assert_eq!(run.kills, 0, "{what}");
        assert!(
            stops.is_empty(),
            "a healthy job was acted on: {stops:?}\n{what}"
        );
        assert_eq!(run.exit, Some(0), "{what}");
    });
}

/// A leak whose last step before the ceiling leaves seconds (a creep of
/// about 1 % of the limit a second, a step every 1.5–3 s) runs beside
/// other tests; one that crosses the last headroom in well under a second
/// (linear at up to 200 MiB/s, a burst, the fast leak) races the kernel
/// and runs alone.
fn leaking(shape: &str) {
    let lock = match shape {
        "creep" | "step" => common::machine::beside,
        _ => common::machine::alone,
    };
    each_run(shape, lock, |run, stops, what| {
        assert_eq!(run.kills, 0, "the kernel killed first: {what}");
        assert_eq!(run.exit, Some(75), "{what}");
        assert!(!stops.is_empty(), "{what}");
    });
}

#[test]
fn serial_shape_load_plateau_is_left_alone() {
    healthy("load_plateau");
}

#[test]
fn serial_shape_stairs_are_left_alone() {
    healthy("stairs");
}

#[test]
fn serial_shape_spikes_are_left_alone() {
    healthy("spikes");
}

#[test]
fn serial_shape_sawtooth_is_left_alone() {
    healthy("sawtooth");
}

#[test]
fn serial_shape_reforking_workers_are_left_alone() {
    healthy("reforking_workers");
}

#[test]
fn serial_shape_checkpoint_save_is_left_alone() {
    healthy("checkpoint_save");
}

#[test]
fn serial_shape_linear_leak_is_stopped_before_the_kernel() {
    leaking("linear");
}

#[test]
fn serial_shape_creep_is_stopped_before_the_kernel() {
    leaking("creep");
}

#[test]
fn serial_shape_burst_is_stopped_before_the_kernel() {
    leaking("burst");
}

#[test]
fn serial_shape_step_leak_is_stopped_before_the_kernel() {
    leaking("step");
}

#[test]
fn serial_shape_fast_leak_is_stopped_before_the_kernel() {
    leaking("fast");
}

/// The kernel's v1 usage thresholds wake oomguard between two slow polls:
/// with `--interval 30s` a linear leak reaches the limit long before the
/// second poll, so only a wake-up at the warn level (which brings the fast
/// ticks) can stop it, and `run_end.wakeups` says the threshold was the
/// one. The controls: `--without usage-threshold` alone leaves its count at
/// zero (the cheap loop, which runs where no threshold is armed, then
/// covers, and says so); `--without wakeups` (no threshold, PSI trigger
/// or cheap loop) must lose to the kernel.
#[test]
fn serial_v1_kernel_wakeup_stops_a_leak_between_slow_polls() {
    if !require(
        shapes::available(),
        "needs root and a cgroup v1 memory hierarchy",
    ) {
        return;
    }
    let _lock = serial();
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, without: &str| {
        let log = dir.path().join(format!("wakeup-{name}.ndjson"));
        let flags = ["--interval", "30s", "--without", without];
        let spec = shapes::Spec {
            flags: &flags,
            ..shapes::Spec::new("linear", 7, 1024 * MIB, &log)
        };
        let r = shapes::run(&spec).expect("a memory cgroup for the shape");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines = common::read_log(&log);
        let wakeups = common::schema::run_end(&lines).wakeups.as_ref().map(|w| {
            (
                w.usage_threshold.woke,
                w.cheap_loop.woke,
                w.usage_threshold.armed,
            )
        });
        (r, wakeups, text)
    };
    let (with, woke, log) = run("all", "none");
    assert_eq!((with.exit, with.kills), (Some(75), 0), "{with:?}\n{log}");
    let (threshold, _, armed) = woke.expect("run_end.wakeups");
    assert!(
        armed && threshold > 0,
        "the threshold did not wake the loop: {woke:?}\n{log}"
    );

    let (alone, woke, log) = run("no-threshold", "usage-threshold");
    let (threshold, cheap, armed) = woke.expect("run_end.wakeups");
    assert_eq!((threshold, armed), (0, false), "{log}");
    assert!(
        cheap > 0,
        "the cheap loop covers the threshold: {woke:?}\n{log}"
    );
    assert_eq!((alone.exit, alone.kills), (Some(75), 0), "{alone:?}\n{log}");

    let (without, _, log) = run("none", "wakeups");
    assert!(
        without.kills > 0 && without.exit != Some(75),
        "without kernel wake-ups the leak should reach the kernel between two 30 s polls: {without:?}\n{log}"
    );
}
