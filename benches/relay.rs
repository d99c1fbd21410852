//! Throughput of the output relay: a stream read through a pipe directly,
//! through `cat` (the least any relay costs: one more process and pipe),
//! and through `oomguard run` (job → oomguard → pipe), with oomguard's own
//! CPU time (user + system, from /proc/<pid>/stat, sampled until it exits;
//! its children's time is not counted). Three streams: `yes | head -c
//! 500M` (nothing to recognise), and `cat` of a 200 MB training log (~100
//! byte lines, a plain-loop progress line every 50) and of a 200 MB tqdm
//! bar redrawn with `\r` (every byte is progress), both in the page cache.
//!
//! Wall times are given as the median and the best of the rounds, and
//! compared like with like: on two cores the direct pipe's time is
//! bimodal (its busiest stage, `head`, either gets a core to itself or
//! shares one), so its median alone swings with the machine.
//!
//! `cargo bench --bench relay` (add `-- quick` for 100 MB, one round).
//! `OOMGUARD_BIN=path` measures another build of oomguard (an older
//! commit's, to compare), `-- only=yes|log|bar` one stream.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod inputs;
use inputs::{cpu_ticks, median, tqdm_bar, training_log};

struct Measured {
    wall: Duration,
    bytes: u64,
    /// The direct child's own CPU seconds (None when not sampled).
    cpu: Option<f64>,
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
                if let Some(t) = cpu_ticks(pid) {
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
    if let Some(t) = cpu_ticks(pid) {
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

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let only = std::env::args().find_map(|a| a.strip_prefix("only=").map(str::to_string));
    let (size, rounds) = if quick { ("100M", 1) } else { ("500M", 9) };
    let file_bytes = if quick { 100 << 20 } else { 200 << 20 };
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("train.log");
    let bar = dir.path().join("bar.txt");
    std::fs::write(&log, training_log(file_bytes)).expect("write the log");
    std::fs::write(&bar, tqdm_bar(file_bytes, 12_880_000)).expect("write the bar");
    let oomguard = std::env::var("OOMGUARD_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_oomguard").to_string());
    println!("oomguard: {oomguard}");
    let streams = [
        ("yes", format!("yes | head -c {size}")),
        ("log", format!("cat {}", log.display())),
        ("bar", format!("cat {}", bar.display())),
    ];
    for (name, job) in &streams {
        if only.as_deref().is_some_and(|o| o != *name) {
            continue;
        }
        relay(&oomguard, name, job, rounds);
    }
}

fn relay(oomguard: &str, name: &str, job: &str, rounds: usize) {
    let (mut direct, mut via, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    let (mut by_cat, mut cat_cpu) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..rounds {
        let mut c = Command::new("sh");
        c.args(["-c", job]);
        let d = measure(c, false);
        direct.push(d.wall.as_secs_f64());

        // The least any relay costs: `cat` in the same place, one more
        // process and pipe between the job and its reader.
        let mut producer = Command::new("sh")
            .args(["-c", job])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the job");
        let mut c = Command::new("cat");
        c.stdin(producer.stdout.take().expect("job stdout"));
        let k = measure(c, true);
        producer.wait().expect("wait for the job");
        by_cat.push(k.wall.as_secs_f64());
        cat_cpu.push(k.cpu.unwrap_or(0.0));

        let mut c = Command::new(oomguard);
        c.args(["run", "-q", "--no-gpu", "--", "sh", "-c", job])
            .env_remove("GITHUB_ACTIONS");
        let v = measure(c, true);
        // Reported, not asserted: an older build measured for comparison
        // may lose bytes, and its figures are still wanted.
        if v.bytes != d.bytes {
            println!(
                "  !! {} of {} bytes lost through oomguard",
                d.bytes.abs_diff(v.bytes),
                d.bytes
            );
        }
        bytes = v.bytes;
        via.push(v.wall.as_secs_f64());
        cpu.push(v.cpu.unwrap_or(0.0));
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (db, kb, vb) = (best(&direct), best(&by_cat), best(&via));
    let (d, v, c) = (median(direct), median(via), median(cpu));
    let (k, kc) = (median(by_cat), median(cat_cpu));
    let mb = bytes as f64 / 1e6;
    // CPU share of a core, per 100 MB/s relayed: CPU seconds per 100 MB.
    let per = |cpu: f64, wall: f64| 100.0 * (cpu / wall) / (mb / wall / 100.0);
    println!("relay, {name}: {mb:.0} MB (`{job}`), {rounds} rounds: median / best");
    println!(
        "  direct pipe      {d:.3} s / {db:.3} s  {:.0} / {:.0} MB/s",
        mb / d,
        mb / db
    );
    println!(
        "  through cat      {k:.3} s / {kb:.3} s  {:.0} / {:.0} MB/s  ({:.2}x / {:.2}x the direct time)",
        mb / k,
        mb / kb,
        k / d,
        kb / db
    );
    println!(
        "  through oomguard {v:.3} s / {vb:.3} s  {:.0} / {:.0} MB/s  ({:.2}x / {:.2}x the direct time)",
        mb / v,
        mb / vb,
        v / d,
        vb / db
    );
    println!(
        "  cat CPU          {kc:.3} s = {:.0} % of a core; {:.1} % of a core per 100 MB/s",
        100.0 * kc / k,
        per(kc, k)
    );
    println!(
        "  oomguard CPU     {c:.3} s = {:.0} % of a core; {:.1} % of a core per 100 MB/s",
        100.0 * c / v,
        per(c, v)
    );
}
