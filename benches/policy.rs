//! The policy benchmark: records a corpus of real memory traces, then
//! scores the default policy on it with `oomguard replay --score`.
//!
//! Each shape of `benches/shapes.py` (six healthy, five leaking) runs
//! `RUNS` times (default 10; `cargo bench --bench policy -- RUNS`), with
//! `--cgroup auto` and `--cgroup off` alternating and the seed drawing other
//! levels, rates and ceilings (768 MiB, 1 GiB, 1.5 GiB, 2 GiB) each time,
//! under `--policy none --log-every-tick` inside a memory cgroup: healthy
//! jobs end on their own, leaks run until the kernel kills them. Every
//! tick is recorded, so the replay sees what the live loop would have seen.
//!
//! Printed per shape: runs, false actions (healthy: a pause, stop, restart
//! or kill) or acted-before-the-kill (leaks), the least headroom at the
//! action, and the median lead time before the kernel's kill, beside the
//! lead of the policy's fixed critical threshold alone.
//!
//! `-- RUNS SHAPE…` records only the shapes named and scores them with the
//! traces of the others already in the corpus.
//!
//! Needs root and the cgroup v1 memory controller. The traces stay in
//! `target/policy-corpus/` for `oomguard replay --score` with other
//! policies.

#![allow(clippy::print_stdout, clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/support/shapes.rs"]
mod shapes;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;
const LIMITS: [u64; 4] = [768 * MIB, 1024 * MIB, 1536 * MIB, 2048 * MIB];

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(10);
    // Shapes named on the command line are recorded again; the others'
    // traces from an earlier run are kept and scored with them.
    let named: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| shapes::HEALTHY.contains(a) || shapes::LEAKING.contains(a))
        .collect();
    let record = |shape: &str| named.is_empty() || named.contains(&shape);
    if !shapes::available() {
        eprintln!("policy bench: needs root and the cgroup v1 memory controller");
        std::process::exit(1);
    }
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/policy-corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    for shape in shapes::HEALTHY.iter().chain(shapes::LEAKING.iter()) {
        if !record(shape) {
            continue;
        }
        for old in std::fs::read_dir(&corpus).unwrap().flatten() {
            if old
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("{shape}-"))
            {
                let _ = std::fs::remove_file(old.path());
            }
        }
        for i in 0..runs {
            let seed = 1000 + i;
            let mode = if i % 2 == 0 { "auto" } else { "off" };
            let log = corpus.join(format!("{shape}-{mode}-{seed}.ndjson"));
            let run = shapes::run(&shapes::Spec {
                cgroup: mode,
                flags: &["--policy", "none", "--log-every-tick"],
                ..shapes::Spec::new(shape, seed, LIMITS[i as usize % LIMITS.len()], &log)
            })
            .expect("a memory cgroup for the shape");
            eprintln!(
                "recorded {shape} {mode} seed {seed}: exit {:?}, {} kernel kills, {:.1} s",
                run.exit, run.kills, run.seconds
            );
        }
    }
    let mut logs: Vec<_> = std::fs::read_dir(&corpus)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ndjson"))
        .collect();
    logs.sort();
    let out = Command::new(env!("CARGO_BIN_EXE_oomguard"))
        .args([
            "replay", "--score", "--policy", "default", "--format", "json",
        ])
        .args(&logs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // shape -> (runs, hits, least headroom, leads, fixed leads, unscored)
    type Row = (u32, u32, Option<f64>, Vec<f64>, Vec<f64>, u32);
    let mut by: BTreeMap<String, Row> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let trace = v["trace"].as_str().unwrap_or("");
        let name = Path::new(trace).file_name().unwrap().to_string_lossy();
        let shape = name.split('-').next().unwrap_or("").to_string();
        let e = by.entry(shape).or_default();
        match v["kind"].as_str() {
            Some("healthy") => {
                e.0 += 1;
                e.1 += u32::from(!v["acted"].is_null());
            }
            Some("leak") => {
                e.0 += 1;
                if let Some(lead) = v["lead_seconds"].as_f64() {
                    e.1 += 1;
                    e.3.push(lead);
                    let h = v["headroom_percent"].as_f64();
                    e.2 = match (e.2, h) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                if let Some(f) = v["fixed_lead_seconds"].as_f64() {
                    e.4.push(f);
                }
            }
            _ => e.5 += 1,
        }
    }
    println!(
        "{:<18} {:>5} {:>22} {:>14} {:>12} {:>18} {:>9}",
        "shape",
        "runs",
        "false / before kill",
        "least headroom",
        "median lead",
        "fixed-threshold lead",
        "unscored"
    );
    let secs = |v: &Vec<f64>| median(v.clone()).map_or("-".into(), |m| format!("{m:.2} s"));
    for shape in shapes::HEALTHY.iter().chain(shapes::LEAKING.iter()) {
        let Some((n, hits, least, leads, fixed, unscored)) = by.get(*shape) else {
            continue;
        };
        let healthy = shapes::HEALTHY.contains(shape);
        let verdict = if healthy {
            format!("{hits} false")
        } else {
            format!("{hits}/{n} before kill")
        };
        println!(
            "{:<18} {:>5} {:>22} {:>14} {:>12} {:>18} {:>9}",
            shape,
            n,
            verdict,
            least.map_or("-".into(), |h| format!("{h:.1}%")),
            if healthy { "-".into() } else { secs(leads) },
            if healthy { "-".into() } else { secs(fixed) },
            unscored
        );
    }
}
