//! The actuator: everything oomguard does *to* the job's processes — pause
//! and resume, the graceful stop ladder (checkpoint signal, throttle of the
//! growers, last-resort freeze, SIGTERM, SIGKILL) and the kill.
//!
//! Signals go through the [`Signaller`] trait and desktop notifications
//! through [`Notifier`], so the whole ladder runs in unit tests against a
//! recording signaller and a scripted tree, without a single process. What
//! the actuator did comes back as [`Acted`] records; the loop hands them to
//! the sinks (log, metrics, dashboard, GitHub annotations).
//!
//! Stopping while memory is still growing: the trainer gets the checkpoint
//! signal and must reach a step boundary, which a data-bound trainer only
//! does with its next batch. So instead of freezing the growers outright
//! (which can deadlock the very checkpoint we wait for), the growing
//! non-trainer processes are *throttled*: held with SIGSTOP and let run for
//! a short slice every cycle, so growth slows ~10× while the pipeline still
//! delivers. Below a last-resort level everything is frozen: the kernel must
//! never be the one that ends the job.
//!
//! Identity is (pid, start time) everywhere: a held process that is no
//! longer the process that was held is forgotten by [`Actuator::prune`], and
//! every signal is sent by identity, so a recycled pid is never hit.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

pub use super::signaller::{
    DesktopNotifier, Ident, Notifier, ProcSignaller, SIG_CONT, SIG_KILL, SIG_STOP, SIG_TERM,
    Signaller,
};
use crate::engine::policy::Action;
use crate::job::restart::CheckpointWatch;
use crate::job::supervise;
use crate::sinks::log::ActionKind;
use crate::vocab::companion::{Channel, Kind};
use crate::vocab::forensics::torch::Framework;
use crate::vocab::model::{ProcSample, Role, Sample};
use journal::Journal;
use peers::Voice;
use requests::Companion;
pub use requests::CompanionState;
use stop_saves::SaveChecks;
use targets::kernel_headroom;
pub(super) use targets::trainer_idents;
pub use targets::{Sent, growers, idents, signal_all};
pub use types::{ActConfig, Acted, Levels, RemoteStop, SaveBudget, Scene};

mod checkpoint_wait;
use checkpoint_wait::{Waited, checkpoint_signal};
use parts::Part;
mod journal;
pub mod parts;
mod peers;
mod requests;
pub(super) mod stop_saves;
mod targets;
mod types;

/// One throttle cycle: growers are stopped except for a short run slice.
/// How long after a framework's banner its companion must have spoken.
pub(super) const FRAMEWORK_GRACE: Duration = Duration::from_secs(10);

pub const THROTTLE_CYCLE: Duration = Duration::from_millis(500);
pub const THROTTLE_RUN: Duration = Duration::from_millis(50);
/// How long the whole tree may stay frozen at the last-resort level before
/// the stop goes on without the checkpoint.
pub const LAST_RESORT_HOLD: Duration = Duration::from_secs(5);

/// The result of a `checkpoint` action with no companion to ask.
pub const NO_COMPANION: &str = "no companion";

/// How long a stop waits for the companion to acknowledge its request
/// before it falls back to the checkpoint signal: the request is read at
/// the next step boundary, so this bounds the step time the channel serves.
pub const ACK_WAIT: Duration = Duration::from_secs(20);
/// After the save is done, how long the trainer has to leave on its own
/// before the rest of the ladder (SIGTERM) goes on.
pub const EXIT_AFTER_DONE: Duration = Duration::from_secs(10);

/// The graceful stop in progress.
#[derive(Debug)]
pub struct Stop {
    reason: String,
    action: Action,
    grace_end: Instant,
    step: StopStep,
    /// Growers held by the throttle (stopped except for short slices).
    throttled: HashSet<Ident>,
    /// The pids whose throttling was logged.
    announced: HashSet<u32>,
    throttle_running: bool,
    throttle_switch: Instant,
    /// Everything frozen at the last-resort level, since when.
    frozen_all: bool,
    frozen_since: Option<Instant>,
    /// The processes that got the checkpoint signal.
    signalled: Vec<Ident>,
    /// Confirms the checkpoint (with `--checkpoint-dir`).
    watch: Option<CheckpointWatch>,
    began: Instant,
    /// The request the companion got instead of the signal.
    request: Option<u64>,
    /// The companion's save finished (the trainer now leaves on its own).
    done_at: Option<Instant>,
    /// The companion did not answer in time: the signal was sent.
    fell_back: bool,
    /// How long the request may go unacknowledged before the signal is
    /// sent after all.
    ack_wait: Duration,
    /// From SIGTERM to the rest of the tree to SIGKILL: `--kill-after`, or
    /// less for a signal's save that must end within its budget.
    kill_after: Duration,
    /// Another node's stop: this node is not short of memory, so nothing
    /// is throttled (a held rank would stall every node's collectives).
    joined: bool,
}

impl Stop {
    /// The rule (or the signal) the stop serves.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// `stop` or `restart`.
    pub fn action(&self) -> Action {
        self.action
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StopStep {
    /// Waiting for the trainers to checkpoint and exit.
    Checkpoint,
    /// SIGTERM sent to the rest; SIGKILL at the deadline.
    Terminate { until: Instant },
    /// SIGKILL sent; waiting for the tree to be gone.
    Killed,
}

/// The state of what oomguard holds and is doing to the job. Its parts
/// (the companion's line, the faults across nodes, the save checks, the
/// journal of what was done) keep their own state behind their own verbs;
/// the actuator holds what ends an attempt and lends the parts what each
/// call needs.
#[derive(Debug)]
pub struct Actuator {
    cfg: ActConfig,
    /// Processes oomguard paused (policy `pause`).
    paused: HashSet<Ident>,
    stop: Option<Stop>,
    /// The critical action that ended the attempt, if the policy did.
    policy_end: Option<Action>,
    /// The signal whose save ended the attempt (`--on-signal`), if one did.
    signal_end: Option<i32>,
    /// Why the signal that ended the attempt got no save
    /// ([`Actuator::end_unsaved`]).
    not_saved: Option<String>,
    /// Why (the rule), kept after the stop itself is over.
    policy_reason: Option<String>,
    /// SIGKILL was sent to the tree.
    killed: bool,
    /// When SIGKILL follows if the tree has not exited by then.
    kill_at: Option<Instant>,
    /// Faults of a job across nodes (`peers.rs`).
    peers: peers::Peers,
    /// The next stop serves this request instead of writing its own.
    joined: Option<u64>,
    /// The warnings that a stop would lose work (`stop_saves.rs`).
    checks: SaveChecks,
    /// The channel to the job's companion (`requests.rs`).
    companion: Companion,
    out: Journal,
}

/// What a stop's steps act with, lent by the actuator for one call.
struct Hands<'a> {
    cfg: &'a ActConfig,
    companion: &'a CompanionState,
    checks: &'a mut SaveChecks,
    out: &'a mut Journal,
    sig: &'a mut dyn Signaller,
}

impl Actuator {
    pub fn new(cfg: ActConfig) -> Self {
        Self {
            paused: HashSet::new(),
            stop: None,
            policy_end: None,
            signal_end: None,
            not_saved: None,
            policy_reason: None,
            killed: false,
            kill_at: None,
            peers: peers::Peers::begun(),
            joined: None,
            checks: SaveChecks::new(cfg.checkpoint_signal, cfg.quiet),
            companion: Companion::default(),
            out: Journal::default(),
            cfg,
        }
    }

    /// The graceful stop in progress, if any.
    pub fn stop(&self) -> Option<&Stop> {
        self.stop.as_ref()
    }

    /// The critical action that ended the attempt, if the policy did.
    pub fn policy_end(&self) -> Option<Action> {
        self.policy_end
    }

    /// Why the policy ended the attempt, kept after the stop is over.
    pub fn policy_reason(&self) -> Option<&str> {
        self.policy_reason.as_deref()
    }

    /// SIGKILL was sent to the tree.
    pub fn killed(&self) -> bool {
        self.killed
    }

    /// The processes oomguard holds paused (policy `pause`).
    pub fn paused(&self) -> &HashSet<Ident> {
        &self.paused
    }

    pub fn companion(&self) -> &CompanionState {
        self.companion.state()
    }

    /// A request can go to a companion that said hello on this channel.
    pub fn can_ask(&self) -> bool {
        self.companion.can_ask()
    }

    /// Tests stand in for a companion's hello.
    #[cfg(test)]
    pub fn companion_mut(&mut self) -> &mut CompanionState {
        self.companion.state_mut()
    }

    pub fn cfg(&self) -> &ActConfig {
        &self.cfg
    }

    pub fn peers(&self) -> &peers::Peers {
        &self.peers
    }

    pub fn parts(&self) -> &parts::StopParts {
        self.out.parts()
    }

    /// This attempt's control channel changes (one that could not be
    /// read is dropped, a new one replaces it).
    pub fn set_channel(&mut self, channel: Option<Channel>) {
        self.companion.set_channel(channel);
    }

    /// Another node's stop to join, taken once.
    pub fn take_remote_stop(&mut self) -> Option<RemoteStop> {
        self.companion.take_remote_stop()
    }

    /// What the deciding tick saw, for the request's `detail`, and the
    /// rank behind the fastest-growing process.
    pub fn note_cause(
        &mut self,
        detail: Option<String>,
        fastest: Option<u32>,
        tree: &[ProcSample],
    ) {
        let cause_rank = self.peers.rank_above(fastest, tree);
        self.companion.note_cause(detail, cause_rank);
    }

    /// The node's leader names the rank that grew the most on the node,
    /// whichever oomguard's it is (`node_group`).
    pub fn note_node_cause(&mut self, detail: Option<String>, rank: u32) {
        self.companion.note_cause(detail, Some(rank));
    }

    /// The `checkpoint` and `relieve` actions: requests that training goes
    /// on after. Without a companion they are logged as decided, result
    /// `no companion`.
    pub fn request(&mut self, action: Action, reason: &str, now: Instant) {
        let kind = if action == Action::Relieve {
            Kind::Relieve
        } else {
            Kind::Checkpoint
        };
        // A relief must not replace a checkpoint request still being served.
        let pending = self.companion.state().pending_kind();
        if kind == Kind::Relieve && pending.is_some_and(|k| k != Kind::Relieve) {
            return;
        }
        let asked = (self.companion).ask((kind, reason), false, self.cfg.grace, now, &mut self.out);
        let result = match asked {
            Some(_) => "ok".to_string(),
            None => NO_COMPANION.to_string(),
        };
        self.push(Acted::Action {
            action: action.into(),
            reason: reason.to_string(),
            pids: Vec::new(),
            signal: None,
            result,
        });
    }

    /// Joins another node's stop: the ranks already agreed on its request,
    /// so this node waits for the same save instead of asking its own.
    pub fn join_stop(&mut self, remote: &RemoteStop, at: Scene<'_>, sig: &mut dyn Signaller) {
        if self.stop.is_some() {
            return;
        }
        self.joined = Some(remote.id);
        let action = if remote.restart {
            Action::Restart
        } else {
            Action::Stop
        };
        self.begin_stop(action, &remote.why, at, sig);
    }

    pub fn with_channel(mut self, channel: Option<Channel>) -> Self {
        self.companion.set_channel(channel);
        self
    }

    /// What a stop's steps act with.
    fn hands<'a>(&'a mut self, sig: &'a mut dyn Signaller) -> Hands<'a> {
        Hands {
            cfg: &self.cfg,
            companion: self.companion.state(),
            checks: &mut self.checks,
            out: &mut self.out,
            sig,
        }
    }

    /// What raising this node's fault needs (see [`Voice`]); `open`: this
    /// node may still raise one.
    fn voice(&mut self) -> (Voice<'_>, &mut peers::Peers) {
        let open = self.companion.spans_nodes() && self.policy_end.is_none();
        let voice = Voice::new(self.companion.channel_mut(), &mut self.out, open);
        (voice, &mut self.peers)
    }

    /// Reads what the companion appended since the last tick.
    pub fn poll_channel(&mut self, now: Instant) {
        // Once a stop is under way the store's host may end before this
        // node does (rank 0's process, in a job of one task per rank): a
        // store that stops answering then is no news.
        let stopping = self.stop.is_some() || self.signal_end.is_some();
        self.companion
            .poll(now, &mut self.peers, &mut self.out, stopping);
    }

    /// Once per tick, for a job across nodes: acts on another node's
    /// fault, raises this node's when a rank stalls, and ends this node's
    /// part once the others know (`peers.rs`). `ending`: the job is ending
    /// anyway.
    pub fn watch_peers(
        &mut self,
        tree: &[ProcSample],
        ending: bool,
        now: Instant,
        sig: &mut dyn Signaller,
    ) {
        if !self.companion.spans_nodes() || ending || self.stop.is_some() {
            return;
        }
        // The processes oomguard holds are not stalls; spanning nodes is
        // known here, so only a decision of this node's own closes it.
        let open = self.policy_end.is_none();
        let mut voice = Voice::new(self.companion.channel_mut(), &mut self.out, open);
        let end = self.peers.watch(tree, &self.paused, now, &mut voice);
        if let Some((action, why)) = end {
            self.end_for_fault(action, &why, tree, now, sig);
        }
    }

    /// A rank of this node ended (its pidfd said so), with its wait status
    /// when it was read: news for the other nodes unless the job is ending
    /// anyway ([`peers::Peers::rank_ended`]).
    pub fn rank_ended(&mut self, pid: u32, status: Option<i32>, now: Instant) {
        let ending = !self.companion.spans_nodes()
            || self.stop.is_some()
            || self.signal_end.is_some()
            || self.policy_end.is_some();
        let (mut voice, peers) = self.voice();
        peers.rank_ended((pid, status), ending, now, &mut voice);
    }

    /// Each rank has an oomguard of its own (a SLURM task each).
    pub fn one_rank_each(&self) -> bool {
        self.peers.one_rank_each()
    }

    /// This node's fault is not yet in the job's store.
    pub fn fault_untold(&self) -> bool {
        self.peers.fault_untold()
    }

    /// The kernel OOM killer took a process of this node's part of a job
    /// across nodes: the other nodes are told ([`peers::Peers::raise_kill`]).
    pub fn raise_kill(&mut self, pid: u32, what: &str, restart: bool, now: Instant) {
        let (mut voice, peers) = self.voice();
        peers.raise_kill((pid, what), restart, now, &mut voice);
    }

    /// A process of this node's part of a job across nodes died another
    /// way the job's output named (`reason`: `cuda-oom`, `worker-died`).
    pub fn raise_death(
        &mut self,
        reason: &str,
        detail: String,
        rank: Option<u32>,
        restart: bool,
        now: Instant,
    ) {
        let (mut voice, peers) = self.voice();
        peers.raise_death((reason, detail), rank, restart, now, &mut voice);
    }

    /// At the attempt's end: another node's fault that came too late to
    /// act on (this node's ranks had already failed in their collectives)
    /// still says why the attempt ended. True when it did.
    pub fn adopt_remote_fault(&mut self, failed: bool) -> bool {
        if !failed || self.policy_end.is_some() {
            return false;
        }
        let (mut voice, peers) = self.voice();
        let Some(remote) = peers.late_fault(crate::vocab::clock::now(), &mut voice) else {
            return false;
        };
        self.end_after_the_ranks(remote.restart, remote.why, "the ranks had already ended");
        true
    }

    /// At the attempt's end: another node's stop whose save this node's
    /// ranks made and then left, before a tick could join it (the request,
    /// the save and the exit all fell between two ticks), is still why the
    /// attempt ended, however the launcher reported the ranks' exit (a rank
    /// aborted by its store's teardown fails it). True when it did.
    pub fn adopt_remote_stop(&mut self) -> bool {
        let Some(remote) = self.companion.take_saved_remote_stop() else {
            return false;
        };
        if self.policy_end.is_some() || self.stop.is_some() {
            return false;
        }
        let result = "the ranks had already saved and left";
        self.end_after_the_ranks(remote.restart, remote.why, result);
        true
    }

    /// Another node's stop or fault is the attempt's end, though this
    /// node's ranks had already gone: recorded as a stop (or restart) that
    /// signalled nothing, with `result` saying why.
    fn end_after_the_ranks(&mut self, restart: bool, why: String, result: &str) {
        let action = if restart {
            Action::Restart
        } else {
            Action::Stop
        };
        self.policy_end = Some(action);
        self.policy_reason = Some(why.clone());
        self.push(Acted::Action {
            action: action.into(),
            reason: why,
            pids: Vec::new(),
            signal: None,
            result: result.into(),
        });
    }

    /// The job's output named its framework.
    pub fn note_framework(&mut self, framework: Framework, now: Instant) {
        self.checks.note_framework(framework, now);
    }

    /// Says, once and before any stop, that the framework the job's output
    /// named would lose work on a stop ([`SaveChecks::check_framework`]).
    pub fn check_framework(
        &mut self,
        now: Instant,
        tree: &[ProcSample],
        job_pid: u32,
        sig: &dyn Signaller,
    ) {
        let connected = self.companion.state().connected;
        if let Some(warning) = (self.checks).check_framework(now, (tree, job_pid), connected, sig) {
            self.say(warning);
        }
    }

    /// Once per attempt, when the trainer has shown progress: says so now
    /// if a stop would lose its work ([`SaveChecks::check_stop_saves`]).
    pub fn check_stop_saves(&mut self, tree: &[ProcSample], job_pid: u32, sig: &dyn Signaller) {
        let connected = self.companion.state().connected;
        if let Some(warning) = (self.checks).check_stop_saves(tree, job_pid, connected, sig) {
            self.say(warning);
        }
    }

    /// Why the framework the job's output named would not save on the
    /// signal a stop sends ([`SaveChecks::framework_loses_work`]).
    pub fn framework_loses_work(&self, trainers: &[Ident], sig: &dyn Signaller) -> Option<String> {
        let connected = self.companion.state().connected;
        self.checks.framework_loses_work(trainers, connected, sig)
    }

    /// A new attempt holds nothing.
    pub fn reset(&mut self) {
        self.paused.clear();
        self.stop = None;
        self.policy_end = None;
        self.signal_end = None;
        self.not_saved = None;
        self.policy_reason = None;
        self.killed = false;
        self.kill_at = None;
        self.companion.reset();
        self.peers = peers::Peers::begun();
        self.joined = None;
        self.checks.reset();
    }

    /// The attempt ended while its stop still waited for a checkpoint (the
    /// trainer saved and left between two ticks): the newest checkpoint
    /// written since the signal is final now that its writer is gone.
    pub fn conclude_checkpoint(&mut self, now: Instant) {
        let Some(st) = self.stop.as_mut() else {
            return;
        };
        if st.step != StopStep::Checkpoint {
            return;
        }
        let Some(watch) = st.watch.take() else {
            return;
        };
        let waited = now - st.began;
        self.out.checkpoint(watch.written(), waited, self.cfg.quiet);
    }

    /// Whether what [`Actuator::drain`] would give holds a rule change or
    /// an action (the tick's sample line then carries the process list).
    pub fn acting(&self) -> bool {
        self.out.acting()
    }

    /// What was done since the last call.
    pub fn drain(&mut self) -> Vec<Acted> {
        self.out.drain()
    }

    /// Whether anything is held or under way (the loop then ticks fast).
    pub fn busy(&self) -> bool {
        self.stop.is_some() || !self.paused.is_empty()
    }

    pub fn push(&mut self, acted: Acted) {
        self.out.push(acted);
    }

    pub(super) fn say(&mut self, text: String) {
        self.out.say(text);
    }

    fn record(&mut self, action: ActionKind, reason: &str, sent: Sent, signal: i32) {
        self.out.record(action, reason, sent, signal);
    }

    /// Forgets held processes (paused, throttled, signalled for a
    /// checkpoint) that are no longer the process that was held: gone, or
    /// their pid taken by another. Only a live identity is ever signalled
    /// again.
    pub fn prune(&mut self, tree: &[ProcSample], sig: &dyn Signaller) {
        if !self.busy() {
            return;
        }
        let in_tree: HashSet<Ident> = idents(tree, |_| true).into_iter().collect();
        // A held process whose pid another process took is let go here,
        // before any SIGCONT or SIGSTOP could reach the newcomer: counted
        // as a refusal, like a signal the start-time check stops.
        let alive = |id: &Ident| {
            let kept = in_tree.contains(id) || sig.is_alive(*id);
            if !kept && sig.reused(*id) {
                supervise::count_reused_refused();
            }
            kept
        };
        self.paused.retain(|id| alive(id));
        if let Some(st) = self.stop.as_mut() {
            st.throttled.retain(|id| alive(id));
        }
    }

    /// Policy `pause`: SIGSTOP to the whole tree.
    pub fn pause(&mut self, reason: &str, tree: &[ProcSample], sig: &mut dyn Signaller) {
        let targets = idents(tree, |_| true);
        let sent = signal_all(sig, &targets, SIG_STOP);
        self.paused.extend(targets);
        self.record(ActionKind::Pause, reason, sent, SIG_STOP);
    }

    /// Processes born since the pause are paused too.
    pub fn pause_new(&mut self, tree: &[ProcSample], sig: &mut dyn Signaller) {
        if self.paused.is_empty() {
            return;
        }
        let new = idents(tree, |p| !self.paused.contains(&(p.pid, p.start_time)));
        if !new.is_empty() {
            signal_all(sig, &new, SIG_STOP);
            self.paused.extend(new);
        }
    }

    /// Policy `resume` (the pausing rule cleared).
    pub fn resume(&mut self, reason: &str, sig: &mut dyn Signaller) {
        let targets: Vec<Ident> = self.paused.drain().collect();
        let sent = signal_all(sig, &targets, SIG_CONT);
        self.record(ActionKind::Resume, reason, sent, SIG_CONT);
        if !self.cfg.quiet {
            self.say(format!("{reason} cleared; resuming the job"));
        }
    }

    /// Gives back what oomguard paused (the job is being told to stop and
    /// must be able to handle it). Returns what was resumed.
    pub fn unpause(&mut self, sig: &mut dyn Signaller) -> Sent {
        let paused: Vec<Ident> = self.paused.drain().collect();
        signal_all(sig, &paused, SIG_CONT)
    }

    /// Starts the graceful ladder: the checkpoint signal to the trainers
    /// only (to the job's main process when no trainer is known). The
    /// growers (`prev`: the last sample, for the comparison) stay held by
    /// the throttle; everything else oomguard paused runs again.
    pub fn begin_stop(
        &mut self,
        action: Action,
        reason: &str,
        at: Scene<'_>,
        sig: &mut dyn Signaller,
    ) {
        let Scene {
            tree,
            prev,
            job_pid,
            now,
        } = at;
        self.policy_end = Some(action);
        self.policy_reason = Some(reason.to_string());
        let mut trainers = idents(tree, |p| p.role == Role::Trainer);
        if trainers.is_empty() {
            trainers = idents(tree, |p| p.pid == job_pid);
        }
        let growers = growers(tree, prev);
        if !self.paused.is_empty() {
            // A paused trainer cannot checkpoint: let it run.
            let resume: Vec<Ident> = self
                .paused
                .drain()
                .filter(|id| !growers.contains(id))
                .collect();
            signal_all(sig, &resume, SIG_CONT);
        }
        // Before the request or signal goes: a trainer that saves at once
        // writes its file before anything after the signal is read.
        let asked_at = SystemTime::now();
        // With a companion listening, the request replaces the signal: the
        // ranks agree on a step, save it together, and leave.
        let joined = self.joined.take();
        let restart = action == Action::Restart;
        let ask = (Kind::CheckpointAndExit, reason);
        let request = joined
            .or_else(|| (self.companion).ask(ask, restart, self.cfg.grace, now, &mut self.out));
        // A request (ours, or the other node's we join) goes without a
        // signal; its id is in the `checkpoint_request` line.
        if request.is_some() {
            let pids = trainers.iter().map(|t| t.0).collect();
            self.push(Acted::Action {
                action: action.into(),
                reason: reason.to_string(),
                pids,
                signal: None,
                result: "ok".into(),
            });
        } else {
            checkpoint_signal(&mut self.hands(sig), action.into(), reason, &trainers);
        }
        let watch = self
            .cfg
            .checkpoint_dir
            .clone()
            .map(|dir| CheckpointWatch::new(dir, self.cfg.checkpoint_glob.clone(), asked_at));
        self.stop = Some(Stop {
            reason: reason.to_string(),
            action,
            grace_end: now + self.cfg.grace,
            step: StopStep::Checkpoint,
            throttled: if joined.is_some() {
                HashSet::new()
            } else {
                growers
            },
            announced: HashSet::new(),
            throttle_running: false,
            throttle_switch: now,
            frozen_all: false,
            frozen_since: None,
            signalled: trainers,
            watch,
            began: now,
            request,
            done_at: None,
            fell_back: false,
            ack_wait: ACK_WAIT.min(self.cfg.grace / 2),
            kill_after: self.cfg.kill_after,
            joined: joined.is_some(),
        });
    }

    /// A save that a signal oomguard received asks for (`--on-signal
    /// checkpoint_and_exit`): every rank saves the step it completed and
    /// leaves, all within `window` (the signal budget less `--kill-after`),
    /// after which the rest of the ladder (SIGTERM, `--kill-after`) runs.
    /// The job is not short of memory, so nothing is throttled, and what
    /// oomguard paused runs again first (a paused rank cannot save).
    pub fn begin_signal_save(
        &mut self,
        signal: i32,
        reason: &str,
        budget: SaveBudget,
        at: Scene<'_>,
        sig: &mut dyn Signaller,
    ) {
        self.unpause(sig);
        self.joined = None;
        self.begin_stop(Action::Stop, reason, at, sig);
        self.signal_end = Some(signal);
        if let Some(st) = self.stop.as_mut() {
            let window = budget.window();
            st.grace_end = at.now + window;
            st.ack_wait = ACK_WAIT.min(window / 2);
            st.kill_after = budget.kill_after();
            st.throttled.clear();
            st.joined = true;
        }
    }

    /// A signal that asks for a save came while a stop of oomguard's own
    /// was saving: that save serves it, within the signal's budget too.
    pub fn hurry_save(&mut self, budget: SaveBudget, now: Instant) {
        if let Some(st) = self.stop.as_mut()
            && st.step == StopStep::Checkpoint
        {
            let window = budget.window();
            st.grace_end = st.grace_end.min(now + window);
            st.ack_wait = st.ack_wait.min(window / 2);
            st.kill_after = st.kill_after.min(budget.kill_after());
        }
    }

    /// A signal asking for a save came during this stop: the attempt ends
    /// for it too (no restart follows; the stop code or Ctrl-C's 130).
    pub fn served_signal(&mut self, signal: i32) {
        if self.stop.is_some() {
            self.signal_end.get_or_insert(signal);
        }
    }

    /// A signal asked for a save and exit that no companion could make
    /// (none had spoken): it was passed on, and the attempt ends for it
    /// all the same, with the stop code and `why` no save was made.
    pub fn end_unsaved(&mut self, signal: i32, why: String) {
        self.signal_end.get_or_insert(signal);
        self.not_saved.get_or_insert(why);
    }

    /// Why the signal that ended the attempt got no save, if it got none.
    pub fn not_saved(&self) -> Option<&str> {
        self.not_saved.as_deref()
    }

    /// The signal whose save ended the attempt, if one did.
    pub fn signal_end(&self) -> Option<i32> {
        self.signal_end
    }

    /// A save and exit is under way (a signal's or a stop's): another
    /// signal asking for one is served by it.
    pub fn saving(&self) -> bool {
        self.stop.is_some()
    }

    /// Ends this node's part without a save, for a fault of a job across
    /// nodes: a rank cannot take part, so a vote would never finish.
    /// SIGTERM and SIGCONT to the whole tree (a stopped rank must run to
    /// take its SIGTERM), then the ladder's `--kill-after`.
    pub fn end_for_fault(
        &mut self,
        action: Action,
        reason: &str,
        tree: &[ProcSample],
        now: Instant,
        sig: &mut dyn Signaller,
    ) {
        self.policy_end = Some(action);
        self.policy_reason = Some(reason.to_string());
        self.paused.clear();
        let all = idents(tree, |_| true);
        let sent = signal_all(sig, &all, SIG_TERM);
        signal_all(sig, &all, SIG_CONT);
        self.record(action.into(), reason, sent, SIG_TERM);
        self.stop = Some(Stop {
            reason: reason.to_string(),
            action,
            grace_end: now,
            step: StopStep::Terminate {
                until: now + self.cfg.kill_after,
            },
            throttled: HashSet::new(),
            announced: HashSet::new(),
            throttle_running: false,
            throttle_switch: now,
            frozen_all: false,
            frozen_since: None,
            signalled: all,
            watch: None,
            began: now,
            request: None,
            done_at: None,
            fell_back: false,
            ack_wait: ACK_WAIT.min(self.cfg.grace / 2),
            kill_after: self.cfg.kill_after,
            joined: true,
        });
    }

    /// Keeps the kernel out while the stop is in progress, and walks the
    /// ladder: trainers exit (or grace ends) → SIGTERM + SIGCONT to the
    /// rest → `--kill-after` → SIGKILL. `sample`: this tick's tree; `prev`:
    /// the last tick's, to find new growers.
    pub fn guard(
        &mut self,
        sample: &Sample,
        prev: Option<&Sample>,
        levels: Levels,
        now: Instant,
        sig: &mut dyn Signaller,
    ) {
        let Some(mut st) = self.stop.take() else {
            return;
        };
        let tree = &sample.procs;
        match st.step {
            StopStep::Checkpoint => {
                if !st.joined {
                    let new_growers = growers(tree, prev);
                    let hard = kernel_headroom(sample);
                    st.hold((hard, levels), new_growers, tree, now, sig, &mut self.out);
                }
                match st.checkpoint_step(tree, now, &mut self.hands(sig)) {
                    Waited::Going => self.killed |= st.step == StopStep::Killed,
                    Waited::Released => return,
                    Waited::GaveUp => {
                        self.policy_end = None;
                        self.policy_reason = None;
                        self.out.push(Acted::GaveUp);
                        return;
                    }
                }
            }
            StopStep::Terminate { until } => {
                if now >= until {
                    let rest = idents(tree, |_| true);
                    let sent = signal_all(sig, &rest, SIG_KILL);
                    if !sent.0.is_empty() {
                        let why = format!("{}: --kill-after expired", st.reason);
                        let part = (st.action, Part::Kill);
                        (self.out).record_part(part, ActionKind::Kill, &why, sent, SIG_KILL);
                    }
                    self.killed = true;
                    st.step = StopStep::Killed;
                }
            }
            StopStep::Killed if self.cfg.may_kill => {
                let rest = idents(tree, |_| true);
                signal_all(sig, &rest, SIG_KILL);
            }
            StopStep::Killed => {}
        }
        self.stop = Some(st);
    }

    /// Ends what oomguard holds without ending the job (attach's watch
    /// ends): resumes the paused (logged) and releases a stop.
    pub fn let_go(&mut self, why: &str, tree: &[ProcSample], sig: &mut dyn Signaller) {
        if !self.paused.is_empty() {
            let sent = self.unpause(sig);
            self.record(ActionKind::Resume, why, sent, SIG_CONT);
        }
        if let Some(st) = self.stop.take() {
            st.release(why, tree, sig, &mut self.out);
        }
    }

    /// Starts the `--kill-after` clock at `now` unless it already runs (a
    /// forwarded TERM, a hangup, a job whose main process exited with
    /// processes left).
    pub fn arm_kill_after(&mut self, now: Instant) {
        if self.kill_at.is_none() {
            self.kill_at = Some(now + self.cfg.kill_after);
        }
    }

    /// Starts the `--kill-after` clock from `now` whatever it said before:
    /// the user's signal that ends the run counts from when it came.
    pub fn rearm_kill_after(&mut self, now: Instant) {
        self.kill_at = Some(now + self.cfg.kill_after);
    }

    /// When the next kill is due (the `--kill-after` clock, or the next
    /// round of a kill under way).
    pub fn kill_deadline(&self) -> Option<Instant> {
        self.kill_at
    }

    pub fn kill_due(&self, now: Instant) -> bool {
        self.kill_at.is_some_and(|k| now >= k)
    }

    /// The policy's `kill`: the attempt ends by it, for this reason.
    pub fn kill_for_policy(
        &mut self,
        why: &str,
        tree: &[ProcSample],
        job_pid: u32,
        now: Instant,
        sig: &mut dyn Signaller,
    ) {
        self.policy_end = Some(Action::Kill);
        self.policy_reason = Some(why.to_string());
        self.kill(why, tree, Some(job_pid), now, sig);
    }

    /// SIGKILL to the whole tree, and to the job's process group
    /// (`group`, while its leader lives) for what the scan has not seen yet.
    /// Logged once: later rounds (every 100 ms, `kill_at`) only catch
    /// late-born processes. Refused, with a message, when oomguard may not
    /// kill. Returns whether the signals were sent.
    pub fn kill(
        &mut self,
        why: &str,
        tree: &[ProcSample],
        group: Option<u32>,
        now: Instant,
        sig: &mut dyn Signaller,
    ) -> bool {
        if !self.cfg.may_kill {
            self.kill_at = None;
            self.say(format!(
                "{why}: not killing processes oomguard did not launch (use --allow-kill)"
            ));
            return false;
        }
        if !self.killed && !tree.is_empty() && !self.cfg.quiet {
            self.say(format!("{why}: killing {} process(es)", tree.len()));
        }
        let first = !self.killed;
        self.killed = true;
        let sent = signal_all(sig, &idents(tree, |_| true), SIG_KILL);
        if let Some(pgid) = group {
            let _ = sig.signal_group(pgid, SIG_KILL);
        }
        if first {
            self.record(ActionKind::Kill, why, sent, SIG_KILL);
        }
        self.kill_at = Some(now + Duration::from_millis(100));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signals_budget_leaves_the_save_at_least_two_thirds() {
        let b = |total: u64, kill_after: u64| SaveBudget {
            total: Duration::from_secs(total),
            kill_after: Duration::from_secs(kill_after),
        };
        // SLURM and Kubernetes by default: 20 s to save, 10 s to end.
        assert_eq!(b(30, 10).window(), Duration::from_secs(20));
        assert_eq!(b(30, 10).kill_after(), Duration::from_secs(10));
        // A long --kill-after does not eat the save: a third at most.
        assert_eq!(b(30, 60).kill_after(), Duration::from_secs(10));
        assert_eq!(b(30, 60).window(), Duration::from_secs(20));
        // docker stop's 10 s, as docs/preemption.md sets it.
        assert_eq!(b(9, 2).window(), Duration::from_secs(7));
    }
}
