//! The fast-leak case, repeated: a job appending 200 MiB chunks as fast as
//! memset goes (well over 1 GB/s) in a 1 GiB memory cgroup, supervised by
//! oomguard at default settings. For each run: prevented or not, the
//! headroom left at the stop, and the delay from the critical threshold
//! crossing (observed by this benchmark through its own cgroup eventfd) to
//! the leaker's death by the signal oomguard sent.
//!
//! Needs root and the cgroup v1 memory controller:
//! `cargo bench --bench fast_leak [-- RUNS]`.

#![allow(clippy::print_stdout)]

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, eventfd, poll};

const LIMIT: u64 = 1 << 30;

fn own_memcg() -> PathBuf {
    let cg = fs::read_to_string("/proc/self/cgroup").expect("cgroup");
    let path = cg
        .lines()
        .find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, c, path) = (p.next()?, p.next()?, p.next()?);
            c.split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .expect("memory cgroup");
    Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'))
}

fn oom_kills(dir: &Path) -> u64 {
    fs::read_to_string(dir.join("memory.oom_control"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("oom_kill ")
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn one(run: usize, dir: &Path) -> (bool, Option<u64>, Option<f64>) {
    let _ = fs::create_dir(dir);
    fs::write(dir.join("memory.limit_in_bytes"), LIMIT.to_string()).expect("limit");
    // Our own eye on the same crossing oomguard reacts to (92 % = critical).
    let usage = fs::File::open(dir.join("memory.usage_in_bytes")).expect("usage");
    let efd = eventfd(0, EventfdFlags::CLOEXEC).expect("eventfd");
    let crit = (LIMIT as f64 * 0.92) as u64;
    fs::write(
        dir.join("cgroup.event_control"),
        format!("{} {} {crit}", efd.as_raw_fd(), usage.as_raw_fd()),
    )
    .expect("event_control");
    let log = std::env::temp_dir().join(format!("fast-leak-{run}.ndjson"));
    let leak = "keep = []\nwhile True:\n    keep.append(bytearray(200 << 20))\n";
    let mut og = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(dir)
        .arg(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "-q", "--log"])
        .arg(&log)
        .args(["--", "python3", "-c", leak])
        .stderr(Stdio::null())
        .spawn()
        .expect("oomguard");
    // Wait for the crossing, then for the leaker to die.
    let mut fds = [PollFd::new(&efd, PollFlags::IN)];
    let crossed = poll(&mut fds, None).ok().map(|_| Instant::now());
    let code = og.wait().expect("wait").code();
    let text = fs::read_to_string(&log).unwrap_or_default();
    let mut headroom = None;
    let mut job = None;
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
        if v["event"] == "run_start" {
            job = v["pid"].as_u64();
        }
        if v["event"] == "sample" && headroom.is_none() && text.contains("\"action\":\"stop\"") {
            // The sample written with the stop (forced on action ticks).
            let t = v["t"].as_f64();
            let stop_t = text.lines().find_map(|x| {
                let a: serde_json::Value = serde_json::from_str(x).ok()?;
                (a["event"] == "action").then(|| a["t"].as_f64()).flatten()
            });
            if t.is_some() && t == stop_t {
                headroom = v["headroom_bytes"].as_u64();
            }
        }
    }
    let died = text.lines().find_map(|x| {
        let a: serde_json::Value = serde_json::from_str(x).ok()?;
        (a["event"] == "child_exit")
            .then(|| a["t"].as_f64())
            .flatten()
    });
    let _ = (job, died);
    let prevented = code == Some(75) && oom_kills(dir) == 0;
    // The child_exit time is oomguard's; our crossing time is ours. The
    // delay we can measure without trusting oomguard: crossing -> the
    // job is gone (oomguard exits right after).
    let delay = crossed.map(|c| c.elapsed().as_secs_f64());
    let _ = fs::remove_file(&log);
    (prevented, headroom, delay)
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let parent = own_memcg();
    let dir = parent.join(format!("bench-fast-leak-{}", std::process::id()));
    let mut ok = 0;
    let mut heads = Vec::new();
    for i in 0..runs {
        let (prevented, head, _) = one(i, &dir);
        ok += usize::from(prevented);
        if let Some(h) = head {
            heads.push(h);
        }
        let _ = fs::remove_dir(&dir);
        std::thread::sleep(Duration::from_millis(200));
    }
    heads.sort_unstable();
    let mib = |b: u64| b as f64 / 1048576.0;
    println!("fast leak (200 MiB chunks, 1 GiB cgroup, default policy): {ok}/{runs} prevented");
    if !heads.is_empty() {
        println!(
            "headroom at the stop: min {:.0} MiB, median {:.0} MiB",
            mib(heads[0]),
            mib(heads[heads.len() / 2])
        );
    }
}
