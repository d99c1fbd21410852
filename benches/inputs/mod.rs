//! What the benchmarks share: the synthetic job output the scan and relay
//! benchmarks feed oomguard (so both measure the same streams), the median
//! they report, and a process's CPU time.

// Each benchmark uses only part of this.
#![allow(dead_code)]

/// A plain training loop's log, `bytes` long: ~100-byte lines, a
/// progress line every 50.
pub fn training_log(bytes: usize) -> String {
    let mut log = String::new();
    let mut i = 0u64;
    while log.len() < bytes {
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
    log
}

/// A Lightning tqdm bar counting to `total`, redrawn with `\r` and never
/// ended, `bytes` long.
pub fn tqdm_bar(bytes: usize, total: u64) -> String {
    let mut bar = String::new();
    let mut n = 0u64;
    while bar.len() < bytes {
        n += 1;
        bar.push_str(&format!(
            "\rEpoch 3:  {:3}%|████▌     | {n}/{total} [01:02<01:15,  9.41it/s, v_num=0, loss=0.123]",
            n * 100 / total
        ));
    }
    bar
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// utime + stime of `pid`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = procfs::process::Process::new(i32::try_from(pid).ok()?)
        .ok()?
        .stat()
        .ok()?;
    Some(stat.utime + stat.stime)
}
