//! Cost of one tick for trees of 8, 64 and 512 processes, with and without
//! reading PSS (`smaps_rollup`), and oomguard's own footprint over a 60 s
//! run of a 64-process tree at default settings.
//!
//! `cargo bench --bench tick` (add `-- quick` to skip the 60 s run).

#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oomguard::engine::probe::proc::{TreeRoot, TreeScanner, parse_smaps_rollup};

mod inputs;
use inputs::{cpu_ticks, median};

fn forker(n: usize, mib: usize, secs: u64) -> std::process::Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/forker.py");
    let mut child = Command::new("python3")
        .arg(script)
        .args([n.to_string(), mib.to_string(), secs.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready");
    child
}

fn tick_cost(n: usize) {
    let mut child = forker(n, 30, 120);
    let mut scanner = TreeScanner::new("/proc", TreeRoot::Process(child.id()));
    scanner.set_job(Some(child.id()));
    let mut cheap = Vec::new();
    let mut full = Vec::new();
    for _ in 0..30 {
        let t0 = Instant::now();
        let found = scanner.scan(None);
        cheap.push(t0.elapsed().as_secs_f64() * 1e3);
        assert_eq!(found.len(), n);
        let t0 = Instant::now();
        let found = scanner.scan(None);
        let mut pss = 0;
        for f in &found {
            let text = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", f.stat.pid))
                .unwrap_or_default();
            pss += parse_smaps_rollup(&text).map_or(0, |r| r.pss);
        }
        full.push(t0.elapsed().as_secs_f64() * 1e3);
        assert!(pss > 0);
    }
    println!(
        "tick, {n:>3} processes: {:7.3} ms without PSS, {:7.3} ms with PSS (median of 30)",
        median(cheap),
        median(full)
    );
    let _ = child.kill();
    let _ = child.wait();
}

fn field(path: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    })
}

fn self_cost() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/forker.py");
    let secs = 60u64;
    let mut og = Command::new(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "-q", "--log", "/dev/null", "--", "python3"])
        .arg(script)
        .args(["64", "30", &secs.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("oomguard");
    let pid = og.id();
    let t0 = Instant::now();
    let (mut ticks, mut hwm) = (0u64, 0u64);
    // The output keeper: oomguard's child, idle while oomguard lives
    // (`VmHWM` in KiB, the rollup in bytes).
    let (mut k_ticks, mut k_hwm, mut k_pss, mut k_private) = (0u64, 0u64, 0u64, 0u64);
    while og.try_wait().ok().flatten().is_none() {
        if let Some(t) = cpu_ticks(pid) {
            ticks = t;
        }
        if let Some(h) = field(&format!("/proc/{pid}/status"), "VmHWM:") {
            hwm = h;
        }
        if let Some(k) = keeper_of(pid) {
            k_ticks = cpu_ticks(k).unwrap_or(k_ticks);
            k_hwm = field(&format!("/proc/{k}/status"), "VmHWM:").unwrap_or(k_hwm);
            let rollup = std::fs::read_to_string(format!("/proc/{k}/smaps_rollup"));
            if let Some(r) = rollup.ok().and_then(|t| parse_smaps_rollup(&t)) {
                (k_pss, k_private) = (r.pss, r.uss);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let wall = t0.elapsed().as_secs_f64();
    let hz = 100.0; // USER_HZ on Linux
    let cpu = ticks as f64 / hz;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "oomguard itself over a {wall:.0} s run of a 64-process tree (defaults, --log): \
         CPU {cpu:.2} s = {:.2}% of one core, peak RSS {:.1} MiB",
        cpu / wall * 100.0,
        mib(hwm)
    );
    println!(
        "its output keeper: CPU {:.2} s, peak RSS {:.1} MiB (PSS {:.1} MiB, private {:.1} MiB: \
         the rest is the binary, shared with oomguard)",
        k_ticks as f64 / hz,
        mib(k_hwm),
        mib(k_pss >> 10),
        mib(k_private >> 10)
    );
}

/// oomguard's output keeper, by its name among `pid`'s children (of any
/// of its threads).
fn keeper_of(pid: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|x| x.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .find(|c| {
            std::fs::read_to_string(format!("/proc/{c}/comm"))
                .is_ok_and(|n| n.trim() == "oomguard-keep")
        })
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    for n in [8, 64, 512] {
        tick_cost(n);
    }
    if !quick {
        self_cost();
    }
}
