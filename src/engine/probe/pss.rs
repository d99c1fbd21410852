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

use crate::engine::probe::proc::{Rollup, page_size, parse_smaps_rollup, parse_stat};
use crate::vocab::model::{ProcSample, Role};

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
    /// Members grouped by family root, in `members` order.
    groups: HashMap<Key, Vec<Member>>,
    /// What the ticks have seen of each member's RSS: a newcomer is read
    /// once its RSS has settled, and until then charged for its growth.
    seen: HashMap<Key, Seen>,
    /// A figure that holds the tree's memory: what the tree's cgroup is
    /// charged for or, without one, the machine's used memory. Only compared
    /// with itself, as a sign that sharing changed (see [`need`]).
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
    /// What the family next in line is expected to cost.
    saving_for: f64,
    refilled: Instant,
    /// CPU seconds per byte of RSS read, learnt from bursts.
    cost_per_byte: f64,
    stats: SweepStats,
    stop: bool,
    /// Each process's USS at the last tick it had no child that was not
    /// read yet, and when (see [`across_forks`]).
    before_fork: HashMap<Key, (u64, Instant)>,
}

/// One member's RSS as the ticks saw it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// RSS when first seen.
    first: u64,
    /// RSS at the last tick and the one before (None until seen twice).
    last: u64,
    prev: Option<u64>,
    first_at: Instant,
}

impl Seen {
    /// A newcomer is worth reading once its RSS stopped moving (a forked
    /// worker imports and allocates right after the fork: a reading taken
    /// then is stale a second later) or after [`SETTLE_MAX`] anyway.
    fn settled(&self, now: Instant) -> bool {
        self.prev
            .is_some_and(|prev| self.last.abs_diff(prev) <= RSS_SLACK)
            || now.saturating_duration_since(self.first_at) >= SETTLE_MAX
    }
}

/// RSS changes below this do not make a reading stale.
const RSS_SLACK: u64 = 1 << 20;
/// The budget saved while idle is capped at this much wall time's worth.
const SAVINGS: f64 = 15.0;
/// Without any change a snapshot is still renewed after this many intervals
/// (sharing can drift without any RSS change, e.g. copy-on-write breaks).
const MAX_AGE_INTERVALS: u32 = 12;
/// A newcomer whose RSS keeps moving is read after this long anyway.
const SETTLE_MAX: Duration = Duration::from_secs(3);
/// During a burst, the family's children lists are re-checked once the
/// readings since the last check cost this much CPU (and at least 8 times
/// what a check costs): a fork mid-burst throws the burst away, so finding
/// it early saves the rest.
const RECHECK_AFTER: f64 = 0.005;
/// With an owned cgroup (exact footprint) refreshes wait this many intervals.
const EXACT_SLOWDOWN: u32 = 2;
/// A footprint move that RSS does not explain (sharing changed) is re-read
/// once the snapshot is this fraction of an interval old.
const UNEXPLAINED_SOONER: u32 = 5;

/// Why a family should be read.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
enum Need {
    /// Its memory moved or its snapshot is old: bytes moved, then age.
    Refresh(f64, f64),
    /// A member exited: the estimate's total is good (its shared pages
    /// went back to the survivors), only their split is not; read when the
    /// budget can pay for it.
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
            groups: HashMap::new(),
            snaps: HashMap::new(),
            seen: HashMap::new(),
            footprint: None,
            exact: false,
            version: 0,
            failed: HashMap::new(),
            // Empty: the first burst costs nothing known yet (no cost per
            // byte learnt), every later one waits until it is paid for.
            tokens: 0.0,
            saving_for: 0.0,
            refilled: now,
            cost_per_byte: 0.0,
            stats: SweepStats::default(),
            stop: false,
            before_fork: HashMap::new(),
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

    /// Tells the sweeper which processes form the tree, and a figure that
    /// holds their memory right now: what the tree's cgroup is charged for,
    /// or the machine's used memory when the tree has no cgroup to read
    /// (it moves with other jobs too, which only costs readings out of the
    /// budget); `exact` when that figure is the job's own (owned cgroup).
    pub fn set_targets(&self, members: Vec<Member>, footprint: Option<u64>, exact: bool) {
        let mut st = self.lock();
        st.version += 1;
        st.footprint = footprint;
        st.exact = exact;
        st.family = family_roots(&members);
        let live: HashSet<Key> = members.iter().map(Member::key).collect();
        let now = Instant::now();
        for m in &members {
            st.seen
                .entry(m.key())
                .and_modify(|s| {
                    s.prev = Some(s.last);
                    s.last = m.rss;
                })
                .or_insert(Seen {
                    first: m.rss,
                    last: m.rss,
                    prev: None,
                    first_at: now,
                });
        }
        st.seen.retain(|k, _| live.contains(k));
        let mut groups: HashMap<Key, Vec<Member>> = HashMap::new();
        for m in &members {
            if let Some(root) = st.family.get(&m.key()) {
                groups.entry(*root).or_default().push(*m);
            }
        }
        st.groups = groups;
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
            .any(|r| matches!(need(&st, *r, now), Some(Need::Forked)));
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
    /// before the fork; that parent's own private figure is held to what
    /// it was before the fork (see [`across_forks`]).
    pub fn apply(&self, procs: &mut [ProcSample], now: Instant) -> f64 {
        let mut st = self.lock();
        let oldest = estimate(&st, procs, now);
        across_forks(procs, &mut st.before_fork, now);
        oldest
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
    let rss_of: HashMap<u32, u64> = procs.iter().map(|p| (p.pid, p.rss_bytes)).collect();
    let mut oldest = 0.0f64;
    // Shared pages a process gave up (it exited, or unmapped them on its
    // way out), for the survivors that still map them.
    let mut handed: Vec<(usize, u64)> = Vec::new();
    for (i, p) in procs.iter_mut().enumerate() {
        let key = (p.pid, p.start_time);
        let root = st.family.get(&key);
        let snap = root.and_then(|root| st.snaps.get(root));
        let reading = snap.and_then(|s| s.readings.get(&key));
        match (reading, snap, root) {
            (Some(r), Some(snap), Some(root)) => {
                let carried = carry(r, p.rss_bytes);
                p.pss_bytes = carried.pss;
                p.uss_bytes = carried.uss;
                p.swap_bytes = r.rollup.swap;
                let age = now.saturating_duration_since(r.at).as_secs_f64();
                // Rounded as the log writes times (ms).
                p.read_age_seconds = Some((age * 1000.0).round() / 1000.0);
                oldest = oldest.max(age);
                if carried.handed > 0
                    && let Some(h) = heir(snap, key, *root, &index).filter(|&h| h != i)
                {
                    handed.push((h, carried.handed));
                }
            }
            _ => {
                // Not read yet: what it wrote since it was first seen, or
                // what it holds beyond its parent (a forked worker that
                // allocated before the tick first saw it); what it shares
                // with its parent is still in the parent's reading.
                let grown = st.seen.get(&key).map_or(0, |s| {
                    let since_seen = p.rss_bytes.saturating_sub(s.first);
                    let beyond_parent = rss_of
                        .get(&p.ppid)
                        .map_or(0, |&parent| p.rss_bytes.saturating_sub(parent));
                    since_seen.max(beyond_parent)
                });
                p.pss_bytes = grown;
                p.uss_bytes = grown;
                p.swap_bytes = 0;
                p.read_age_seconds = None;
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
            if let Some(h) = heir(snap, *key, *root, &index) {
                handed.push((h, shared));
                oldest = oldest.max(now.saturating_duration_since(r.at).as_secs_f64());
            }
        }
    }
    for (i, bytes) in handed {
        procs[i].pss_bytes += bytes;
    }
    oldest
}

/// How long a parent's private figure is held to its value before a fork
/// while the fork's children wait to be read: longer than a newcomer waits
/// to settle ([`SETTLE_MAX`]) and its family's burst, short enough that a
/// parent forking again and again is not frozen.
const FORK_HOLD: Duration = Duration::from_secs(10);

/// A parent with children not read since their fork carries its reading
/// from before the fork plus the RSS it gained since: the pages it now
/// shares with them still count as its own, and what it allocated after
/// the fork comes on top (a trainer stated at 621 MiB private that never
/// held more than 537). Until the family is read, its USS is held to its
/// figure at the last tick before the fork; growth since that tick is not
/// shown until the reading. Its PSS is left as estimated: the children
/// count none of the shared pages, so the sum stays whole.
fn across_forks(procs: &mut [ProcSample], before: &mut HashMap<Key, (u64, Instant)>, now: Instant) {
    let forked: HashSet<u32> = (procs.iter())
        .filter(|p| p.read_age_seconds.is_none())
        .map(|p| p.ppid)
        .collect();
    let mut live = HashSet::with_capacity(procs.len());
    for p in procs.iter_mut() {
        let key = (p.pid, p.start_time);
        live.insert(key);
        if !forked.contains(&p.pid) {
            before.insert(key, (p.uss_bytes, now));
        } else if let Some(&(uss, at)) = before.get(&key)
            && now.saturating_duration_since(at) <= FORK_HOLD
        {
            p.uss_bytes = p.uss_bytes.min(uss);
        }
    }
    before.retain(|key, _| live.contains(key));
}

/// A reading carried forward to the RSS a tick found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Carried {
    pss: u64,
    uss: u64,
    /// PSS of shared pages the process no longer maps: it goes to the
    /// processes that still share them.
    handed: u64,
}

/// Growth is new private memory, so it counts fully. A drop is taken from
/// the private pages first; only what goes beyond them left shared pages,
/// whose share goes back to the other sharers. A process on its way out
/// (the kernel tears its memory down before it becomes a zombie, and its
/// RSS reads 0 from then on) thus hands all of its share back rather than
/// taking it with it.
fn carry(r: &Reading, rss: u64) -> Carried {
    let (pss, uss) = (r.rollup.pss, r.rollup.uss.min(r.rollup.pss));
    if rss >= r.rss_at {
        let grown = rss - r.rss_at;
        return Carried {
            pss: pss + grown,
            uss: uss + grown,
            handed: 0,
        };
    }
    let drop = r.rss_at - rss;
    let private_drop = drop.min(uss);
    let shared_rss = r.rss_at.saturating_sub(uss);
    let shared_drop = drop - private_drop;
    let gone = if rss == 0 {
        1.0
    } else if shared_rss == 0 {
        0.0
    } else {
        (shared_drop as f64 / shared_rss as f64).min(1.0)
    };
    let shared_pss = pss - uss;
    let handed = (shared_pss as f64 * gone) as u64;
    Carried {
        pss: uss - private_drop + shared_pss - handed,
        uss: uss - private_drop,
        handed,
    }
}

/// The live process that takes over `key`'s share of pages it no longer
/// maps: its nearest ancestor in the snapshot that is still in the tree,
/// else the family root, else any live member of the snapshot.
fn heir(snap: &Snapshot, key: Key, root: Key, index: &HashMap<Key, usize>) -> Option<usize> {
    let live = |k: &Key| *k != key && index.contains_key(k);
    let mut up = snap.readings.get(&key).and_then(|r| r.parent);
    for _ in 0..64 {
        match up {
            Some(h) if live(&h) => break,
            Some(h) => up = snap.readings.get(&h).and_then(|x| x.parent),
            None => break,
        }
    }
    let h = up
        .filter(live)
        .or_else(|| live(&root).then_some(root))
        .or_else(|| snap.readings.keys().filter(|k| live(k)).min().copied())?;
    index.get(&h).copied()
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
fn need(st: &State, root: Key, now: Instant) -> Option<Need> {
    let members: &[Member] = st.groups.get(&root).map_or(&[], Vec::as_slice);
    let unread = |m: &&Member| {
        st.snaps
            .get(&root)
            .is_none_or(|s| !s.readings.contains_key(&m.key()))
    };
    if members.iter().any(|m| unread(&m)) {
        // Read a fork once its newcomers have settled; until then they are
        // charged for what they hold beyond their parent.
        let settled = members
            .iter()
            .filter(unread)
            .all(|m| st.seen.get(&m.key()).is_none_or(|s| s.settled(now)));
        return settled.then_some(Need::Forked);
    }
    let snap = st.snaps.get(&root)?;
    if snap.readings.len() > members.len() {
        return Some(Need::Exited);
    }
    let age = now.saturating_duration_since(snap.at);
    // Sharing that changed is the one move the estimate cannot follow (a
    // worker writing to pages it inherited copies them: its private memory
    // grows, no RSS moves): until re-read, every worker keeps the private
    // memory it had at its fork. With the job's own footprint it shows as
    // footprint growth that the members' RSS does not explain, and is re-read
    // soon, whatever the slowdown below (within the budget).
    if st.exact
        && age >= st.cfg.interval / UNEXPLAINED_SOONER
        && let Some(bytes) = unexplained(st, snap, members)
    {
        return Some(Need::Refresh(bytes as f64, age.as_secs_f64()));
    }
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
    // page it inherited makes a private copy; both RSS stay the same): a
    // footprint that moved says so.
    let footprint_moved = st
        .footprint
        .zip(snap.footprint_at)
        .is_some_and(|(now, then)| now.abs_diff(then) > (4u64 << 20).max(now / 100));
    let old = age >= st.cfg.interval * MAX_AGE_INTERVALS * slow;
    (moved > 0 || footprint_moved || old).then_some(Need::Refresh(moved as f64, age.as_secs_f64()))
}

/// Footprint change since the snapshot that the members' RSS changes do
/// not account for, when larger than noise (see [`need`]).
fn unexplained(st: &State, snap: &Snapshot, members: &[Member]) -> Option<u64> {
    let (now, then) = st.footprint.zip(snap.footprint_at)?;
    let rss: i128 = members
        .iter()
        .filter_map(|m| {
            snap.readings
                .get(&m.key())
                .map(|r| i128::from(m.rss) - i128::from(r.rss_at))
        })
        .sum();
    let footprint = i128::from(now) - i128::from(then);
    let left = (footprint - rss).unsigned_abs();
    let left = u64::try_from(left).unwrap_or(u64::MAX);
    (left > (4u64 << 20).max(now / 100)).then_some(left)
}

/// The family to read next, if the budget allows one now; otherwise how
/// long to wait.
fn choose(st: &mut State, now: Instant) -> Result<Burst, Duration> {
    let budget = st.cfg.budget.max(1e-6);
    let elapsed = now.saturating_duration_since(st.refilled).as_secs_f64();
    st.refilled = now;
    // Savings are capped, but never below what the family waiting for them
    // needs: a burst is only taken once it is paid for, so the budget holds
    // over any stretch of time, not just on average.
    let cap = (budget * SAVINGS).max(st.saving_for);
    st.tokens = (st.tokens + elapsed * budget).min(cap);
    let mut best: Option<(Need, Key)> = None;
    for &root in st.groups.keys() {
        if st.failed.get(&root) == Some(&st.version) {
            continue;
        }
        if let Some(n) = need(st, root, now)
            && best.as_ref().is_none_or(|(b, _)| n > *b)
        {
            best = Some((n, root));
        }
    }
    let Some((_, root)) = best else {
        return Err(Duration::from_secs(1));
    };
    let members: &[Member] = st.groups.get(&root).map_or(&[], Vec::as_slice);
    // Forks come first, but like everything else wait until the budget can
    // pay for the burst: the cost is that of the family's last burst, or
    // its RSS at the learnt cost per byte (the page-table walk follows
    // mapped memory). Until then the estimates carry the family.
    let expected = match st.snaps.get(&root) {
        Some(s) if s.cost > 0.0 => s.cost,
        _ => members.iter().map(|m| m.rss as f64).sum::<f64>() * st.cost_per_byte,
    };
    st.saving_for = expected;
    if st.tokens < expected || st.tokens < 0.0 {
        let short = expected.max(0.0) - st.tokens;
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
    // Everything this thread spends is charged to the budget, not only the
    // readings: waking up, choosing, the children lists.
    let mut charged = thread_cpu();
    let charge = |st: &mut State, charged: &mut f64| {
        let cpu = thread_cpu();
        let spent = (cpu - *charged).max(0.0);
        *charged = cpu;
        st.tokens -= spent;
        st.stats.cpu_seconds += spent;
    };
    loop {
        let burst = {
            let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if st.stop {
                    return;
                }
                charge(&mut st, &mut charged);
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
        charge(&mut st, &mut charged);
        st.stats.readings += readings.len() as u64;
        let rss: u64 = readings.values().map(|r| r.rollup.rss).sum();
        if rss > 0 && consistent {
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
/// lists before and after, and no child the tick has not listed yet). The
/// cheap checks come first and are repeated between expensive readings,
/// so a burst that cannot be consistent stops early.
fn read_family(
    proc_root: &Path,
    burst: &Burst,
    page: u64,
    buf: &mut String,
) -> (HashMap<Key, Reading>, bool) {
    let mut readings = HashMap::with_capacity(burst.members.len());
    let cpu0 = thread_cpu();
    let before = children(proc_root, burst, buf);
    // Re-checking costs a pass over every member's children lists: spaced
    // so that it stays a small part of the burst however large the family.
    let recheck_after = RECHECK_AFTER.max(8.0 * (thread_cpu() - cpu0));
    // A child the tick has not listed yet was forked before the burst: its
    // parent's reading would already share with it.
    if unknown_child(proc_root, burst, &before, buf) {
        return (readings, false);
    }
    let mut since_check = 0.0;
    for (n, &((pid, start), parent)) in burst.members.iter().enumerate() {
        let cpu0 = thread_cpu();
        let dir = proc_root.join(pid.to_string());
        let at = Instant::now();
        let rollup =
            read_into(&dir.join("smaps_rollup"), buf).and_then(|()| parse_smaps_rollup(buf));
        // The pid may have been reused between listing and reading: only
        // keep the reading if the start time still matches.
        let stat = read_into(&dir.join("stat"), buf)
            .and_then(|()| parse_stat(buf))
            .filter(|s| s.start_time == start);
        let (Some(rollup), Some(stat)) = (rollup, stat) else {
            return (readings, false);
        };
        readings.insert(
            (pid, start),
            Reading {
                rollup,
                rss_at: stat.rss_pages * page,
                at,
                parent,
            },
        );
        since_check += thread_cpu() - cpu0;
        if since_check >= recheck_after && n + 1 < burst.members.len() {
            since_check = 0.0;
            if children(proc_root, burst, buf) != before {
                return (readings, false);
            }
        }
    }
    let after = children(proc_root, burst, buf);
    let consistent = before == after && !unknown_child(proc_root, burst, &after, buf);
    (readings, consistent)
}

/// Whether a live child of the family is not in the tick's listing.
fn unknown_child(proc_root: &Path, burst: &Burst, kids: &[u32], buf: &mut String) -> bool {
    kids.iter().filter(|k| !burst.known.contains(k)).any(|kid| {
        read_into(&proc_root.join(kid.to_string()).join("stat"), buf)
            .and_then(|()| parse_stat(buf))
            .is_some_and(|s| s.state != 'Z' && s.state != 'X')
    })
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
            rss_peak_bytes: None,
            gpu_bytes: None,
            read_age_seconds: None,
            torch: None,
            start_time: m.start_time,
            stopped: false,
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
        let now = Instant::now();
        let family = family_roots(&members);
        let mut groups: HashMap<Key, Vec<Member>> = HashMap::new();
        for m in &members {
            groups.entry(family[&m.key()]).or_default().push(*m);
        }
        let mut st = State {
            cfg: SweepConfig {
                interval: Duration::from_secs(5),
                budget: 0.01,
            },
            family,
            groups,
            seen: members
                .iter()
                .map(|m| {
                    let seen = Seen {
                        first: m.rss,
                        last: m.rss,
                        prev: None,
                        first_at: now,
                    };
                    (m.key(), seen)
                })
                .collect(),
            members,
            snaps: HashMap::new(),
            footprint: None,
            exact: false,
            version: 0,
            failed: HashMap::new(),
            tokens: 0.3,
            saving_for: 0.0,
            refilled: now,
            cost_per_byte: 0.0,
            stats: SweepStats::default(),
            stop: false,
            before_fork: HashMap::new(),
        };
        st.snaps.insert(
            root,
            Snapshot {
                readings: snap.into_iter().collect(),
                at: now,
                footprint_at: None,
                cost: 0.01,
            },
        );
        st
    }

    /// The tick saw every member again with the RSS it has now.
    fn tick(st: &mut State) {
        for m in &st.members {
            if let Some(s) = st.seen.get_mut(&m.key()) {
                s.prev = Some(s.last);
                s.last = m.rss;
            }
        }
        for g in st.groups.values_mut() {
            for m in g.iter_mut() {
                if let Some(now) = st.members.iter().find(|x| x.key() == m.key()) {
                    m.rss = now.rss;
                }
            }
        }
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
        // Still growing: not worth a burst yet.
        tick(&mut st);
        assert_eq!(need(&st, parent.key(), Instant::now()), None);
        tick(&mut st);
        assert!(matches!(
            need(&st, parent.key(), Instant::now()),
            Some(Need::Forked)
        ));
    }

    #[test]
    fn a_reading_carries_its_age_and_an_estimate_none() {
        // The parent was read 2 s before the tick; its new worker was not.
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let mut read = reading(800 * MIB, 800 * MIB, 800 * MIB, None);
        let now = Instant::now();
        read.at = now - Duration::from_secs(2);
        let ms = vec![parent, member(101, 100, Role::Worker, 800 * MIB)];
        let st = state(ms, vec![(parent.key(), read)], parent.key());
        let mut procs: Vec<ProcSample> = st.members.iter().map(proc).collect();
        estimate(&st, &mut procs, now);
        assert_eq!(procs[0].read_age_seconds, Some(2.0));
        assert_eq!(procs[1].read_age_seconds, None);
    }

    /// Figures of tests/diagnosis.rs's numpy case on a busy machine: the
    /// trainer at 541 MiB private before the fork; with its two workers
    /// not yet read and 80 MiB allocated since, estimated at 621 (the
    /// reader saw it at 228 → 308 after the fork, 537 at most before).
    #[test]
    fn a_parent_with_unread_children_states_no_more_than_before_the_fork() {
        let parent = member(100, 1, Role::Trainer, 543 * MIB);
        let snap = vec![(parent.key(), reading(541 * MIB, 541 * MIB, 543 * MIB, None))];
        let mut st = state(vec![parent], snap, parent.key());
        let t0 = Instant::now();
        let apply = |st: &mut State, at: Instant| -> Vec<ProcSample> {
            let mut procs: Vec<ProcSample> = st.members.iter().map(proc).collect();
            estimate(st, &mut procs, at);
            across_forks(&mut procs, &mut st.before_fork, at);
            procs
        };
        let uss = |st: &mut State, at: Instant| -> Vec<u64> {
            apply(st, at).iter().map(|p| p.uss_bytes / MIB).collect()
        };
        assert_eq!(uss(&mut st, t0), [541]);
        st.members[0].rss = 623 * MIB;
        st.members.push(member(101, 100, Role::Worker, 321 * MIB));
        st.members.push(member(102, 100, Role::Worker, 327 * MIB));
        for m in &st.members[1..] {
            st.family.insert(m.key(), parent.key());
            let seen = Seen {
                first: m.rss,
                last: m.rss,
                prev: None,
                first_at: t0,
            };
            st.seen.insert(m.key(), seen);
        }
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(uss(&mut st, t1), [541, 0, 0]);
        // The sum is left whole: the shared pages stay the parent's.
        assert_eq!(apply(&mut st, t1)[0].pss_bytes, 621 * MIB);
        // Children left unread past the hold: the estimate is shown again.
        assert_eq!(
            uss(&mut st, t0 + FORK_HOLD + Duration::from_secs(1)),
            [621, 0, 0]
        );
        // Read: the reading is the figure.
        let read = st
            .snaps
            .get_mut(&parent.key())
            .expect("the parent's snapshot");
        read.readings
            .insert(parent.key(), reading(470 * MIB, 308 * MIB, 623 * MIB, None));
        for m in &st.members[1..] {
            let r = reading(170 * MIB, 12 * MIB, m.rss, Some(parent.key()));
            read.readings.insert(m.key(), r);
        }
        assert_eq!(uss(&mut st, t1), [308, 12, 12]);
    }

    #[test]
    fn a_newcomer_first_seen_after_it_allocated_counts_beyond_its_parent() {
        // The workers wrote their 40 MiB before the first tick saw them:
        // no growth since seen, but 40 MiB more than the parent they share with.
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let snap = vec![(parent.key(), reading(800 * MIB, 800 * MIB, 800 * MIB, None))];
        let mut ms = vec![parent];
        for i in 0..6 {
            ms.push(member(101 + i, 100, Role::Worker, 840 * MIB));
        }
        let st = state(ms, snap, parent.key());
        assert_eq!(total(&st), 1040 * MIB);
    }

    /// A burst of the parent and 6 workers sharing 800 MiB, each worker
    /// with 40 MiB of its own.
    fn shared_family() -> (Member, Vec<(Key, Reading)>, Vec<Member>) {
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let share = 800 * MIB / 7;
        let mut snap = vec![(parent.key(), reading(share, 0, 800 * MIB, None))];
        let mut workers = Vec::new();
        for i in 0..6 {
            let w = member(101 + i, 100, Role::Worker, 840 * MIB);
            snap.push((
                w.key(),
                reading(share + 40 * MIB, 40 * MIB, 840 * MIB, Some(parent.key())),
            ));
            workers.push(w);
        }
        (parent, snap, workers)
    }

    #[test]
    fn workers_on_their_way_out_hand_their_share_back() {
        // The kernel has torn the workers' memory down (RSS 0) but they are
        // not zombies yet, so the tick still lists them. Counting them as 0
        // while the parent keeps its 1/7 showed 800 MiB as ~114 MiB.
        let (parent, snap, workers) = shared_family();
        let mut ms = vec![parent];
        ms.extend(workers.iter().map(|w| Member { rss: 0, ..*w }));
        let st = state(ms, snap, parent.key());
        let t = total(&st);
        assert!(t.abs_diff(800 * MIB) < MIB, "{} MiB", t / MIB);
    }

    #[test]
    fn freeing_private_memory_keeps_the_shares() {
        let (parent, snap, workers) = shared_family();
        let mut ms = vec![parent];
        ms.extend(workers.iter().map(|w| Member {
            rss: w.rss - 40 * MIB,
            ..*w
        }));
        let st = state(ms, snap, parent.key());
        let t = total(&st);
        assert!(t.abs_diff(800 * MIB) < MIB, "{} MiB", t / MIB);
    }

    #[test]
    fn a_shrinking_reading_splits_private_then_shared() {
        let r = reading(150 * MIB, 50 * MIB, 450 * MIB, None);
        // Growth counts fully.
        assert_eq!(
            carry(&r, 460 * MIB),
            Carried {
                pss: 160 * MIB,
                uss: 60 * MIB,
                handed: 0
            }
        );
        // 30 MiB freed: private.
        assert_eq!(carry(&r, 420 * MIB).pss, 120 * MIB);
        // 250 MiB dropped: all 50 private, then half of the 400 shared.
        let c = carry(&r, 200 * MIB);
        assert_eq!((c.uss, c.handed), (0, 50 * MIB));
        assert_eq!(c.pss, 50 * MIB);
        // Gone: everything shared goes back.
        assert_eq!(
            carry(&r, 0),
            Carried {
                pss: 0,
                uss: 0,
                handed: 100 * MIB
            }
        );
    }

    #[test]
    fn exited_workers_hand_their_share_back() {
        // A consistent burst of the parent and 6 workers sharing 800 MiB,
        // then the workers exit: the parent's old reading (1/7 of it) plus
        // the workers' shared parts is the 800 MiB still there.
        let (parent, snap, _) = shared_family();
        let st = state(vec![parent], snap, parent.key());
        let t = total(&st);
        assert!(t.abs_diff(800 * MIB) < MIB, "{t}");
        assert!(matches!(
            need(&st, parent.key(), Instant::now()),
            Some(Need::Exited)
        ));
    }

    #[test]
    fn an_unchanged_fresh_family_needs_nothing() {
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let snap = vec![(parent.key(), reading(800 * MIB, 800 * MIB, 800 * MIB, None))];
        let st = state(vec![parent], snap, parent.key());
        assert_eq!(need(&st, parent.key(), Instant::now()), None);
        // Untouched, it is renewed only after the long maximum age.
        let later = Instant::now() + Duration::from_secs(5 * 11);
        assert_eq!(need(&st, parent.key(), later), None);
        let much_later = Instant::now() + Duration::from_secs(5 * 12 + 1);
        assert!(matches!(
            need(&st, parent.key(), much_later),
            Some(Need::Refresh(..))
        ));
    }

    #[test]
    fn a_moved_footprint_renews_a_family_whose_rss_stood_still() {
        // Workers copying the pages they share: no RSS moves, but what
        // holds the tree (its cgroup, or the machine) grew by 300 MiB.
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let snap = vec![(parent.key(), reading(800 * MIB, 800 * MIB, 800 * MIB, None))];
        let mut st = state(vec![parent], snap, parent.key());
        let root = parent.key();
        st.snaps.get_mut(&root).unwrap().footprint_at = Some(3 << 30);
        let after_interval = Instant::now() + Duration::from_secs(6);
        st.footprint = Some((3 << 30) + 2 * MIB);
        assert_eq!(need(&st, root, after_interval), None, "noise");
        st.footprint = Some((3 << 30) + 300 * MIB);
        assert!(matches!(
            need(&st, root, after_interval),
            Some(Need::Refresh(..))
        ));
        // Not before the interval: the budget is for families that moved.
        assert_eq!(need(&st, root, Instant::now()), None);
    }

    #[test]
    fn copying_shared_pages_under_an_owned_cgroup_is_reread_within_seconds() {
        // Three workers copying what they inherited: the owned cgroup's
        // working set grows 150 MiB, no RSS moves. Read again after a fifth
        // of an interval, not after the owned cgroup's doubled interval
        // (the readings from around the fork would stay for 10 s).
        let parent = member(100, 1, Role::Trainer, 800 * MIB);
        let snap = vec![(parent.key(), reading(800 * MIB, 800 * MIB, 800 * MIB, None))];
        let mut st = state(vec![parent], snap, parent.key());
        st.exact = true;
        let root = parent.key();
        st.snaps.get_mut(&root).unwrap().footprint_at = Some(1 << 30);
        st.footprint = Some((1 << 30) + 150 * MIB);
        let soon = Instant::now() + Duration::from_millis(1100);
        assert!(matches!(need(&st, root, soon), Some(Need::Refresh(..))));
        assert_eq!(need(&st, root, Instant::now()), None, "not at once");
        // Growth its RSS shows is followed by the estimate: no hurry.
        st.members[0].rss = 950 * MIB;
        st.groups.insert(root, st.members.clone());
        assert_eq!(need(&st, root, soon), None);
    }
}
