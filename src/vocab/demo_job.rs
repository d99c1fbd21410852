//! The demo's job when python3 is not installed (or `OOMGUARD_DEMO_JOB=builtin`):
//! the same story as `demo.py`, in this binary, so `oomguard demo` needs
//! nothing but Rust. A trainer holds 128 MiB of "weights" and starts 4
//! workers (`oomguard demo-job worker`) whose caches grow by 1.5 MiB per
//! batch; on SIGTERM the trainer writes a checkpoint and exits. Unlike the
//! Python job the workers are separate programs, not forks, so they share
//! no copy-on-write pages with the trainer.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

const MIB: usize = 1 << 20;
const WORKERS: usize = 4;
/// Per batch, per worker: 1.5 MiB, as `demo.py`.
const LEAK: usize = 3 * MIB / 2;

/// Writes a line to the job's stdout (ours: this process is the job).
fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// A worker: one batch every 100 ms, each cached forever.
pub fn worker() -> i32 {
    let mut cache: Vec<Vec<u8>> = Vec::new();
    let mut out = std::io::stdout().lock();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        cache.push(vec![1u8; LEAK]);
        if out.write_all(b"b").and_then(|()| out.flush()).is_err() {
            return 0;
        }
    }
}

/// The trainer: reads one batch at a time and checkpoints on SIGTERM.
pub fn trainer(ckpt_dir: &Path) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("demo trainer: {e}");
            return 1;
        }
    };
    rt.block_on(train(ckpt_dir))
}

async fn train(ckpt_dir: &Path) -> i32 {
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        eprintln!("demo trainer: cannot handle SIGTERM");
        return 1;
    };
    let weights = std::hint::black_box(vec![1u8; 128 * MIB]);
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("demo trainer: {e}");
            return 1;
        }
    };
    let (tx, mut batches) = tokio::sync::mpsc::channel::<()>(64);
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let mut child = match Command::new(&exe)
            .args(["demo-job", "worker"])
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("demo trainer: cannot start a worker: {e}");
                return 1;
            }
        };
        if let Some(mut out) = child.stdout.take() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                while matches!(out.read(&mut b), Ok(1)) {
                    if tx.blocking_send(()).is_err() {
                        break;
                    }
                }
            });
        }
        workers.push(child);
    }
    drop(tx);
    say(&format!(
        "demo trainer: 128 MiB of weights, {WORKERS} DataLoader workers, each caching 1.5 MiB per batch"
    ));
    let mut step: u64 = 0;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            got = batches.recv() => {
                if got.is_none() {
                    return 3; // every worker is gone
                }
                step += 1;
                if step.is_multiple_of(40) {
                    say(&format!(
                        "step {step:4} | loss {:.3} | worker caches ~{:.0} MiB in total",
                        2.5 / (1.0 + step as f64 / 400.0),
                        step as f64 * 1.5
                    ));
                }
            }
        }
    }
    let path = ckpt_dir.join(format!("step-{step}.ckpt"));
    let tmp = path.with_extension("tmp");
    let saved = std::fs::create_dir_all(ckpt_dir)
        .and_then(|()| std::fs::write(&tmp, step.to_string()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = saved {
        eprintln!("demo trainer: cannot save '{}': {e}", path.display());
        return 1;
    }
    say(&format!(
        "demo trainer: SIGTERM received, checkpoint saved at step {step} ({}); exiting",
        path.display()
    ));
    drop(weights);
    0
}
