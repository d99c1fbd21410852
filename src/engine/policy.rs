//! The policy engine: rules over the derived view, and the decisions they
//! lead to. Pure: samples in, decisions out. No clock (time is `Sample::t`),
//! no I/O, no processes — so every behaviour is unit-tested with hand-made
//! sequences.
//!
//! A rule has a metric, a comparison, a threshold, how long the condition
//! must hold (`for`), the level at which it clears again (hysteresis), a
//! cooldown between repeated actions, and an action. When several rules
//! fire, the strongest action wins (kill > stop/restart > pause > warn).
//! A pause never lasts longer than `max_pause`: then the critical action
//! runs.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::vocab::model::{GpuSample, Psi, Sample, SystemSample, View};

/// What a rule looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Headroom under the nearest ceiling, in % of that ceiling.
    HeadroomPercent,
    /// Headroom under the nearest ceiling, in bytes.
    HeadroomBytes,
    /// The job's footprint, the figure compared with the ceilings: the
    /// owned cgroup's working set, or else the PSS sum.
    Footprint,
    /// The PSS sum over the job's tree.
    TreePss,
    /// Machine swap in use, bytes.
    SwapUsed,
    /// Swap-in rate, bytes/s: the early warning nobody watches.
    SwapInRate,
    /// PSI memory `some` avg10, %.
    PsiSome,
    /// PSI memory `full` avg10, %.
    PsiFull,
    /// Seconds until headroom is 0 at the current growth (∞ when flat).
    Eta,
    /// Growth of the fastest-growing process, bytes/s.
    FastestGrowth,
    /// The fullest GPU's memory in use, % of its total.
    GpuUsedPercent,
    /// Seconds until the fullest GPU runs out at its current growth.
    GpuEta,
    /// PyTorch reserved − allocated on the worst device, bytes.
    TorchFragmentation,
}

impl Metric {
    pub const ALL: [Metric; 13] = [
        Metric::HeadroomPercent,
        Metric::HeadroomBytes,
        Metric::Footprint,
        Metric::TreePss,
        Metric::SwapUsed,
        Metric::SwapInRate,
        Metric::PsiSome,
        Metric::PsiFull,
        Metric::Eta,
        Metric::FastestGrowth,
        Metric::GpuUsedPercent,
        Metric::GpuEta,
        Metric::TorchFragmentation,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::HeadroomPercent => "headroom_percent",
            Metric::HeadroomBytes => "headroom_bytes",
            Metric::Footprint => "footprint",
            Metric::TreePss => "tree_pss",
            Metric::SwapUsed => "swap_used",
            Metric::SwapInRate => "swap_in_rate",
            Metric::PsiSome => "psi_some",
            Metric::PsiFull => "psi_full",
            Metric::Eta => "eta",
            Metric::FastestGrowth => "fastest_growth",
            Metric::GpuUsedPercent => "gpu_used_percent",
            Metric::GpuEta => "gpu_eta",
            Metric::TorchFragmentation => "torch_fragmentation",
        }
    }

    pub fn from_name(s: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == s)
    }

    /// Whether the metric is a GPU metric (GPU pressure is not a kernel OOM).
    pub fn is_gpu(self) -> bool {
        matches!(
            self,
            Metric::GpuUsedPercent | Metric::GpuEta | Metric::TorchFragmentation
        )
    }
}

/// What to do when a rule fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Warn,
    /// Ask the trainer's companion to free what it can (Python's garbage,
    /// the C heap, PyTorch's CUDA cache); training goes on. Only for a
    /// user's rule: the default ladder does not use it (freeing caches does
    /// not stop a leak, and a request replaces the last one).
    Relieve,
    /// Ask the trainer's companion for a checkpoint; training goes on.
    Checkpoint,
    Pause,
    Restart,
    Stop,
    Kill,
}

impl Action {
    pub const NAMES: &'static str = "warn, relieve, checkpoint, pause, stop, kill, restart";

    pub fn name(self) -> &'static str {
        match self {
            Action::Warn => "warn",
            Action::Relieve => "relieve",
            Action::Checkpoint => "checkpoint",
            Action::Pause => "pause",
            Action::Restart => "restart",
            Action::Stop => "stop",
            Action::Kill => "kill",
        }
    }

    pub fn from_name(s: &str) -> Option<Action> {
        [
            Action::Warn,
            Action::Relieve,
            Action::Checkpoint,
            Action::Pause,
            Action::Restart,
            Action::Stop,
            Action::Kill,
        ]
        .into_iter()
        .find(|a| a.name() == s)
    }

    /// Ordering for "the strongest action wins".
    fn strength(self) -> u8 {
        match self {
            Action::Warn => 0,
            Action::Relieve => 1,
            Action::Checkpoint => 2,
            Action::Pause => 3,
            Action::Restart | Action::Stop => 4,
            Action::Kill => 5,
        }
    }

    /// Actions that end the attempt.
    pub fn is_critical(self) -> bool {
        self.strength() >= 4
    }

    /// Actions that only ask or tell (the job runs on untouched).
    pub fn is_advisory(self) -> bool {
        self.strength() <= 2
    }

    /// Requests to the companion (nothing is sent without one).
    pub fn is_request(self) -> bool {
        matches!(self, Action::Relieve | Action::Checkpoint)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The comparison of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Below,
    Above,
}

impl Op {
    fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Op::Below => value < threshold,
            Op::Above => value > threshold,
        }
    }
}

/// An extra condition that must also hold (e.g. "ETA < 10 s *and* headroom
/// < 50 %", so a burst at start-up with plenty of room does not stop a job).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Guard {
    pub metric: Metric,
    pub op: Op,
    pub threshold: f64,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    pub name: String,
    pub metric: Metric,
    pub op: Op,
    pub threshold: f64,
    /// Seconds the condition must hold before the rule fires.
    pub for_seconds: f64,
    /// The level at which a firing rule clears (hysteresis).
    pub clear: f64,
    /// Seconds before the action may run again after it ran.
    pub cooldown_seconds: f64,
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub also: Option<Guard>,
    /// A command to run when this rule's action runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<String>,
}

impl Rule {
    /// A rule with a default hysteresis: a 25 % margin on the threshold.
    pub fn new(name: &str, metric: Metric, op: Op, threshold: f64, action: Action) -> Self {
        let margin = threshold.abs() * 0.25;
        let clear = match op {
            Op::Below => threshold + margin,
            Op::Above => threshold - margin,
        };
        Self {
            name: name.to_string(),
            metric,
            op,
            threshold,
            for_seconds: 0.0,
            clear,
            cooldown_seconds: if action == Action::Warn { 300.0 } else { 0.0 },
            action,
            also: None,
            hook: None,
        }
    }

    fn cleared_by(&self, value: f64) -> bool {
        match self.op {
            Op::Below => value >= self.clear,
            Op::Above => value <= self.clear,
        }
    }
}

/// The policy: rules plus the pause limit and what follows an over-long
/// pause.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub max_pause_seconds: f64,
    /// What runs when a pause exceeds `max_pause_seconds`.
    pub after_pause: Action,
}

impl Policy {
    /// No rules: only observe.
    pub fn none() -> Self {
        Self {
            rules: Vec::new(),
            max_pause_seconds: 600.0,
            after_pause: Action::Stop,
        }
    }

    /// The default, safe for an unattended overnight run: warn under 20 %
    /// headroom; critical (`on_critical`) under 8 %, or when the ETA has
    /// been under 10 s for 2 s while less than 30 % headroom is left (with
    /// more room than that, a fast rise is usually a checkpoint or dataset
    /// being loaded, and the 8 % rule plus fast polling still catch a leak).
    pub fn default_with(
        warn_used_percent: f64,
        critical_used_percent: f64,
        on_critical: Action,
    ) -> Self {
        let warn = 100.0 - warn_used_percent;
        let crit = 100.0 - critical_used_percent;
        let mut eta = Rule::new("critical-eta", Metric::Eta, Op::Below, 10.0, on_critical);
        eta.clear = 30.0;
        eta.for_seconds = 2.0;
        eta.also = Some(Guard {
            metric: Metric::HeadroomPercent,
            op: Op::Below,
            threshold: 30.0,
        });
        let mut warn_rule = Rule::new(
            "warn-headroom",
            Metric::HeadroomPercent,
            Op::Below,
            warn,
            Action::Warn,
        );
        warn_rule.clear = (warn + 5.0).min(100.0);
        let mut crit_rule = Rule::new(
            "critical-headroom",
            Metric::HeadroomPercent,
            Op::Below,
            crit,
            on_critical,
        );
        crit_rule.clear = (crit + 4.0).min(100.0);
        let mut gpu = Rule::new(
            "warn-gpu",
            Metric::GpuUsedPercent,
            Op::Above,
            95.0,
            Action::Warn,
        );
        gpu.clear = 90.0;
        // Between the warning and the stop: a checkpoint now, so a stop (or
        // the kernel) that follows loses little. A job without a companion
        // gets nothing from it (the rule fires, nothing is sent).
        let ckpt_level = (warn + crit) / 2.0;
        let mut ckpt = Rule::new(
            "checkpoint-headroom",
            Metric::HeadroomPercent,
            Op::Below,
            ckpt_level,
            Action::Checkpoint,
        );
        ckpt.clear = warn.min(100.0);
        ckpt.cooldown_seconds = 300.0;
        Self {
            rules: vec![warn_rule, ckpt, crit_rule, eta, gpu],
            max_pause_seconds: 600.0,
            after_pause: if on_critical == Action::Pause {
                Action::Stop
            } else {
                on_critical
            },
        }
    }

    /// The headroom-% thresholds of the first warn and first critical rule
    /// (for gauges and reports).
    pub fn thresholds(&self) -> (Option<f64>, Option<f64>) {
        let pick = |crit: bool| {
            self.rules
                .iter()
                .find(|r| {
                    r.metric == Metric::HeadroomPercent
                        && r.op == Op::Below
                        && !(crit && r.action.is_request())
                        && (r.action != Action::Warn) == crit
                })
                .map(|r| r.threshold)
        };
        (pick(false), pick(true))
    }
}

/// The unit a metric's values are in.
pub fn unit(m: Metric) -> &'static str {
    match m {
        Metric::HeadroomPercent | Metric::PsiSome | Metric::PsiFull | Metric::GpuUsedPercent => {
            "percent"
        }
        Metric::HeadroomBytes
        | Metric::Footprint
        | Metric::TreePss
        | Metric::SwapUsed
        | Metric::TorchFragmentation => "bytes",
        Metric::SwapInRate | Metric::FastestGrowth => "bytes_per_second",
        Metric::Eta | Metric::GpuEta => "seconds",
    }
}

/// The metric values of one tick. `None` means "not known this tick" (no
/// cgroup, no GPU, a failed read): a rule never fires *or* clears on a
/// missing value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Readings {
    pub t: f64,
    pub values: [Option<f64>; Metric::ALL.len()],
}

impl Readings {
    pub fn get(&self, m: Metric) -> Option<f64> {
        self.values[m as usize]
    }

    pub fn set(&mut self, m: Metric, v: Option<f64>) {
        self.values[m as usize] = v;
    }

    /// Extracts every metric from a sample and its view.
    pub fn from_sample(
        sample: &Sample,
        view: &View,
        gpu_eta: Option<f64>,
        frag: Option<f64>,
    ) -> Self {
        Self::from_inputs(&Inputs {
            t: sample.t,
            headroom_percent: view.headroom_percent(),
            headroom_bytes: view.headroom_bytes(),
            footprint_bytes: sample.tree.footprint_bytes,
            pss_bytes: sample.tree.pss_bytes,
            system: &sample.system,
            psi: sample.psi,
            has_ceiling: view.nearest.is_some(),
            eta_seconds: view.eta_seconds,
            fastest_growth: Some(view.fastest.map_or(0.0, |(_, rate)| rate)),
            gpus: &sample.gpus,
            gpu_eta,
            frag,
        })
    }

    /// Every metric from its inputs, however they were gathered (a live
    /// tick, or a logged sample in `oomguard replay`).
    pub fn from_inputs(i: &Inputs<'_>) -> Self {
        let mut r = Readings {
            t: i.t,
            ..Default::default()
        };
        r.set(Metric::HeadroomPercent, i.headroom_percent);
        r.set(Metric::HeadroomBytes, i.headroom_bytes.map(|b| b as f64));
        r.set(Metric::Footprint, Some(i.footprint_bytes as f64));
        r.set(Metric::TreePss, Some(i.pss_bytes as f64));
        let sys_known = i.system.mem_total_bytes > 0;
        r.set(
            Metric::SwapUsed,
            sys_known.then_some(i.system.swap_used_bytes as f64),
        );
        r.set(
            Metric::SwapInRate,
            sys_known.then_some(i.system.swap_in_bytes_per_s),
        );
        r.set(Metric::PsiSome, i.psi.map(|p| p.some_avg10));
        r.set(Metric::PsiFull, i.psi.map(|p| p.full_avg10));
        // Flat memory: the ETA is infinite, which is a value, not unknown.
        r.set(
            Metric::Eta,
            i.has_ceiling
                .then(|| i.eta_seconds.unwrap_or(f64::INFINITY)),
        );
        r.set(Metric::FastestGrowth, i.fastest_growth);
        let gpu_pct = i
            .gpus
            .iter()
            .filter(|g| g.total_bytes > 0)
            .map(|g| g.used_bytes as f64 / g.total_bytes as f64 * 100.0)
            .max_by(f64::total_cmp);
        r.set(Metric::GpuUsedPercent, gpu_pct);
        r.set(
            Metric::GpuEta,
            gpu_pct.map(|_| i.gpu_eta.unwrap_or(f64::INFINITY)),
        );
        r.set(Metric::TorchFragmentation, i.frag);
        r
    }
}

/// What the engine reads, before it becomes `Readings`.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub t: f64,
    pub headroom_percent: Option<f64>,
    pub headroom_bytes: Option<u64>,
    pub footprint_bytes: u64,
    pub pss_bytes: u64,
    pub system: &'a SystemSample,
    pub psi: Option<Psi>,
    /// A ceiling is known (the ETA means something).
    pub has_ceiling: bool,
    pub eta_seconds: Option<f64>,
    pub fastest_growth: Option<f64>,
    pub gpus: &'a [GpuSample],
    pub gpu_eta: Option<f64>,
    pub frag: Option<f64>,
}

/// What the engine wants done.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A rule changed state (for the `rule` log event).
    Rule {
        rule: String,
        metric: Metric,
        value: f64,
        threshold: f64,
        firing: bool,
    },
    /// Run an action because of `reason` (a rule name, or `max-pause`).
    Act {
        action: Action,
        reason: String,
        hook: Option<String>,
    },
    /// The pause is over: the rule that caused it cleared.
    Resume { reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Idle,
    Pending { since: f64 },
    Firing,
}

#[derive(Debug, Clone)]
struct RuleState {
    state: State,
    last_action: Option<f64>,
}

/// Runs the rules over successive readings.
#[derive(Debug, Clone)]
pub struct Engine {
    policy: Policy,
    states: Vec<RuleState>,
    last_t: Option<f64>,
    /// When the current pause began, and which rule caused it.
    paused: Option<(f64, String)>,
    /// A critical action was decided: the attempt is ending.
    ended: bool,
    /// How often a rule with a `for` started or stopped waiting it out.
    pending_changes: u64,
}

impl Engine {
    pub fn new(policy: Policy) -> Self {
        let states = policy
            .rules
            .iter()
            .map(|_| RuleState {
                state: State::Idle,
                last_action: None,
            })
            .collect();
        Self {
            policy,
            states,
            last_t: None,
            paused: None,
            ended: false,
            pending_changes: 0,
        }
    }

    /// Counts every start and end of a rule's `for` wait. A tick that
    /// changes it is logged, so a replay starts the wait at the same
    /// sample the run did.
    /// A rule that only warns or asks (warn, relieve, checkpoint) is
    /// firing now: the dashboard's WARNING state.
    pub fn warning(&self) -> bool {
        self.policy
            .rules
            .iter()
            .zip(&self.states)
            .any(|(r, s)| r.action.is_advisory() && matches!(s.state, State::Firing))
    }

    /// Some rule is waiting out its `for` or firing.
    pub fn watching(&self) -> bool {
        self.states.iter().any(|s| !matches!(s.state, State::Idle))
    }

    pub fn pending_changes(&self) -> u64 {
        self.pending_changes
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn paused(&self) -> bool {
        self.paused.is_some()
    }

    /// Starts over for a new attempt (rules back to idle).
    pub fn reset(&mut self) {
        *self = Engine::new(self.policy.clone());
    }

    /// Tells the engine a pause was lifted from outside (a key press).
    pub fn resumed_externally(&mut self) {
        self.paused = None;
    }

    /// Tells the engine a pause was started from outside (a key press).
    pub fn paused_externally(&mut self, t: f64) {
        self.paused.get_or_insert((t, "manual".into()));
    }

    /// One tick: readings in, decisions out.
    pub fn step(&mut self, r: &Readings) -> Vec<Decision> {
        let mut out = Vec::new();
        // Stale or replayed data (time not moving forward) decides nothing.
        if self.ended || self.last_t.is_some_and(|last| r.t <= last) {
            return out;
        }
        self.last_t = Some(r.t);
        let mut wanted: Option<(Action, String, Option<String>)> = None;
        for (rule, st) in self.policy.rules.iter().zip(self.states.iter_mut()) {
            let Some(value) = r.get(rule.metric) else {
                continue;
            };
            let guard_ok = match rule.also {
                None => Some(true),
                Some(g) => r.get(g.metric).map(|v| g.op.holds(v, g.threshold)),
            };
            let Some(guard_ok) = guard_ok else { continue };
            let holds = guard_ok && rule.op.holds(value, rule.threshold);
            let waits = rule.for_seconds > 0.0;
            match st.state {
                State::Pending { .. } if !holds => {
                    st.state = State::Idle;
                    self.pending_changes += u64::from(waits);
                }
                State::Idle if holds => {
                    st.state = State::Pending { since: r.t };
                    self.pending_changes += u64::from(waits);
                }
                State::Idle | State::Pending { .. } | State::Firing => {}
            }
            if let State::Pending { since } = st.state
                && r.t - since >= rule.for_seconds
            {
                st.state = State::Firing;
                out.push(Decision::Rule {
                    rule: rule.name.clone(),
                    metric: rule.metric,
                    value,
                    threshold: rule.threshold,
                    firing: true,
                });
                let cooled = st
                    .last_action
                    .is_none_or(|last| r.t - last >= rule.cooldown_seconds);
                if cooled
                    && wanted
                        .as_ref()
                        .is_none_or(|(a, _, _)| rule.action.strength() > a.strength())
                {
                    wanted = Some((rule.action, rule.name.clone(), rule.hook.clone()));
                }
            } else if st.state == State::Firing && rule.cleared_by(value) {
                st.state = State::Idle;
                out.push(Decision::Rule {
                    rule: rule.name.clone(),
                    metric: rule.metric,
                    value,
                    threshold: rule.threshold,
                    firing: false,
                });
                if self
                    .paused
                    .as_ref()
                    .is_some_and(|(_, why)| *why == rule.name)
                {
                    self.paused = None;
                    out.push(Decision::Resume {
                        reason: rule.name.clone(),
                    });
                }
            }
        }
        if let Some((since, why)) = &self.paused
            && r.t - since >= self.policy.max_pause_seconds
            && wanted.as_ref().is_none_or(|(a, _, _)| !a.is_critical())
        {
            let reason = format!("max-pause ({why})");
            wanted = Some((self.policy.after_pause, reason, None));
        }
        if let Some((action, reason, hook)) = wanted {
            if action == Action::Pause && self.paused.is_some() {
                return out;
            }
            for (rule, st) in self.policy.rules.iter().zip(self.states.iter_mut()) {
                if rule.name == reason {
                    st.last_action = Some(r.t);
                }
            }
            match action {
                Action::Pause => self.paused = Some((r.t, reason.clone())),
                a if a.is_critical() => {
                    self.ended = true;
                    self.paused = None;
                }
                _ => {}
            }
            out.push(Decision::Act {
                action,
                reason,
                hook,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: f64, headroom: f64) -> Readings {
        let mut r = Readings {
            t,
            ..Default::default()
        };
        r.set(Metric::HeadroomPercent, Some(headroom));
        r.set(Metric::Eta, Some(f64::INFINITY));
        r
    }

    fn acts(d: &[Decision]) -> Vec<(Action, String)> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Act { action, reason, .. } => Some((*action, reason.clone())),
                _ => None,
            })
            .collect()
    }

    fn warn_rule() -> Policy {
        let mut r = Rule::new("w", Metric::HeadroomPercent, Op::Below, 20.0, Action::Warn);
        r.clear = 25.0;
        r.cooldown_seconds = 10.0;
        Policy {
            rules: vec![r],
            max_pause_seconds: 600.0,
            after_pause: Action::Stop,
        }
    }

    #[test]
    fn the_warning_state_lasts_while_a_warn_rule_fires() {
        let mut e = Engine::new(warn_rule());
        e.step(&at(1.0, 50.0));
        assert!(!e.warning());
        e.step(&at(2.0, 15.0));
        assert!(e.warning(), "fired");
        e.step(&at(3.0, 22.0));
        assert!(e.warning(), "not yet cleared (clears at 25 %)");
        e.step(&at(4.0, 30.0));
        assert!(!e.warning(), "cleared");
        // A stop is not a warning.
        let mut stop = warn_rule();
        stop.rules[0].action = Action::Stop;
        let mut e = Engine::new(stop);
        e.step(&at(1.0, 15.0));
        assert!(!e.warning());
    }

    #[test]
    fn waits_are_counted_so_the_loop_can_log_them() {
        let mut p = Policy::none();
        let mut rule = Rule::new(
            "slow",
            Metric::HeadroomPercent,
            Op::Below,
            10.0,
            Action::Warn,
        );
        rule.for_seconds = 2.0;
        p.rules.push(rule);
        p.rules.push(Rule::new(
            "instant",
            Metric::HeadroomPercent,
            Op::Below,
            5.0,
            Action::Warn,
        ));
        let mut e = Engine::new(p);
        e.step(&at(1.0, 50.0));
        assert_eq!(e.pending_changes(), 0);
        e.step(&at(2.0, 8.0));
        assert_eq!(e.pending_changes(), 1, "the wait began");
        e.step(&at(3.0, 50.0));
        assert_eq!(e.pending_changes(), 2, "the wait ended");
        e.step(&at(4.0, 4.0));
        assert_eq!(
            e.pending_changes(),
            3,
            "a rule without `for` does not count"
        );
    }

    #[test]
    fn fires_once_and_clears_with_hysteresis() {
        let mut e = Engine::new(warn_rule());
        assert!(e.step(&at(0.0, 50.0)).is_empty());
        let d = e.step(&at(1.0, 19.0));
        assert_eq!(acts(&d), vec![(Action::Warn, "w".into())]);
        assert!(matches!(d[0], Decision::Rule { firing: true, .. }));
        // Still below: no repeat. Between threshold and clear: still firing.
        assert!(e.step(&at(2.0, 15.0)).is_empty());
        assert!(e.step(&at(3.0, 22.0)).is_empty());
        let d = e.step(&at(4.0, 26.0));
        assert!(matches!(d[0], Decision::Rule { firing: false, .. }));
        assert!(acts(&d).is_empty());
    }

    #[test]
    fn sustain_requires_the_condition_to_hold() {
        let mut p = warn_rule();
        p.rules[0].for_seconds = 3.0;
        let mut e = Engine::new(p);
        assert!(e.step(&at(0.0, 10.0)).is_empty());
        assert!(e.step(&at(2.0, 10.0)).is_empty());
        // Interrupted: the clock starts again.
        assert!(e.step(&at(2.5, 30.0)).is_empty());
        assert!(e.step(&at(3.0, 10.0)).is_empty());
        assert!(e.step(&at(5.9, 10.0)).is_empty());
        assert_eq!(acts(&e.step(&at(6.0, 10.0))).len(), 1);
    }

    #[test]
    fn cooldown_limits_repeats() {
        let mut e = Engine::new(warn_rule());
        assert_eq!(acts(&e.step(&at(0.0, 10.0))).len(), 1);
        e.step(&at(1.0, 30.0)); // clears
        // Fires again at 2 s, but within the 10 s cooldown: rule event only.
        let d = e.step(&at(2.0, 10.0));
        assert!(matches!(d[0], Decision::Rule { firing: true, .. }));
        assert!(acts(&d).is_empty());
        e.step(&at(3.0, 30.0));
        assert_eq!(acts(&e.step(&at(11.0, 10.0))).len(), 1);
    }

    #[test]
    fn strongest_action_wins() {
        let p = Policy::default_with(80.0, 92.0, Action::Stop);
        let mut e = Engine::new(p);
        let d = e.step(&at(0.0, 5.0));
        assert_eq!(acts(&d), vec![(Action::Stop, "critical-headroom".into())]);
        // The warning, checkpoint and critical rules all report firing.
        assert_eq!(
            d.iter()
                .filter(|d| matches!(d, Decision::Rule { firing: true, .. }))
                .count(),
            3
        );
        // After a critical action the engine is done for this attempt.
        assert!(e.step(&at(1.0, 1.0)).is_empty());
        e.reset();
        assert_eq!(acts(&e.step(&at(2.0, 1.0))).len(), 1);
    }

    #[test]
    fn pause_resumes_when_cleared_and_escalates_after_max_pause() {
        let mut p = Policy::default_with(80.0, 92.0, Action::Pause);
        p.max_pause_seconds = 10.0;
        let mut e = Engine::new(p.clone());
        assert_eq!(
            acts(&e.step(&at(0.0, 5.0))),
            vec![(Action::Pause, "critical-headroom".into())]
        );
        assert!(e.paused());
        // Clears at >= 12 %: resume.
        let d = e.step(&at(1.0, 13.0));
        assert!(d.contains(&Decision::Resume {
            reason: "critical-headroom".into()
        }));
        assert!(!e.paused());

        let mut e = Engine::new(p);
        e.step(&at(0.0, 5.0));
        assert!(acts(&e.step(&at(5.0, 5.0))).is_empty());
        let d = e.step(&at(10.0, 5.0));
        assert_eq!(
            acts(&d),
            vec![(Action::Stop, "max-pause (critical-headroom)".into())]
        );
        assert!(!e.paused());
    }

    #[test]
    fn no_decision_from_stale_or_missing_data() {
        let mut e = Engine::new(warn_rule());
        e.step(&at(5.0, 50.0));
        // Time not moving forward: a replayed or stale sample.
        assert!(e.step(&at(5.0, 1.0)).is_empty());
        assert!(e.step(&at(4.0, 1.0)).is_empty());
        // Missing value: neither fires nor clears.
        let missing = Readings {
            t: 6.0,
            ..Default::default()
        };
        assert!(e.step(&missing).is_empty());
        assert_eq!(acts(&e.step(&at(7.0, 1.0))).len(), 1);
        let missing = Readings {
            t: 8.0,
            ..Default::default()
        };
        assert!(e.step(&missing).is_empty());
        assert!(
            e.step(&at(9.0, 22.0)).is_empty(),
            "still firing between threshold and clear"
        );
    }

    #[test]
    fn eta_rule_needs_its_guard() {
        let mut e = Engine::new(Policy::default_with(80.0, 92.0, Action::Stop));
        let mut r = at(0.0, 90.0);
        r.set(Metric::Eta, Some(5.0));
        assert!(
            e.step(&r).is_empty(),
            "plenty of headroom: a burst, not a leak"
        );
        let mut r = at(1.0, 29.0);
        r.set(Metric::Eta, Some(5.0));
        assert!(acts(&e.step(&r)).is_empty(), "must hold for 2 s");
        let mut r = at(2.0, 28.5);
        r.set(Metric::Eta, Some(4.5));
        assert!(acts(&e.step(&r)).is_empty(), "must hold for 2 s");
        let mut r = at(3.0, 28.0);
        r.set(Metric::Eta, Some(4.0));
        assert_eq!(
            acts(&e.step(&r)),
            vec![(Action::Stop, "critical-eta".into())]
        );
    }

    #[test]
    fn infinite_eta_never_fires() {
        let mut e = Engine::new(Policy::default_with(80.0, 92.0, Action::Stop));
        for t in 0..5 {
            assert!(acts(&e.step(&at(t as f64, 30.0))).is_empty());
        }
    }

    #[test]
    fn thresholds_of_the_default_policy() {
        let p = Policy::default_with(80.0, 92.0, Action::Stop);
        assert_eq!(p.thresholds(), (Some(20.0), Some(8.0)));
    }

    #[test]
    fn names_round_trip() {
        for m in Metric::ALL {
            assert_eq!(Metric::from_name(m.name()), Some(m));
        }
        for a in ["warn", "checkpoint", "pause", "stop", "kill", "restart"] {
            assert_eq!(Action::from_name(a).unwrap().name(), a);
        }
        assert_eq!(Action::from_name("pase"), None);
    }
}
