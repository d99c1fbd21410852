//! The decision half of a tick, without I/O of its own: a sample goes in,
//! the view is derived, the pure policy engine decides, and the actuator
//! carries the decisions out through the [`Signaller`] and [`Notifier`] it
//! is handed. What happened comes back as [`Acted`] records for the sinks.
//!
//! The loop around it (`runtime::Supervisor`) owns the readers, the child
//! process, the timers and the sinks; this part owns the engine, the
//! history, and what oomguard holds. That split is what lets the stop
//! ladder, the throttle, max-pause escalation and restart decisions be
//! unit-tested from a scripted series of samples, with no process at all.

use std::time::{Duration, Instant};

use super::act::{Acted, Actuator, Levels, Notifier, Scene, Signaller};
use crate::engine::policy::{Action, Decision, Engine, Readings};
use crate::job::supervise;
use crate::runtime::node_group::NodeRole;
use crate::vocab::model::{CeilingSource, History, ProcSample, Sample, View};
use crate::vocab::units::{HumanBytes, human_duration};

/// Fastest polling cadence (near the ceiling and while stopping).
pub const FAST: Duration = Duration::from_millis(20);

/// What the tick needs besides the sample.
#[derive(Debug, Clone, Copy)]
pub struct TickInputs {
    pub now: Instant,
    /// The job is ending (its main process exited, a shutdown signal came,
    /// or a stop is under way): the policy has nothing more to decide.
    pub ending: bool,
    /// The job's main process, for the checkpoint signal when no trainer
    /// is known.
    pub job_pid: u32,
    /// Policy inputs a sample alone does not give.
    pub gpu_eta: Option<f64>,
    pub torch_fragmentation: Option<f64>,
    /// No attempt can follow this one (`--max-restarts` reached): a
    /// `restart` only stops the job, and says so.
    pub last_attempt: bool,
    /// The node's tasks pool their measurements (`node_group`): `defer`
    /// when another task's oomguard decides for the node (this one only
    /// warns and relieves), and, for the one that decides, the task whose
    /// memory grew the most, which its stop names.
    pub node: NodeRole,
}

/// What the tick decided, for the sinks.
#[derive(Debug)]
pub struct TickOut {
    pub view: View,
    pub readings: Readings,
    /// A rule changed state or an action was taken (the sample line is
    /// written with its per-process detail).
    pub decided: bool,
    /// A rule began or ended its `for` wait (the line is written so that a
    /// replay waits from the same sample).
    pub waits_changed: bool,
}

/// Words the tick uses in its messages.
#[derive(Debug, Clone, Default)]
pub struct Voice {
    pub quiet: bool,
    /// `--notify`: warnings become desktop notifications too.
    pub notify: bool,
    /// `--on-warn` hook command.
    pub on_warn: Option<String>,
}

/// The engine, the history and the actuator, driven one sample at a time.
#[derive(Debug)]
pub struct Core {
    engine: Engine,
    history: History,
    act: Actuator,
    voice: Voice,
    last_sample: Option<Sample>,
    last_view: Option<View>,
}

impl Core {
    pub fn new(engine: Engine, act: Actuator, voice: Voice) -> Self {
        Self {
            engine,
            history: History::new(crate::vocab::model::ETA_WINDOW_SECONDS),
            act,
            voice,
            last_sample: None,
            last_view: None,
        }
    }

    /// The actuator, read: what oomguard holds and is doing to the job.
    pub fn act(&self) -> &Actuator {
        &self.act
    }

    /// The actuator, driven: between ticks the loop hands it what the
    /// job did (a rank's exit, a signal's save, the kill deadline); the
    /// actuator keeps its own state consistent through its verbs.
    pub fn act_mut(&mut self) -> &mut Actuator {
        &mut self.act
    }

    pub fn policy(&self) -> &crate::engine::policy::Policy {
        self.engine.policy()
    }

    /// A warning is in force (the dashboard's state).
    pub fn warning(&self) -> bool {
        self.engine.warning()
    }

    /// Some rule is waiting out its `for` or firing (the log keeps every
    /// line then).
    pub fn watching(&self) -> bool {
        self.engine.watching()
    }

    /// The user paused the job from the dashboard at `t`: its rules' waits
    /// do not run on while it is held.
    pub fn paused_externally(&mut self, t: f64) {
        self.engine.paused_externally(t);
    }

    pub fn resumed_externally(&mut self) {
        self.engine.resumed_externally();
    }

    /// A stop that could not end the job was given up: the policy starts
    /// over.
    pub fn gave_up(&mut self) {
        self.engine.reset();
    }

    /// The view of a sample taken outside the tick (the last one, as the
    /// job ends).
    pub fn view_of(&mut self, sample: &Sample) -> View {
        self.history.push(sample)
    }

    /// A stop the loop begins between ticks (a key, a hook), on the tree
    /// of the last scan (`tree`): the growers are found against the core's
    /// own last sample.
    pub fn begin_stop(
        &mut self,
        (action, reason): (Action, &str),
        tree: &[ProcSample],
        job_pid: u32,
        now: Instant,
        sig: &mut dyn Signaller,
    ) {
        let at = Scene {
            tree,
            prev: self.last_sample.as_ref(),
            job_pid,
            now,
        };
        self.act.begin_stop(action, reason, at, sig);
    }

    /// A signal's save (`--on-signal`), begun like [`Core::begin_stop`].
    pub fn begin_signal_save(
        &mut self,
        (signal, reason): (i32, &str),
        budget: super::act::SaveBudget,
        (tree, job_pid): (&[ProcSample], u32),
        now: Instant,
        sig: &mut dyn Signaller,
    ) {
        let at = Scene {
            tree,
            prev: self.last_sample.as_ref(),
            job_pid,
            now,
        };
        self.act.begin_signal_save(signal, reason, budget, at, sig);
    }

    /// Headroom (%) at the last tick's view.
    pub fn last_headroom(&self) -> Option<f64> {
        self.last_view.as_ref().and_then(View::headroom_percent)
    }

    /// The previous tick's sample.
    pub fn last_sample(&self) -> Option<&Sample> {
        self.last_sample.as_ref()
    }

    /// Lent to the sinks, then given back with [`Core::keep_sample`].
    pub fn take_last_sample(&mut self) -> Option<Sample> {
        self.last_sample.take()
    }

    pub fn keep_sample(&mut self, sample: Sample) {
        self.last_sample = Some(sample);
    }

    /// The view the loop acted on, for the next tick's scan
    /// ([`Core::needs_full_scan`]).
    pub fn keep_view(&mut self, view: View) {
        self.last_view = Some(view);
    }

    /// A new attempt starts from nothing.
    pub fn reset(&mut self) {
        self.act.reset();
        self.engine.reset();
        self.history.clear();
        self.last_sample = None;
        self.last_view = None;
    }

    /// The stop ladder's levels, from the policy.
    pub fn levels(&self) -> Levels {
        Levels {
            last_resort: self.wake_levels()[2],
        }
    }

    /// One tick's decisions: view, policy, actuator. The sample is kept
    /// as the previous one for the next tick. What the actuator did is in
    /// `self.act.drain()`.
    pub fn tick(
        &mut self,
        sample: Sample,
        inp: TickInputs,
        sig: &mut dyn Signaller,
        notifier: &mut dyn Notifier,
    ) -> TickOut {
        self.act.poll_channel(inp.now);
        self.act
            .watch_peers(&sample.procs, inp.ending, inp.now, sig);
        let view = self.history.push(&sample);
        let readings = Readings::from_sample(&sample, &view, inp.gpu_eta, inp.torch_fragmentation);
        let waits_before = self.engine.pending_changes();
        let decisions = if inp.ending || self.act.stop().is_some() {
            Vec::new()
        } else {
            self.engine.step(&readings)
        };
        let decided = !decisions.is_empty();
        let waits_changed = self.engine.pending_changes() != waits_before;
        for d in decisions {
            self.apply(d, &sample, &view, inp, sig, notifier);
        }
        // Not taken while the job ends: a stop that came with the ranks'
        // last words is still why they left (`adopt_remote_stop`).
        if !inp.ending
            && self.act.stop().is_none()
            && let Some(remote) = self.act.take_remote_stop()
        {
            if !self.voice.quiet {
                let (ours, then) = match (self.act.one_rank_each(), remote.restart) {
                    (true, true) => ("this task's rank saves", "restarts the job with it"),
                    (true, false) => ("this task's rank saves", "stops with it"),
                    (false, true) => ("this node's ranks save", "restart the job with it"),
                    (false, false) => ("this node's ranks save", "stop with it"),
                };
                self.act.push(Acted::Say(format!(
                    "{}; {ours} the same step and {then}",
                    remote.why
                )));
            }
            let at = Scene {
                tree: &sample.procs,
                prev: self.last_sample.as_ref(),
                job_pid: inp.job_pid,
                now: inp.now,
            };
            self.act.join_stop(&remote, at, sig);
        }
        self.act.pause_new(&sample.procs, sig);
        let levels = self.levels();
        self.act
            .guard(&sample, self.last_sample.as_ref(), levels, inp.now, sig);
        self.last_sample = Some(sample);
        TickOut {
            view,
            readings,
            decided,
            waits_changed,
        }
    }

    fn apply(
        &mut self,
        d: Decision,
        sample: &Sample,
        view: &View,
        inp: TickInputs,
        sig: &mut dyn Signaller,
        notifier: &mut dyn Notifier,
    ) {
        let (action, reason, hook) = match d {
            Decision::Rule {
                rule,
                metric,
                value,
                threshold,
                firing,
            } => {
                self.act.push(Acted::Rule(crate::sinks::log::RuleEvent::new(
                    &rule,
                    metric.name(),
                    value,
                    threshold,
                    firing,
                )));
                return;
            }
            Decision::Resume { reason } => {
                self.act.resume(&reason, sig);
                return;
            }
            Decision::Act {
                action,
                reason,
                hook,
            } => (action, reason, hook),
        };
        let Some((reason, grower)) = inp.node.take(action, reason) else {
            return;
        };
        if action.is_request() && !self.act.companion().connected {
            // Nothing to ask: logged as decided, without a word to the user.
            self.act.request(action, &reason, inp.now);
            return;
        }
        let action = self.no_pause_across_nodes(action, &reason);
        if action == Action::Warn {
            self.warn(&reason, sample, view, notifier);
        } else if !self.voice.quiet {
            let text = describe(action, &reason, view, &self.act, inp.last_attempt);
            self.act.push(Acted::Say(text));
        }
        let tree = &sample.procs;
        match action {
            Action::Warn => self.act.push(Acted::Action {
                action: crate::sinks::log::ActionKind::Warn,
                reason: reason.clone(),
                pids: Vec::new(),
                signal: None,
                result: "ok".into(),
            }),
            Action::Relieve | Action::Checkpoint => {
                self.act
                    .note_cause(headroom_text(view), view.fastest.map(|f| f.0), tree);
                self.act.request(action, &reason, inp.now);
            }
            Action::Pause => self.act.pause(&reason, tree, sig),
            Action::Stop | Action::Restart => {
                self.act
                    .note_cause(headroom_text(view), view.fastest.map(|f| f.0), tree);
                if let Some(g) = grower {
                    self.act.note_node_cause(headroom_text(view), g.rank);
                }
                let at = Scene {
                    tree,
                    prev: self.last_sample.as_ref(),
                    job_pid: inp.job_pid,
                    now: inp.now,
                };
                self.act.begin_stop(action, &reason, at, sig);
            }
            Action::Kill if !self.act.cfg().may_kill => {
                self.act.push(Acted::Say(format!(
                    "{reason}: not killing processes oomguard did not launch (use --allow-kill)"
                )));
                self.act.push(Acted::Action {
                    action: crate::sinks::log::ActionKind::Warn,
                    reason: reason.clone(),
                    pids: Vec::new(),
                    signal: None,
                    result: "kill refused: attached".into(),
                });
            }
            Action::Kill => {
                self.act
                    .kill_for_policy(&reason, tree, inp.job_pid, inp.now, sig);
            }
        }
        let hook = hook.or_else(|| {
            (action == Action::Warn)
                .then(|| self.voice.on_warn.clone())
                .flatten()
        });
        if let Some(cmd) = hook {
            self.act.push(Acted::Hook {
                cmd,
                action,
                reason,
            });
        }
    }

    /// A job with ranks on other nodes is never paused: a held rank stalls
    /// every node in its next collective until the collective's timeout.
    /// It is stopped with a checkpoint instead (every node's).
    fn no_pause_across_nodes(&mut self, action: Action, reason: &str) -> Action {
        if action != Action::Pause || !self.act.companion().spans_nodes() {
            return action;
        }
        self.act.push(Acted::Say(format!(
            "{reason}: the job has ranks on other nodes, and pausing this node's would stall \
             them all; stopping it with a checkpoint instead"
        )));
        Action::Stop
    }

    fn warn(&mut self, reason: &str, sample: &Sample, view: &View, notifier: &mut dyn Notifier) {
        let head = headroom_text(view).unwrap_or_default();
        let eta = view
            .eta_seconds
            .map_or_else(String::new, |e| format!("; full in ~{e:.0}s"));
        let top = sample
            .procs
            .iter()
            .max_by_key(|p| p.pss_bytes)
            .map_or_else(String::new, |p| {
                format!(
                    "; largest {} (pid {}, {}) {}",
                    p.comm,
                    p.pid,
                    p.role.as_str(),
                    HumanBytes(p.pss_bytes)
                )
            });
        let msg = format!("{head}{eta}{top}");
        if !self.voice.quiet {
            self.act
                .push(Acted::Say(format!("warning ({reason}): {msg}")));
        }
        if self.voice.notify {
            notifier.notify(format!("oomguard: memory warning ({reason})"), msg);
        }
    }

    /// How soon the next tick comes: faster as headroom shrinks, and fast
    /// while anything is held.
    /// The warn and critical headroom levels (%) the loop watches with
    /// its fast ticks and wake-ups: the policy's, or the default policy's
    /// (20 %, 8 %) when it has none, so an observe-only run (`--policy
    /// none`) still records the near-ceiling detail a default run sees.
    pub fn watched_levels(&self) -> (f64, f64) {
        let (warn, crit) = self.engine.policy().thresholds();
        (warn.unwrap_or(20.0), crit.unwrap_or(8.0))
    }

    /// The headroom levels (%) that wake the loop: warn, critical and the
    /// last resort (half the critical level).
    pub fn wake_levels(&self) -> [f64; 3] {
        let (warn, crit) = self.watched_levels();
        [warn, crit, crit / 2.0]
    }

    /// Whether the next tick must see every process of the job, even one
    /// forked a moment ago: a stop is under way, or the last tick was
    /// below the critical level, where a last-resort freeze may follow and
    /// a worker it misses goes on growing (a quick scan re-reads only the
    /// processes already known).
    pub fn needs_full_scan(&self) -> bool {
        let (_, crit) = self.watched_levels();
        self.act.busy() || self.last_headroom().is_some_and(|h| h < crit)
    }

    pub fn cadence(&self, view: &View, base: Duration) -> Duration {
        if self.act.busy() {
            return FAST;
        }
        let (warn, crit) = self.watched_levels();
        let fast = match view.headroom_percent() {
            Some(h) if h < crit * 2.0 => FAST,
            Some(h) if h < warn => Duration::from_millis(100),
            Some(h) if h < warn + 10.0 => Duration::from_millis(250),
            _ => base,
        };
        let soon = view.eta_seconds.is_some_and(|eta| eta < 30.0)
            // A steep drop since the last tick (before there is history
            // for an ETA): look again soon.
            || self
                .last_view
                .as_ref()
                .and_then(|prev| Some(prev.headroom_percent()? - view.headroom_percent()?))
                .is_some_and(|d| d > 2.0);
        let fast = if soon {
            fast.min(Duration::from_millis(100))
        } else {
            fast
        };
        fast.min(base)
    }
}

/// "headroom 1.2 GiB (7.5%) under the cgroup ceiling of 16 GiB"; for
/// `/dev/shm`, how full it is and what fills it.
fn headroom_text(view: &View) -> Option<String> {
    let n = view.nearest?;
    if n.ceiling.source == CeilingSource::Shm {
        return Some(format!(
            "/dev/shm {} of {} ({:.1}% free): DataLoader batches held in shared memory",
            HumanBytes(n.used_bytes),
            HumanBytes(n.ceiling.bytes),
            n.headroom_percent(),
        ));
    }
    Some(format!(
        "headroom {} ({:.1}%) under the {} ceiling of {}",
        HumanBytes(n.headroom_bytes),
        n.headroom_percent(),
        n.ceiling.source.as_str(),
        HumanBytes(n.ceiling.bytes)
    ))
}

/// The message for a critical action: what was crossed and what follows.
fn describe(action: Action, reason: &str, view: &View, act: &Actuator, last: bool) -> String {
    let head = headroom_text(view).map_or_else(String::new, |h| format!(": {h}"));
    let stop = || {
        let how = if act.can_ask() {
            "a checkpoint requested from the companion".to_string()
        } else {
            format!(
                "{} to the trainer",
                supervise::signal_name(act.cfg().checkpoint_signal)
            )
        };
        format!(
            "stopping the job gracefully ({how}, {} grace)",
            human_duration(act.cfg().grace)
        )
    };
    let what = match action {
        Action::Pause => "pausing the job".to_string(),
        Action::Stop => stop(),
        Action::Restart if last => {
            format!("{}; no restart follows (--max-restarts reached)", stop())
        }
        Action::Restart => "stopping the job to restart it".to_string(),
        Action::Kill => "killing the job".to_string(),
        Action::Warn => "warning".to_string(),
        Action::Checkpoint => "asking the trainer for a checkpoint (training goes on)".to_string(),
        Action::Relieve => "asking the trainer to free its caches (training goes on)".to_string(),
    };
    format!("{reason}{head}; {what}")
}

#[cfg(test)]
mod tests {
    //! The tick driven by a scripted sampler and a recording signaller: no
    //! process is started, every signal is seen.

    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::engine::policy::Policy;
    use crate::job::supervise::SignalError;
    use crate::runtime::act::{ActConfig, Ident, SIG_CONT, SIG_KILL, SIG_STOP, SIG_TERM};
    use crate::vocab::model::{ProcSample, Role, SystemSample, TreeTotals};

    const GIB: u64 = 1 << 30;
    const CKPT: i32 = libc::SIGUSR1;
    const TRAINER: u32 = 100;
    const W1: u32 = 101;
    const W2: u32 = 102;

    /// Every signal sent, in order; `dead`: identities that are gone.
    #[derive(Default)]
    struct Recorder {
        sent: Vec<(u32, i32)>,
        groups: Vec<(u32, i32)>,
        dead: HashSet<Ident>,
    }

    impl Signaller for Recorder {
        fn signal(&mut self, id: Ident, sig: i32) -> Result<(), SignalError> {
            if self.dead.contains(&id) {
                return Err(SignalError::Gone(id.0));
            }
            self.sent.push((id.0, sig));
            Ok(())
        }
        fn is_alive(&self, id: Ident) -> bool {
            !self.dead.contains(&id)
        }
        fn signal_group(&mut self, pgid: u32, sig: i32) -> Result<(), SignalError> {
            self.groups.push((pgid, sig));
            Ok(())
        }
    }

    impl Recorder {
        fn take(&mut self) -> Vec<(u32, i32)> {
            std::mem::take(&mut self.sent)
        }
    }

    #[derive(Default)]
    struct Notes(Vec<String>);

    impl Notifier for Notes {
        fn notify(&mut self, summary: String, _body: String) {
            self.0.push(summary);
        }
    }

    /// A scripted sampler: a trainer and two workers on a 10 GiB machine;
    /// each `sample` call says how much is still available and how big
    /// each process is.
    struct Script {
        procs: Vec<(u32, Role, u64)>,
        start_times: Vec<(u32, u64)>,
    }

    impl Script {
        fn new() -> Self {
            Self {
                procs: vec![
                    (TRAINER, Role::Trainer, GIB),
                    (W1, Role::Worker, GIB / 4),
                    (W2, Role::Worker, GIB / 4),
                ],
                start_times: Vec::new(),
            }
        }

        fn start_time(&self, pid: u32) -> u64 {
            self.start_times
                .iter()
                .find(|(p, _)| *p == pid)
                .map_or(pid as u64 * 10, |(_, s)| *s)
        }

        fn sample(&self, t: f64, headroom_percent: f64) -> Sample {
            let total = 10 * GIB;
            let procs: Vec<ProcSample> = self
                .procs
                .iter()
                .map(|&(pid, role, rss)| ProcSample {
                    pid,
                    ppid: if pid == TRAINER { 1 } else { TRAINER },
                    role,
                    comm: "python3".into(),
                    rss_bytes: rss,
                    pss_bytes: rss,
                    uss_bytes: rss,
                    swap_bytes: 0,
                    rss_peak_bytes: None,
                    gpu_bytes: None,
                    read_age_seconds: None,
                    torch: None,
                    start_time: self.start_time(pid),
                    stopped: false,
                })
                .collect();
            let used: u64 = procs.iter().map(|p| p.pss_bytes).sum();
            Sample {
                t,
                tree: TreeTotals {
                    procs: procs.len() as u32,
                    rss_bytes: used,
                    pss_bytes: used,
                    footprint_bytes: used,
                    ..Default::default()
                },
                procs,
                system: SystemSample {
                    mem_total_bytes: total,
                    mem_available_bytes: (total as f64 * headroom_percent / 100.0) as u64,
                    ..Default::default()
                },
                ..Default::default()
            }
        }

        fn grow(&mut self, pid: u32, by: u64) {
            for p in self.procs.iter_mut().filter(|p| p.0 == pid) {
                p.2 += by;
            }
        }

        fn exit(&mut self, pid: u32) {
            self.procs.retain(|p| p.0 != pid);
        }
    }

    /// Warn at 20 % headroom, critical at 8 %.
    fn core(on_critical: Action, may_kill: bool) -> Core {
        core_with(on_critical, may_kill, |_| {})
    }

    /// A core whose actuator's settings `tune` changes first.
    fn core_with(on_critical: Action, may_kill: bool, tune: impl FnOnce(&mut ActConfig)) -> Core {
        let policy = Policy::default_with(80.0, 92.0, on_critical);
        let mut cfg = ActConfig {
            checkpoint_signal: CKPT,
            grace: Duration::from_secs(2),
            kill_after: Duration::from_secs(1),
            may_kill,
            quiet: true,
            checkpoint_dir: None,
            checkpoint_glob: "*".into(),
        };
        tune(&mut cfg);
        let act = Actuator::new(cfg);
        let voice = Voice {
            quiet: true,
            notify: true,
            on_warn: None,
        };
        Core::new(Engine::new(policy), act, voice)
    }

    struct Run {
        core: Core,
        sig: Recorder,
        notes: Notes,
        /// What the actuator said to the user.
        said: Vec<String>,
        t0: Instant,
        /// `TickInputs::last_attempt`.
        last_attempt: bool,
        /// `TickInputs::node`.
        node: NodeRole,
    }

    impl Run {
        fn new(core: Core) -> Self {
            Self {
                core,
                sig: Recorder::default(),
                notes: Notes::default(),
                said: Vec::new(),
                t0: Instant::now(),
                last_attempt: false,
                node: NodeRole::Alone,
            }
        }

        /// One tick at `t` seconds; returns the actions taken.
        fn tick(&mut self, script: &Script, t: f64, headroom: f64) -> Vec<(&'static str, String)> {
            let sample = script.sample(t, headroom);
            self.core.act.prune(&sample.procs, &self.sig);
            let inputs = TickInputs {
                now: self.t0 + Duration::from_secs_f64(t),
                ending: false,
                job_pid: TRAINER,
                gpu_eta: None,
                torch_fragmentation: None,
                last_attempt: self.last_attempt,
                node: self.node,
            };
            self.core
                .tick(sample, inputs, &mut self.sig, &mut self.notes);
            self.core
                .act
                .drain()
                .into_iter()
                .filter_map(|a| match a {
                    Acted::Action { action, reason, .. } => Some((action.as_str(), reason)),
                    Acted::Say(text) => {
                        self.said.push(text);
                        None
                    }
                    _ => None,
                })
                .collect()
        }
    }

    /// What the actuator said since the last call.
    fn said(act: &mut Actuator) -> Vec<String> {
        act.drain()
            .into_iter()
            .filter_map(|a| match a {
                Acted::Say(text) => Some(text),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn lightning_without_a_companion_is_warned_about_once_before_any_stop() {
        use crate::vocab::forensics::torch::Framework;
        let script = Script::new();
        let tree = script.sample(0.0, 50.0).procs;
        for companion in [false, true] {
            let mut run = Run::new(core(Action::Stop, true));
            run.core = core_with(Action::Stop, true, |c| c.quiet = false);
            let act = &mut run.core.act;
            act.companion_mut().connected = companion;
            let t0 = run.t0;
            act.note_framework(Framework::Lightning, t0);
            // Its companion would say hello as the Trainer is built: not
            // yet missed 5 s after the banner.
            act.check_framework(t0 + Duration::from_secs(5), &tree, TRAINER, &run.sig);
            assert!(said(act).is_empty());
            act.check_framework(t0 + Duration::from_secs(11), &tree, TRAINER, &run.sig);
            act.check_framework(t0 + Duration::from_secs(12), &tree, TRAINER, &run.sig);
            let told = said(act);
            if companion {
                assert!(told.is_empty(), "{told:?}");
            } else {
                assert_eq!(told.len(), 1, "{told:?}");
                assert!(told[0].contains("PyTorch Lightning"), "{told:?}");
                assert!(told[0].contains("a stop would lose the work"), "{told:?}");
            }
        }
    }

    #[test]
    fn the_stop_ladder_checkpoints_the_trainer_then_terminates_then_kills() {
        let mut run = Run::new(core(Action::Stop, true));
        let script = Script::new();
        assert!(run.tick(&script, 0.0, 50.0).is_empty());
        assert!(run.sig.take().is_empty());
        // Critical: the checkpoint signal goes to the trainer only.
        let acts = run.tick(&script, 1.0, 5.0);
        assert_eq!(acts[0].0, "stop", "{acts:?}");
        assert_eq!(run.sig.take(), vec![(TRAINER, CKPT)]);
        // Within the grace the trainer is left alone.
        run.tick(&script, 2.0, 5.0);
        assert!(run.sig.take().is_empty());
        // Grace over (2 s): TERM, and CONT so a stopped process sees it.
        let acts = run.tick(&script, 3.1, 5.0);
        assert_eq!(acts.len(), 1, "{acts:?}");
        assert!(acts[0].1.contains("terminating the rest"), "{acts:?}");
        let sent = run.sig.take();
        let terms: Vec<u32> = sent
            .iter()
            .filter(|s| s.1 == SIG_TERM)
            .map(|s| s.0)
            .collect();
        assert_eq!(terms, vec![TRAINER, W1, W2]);
        assert!(sent.iter().filter(|s| s.1 == SIG_CONT).count() == 3);
        // --kill-after (1 s) later: SIGKILL to whatever is left.
        run.tick(&script, 3.5, 5.0);
        assert!(run.sig.take().is_empty());
        let acts = run.tick(&script, 4.2, 5.0);
        assert_eq!(acts[0].0, "kill");
        assert!(acts[0].1.contains("--kill-after expired"));
        assert_eq!(
            run.sig.take(),
            vec![(TRAINER, SIG_KILL), (W1, SIG_KILL), (W2, SIG_KILL)]
        );
        assert!(run.core.act.killed());
        assert_eq!(run.core.act.policy_end(), Some(Action::Stop));
    }

    #[test]
    fn a_trainer_that_exits_after_its_checkpoint_ends_the_wait_at_once() {
        let mut run = Run::new(core(Action::Stop, true));
        let mut script = Script::new();
        run.tick(&script, 0.0, 50.0);
        run.tick(&script, 1.0, 5.0);
        run.sig.take();
        script.exit(TRAINER);
        run.tick(&script, 1.2, 5.0);
        let terms: Vec<(u32, i32)> = run
            .sig
            .take()
            .into_iter()
            .filter(|s| s.1 == SIG_TERM)
            .collect();
        assert_eq!(terms, vec![(W1, SIG_TERM), (W2, SIG_TERM)]);
    }

    #[test]
    fn growing_workers_are_throttled_while_the_trainer_checkpoints() {
        let mut run = Run::new(core(Action::Stop, true));
        let mut script = Script::new();
        run.tick(&script, 0.0, 50.0);
        script.grow(W1, 64 << 20);
        run.tick(&script, 1.0, 5.0);
        // The stop, then the first throttle slice lets the grower run.
        assert_eq!(run.sig.take(), vec![(TRAINER, CKPT), (W1, SIG_CONT)]);
        let mut w1 = Vec::new();
        let mut logged = Vec::new();
        let mut t = 1.0;
        while t < 2.9 {
            t += 0.02;
            script.grow(W1, 1 << 20);
            logged.extend(run.tick(&script, t, 5.0));
            for (pid, sig) in run.sig.take() {
                assert_eq!(pid, W1, "only the grower is throttled (got {sig} to {pid})");
                w1.push((t, sig));
            }
        }
        // Logged once, when first held; not at every cycle.
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert_eq!(logged[0].0, "pause");
        assert!(logged[0].1.starts_with("throttle during"), "{logged:?}");
        // It alternates: held ~450 ms, let run ~50 ms.
        assert!(w1.len() >= 6, "{w1:?}");
        for pair in w1.windows(2) {
            assert_ne!(pair[0].1, pair[1].1, "{w1:?}");
        }
        let stops: Vec<f64> = w1.iter().filter(|s| s.1 == SIG_STOP).map(|s| s.0).collect();
        let conts: Vec<f64> = w1.iter().filter(|s| s.1 == SIG_CONT).map(|s| s.0).collect();
        for (s, c) in stops.iter().zip(conts.iter()) {
            let held = c - s;
            assert!((0.42..0.52).contains(&held), "held {held:.3}s: {w1:?}");
        }
    }

    #[test]
    fn the_last_resort_freezes_the_tree_and_kills_it_when_it_stays_stuck() {
        let c = core_with(Action::Stop, true, |c| {
            c.grace = Duration::from_secs(30);
            c.quiet = false;
        });
        let mut run = Run::new(c);
        let script = Script::new();
        run.tick(&script, 0.0, 50.0);
        run.tick(&script, 1.0, 5.0);
        run.sig.take();
        // Below half the critical level (4 %): everything is frozen.
        let acts = run.tick(&script, 1.1, 2.0);
        assert_eq!(acts[0].0, "pause");
        assert!(acts[0].1.starts_with("last resort"), "{acts:?}");
        assert_eq!(
            run.sig.take(),
            vec![(TRAINER, SIG_STOP), (W1, SIG_STOP), (W2, SIG_STOP)]
        );
        // The grace (30 s) has not run out, but frozen for 5 s is stuck:
        // the tree is killed rather than resumed into the kernel's hands.
        run.tick(&script, 3.0, 2.0);
        assert!(run.sig.take().iter().all(|s| s.1 != SIG_KILL));
        let acts = run.tick(&script, 6.2, 2.0);
        assert_eq!(acts[0].0, "kill", "{acts:?}");
        assert_eq!(
            run.sig.take(),
            vec![(TRAINER, SIG_KILL), (W1, SIG_KILL), (W2, SIG_KILL)]
        );
        // The user is told why: not the grace, which had 25 s left.
        let said = run.said.join("\n");
        assert!(said.contains("no room appeared within 5.0s"), "{said}");
        assert!(!said.contains("grace"), "{said}");
    }

    #[test]
    fn a_restart_with_no_restarts_left_says_it_only_stops() {
        for (last, says) in [
            (false, "stopping the job to restart it"),
            (
                true,
                "stopping the job gracefully (SIGUSR1 to the trainer, 2.0s grace); no restart follows (--max-restarts reached)",
            ),
        ] {
            let mut c = core(Action::Restart, true);
            c.voice.quiet = false;
            let mut run = Run::new(c);
            run.last_attempt = last;
            let script = Script::new();
            run.tick(&script, 0.0, 50.0);
            let acts = run.tick(&script, 1.0, 5.0);
            assert_eq!(acts[0].0, "restart", "{acts:?}");
            let said = run.said.join("\n");
            assert!(said.ends_with(says), "{said}");
        }
    }

    #[test]
    fn on_a_node_of_several_tasks_only_the_leader_stops_and_it_names_the_grower() {
        // A member: the stop is the leader's to take.
        let mut run = Run::new(core(Action::Stop, true));
        run.node = NodeRole::Defer;
        let script = Script::new();
        run.tick(&script, 0.0, 50.0);
        let acts = run.tick(&script, 1.0, 5.0);
        assert!(acts.iter().all(|(a, _)| *a != "stop"), "{acts:?}");
        assert!(run.core.act().stop().is_none());
        // The leader: its stop names the task that grew the most.
        let mut run = Run::new(core(Action::Stop, true));
        run.node = NodeRole::Lead(Some(crate::runtime::node_group::Grower {
            task: 3,
            rank: 3,
            grew_bytes: 64 << 20,
        }));
        run.tick(&script, 0.0, 50.0);
        let acts = run.tick(&script, 1.0, 5.0);
        let stop = acts.iter().find(|(a, _)| *a == "stop").expect("a stop");
        assert!(
            stop.1
                .contains("rank 3 (task 3) grew the most on this node (64.0 MiB"),
            "{stop:?}"
        );
    }

    #[test]
    fn a_pause_that_lasts_past_max_pause_becomes_a_stop() {
        let mut c = core(Action::Pause, true);
        let mut policy = c.engine.policy().clone();
        policy.max_pause_seconds = 3.0;
        c.engine = Engine::new(policy);
        let mut run = Run::new(c);
        let script = Script::new();
        run.tick(&script, 0.0, 50.0);
        let acts = run.tick(&script, 1.0, 5.0);
        assert_eq!(acts[0].0, "pause");
        assert_eq!(
            run.sig.take(),
            vec![(TRAINER, SIG_STOP), (W1, SIG_STOP), (W2, SIG_STOP)]
        );
        run.tick(&script, 2.0, 5.0);
        run.tick(&script, 3.0, 5.0);
        assert!(run.sig.take().is_empty());
        let acts = run.tick(&script, 4.1, 5.0);
        assert_eq!(acts[0].0, "stop", "{acts:?}");
        assert!(acts[0].1.starts_with("max-pause"), "{acts:?}");
        // The paused tree runs again (none grew), so the trainer can
        // checkpoint; then it gets the checkpoint signal.
        let sent = run.sig.take();
        assert_eq!(sent.last(), Some(&(TRAINER, CKPT)), "{sent:?}");
        for pid in [TRAINER, W1, W2] {
            assert!(sent.contains(&(pid, SIG_CONT)), "{sent:?}");
        }
        assert!(run.core.act.paused().is_empty());
    }

    #[test]
    fn a_paused_process_whose_pid_was_reused_is_never_resumed() {
        let mut run = Run::new(core(Action::Pause, true));
        let mut script = Script::new();
        run.tick(&script, 0.0, 50.0);
        run.tick(&script, 1.0, 5.0);
        run.sig.take();
        // W1 died; an unrelated process got its pid.
        run.sig.dead.insert((W1, W1 as u64 * 10));
        script.start_times.push((W1, 999_999));
        run.tick(&script, 2.0, 5.0);
        // It joined the tree after the pause: paused as a new member...
        assert_eq!(run.sig.take(), vec![(W1, SIG_STOP)]);
        // ...and resumed with the rest when the rule clears; the old W1
        // identity is never signalled.
        let acts = run.tick(&script, 3.0, 40.0);
        assert_eq!(acts[0].0, "resume", "{acts:?}");
        let sent = run.sig.take();
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert!(!run.core.act.paused().contains(&(W1, W1 as u64 * 10)));
    }

    #[test]
    fn restart_is_a_stop_that_remembers_it_ends_in_a_restart() {
        let mut run = Run::new(core(Action::Restart, true));
        let script = Script::new();
        run.tick(&script, 0.0, 50.0);
        let acts = run.tick(&script, 1.0, 5.0);
        assert_eq!(acts[0].0, "restart");
        assert_eq!(run.sig.take(), vec![(TRAINER, CKPT)]);
        assert_eq!(run.core.act.policy_end(), Some(Action::Restart));
        // A new attempt starts with nothing held and the policy rearmed.
        run.core.reset();
        assert!(run.core.act.stop().is_none() && run.core.act.policy_end().is_none());
        let acts = run.tick(&script, 0.0, 5.0);
        assert_eq!(acts[0].0, "restart", "the rule fires again: {acts:?}");
    }

    #[test]
    fn warn_notifies_and_kill_is_refused_when_oomguard_did_not_launch_the_job() {
        let mut run = Run::new(core(Action::Kill, false));
        let script = Script::new();
        let acts = run.tick(&script, 0.0, 15.0);
        assert_eq!(acts[0].0, "warn");
        assert_eq!(run.notes.0.len(), 1);
        assert!(run.notes.0[0].contains("memory warning"));
        let acts = run.tick(&script, 1.0, 5.0);
        assert_eq!(acts, vec![("warn", "critical-headroom".to_string())]);
        assert!(run.sig.take().is_empty());
        assert!(run.sig.groups.is_empty());
    }

    #[test]
    fn kill_reaches_the_tree_and_the_job_group() {
        let mut run = Run::new(core(Action::Kill, true));
        let script = Script::new();
        run.tick(&script, 0.0, 50.0);
        let acts = run.tick(&script, 1.0, 5.0);
        assert_eq!(acts[0].0, "kill");
        assert_eq!(run.sig.take().len(), 3);
        assert_eq!(run.sig.groups, vec![(TRAINER, SIG_KILL)]);
        assert!(run.core.act.kill_deadline().is_some());
    }

    /// `--kill-after`: the clock starts once (a later start does not move
    /// it), a user's signal restarts it, and when it expires the kill
    /// reaches every process of the tree and the job's group, then again
    /// every 100 ms.
    #[test]
    fn kill_after_expires_and_the_kill_reaches_the_tree_and_the_group() {
        let mut run = Run::new(core(Action::Stop, true));
        let script = Script::new();
        run.tick(&script, 0.0, 50.0);
        let tree = script.sample(0.0, 50.0).procs;
        let at = |s: f64| run.t0 + Duration::from_secs_f64(s);
        let (t0, t05, t09, t15, t19, t2) = (at(0.0), at(0.5), at(0.9), at(1.5), at(1.9), at(2.0));
        let act = &mut run.core.act;
        assert!(!act.kill_due(at(100.0)), "no clock runs before a start");
        act.arm_kill_after(t0);
        act.arm_kill_after(t05);
        assert!(
            !act.kill_due(t09) && act.kill_due(at(1.0)),
            "a second start moved it"
        );
        act.rearm_kill_after(t05);
        assert!(!act.kill_due(at(1.4)) && act.kill_due(t15));
        assert!(act.kill(
            "--kill-after expired",
            &tree,
            Some(TRAINER),
            t15,
            &mut run.sig
        ));
        assert_eq!(run.sig.take().len(), tree.len());
        assert_eq!(run.sig.groups, vec![(TRAINER, SIG_KILL)]);
        assert!(!act.kill_due(at(1.59)) && act.kill_due(at(1.6)));
        let kills = act.drain();
        let logged = kills
            .iter()
            .filter(|a| matches!(a, Acted::Action { .. }))
            .count();
        assert_eq!(logged, 1, "the kill is one action");
        // A job oomguard did not launch is not killed without --allow-kill.
        let mut watch = Run::new(core(Action::Stop, false));
        watch.core.act.arm_kill_after(t0);
        assert!(watch.core.act.kill_due(t19));
        let act = &mut watch.core.act;
        assert!(!act.kill(
            "--kill-after expired",
            &tree,
            Some(TRAINER),
            t2,
            &mut watch.sig
        ));
        assert!(watch.sig.take().is_empty() && !act.kill_due(t2));
    }

    #[test]
    fn the_cadence_speeds_up_near_the_ceiling_and_while_holding() {
        let mut run = Run::new(core(Action::Pause, true));
        let script = Script::new();
        let base = Duration::from_secs(1);
        run.tick(&script, 0.0, 50.0);
        let v = run.core.history.push(&script.sample(0.5, 50.0));
        assert_eq!(run.core.cadence(&v, base), base);
        let v = run.core.history.push(&script.sample(0.6, 25.0));
        assert!(run.core.cadence(&v, base) <= Duration::from_millis(250));
        run.tick(&script, 1.0, 5.0);
        let v = run.core.history.push(&script.sample(1.1, 50.0));
        assert_eq!(
            run.core.cadence(&v, base),
            FAST,
            "a paused job is watched closely"
        );
    }

    /// A core whose actuator has a control channel in `dir`, and a way to
    /// append what the companion would write.
    fn with_companion(dir: &std::path::Path) -> (Run, std::path::PathBuf) {
        with_companion_on(dir, Action::Stop)
    }

    fn with_companion_on(dir: &std::path::Path, on_critical: Action) -> (Run, std::path::PathBuf) {
        with_companion_tuned(dir, on_critical, |_| {})
    }

    fn with_companion_tuned(
        dir: &std::path::Path,
        on_critical: Action,
        tune: impl FnOnce(&mut ActConfig),
    ) -> (Run, std::path::PathBuf) {
        let mut c = core_with(on_critical, true, tune);
        let ch = crate::vocab::companion::Channel::create(dir, 1).unwrap();
        let events = ch.dir().join("events");
        c.act.set_channel(Some(ch));
        (Run::new(c), events)
    }

    fn say_as_companion(events: &std::path::Path, line: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(events)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }

    fn request_id(events: &std::path::Path) -> u64 {
        let text = std::fs::read_to_string(events.with_file_name("request")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["kind"], "checkpoint_and_exit");
        v["id"].as_u64().unwrap()
    }

    fn request_kind(events: &std::path::Path) -> String {
        let text = std::fs::read_to_string(events.with_file_name("request")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["kind"].as_str().unwrap().to_string()
    }

    #[test]
    fn a_relieve_rule_asks_the_companion_and_never_replaces_a_checkpoint_being_served() {
        use crate::engine::policy::{Metric, Op, Rule};
        let t = tempfile::tempdir().unwrap();
        let (mut run, events) = with_companion(t.path());
        let mut policy = Policy::default_with(80.0, 92.0, Action::Stop);
        policy.rules.push(Rule::new(
            "relieve-60",
            Metric::HeadroomPercent,
            Op::Below,
            60.0,
            Action::Relieve,
        ));
        run.core.engine = Engine::new(policy);
        let script = Script::new();
        say_as_companion(
            &events,
            r#"{"type":"hello","pid":100,"rank":0,"framework":"plain"}"#,
        );
        run.tick(&script, 0.0, 70.0);
        let acts = run.tick(&script, 1.0, 50.0);
        assert_eq!(acts.len(), 1, "{acts:?}");
        assert_eq!(acts[0].0, "relieve", "{acts:?}");
        assert_eq!(request_kind(&events), "relieve");
        assert!(run.sig.take().is_empty(), "a relief signals nobody");
        // The checkpoint level: its request replaces the relief's, and a
        // relief asked while it is served does not replace it.
        let acts = run.tick(&script, 2.0, 12.0);
        assert_eq!(acts[0].0, "checkpoint", "{acts:?}");
        assert_eq!(request_kind(&events), "checkpoint");
        run.core.act.request(Action::Relieve, "again", run.t0);
        assert_eq!(request_kind(&events), "checkpoint");
    }

    #[test]
    fn with_a_companion_the_stop_asks_instead_of_signalling_and_waits_for_done() {
        let t = tempfile::tempdir().unwrap();
        let (mut run, events) = with_companion(t.path());
        let script = Script::new();
        say_as_companion(
            &events,
            r#"{"type":"hello","pid":100,"rank":0,"framework":"plain"}"#,
        );
        run.tick(&script, 0.0, 50.0);
        let acts = run.tick(&script, 1.0, 5.0);
        assert_eq!(acts[0].0, "stop", "{acts:?}");
        assert!(run.sig.take().iter().all(|s| s.1 != CKPT), "signalled");
        let id = request_id(&events);
        say_as_companion(&events, &format!(r#"{{"type":"ack","id":{id},"step":7}}"#));
        run.tick(&script, 1.5, 5.0);
        say_as_companion(
            &events,
            &format!(r#"{{"type":"done","id":{id},"step":7,"paths":["/c/7"],"ok":true}}"#),
        );
        run.tick(&script, 1.8, 5.0);
        let saved = run.core.act.companion().done.clone().unwrap();
        assert_eq!((saved.id, saved.step), (id, Some(7)));
        // The trainer has time to leave on its own: the grace (2 s) is
        // over at 3.0, and then the rest of the ladder goes on.
        assert!(run.sig.take().iter().all(|s| s.1 != SIG_TERM));
        run.tick(&script, 3.1, 5.0);
        assert!(run.sig.take().iter().any(|s| s.1 == SIG_TERM));
    }

    #[test]
    fn a_companion_of_another_protocol_is_not_asked_and_the_stop_signals() {
        let t = tempfile::tempdir().unwrap();
        let (mut run, events) = with_companion_tuned(t.path(), Action::Stop, |c| c.quiet = false);
        let script = Script::new();
        say_as_companion(
            &events,
            r#"{"type":"hello","pid":100,"rank":0,"v":2,"version":"9.0.0","path":"/venv/oomguard"}"#,
        );
        say_as_companion(&events, r#"{"type":"progress","pid":100,"step":5}"#);
        run.tick(&script, 0.0, 50.0);
        assert!(!run.core.act.companion().connected);
        assert_eq!(
            run.core.act.companion().step,
            None,
            "a foreign record was read"
        );
        let said = run.said.join("\n");
        assert!(
            said.contains("speaks protocol 2, this oomguard 1"),
            "{said}"
        );
        assert!(said.contains("/venv/oomguard"), "{said}");
        let acts = run.tick(&script, 1.0, 5.0);
        assert_eq!(acts[0].0, "stop", "{acts:?}");
        assert!(run.sig.take().contains(&(TRAINER, CKPT)), "no signal");
        assert!(!events.with_file_name("request").exists(), "asked anyway");
    }

    #[test]
    fn once_the_save_is_done_no_grower_is_held_while_the_ranks_leave() {
        let t = tempfile::tempdir().unwrap();
        let (mut run, events) = with_companion_tuned(t.path(), Action::Stop, |c| {
            c.grace = Duration::from_secs(30)
        });
        let mut script = Script::new();
        say_as_companion(&events, r#"{"type":"hello","pid":100,"rank":0}"#);
        run.tick(&script, 0.0, 50.0);
        script.grow(W1, 64 << 20);
        run.tick(&script, 1.0, 5.0);
        let mut t = 1.0;
        while t < 2.0 {
            t += 0.02;
            script.grow(W1, 1 << 20);
            run.tick(&script, t, 5.0);
        }
        assert!(
            run.sig.take().contains(&(W1, SIG_STOP)),
            "the grower is held"
        );
        let id = request_id(&events);
        say_as_companion(
            &events,
            &format!(r#"{{"type":"done","id":{id},"step":7,"paths":["/c/7"],"ok":true}}"#),
        );
        let mut after = Vec::new();
        while t < 4.0 {
            t += 0.02;
            script.grow(W1, 1 << 20);
            run.tick(&script, t, 5.0);
            after.extend(run.sig.take());
        }
        // Let go once (unless it was in its run slice), and never held again.
        assert!(!after.contains(&(W1, SIG_STOP)), "{after:?}");
        assert!(
            after.iter().filter(|s| s.1 == SIG_CONT).count() <= 1,
            "{after:?}"
        );
    }

    #[test]
    fn a_companion_that_does_not_acknowledge_gets_the_signal_after_all() {
        let t = tempfile::tempdir().unwrap();
        let (mut run, events) = with_companion(t.path());
        let script = Script::new();
        say_as_companion(&events, r#"{"type":"hello","pid":100,"rank":0}"#);
        run.tick(&script, 0.0, 50.0);
        run.tick(&script, 1.0, 5.0);
        assert!(run.sig.take().iter().all(|s| s.1 != CKPT));
        // Half the grace (1 s) without an ack: the checkpoint signal.
        run.tick(&script, 1.5, 5.0);
        assert!(run.sig.take().iter().all(|s| s.1 != CKPT));
        run.tick(&script, 2.1, 5.0);
        assert!(run.sig.take().contains(&(TRAINER, CKPT)));
        assert!(
            run.said.iter().any(|s| s.contains("did not acknowledge")),
            "{:?}",
            run.said
        );
    }

    #[test]
    fn another_nodes_request_is_joined_without_a_signal_and_names_the_node() {
        let t = tempfile::tempdir().unwrap();
        let (mut run, events) = with_companion(t.path());
        let script = Script::new();
        say_as_companion(
            &events,
            r#"{"type":"hello","pid":100,"rank":0,"world":4,"local_world":2}"#,
        );
        run.tick(&script, 0.0, 50.0);
        say_as_companion(
            &events,
            r#"{"type":"remote","id":99,"kind":"checkpoint_and_exit","node":1,"cause_rank":3,"reason":"critical-headroom","detail":"headroom 1 GiB (5.0%)"}"#,
        );
        let acts = run.tick(&script, 1.0, 60.0);
        assert_eq!(
            acts,
            vec![(
                "stop",
                "node 1 (rank 3): critical-headroom: headroom 1 GiB (5.0%)".to_string()
            )]
        );
        assert!(run.sig.take().is_empty(), "a joined stop signals nothing");
        assert_eq!(run.core.act.policy_end(), Some(Action::Stop));
        assert!(run.core.act.companion().spans_nodes());
    }

    #[test]
    fn another_nodes_restart_is_joined_as_a_restart_and_ours_says_so() {
        let t = tempfile::tempdir().unwrap();
        let (mut run, events) = with_companion(t.path());
        let script = Script::new();
        say_as_companion(
            &events,
            r#"{"type":"hello","pid":100,"rank":0,"world":4,"local_world":2}"#,
        );
        run.tick(&script, 0.0, 50.0);
        say_as_companion(
            &events,
            r#"{"type":"remote","id":99,"kind":"checkpoint_and_exit","node":1,"reason":"critical-headroom","then":"restart"}"#,
        );
        let acts = run.tick(&script, 1.0, 60.0);
        assert_eq!(acts[0].0, "restart", "{acts:?}");
        assert_eq!(run.core.act.policy_end(), Some(Action::Restart));
        // This node's own restart tells the other nodes to restart too.
        let t2 = tempfile::tempdir().unwrap();
        let (mut ours, events) = with_companion_on(t2.path(), Action::Restart);
        say_as_companion(&events, r#"{"type":"hello","pid":100,"rank":0}"#);
        ours.tick(&script, 0.0, 50.0);
        let acts = ours.tick(&script, 1.0, 5.0);
        assert_eq!(acts[0].0, "restart", "{acts:?}");
        let req: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(events.with_file_name("request")).unwrap(),
        )
        .unwrap();
        assert_eq!(req["then"], "restart");
        assert_eq!(req["kind"], "checkpoint_and_exit");
    }
}
