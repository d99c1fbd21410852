//! The vocabulary every other module speaks: one tick's raw readings
//! (`Sample`) and what follows from them (`View`: ceilings, headroom, ETA).
//!
//! Plain data only. No file system, no clock, no runtime: time arrives as
//! `Sample::t` (seconds since the run started), so everything here can be
//! tested with hand-built sequences.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::vocab::growth::{self, Tail};

/// Where a process sits in the job (see design.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// sh, bash, env, timeout, srun, torchrun and other wrappers.
    Launcher,
    /// The first process below the launchers: the training script.
    Trainer,
    /// A descendant of a trainer (DataLoader workers).
    Worker,
    /// Anything else in the tree (orphans of unknown origin, helpers); also
    /// what a log reader makes of a role it does not know.
    #[serde(other)]
    Other,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Launcher, Role::Trainer, Role::Worker, Role::Other];

    fn other() -> Role {
        Role::Other
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Launcher => "launcher",
            Role::Trainer => "trainer",
            Role::Worker => "worker",
            Role::Other => "other",
        }
    }
}

/// One process of the tree at one tick.
///
/// `pss_bytes` and `uss_bytes` come from `smaps_rollup`, which is expensive
/// and therefore swept at most every `--pss-interval`; between sweeps they
/// are carried forward by the process's RSS change, since fresh allocations
/// are private and count fully. `swap_bytes` is the process's share of swap
/// (SwapPss) from the same sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcSample {
    pub pid: u32,
    // A log reader takes a process with only some figures (an older or a
    // hand-written line): the others read as 0.
    #[serde(default)]
    pub ppid: u32,
    #[serde(default = "Role::other")]
    pub role: Role,
    #[serde(default)]
    pub comm: String,
    #[serde(default)]
    pub rss_bytes: u64,
    #[serde(default)]
    pub pss_bytes: u64,
    #[serde(default)]
    pub uss_bytes: u64,
    #[serde(default)]
    pub swap_bytes: u64,
    /// On a process list: the most RSS any tick saw since the process's
    /// previous list, when more than `rss_bytes` (memory that rose and fell
    /// between two lists, such as evaluation outputs gathered and freed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_peak_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_bytes: Option<u64>,
    /// How old the `smaps_rollup` reading behind `pss_bytes`/`uss_bytes`
    /// is, seconds; `None` for a process not read yet (its figures are
    /// the sweeper's estimate). A list's readings are of different ages:
    /// a per-process rate or growth is placed at the reading's time, not
    /// the line's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_age_seconds: Option<f64>,
    /// PyTorch's caching allocator per device (`--torch-stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<Vec<TorchDeviceStats>>,
    /// Kernel start time in clock ticks: with `pid`, the identity of the
    /// process (pids are reused).
    #[serde(skip)]
    pub start_time: u64,
    /// Stopped by a signal (state `T`; not a debugger's trace stop).
    #[serde(skip)]
    pub stopped: bool,
}

/// Sums over the tree. The footprint is the PSS sum, never the RSS sum.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TreeTotals {
    pub procs: u32,
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    pub uss_bytes: u64,
    pub swap_bytes: u64,
    /// What the job costs right now: the working set of the cgroup oomguard
    /// created for it when it has one (exact, includes page cache it cannot
    /// drop and `/dev/shm`), otherwise the PSS sum.
    pub footprint_bytes: u64,
    /// Age of the oldest `smaps_rollup` reading behind `pss_bytes`.
    pub pss_age_seconds: f64,
}

/// One role's share of the tree at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleTotals {
    pub role: Role,
    pub pss_bytes: u64,
    pub rss_bytes: u64,
}

/// PSS and RSS summed by role, for the roles present, in [`Role::ALL`]
/// order. Every sample line carries these, so the report's stack and the
/// role metric never have to guess between per-process lists.
pub fn role_totals(procs: &[ProcSample]) -> Vec<RoleTotals> {
    Role::ALL
        .iter()
        .filter_map(|&role| {
            let mut it = procs.iter().filter(|p| p.role == role).peekable();
            it.peek()?;
            let (pss_bytes, rss_bytes) = it.fold((0, 0), |(pss, rss), p| {
                (pss + p.pss_bytes, rss + p.rss_bytes)
            });
            Some(RoleTotals {
                role,
                pss_bytes,
                rss_bytes,
            })
        })
        .collect()
}

/// Machine-wide memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SystemSample {
    pub mem_total_bytes: u64,
    pub mem_available_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_used_bytes: u64,
    pub swap_in_bytes_per_s: f64,
    pub swap_out_bytes_per_s: f64,
    /// `/proc/vmstat` `oom_kill`: kernel OOM kills anywhere on the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kill_total: Option<u64>,
}

/// The job's memory cgroup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CgroupSample {
    /// 1 or 2.
    #[serde(default)]
    pub version: u8,
    /// The job's cgroup, relative to the hierarchy root (`/a/b`). The log
    /// writes it (and `limit_path`) only on lines with a process list: it
    /// is fixed for the run and, long, cost ~11 MB a day on every line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Raw usage of the job's cgroup (includes page cache).
    #[serde(default)]
    pub usage_bytes: u64,
    /// The tightest limit of the cgroup and its ancestors; null when none.
    pub limit_bytes: Option<u64>,
    /// OOM kills of processes in the job's cgroup.
    pub oom_kill_count: Option<u64>,
    /// The cgroup that holds `limit_bytes` (may be an ancestor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_path: Option<String>,
    /// Usage minus inactive file cache of the cgroup holding the limit: what
    /// the kernel cannot simply drop before it starts killing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_working_set_bytes: Option<u64>,
    /// Whether oomguard created this cgroup for the job.
    #[serde(default)]
    pub owned: bool,
}

/// Memory pressure stall information (`/proc/pressure/memory` or the
/// cgroup's `memory.pressure`): share of the last 10 s some / all tasks
/// were stalled on memory, in percent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Psi {
    pub some_avg10: f64,
    pub full_avg10: f64,
}

/// One GPU at one tick (NVML).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuSample {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub used_bytes: u64,
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// NVML's driver reserve, not PyTorch's cache.
    pub reserved_bytes: u64,
    pub util_percent: Option<u32>,
    /// GPU memory of processes in the tree.
    #[serde(default)]
    pub tree_bytes: u64,
    /// GPU memory of processes outside the tree.
    #[serde(default)]
    pub foreign_bytes: u64,
    /// How old the reading is, when a tick carries an earlier one (fast
    /// ticks do not wait for NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<f64>,
}

/// The tmpfs the job sees at `/dev/shm` (`engine::probe::shm`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ShmSample {
    pub size_bytes: u64,
    pub used_bytes: u64,
}

impl ShmSample {
    /// Whether it is a ceiling of its own: a size someone chose (Docker's
    /// 64 MiB, `--shm-size`, a sized `emptyDir`), below the kernel's
    /// default of half the machine's memory. At that default (or a tmpfs as
    /// large as memory), shared memory is memory and the memory ceilings
    /// watch it; a ceiling there would only stand nearest on every
    /// workstation, 0 of 12 GiB used.
    pub fn is_ceiling(&self, mem_total_bytes: u64) -> bool {
        mem_total_bytes == 0 || self.size_bytes < mem_total_bytes / 100 * 49
    }
}

/// The raw readings of one tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    pub tree: TreeTotals,
    pub procs: Vec<ProcSample>,
    pub system: SystemSample,
    pub cgroup: Option<CgroupSample>,
    pub psi: Option<Psi>,
    pub gpus: Vec<GpuSample>,
    /// `/dev/shm` as the job's trainer sees it, when it is a tmpfs.
    pub shm: Option<ShmSample>,
    /// The user's `--budget`, resolved to bytes.
    pub budget_bytes: Option<u64>,
    /// The footprint of the node's other tasks, when this oomguard decides
    /// for the node's tasks (one oomguard per rank): `--budget` is then the
    /// node's, and they count against it.
    pub others_bytes: u64,
}

/// What kind of limit a ceiling is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CeilingSource {
    Cgroup,
    Budget,
    System,
    /// The tmpfs at `/dev/shm`: full, it fails a write with ENOSPC or
    /// SIGBUS, not an OOM kill.
    Shm,
}

impl CeilingSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CeilingSource::Cgroup => "cgroup",
            CeilingSource::Budget => "budget",
            CeilingSource::System => "system",
            CeilingSource::Shm => "shm",
        }
    }

    /// The name a person reads (the dashboard, messages).
    pub fn label(self) -> &'static str {
        match self {
            CeilingSource::Shm => "/dev/shm",
            other => other.as_str(),
        }
    }
}

/// A limit the job must stay under.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ceiling {
    pub source: CeilingSource,
    pub bytes: u64,
}

/// A ceiling with how much is left under it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CeilingState {
    pub ceiling: Ceiling,
    pub used_bytes: u64,
    pub headroom_bytes: u64,
}

impl CeilingState {
    pub fn headroom_percent(&self) -> f64 {
        percent(self.headroom_bytes, self.ceiling.bytes)
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64 * 100.0).clamp(0.0, 100.0)
    }
}

impl Sample {
    /// Every ceiling that applies, with the headroom under it.
    pub fn ceilings(&self) -> Vec<CeilingState> {
        let mut out = Vec::with_capacity(4);
        if let Some(cg) = &self.cgroup
            && let Some(limit) = cg.limit_bytes
        {
            let used = cg.limit_working_set_bytes.unwrap_or(cg.usage_bytes);
            out.push(CeilingState {
                ceiling: Ceiling {
                    source: CeilingSource::Cgroup,
                    bytes: limit,
                },
                used_bytes: used,
                headroom_bytes: limit.saturating_sub(used),
            });
        }
        if let Some(budget) = self.budget_bytes {
            out.push(CeilingState {
                ceiling: Ceiling {
                    source: CeilingSource::Budget,
                    bytes: budget,
                },
                used_bytes: self.tree.footprint_bytes + self.others_bytes,
                headroom_bytes: budget
                    .saturating_sub(self.tree.footprint_bytes + self.others_bytes),
            });
        }
        if self.system.mem_total_bytes > 0 {
            out.push(CeilingState {
                ceiling: Ceiling {
                    source: CeilingSource::System,
                    bytes: self.system.mem_total_bytes,
                },
                used_bytes: self
                    .system
                    .mem_total_bytes
                    .saturating_sub(self.system.mem_available_bytes),
                headroom_bytes: self.system.mem_available_bytes,
            });
        }
        // Its bytes are memory too, already in the cgroup's and the
        // machine's use: a ceiling beside them, never added to them.
        if let Some(shm) = self
            .shm
            .filter(|s| s.is_ceiling(self.system.mem_total_bytes))
        {
            out.push(CeilingState {
                ceiling: Ceiling {
                    source: CeilingSource::Shm,
                    bytes: shm.size_bytes,
                },
                used_bytes: shm.used_bytes,
                headroom_bytes: shm.size_bytes.saturating_sub(shm.used_bytes),
            });
        }
        out
    }

    /// The ceiling with the least headroom left: the one the job hits first.
    pub fn nearest(&self) -> Option<CeilingState> {
        self.ceilings()
            .into_iter()
            .min_by_key(|c| (c.headroom_bytes, c.ceiling.bytes))
    }
}

/// The derived view of one tick: what policies and sinks act on.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub t: f64,
    pub nearest: Option<CeilingState>,
    /// Seconds until headroom reaches 0 at the current growth; `None` when
    /// memory is not growing or there is too little history.
    pub eta_seconds: Option<f64>,
    /// Headroom change in bytes/s over the ETA window (negative = growing).
    pub headroom_slope: Option<f64>,
    /// The process whose footprint grew fastest over the window, bytes/s.
    pub fastest: Option<(u32, f64)>,
}

impl View {
    pub fn headroom_bytes(&self) -> Option<u64> {
        self.nearest.map(|c| c.headroom_bytes)
    }

    pub fn headroom_percent(&self) -> Option<f64> {
        self.nearest.map(|c| c.headroom_percent())
    }
}

/// A bounded history of recent ticks, from which rates and the ETA are
/// derived: the trend by least squares over the window, gated on growth
/// still going at the newest ticks ([`crate::vocab::growth`]).
#[derive(Debug, Clone)]
pub struct History {
    window: f64,
    points: VecDeque<Point>,
    /// The newest ticks' headroom, undecimated: the plateau gate reads the
    /// last two tick intervals, however short.
    tail: Tail,
}

#[derive(Debug, Clone)]
struct Point {
    t: f64,
    headroom: f64,
    procs: Vec<(u32, u64, u64)>,
}

/// Seconds of history the live loop's ETA and growth rates look at.
pub const ETA_WINDOW_SECONDS: f64 = 10.0;

/// Fewer points than this and the slope is noise.
const MIN_POINTS: usize = 3;
/// A process is rated for growth once seen over this many seconds.
const MIN_GROWTH_SPAN: f64 = 1.0;

impl History {
    /// `window`: seconds of history the ETA and growth rates look at.
    pub fn new(window: f64) -> Self {
        Self {
            window: window.max(0.5),
            points: VecDeque::new(),
            tail: Tail::default(),
        }
    }

    /// Records a sample and returns its view.
    pub fn push(&mut self, sample: &Sample) -> View {
        let procs = sample
            .procs
            .iter()
            .map(|p| (p.pid, p.start_time, p.pss_bytes))
            .collect();
        self.push_reading(sample.t, sample.nearest(), procs)
    }

    /// Records one tick's headroom under its nearest ceiling (and each
    /// process's `(pid, start time, PSS)`) and returns its view: what
    /// `push` does from a live sample, and `replay` from a logged one.
    pub fn push_reading(
        &mut self,
        t: f64,
        nearest: Option<CeilingState>,
        procs: Vec<(u32, u64, u64)>,
    ) -> View {
        if let Some(last) = self.points.back()
            && t < last.t
        {
            // Time went backwards (a new attempt): old history says nothing.
            self.points.clear();
            self.tail.clear();
        }
        if let Some(n) = nearest {
            // Fast polling near a ceiling would flood the window; keep at
            // most one point per 100 ms (the newest). Measured from the
            // point before the newest: against the newest itself, 20 ms
            // ticks would replace it forever and the window would never
            // hold more than two points (no trend at all).
            let len = self.points.len();
            if len > 1 && t - self.points[len - 2].t < 0.1 {
                self.points.pop_back();
            }
            self.points.push_back(Point {
                t,
                headroom: n.headroom_bytes as f64,
                procs,
            });
            // Growth is headroom lost.
            self.tail.push(t, -(n.headroom_bytes as f64));
        }
        while let Some(front) = self.points.front() {
            if t - front.t > self.window && self.points.len() > MIN_POINTS {
                self.points.pop_front();
            } else {
                break;
            }
        }
        let headroom_slope = self.slope();
        // The trend alone would still show a ramp that ended seconds ago:
        // only growth that continues at the newest ticks has an ETA.
        let span = match (self.points.front(), self.points.back()) {
            (Some(a), Some(b)) => b.t - a.t,
            _ => 0.0,
        };
        let eta_seconds = match (nearest, headroom_slope) {
            (Some(n), Some(slope)) if slope < 0.0 && self.tail.continuing(-slope) => {
                let eta = (n.headroom_bytes as f64 / -slope).max(0.0);
                growth::keep_eta(eta, -slope, span, || {
                    self.points.iter().map(|p| (p.t, -p.headroom)).collect()
                })
            }
            _ => None,
        };
        View {
            t,
            nearest,
            eta_seconds,
            headroom_slope,
            fastest: self.fastest(),
        }
    }

    /// Forgets everything (a new attempt starts).
    pub fn clear(&mut self) {
        self.points.clear();
        self.tail.clear();
    }

    /// Least-squares slope of headroom over the window, or over the last
    /// `MIN_POINTS` points when the window holds fewer (slow sampling must
    /// not make the slope vanish).
    fn slope(&self) -> Option<f64> {
        let last = self.points.back()?.t;
        let in_window = self
            .points
            .iter()
            .filter(|p| last - p.t <= self.window)
            .count();
        let n = in_window.max(MIN_POINTS);
        if self.points.len() < n {
            return None;
        }
        let pts = self.points.iter().skip(self.points.len() - n);
        least_squares_slope(pts.map(|p| (p.t, p.headroom)))
    }

    /// The process whose PSS grew fastest over the window and is still
    /// growing at its newest readings, with its rate in bytes/s.
    fn fastest(&self) -> Option<(u32, f64)> {
        let last = self.points.back()?;
        // Each process's readings in the window, newest first: a worker
        // born since the window began is rated over its own life in it
        // (compared with the window's first point only, it would be left
        // out until the window had moved past its birth).
        let mut seen: HashMap<(u32, u64), Vec<(f64, f64)>> = last
            .procs
            .iter()
            .map(|&(pid, start, pss)| ((pid, start), vec![(last.t, pss as f64)]))
            .collect();
        for p in self.points.iter().rev().skip(1) {
            for &(pid, start, pss) in &p.procs {
                if let Some(readings) = seen.get_mut(&(pid, start)) {
                    readings.push((p.t, pss as f64));
                }
            }
        }
        last.procs
            .iter()
            .filter_map(|&(pid, start, _)| {
                let readings = seen.get(&(pid, start))?;
                let (&(t1, now), &(t0, before)) = (readings.first()?, readings.last()?);
                let dt = t1 - t0;
                if dt < MIN_GROWTH_SPAN {
                    return None;
                }
                let rate = (now - before) / dt;
                let tail: Vec<(f64, f64)> =
                    readings.iter().take(growth::TAIL).rev().copied().collect();
                (rate > 0.0 && growth::continuing(&tail, rate)).then_some((pid, rate))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

pub use crate::vocab::growth::least_squares_slope;

/// One device's figures from `torch.cuda`, as reported by one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorchDeviceStats {
    /// CUDA device index as the process sees it (after `CUDA_VISIBLE_DEVICES`).
    pub device: u32,
    /// `torch.cuda.memory_allocated(device)`: bytes in live tensors.
    pub allocated_bytes: u64,
    /// `torch.cuda.memory_reserved(device)`: bytes the caching allocator holds.
    pub reserved_bytes: u64,
    /// `torch.cuda.max_memory_allocated(device)`: peak of `allocated_bytes`.
    pub max_allocated_bytes: u64,
    /// `memory_stats(device)["num_alloc_retries"]`: times a `cudaMalloc`
    /// failed and the allocator freed its cache to retry, the usual sign that
    /// an OOM is near.
    pub alloc_retries: u64,
}

impl TorchDeviceStats {
    /// Reserved but unallocated bytes (reserved − allocated): memory the
    /// allocator holds in blocks it could not hand out.
    pub fn fragmentation_bytes(&self) -> u64 {
        self.reserved_bytes.saturating_sub(self.allocated_bytes)
    }
}

/// Linux signals: number, name, and glibc's `strsignal()` text (what a
/// DataLoader prints for a worker that died of it). The one table:
/// oomguard's messages and log, the signals a user names, and PyTorch's
/// messages read from the job's output all go through it.
pub const SIGNALS: &[(i32, &str, &str)] = &[
    (libc::SIGHUP, "SIGHUP", "Hangup"),
    (libc::SIGINT, "SIGINT", "Interrupt"),
    (libc::SIGQUIT, "SIGQUIT", "Quit"),
    (libc::SIGILL, "SIGILL", "Illegal instruction"),
    (libc::SIGTRAP, "SIGTRAP", "Trace/breakpoint trap"),
    (libc::SIGABRT, "SIGABRT", "Aborted"),
    (libc::SIGBUS, "SIGBUS", "Bus error"),
    (libc::SIGFPE, "SIGFPE", "Floating point exception"),
    (libc::SIGKILL, "SIGKILL", "Killed"),
    (libc::SIGUSR1, "SIGUSR1", "User defined signal 1"),
    (libc::SIGSEGV, "SIGSEGV", "Segmentation fault"),
    (libc::SIGUSR2, "SIGUSR2", "User defined signal 2"),
    (libc::SIGPIPE, "SIGPIPE", "Broken pipe"),
    (libc::SIGALRM, "SIGALRM", "Alarm clock"),
    (libc::SIGTERM, "SIGTERM", "Terminated"),
    (libc::SIGSTKFLT, "SIGSTKFLT", "Stack fault"),
    (libc::SIGCHLD, "SIGCHLD", "Child exited"),
    (libc::SIGCONT, "SIGCONT", "Continued"),
    (libc::SIGSTOP, "SIGSTOP", "Stopped (signal)"),
    (libc::SIGTSTP, "SIGTSTP", "Stopped"),
    (libc::SIGTTIN, "SIGTTIN", "Stopped (tty input)"),
    (libc::SIGTTOU, "SIGTTOU", "Stopped (tty output)"),
    (libc::SIGURG, "SIGURG", "Urgent I/O condition"),
    (libc::SIGXCPU, "SIGXCPU", "CPU time limit exceeded"),
    (libc::SIGXFSZ, "SIGXFSZ", "File size limit exceeded"),
    (libc::SIGVTALRM, "SIGVTALRM", "Virtual timer expired"),
    (libc::SIGPROF, "SIGPROF", "Profiling timer expired"),
    (libc::SIGWINCH, "SIGWINCH", "Window changed"),
    (libc::SIGIO, "SIGIO", "I/O possible"),
    (libc::SIGPWR, "SIGPWR", "Power failure"),
    (libc::SIGSYS, "SIGSYS", "Bad system call"),
];

/// The name of a known signal (`9` → `SIGKILL`).
pub fn known_signal(sig: i32) -> Option<&'static str> {
    SIGNALS
        .iter()
        .find(|(n, _, _)| *n == sig)
        .map(|(_, name, _)| *name)
}

/// A signal's name for messages and the log (`SIGTERM`; `SIG40` for one
/// without a name).
pub fn signal_name(sig: i32) -> String {
    known_signal(sig).map_or_else(|| format!("SIG{sig}"), str::to_string)
}

/// Parses a signal a user names: `TERM`, `SIGTERM`, `sigterm` or `15`.
pub fn parse_signal(text: &str) -> Option<i32> {
    let t = text.trim();
    if let Ok(n) = t.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let up = t.to_ascii_uppercase();
    let name = up.strip_prefix("SIG").unwrap_or(&up);
    SIGNALS
        .iter()
        .find(|(_, n, _)| n.strip_prefix("SIG") == Some(name))
        .map(|(s, _, _)| *s)
}

#[cfg(test)]
pub mod testing {
    //! Builders for hand-made samples, shared by the policy tests.
    use super::*;

    /// A sample at `t` under a 1000-byte budget with `footprint` used and a
    /// machine that has plenty of memory.
    pub fn budget_sample(t: f64, footprint: u64) -> Sample {
        Sample {
            t,
            tree: TreeTotals {
                procs: 1,
                pss_bytes: footprint,
                footprint_bytes: footprint,
                ..Default::default()
            },
            system: SystemSample {
                mem_total_bytes: 1 << 40,
                mem_available_bytes: 1 << 39,
                ..Default::default()
            },
            budget_bytes: Some(1000),
            others_bytes: 0,
            ..Default::default()
        }
    }

    /// The view of a tick at `t` with no ceiling, trend or grower.
    pub fn bare_view(t: f64) -> View {
        View {
            t,
            nearest: None,
            eta_seconds: None,
            headroom_slope: None,
            fastest: None,
        }
    }

    /// A process `pid` with `bytes` of RSS, PSS and USS alike.
    pub fn proc_sample(pid: u32, role: Role, bytes: u64) -> ProcSample {
        ProcSample {
            pid,
            ppid: 1,
            role,
            comm: "python".into(),
            rss_bytes: bytes,
            pss_bytes: bytes,
            uss_bytes: bytes,
            swap_bytes: 0,
            rss_peak_bytes: None,
            gpu_bytes: None,
            read_age_seconds: None,
            torch: None,
            start_time: u64::from(pid),
            stopped: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::budget_sample;
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn one_signal_table_names_parses_and_reads_strsignal_text() {
        assert_eq!(parse_signal("usr1"), Some(libc::SIGUSR1));
        assert_eq!(parse_signal(" SIGTERM "), Some(libc::SIGTERM));
        assert_eq!(parse_signal("15"), Some(15));
        assert_eq!(parse_signal("65"), None);
        assert_eq!(parse_signal("NOPE"), None);
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(40), "SIG40");
        assert_eq!(known_signal(40), None);
        let mut numbers: Vec<i32> = SIGNALS.iter().map(|s| s.0).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), SIGNALS.len(), "a number listed twice");
        assert_eq!(numbers, (1..=31).collect::<Vec<_>>());
    }

    /// `budget_sample` in MiB under a 1000 MiB budget: growth estimates
    /// ignore rises under `growth::FLOOR_BYTES`.
    fn mib_sample(t: f64, footprint_mib: u64) -> Sample {
        let mut s = budget_sample(t, footprint_mib * MIB);
        s.budget_bytes = Some(1000 * MIB);
        s
    }

    #[test]
    fn nearest_ceiling_is_the_one_with_least_headroom() {
        let mut s = budget_sample(0.0, 400);
        s.cgroup = Some(CgroupSample {
            version: 1,
            path: "/job".into(),
            usage_bytes: 900,
            limit_bytes: Some(2000),
            oom_kill_count: Some(0),
            limit_path: Some("/".into()),
            limit_working_set_bytes: Some(1700),
            owned: false,
        });
        let n = s.nearest().unwrap();
        assert_eq!(n.ceiling.source, CeilingSource::Cgroup);
        assert_eq!(n.headroom_bytes, 300);
        assert!((n.headroom_percent() - 15.0).abs() < 1e-9);
        s.tree.footprint_bytes = 800;
        assert_eq!(s.nearest().unwrap().ceiling.source, CeilingSource::Budget);
    }

    #[test]
    fn dev_shm_is_a_ceiling_beside_the_others_never_added_to_them() {
        const MIB: u64 = 1 << 20;
        let mut s = budget_sample(0.0, 0);
        s.budget_bytes = None;
        s.system.mem_total_bytes = 16 << 30;
        s.system.mem_available_bytes = 15 << 30;
        s.tree.footprint_bytes = 230 * MIB;
        s.cgroup = Some(CgroupSample {
            version: 2,
            path: "/job".into(),
            usage_bytes: 240 * MIB,
            limit_bytes: Some(256 * MIB),
            oom_kill_count: Some(0),
            limit_path: None,
            limit_working_set_bytes: Some(240 * MIB),
            owned: true,
        });
        // 40 MiB of the cgroup's 240 are /dev/shm's: 24 MiB left there,
        // 16 MiB under the cgroup limit. The cgroup is nearer, and stops
        // the job; neither figure counts the 40 MiB twice.
        s.shm = Some(ShmSample {
            size_bytes: 64 * MIB,
            used_bytes: 40 * MIB,
        });
        let all = s.ceilings();
        assert_eq!(all.len(), 3);
        let n = s.nearest().unwrap();
        assert_eq!(
            (n.ceiling.source, n.used_bytes),
            (CeilingSource::Cgroup, 240 * MIB)
        );
        let shm = all
            .iter()
            .find(|c| c.ceiling.source == CeilingSource::Shm)
            .unwrap();
        assert_eq!((shm.used_bytes, shm.headroom_bytes), (40 * MIB, 24 * MIB));
        // Nearer when the job's other memory is small.
        s.cgroup.as_mut().unwrap().limit_working_set_bytes = Some(60 * MIB);
        assert_eq!(s.nearest().unwrap().ceiling.source, CeilingSource::Shm);
        // The kernel's default size (half of memory) is memory, not a ceiling.
        s.shm = Some(ShmSample {
            size_bytes: 8 << 30,
            used_bytes: 40 * MIB,
        });
        assert!(
            s.ceilings()
                .iter()
                .all(|c| c.ceiling.source != CeilingSource::Shm)
        );
    }

    #[test]
    fn over_budget_headroom_is_zero_not_negative() {
        let s = budget_sample(0.0, 5000);
        assert_eq!(s.nearest().unwrap().headroom_bytes, 0);
        assert_eq!(s.nearest().unwrap().headroom_percent(), 0.0);
    }

    #[test]
    fn eta_on_linear_growth() {
        let mut h = History::new(30.0);
        let mut v = None;
        for i in 0..10 {
            // 10 bytes/s growth under a 1000-byte budget.
            v = Some(h.push(&mib_sample(i as f64, 100 + 10 * i)));
        }
        let v = v.unwrap();
        assert_eq!(v.headroom_bytes(), Some(810 * MIB));
        assert!((v.eta_seconds.unwrap() - 81.0).abs() < 1e-6);
    }

    #[test]
    fn eta_on_noisy_growth_is_close() {
        let mut h = History::new(60.0);
        let mut v = None;
        let noise = [7i64, -5, 3, -8, 6, -2, 4, -6, 1, 0, 5, -4];
        for (i, n) in noise.iter().enumerate() {
            let fp = (100 + 20 * i as i64 + n) as u64;
            v = Some(h.push(&mib_sample(i as f64, fp)));
        }
        let eta = v.unwrap().eta_seconds.unwrap();
        // True: headroom ~ 1000 - 320 = 680 at 20 B/s => ~34 s.
        assert!((eta - 34.0).abs() < 3.0, "eta {eta}");
    }

    #[test]
    fn no_eta_when_flat_or_shrinking_or_too_short() {
        let mut h = History::new(30.0);
        assert_eq!(h.push(&budget_sample(0.0, 500)).eta_seconds, None);
        assert_eq!(h.push(&budget_sample(1.0, 600)).eta_seconds, None);
        let mut h = History::new(30.0);
        for i in 0..5 {
            assert_eq!(h.push(&budget_sample(i as f64, 500)).eta_seconds, None);
        }
        for i in 5..10 {
            assert_eq!(
                h.push(&budget_sample(i as f64, 500 - 20 * (i - 4)))
                    .eta_seconds,
                None
            );
        }
    }

    #[test]
    fn window_drops_old_points() {
        let mut h = History::new(5.0);
        // Fast growth long ago, flat now: the ETA must forget the past.
        for i in 0..10 {
            h.push(&budget_sample(i as f64, 100 * i));
        }
        let mut v = None;
        for i in 10..20 {
            v = Some(h.push(&budget_sample(i as f64, 900)));
        }
        assert_eq!(v.unwrap().eta_seconds, None);
    }

    #[test]
    fn a_burst_that_stopped_has_no_eta() {
        let mut h = History::new(10.0);
        // 500 bytes at once, then flat: not a leak.
        let mut last = None;
        for (t, fp) in [
            (0.0, 0),
            (1.0, 250),
            (2.0, 500),
            (3.0, 500),
            (4.0, 500),
            (5.0, 500),
            (6.0, 500),
        ] {
            last = Some(h.push(&budget_sample(t, fp)));
        }
        assert_eq!(last.unwrap().eta_seconds, None);
    }

    /// The ETA of a fast load that stops: present while it grows, `None`
    /// at most two ticks after the last growing one, at 1 s ticks and at
    /// the 20 ms ticks near a ceiling alike.
    #[test]
    fn eta_is_none_within_two_ticks_of_growth_ending() {
        for tick in [1.0, 0.25, 0.1, 0.02] {
            let mut h = History::new(10.0);
            // 100 B/s under a budget of 1000 bytes... scaled to MiB so the
            // noise floor is well below a tick's growth.
            let mib = 1u64 << 20;
            let budget = 1000 * mib;
            let mk = |t: f64, fp: u64| {
                let mut s = budget_sample(t, fp);
                s.budget_bytes = Some(budget);
                s
            };
            // Growth at 300 MiB/s for 2 s, from 100 MiB.
            let ticks = (2.0 / tick) as u64;
            let mut t = 0.0;
            let mut fp = 100 * mib;
            let mut last_growing = None;
            for _ in 0..=ticks {
                last_growing = Some(h.push(&mk(t, fp)));
                t += tick;
                fp += (300.0 * tick) as u64 * mib;
            }
            let v = last_growing.unwrap();
            assert!(v.eta_seconds.is_some(), "tick {tick}: growing has an ETA");
            // Flat from here, with the trend still steep.
            let fp = fp - (300.0 * tick) as u64 * mib;
            let first = h.push(&mk(t, fp));
            let second = h.push(&mk(t + tick, fp));
            assert!(
                second.headroom_slope.unwrap() < -50.0 * mib as f64,
                "tick {tick}: the trend still shows the ramp"
            );
            assert_eq!(second.eta_seconds, None, "tick {tick}: two flat ticks");
            let _ = first;
            for i in 2..40 {
                let v = h.push(&mk(t + tick * f64::from(i), fp));
                assert_eq!(v.eta_seconds, None, "tick {tick}: flat tick {i}");
            }
        }
    }

    #[test]
    fn a_plateau_with_allocator_noise_has_no_lasting_eta() {
        let mut h = History::new(10.0);
        // A 700 MiB load in 2 s, then ±4 MiB of noise every 100 ms: with the
        // trend still steep, noise that happens to rise for two ticks can
        // give one tick an ETA, never the 2 s a growth rule waits out.
        for i in 0..=20 {
            h.push(&mib_sample(f64::from(i) * 0.1, 100 + 35 * i as u64));
        }
        let noise = [3i64, -2, 4, -4, 1, 2, -3, 4, 0, -1];
        let (mut run, mut longest, mut with_eta) = (0, 0, 0);
        for i in 0..100 {
            let fp = (800 + noise[i % noise.len()]) as u64;
            let v = h.push(&mib_sample(2.0 + 0.1 * (i + 1) as f64, fp));
            if i >= 1 && v.eta_seconds.is_some() {
                run += 1;
                with_eta += 1;
            } else {
                run = 0;
            }
            longest = longest.max(run);
        }
        // 0.3 s at most, far from the 2 s of `critical-eta`'s `for`.
        assert!(longest <= 3, "an ETA held for {longest} ticks");
        assert!(with_eta <= 10, "{with_eta} of 100 noise ticks had an ETA");
    }

    #[test]
    fn slow_sampling_keeps_the_eta() {
        let mut h = History::new(10.0);
        let mut v = None;
        for i in 0..6 {
            // 2.5 s apart: never three points within the 2 s recent window.
            v = Some(h.push(&mib_sample(i as f64 * 2.5, 100 + 50 * i)));
        }
        assert!(v.unwrap().eta_seconds.is_some());
    }

    #[test]
    fn fastest_process() {
        let mut h = History::new(30.0);
        let mk = |t: f64, a: u64, b: u64| {
            let mut s = mib_sample(t, a + b);
            s.procs = vec![
                ProcSample {
                    pid: 10,
                    ppid: 1,
                    role: Role::Trainer,
                    comm: "python".into(),
                    rss_bytes: a * MIB,
                    pss_bytes: a * MIB,
                    uss_bytes: a * MIB,
                    swap_bytes: 0,
                    rss_peak_bytes: None,
                    gpu_bytes: None,
                    read_age_seconds: None,
                    torch: None,
                    start_time: 5,
                    stopped: false,
                },
                ProcSample {
                    pid: 11,
                    ppid: 10,
                    role: Role::Worker,
                    comm: "python".into(),
                    rss_bytes: b * MIB,
                    pss_bytes: b * MIB,
                    uss_bytes: b * MIB,
                    swap_bytes: 0,
                    rss_peak_bytes: None,
                    gpu_bytes: None,
                    read_age_seconds: None,
                    torch: None,
                    start_time: 6,
                    stopped: false,
                },
            ];
            s
        };
        h.push(&mk(0.0, 100, 100));
        let v = h.push(&mk(2.0, 110, 300));
        assert_eq!(v.fastest, Some((11, 100.0 * MIB as f64)));
        // A worker born after the window began is rated over its own life:
        // it grows 50/s, faster than the others, and is the fastest.
        let mut s = mk(3.0, 110, 300);
        let mut born = s.procs[1].clone();
        born.pid = 12;
        born.start_time = 7;
        born.pss_bytes = 1000 * MIB;
        s.procs.push(born.clone());
        let fastest = h.push(&s).fastest.map(|f| f.0);
        assert_eq!(fastest, Some(11), "a newborn is not rated yet");
        let mut s = mk(5.0, 110, 300);
        born.pss_bytes = 1100 * MIB;
        s.procs.push(born.clone());
        assert_eq!(h.push(&s).fastest, Some((12, 50.0 * MIB as f64)));
        // Flat from here: two readings later nobody is growing, though
        // the window still spans the growth.
        let mut s = mk(6.0, 110, 300);
        born.pss_bytes = 1100 * MIB;
        s.procs.push(born.clone());
        h.push(&s);
        let mut s = mk(7.0, 110, 300);
        s.procs.push(born);
        assert_eq!(h.push(&s).fastest, None);
    }

    #[test]
    fn time_going_backwards_resets() {
        let mut h = History::new(30.0);
        for i in 0..5 {
            h.push(&budget_sample(i as f64, 100 * i));
        }
        let v = h.push(&budget_sample(0.0, 100));
        assert_eq!(v.eta_seconds, None);
    }
}
