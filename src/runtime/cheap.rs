//! The cheap loop: between ticks, one read of the usage counter of the
//! cgroup that holds the nearest limit, paced by how soon that limit's next
//! level (warn, critical, last resort) could be reached at the fastest
//! growth this machine can produce. A crossing makes the next tick run at
//! once.
//!
//! It is what a normal user has instead of the kernel's v1 usage
//! thresholds (root only) and a fast PSI trigger (an unprivileged trigger
//! must use a 2 s window): a cgroup that fills in half a second would
//! otherwise meet only the fixed 250/100/20 ms ladder. One read costs tens
//! of microseconds; with the job far from its levels they are far apart
//! (`run_end.cheap_loop` counts them and their time).
//!
//! The counter includes page cache the kernel drops before it kills, which
//! the ticks leave out (the working set); each tick hands over the
//! difference, so a cgroup full of cache does not look full here.
//!
//! A small `/dev/shm` (a container's 64 MiB) is followed the same way, by
//! its own loop over one `fstatfs` (7.7 µs a read, measured by
//! `run_end.cheap_loop`): DataLoader workers can fill it in a second, and
//! a write past its end fails with ENOSPC in a worker, not in oomguard's
//! sight.

use std::cell::OnceCell;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::engine::probe::shm;

/// Growth one CPU can produce, bytes/s: first-touch page faults of a
/// memset-style leak ran at about 2 GiB/s per process here. The whole
/// machine's is this times the online CPUs.
pub const GROWTH_PER_CPU: f64 = 2.0 * 1024.0 * 1024.0 * 1024.0;

/// Reads no closer together than this, however close a level is.
pub const MIN_GAP: Duration = Duration::from_millis(1);

/// Reads of `/dev/shm` no closer together than this (see
/// [`Counter::min_gap`]).
pub const SHM_MIN_GAP: Duration = Duration::from_millis(50);

/// Share of the time the fastest growth needs to reach the next level that
/// may pass before the next read: a half leaves a read in hand.
const SHARE: f64 = 0.5;

/// How long until the next read: half the time growth at `max_rate`
/// (bytes/s) needs from `used` to `next_level` (both bytes of working set),
/// between [`MIN_GAP`] and `max_gap`. `None` when no level is left above.
pub fn pace(
    used: u64,
    next_level: Option<u64>,
    max_rate: f64,
    max_gap: Duration,
) -> Option<Duration> {
    let level = next_level?;
    let room = level.saturating_sub(used) as f64;
    let secs = room / max_rate.max(1.0) * SHARE;
    Some(Duration::from_secs_f64(secs).clamp(MIN_GAP, max_gap.max(MIN_GAP)))
}

/// The levels (bytes of working set) of one limit: where usage crosses
/// `100 − h` % of it for each headroom threshold `h` (in %).
pub fn levels(limit: u64, headroom_percents: &[f64]) -> Vec<u64> {
    let mut v: Vec<u64> = headroom_percents
        .iter()
        .filter(|h| h.is_finite() && **h > 0.0 && **h < 100.0)
        .map(|h| (limit as f64 * (1.0 - h / 100.0)) as u64)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// What a loop reads between ticks.
#[derive(Debug)]
pub enum Counter {
    /// The usage counter of the cgroup that holds the limit:
    /// `memory.usage_in_bytes` (v1) or `memory.current` (v2).
    Usage(PathBuf),
    /// The bytes in use of the tmpfs at this path (the job's `/dev/shm`),
    /// read through the directory held open (from the first read).
    Shm(PathBuf, OnceCell<Option<OwnedFd>>),
}

impl Counter {
    /// The job's `/dev/shm` at `path`.
    pub fn shm(path: &Path) -> Self {
        Counter::Shm(path.to_path_buf(), OnceCell::new())
    }

    fn read(&self) -> Option<u64> {
        match self {
            Counter::Usage(file) => std::fs::read_to_string(file)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok()),
            Counter::Shm(path, dir) => {
                shm::read_fd(dir.get_or_init(|| shm::open(path)).as_ref()?).map(|s| s.used_bytes)
            }
        }
    }

    /// Reads the same thing as `other`.
    fn same(&self, other: &Counter) -> bool {
        match (self, other) {
            (Counter::Usage(a), Counter::Usage(b)) | (Counter::Shm(a, _), Counter::Shm(b, _)) => {
                a == b
            }
            _ => false,
        }
    }

    /// The closest two reads may come: a cgroup's limit is GiBs, read as
    /// often as its levels ask; a `/dev/shm` is tens of MiBs, where the
    /// fastest growth would ask for a read every few milliseconds all run
    /// long (measured on a 64 MiB tmpfs half full: 280 reads a second cost
    /// 1.9 % of a core, one per 20 ms 0.75 %, the wake-up more than the
    /// `fstatfs`). One per 50 ms: a DataLoader filling it at 200 MiB/s
    /// moves 10 MiB (16 %) between reads, at 20 MiB/s 1 MiB.
    fn min_gap(&self) -> Duration {
        match self {
            Counter::Usage(_) => MIN_GAP,
            Counter::Shm(..) => SHM_MIN_GAP,
        }
    }
}

/// The loop's state for the limit a run is under.
#[derive(Debug)]
pub struct CheapLoop {
    counter: Counter,
    levels: Vec<u64>,
    /// Usage − working set at the last tick (page cache).
    cache: u64,
    /// The working set at the last tick: the next level is the first
    /// above it.
    used: u64,
    max_rate: f64,
    max_gap: Duration,
    next: Option<Instant>,
    /// Reads so far, and the time they took.
    reads: u64,
    read_time: Duration,
}

impl CheapLoop {
    /// `max_gap`: `--interval`.
    pub fn new(counter: Counter, max_rate: f64, max_gap: Duration) -> Self {
        Self {
            counter,
            levels: Vec::new(),
            cache: 0,
            used: 0,
            max_rate,
            max_gap,
            next: None,
            reads: 0,
            read_time: Duration::ZERO,
        }
    }

    /// Reads so far, and the time they took.
    pub fn reads(&self) -> (u64, Duration) {
        (self.reads, self.read_time)
    }

    /// The machine's fastest growth: [`GROWTH_PER_CPU`] × online CPUs.
    pub fn machine_rate() -> f64 {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        GROWTH_PER_CPU * cpus as f64
    }

    /// After a tick: the loop over `counter` (started, or started again
    /// when the limit moved to another cgroup, or the trainer to another
    /// `/dev/shm`), with the limit's `levels` and the working set the tick
    /// saw. `max_gap`: `--interval`.
    pub fn follow(
        slot: &mut Option<Self>,
        counter: Counter,
        max_gap: Duration,
        (levels, working_set): (Vec<u64>, u64),
        now: Instant,
    ) {
        let me = match slot {
            Some(c) if c.counter.same(&counter) => c,
            slot => slot.insert(Self::new(counter, Self::machine_rate(), max_gap)),
        };
        let counter = me.read();
        me.update(levels, working_set, counter, now);
    }

    /// One read of the counter, counted in the loop's cost.
    fn read(&mut self) -> Option<u64> {
        // What the read cost, in real time.
        let t0 = Instant::now();
        let counter = self.counter.read();
        self.reads += 1;
        self.read_time += t0.elapsed();
        counter
    }

    /// After a tick: the limit, its levels, the working set the tick saw
    /// and the counter's reading now.
    pub fn update(
        &mut self,
        levels: Vec<u64>,
        working_set: u64,
        counter: Option<u64>,
        now: Instant,
    ) {
        self.levels = levels;
        self.used = working_set;
        self.cache = counter.map_or(0, |c| c.saturating_sub(working_set));
        self.schedule(working_set, now);
    }

    fn next_level(&self) -> Option<u64> {
        self.levels.iter().copied().find(|&l| l > self.used)
    }

    fn schedule(&mut self, used: u64, now: Instant) {
        let min_gap = self.counter.min_gap();
        self.next = pace(used, self.next_level(), self.max_rate, self.max_gap)
            .map(|d| now + d.max(min_gap));
    }

    /// When the next read is due (`None`: nothing to watch for).
    pub fn due(&self) -> Option<Instant> {
        self.next
    }

    /// Reads the counter if due. True when a level was crossed since the
    /// last tick: the caller ticks now.
    pub fn check(&mut self, now: Instant) -> bool {
        if self.next.is_none_or(|n| now < n) {
            return false;
        }
        let Some(counter) = self.read() else {
            self.next = None;
            return false;
        };
        let used = counter.saturating_sub(self.cache);
        if self.next_level().is_some_and(|l| used >= l) {
            self.next = None;
            return true;
        }
        self.schedule(used, now);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: f64 = (1u64 << 30) as f64;

    #[test]
    fn reads_come_closer_as_the_next_level_nears() {
        let max = Duration::from_secs(1);
        // 1 GiB limit, critical level at 92 %, 4 GiB/s: from 10 % used the
        // level is 84 % of a GiB away (~0.2 s), read at half of that.
        let crit = (1024.0 * 0.92) as u64 * MIB;
        let far = pace(102 * MIB, Some(crit), 4.0 * GIB, max).unwrap();
        assert!((far.as_secs_f64() - 0.103).abs() < 0.002, "{far:?}");
        let near = pace(900 * MIB, Some(crit), 4.0 * GIB, max).unwrap();
        assert!(near < Duration::from_millis(10), "{near:?}");
        assert_eq!(pace(crit, Some(crit), 4.0 * GIB, max), Some(MIN_GAP));
        // A 64 GiB node far from its level reads at --interval at most.
        assert_eq!(pace(0, Some(60 << 30), 4.0 * GIB, max), Some(max));
        assert_eq!(pace(0, None, 4.0 * GIB, max), None);
    }

    #[test]
    fn levels_are_the_thresholds_as_bytes() {
        assert_eq!(
            levels(1000, &[20.0, 8.0, 4.0, 8.0, f64::NAN]),
            vec![800, 920, 960]
        );
    }

    #[test]
    fn a_crossing_is_seen_on_the_counter_less_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("memory.usage_in_bytes");
        std::fs::write(&file, "900\n").unwrap();
        let mut c = CheapLoop::new(Counter::Usage(file.clone()), 1e12, Duration::from_secs(1));
        let now = Instant::now();
        // Working set 700 of which the counter shows 900: 200 of cache.
        c.update(levels(1000, &[20.0, 8.0]), 700, Some(900), now);
        let due = c.due().unwrap();
        assert!(!c.check(due), "still below 800");
        std::fs::write(&file, "1010\n").unwrap();
        let due = c.due().unwrap();
        assert!(c.check(due), "810 of working set crossed 800");
        assert_eq!(c.due(), None, "nothing more until the next tick");
        assert_eq!(c.reads, 2);
        // Past every level: nothing to read for.
        c.update(levels(1000, &[20.0, 8.0]), 950, Some(1000), now);
        assert_eq!(c.due(), None);
    }

    #[test]
    fn dev_shm_is_read_no_closer_than_its_gap() {
        let now = Instant::now();
        let mut c = CheapLoop::new(
            Counter::shm(Path::new("/dev/shm")),
            4.0 * GIB,
            Duration::from_secs(1),
        );
        // 11 MiB below its level: 1.3 ms at the machine's rate.
        c.update(levels(64 * MIB, &[20.0]), 40 * MIB, Some(40 * MIB), now);
        assert_eq!(c.due(), Some(now + SHM_MIN_GAP));
        if std::fs::metadata("/dev/shm").is_ok() {
            // Read through the directory held open, where it is a tmpfs.
            assert_eq!(
                c.counter.read().is_some(),
                shm::read(Path::new("/dev/shm")).is_some()
            );
        }
        // A cgroup's counter keeps the 1 ms floor.
        let mut u = CheapLoop::new(
            Counter::Usage(PathBuf::from("/nonexistent")),
            4.0 * GIB,
            Duration::from_secs(1),
        );
        u.update(levels(64 * MIB, &[20.0]), 40 * MIB, None, now);
        assert!(u.due().unwrap() < now + Duration::from_millis(2));
    }

    #[test]
    fn not_due_is_no_read() {
        let mut c = CheapLoop::new(
            Counter::Usage(PathBuf::from("/nonexistent")),
            1.0,
            Duration::from_secs(1),
        );
        c.update(vec![1 << 40], 0, None, Instant::now());
        assert!(!c.check(Instant::now()));
        assert_eq!(c.reads, 0);
    }
}
