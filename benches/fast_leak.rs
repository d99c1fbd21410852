//! The fast-leak case, repeated: a job appending 200 MiB chunks as fast as
//! memset goes (well over 1 GB/s; after a 0.3 s start) in a 1 GiB memory cgroup, supervised by
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

/// The leaker: oomguard's child (found through /proc, like `pgrep -P`).
fn child_of(ppid: u32) -> Option<u32> {
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        let parent: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (parent == ppid).then_some(pid)
    })
}

struct Run {
    prevented: bool,
    headroom_at_stop: Option<u64>,
    /// Critical crossing (our eventfd) -> the leaker is gone (its pidfd
    /// polls readable once it has exited, which includes the kernel freeing
    /// its ~1 GiB).
    delay: Option<Duration>,
    /// How far the cgroup's peak usage went past the critical threshold.
    overshoot: Option<u64>,
}

fn one(run: usize, dir: &Path) -> Run {
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
    // A short pause before leaking lets this benchmark find the leaker.
    let leak = "import time\ntime.sleep(0.3)\nkeep = []\nwhile True:\n    keep.append(bytearray(200 << 20))\n";
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
    let t0 = Instant::now();
    let mut leaker = None;
    while leaker.is_none() && t0.elapsed() < Duration::from_secs(5) {
        leaker = child_of(og.id());
        std::thread::sleep(Duration::from_millis(5));
    }
    let pidfd = leaker.and_then(|p| {
        rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(p as i32)?,
            rustix::process::PidfdFlags::empty(),
        )
        .ok()
    });
    let mut fds = [PollFd::new(&efd, PollFlags::IN)];
    let crossed = poll(&mut fds, None).ok().map(|_| Instant::now());
    let died = pidfd.as_ref().and_then(|fd| {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        poll(&mut fds, None).ok().map(|_| Instant::now())
    });
    let code = og.wait().expect("wait").code();
    let text = fs::read_to_string(&log).unwrap_or_default();
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let stop_t = events
        .iter()
        .find(|v| v["event"] == "action" && v["action"] == "stop")
        .and_then(|v| v["t"].as_f64());
    // The sample written on the stop's tick (forced on action ticks).
    let headroom_at_stop = events
        .iter()
        .find(|v| v["event"] == "sample" && v["t"].as_f64() == stop_t)
        .and_then(|v| v["headroom_bytes"].as_u64());
    let _ = fs::remove_file(&log);
    let peak: Option<u64> = fs::read_to_string(dir.join("memory.max_usage_in_bytes"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    Run {
        overshoot: peak.map(|p| p.saturating_sub(crit)),
        prevented: code == Some(75) && oom_kills(dir) == 0,
        headroom_at_stop,
        delay: crossed
            .zip(died)
            .map(|(c, d)| d.saturating_duration_since(c)),
    }
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
    let mut delays = Vec::new();
    let mut overshoots = Vec::new();
    for i in 0..runs {
        let r = one(i, &dir);
        ok += usize::from(r.prevented);
        heads.extend(r.headroom_at_stop);
        delays.extend(r.delay);
        overshoots.extend(r.overshoot);
        let _ = fs::remove_dir(&dir);
        std::thread::sleep(Duration::from_millis(200));
    }
    heads.sort_unstable();
    delays.sort_unstable();
    overshoots.sort_unstable();
    let mib = |b: u64| b as f64 / 1048576.0;
    println!("fast leak (200 MiB chunks, 1 GiB cgroup, default policy): {ok}/{runs} prevented");
    if !heads.is_empty() {
        println!(
            "headroom at the stop: min {:.0} MiB, median {:.0} MiB",
            mib(heads[0]),
            mib(heads[heads.len() / 2])
        );
    }
    if !overshoots.is_empty() {
        println!(
            "peak usage past the critical threshold: min {:.1} MiB, median {:.1} MiB, max {:.1} MiB",
            mib(overshoots[0]),
            mib(overshoots[overshoots.len() / 2]),
            mib(overshoots[overshoots.len() - 1])
        );
    }
    if !delays.is_empty() {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "critical crossing -> leaker gone (incl. freeing its memory): min {:.1} ms, median {:.1} ms, max {:.1} ms ({} runs)",
            ms(delays[0]),
            ms(delays[delays.len() / 2]),
            ms(delays[delays.len() - 1]),
            delays.len()
        );
    }
}
