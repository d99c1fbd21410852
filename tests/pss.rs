//! The footprint through forks and exits, with real processes: a python
//! parent that holds a known amount of memory and forks workers that read
//! it and allocate their own, so the test knows the truth at every sample.
//! `--cgroup off`, so the footprint is the PSS sum; everything runs inside a
//! small memory cgroup.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{MemCgroup, oomguard, read_log};

const MIB: u64 = 1 << 20;

/// `churn.py SHARED PRIV WORKERS EPOCHS EPOCH_S GAP_S LEAD_S TAIL_S`: the
/// parent writes SHARED MiB, waits LEAD_S, then EPOCHS times forks WORKERS
/// children that read every shared page (so they map it, copy-on-write) and
/// write PRIV MiB of their own, live EPOCH_S and exit; GAP_S between
/// epochs, TAIL_S at the end.
const CHURN: &str = include_str!("../benches/churn.py");

struct Scenario {
    name: &'static str,
    workers: u32,
    epochs: u32,
    epoch_s: f64,
    gap_s: f64,
    lead_s: f64,
    tail_s: f64,
    /// Allowed ratio of reported to true footprint.
    bounds: (f64, f64),
}

const SHARED_MIB: u64 = 800;
const PRIV_MIB: u64 = 40;

/// One sample: t, procs, tree PSS, tree RSS, the role PSS totals' sum.
type Point = (f64, u32, u64, u64, u64);

/// Runs the scenario under oomguard and returns its samples, or None when
/// skipped.
fn run(s: &Scenario) -> Option<Vec<Point>> {
    let cg = MemCgroup::or_skip(s.name, 2 << 30)?;
    let dir = tempfile::tempdir().unwrap();
    let script = common::script(dir.path(), "churn.py", CHURN);
    let log = dir.path().join("run.ndjson");
    let bin = oomguard().get_program().to_owned();
    let args: Vec<String> = [
        "run",
        "-q",
        "--cgroup",
        "off",
        "--interval",
        "1s",
        "--log",
        log.to_str().unwrap(),
        "--",
        "python3",
        script.to_str().unwrap(),
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([
        SHARED_MIB.to_string(),
        PRIV_MIB.to_string(),
        s.workers.to_string(),
        s.epochs.to_string(),
        s.epoch_s.to_string(),
        s.gap_s.to_string(),
        s.lead_s.to_string(),
        s.tail_s.to_string(),
    ])
    .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let status = cg
        .command(Path::new(&bin), &args)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "oomguard exited {status}");
    assert_eq!(cg.oom_kills(), 0, "the test's cgroup is too small");
    Some(
        read_log(&log)
            .iter()
            .filter_map(|l| {
                let s = l.sample()?;
                let roles: u64 = s.roles.iter().map(|r| r.pss_bytes).sum();
                Some((l.t, s.tree.procs, s.tree.pss_bytes, s.tree.rss_bytes, roles))
            })
            .collect(),
    )
}

/// Every sample where the process count is the same as at the samples
/// before and after, and the parent's memory is in place, is within the
/// bounds of the truth: SHARED once, plus PRIV per live worker.
fn check(s: &Scenario) {
    let Some(samples) = run(s) else {
        return;
    };
    let mut checked = 0;
    let mut bad = Vec::new();
    // At any sample, settled or not, the parent's pages are there: a
    // worker on its way out (RSS 0, not yet a zombie) once took its share
    // of them along and showed the job at ~0.11x.
    for &(t, procs, pss, rss, _) in &samples {
        if procs > 0 && rss >= SHARED_MIB * MIB && pss < SHARED_MIB * MIB * 6 / 10 {
            bad.push(format!(
                "t={t:.1} procs={procs} pss={} MiB, below 0.6x the parent's {SHARED_MIB} MiB",
                pss / MIB
            ));
        }
    }
    for w in samples.windows(3) {
        let (t, procs, pss, rss, roles) = w[1];
        assert_eq!(roles, pss, "role totals must add up to the tree at t={t}");
        if w[0].1 != procs || w[2].1 != procs || procs == 0 || rss < SHARED_MIB * MIB {
            continue;
        }
        let truth = (SHARED_MIB + u64::from(procs - 1) * PRIV_MIB) * MIB;
        let ratio = pss as f64 / truth as f64;
        checked += 1;
        if !(s.bounds.0..=s.bounds.1).contains(&ratio) {
            bad.push(format!(
                "t={t:.1} procs={procs} pss={} MiB truth={} MiB ({ratio:.2}x)",
                pss / MIB,
                truth / MIB
            ));
        }
    }
    let table: Vec<String> = samples
        .iter()
        .map(|(t, n, pss, _, _)| format!("{t:.1}:{n}:{}", pss / MIB))
        .collect();
    // A loaded machine stretches the short epochs (forking workers that
    // map 800 MiB takes time): a few stable samples are enough to judge.
    assert!(
        checked >= 3,
        "too few stable samples ({checked}): {}",
        table.join(" ")
    );
    assert!(
        bad.is_empty(),
        "{}: outside {:?} x truth:\n{}\nall samples (t:procs:MiB): {}",
        s.name,
        s.bounds,
        bad.join("\n"),
        table.join(" ")
    );
}

#[test]
fn serial_pss_one_fork_is_not_double_counted() {
    let _serial = common::serial();
    check(&Scenario {
        name: "pss-fork",
        workers: 6,
        epochs: 1,
        epoch_s: 10.0,
        gap_s: 0.0,
        lead_s: 3.0,
        tail_s: 0.0,
        bounds: (0.85, 1.15),
    });
}

#[test]
fn serial_pss_workers_exiting_leave_the_parent_its_pages() {
    let _serial = common::serial();
    check(&Scenario {
        name: "pss-exit",
        workers: 6,
        epochs: 1,
        epoch_s: 6.0,
        gap_s: 0.0,
        lead_s: 2.0,
        tail_s: 10.0,
        bounds: (0.85, 1.15),
    });
}

#[test]
fn serial_pss_epoch_churn_20s() {
    let _serial = common::serial();
    check(&Scenario {
        name: "pss-churn20",
        workers: 6,
        epochs: 2,
        epoch_s: 20.0,
        gap_s: 1.0,
        lead_s: 2.0,
        tail_s: 2.0,
        bounds: (0.85, 1.15),
    });
}

#[test]
fn serial_pss_epoch_churn_3s() {
    let _serial = common::serial();
    check(&Scenario {
        name: "pss-churn3",
        workers: 6,
        // Enough epochs that a loaded machine, which stretches them, still
        // leaves a few stable samples to judge.
        epochs: 12,
        epoch_s: 3.0,
        gap_s: 0.5,
        lead_s: 2.0,
        tail_s: 2.0,
        bounds: (0.70, 1.30),
    });
}
