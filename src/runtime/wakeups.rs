//! What wakes the loop between ticks, owned in one part: the tick's own
//! schedule (the next tick and the next full scan), the kernel's v1 usage
//! thresholds, the PSI trigger and `memory.events` (POLLPRI), the cheap
//! loop over the limit's usage counter, and the count of what woke the
//! loop (`run_end.wakeups`). Also `memory.high`, which makes the kernel
//! raise one of those events.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use super::cheap::{self, CheapLoop, Counter};
use super::rank_exits::RankExits;
use super::tick::FAST;
use crate::engine::probe::cgroup::{CgroupReader, Threshold, Version};
use crate::engine::probe::system::PriWake;
use crate::settings::values::Without;
use crate::sinks::log::{CheapLoopStats, Wakeups as Counts};
use crate::vocab::model::{CgroupSample, ShmSample};

/// What the kernel woke the loop with.
pub(super) enum Kernel {
    Threshold,
    /// The POLLPRI source at this index.
    Pri(usize),
    /// A rank of a job across nodes ended (its pid).
    RankEnded(u32),
}

/// A wake-up that could not be armed, and why (said once, and logged in
/// `run_end.wakeups`): the run goes on with the others and the tick.
pub(super) struct Refused {
    pub what: String,
    pub why: String,
}

pub(super) struct Wakeups {
    without: Without,
    thresholds: Vec<AsyncFd<Threshold>>,
    cheap: Option<CheapLoop>,
    /// The same over the job's `/dev/shm`, while it is a ceiling.
    shm: Option<CheapLoop>,
    /// POLLPRI sources, each with whether it is the PSI trigger (else a
    /// `memory.events` file).
    pri: Vec<(AsyncFd<PriWake>, bool)>,
    counts: Counts,
    /// The ranks of a job across nodes, for the moment one ends.
    ranks: RankExits,
    next_tick: Instant,
    next_full: Instant,
}

impl Wakeups {
    /// None armed yet; the first tick (a full one) is due at `now`.
    pub fn new(without: Without, now: Instant) -> Self {
        Self {
            without,
            thresholds: Vec::new(),
            cheap: None,
            shm: None,
            pri: Vec::new(),
            counts: Counts::default(),
            ranks: RankExits::default(),
            next_tick: now,
            next_full: now,
        }
    }

    /// A tick with a full scan is due at once (a new attempt).
    pub fn tick_now(&mut self, now: Instant) {
        self.next_tick = now;
        self.next_full = now;
    }

    /// Whether the tick due now must walk the whole tree.
    pub fn full_due(&self, now: Instant) -> bool {
        now >= self.next_full
    }

    /// A full scan ran at `now`: the next is due within a quarter second
    /// (sooner with a shorter `--interval`), whatever the pace.
    pub fn full_scan_ran(&mut self, now: Instant, interval: Duration) {
        self.next_full = now + interval.min(Duration::from_millis(250)).max(FAST);
    }

    /// After a tick: the next one `every` from now; at the slow pace
    /// (`every` ≥ `--interval`) it is a full one.
    pub fn schedule(&mut self, now: Instant, every: Duration, interval: Duration) {
        self.next_tick = now + every;
        if every >= interval {
            self.next_full = self.next_tick;
        }
    }

    /// The timer fired: whether a cheap loop's read moved the tick to now
    /// (the tick is then due).
    pub fn cheap_loop_moved(&mut self, now: Instant) -> bool {
        let mut moved = false;
        for c in [&mut self.cheap, &mut self.shm].into_iter().flatten() {
            moved |= c.check(now);
        }
        if moved {
            self.next_tick = now;
        }
        moved
    }

    pub fn tick_due(&self, now: Instant) -> bool {
        now >= self.next_tick
    }

    /// A timer tick is starting: counted for the cheap loop when its read
    /// moved it, else for the poll.
    pub fn count_timer(&mut self, cheap: bool) {
        let woke = if cheap {
            &mut self.counts.cheap_loop
        } else {
            &mut self.counts.poll
        };
        woke.woke += 1;
    }

    /// The earliest of the next tick and the cheap loops' next reads.
    pub fn next(&self) -> Instant {
        [&self.cheap, &self.shm]
            .into_iter()
            .filter_map(|c| c.as_ref().and_then(CheapLoop::due))
            .fold(self.next_tick, Instant::min)
    }

    /// Watches exactly these ranks' ends (see `rank_exits.rs`).
    pub fn follow_ranks(&mut self, pids: &[u32]) {
        self.ranks.follow(pids);
    }

    /// Resolves when the kernel wakes the loop (a v1 threshold crossed, a
    /// PSI trigger or a `memory.events` change, a rank's end); never
    /// without any armed.
    pub async fn kernel(&self) -> Kernel {
        tokio::select! {
            () = threshold_crossed(&self.thresholds) => Kernel::Threshold,
            i = pri_woken(&self.pri) => Kernel::Pri(i),
            pid = self.ranks.ended() => Kernel::RankEnded(pid),
        }
    }

    /// A kernel wake-up is starting a tick: re-armed where it needs it,
    /// and counted (a rank's end is not a memory wake-up: it is dropped
    /// from the watch, and not counted).
    pub fn woke(&mut self, k: &Kernel) {
        let counter = match *k {
            Kernel::RankEnded(pid) => {
                self.ranks.forget(pid);
                return;
            }
            Kernel::Threshold => &mut self.counts.usage_threshold,
            Kernel::Pri(i) => match self.pri.get_mut(i) {
                Some((w, psi)) => {
                    w.get_mut().rearm();
                    if *psi {
                        &mut self.counts.psi
                    } else {
                        &mut self.counts.memory_events
                    }
                }
                None => return,
            },
        };
        counter.woke += 1;
    }

    /// On cgroup v1, asks the kernel to wake the loop when usage crosses
    /// the `levels` (headroom %) of the cgroup's limit and, when the
    /// cgroup is the job's alone (`budget_here`), of `budget`: a fast leak
    /// cannot race past either between two ticks.
    pub fn register_thresholds(
        &mut self,
        reader: &CgroupReader,
        cg: &CgroupSample,
        budget: Option<u64>,
        budget_here: bool,
        levels: &[f64],
    ) -> Option<Refused> {
        if self.without.usage_threshold {
            return None;
        }
        let mut targets = Vec::new();
        if let (Some(limit), Some(path)) = (cg.limit_bytes, cg.limit_path.as_deref())
            && let Some(dir) = reader.limit_dir(path)
        {
            targets.push((dir, limit));
        }
        if let Some(budget) = budget.filter(|_| budget_here)
            && let Some(dir) = reader.limit_dir(&cg.path)
        {
            targets.push((dir, budget));
        }
        let mut levels = levels.to_vec();
        levels.dedup();
        for (dir, ceiling) in targets {
            for &h in &levels {
                let bytes = (ceiling as f64 * (1.0 - h / 100.0)) as u64;
                match Threshold::register(&dir, bytes) {
                    Ok(t) => {
                        if let Ok(fd) = watch_threshold(t) {
                            self.thresholds.push(fd);
                        }
                    }
                    Err(e) => {
                        // Not permitted (a user who does not own the
                        // cgroup): the cheap loop covers it.
                        let why = format!("{}: {e}", dir.join("cgroup.event_control").display());
                        self.counts.usage_threshold.refused = Some(why.clone());
                        return Some(Refused {
                            what: "the kernel's usage threshold".into(),
                            why,
                        });
                    }
                }
            }
        }
        None
    }

    /// Kernel wake-ups beyond v1 thresholds: a PSI trigger (200 ms of
    /// memory stall within 2 s) on the job cgroup's `memory.pressure` on
    /// v2, or the machine's `/proc/pressure/memory`; and `memory.events`
    /// changes of the cgroup holding the limit on v2 (and of the job's own,
    /// for its `high` events). Best effort: polling covers the rest.
    pub fn register_pri(
        &mut self,
        reader: Option<&CgroupReader>,
        proc_root: &Path,
    ) -> Option<Refused> {
        let v2 = reader.filter(|c| c.location().version == Version::V2);
        let psi_path = v2
            .map(|c| c.location().dir().join("memory.pressure"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| proc_root.join("pressure/memory"));
        // A 2 s window: what every kernel accepts, also from non-root.
        let mut refused = None;
        if !self.without.psi {
            match PriWake::psi_trigger(&psi_path, 200_000, 2_000_000) {
                Ok(w) => {
                    if let Some(fd) = watch_pri(w) {
                        self.pri.push((fd, true));
                    }
                }
                // A kernel without PSI (no file) is not news.
                Err(e) if psi_path.exists() => {
                    let why = e.to_string();
                    self.counts.psi.refused = Some(why.clone());
                    refused = Some(Refused {
                        what: format!("the PSI trigger on {}", psi_path.display()),
                        why,
                    });
                }
                Err(_) => {}
            }
        }
        if let Some(c) = v2.filter(|_| !self.without.memory_events) {
            let limit_dir = c
                .read()
                .and_then(|s| s.limit_path)
                .map(|p| c.location().mount_point.join(p.trim_start_matches('/')))
                .unwrap_or_else(|| c.location().dir());
            let mut dirs = vec![limit_dir];
            if c.owned() && !dirs.contains(&c.location().dir()) {
                dirs.push(c.location().dir());
            }
            for dir in dirs {
                if let Ok(w) = PriWake::events(&dir.join("memory.events"))
                    && let Some(fd) = watch_pri(w)
                {
                    self.pri.push((fd, false));
                }
            }
        }
        refused
    }

    /// Hands the cheap loop this tick's limit, levels and working set (and
    /// starts it on the first tick that has a cgroup limit). Not where a
    /// v1 threshold already watches the limit, nor `--without cheap-loop`
    /// (for the tests that prove each wake-up acted).
    pub fn pace_cheap_loop(
        &mut self,
        reader: &CgroupReader,
        cg: &CgroupSample,
        levels: &[f64],
        interval: Duration,
        now: Instant,
    ) {
        if self.without.cheap_loop || !self.thresholds.is_empty() {
            return;
        }
        let (Some(limit), Some(path), Some(ws)) = (
            cg.limit_bytes,
            cg.limit_path.as_deref(),
            cg.limit_working_set_bytes,
        ) else {
            return;
        };
        let levels = cheap::levels(limit, levels);
        CheapLoop::follow(
            &mut self.cheap,
            Counter::Usage(reader.usage_file(path)),
            interval,
            (levels, ws),
            now,
        );
    }

    /// Hands the `/dev/shm` loop this tick's reading of the tmpfs at
    /// `path` while it is a ceiling (a v1 threshold never watches it);
    /// drops the loop when it is not.
    pub fn pace_shm_loop(
        &mut self,
        shm: Option<(&Path, ShmSample)>,
        levels: &[f64],
        interval: Duration,
        now: Instant,
    ) {
        let Some((path, s)) = shm.filter(|_| !self.without.cheap_loop) else {
            // Kept with its counts, reading nothing.
            if let Some(c) = self.shm.as_mut() {
                c.update(Vec::new(), 0, None, now);
            }
            return;
        };
        let levels = cheap::levels(s.size_bytes, levels);
        CheapLoop::follow(
            &mut self.shm,
            Counter::shm(path),
            interval,
            (levels, s.used_bytes),
            now,
        );
    }

    /// `run_end.wakeups`: the counts so far, and which were armed.
    pub fn armed(&self) -> Counts {
        let mut w = self.counts.clone();
        w.usage_threshold.armed = !self.thresholds.is_empty();
        w.psi.armed = self.pri.iter().any(|(_, psi)| *psi);
        w.memory_events.armed = self.pri.iter().any(|(_, psi)| !*psi);
        w.cheap_loop.armed = self.cheap.is_some() || self.shm.is_some();
        w.poll.armed = true;
        w
    }

    /// `run_end.cheap_loop`: its reads and their time, when it ran.
    /// Both loops' (the limit's and `/dev/shm`'s) together.
    pub fn cheap_loop_stats(&self) -> Option<CheapLoopStats> {
        let loops: Vec<(u64, Duration)> = [&self.cheap, &self.shm]
            .into_iter()
            .flatten()
            .map(CheapLoop::reads)
            .collect();
        let (reads, time) = loops
            .iter()
            .fold((0, Duration::ZERO), |(n, t), (rn, rt)| (n + rn, t + *rt));
        (!loops.is_empty()).then(|| CheapLoopStats {
            reads,
            seconds: (time.as_secs_f64() * 1e6).round() / 1e6,
        })
    }
}

/// On cgroup v2, sets `memory.high` of the job's owned cgroup a little
/// above the critical level `crit` (headroom %), between it and the
/// last-resort level: a leak that races past the critical level between
/// two ticks is slowed by the kernel (reclaim and allocation throttling,
/// no kill) while the graceful stop runs, and the crossing raises a `high`
/// event that wakes the loop. `--without memory-high` leaves it alone
/// (for measuring; see docs/design.md). The value written.
pub(super) fn set_memory_high(
    without: &Without,
    reader: &CgroupReader,
    cg: &CgroupSample,
    crit: f64,
    budget: Option<u64>,
) -> Option<u64> {
    if without.memory_high || !reader.owned() || reader.location().version != Version::V2 {
        return None;
    }
    // Three quarters of the way from the ceiling down to the critical
    // headroom: 94 % of the ceiling with the default 8 %.
    let share = 1.0 - crit * 0.75 / 100.0;
    let mut high: Option<u64> = None;
    if let (Some(limit), Some(ws)) = (cg.limit_bytes, cg.limit_working_set_bytes) {
        // The ceiling's cgroup also holds oomguard and any siblings.
        let others = ws.saturating_sub(cg.usage_bytes.min(ws));
        let at = (limit as f64 * share) as u64;
        high = Some(at.saturating_sub(others));
    }
    if let Some(budget) = budget {
        let at = (budget as f64 * share) as u64;
        high = Some(high.map_or(at, |h| h.min(at)));
    }
    let high = high.filter(|h| *h > 0)?;
    // Best effort: without it the wake-ups and polling still act.
    std::fs::write(
        reader.location().dir().join("memory.high"),
        high.to_string(),
    )
    .ok()
    .map(|()| high)
}

/// Resolves when any threshold eventfd fires (and drains it).
async fn threshold_crossed(fds: &[AsyncFd<Threshold>]) {
    if fds.is_empty() {
        return std::future::pending().await;
    }
    let mut futs: Vec<_> = fds.iter().map(|fd| Box::pin(fd.readable())).collect();
    std::future::poll_fn(move |cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(Ok(mut guard)) = f.as_mut().poll(cx) {
                let mut buf = [0u8; 8];
                let fd = guard.get_inner().eventfd.as_fd();
                match rustix::io::read(fd, &mut buf) {
                    Ok(_) => {}
                    Err(_) => guard.clear_ready(),
                }
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Resolves with the index of the first POLLPRI wake source that fired.
async fn pri_woken(fds: &[(AsyncFd<PriWake>, bool)]) -> usize {
    if fds.is_empty() {
        return std::future::pending().await;
    }
    let mut futs: Vec<_> = fds
        .iter()
        .map(|(fd, _)| Box::pin(fd.ready(tokio::io::Interest::PRIORITY)))
        .collect();
    std::future::poll_fn(move |cx| {
        for (i, f) in futs.iter_mut().enumerate() {
            if let std::task::Poll::Ready(Ok(mut guard)) = f.as_mut().poll(cx) {
                guard.clear_ready();
                return std::task::Poll::Ready(i);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

#[allow(unsafe_code)]
fn watch_pri(w: PriWake) -> Option<AsyncFd<PriWake>> {
    // SAFETY: `PriWake` owns its file and never replaces it, so the fd stays
    // open and the same for the whole life of the AsyncFd.
    unsafe { AsyncFd::register_with_interest(w, tokio::io::Interest::PRIORITY) }.ok()
}

#[allow(unsafe_code)]
fn watch_threshold(t: Threshold) -> Result<AsyncFd<Threshold>, ()> {
    // SAFETY: `Threshold` owns its eventfd and never replaces it, so the fd
    // stays open and the same for the whole life of the AsyncFd.
    unsafe { AsyncFd::register(t) }.map_err(|_| ())
}
