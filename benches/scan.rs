//! Throughput of the output scanner (`OutputScanner::feed`, which now also
//! reads training progress from every line and `\r` segment) on three
//! inputs: an ordinary training log, a tqdm bar redrawn with `\r`, and a
//! 100 MB stream with no line end at all. The relay passes bytes through
//! this scanner, so its MB/s bounds what progress reading can cost.
//!
//! `cargo bench --bench scan`

#![allow(clippy::print_stdout)]

use std::time::Instant;

use oomguard::job::relay::OutputScanner;

mod inputs;
use inputs::{median, tqdm_bar, training_log};

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
            found += usize::from(oomguard::vocab::forensics::progress::parse(line).is_some());
        }
        let secs = t0.elapsed().as_secs_f64();
        assert!(found > 0);
        rates.push(input.len() as f64 / 1e6 / secs);
    }
    median(rates)
}

fn main() {
    let log = training_log(20 << 20);
    let bar = tqdm_bar(20 << 20, 1_288_000);
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
