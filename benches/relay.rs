//! Throughput of the output relay: `yes | head -c 500M` read through a pipe
//! directly, and through `oomguard run` (job → oomguard → pipe), with
//! oomguard's own CPU time (user + system, from /proc/<pid>/stat, sampled
//! until it exits; its children's time is not counted).
//!
//! `cargo bench --bench relay` (add `-- quick` for 100 MB, one round).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Measured {
    wall: Duration,
    bytes: u64,
    /// The direct child's own CPU seconds (None when not sampled).
    cpu: Option<f64>,
}

/// utime + stime of `pid` in clock ticks.
fn own_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat; `rest` starts at field 3.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn measure(mut cmd: Command, sample_cpu: bool) -> Measured {
    let started = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
    let pid = child.id();
    let ticks = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let sampler = sample_cpu.then(|| {
        let (ticks, done) = (Arc::clone(&ticks), Arc::clone(&done));
        std::thread::spawn(move || {
            while done.load(Ordering::Relaxed) == 0 {
                if let Some(t) = own_ticks(pid) {
                    ticks.store(t, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    });
    let mut out = child.stdout.take().expect("stdout");
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = out.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    // The last sample before the exit: the relay's work is done by now.
    if let Some(t) = own_ticks(pid) {
        ticks.store(t, Ordering::Relaxed);
    }
    let status = child.wait().expect("wait");
    let wall = started.elapsed();
    done.store(1, Ordering::Relaxed);
    if let Some(s) = sampler {
        s.join().expect("sampler");
    }
    assert!(status.success(), "{status:?}");
    let hz = 100.0; // USER_HZ on every Linux the relay runs on
    Measured {
        wall,
        bytes,
        cpu: sample_cpu.then(|| ticks.load(Ordering::Relaxed) as f64 / hz),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (size, rounds) = if quick { ("100M", 1) } else { ("500M", 5) };
    let job = format!("yes | head -c {size}");
    let (mut direct, mut via, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..rounds {
        let mut c = Command::new("sh");
        c.args(["-c", &job]);
        let d = measure(c, false);
        direct.push(d.wall.as_secs_f64());

        let mut c = Command::new(env!("CARGO_BIN_EXE_oomguard"));
        c.args(["run", "-q", "--no-gpu", "--", "sh", "-c", &job])
            .env_remove("GITHUB_ACTIONS");
        let v = measure(c, true);
        assert_eq!(v.bytes, d.bytes, "bytes lost through oomguard");
        bytes = v.bytes;
        via.push(v.wall.as_secs_f64());
        cpu.push(v.cpu.unwrap_or(0.0));
    }
    let (d, v, c) = (median(direct), median(via), median(cpu));
    let mb = bytes as f64 / 1e6;
    let rate = mb / v;
    println!("relay: {mb:.0} MB of `yes`, median of {rounds}");
    println!("  direct pipe      {d:.3} s  {:.0} MB/s", mb / d);
    println!(
        "  through oomguard {v:.3} s  {rate:.0} MB/s  ({:.2}x the direct time)",
        v / d
    );
    println!(
        "  oomguard CPU     {c:.3} s = {:.0} % of a core; {:.1} % of a core per 100 MB/s",
        100.0 * c / v,
        100.0 * (c / v) / (rate / 100.0)
    );
}
