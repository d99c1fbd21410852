//! The fast-leak case, repeated: a job appending 200 MiB chunks as fast as
//! memset goes (well over 1 GB/s; after a 0.3 s start) in a 1 GiB memory cgroup, supervised by
//! oomguard at default settings. For each run: prevented or not, the
//! headroom left at the stop, and two delays from the critical threshold
//! crossing (observed by this benchmark through its own cgroup eventfd):
//! to the *delivery* of the signal oomguard sent (the leaker's handler
//! records the monotonic clock the moment it runs), and to the leaker being
//! gone (which includes the kernel freeing its memory).
//!
//! The leaker is this same binary (`FAST_LEAK_RECORD` set): Python would
//! only run a signal handler after its current 200 MiB allocation.
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

/// The clock both sides read (the handler with the async-signal-safe
/// `clock_gettime`), in nanoseconds.
fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: `t` is a valid timespec to write into.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t);
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

static RECORD_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_term(_: libc::c_int) {
    let t = now_ns().to_le_bytes();
    let fd = RECORD_FD.load(std::sync::atomic::Ordering::SeqCst);
    #[allow(unsafe_code)]
    // SAFETY: write and _exit are async-signal-safe; `t` lives on this
    // handler's stack.
    unsafe {
        libc::write(fd, t.as_ptr().cast(), t.len());
        libc::_exit(0);
    }
}

/// The leaker: records when SIGTERM arrives, then appends 200 MiB chunks
/// as fast as memset goes.
fn leak(record: &str) -> ! {
    let f = fs::File::create(record).expect("record file");
    RECORD_FD.store(
        std::os::fd::IntoRawFd::into_raw_fd(f),
        std::sync::atomic::Ordering::SeqCst,
    );
    #[allow(unsafe_code)]
    // SAFETY: installs a handler that only makes async-signal-safe calls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_term as *const () as usize;
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
    // A short pause before leaking lets the benchmark find the leaker.
    std::thread::sleep(Duration::from_millis(300));
    let mut keep = Vec::new();
    loop {
        keep.push(vec![1u8; 200 << 20]);
    }
}

struct Run {
    prevented: bool,
    headroom_at_stop: Option<u64>,
    /// Critical crossing (our eventfd) -> the leaker is gone (its pidfd
    /// polls readable once it has exited, which includes the kernel freeing
    /// its ~1 GiB).
    delay: Option<Duration>,
    /// Critical crossing -> the leaker's SIGTERM handler ran.
    delivered: Option<Duration>,
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
    let record = std::env::temp_dir().join(format!("fast-leak-{run}.signal"));
    let _ = fs::remove_file(&record);
    let me = std::env::current_exe().expect("own path");
    let mut og = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(dir)
        .arg(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "-q", "--log"])
        .arg(&log)
        .arg("--")
        .arg(&me)
        .env("FAST_LEAK_RECORD", &record)
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
    let crossed = poll(&mut fds, None)
        .ok()
        .map(|_| (Instant::now(), now_ns()));
    let died = pidfd.as_ref().and_then(|fd| {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        poll(&mut fds, None).ok().map(|_| Instant::now())
    });
    // Kills in oomguard's own cgroup are counted there (cgroup v1), not in
    // ours: read it while it still exists.
    let job_cg = dir.join(format!("oomguard-{}", og.id()));
    let job_kills = oom_kills(&job_cg);
    let code = og.wait().expect("wait").code();
    let delivered = fs::read(&record)
        .ok()
        .and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?)))
        .zip(crossed)
        .map(|(at, (_, c))| Duration::from_nanos(at.saturating_sub(c)));
    let _ = fs::remove_file(&record);
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
        prevented: code == Some(75) && oom_kills(dir) + job_kills == 0,
        headroom_at_stop,
        delay: crossed
            .zip(died)
            .map(|((c, _), d)| d.saturating_duration_since(c)),
        delivered,
    }
}

fn main() {
    if let Some(record) = std::env::var_os("FAST_LEAK_RECORD") {
        leak(&record.to_string_lossy());
    }
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let parent = own_memcg();
    let dir = parent.join(format!("bench-fast-leak-{}", std::process::id()));
    let mut ok = 0;
    let mut heads = Vec::new();
    let mut delays = Vec::new();
    let mut delivered = Vec::new();
    let mut overshoots = Vec::new();
    for i in 0..runs {
        let r = one(i, &dir);
        ok += usize::from(r.prevented);
        heads.extend(r.headroom_at_stop);
        delays.extend(r.delay);
        delivered.extend(r.delivered);
        overshoots.extend(r.overshoot);
        let _ = fs::remove_dir(&dir);
        std::thread::sleep(Duration::from_millis(200));
    }
    heads.sort_unstable();
    delays.sort_unstable();
    delivered.sort_unstable();
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
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    if !delivered.is_empty() {
        println!(
            "critical crossing -> SIGTERM delivered to the leaker: min {:.2} ms, median {:.2} ms, max {:.2} ms ({} runs)",
            ms(delivered[0]),
            ms(delivered[delivered.len() / 2]),
            ms(delivered[delivered.len() - 1]),
            delivered.len()
        );
    }
    if !delays.is_empty() {
        println!(
            "critical crossing -> leaker gone (incl. freeing its memory): min {:.1} ms, median {:.1} ms, max {:.1} ms ({} runs)",
            ms(delays[0]),
            ms(delays[delays.len() / 2]),
            ms(delays[delays.len() - 1]),
            delays.len()
        );
    }
}
