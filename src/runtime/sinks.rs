//! The sink fan-out: everything a run reports goes out through here, to
//! the NDJSON log, the Prometheus metrics (and their textfile), GitHub
//! Actions annotations, the dashboard, stderr and desktop notifications,
//! and into the run's totals for `run_end` and the summary.
//!
//! What happened is one stream of log events ([`Sinks::emit`]): the
//! dashboard's line, the counts, the metrics and the annotation of an event
//! are derived here from the very line the log gets, so what the user sees
//! cannot say other than what the log (and so `report` and `replay`) says.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::act::Notifier;
use crate::engine::policy::{Policy, Readings};
use crate::job::supervise;
use crate::sinks::log::quiet::{LineMark, QUIET_AFTER, QUIET_EVERY};
use crate::sinks::log::{
    ActionEvent, ActionKind, Event, LogWriter, Outcome, Peak, RuleState, RunEnd, SampleEvent,
};
use crate::sinks::tui::UiEvent;
use crate::vocab::model::{CeilingSource, CeilingState, Role, Sample, View};
use crate::vocab::units::HumanBytes;

/// Running totals for `run_end` and the summary.
#[derive(Debug, Default)]
pub struct RunStats {
    pub peak: Peak,
    /// The process holding the most PSS at the footprint's peak.
    pub peak_holder: Option<(u32, String, Role, u64)>,
    /// The footprint is the owned (or exclusive) cgroup's working set, not
    /// the PSS sum: the summary says which of the two it shows.
    pub footprint_is_working_set: bool,
    pub least_headroom: Option<CeilingState>,
    pub actions: BTreeMap<String, u32>,
    pub samples: u64,
}

pub struct Sinks {
    started: Instant,
    log: LogWriter,
    metrics: crate::sinks::metrics::Metrics,
    textfile: Option<crate::sinks::metrics::Textfile>,
    /// Set when running as a GitHub Actions step.
    annotator: Option<crate::sinks::github::Annotator>,
    /// The dashboard's state (it owns the terminal while it runs).
    app: Option<crate::sinks::tui::App>,
    notifier: Box<dyn Notifier>,
    stats: RunStats,
    /// `--interval` and `--procs-interval`: the log's cadence.
    interval: Duration,
    procs_interval: Duration,
    /// `--log-every-tick`.
    every_tick: bool,
    last_logged: Option<f64>,
    last_procs_log: Option<f64>,
    /// When (run time) the attempt's early process list is due, until it is
    /// written (see [`EARLY_PROCS_LIST`]).
    early_procs_list: Option<f64>,
    /// Unforced lines with the process list written so far.
    procs_lists: u32,
    /// Each process's private memory (USS) on the last process list, and
    /// when the attempt started: see [`MOVED_SHARE`].
    logged_uss: HashMap<u32, u64>,
    attempt_t: f64,
    /// After a list for memory that moved, one more is due then: it shows
    /// whether the memory kept moving or levelled off (the report tells a
    /// leak from a ramp by the newest readings).
    confirm_at: Option<f64>,
    /// Each process's highest RSS at any tick since its last list: lists
    /// are seconds apart, and memory gathered and freed between two of
    /// them would otherwise leave no trace of its peak.
    rss_max: HashMap<u32, u64>,
    /// What the last sample line said, and the lines left out since: a
    /// steady run writes one line in `QUIET_EVERY` (`sinks::log::quiet`).
    last_line: Option<LineMark>,
    quiet_lines: u32,
    /// Due lines this attempt (every one is written for `QUIET_AFTER`).
    attempt_lines: u32,
    /// A rule is waiting or firing: every line counts (see [`Self::set_watching`]).
    watching: bool,
    /// Stops the metrics endpoint when dropped (the runtime ending does too).
    _metrics_stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// An attempt's first process list comes at its first sample, before a
/// trainer has started its workers; the next would wait a whole
/// `--procs-interval`. One more this far into each attempt gives the report
/// every worker, and two readings of it to tell a leak from a fixed cost,
/// in attempts that end sooner (one line per attempt: the log-size bound
/// holds, see `log.rs`).
pub const EARLY_PROCS_LIST: f64 = 10.0;

/// A process list is also written when a process's private memory moved
/// this much (share of what the last list showed, and at least
/// [`MOVED_MIN_BYTES`]) since the last list: the PSS sweep renews a family
/// when its memory moves, and without a list the report would only see the
/// readings from around the fork (a worker copying its parent's pages
/// doubles its private memory without any RSS change). Spaced by at least
/// [`MOVED_SPACING`] and by a thirtieth of the attempt's age, so such lists
/// grow with the logarithm of the run's length (about 250 in a day of
/// memory that never stops moving): the log-size bound holds.
pub const MOVED_SHARE: f64 = 0.1;
pub const MOVED_MIN_BYTES: u64 = 8 << 20;
pub const MOVED_SPACING: f64 = 2.0;

impl RunStats {
    /// One tick's sample into the run's peaks and least headroom.
    pub fn record(&mut self, sample: &Sample, view: &View) {
        self.samples += 1;
        let first = self.samples == 1;
        let p = &mut self.peak;
        if sample.tree.footprint_bytes > p.footprint_bytes || first {
            p.footprint_bytes = sample.tree.footprint_bytes;
            p.footprint_t = sample.t;
            self.peak_holder = sample
                .procs
                .iter()
                .max_by_key(|p| p.pss_bytes)
                .map(|p| (p.pid, p.comm.clone(), p.role, p.pss_bytes));
        }
        if sample.tree.pss_bytes > p.tree_pss_bytes || first {
            p.tree_pss_bytes = sample.tree.pss_bytes;
            p.t = sample.t;
        }
        p.tree_rss_bytes = p.tree_rss_bytes.max(sample.tree.rss_bytes);
        p.swap_used_bytes = p.swap_used_bytes.max(sample.system.swap_used_bytes);
        let gpu: u64 = sample.gpus.iter().map(|g| g.used_bytes).sum();
        p.gpu_used_bytes = p.gpu_used_bytes.max(gpu);
        if let Some(shm) = sample.shm
            && shm.is_ceiling(sample.system.mem_total_bytes)
            && p.shm.is_none_or(|s| shm.used_bytes > s.used_bytes)
        {
            p.shm = Some(shm);
        }
        if let Some(n) = view.nearest
            && self
                .least_headroom
                .is_none_or(|l| n.headroom_bytes < l.headroom_bytes)
        {
            self.least_headroom = Some(n);
        }
    }

    /// The summary's memory lines: the peak footprint (named for what it
    /// is, the figure the ceilings were compared with), PSS and RSS as its
    /// breakdown, and the nearest ceiling.
    pub fn memory_lines(&self) -> Vec<String> {
        let p = &self.peak;
        let holder = self
            .peak_holder
            .as_ref()
            .map_or(String::new(), |(pid, comm, role, pss)| {
                format!(
                    "; largest: {comm} (pid {pid}, {}) {} PSS",
                    role.as_str(),
                    HumanBytes(*pss)
                )
            });
        let what = if self.footprint_is_working_set {
            " (the cgroup's working set)"
        } else {
            " (PSS sum)"
        };
        let breakdown = if self.footprint_is_working_set {
            format!("; peak PSS sum {}", HumanBytes(p.tree_pss_bytes))
        } else {
            String::new()
        };
        // A process that peaked between samples (a short job, a spike):
        // what the kernel recorded says more than the samples.
        let spike = if p.largest_process_rss_bytes > p.tree_rss_bytes {
            format!(
                "; one process reached {} RSS between samples (kernel high-water mark)",
                HumanBytes(p.largest_process_rss_bytes)
            )
        } else {
            String::new()
        };
        let mut lines = vec![format!(
            "peak footprint {}{what} at {:.0}s{holder}{breakdown}; peak RSS sum {}{spike}",
            HumanBytes(p.footprint_bytes),
            p.footprint_t,
            HumanBytes(p.tree_rss_bytes),
        )];
        if let Some(l) = self
            .least_headroom
            .filter(|l| l.ceiling.source == CeilingSource::Shm)
        {
            lines.push(format!(
                "nearest ceiling: /dev/shm {} (peak {} used, {:.1}% free); peak swap used {}",
                HumanBytes(l.ceiling.bytes),
                HumanBytes(l.used_bytes),
                l.headroom_percent(),
                HumanBytes(p.swap_used_bytes),
            ));
        } else if let Some(l) = self.least_headroom {
            lines.push(format!(
                "nearest ceiling: {} {} (least headroom {}, {:.1}%); peak swap used {}",
                l.ceiling.source.as_str(),
                HumanBytes(l.ceiling.bytes),
                HumanBytes(l.headroom_bytes),
                l.headroom_percent(),
                HumanBytes(p.swap_used_bytes),
            ));
            if let Some(shm) = p.shm {
                lines.push(format!(
                    "/dev/shm peak {} of {} ({:.0}%)",
                    HumanBytes(shm.used_bytes),
                    HumanBytes(shm.size_bytes),
                    shm.used_bytes as f64 / shm.size_bytes.max(1) as f64 * 100.0
                ));
            }
        }
        lines
    }
}

/// Where a run's output goes, as `setup.rs` opens it (plain data).
pub struct Outlets {
    pub log: LogWriter,
    pub metrics: crate::sinks::metrics::Metrics,
    pub textfile: Option<crate::sinks::metrics::Textfile>,
    /// Stops the metrics endpoint when dropped.
    pub metrics_stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The dashboard's state.
    pub app: Option<crate::sinks::tui::App>,
    pub notifier: Box<dyn Notifier>,
}

impl Sinks {
    /// The sinks of a run that started at `started`, logging a line per
    /// `interval` and a process list per `procs_interval` (every tick with
    /// `every_tick`); GitHub annotations when run as an Actions step.
    pub fn new(
        started: Instant,
        out: Outlets,
        interval: Duration,
        procs_interval: Duration,
        every_tick: bool,
    ) -> Self {
        Self {
            started,
            log: out.log,
            metrics: out.metrics,
            textfile: out.textfile,
            annotator: crate::sinks::github::in_github_actions(std::env::vars())
                .then(crate::sinks::github::Annotator::default),
            app: out.app,
            notifier: out.notifier,
            stats: RunStats::default(),
            interval,
            procs_interval,
            every_tick,
            last_logged: None,
            last_procs_log: None,
            early_procs_list: Some(EARLY_PROCS_LIST),
            logged_uss: HashMap::new(),
            rss_max: HashMap::new(),
            last_line: None,
            quiet_lines: 0,
            attempt_lines: 0,
            watching: false,
            attempt_t: 0.0,
            confirm_at: None,
            procs_lists: 0,
            _metrics_stop: out.metrics_stop,
        }
    }

    /// When the run started (its time 0).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// What happened, now, to every sink that shows it.
    pub fn emit(&mut self, event: &Event) {
        let t = self.log.t();
        self.emit_at(t, event);
    }

    /// What happened at run time `t`, to every sink that shows it: counted
    /// and on the metrics, on the dashboard, annotated on GitHub, and
    /// logged.
    pub fn emit_at(&mut self, t: f64, event: &Event) {
        if let Some(ui) = dashboard_event(t, event, self.log.attempt())
            && let Some(app) = self.app.as_mut()
        {
            app.on_event(ui);
        }
        match event {
            Event::Action(a) => {
                self.tally(a);
                self.annotate_action(a);
            }
            Event::RunEnd(end) => self.annotate_end(end),
            _ => {}
        }
        self.log.write_at(t, event);
    }

    /// The lines that follow belong to attempt `n`.
    pub fn set_attempt(&mut self, n: u32) {
        self.log.set_attempt(n);
    }

    /// The job's progress to the log (the next sample carries it when it
    /// `changed`), the metrics and the dashboard.
    pub fn set_progress(
        &mut self,
        current: Option<&crate::vocab::forensics::progress::Progress>,
        changed: bool,
    ) {
        self.log.set_progress(current, changed);
        self.metrics
            .set_progress(current.and_then(|p| p.step), current.and_then(|p| p.total));
        if let Some(app) = self.app.as_mut() {
            app.set_progress(current.cloned());
        }
    }

    /// A new attempt has shown no progress yet (log and metrics).
    pub fn clear_progress(&mut self) {
        self.log.set_progress(None, false);
        self.metrics.set_progress(None, None);
    }

    /// A checkpoint of `step` was saved.
    pub fn saved(&mut self, step: u64) {
        self.metrics.saved(step);
    }

    /// The dashboard's state, while the dashboard runs.
    pub fn app(&self) -> Option<&crate::sinks::tui::App> {
        self.app.as_ref()
    }

    pub fn app_mut(&mut self) -> Option<&mut crate::sinks::tui::App> {
        self.app.as_mut()
    }

    /// The dashboard closes: its state, for what it leaves behind.
    pub fn take_app(&mut self) -> Option<crate::sinks::tui::App> {
        self.app.take()
    }

    pub fn stats(&self) -> &RunStats {
        &self.stats
    }

    pub fn stats_mut(&mut self) -> &mut RunStats {
        &mut self.stats
    }

    pub fn notifier_mut(&mut self) -> &mut dyn Notifier {
        &mut *self.notifier
    }

    /// The metrics textfile, for its last write and removal.
    pub fn take_textfile(&mut self) -> Option<crate::sinks::metrics::Textfile> {
        self.textfile.take()
    }

    /// Run as a GitHub Actions step (annotations and a step summary).
    pub fn in_github_actions(&self) -> bool {
        self.annotator.is_some()
    }

    /// The next attempt starts at `t`: a line at its first sample, and its
    /// early process list.
    pub fn start_attempt(&mut self, t: f64) {
        self.last_logged = None;
        self.attempt_lines = 0;
        self.early_procs_list = Some(t + EARLY_PROCS_LIST);
        self.attempt_t = t;
    }

    fn moved_spacing(&self, t: f64) -> f64 {
        MOVED_SPACING.max((t - self.attempt_t) / 30.0)
    }

    /// Whether a process's private memory moved enough since the last list
    /// for a list of its own (see [`MOVED_SHARE`]).
    fn moved(&self, sample: &Sample) -> bool {
        let since = self.last_procs_log.map_or(f64::INFINITY, |l| sample.t - l);
        if since < self.moved_spacing(sample.t) {
            return false;
        }
        sample.procs.iter().any(|p| {
            let was = self.logged_uss.get(&p.pid).copied().unwrap_or(0);
            let d = p.uss_bytes.abs_diff(was);
            d >= MOVED_MIN_BYTES && d as f64 >= MOVED_SHARE * was as f64
        })
    }

    /// Whether a rule is waiting (`for`) or firing: the log then keeps
    /// every line, so a replay sees every reading behind a decision.
    pub fn set_watching(&mut self, watching: bool) {
        self.watching = watching;
    }

    /// A due line that says nothing new: a steady run writes one in
    /// [`QUIET_EVERY`] once past its first [`QUIET_AFTER`]. Lines a reader needs (a rule or action, a process
    /// list, moved progress, a rule waiting, `--log-every-tick`) always go.
    fn quiet(&mut self, sample: &Sample, view: &View, needed: bool) -> bool {
        let mark = LineMark::of(sample, view);
        self.attempt_lines = self.attempt_lines.saturating_add(1);
        let news = needed
            || self.attempt_lines <= QUIET_AFTER
            || self.every_tick
            || self.watching
            || self.log.progress_pending()
            || self
                .last_line
                .as_ref()
                .is_none_or(|last| mark.moved_from(last))
            || self.quiet_lines + 1 >= QUIET_EVERY;
        if news {
            self.last_line = Some(mark);
            self.quiet_lines = 0;
        } else {
            self.quiet_lines += 1;
        }
        !news
    }

    /// One tick's sample to every sink: metrics and the dashboard always,
    /// the run's peaks, and the log at its cadence (one line per
    /// `--interval`; `logged`: this tick must be logged anyway, a rule or
    /// action happened or a `for` wait changed; `force`: with the process
    /// list). `inputs`: the policy and what it saw (the inputs a replay
    /// cannot derive are logged).
    pub fn sample(
        &mut self,
        sample: &Sample,
        view: &View,
        logged: bool,
        force: bool,
        inputs: Option<(&Policy, &Readings)>,
        paused: bool,
    ) {
        // Every tick: a scrape sees the newest numbers (cheap: a copy).
        self.metrics.update(sample, view);
        if let Some(app) = self.app.as_mut() {
            app.on_sample(sample, view);
        }
        self.metrics.set_paused(paused);
        for p in &sample.procs {
            let m = self.rss_max.entry(p.pid).or_default();
            *m = (*m).max(p.rss_bytes);
        }
        self.stats.record(sample, view);
        // Fast ticks are not all logged: one line per --interval, plus
        // every tick where a rule or action happened.
        let due = self.every_tick
            || self
                .last_logged
                .is_none_or(|last| sample.t - last >= self.interval.as_secs_f64() * 0.95);
        if !(due || logged) {
            return;
        }
        self.last_logged = Some(sample.t);
        // The textfile at the log's cadence, not at every fast tick.
        if let Some(t) = &self.textfile
            && let Err(e) = t.write(&self.metrics.render())
        {
            self.say(format!("{e}; no more metrics textfile"));
            self.textfile = None;
        }
        let early = self.early_procs_list.is_some_and(|due| sample.t >= due);
        let moved = self.moved(sample);
        let confirm = self.confirm_at.is_some_and(|at| sample.t >= at);
        let with_procs = force
            || early
            || moved
            || confirm
            || self
                .last_procs_log
                .is_none_or(|last| sample.t - last >= self.procs_interval.as_secs_f64());
        if self.quiet(sample, view, logged || with_procs) {
            return;
        }
        if with_procs {
            self.last_procs_log = Some(sample.t);
            self.confirm_at = moved.then(|| sample.t + 1.5 * self.moved_spacing(sample.t));
            self.logged_uss = sample.procs.iter().map(|p| (p.pid, p.uss_bytes)).collect();
            if early {
                self.early_procs_list = None;
            }
        }
        let mut event = SampleEvent::new(sample, view, with_procs);
        if let Some(procs) = event.procs.as_mut() {
            for p in procs.iter_mut() {
                p.rss_peak_bytes = self
                    .rss_max
                    .get(&p.pid)
                    .copied()
                    .filter(|&m| m > p.rss_bytes);
            }
            self.rss_max = sample.procs.iter().map(|p| (p.pid, p.rss_bytes)).collect();
        }
        if let Some((policy, r)) = inputs {
            event = event.with_policy_inputs(policy, r, self.every_tick);
        }
        if with_procs && !force {
            // Per-GPU detail on one process list in GPU_DETAIL_EVERY.
            self.procs_lists = self.procs_lists.wrapping_add(1);
            if self.procs_lists % crate::sinks::log::GPU_DETAIL_EVERY != 1 {
                event = event.without_gpus();
            }
        }
        self.log
            .write_at(sample.t, &crate::sinks::log::Event::Sample(Box::new(event)));
    }

    /// An action into the run's counts and the metrics. A `checkpoint` or
    /// `relieve` decided with no companion to ask is logged (so a replay of
    /// the run matches it), but it did nothing to count.
    fn tally(&mut self, a: &ActionEvent) {
        if !idle(a) {
            self.count(a.action.as_str());
        }
        if matches!(
            a.action,
            ActionKind::Stop | ActionKind::Restart | ActionKind::Kill
        ) {
            self.metrics.stopped(a.action.as_str(), &a.reason);
        }
    }

    /// The actions a CI run must see, as GitHub annotations.
    fn annotate_action(&mut self, a: &ActionEvent) {
        let level = match a.action {
            ActionKind::Warn => crate::sinks::github::Level::Warning,
            ActionKind::Pause | ActionKind::Stop | ActionKind::Kill | ActionKind::Restart => {
                crate::sinks::github::Level::Error
            }
            _ => return,
        };
        let (action, reason) = (a.action, &a.reason);
        self.annotate(
            &format!("{action}:{reason}"),
            level,
            &format!("oomguard: {action}"),
            &format!("{action} ({reason})"),
        );
    }

    /// How the run ended, for CI: a memory regression past `--fail-above`
    /// and a kernel OOM kill are errors a pipeline must see.
    fn annotate_end(&mut self, end: &RunEnd) {
        use crate::sinks::github::Level;
        if let Some(limit) = end.fail_above.as_ref().filter(|f| f.exceeded) {
            let what = fail_above_verdict(&end.peak, limit.limit_bytes);
            self.annotate(
                "fail_above",
                Level::Error,
                "oomguard: memory regression",
                &what,
            );
        }
        if end.outcome == Outcome::OomKilled {
            self.annotate(
                "oom_kill",
                Level::Error,
                "oomguard: OOM kill",
                "the kernel OOM killer killed the job",
            );
        }
    }

    /// oomguard's own message: on stderr, or in the dashboard's events pane
    /// while the dashboard owns the terminal.
    pub fn say(&mut self, text: String) {
        match self.app.as_mut() {
            Some(app) => app.on_event(crate::sinks::tui::UiEvent::Note {
                t: crate::vocab::clock::since(self.started).as_secs_f64(),
                severity: crate::sinks::tui::Severity::Info,
                text,
            }),
            None => eprintln!("oomguard: {text}"),
        }
    }

    fn count(&mut self, action: &str) {
        *self.stats.actions.entry(action.to_string()).or_insert(0) += 1;
        self.metrics.action(action);
    }

    /// A few GitHub Actions annotations (rate-limited), never one per tick.
    pub fn annotate(
        &mut self,
        key: &str,
        level: crate::sinks::github::Level,
        title: &str,
        message: &str,
    ) {
        let t = self.log.t();
        if let Some(a) = self.annotator.as_mut()
            && let Some(line) = a.offer(t, key, level, title, message)
        {
            eprintln!("{line}");
        }
    }
}

/// Why `--fail-above` failed the run: the peak PSS sum, or else one
/// process's RSS high-water mark, past `limit`.
pub fn fail_above_verdict(peak: &Peak, limit: u64) -> String {
    if peak.tree_pss_bytes > limit {
        format!(
            "peak PSS sum {} exceeded --fail-above {}",
            HumanBytes(peak.tree_pss_bytes),
            HumanBytes(limit),
        )
    } else {
        format!(
            "one process reached {} RSS (the kernel's high-water mark; the samples saw a PSS sum of at most {}) and exceeded --fail-above {}",
            HumanBytes(peak.largest_process_rss_bytes),
            HumanBytes(peak.tree_pss_bytes),
            HumanBytes(limit),
        )
    }
}

/// An `action` line: what was done to which processes, with which signal.
pub fn action(
    action: ActionKind,
    reason: &str,
    pids: Vec<u32>,
    signal: Option<i32>,
    result: String,
) -> Event {
    Event::Action(ActionEvent {
        action,
        reason: reason.to_string(),
        pids,
        signal: signal.map(supervise::signal_name),
        result,
    })
}

/// A `checkpoint` or `relieve` decided with no companion to ask.
fn idle(a: &ActionEvent) -> bool {
    matches!(a.action, ActionKind::Checkpoint | ActionKind::Relieve)
        && a.result == crate::runtime::act::NO_COMPANION
}

/// The dashboard's line for a log event at `t` (in `attempt`), for the
/// events it shows.
fn dashboard_event(t: f64, event: &Event, attempt: u32) -> Option<UiEvent> {
    Some(match event {
        Event::Action(a) => {
            use crate::sinks::tui::ActionKind as Shown;
            let action = match a.action {
                _ if idle(a) => return None,
                ActionKind::Warn => Shown::Warn,
                ActionKind::Checkpoint => Shown::Checkpoint,
                ActionKind::Pause => Shown::Pause,
                ActionKind::Resume => Shown::Resume,
                ActionKind::Stop => Shown::Stop,
                ActionKind::Kill => Shown::Kill,
                ActionKind::Restart => Shown::Restart,
                ActionKind::Relieve | ActionKind::Other => return None,
            };
            UiEvent::Action {
                t,
                action,
                reason: a.reason.clone(),
                pids: a.pids.clone(),
                error: (a.result != "ok").then(|| a.result.clone()),
            }
        }
        Event::Rule(r) => {
            let (rule, metric) = (r.rule.clone(), r.metric.clone().unwrap_or_default());
            let (value, threshold) = (r.value.unwrap_or(f64::NAN), r.threshold.unwrap_or(f64::NAN));
            match r.state {
                RuleState::Firing => UiEvent::RuleFiring {
                    t,
                    rule,
                    metric,
                    value,
                    threshold,
                },
                RuleState::Cleared => UiEvent::RuleCleared {
                    t,
                    rule,
                    metric,
                    value,
                    threshold,
                },
                RuleState::Other => return None,
            }
        }
        Event::ChildExit(e) => UiEvent::ChildExit {
            t,
            pid: e.pid,
            how: match (&e.code, &e.signal) {
                (Some(c), _) => format!("exited with {c}"),
                (_, Some(s)) => format!("killed by {s}"),
                _ => String::new(),
            },
        },
        Event::Restart(r) => UiEvent::Restart {
            t,
            attempt,
            degraded: r
                .degraded
                .iter()
                .map(|(k, v)| {
                    let new = v.get(1).unwrap_or(v);
                    let new = new.as_str().map_or_else(|| new.to_string(), str::to_string);
                    (k.clone(), new)
                })
                .collect(),
        },
        Event::OomKill(k) => UiEvent::OomKill {
            t,
            pid: k.pid?,
            comm: k.comm.clone().unwrap_or_default(),
            role: k
                .role
                .as_deref()
                .and_then(|r| Role::ALL.into_iter().find(|x| x.as_str() == r)),
        },
        Event::CudaOom(e) => UiEvent::CudaOom {
            t,
            pid: e.pid,
            device: e.device,
            tried_bytes: e.tried_bytes,
        },
        Event::WorkerDied(e) => UiEvent::WorkerDied {
            t,
            pid: e.pid.unwrap_or(0),
            comm: String::new(),
            how: match (&e.signal, e.exit_code) {
                (Some(s), _) => format!("killed by {s}"),
                (None, Some(code)) => format!("exit code {code}"),
                (None, None) => "exit code unknown".to_string(),
            },
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::model::Role;
    use crate::vocab::model::testing::{bare_view as view, budget_sample, proc_sample};

    /// The summary names the figure the ceilings were compared with: in
    /// a cgroup of its own, the working set (here 300 MiB below the PSS
    /// sum, as file pages already cached make it), with PSS only as a
    /// labelled breakdown.
    #[test]
    fn the_summary_gives_the_working_set_as_the_footprint_and_pss_by_name() {
        const MIB: u64 = 1 << 20;
        let mut stats = RunStats {
            footprint_is_working_set: true,
            ..Default::default()
        };
        for (t, ws, pss) in [(1.0, 400, 700), (2.0, 716, 1018), (3.0, 650, 1100)] {
            let mut s = budget_sample(t, ws * MIB);
            s.tree.pss_bytes = pss * MIB;
            s.tree.rss_bytes = 2 * pss * MIB;
            s.procs = vec![proc_sample(7, Role::Trainer, 0)];
            stats.record(&s, &view(t));
        }
        let lines = stats.memory_lines();
        assert!(
            lines[0].starts_with("peak footprint 716 MiB (the cgroup's working set) at 2s"),
            "{lines:?}"
        );
        assert!(lines[0].contains("peak PSS sum 1.1 GiB"), "{lines:?}");
        assert_eq!(stats.peak.footprint_bytes, 716 * MIB);
        assert_eq!(stats.peak.tree_pss_bytes, 1100 * MIB);
        // PSS appears only as a labelled figure ("… PSS sum 1.1 GiB",
        // "… 0 B PSS"), never as what "footprint" names.
        for l in &lines {
            for (i, _) in l.match_indices("PSS") {
                assert!(
                    l[i..].starts_with("PSS sum ") || l[..i].ends_with("B "),
                    "{l}"
                );
            }
            assert!(!l.contains("footprint 1.1 GiB"), "{l}");
        }
        // Without a cgroup of its own the footprint is the PSS sum, said so.
        let mut plain = RunStats::default();
        plain.record(&budget_sample(1.0, 500 * MIB), &view(1.0));
        let lines = plain.memory_lines();
        assert!(
            lines[0].starts_with("peak footprint 500 MiB (PSS sum) at 1s"),
            "{lines:?}"
        );
    }

    /// The dashboard's line is made from the logged event itself: what it
    /// shows of an action, a restart, a kill or an exit is what the log
    /// (and so `report`) says of it.
    #[test]
    fn the_dashboard_shows_what_is_logged() {
        use crate::sinks::log::{ChildExit, OomKillEvent, RestartEvent};
        use crate::sinks::tui::ActionKind as Shown;
        let stop = action(
            ActionKind::Stop,
            "critical",
            vec![7, 8],
            Some(15),
            "EPERM".into(),
        );
        assert_eq!(
            dashboard_event(3.0, &stop, 1),
            Some(UiEvent::Action {
                t: 3.0,
                action: Shown::Stop,
                reason: "critical".into(),
                pids: vec![7, 8],
                error: Some("EPERM".into()),
            })
        );
        // A request with no companion to take it did nothing to show.
        let idle = action(
            ActionKind::Checkpoint,
            "eta",
            vec![],
            None,
            crate::runtime::act::NO_COMPANION.into(),
        );
        assert_eq!(dashboard_event(3.0, &idle, 1), None);
        let restart = Event::Restart(RestartEvent {
            reason: Some("oom".into()),
            checkpoint: None,
            degraded: [("NUM_WORKERS".to_string(), serde_json::json!(["4", "2"]))].into(),
            delay_seconds: None,
        });
        assert_eq!(
            dashboard_event(9.0, &restart, 2),
            Some(UiEvent::Restart {
                t: 9.0,
                attempt: 2,
                degraded: vec![("NUM_WORKERS".into(), "2".into())],
            })
        );
        let kill = |pid| {
            Event::OomKill(Box::new(OomKillEvent {
                pid,
                comm: Some("pt_data_worker".into()),
                role: Some("worker".into()),
                ..OomKillEvent::default()
            }))
        };
        assert_eq!(
            dashboard_event(5.0, &kill(Some(42)), 1),
            Some(UiEvent::OomKill {
                t: 5.0,
                pid: 42,
                comm: "pt_data_worker".into(),
                role: Some(Role::Worker),
            })
        );
        // A kill the kernel's report could not name has no process to show.
        assert_eq!(dashboard_event(5.0, &kill(None), 1), None);
        // A rule's change, with an ETA of never logged as the largest
        // number, reads as the log says.
        let cleared = Event::Rule(crate::sinks::log::RuleEvent::new(
            "eta",
            "eta_seconds",
            f64::INFINITY,
            60.0,
            false,
        ));
        let shown = dashboard_event(4.0, &cleared, 1).map(|e| crate::sinks::tui::describe(&e));
        assert_eq!(
            shown.map(|l| l.text),
            Some("eta cleared: eta never (threshold 1m 00s)".to_string())
        );
        let exit = Event::ChildExit(ChildExit {
            pid: 10,
            code: None,
            signal: Some("SIGKILL".into()),
        });
        assert_eq!(
            dashboard_event(6.0, &exit, 1),
            Some(UiEvent::ChildExit {
                t: 6.0,
                pid: 10,
                how: "killed by SIGKILL".into(),
            })
        );
    }

    /// One `emit` reaches the log and the run's counts (the summary's
    /// actions), and a request that did nothing is logged, not counted.
    #[test]
    fn an_emitted_action_is_logged_and_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.ndjson");
        let mut s = sinks(&path, false);
        s.emit(&action(
            ActionKind::Stop,
            "critical",
            vec![7],
            Some(15),
            "ok".into(),
        ));
        let idle = crate::runtime::act::NO_COMPANION.to_string();
        s.emit(&action(ActionKind::Checkpoint, "eta", vec![], None, idle));
        assert_eq!(s.stats().actions.get("stop"), Some(&1));
        assert_eq!(s.stats().actions.get("checkpoint"), None);
        // With the dashboard: the same emit is its line too.
        s.app = Some(crate::sinks::tui::App::new("train".into()));
        s.emit(&action(
            ActionKind::Kill,
            "last resort",
            vec![7],
            Some(9),
            "ok".into(),
        ));
        let shown: Vec<String> = s.app().unwrap().events().map(|l| l.text.clone()).collect();
        assert_eq!(shown.len(), 1, "{shown:?}");
        assert!(shown[0].starts_with("kill (last resort)"), "{shown:?}");
        let text = std::fs::read_to_string(&path).unwrap();
        let actions: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(r#""event":"action""#))
            .collect();
        assert_eq!(actions.len(), 3, "{text}");
        assert!(actions[0].contains(r#""signal":"SIGTERM""#), "{text}");
    }

    struct Quiet;

    impl Notifier for Quiet {
        fn notify(&mut self, _summary: String, _body: String) {}
    }

    fn sinks(log: &std::path::Path, every_tick: bool) -> Sinks {
        sinks_listing(log, every_tick, Duration::from_secs(5))
    }

    fn sinks_listing(log: &std::path::Path, every_tick: bool, procs: Duration) -> Sinks {
        let started = Instant::now();
        let out = Outlets {
            log: LogWriter::create(log, started).unwrap(),
            metrics: crate::sinks::metrics::Metrics::new(Default::default(), "test"),
            textfile: None,
            metrics_stop: None,
            app: None,
            notifier: Box::new(Quiet),
        };
        let mut s = Sinks::new(started, out, Duration::from_secs(1), procs, every_tick);
        // Not a GitHub Actions step, wherever the tests run.
        s.annotator = None;
        s
    }

    fn sample(t: f64, uss: u64) -> Sample {
        let mut s = budget_sample(t, 100 << 20);
        s.procs = vec![proc_sample(7, Role::Trainer, uss)];
        s
    }

    /// `(t, with a process list)` of every sample line written.
    fn lines(log: &std::path::Path) -> Vec<(f64, bool)> {
        std::fs::read_to_string(log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["event"] == "sample")
            .map(|v| (v["t"].as_f64().unwrap(), v.get("procs").is_some()))
            .collect()
    }

    /// Near a ceiling (an ETA of a minute): no line is a quiet one.
    fn near(t: f64) -> View {
        View {
            eta_seconds: Some(60.0),
            ..view(t)
        }
    }

    /// Fast ticks (every 100 ms, as near a ceiling) are logged once per
    /// `--interval`, each tick where something happened is logged, and
    /// the process list comes at the first line, every
    /// `--procs-interval`, at the early list, when forced and when a
    /// process's memory moved; `--log-every-tick` logs every tick.
    #[test]
    fn sample_lines_keep_their_cadence_through_fast_ticks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.ndjson");
        let mut s = sinks(&path, false);
        s.start_attempt(0.0);
        let mib = 1u64 << 20;
        for i in 0..=120 {
            let t = f64::from(i) / 10.0;
            s.sample(&sample(t, 500 * mib), &near(t), false, false, None, false);
        }
        let got = lines(&path);
        let times: Vec<f64> = got.iter().map(|l| l.0).collect();
        let want: Vec<f64> = (0..=12).map(f64::from).collect();
        assert_eq!(times, want, "one line per --interval");
        let listed: Vec<f64> = got.iter().filter(|l| l.1).map(|l| l.0).collect();
        // The first list: a process new to the lists counts as moved, so a
        // confirming list follows 1.5 spacings later (3 s); the next comes
        // a --procs-interval after that (8 s), and the early list at 10 s.
        assert_eq!(listed, vec![0.0, 3.0, 8.0, 10.0]);
        // A rule fired: logged though not due; forced: with the list.
        s.sample(
            &sample(12.05, 500 * mib),
            &near(12.05),
            true,
            false,
            None,
            false,
        );
        s.sample(
            &sample(12.1, 500 * mib),
            &near(12.1),
            true,
            true,
            None,
            false,
        );
        // Memory that moved 10 % and 8 MiB earns a list of its own, once
        // two seconds passed since the last list.
        s.sample(
            &sample(13.2, 600 * mib),
            &near(13.2),
            false,
            false,
            None,
            false,
        );
        s.sample(
            &sample(14.2, 600 * mib),
            &near(14.2),
            false,
            false,
            None,
            false,
        );
        s.sample(
            &sample(15.2, 700 * mib),
            &near(15.2),
            false,
            false,
            None,
            false,
        );
        let got = lines(&path);
        let tail = [
            (12.05, false),
            (12.1, true),
            (13.2, false),
            (14.2, true),
            (15.2, false),
        ];
        assert_eq!(&got[13..], &tail);
        assert_eq!(s.stats.samples, 126, "every tick reaches the run's totals");

        let every = dir.path().join("every.ndjson");
        let mut s = sinks(&every, true);
        s.start_attempt(0.0);
        for i in 0..20 {
            let t = f64::from(i) / 20.0;
            s.sample(&sample(t, 500 * mib), &view(t), false, false, None, false);
        }
        assert_eq!(lines(&every).len(), 20, "--log-every-tick logs every tick");
    }

    /// A steady node (a parent and 40 workers of 20 MiB, nothing moving)
    /// for a day at defaults: after ten minutes one line in ten, the process list every
    /// minute, at most 25 MB (#49). Memory that moves is written every
    /// interval again, and a rule waiting keeps every line.
    #[test]
    fn a_day_of_a_steady_41_process_node_fits_in_25_mb() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("day.ndjson");
        let mut s = sinks_listing(&path, false, Duration::from_secs(60));
        s.start_attempt(0.0);
        let mib = 1u64 << 20;
        let steady = |t: f64, extra: u64| {
            let mut x = budget_sample(t, 0);
            x.budget_bytes = Some(16 << 30);
            x.procs = (0..41u32)
                .map(|i| {
                    let role = if i == 0 { Role::Trainer } else { Role::Worker };
                    let mut p = proc_sample(1_000_000 + i, role, 20 * mib + extra);
                    p.comm = "pt_data_worker".into();
                    p.ppid = if i == 0 { 999_999 } else { 1_000_000 };
                    p.pss_bytes = 12 * mib + 345_678 + extra;
                    p
                })
                .collect();
            x.tree.procs = 41;
            x.tree.footprint_bytes = x.procs.iter().map(|p| p.pss_bytes).sum();
            x.tree.pss_bytes = x.tree.footprint_bytes;
            x.tree.rss_bytes = x.procs.iter().map(|p| p.rss_bytes).sum();
            x.psi = Some(crate::vocab::model::Psi {
                some_avg10: 0.0,
                full_avg10: 0.0,
            });
            // A DataLoader's batches in flight through a 64 MiB /dev/shm.
            x.shm = Some(crate::vocab::model::ShmSample {
                size_bytes: 64 * mib,
                used_bytes: 24 * mib + u64::from(extra > 0) * 4096,
            });
            x
        };
        let day = 86_400;
        for i in 0..day {
            let t = f64::from(i);
            // A few pages of jitter, as a real tree shows.
            s.sample(
                &steady(t, u64::from(i % 7) * 4096),
                &view(t),
                false,
                false,
                None,
                false,
            );
        }
        let got = lines(&path);
        let bytes = std::fs::metadata(&path).unwrap().len();
        let lists = got.iter().filter(|l| l.1).count();
        eprintln!(
            "a steady day: {} lines, {lists} with the process list, {:.1} MB",
            got.len(),
            bytes as f64 / 1e6
        );
        assert!(bytes <= 25_000_000, "{bytes} bytes");
        assert!(
            got.len() <= day as usize / 10 + lists,
            "{} lines",
            got.len()
        );
        assert!((1440..1450).contains(&lists), "{lists} lists");
        // No gap longer than ten intervals.
        assert!(got.windows(2).all(|w| w[1].0 - w[0].0 <= 10.0));

        // Moving memory: a line every interval again.
        let before = lines(&path).len();
        for i in 0..20u32 {
            let t = f64::from(day + i);
            s.sample(
                &steady(t, u64::from(i) * 8 * mib),
                &view(t),
                false,
                false,
                None,
                false,
            );
        }
        assert_eq!(lines(&path).len() - before, 20, "every moving line");
        // A rule waiting: every line though nothing moves.
        s.set_watching(true);
        let before = lines(&path).len();
        for i in 20..30u32 {
            let t = f64::from(day + i);
            s.sample(&steady(t, 152 * mib), &view(t), false, false, None, false);
        }
        assert_eq!(
            lines(&path).len() - before,
            10,
            "every line while a rule waits"
        );
    }
}
