//! Throughput of the output scanner (`OutputScanner::feed`, which now also
//! reads training progress from every line and `\r` segment) on three
//! inputs: an ordinary training log, a tqdm bar redrawn with `\r`, and a
//! 100 MB stream with no line end at all. The relay passes bytes through
//! this scanner, so its MB/s bounds what progress reading can cost.
//!
//! `cargo bench --bench scan`

#![allow(clippy::print_stdout)]

use std::time::Instant;

use oomguard::probe::output::OutputScanner;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// MB/s over `runs` passes of `input`, fed in 64 KiB reads as the relay does.
fn throughput(input: &[u8], runs: usize) -> f64 {
    let mut rates = Vec::new();
    for _ in 0..runs {
        let mut s = OutputScanner::new();
        let t0 = Instant::now();
        for chunk in input.chunks(64 * 1024) {
            s.feed(chunk);
            let _ = s.take_events();
        }
        s.finish();
        let secs = t0.elapsed().as_secs_f64();
        rates.push(input.len() as f64 / 1e6 / secs);
    }
    median(rates)
}

/// MB/s of the progress parser alone over the same lines / segments: the
/// share of the scanner's time that progress reading takes.
fn parse_only(input: &str, sep: char) -> f64 {
    let mut rates = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let mut found = 0usize;
        for line in input.split(sep) {
            found += usize::from(oomguard::forensics::progress::parse(line).is_some());
        }
        let secs = t0.elapsed().as_secs_f64();
        assert!(found > 0);
        rates.push(input.len() as f64 / 1e6 / secs);
    }
    median(rates)
}

fn main() {
    let mut log = String::new();
    let mut i = 0u64;
    while log.len() < 20 << 20 {
        i += 1;
        log.push_str(&format!(
            "2026-11-23 10:00:{:02} INFO train.py:88 loss=0.{i:04} lr=3e-4 grad_norm=1.{i:03} tokens/s=12345\n",
            i % 60
        ));
        if i.is_multiple_of(50) {
            log.push_str(&format!(
                "Epoch [{}/10], Step [{i}/100000], Loss: 0.1234\n",
                i / 10000 + 1
            ));
        }
    }
    let mut bar = String::new();
    let mut n = 0u64;
    while bar.len() < 20 << 20 {
        n += 1;
        bar.push_str(&format!(
            "\rEpoch 3:  {:3}%|████▌     | {n}/1288000 [01:02<01:15,  9.41it/s, v_num=0, loss=0.123]",
            n * 100 / 1_288_000
        ));
    }
    let no_newline = vec![b'x'; 100 << 20];
    println!(
        "scanner, training log (20 MB):      {:8.1} MB/s",
        throughput(log.as_bytes(), 5)
    );
    println!(
        "scanner, tqdm bar with \\r (20 MB):  {:8.1} MB/s",
        throughput(bar.as_bytes(), 5)
    );
    println!(
        "scanner, 100 MB with no line end:   {:8.1} MB/s",
        throughput(&no_newline, 3)
    );
    println!(
        "progress parser alone, training log: {:8.1} MB/s",
        parse_only(&log, '\n')
    );
    println!(
        "progress parser alone, tqdm bar:     {:8.1} MB/s",
        parse_only(&bar, '\r')
    );
}
