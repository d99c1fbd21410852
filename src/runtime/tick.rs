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

use super::act::{Acted, Actuator, Levels, Notifier, Signaller};
use crate::model::{History, Sample, View};
use crate::policy::{Action, Decision, Engine, Readings};
use crate::supervise;
use crate::units::{HumanBytes, human_duration};

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
    pub engine: Engine,
    pub history: History,
    pub act: Actuator,
    pub voice: Voice,
    pub last_sample: Option<Sample>,
    pub last_view: Option<View>,
}

impl Core {
    pub fn new(engine: Engine, act: Actuator, voice: Voice) -> Self {
        Self {
            engine,
            history: History::new(10.0),
            act,
            voice,
            last_sample: None,
            last_view: None,
        }
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
        let (_, crit) = self.engine.policy().thresholds();
        Levels {
            last_resort: crit.unwrap_or(8.0) / 2.0,
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
        let view = self.history.push(&sample);
        let readings =
            Readings::from_sample(&sample, &view, inp.gpu_eta, inp.torch_fragmentation);
        let waits_before = self.engine.pending_changes();
        let decisions = if inp.ending || self.act.stop.is_some() {
            Vec::new()
        } else {
            self.engine.step(&readings)
        };
        let decided = !decisions.is_empty();
        let waits_changed = self.engine.pending_changes() != waits_before;
        for d in decisions {
            self.apply(d, &sample, &view, inp, sig, notifier);
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
                let value = if value.is_finite() { value } else { f64::MAX };
                self.act.push(Acted::Rule(crate::log::RuleEvent {
                    rule,
                    metric: metric.name().to_string(),
                    value: (value * 1000.0).round() / 1000.0,
                    threshold,
                    state: if firing { "firing" } else { "cleared" }.to_string(),
                }));
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
        if action == Action::Warn {
            self.warn(&reason, sample, view, notifier);
        } else if !self.voice.quiet {
            let text = describe(action, &reason, view, &self.act);
            self.act.push(Acted::Say(text));
        }
        let tree = &sample.procs;
        match action {
            Action::Warn => self.act.push(Acted::Action {
                action: "warn",
                reason: reason.clone(),
                pids: Vec::new(),
                signal: None,
                result: "ok".into(),
            }),
            Action::Pause => self.act.pause(&reason, tree, sig),
            Action::Stop | Action::Restart => {
                let prev = self.last_sample.as_ref();
                self.act
                    .begin_stop(action, &reason, inp.job_pid, tree, prev, inp.now, sig);
            }
            Action::Kill if !self.act.cfg.may_kill => {
                self.act.push(Acted::Say(format!(
                    "{reason}: not killing processes oomguard did not launch (use --allow-kill)"
                )));
                self.act.push(Acted::Action {
                    action: "warn",
                    reason: reason.clone(),
                    pids: Vec::new(),
                    signal: None,
                    result: "kill refused: attached".into(),
                });
            }
            Action::Kill => {
                self.act.policy_end = Some(Action::Kill);
                self.act.kill(&reason, tree, Some(inp.job_pid), inp.now, sig);
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

    fn warn(&mut self, reason: &str, sample: &Sample, view: &View, notifier: &mut dyn Notifier) {
        let head = view.nearest.map_or_else(String::new, |n| {
            format!(
                "headroom {} ({:.1}%) under the {} ceiling of {}",
                HumanBytes(n.headroom_bytes),
                n.headroom_percent(),
                n.ceiling.source.as_str(),
                HumanBytes(n.ceiling.bytes)
            )
        });
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
    pub fn cadence(&self, view: &View, base: Duration) -> Duration {
        if self.act.busy() {
            return FAST;
        }
        let (warn, crit) = self.engine.policy().thresholds();
        let (warn, crit) = (warn.unwrap_or(20.0), crit.unwrap_or(8.0));
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

/// The message for a critical action: what was crossed and what follows.
fn describe(action: Action, reason: &str, view: &View, act: &Actuator) -> String {
    let head = view.nearest.map_or_else(String::new, |n| {
        format!(
            ": headroom {} ({:.1}%) under the {} ceiling of {}",
            HumanBytes(n.headroom_bytes),
            n.headroom_percent(),
            n.ceiling.source.as_str(),
            HumanBytes(n.ceiling.bytes)
        )
    });
    let what = match action {
        Action::Pause => "pausing the job".to_string(),
        Action::Stop => format!(
            "stopping the job gracefully ({} to the trainer, {} grace)",
            supervise::signal_name(act.cfg.checkpoint_signal),
            human_duration(act.cfg.grace)
        ),
        Action::Restart => "stopping the job to restart it".to_string(),
        Action::Kill => "killing the job".to_string(),
        Action::Warn => "warning".to_string(),
    };
    format!("{reason}{head}; {what}")
}
