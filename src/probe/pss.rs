//! PSS, USS and swap of the tree's processes from `smaps_rollup`: which
//! readings to take, when, at what CPU cost, and how to sum them honestly
//! while processes fork and exit.
//!
//! Processes that can share copy-on-write pages form a *family*: a process
//! that is not a launcher and its descendants (a trainer and its DataLoader
//! workers). A family is read in one *burst* (its members' readings back to
//! back) and the burst is published as one *snapshot*, atomically, so a sum
//! never mixes a reading taken before a fork or an exit with one taken after
//! it. Until a changed family is read again its figure is an estimate from
//! the last snapshot (see [`PssSweeper::apply`] and docs/design.md, "Counting
//! memory through forks and exits").
//!
//! Reading `smaps_rollup` walks page tables, so its cost grows with mapped
//! memory. Every burst's CPU time is measured (thread CPU clock) and the
//! sweeper keeps to a budget (a share of one core), spending it first on
//! families whose membership changed, then on those whose memory moved most.
//! It runs on its own thread: it never delays a tick.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::model::{ProcSample, Role};
use crate::probe::proc::{Rollup, page_size, parse_smaps_rollup, parse_stat};

/// A process's identity: pid and start time (pids are reused).
pub type Key = (u32, u64);

/// One tree process as the tick found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub pid: u32,
    pub start_time: u64,
    pub ppid: u32,
    pub role: Role,
    /// RSS from `stat`, bytes.
    pub rss: u64,
}

impl Member {
    fn key(&self) -> Key {
        (self.pid, self.start_time)
    }
}

impl From<&ProcSample> for Member {
    fn from(p: &ProcSample) -> Self {
        Self {
            pid: p.pid,
            start_time: p.start_time,
            ppid: p.ppid,
            role: p.role,
            rss: p.rss_bytes,
        }
    }
}

/// How the sweeper spends its time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepConfig {
    /// A family whose memory moved is re-read once its snapshot is this old.
    pub interval: Duration,
    /// Share of one core the readings may use on average (0.01 = 1 %).
    pub budget: f64,
}

impl SweepConfig {
    pub const DEFAULT_BUDGET: f64 = 0.01;
}

/// What the sweeper has spent, for benchmarks and the log.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SweepStats {
    /// CPU seconds spent reading `smaps_rollup` (and checking the family).
    pub cpu_seconds: f64,
    pub readings: u64,
    /// Bursts published / thrown away because the family changed mid-burst.
    pub bursts: u64,
    pub discarded: u64,
}

/// One `smaps_rollup` reading.
#[derive(Debug, Clone, Copy)]
struct Reading {
    rollup: Rollup,
    /// RSS from `stat` right after the reading: the base the tick's RSS is
    /// compared with (the same counter on both sides).
    rss_at: u64,
    at: Instant,
    /// The parent at the time, when it was in the same burst: where an
    /// exited process's shared pages go.
    parent: Option<Key>,
}

/// A family's last consistent burst.
#[derive(Debug, Clone)]
struct Snapshot {
    readings: HashMap<Key, Reading>,
    /// When the burst started (its oldest reading).
    at: Instant,
    /// What the tree's cgroup was charged for then.
    footprint_at: Option<u64>,
    /// CPU seconds the burst cost.
    cost: f64,
}

#[derive(Debug)]
struct State {
    cfg: SweepConfig,
    members: Vec<Member>,
    /// Family root of each member.
    family: HashMap<Key, Key>,
    snaps: HashMap<Key, Snapshot>,
    /// RSS when a process was first seen: its private growth since is all
    /// an unmeasured newcomer is charged for.
    first_rss: HashMap<Key, u64>,
    /// The usage of the cgroup the tree is in, when it has one.
    footprint: Option<u64>,
    /// The owned cgroup gives the exact footprint: PSS only splits it.
    exact: bool,
    /// Bumped on every `set_targets`; a family whose burst was thrown away
    /// waits for the next one (the tick has not seen the change yet).
    version: u64,
    failed: HashMap<Key, u64>,
    /// CPU seconds the sweeper may still spend (negative after a burst
    /// larger than the savings).
    tokens: f64,
    refilled: Instant,
    /// CPU seconds per byte of RSS read, learnt from bursts.
    cost_per_byte: f64,
    stats: SweepStats,
    stop: bool,
}

/// RSS changes below this do not make a reading stale.
const RSS_SLACK: u64 = 1 << 20;
/// The budget saved while idle is capped at this much wall time's worth.
const SAVINGS: f64 = 15.0;
/// Without any change a snapshot is still renewed after this many intervals.
const MAX_AGE_INTERVALS: u32 = 6;
/// With an owned cgroup (exact footprint) refreshes wait this many intervals.
const EXACT_SLOWDOWN: u32 = 2;

/// Why a family should be read.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
enum Need {
    /// Its memory moved or its snapshot is old: bytes moved, then age.
    Refresh(f64, f64),
    /// A member exited: the estimate is good, but the survivors' shares
    /// are still the old ones.
    Exited,
    /// A member is new: it is counted only by its RSS growth until read.
    Forked,
}

struct Burst {
    root: Key,
    members: Vec<(Key, Option<Key>)>,
    known: HashSet<u32>,
    version: u64,
}

/// Reads `smaps_rollup` on its own thread, family by family, within a CPU
/// budget.
pub struct PssSweeper {
    shared: Arc<(Mutex<State>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl PssSweeper {
    pub fn start(proc_root: PathBuf, cfg: SweepConfig) -> Self {
        let now = Instant::now();
        let state = State {
            cfg,
            members: Vec::new(),
            family: HashMap::new(),
            snaps: HashMap::new(),
            first_rss: HashMap::new(),
            footprint: None,
            exact: false,
            version: 0,
            failed: HashMap::new(),
            // Enough for the first burst of a small tree right away.
            tokens: cfg.budget * SAVINGS,
            refilled: now,
            cost_per_byte: 0.0,
            stats: SweepStats::default(),
            stop: false,
        };
        let shared = Arc::new((Mutex::new(state), Condvar::new()));
        let thread_shared = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("oomguard-pss".into())
            .spawn(move || sweep_loop(&proc_root, &thread_shared))
            .ok();
        Self { shared, handle }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means the sweeper panicked mid-update; the
        // data is still plain numbers, so keep using it.
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the sweeper which processes form the tree, and what the
    /// cgroup the tree is in is charged for right now, when it is in one
    /// (the machine's used memory would mostly measure other jobs);
    /// `exact` when that figure is the job's own (owned cgroup).
    pub fn set_targets(&self, members: Vec<Member>, footprint: Option<u64>, exact: bool) {
        let mut st = self.lock();
        st.version += 1;
        st.footprint = footprint;
        st.exact = exact;
        st.family = family_roots(&members);
        let live: HashSet<Key> = members.iter().map(Member::key).collect();
        for m in &members {
            st.first_rss.entry(m.key()).or_insert(m.rss);
        }
        st.first_rss.retain(|k, _| live.contains(k));
        st.members = members;
        // A snapshot whose root is gone (the trainer exited, its workers
        // were orphaned) moves to a family that holds its survivors, so
        // their shares are not forgotten.
        let roots: HashSet<Key> = st.family.values().copied().collect();
        let orphaned: Vec<Key> = st
            .snaps
            .keys()
            .filter(|k| !roots.contains(k))
            .copied()
            .collect();
        for old in orphaned {
            let Some(snap) = st.snaps.remove(&old) else {
                continue;
            };
            let heir = snap
                .readings
                .keys()
                .filter_map(|k| st.family.get(k))
                .find(|r| !st.snaps.contains_key(r))
                .copied();
            if let Some(heir) = heir {
                st.snaps.insert(heir, snap);
            }
        }
        st.failed.retain(|k, _| roots.contains(k));
        let changed = roots
            .iter()
            .any(|r| matches!(need(&st, *r), Some(Need::Forked)));
        drop(st);
        if changed {
            self.shared.1.notify_one();
        }
    }

    /// Fills in PSS, USS and swap of this tick's processes and returns the
    /// age in seconds of the oldest reading used.
    ///
    /// A member of the last snapshot counts its reading plus its RSS change
    /// since (new allocations are private). A member that exited since
    /// leaves its shared part (PSS − USS) to its nearest surviving ancestor
    /// in the snapshot: those pages are still there, now owned by fewer. A
    /// newcomer not yet read counts only its RSS growth since first seen:
    /// what it shares is still counted in full by its parent's reading from
    /// before the fork.
    pub fn apply(&self, procs: &mut [ProcSample], now: Instant) -> f64 {
        estimate(&self.lock(), procs, now)
    }

    /// What the sweeper has spent so far.
    pub fn stats(&self) -> SweepStats {
        self.lock().stats
    }
}

/// See [`PssSweeper::apply`].
fn estimate(st: &State, procs: &mut [ProcSample], now: Instant) -> f64 {
    let index: HashMap<Key, usize> = procs
        .iter()
        .enumerate()
        .map(|(i, p)| ((p.pid, p.start_time), i))
        .collect();
    let mut oldest = 0.0f64;
    for p in procs.iter_mut() {
        let key = (p.pid, p.start_time);
        let reading = st
            .family
            .get(&key)
            .and_then(|root| st.snaps.get(root))
            .and_then(|s| s.readings.get(&key));
        match reading {
            Some(r) => {
                let grown = p.rss_bytes as i64 - r.rss_at as i64;
                p.pss_bytes = (r.rollup.pss as i64 + grown).max(0) as u64;
                p.uss_bytes = (r.rollup.uss as i64 + grown).max(0) as u64;
                p.swap_bytes = r.rollup.swap;
                oldest = oldest.max(now.saturating_duration_since(r.at).as_secs_f64());
            }
            None => {
                let grown = st
                    .first_rss
                    .get(&key)
                    .map_or(0, |&first| p.rss_bytes.saturating_sub(first));
                p.pss_bytes = grown;
                p.uss_bytes = grown;
                p.swap_bytes = 0;
            }
        }
    }
    // Exited members' shared pages, to the survivors.
    for (root, snap) in &st.snaps {
        for (key, r) in &snap.readings {
            if index.contains_key(key) {
                continue;
            }
            let shared = r.rollup.pss.saturating_sub(r.rollup.uss);
            if shared == 0 {
                continue;
            }
            let mut heir = r.parent;
            let mut steps = 0;
            while let Some(h) = heir {
                if index.contains_key(&h) || steps > 64 {
                    break;
                }
                heir = snap.readings.get(&h).and_then(|x| x.parent);
                steps += 1;
            }
            let heir = heir
                .filter(|h| index.contains_key(h))
                .or_else(|| index.contains_key(root).then_some(*root))
                .or_else(|| {
                    snap.readings
                        .keys()
                        .find(|k| index.contains_key(k))
                        .copied()
                });
            if let Some(i) = heir.and_then(|h| index.get(&h)) {
                procs[*i].pss_bytes += shared;
                oldest = oldest.max(now.saturating_duration_since(r.at).as_secs_f64());
            }
        }
    }
    oldest
}

impl Drop for PssSweeper {
    fn drop(&mut self) {
        self.lock().stop = true;
        self.shared.1.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The family root of each member: launchers stand alone (they exec what
/// they start, so share nothing worth counting); anything else belongs to
/// the family of its parent unless that parent is a launcher or not in the
/// tree.
fn family_roots(members: &[Member]) -> HashMap<Key, Key> {
    let by_pid: HashMap<u32, usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.pid, i))
        .collect();
    let mut out = HashMap::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        let mut j = i;
        for _ in 0..members.len() {
            let cur = &members[j];
            if cur.role == Role::Launcher {
                break;
            }
            match by_pid.get(&cur.ppid) {
                Some(&k) if k != j && members[k].role != Role::Launcher => j = k,
                _ => break,
            }
        }
        out.insert(m.key(), members[j].key());
    }
    out
}

/// Why (if at all) the family rooted at `root` should be read now.
fn need(st: &State, root: Key) -> Option<Need> {
    let members: Vec<&Member> = st
        .members
        .iter()
        .filter(|m| st.family.get(&m.key()) == Some(&root))
        .collect();
    let Some(snap) = st.snaps.get(&root) else {
        return Some(Need::Forked);
    };
    if members
        .iter()
        .any(|m| !snap.readings.contains_key(&m.key()))
    {
        return Some(Need::Forked);
    }
    if snap.readings.len() > members.len() {
        return Some(Need::Exited);
    }
    let age = snap.at.elapsed();
    let slow = if st.exact { EXACT_SLOWDOWN } else { 1 };
    if age < st.cfg.interval * slow {
        return None;
    }
    let moved: u64 = members
        .iter()
        .filter_map(|m| {
            snap.readings
                .get(&m.key())
                .map(|r| m.rss.abs_diff(r.rss_at))
        })
        .filter(|&d| d > RSS_SLACK)
        .sum();
    // Sharing can change without any RSS change (a worker writing to a
    // page it inherited): a footprint that moved says so.
    let footprint_moved = st
        .footprint
        .zip(snap.footprint_at)
        .is_some_and(|(now, then)| now.abs_diff(then) > (4u64 << 20).max(now / 100));
    let old = age >= st.cfg.interval * MAX_AGE_INTERVALS * slow;
    (moved > 0 || footprint_moved || old).then_some(Need::Refresh(moved as f64, age.as_secs_f64()))
}

/// The family to read next, if the budget allows one now; otherwise how
/// long to wait.
fn choose(st: &mut State, now: Instant) -> Result<Burst, Duration> {
    let budget = st.cfg.budget.max(1e-6);
    let elapsed = now.saturating_duration_since(st.refilled).as_secs_f64();
    st.refilled = now;
    st.tokens = (st.tokens + elapsed * budget).min(budget * SAVINGS);
    let roots: HashSet<Key> = st.family.values().copied().collect();
    let mut best: Option<(Need, Key)> = None;
    for root in roots {
        if st.failed.get(&root) == Some(&st.version) {
            continue;
        }
        if let Some(n) = need(st, root)
            && best.as_ref().is_none_or(|(b, _)| n > *b)
        {
            best = Some((n, root));
        }
    }
    let Some((need, root)) = best else {
        return Err(Duration::from_secs(1));
    };
    let members: Vec<Member> = st
        .members
        .iter()
        .filter(|m| st.family.get(&m.key()) == Some(&root))
        .copied()
        .collect();
    // A membership change spends as soon as the budget is not in debt; a
    // refresh waits until it can pay for itself.
    let expected = match st.snaps.get(&root) {
        Some(s) if s.cost > 0.0 => s.cost,
        _ => members.iter().map(|m| m.rss as f64).sum::<f64>() * st.cost_per_byte,
    };
    let wanted = match need {
        Need::Forked | Need::Exited => 0.0,
        Need::Refresh(..) => expected.min(budget * SAVINGS),
    };
    if st.tokens < wanted || st.tokens < 0.0 {
        let short = wanted.max(0.0) - st.tokens;
        return Err(Duration::from_secs_f64((short / budget).clamp(0.01, 1.0)));
    }
    let keys: HashMap<u32, Key> = members.iter().map(|m| (m.pid, m.key())).collect();
    Ok(Burst {
        root,
        members: members
            .iter()
            .map(|m| (m.key(), keys.get(&m.ppid).copied()))
            .collect(),
        known: st.members.iter().map(|m| m.pid).collect(),
        version: st.version,
    })
}

fn sweep_loop(proc_root: &Path, shared: &(Mutex<State>, Condvar)) {
    let (lock, cvar) = shared;
    let mut buf = String::with_capacity(2048);
    let page = page_size();
    loop {
        let burst = {
            let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if st.stop {
                    return;
                }
                match choose(&mut st, Instant::now()) {
                    Ok(b) => break b,
                    Err(wait) => {
                        st = cvar
                            .wait_timeout(st, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
        };
        let cpu0 = thread_cpu();
        let started = Instant::now();
        let (readings, consistent) = read_family(proc_root, &burst, page, &mut buf);
        let cost = (thread_cpu() - cpu0).max(0.0);
        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
        st.tokens -= cost;
        st.stats.cpu_seconds += cost;
        st.stats.readings += readings.len() as u64;
        let rss: u64 = readings.values().map(|r| r.rollup.rss).sum();
        if rss > 0 {
            let per_byte = cost / rss as f64;
            st.cost_per_byte = if st.cost_per_byte == 0.0 {
                per_byte
            } else {
                0.8 * st.cost_per_byte + 0.2 * per_byte
            };
        }
        if consistent {
            st.stats.bursts += 1;
            let footprint_at = st.footprint;
            st.snaps.insert(
                burst.root,
                Snapshot {
                    readings,
                    at: started,
                    footprint_at,
                    cost,
                },
            );
            st.failed.remove(&burst.root);
        } else {
            st.stats.discarded += 1;
            st.failed.insert(burst.root, burst.version);
        }
    }
}

/// Reads a family back to back. Consistent when every member was read and
/// no member forked or lost a child while it was being read (children
/// lists before and after, and no child the tick has not listed yet).
fn read_family(
    proc_root: &Path,
    burst: &Burst,
    page: u64,
    buf: &mut String,
) -> (HashMap<Key, Reading>, bool) {
    let before = children(proc_root, burst, buf);
    let mut readings = HashMap::with_capacity(burst.members.len());
    let mut consistent = true;
    for &((pid, start), parent) in &burst.members {
        let dir = proc_root.join(pid.to_string());
        let at = Instant::now();
        let rollup =
            read_into(&dir.join("smaps_rollup"), buf).and_then(|()| parse_smaps_rollup(buf));
        // The pid may have been reused between listing and reading: only
        // keep the reading if the start time still matches.
        let stat = read_into(&dir.join("stat"), buf)
            .and_then(|()| parse_stat(buf))
            .filter(|s| s.start_time == start);
        match (rollup, stat) {
            (Some(rollup), Some(stat)) => {
                readings.insert(
                    (pid, start),
                    Reading {
                        rollup,
                        rss_at: stat.rss_pages * page,
                        at,
                        parent,
                    },
                );
            }
            _ => consistent = false,
        }
    }
    let after = children(proc_root, burst, buf);
    if before != after {
        consistent = false;
    }
    // A child the tick has not listed yet was forked before the burst: its
    // parent's reading already shares with it.
    for &kid in &after {
        if burst.known.contains(&kid) {
            continue;
        }
        let live = read_into(&proc_root.join(kid.to_string()).join("stat"), buf)
            .and_then(|()| parse_stat(buf))
            .is_some_and(|s| s.state != 'Z' && s.state != 'X');
        if live {
            consistent = false;
        }
    }
    (readings, consistent)
}

/// Children of the burst's members, from every thread's `children` file
/// (a fork from any thread lands in that thread's list). Empty where the
/// kernel lacks the file: then only the tick's listing guards the burst.
fn children(proc_root: &Path, burst: &Burst, buf: &mut String) -> Vec<u32> {
    let mut out = Vec::new();
    for &((pid, _), _) in &burst.members {
        let Ok(tasks) = fs::read_dir(proc_root.join(pid.to_string()).join("task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if read_into(&task.path().join("children"), buf).is_some() {
                out.extend(
                    buf.split_ascii_whitespace()
                        .filter_map(|s| s.parse::<u32>().ok()),
                );
            }
        }
    }
    out.sort_unstable();
    out
}

fn read_into(path: &Path, buf: &mut String) -> Option<()> {
    use std::io::Read;
    buf.clear();
    fs::File::open(path).ok()?.read_to_string(buf).ok()?;
    Some(())
}

/// CPU seconds this thread has used.
fn thread_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn member(pid: u32, ppid: u32, role: Role, rss: u64) -> Member {
        Member {
            pid,
            start_time: u64::from(pid) * 10,
            ppid,
            role,
            rss,
        }
    }

    fn proc(m: &Member) -> ProcSample {
        ProcSample {
            pid: m.pid,
            ppid: m.ppid,
            role: m.role,
            comm: "python3".into(),
            rss_bytes: m.rss,
            pss_bytes: 0,
            uss_bytes: 0,
            swap_bytes: 0,
            gpu_bytes: None,
            torch: None,
            start_time: m.start_time,
        }
    }

    fn reading(pss: u64, uss: u64, rss: u64, parent: Option<Key>) -> Reading {
        Reading {
            rollup: Rollup {
                rss,
                pss,
                uss,
                swap: 0,
            },
            rss_at: rss,
            at: Instant::now(),
            parent,
        }
    }

    fn state(members: Vec<Member>, snap: Vec<(Key, Reading)>, root: Key) -> State {
        let mut st = State {
            cfg: SweepConfig {
                interval: Duration::from_secs(5),
                budget: 0.01,
            },
            family: family_roots(&members),
            first_rss: members.iter().map(|m| (m.key(), m.rss)).collect(),
            members,
            snaps: HashMap::new(),
            footprint: None,
            exact: false,
            version: 0,
            failed: HashMap::new(),
            tokens: 0.3,
            refilled: Instant::now(),
            cost_per_byte: 0.0,
            stats: SweepStats::default(),
            stop: false,
        };
        st.snaps.insert(
            root,
            Snapshot {
                readings: snap.into_iter().collect(),
                at: Instant::now(),
                footprint_at: None,
                cost: 0.01,
            },
        );
        st
    }

    fn total(st: &State) -> u64 {
        let mut procs: Vec<ProcSample> = st.members.iter().map(proc).collect();
        estimate(st, &mut procs, Instant::now());
        procs.iter().map(|p| p.pss_bytes).sum()
    }

    #[test]
    fn families_stop_at_launchers() {
        let ms = vec![
            member(10, 1, Role::Launcher, 0),
            member(11, 10, Role::Trainer, 0),
            member(12, 11, Role::Worker, 0),
            member(13, 12, Role::Worker, 0),
            member(14, 11, Role::Launcher, 0),
            member(15, 14, Role::Other, 0),
        ];
        let f = family_roots(&ms);
        let root = |pid: u32| f[&(pid, u64::from(pid) * 10)].0;
        assert_eq!([10, 11, 12, 13, 14, 15].map(root), [10, 11, 11, 11, 14, 15]);
    }

    #[test]
    fn a_fork_is_not_counted_twice_before_the_family_is_read() {
        // The parent alone held 800 MiB; 6 workers appear that map it and
        // have since written 40 MiB each (their RSS grew by that much after
        // the tick first saw them).
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let snap = vec![(parent.key(), reading(800 * MIB, 800 * MIB, 800 * MIB, None))];
        let mut ms = vec![parent];
        for i in 0..6 {
            ms.push(member(101 + i, 100, Role::Worker, 800 * MIB));
        }
        let mut st = state(ms, snap, parent.key());
        assert_eq!(total(&st), 800 * MIB);
        for m in st.members.iter_mut().skip(1) {
            m.rss += 40 * MIB;
        }
        assert_eq!(total(&st), 1040 * MIB);
        assert!(matches!(need(&st, parent.key()), Some(Need::Forked)));
    }

    #[test]
    fn exited_workers_hand_their_share_back() {
        // A consistent burst of the parent and 6 workers sharing 800 MiB,
        // then the workers exit: the parent's old reading (1/7 of it) plus
        // the workers' shared parts is the 800 MiB still there.
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let share = 800 * MIB / 7;
        let mut snap = vec![(parent.key(), reading(share, 0, 800 * MIB, None))];
        for i in 0..6 {
            let w = member(101 + i, 100, Role::Worker, 840 * MIB);
            snap.push((
                w.key(),
                reading(share + 40 * MIB, 40 * MIB, 840 * MIB, Some(parent.key())),
            ));
        }
        let st = state(vec![parent], snap, parent.key());
        let t = total(&st);
        assert!(t.abs_diff(800 * MIB) < MIB, "{t}");
        assert!(matches!(need(&st, parent.key()), Some(Need::Exited)));
    }

    #[test]
    fn an_unchanged_fresh_family_needs_nothing() {
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let snap = vec![(parent.key(), reading(800 * MIB, 800 * MIB, 800 * MIB, None))];
        let st = state(vec![parent], snap, parent.key());
        assert_eq!(need(&st, parent.key()), None);
    }
}
