//! A job whose ranks span nodes, when one rank cannot take part any more.
//!
//! The checkpoint vote needs every rank to reach its next step. A rank that
//! is stopped by a signal (not by oomguard) never does, and every other
//! rank of every node waits for it in its next collective until the
//! collective's timeout (10–30 minutes with NCCL). This part notices such a
//! rank on this node, tells the other nodes through the companion's fault
//! channel (the job's rendezvous store), and ends this node's part once
//! they have had time to learn why; and it ends this node's part when
//! another node reports a fault. A save is not possible then (the vote
//! cannot finish), so the end goes straight to SIGTERM: the point is that
//! every node ends within seconds, names the cause, and exits "stopped by
//! policy" for its scheduler to requeue.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::super::store_link::{News, Place, StoreLink};
use super::journal::Journal;
use super::{Acted, Ident};
use crate::engine::policy::Action;
use crate::vocab::companion::{Channel, Fault, Record, STORE_CLOSING};
use crate::vocab::model::{ProcSample, Role};
use crate::vocab::units::human_duration;

/// How long a rank may stay stopped before it counts as a fault: a short
/// ^Z passes, and the other nodes still end well inside `--grace` + 10 s.
pub const STALL_AFTER: Duration = Duration::from_secs(5);
/// The most this node waits for the store to have its fault before it
/// ends its part anyway (the companion's thread polls every 0.5 s).
const TELL_WAIT: Duration = Duration::from_secs(3);
/// Once the store has the fault: time for the other nodes' companions to
/// read it before this node's ranks go and the other nodes' collectives
/// fail.
const AFTER_TOLD: Duration = Duration::from_millis(1500);
/// After the job's store went away with no fault: how long this node's
/// ranks may still be finishing on their own before they are taken to be
/// waiting for a node that is gone (a job whose store lives in rank 0's
/// process, outside torchrun, can lose it at a normal end).
pub const STORE_LOST_WAIT: Duration = Duration::from_secs(10);
/// The same wait with one oomguard per rank: rank 0's own process serves
/// the store, and says so before a normal end (`store-closing`), so a store
/// gone without that word is rank 0's death, told within 10 s.
const STORE_LOST_WAIT_TASKS: Duration = Duration::from_secs(2);
/// How long the store may not answer, with one oomguard per rank, before
/// it is lost (no launcher keeps it: a refused connection is final).
const LOST_AFTER_TASKS: Duration = Duration::from_secs(2);

/// What the job's other nodes and this node's ranks have said about faults.
#[derive(Debug, Default)]
pub struct Peers {
    /// When this attempt began (Unix seconds; 0 when unknown): a fault in
    /// the job's store from before it is an earlier attempt's.
    began: f64,
    /// This node's ranks seen stopped by someone else, since when.
    stopped_since: HashMap<Ident, Instant>,
    /// This node's fault, once raised.
    raised: Option<Raised>,
    /// Another node's fault this node has not yet acted on.
    remote: Option<RemoteFault>,
    /// pid → global rank, from the companions' hellos.
    ranks: HashMap<u32, u32>,
    /// The job's store stopped answering: when, and where it was.
    store_lost: Option<(Instant, String)>,
    /// This attempt's line to the job's store, once a rank named it.
    link: Option<StoreLink>,
    /// How each rank that is ending said it ends (its companion's `crash`
    /// and `bye`), by pid.
    ends: HashMap<u32, RankEnd>,
    /// A rank of this node that died of a broken collective: most likely
    /// a consequence of another node's fault, which is waited for a little
    /// before this one is told as the cause.
    held: Option<Held>,
    /// The ranks whose end was handled.
    gone: HashSet<u32>,
    /// SLURM started each rank as a task of its own (a companion said so):
    /// no launcher, and rank 0's process serves the job's store.
    task_layout: bool,
    /// Rank 0 said it ends normally (`store-closing`): the store going
    /// away after is no news.
    store_closing: bool,
}

#[derive(Debug, Default)]
struct RankEnd {
    crash: Option<String>,
    bye: bool,
}

#[derive(Debug)]
struct Held {
    rank: u32,
    reason: &'static str,
    detail: String,
    at: Instant,
}

/// How long a rank's death by a broken collective waits for another node's
/// fault to explain it (the other node's oomguard tells its own the moment
/// it happens, so this is ample).
const HOLD: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Raised {
    /// The fault's id in the channel (none: it could not be written).
    id: Option<u64>,
    why: String,
    at: Instant,
    /// When the companion reported it in the store.
    told: Option<Instant>,
    ended: bool,
}

/// Another node's fault: why (naming the node), and whether that node
/// restarts the job (then this node restarts with it).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteFault {
    pub why: String,
    pub restart: bool,
}

impl Peers {
    /// The peers of an attempt that begins now.
    pub fn begun() -> Self {
        Peers {
            began: crate::vocab::clock::unix_seconds(),
            ..Peers::default()
        }
    }

    /// Takes in one companion record.
    pub fn note(&mut self, r: &Record, now: Instant) {
        match r {
            Record::Hello {
                pid,
                rank,
                world,
                local_world,
                node,
                task,
                store,
                ..
            } => {
                self.ranks.insert(*pid, *rank);
                // Other oomguards to hear from: other nodes' under a
                // launcher; with one oomguard per rank, every other rank's.
                let here = if task.is_some() {
                    Some(1)
                } else {
                    *local_world
                };
                let spans = matches!((world, here), (Some(w), Some(l)) if *w > l);
                self.task_layout |= task.is_some();
                let place = Place {
                    node: node.unwrap_or(0),
                    task: *task,
                };
                if let (true, Some(store)) = (spans, store)
                    && self.link.as_ref().is_none_or(|l| l.addr() != store)
                {
                    self.link = if self.task_layout {
                        StoreLink::start_with(store.clone(), place, self.began, LOST_AFTER_TASKS)
                    } else {
                        StoreLink::start(store.clone(), place, self.began)
                    }
                    .ok();
                }
            }
            Record::Crash { pid, error, .. } => {
                self.ends.entry(*pid).or_default().crash =
                    Some(error.clone().unwrap_or_else(|| "an exception".into()));
            }
            Record::Bye { pid, .. } => {
                self.ends.entry(*pid).or_default().bye = true;
            }
            Record::StoreLost { addr } => {
                let addr = addr.clone().unwrap_or_else(|| "?".into());
                self.store_lost.get_or_insert((now, addr));
            }
            Record::FaultPublished { id } => {
                if let Some(raised) = self.raised.as_mut().filter(|x| x.id == Some(*id)) {
                    raised.told.get_or_insert(now);
                }
            }
            Record::Fault { reason, .. } if reason.as_deref() == Some(STORE_CLOSING) => {
                self.store_closing = true;
            }
            Record::Fault {
                node,
                cause_rank,
                reason,
                detail,
                then,
                ..
            } => {
                self.remote.get_or_insert(RemoteFault {
                    why: crate::vocab::companion::remote_cause(
                        *node,
                        *cause_rank,
                        reason.as_deref().unwrap_or("fault"),
                        detail.as_deref(),
                    ),
                    restart: then.as_deref() == Some("restart"),
                });
            }
            _ => {}
        }
    }

    /// Why the attempt ends when the job's store went away with no fault.
    fn store_lost_why(&self) -> Option<String> {
        if self.store_closing {
            return None;
        }
        self.store_lost.as_ref().map(|(_, addr)| {
            if self.task_layout {
                // No launcher: rank 0's own process serves the store.
                format!(
                    "rank 0: store-lost: the job's store at {addr}, served by rank 0's process, went away while this task's rank still ran, with no word of a normal end: rank 0 ended"
                )
            } else {
                format!(
                    "store-lost: the job's store at {addr} (hosted by node 0's launcher) went away while this node's ranks still ran: node 0's part of the job ended"
                )
            }
        })
    }

    fn store_lost_wait(&self) -> Duration {
        if self.task_layout {
            STORE_LOST_WAIT_TASKS
        } else {
            STORE_LOST_WAIT
        }
    }

    /// SLURM started each rank as a task of its own: this oomguard's part
    /// of the job is one rank.
    pub fn one_rank_each(&self) -> bool {
        self.task_layout
    }

    /// Rank 0 said it ends normally (one oomguard per rank).
    pub fn store_closing(&self) -> bool {
        self.store_closing
    }

    /// A fault of this node's is not yet in the store (its link is still
    /// putting it there).
    pub fn fault_untold(&self) -> bool {
        self.link.is_some()
            && self
                .raised
                .as_ref()
                .is_some_and(|r| r.id.is_some() && r.told.is_none())
    }

    /// What the link to the job's store heard since the last call.
    pub fn link_news(&self) -> Vec<News> {
        self.link.as_ref().map(StoreLink::take).unwrap_or_default()
    }

    /// The pids of this node's ranks whose companion said hello, and
    /// that have not ended.
    pub fn rank_pids(&self) -> Vec<u32> {
        self.ranks
            .keys()
            .filter(|p| !self.gone.contains(p))
            .copied()
            .collect()
    }

    /// The rank pid's global rank, when its companion said hello.
    pub fn rank_of(&self, pid: u32) -> Option<u32> {
        self.ranks.get(&pid).copied()
    }

    /// The rank `pid` is, or works for (a DataLoader worker's trainer):
    /// the nearest ancestor in `tree` whose companion said hello.
    pub fn rank_above(&self, pid: Option<u32>, tree: &[ProcSample]) -> Option<u32> {
        let mut pid = pid?;
        for _ in 0..tree.len() + 1 {
            if let Some(r) = self.rank_of(pid) {
                return Some(r);
            }
            pid = tree.iter().find(|p| p.pid == pid)?.ppid;
        }
        None
    }

    /// Follows this node's ranks (the processes whose companion said hello,
    /// and the trainers): the first one stopped by someone other than
    /// oomguard (`held`) for [`STALL_AFTER`], with how long.
    fn stalled(
        &mut self,
        tree: &[ProcSample],
        held: &HashSet<Ident>,
        now: Instant,
    ) -> Option<(u32, Duration)> {
        let is_rank = |p: &ProcSample| p.role == Role::Trainer || self.ranks.contains_key(&p.pid);
        let stopped: Vec<Ident> = tree
            .iter()
            .filter(|p| p.stopped && is_rank(p) && !held.contains(&(p.pid, p.start_time)))
            .map(|p| (p.pid, p.start_time))
            .collect();
        self.stopped_since.retain(|id, _| stopped.contains(id));
        for id in &stopped {
            self.stopped_since.entry(*id).or_insert(now);
        }
        self.stopped_since
            .iter()
            .map(|(id, since)| (id.0, now - *since))
            .filter(|(_, d)| *d >= STALL_AFTER)
            .max_by_key(|(_, d)| *d)
    }

    /// Whether this node's raised fault has been out long enough.
    fn due(&self, now: Instant) -> Option<String> {
        let r = self.raised.as_ref().filter(|r| !r.ended)?;
        let due = match r.told {
            Some(t) => now >= t + AFTER_TOLD,
            None => now >= r.at + TELL_WAIT,
        };
        due.then(|| r.why.clone())
    }
}

/// What raising this node's fault needs of the actuator, lent for one
/// call: the channel it is told on, the journal it is written to, and
/// whether this node may still raise one (a job across nodes, not already
/// ending by a decision of its own).
pub struct Voice<'a> {
    ch: Option<&'a mut Channel>,
    out: &'a mut Journal,
    open: bool,
}

impl<'a> Voice<'a> {
    pub fn new(ch: Option<&'a mut Channel>, out: &'a mut Journal, open: bool) -> Self {
        Self { ch, out, open }
    }
}

/// How this node's part ends for a fault: `stop` or `restart`, and why.
pub type FaultEnd = (Action, String);

impl Peers {
    /// Once per tick, for a job across nodes that is not ending anyway:
    /// another node's fault, this node's raised when a rank stalls (`held`:
    /// the processes oomguard itself holds are not stalls), and the end of
    /// this node's part once the others know: the end, when it is due.
    pub fn watch(
        &mut self,
        tree: &[ProcSample],
        held: &HashSet<Ident>,
        now: Instant,
        v: &mut Voice<'_>,
    ) -> Option<FaultEnd> {
        self.release_held(now, false, v);
        if self.raised.is_some() {
            // This node's own fault came first: another node's (a
            // consequence of it, as a rank there failed) is not the cause.
            self.remote = None;
        }
        if self.remote.is_none()
            && self.raised.is_none()
            && let Some(why) = self.store_lost_why()
            && self
                .store_lost
                .as_ref()
                .is_some_and(|(at, _)| now >= *at + self.store_lost_wait())
        {
            let ours = if self.task_layout {
                "this task's rank"
            } else {
                "this node's ranks"
            };
            v.out.say(format!(
                "{why}; {ours} would wait for it in their next collective: stopping"
            ));
            self.store_lost = None;
            return Some((Action::Stop, why));
        }
        if let Some(remote) = self.remote.take() {
            let then = if remote.restart {
                "restart the job with it"
            } else {
                "stop with it"
            };
            v.out.say(format!(
                "{}; this node's ranks cannot go on without it, and {then} (no save is possible: the vote needs every rank)",
                remote.why
            ));
            let action = if remote.restart {
                Action::Restart
            } else {
                Action::Stop
            };
            return Some((action, remote.why));
        }
        if self.raised.is_none()
            && let Some((pid, stalled)) = self.stalled(tree, held, now)
        {
            self.raise_stall(pid, stalled, now, v);
        }
        let why = self.due(now)?;
        if let Some(r) = self.raised.as_mut() {
            r.ended = true;
        }
        Some((Action::Stop, why))
    }

    fn raise_stall(&mut self, pid: u32, stalled: Duration, now: Instant, v: &mut Voice<'_>) {
        let rank = self.rank_of(pid);
        let who = rank.map_or(format!("pid {pid}"), |r| format!("rank {r} (pid {pid})"));
        let detail = format!("{who} stopped by a signal for {}", human_duration(stalled));
        let fault = Fault {
            cause_rank: rank,
            reason: "rank-stopped".into(),
            detail: detail.clone(),
            then: None,
        };
        let id = self.tell(&fault, v);
        let why = format!("rank-stopped: {detail}");
        v.out.say(format!(
            "{detail} (not by oomguard): every node's ranks wait for it in their next collective; \
             telling the other nodes and ending this node's part"
        ));
        v.out.push(Acted::Fault { id, fault });
        self.raised = Some(Raised {
            id,
            why,
            at: now,
            told: None,
            ended: false,
        });
    }

    /// Puts this node's fault where the other nodes learn it: straight into
    /// the job's store when a rank named it (no rank of this node need
    /// live), else in the channel for the companion to carry (a companion
    /// older than this oomguard). Its id, when it could go.
    fn tell(&self, fault: &Fault, v: &mut Voice<'_>) -> Option<u64> {
        let ch = v.ch.as_deref_mut()?;
        if let Some(link) = &self.link {
            let id = ch.fault_id();
            link.publish(id, fault);
            return Some(id);
        }
        match ch.fault(fault) {
            Ok(id) => Some(id),
            Err(e) => {
                v.out.say(format!("cannot tell the other nodes: {e}"));
                None
            }
        }
    }

    /// A rank of this node ended (its pidfd said so). Unless the job is
    /// ending anyway (`ending`, or a fault already out), the other nodes'
    /// ranks would wait for it in their next collective: they are told at
    /// once, naming the rank and how it ended: `status`, its wait status
    /// read while it was a zombie (before its launcher reaped it), and what
    /// its companion said (an exception, Python's shutdown). A rank that
    /// exited 0, or (status unknown) by Python's own shutdown with no
    /// exception, is not news. One that died of a broken collective, or
    /// exited non-zero with no exception (its output may name a better
    /// cause: a CUDA OOM), waits [`HOLD`] for the fault that explains it.
    pub fn rank_ended(
        &mut self,
        (pid, status): (u32, Option<i32>),
        ending: bool,
        now: Instant,
        v: &mut Voice<'_>,
    ) {
        use crate::engine::probe::proc::Ended;
        let end = self.ends.remove(&pid).unwrap_or_default();
        let Some(rank) = self.rank_of(pid) else {
            return;
        };
        if !self.gone.insert(pid) {
            return;
        }
        if ending || self.raised.is_some() || self.remote.is_some() || self.held.is_some() {
            return;
        }
        let who = format!("rank {rank} (pid {pid})");
        let hold = |reason, detail| Held {
            rank,
            reason,
            detail,
            at: now,
        };
        match (status.map(Ended::from_wait_status), end.crash) {
            (Some(Ended::Exited(0)), _) => {}
            (_, Some(err)) if broken_collective(&err) => {
                self.held = Some(hold("rank-crashed", format!("{who} raised {err}")));
            }
            (_, Some(err)) => {
                let reason = if err.contains("CUDA out of memory") {
                    "cuda-oom"
                } else {
                    "rank-crashed"
                };
                let detail = format!("{who} raised {err}");
                self.raise_death((reason, detail), Some(rank), false, now, v);
            }
            (Some(Ended::Signaled(sig)), None) => {
                let detail = format!(
                    "{who} was killed by {}",
                    crate::vocab::model::signal_name(sig)
                );
                self.raise_death(("rank-killed", detail), Some(rank), false, now, v);
            }
            (Some(Ended::Exited(code)), None) => {
                let detail = format!("{who} exited with {code}");
                self.held = Some(hold("rank-exited", detail));
            }
            (None, None) if end.bye => {}
            (None, None) => {
                let detail =
                    format!("{who} was killed by a signal (it ended without Python's shutdown)");
                self.raise_death(("rank-killed", detail), Some(rank), false, now, v);
            }
        }
    }

    /// A held death (see [`Peers::rank_ended`]) that no other node's fault
    /// explained in time (or at all: `force`) is this node's own fault.
    fn release_held(&mut self, now: Instant, force: bool, v: &mut Voice<'_>) {
        if self.remote.is_some() {
            self.held = None;
            return;
        }
        if let Some(h) = self.held.take_if(|h| force || now >= h.at + HOLD) {
            self.raise_death((h.reason, h.detail), Some(h.rank), false, now, v);
        }
    }

    /// The kernel OOM killer took a process of this node's part of a job
    /// across nodes: this node's ranks fail now, and so will the other
    /// nodes' in their next collective. Tells them why (best effort: a
    /// rank of this node must still live to carry it to the store), and
    /// whether this node restarts the job (`restart`). Nothing to end: the
    /// kill ends this node's part.
    pub fn raise_kill(
        &mut self,
        (pid, what): (u32, &str),
        restart: bool,
        now: Instant,
        v: &mut Voice<'_>,
    ) {
        let rank = self.rank_of(pid);
        let who = rank.map_or(format!("{what} (pid {pid})"), |r| {
            format!("rank {r} (pid {pid})")
        });
        let detail = format!("{who} killed by the kernel OOM killer");
        self.raise_death(("oom-kill", detail), rank, restart, now, v);
    }

    /// A process of this node's part of a job across nodes died another
    /// way the job's output named (`reason`: `cuda-oom`, `worker-died`):
    /// the other nodes learn it as [`Peers::raise_kill`] tells a kill.
    pub fn raise_death(
        &mut self,
        (reason, detail): (&str, String),
        rank: Option<u32>,
        restart: bool,
        now: Instant,
        v: &mut Voice<'_>,
    ) {
        // Only the first trouble of a node that is not already ending for
        // another reason (its own, or another node's) is news.
        if !v.open || self.raised.is_some() {
            return;
        }
        let fault = Fault {
            cause_rank: rank,
            reason: reason.into(),
            detail,
            then: restart.then(|| "restart".to_string()),
        };
        let id = self.tell(&fault, v);
        let why = format!("{reason}: {}", fault.detail);
        v.out.push(Acted::Fault { id, fault });
        self.raised = Some(Raised {
            id,
            why,
            at: now,
            told: None,
            ended: true,
        });
    }

    /// At the attempt's end, its ranks having failed: another node's fault
    /// that came too late to act on (this node's ranks had already failed
    /// in their collectives), or the store that went away, still says why
    /// the attempt ended, unless this node raised its own.
    pub fn late_fault(&mut self, now: Instant, v: &mut Voice<'_>) -> Option<RemoteFault> {
        if self.raised.is_some() {
            return None;
        }
        self.release_held(now, true, v);
        if self.raised.is_some() {
            return None;
        }
        let lost = self.store_lost_why().map(|why| RemoteFault {
            why,
            restart: false,
        });
        self.remote.take().or(lost)
    }
}

/// Whether a rank's exception is what a collective raises when a peer is
/// gone (gloo's closed socket, NCCL's and the store's errors, a timeout):
/// the death of a rank elsewhere, not a fault of this rank's own.
fn broken_collective(error: &str) -> bool {
    const SIGNS: [&str; 9] = [
        "DistBackendError",
        "DistNetworkError",
        "DistStoreError",
        "Connection closed by peer",
        "Connection reset by peer",
        "Broken pipe",
        "gloo",
        "NCCL",
        "timed out",
    ];
    SIGNS.iter().any(|s| error.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::supervise::SignalError;
    use crate::runtime::act::{ActConfig, Actuator, SIG_CONT, SIG_TERM, Signaller};

    #[derive(Default)]
    struct Rec(Vec<(u32, i32)>);
    impl Signaller for Rec {
        fn signal(&mut self, id: Ident, sig: i32) -> Result<(), SignalError> {
            self.0.push((id.0, sig));
            Ok(())
        }
        fn is_alive(&self, _: Ident) -> bool {
            true
        }
        fn signal_group(&mut self, _: u32, _: i32) -> Result<(), SignalError> {
            Ok(())
        }
    }

    fn rank(pid: u32, stopped: bool) -> ProcSample {
        ProcSample {
            stopped,
            ..crate::vocab::model::testing::proc_sample(pid, Role::Trainer, 0)
        }
    }

    /// Another node's `fault` record.
    fn fault(
        id: u64,
        node: u32,
        rank: u32,
        reason: &str,
        detail: Option<&str>,
        restart: bool,
    ) -> Record {
        Record::Fault {
            id,
            node,
            cause_rank: Some(rank),
            reason: Some(reason.into()),
            detail: detail.map(str::to_string),
            then: restart.then(|| "restart".into()),
        }
    }

    fn cfg() -> ActConfig {
        ActConfig {
            checkpoint_signal: libc::SIGUSR1,
            grace: Duration::from_secs(30),
            kill_after: Duration::from_secs(10),
            may_kill: true,
            quiet: false,
            checkpoint_dir: None,
            checkpoint_glob: "*".into(),
        }
    }

    fn across_nodes() -> Actuator {
        let mut a = Actuator::new(cfg());
        a.companion.state_mut().world = Some((4, 2));
        let hello = Record::Hello {
            pid: 11,
            rank: 3,
            framework: "plain".into(),
            world: Some(4),
            local_world: Some(2),
            v: None,
            version: None,
            path: None,
            node: None,
            task: None,
            local_rank: None,
            store: None,
        };
        a.peers.note(&hello, Instant::now());
        a
    }

    #[test]
    fn a_rank_stopped_for_five_seconds_raises_a_fault_and_ends_the_node() {
        let mut a = across_nodes();
        let mut sig = Rec::default();
        let t0 = Instant::now();
        let tree = [rank(10, false), rank(11, true)];
        a.watch_peers(&tree, false, t0, &mut sig);
        a.watch_peers(&tree, false, t0 + Duration::from_secs(4), &mut sig);
        assert!(a.peers.raised.is_none(), "4 s is not a stall yet");
        a.watch_peers(&tree, false, t0 + STALL_AFTER, &mut sig);
        let raised = a.peers.raised.as_ref().expect("a fault after 5 s");
        assert!(raised.why.contains("rank 3 (pid 11)"), "{}", raised.why);
        assert!(sig.0.is_empty(), "nothing ends before the others know");
        // No channel: the others cannot confirm, so the node ends at the wait.
        a.watch_peers(&tree, false, t0 + STALL_AFTER + TELL_WAIT, &mut sig);
        assert_eq!(a.policy_end, Some(Action::Stop));
        assert!(sig.0.contains(&(11, SIG_TERM)) && sig.0.contains(&(11, SIG_CONT)));
        assert!(sig.0.contains(&(10, SIG_TERM)));
    }

    #[test]
    fn a_confirmed_fault_ends_the_node_soon_after_the_store_has_it() {
        let mut a = across_nodes();
        let mut sig = Rec::default();
        let t0 = Instant::now();
        let tree = [rank(11, true)];
        a.watch_peers(&tree, false, t0, &mut sig);
        a.watch_peers(&tree, false, t0 + STALL_AFTER, &mut sig);
        a.peers.raised.as_mut().unwrap().id = Some(7);
        let told = t0 + STALL_AFTER + Duration::from_millis(500);
        a.peers.note(&Record::FaultPublished { id: 7 }, told);
        a.watch_peers(&tree, false, told + Duration::from_secs(1), &mut sig);
        assert!(a.stop.is_none());
        a.watch_peers(&tree, false, told + AFTER_TOLD, &mut sig);
        assert_eq!(a.policy_end, Some(Action::Stop));
    }

    #[test]
    fn ranks_paused_by_oomguard_and_single_node_jobs_are_not_faults() {
        let t0 = Instant::now();
        let tree = [rank(11, true)];
        let mut a = across_nodes();
        a.paused.insert((11, 11));
        let mut sig = Rec::default();
        a.watch_peers(&tree, false, t0, &mut sig);
        a.watch_peers(&tree, false, t0 + STALL_AFTER * 2, &mut sig);
        assert!(a.peers.raised.is_none());
        let mut one = Actuator::new(cfg());
        one.companion.state_mut().world = Some((2, 2));
        one.watch_peers(&tree, false, t0, &mut sig);
        one.watch_peers(&tree, false, t0 + STALL_AFTER * 2, &mut sig);
        assert!(one.peers.raised.is_none());
    }

    #[test]
    fn a_workers_growth_is_put_on_its_rank() {
        let a = across_nodes();
        let mut worker = rank(30, false);
        worker.ppid = 11;
        let tree = [rank(11, false), worker];
        assert_eq!(a.peers.rank_above(Some(30), &tree), Some(3));
        assert_eq!(a.peers.rank_above(Some(11), &tree), Some(3));
        assert_eq!(a.peers.rank_above(Some(99), &tree), None);
        assert_eq!(a.peers.rank_above(None, &tree), None);
    }

    #[test]
    fn a_lost_store_ends_the_node_only_after_its_ranks_had_time_to_finish() {
        let mut a = across_nodes();
        let mut sig = Rec::default();
        let t0 = Instant::now();
        let lost = Record::StoreLost {
            addr: Some("n0:29500".into()),
        };
        a.peers.note(&lost, t0);
        a.watch_peers(
            &[rank(10, false)],
            false,
            t0 + Duration::from_secs(9),
            &mut sig,
        );
        assert!(a.stop.is_none(), "ranks may still be finishing");
        a.watch_peers(&[rank(10, false)], false, t0 + STORE_LOST_WAIT, &mut sig);
        assert_eq!(a.policy_end, Some(Action::Stop));
        assert!(
            a.policy_reason
                .clone()
                .unwrap()
                .starts_with("store-lost: the job's store at n0:29500")
        );
        // One oomguard per rank: rank 0's process served the store. Gone
        // without a word, it is rank 0's death, told sooner; after rank 0
        // said it ends normally, its going is no news at all.
        let mut t = across_nodes();
        t.peers.task_layout = true;
        t.peers.note(&lost, t0);
        t.watch_peers(
            &[rank(10, false)],
            false,
            t0 + STORE_LOST_WAIT_TASKS,
            &mut sig,
        );
        assert!(
            t.policy_reason
                .clone()
                .unwrap()
                .starts_with("rank 0: store-lost: the job's store at n0:29500"),
            "{:?}",
            t.policy_reason
        );
        let mut n = across_nodes();
        n.peers.task_layout = true;
        n.peers
            .note(&fault(0, 0, 0, STORE_CLOSING, None, false), t0);
        n.peers.note(&lost, t0);
        n.watch_peers(&[rank(10, false)], false, t0 + STORE_LOST_WAIT, &mut sig);
        assert!(n.stop.is_none() && n.policy_reason.is_none());
        // A fault that names the cause wins over a lost store.
        let mut b = across_nodes();
        b.peers.note(&lost, t0);
        let fault = fault(1, 0, 1, "oom-kill", None, false);
        b.peers.note(&fault, t0);
        b.watch_peers(&[rank(10, false)], false, t0 + STORE_LOST_WAIT, &mut sig);
        assert!(
            b.policy_reason
                .unwrap()
                .starts_with("node 0 (rank 1): oom-kill")
        );
    }

    #[test]
    fn a_rank_that_runs_again_is_forgiven() {
        let mut a = across_nodes();
        let mut sig = Rec::default();
        let t0 = Instant::now();
        a.watch_peers(&[rank(11, true)], false, t0, &mut sig);
        a.watch_peers(
            &[rank(11, false)],
            false,
            t0 + Duration::from_secs(3),
            &mut sig,
        );
        a.watch_peers(
            &[rank(11, true)],
            false,
            t0 + Duration::from_secs(4),
            &mut sig,
        );
        a.watch_peers(
            &[rank(11, true)],
            false,
            t0 + Duration::from_secs(8),
            &mut sig,
        );
        assert!(a.peers.raised.is_none(), "stopped 4 s, not 8");
    }

    #[test]
    fn another_nodes_fault_ends_this_node_and_names_it() {
        let mut a = across_nodes();
        let mut sig = Rec::default();
        let fault = fault(
            5,
            1,
            3,
            "rank-stopped",
            Some("rank 3 (pid 11) stopped by a signal for 5 s"),
            false,
        );
        let now = Instant::now();
        a.peers.note(&fault, now);
        a.watch_peers(&[rank(20, false)], false, now, &mut sig);
        assert_eq!(a.policy_end, Some(Action::Stop));
        let why = a.policy_reason.clone().unwrap();
        assert!(why.starts_with("node 1 (rank 3): rank-stopped"), "{why}");
        assert!(sig.0.contains(&(20, SIG_TERM)));
    }

    #[test]
    fn a_fault_that_comes_after_the_ranks_failed_still_names_the_cause() {
        let mut a = across_nodes();
        let fault = fault(5, 0, 1, "oom-kill", None, true);
        a.peers.note(&fault, Instant::now());
        assert!(
            !a.adopt_remote_fault(false),
            "a job that succeeded keeps its end"
        );
        assert!(a.adopt_remote_fault(true));
        assert_eq!(a.policy_end, Some(Action::Restart));
        assert_eq!(
            a.policy_reason.as_deref(),
            Some("node 0 (rank 1): oom-kill")
        );
        assert!(!a.adopt_remote_fault(true));
    }

    #[test]
    fn another_nodes_stop_saved_and_left_between_two_ticks_is_still_the_end() {
        let mut a = across_nodes();
        let remote = || crate::runtime::act::RemoteStop {
            id: 7,
            why: "node 0 (rank 1): critical-headroom".into(),
            restart: false,
        };
        a.companion.agreed_stop(remote());
        assert!(!a.adopt_remote_stop(), "no save for it: not its end");
        a.companion.agreed_stop(remote());
        a.companion.state_mut().done = Some(crate::runtime::act::requests::Saved {
            id: 7,
            step: Some(72),
            after_request_seconds: 0.0,
            paths: Vec::new(),
            ok: true,
            not_counted: None,
        });
        assert!(a.adopt_remote_stop());
        assert_eq!(a.policy_end, Some(Action::Stop));
        assert_eq!(
            a.policy_reason.as_deref(),
            Some("node 0 (rank 1): critical-headroom")
        );
        assert!(!a.adopt_remote_stop(), "once");
    }

    #[test]
    fn a_node_whose_own_rank_died_first_does_not_take_the_others_fault_as_its_cause() {
        let mut a = across_nodes();
        let now = Instant::now();
        a.raise_kill(11, "python", false, now);
        assert!(a.peers.raised.is_some(), "the kill is raised");
        let echo = fault(9, 1, 2, "worker-died", None, false);
        a.peers.note(&echo, now);
        assert!(!a.adopt_remote_fault(true));
        assert_eq!(a.policy_end, None);
        let mut sig = Rec::default();
        a.peers.note(&echo, now);
        a.watch_peers(&[rank(10, false)], false, now, &mut sig);
        assert!(a.stop.is_none() && sig.0.is_empty());
    }

    fn said(a: &mut Actuator, r: Record) {
        a.peers.note(&r, Instant::now());
    }

    fn raised(a: &Actuator) -> Option<String> {
        a.peers.raised.as_ref().map(|r| r.why.clone())
    }

    #[test]
    fn a_rank_that_ends_without_pythons_shutdown_is_told_as_killed() {
        let mut a = across_nodes();
        a.rank_ended(11, None, Instant::now());
        let why = raised(&a).expect("a kill is a fault");
        assert!(why.starts_with("rank-killed: rank 3 (pid 11)"), "{why}");
        assert!(!a.peers.rank_pids().contains(&11), "handled once");
    }

    #[test]
    fn a_rank_that_returns_is_not_news_and_one_that_raises_is() {
        let mut a = across_nodes();
        said(&mut a, Record::Bye { pid: 11, rank: 3 });
        a.rank_ended(11, None, Instant::now());
        assert_eq!(raised(&a), None, "a normal end");
        let mut a = across_nodes();
        said(
            &mut a,
            Record::Crash {
                pid: 11,
                rank: 3,
                error: Some("ValueError: bad batch".into()),
            },
        );
        said(&mut a, Record::Bye { pid: 11, rank: 3 });
        a.rank_ended(11, None, Instant::now());
        let why = raised(&a).expect("a crash is a fault");
        assert_eq!(
            why,
            "rank-crashed: rank 3 (pid 11) raised ValueError: bad batch"
        );
    }

    #[test]
    fn a_death_by_a_broken_collective_waits_for_the_fault_that_broke_it() {
        let gloo = Record::Crash {
            pid: 11,
            rank: 3,
            error: Some(
                "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer".into(),
            ),
        };
        let mut sig = Rec::default();
        let t0 = Instant::now();
        // The other node's fault comes: it is the cause.
        let mut a = across_nodes();
        said(&mut a, gloo.clone());
        a.rank_ended(11, None, t0);
        assert_eq!(raised(&a), None, "held");
        a.peers.note(
            &fault(
                4,
                0,
                1,
                "rank-killed",
                Some("rank 1 (pid 7) was killed"),
                false,
            ),
            t0,
        );
        a.watch_peers(&[rank(10, false)], false, t0 + HOLD, &mut sig);
        assert_eq!(raised(&a), None);
        assert!(
            a.policy_reason
                .as_deref()
                .is_some_and(|r| r.starts_with("node 0 (rank 1): rank-killed")),
            "{:?}",
            a.policy_reason
        );
        // None comes: after the hold, this node's own.
        let mut a = across_nodes();
        said(&mut a, gloo);
        a.rank_ended(11, None, t0);
        a.watch_peers(&[rank(10, false)], false, t0 + HOLD / 2, &mut sig);
        assert_eq!(raised(&a), None);
        a.watch_peers(&[rank(10, false)], false, t0 + HOLD, &mut sig);
        assert!(raised(&a).is_some_and(|w| w.starts_with("rank-crashed: rank 3")));
    }

    #[test]
    fn a_rank_ending_while_the_job_stops_is_not_news() {
        let mut a = across_nodes();
        a.policy_end = Some(Action::Stop);
        a.rank_ended(11, None, Instant::now());
        assert_eq!(raised(&a), None);
    }

    #[test]
    fn a_ranks_wait_status_says_how_it_ended() {
        let t0 = Instant::now();
        // Killed: named with its signal, at once.
        let mut a = across_nodes();
        a.rank_ended(11, Some(libc::SIGKILL), t0);
        assert_eq!(
            raised(&a).as_deref(),
            Some("rank-killed: rank 3 (pid 11) was killed by SIGKILL")
        );
        // Exited 0: a normal end, even with no `bye` heard.
        let mut a = across_nodes();
        a.rank_ended(11, Some(0), t0);
        assert_eq!(raised(&a), None);
        // Exited 1: held for a better cause from the output, then told.
        let mut a = across_nodes();
        let mut sig = Rec::default();
        a.rank_ended(11, Some(1 << 8), t0);
        assert_eq!(raised(&a), None, "held");
        a.watch_peers(&[rank(10, false)], false, t0 + HOLD, &mut sig);
        assert_eq!(
            raised(&a).as_deref(),
            Some("rank-exited: rank 3 (pid 11) exited with 1")
        );
    }
}
