//! `oomguard replay --score LOG…`: judges one policy on a corpus of
//! recorded runs. Each run is a trace of a job that either ended on its own
//! (exit 0: *healthy*, where any pause, stop, restart or kill is a false
//! action) or was killed by the kernel (*leak*, where the policy must act
//! before the kill; the lead time is how long before it). Runs that are
//! neither (the job failed, the log has no end) are listed and not scored.
//!
//! Each leak is also replayed under the policy's fixed critical threshold
//! alone (its level rules, no growth rule), so the lead time a growth rule
//! adds is visible beside it.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Act, Replay};
use crate::engine::policy::{Metric, Policy};
use crate::sinks::log::ActionKind;

/// What a trace is, by how its run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Healthy,
    Leak,
    /// Neither exit 0 nor a kernel kill: not scored.
    Unscored,
}

/// One trace's score.
#[derive(Debug, Clone, Serialize)]
pub struct Scored {
    pub trace: String,
    pub kind: Kind,
    /// The first pause, stop, restart or kill the policy decided.
    pub acted: Option<Act>,
    /// Checkpoint-worthy warnings are not actions: counted apart.
    pub warns: usize,
    /// `checkpoint` requests in the first attempt: a save, not the run
    /// (counted apart from false stops).
    pub checkpoints: usize,
    /// The kernel's first kill, for a leak.
    pub kernel_kill_t: Option<f64>,
    /// Headroom (%) of the sample the action was decided on.
    pub headroom_percent: Option<f64>,
    /// Seconds from the action to the kernel's kill (a leak acted on in
    /// time).
    pub lead_seconds: Option<f64>,
    /// The same under the policy's level rules alone.
    pub fixed_lead_seconds: Option<f64>,
}

impl Scored {
    /// A healthy job paused, stopped, restarted or killed.
    pub fn false_action(&self) -> bool {
        self.kind == Kind::Healthy && self.acted.is_some()
    }

    /// A leak acted on before the kernel's kill.
    pub fn prevented(&self) -> bool {
        self.kind == Kind::Leak && self.lead_seconds.is_some()
    }
}

fn stops(a: &Act) -> bool {
    a.action.is_decisive()
}

/// The policy's level rules alone: what a fixed critical threshold does.
pub fn fixed_threshold(policy: &Policy) -> Policy {
    let mut p = policy.clone();
    p.rules.retain(|r| {
        !r.action.is_advisory()
            && matches!(r.metric, Metric::HeadroomPercent | Metric::HeadroomBytes)
    });
    p
}

/// Scores one replayed trace; `fixed`: the same trace replayed under
/// [`fixed_threshold`].
pub fn score(trace: &str, r: &Replay, fixed: &Replay) -> Scored {
    let kill = r.oom_kills.iter().find(|k| k.0 == 1).map(|k| k.1);
    let kind = match (kill, r.exit_code) {
        (Some(_), _) => Kind::Leak,
        (None, Some(0)) => Kind::Healthy,
        _ => Kind::Unscored,
    };
    let first = |rep: &Replay| -> Option<Act> {
        rep.rows
            .iter()
            .filter_map(|row| row.replayed.as_ref())
            .filter(|a| a.attempt == 1 && stops(a))
            .find(|a| kill.is_none_or(|k| a.t <= k))
            .cloned()
    };
    let acted = first(r);
    let lead = |a: &Option<Act>| Some(kill? - a.as_ref()?.t);
    let headroom_percent = acted.as_ref().and_then(|a| {
        r.headroom
            .iter()
            .find(|(att, t, _)| *att == a.attempt && *t >= a.t)
            .and_then(|h| h.2)
    });
    Scored {
        trace: trace.to_string(),
        kind,
        warns: r
            .rows
            .iter()
            .filter_map(|row| row.replayed.as_ref())
            .filter(|a| a.action == ActionKind::Warn)
            .count(),
        checkpoints: r
            .rows
            .iter()
            .filter_map(|row| row.replayed.as_ref())
            .filter(|a| a.attempt == 1 && a.action == ActionKind::Checkpoint)
            .count(),
        kernel_kill_t: kill,
        headroom_percent,
        lead_seconds: lead(&acted),
        fixed_lead_seconds: lead(&first(fixed)),
        acted,
    }
}

/// The corpus table: a row per trace, then the totals.
pub fn render_text(policy_source: &str, rows: &[Scored]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "oomguard replay --score: {} traces, policy: {policy_source}",
        rows.len()
    );
    let _ = writeln!(
        out,
        "{:<40} {:<8} {:<30} {:>9} {:>8} {:>11}",
        "trace", "kind", "first action", "headroom", "lead", "fixed lead"
    );
    let secs = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:.2} s"));
    for s in rows {
        let act = s.acted.as_ref().map_or("-".to_string(), |a| {
            format!("{} ({}) {:.1} s", a.action, a.reason, a.t)
        });
        let kind = match s.kind {
            Kind::Healthy => "healthy",
            Kind::Leak => "leak",
            Kind::Unscored => "unscored",
        };
        let _ = writeln!(
            out,
            "{:<40} {:<8} {:<30} {:>9} {:>8} {:>11}",
            s.trace,
            kind,
            act,
            s.headroom_percent
                .map_or("-".to_string(), |h| format!("{h:.1}%")),
            secs(s.lead_seconds),
            secs(s.fixed_lead_seconds)
        );
    }
    let healthy = rows.iter().filter(|s| s.kind == Kind::Healthy).count();
    let leaks = rows.iter().filter(|s| s.kind == Kind::Leak).count();
    let _ = writeln!(
        out,
        "healthy: {} of {healthy} falsely paused, stopped or killed ({} asked for a checkpoint); leaks: {} of {leaks} acted on before the kernel's kill",
        rows.iter().filter(|s| s.false_action()).count(),
        rows.iter()
            .filter(|s| s.kind == Kind::Healthy && s.checkpoints > 0)
            .count(),
        rows.iter().filter(|s| s.prevented()).count(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::replay::Row;

    fn act(t: f64, action: &str) -> Act {
        Act {
            t,
            attempt: 1,
            action: action.into(),
            reason: "critical-headroom".into(),
        }
    }

    fn replay(acts: &[Act], kill: Option<f64>, exit: Option<i32>) -> Replay {
        Replay {
            samples: 3,
            rows: acts
                .iter()
                .map(|a| Row {
                    recorded: None,
                    replayed: Some(a.clone()),
                })
                .collect(),
            policy_source: "recorded".into(),
            policy: Policy::none(),
            notes: Vec::new(),
            oom_kills: kill.map(|k| vec![(1, k)]).unwrap_or_default(),
            exit_code: exit,
            headroom: vec![
                (1, 1.0, Some(30.0)),
                (1, 2.0, Some(7.5)),
                (1, 3.0, Some(1.0)),
            ],
            every_tick: true,
        }
    }

    #[test]
    fn a_leak_stopped_before_the_kill_has_its_lead_and_headroom() {
        let r = replay(&[act(1.0, "warn"), act(2.0, "stop")], Some(3.5), Some(137));
        let fixed = replay(&[act(3.0, "stop")], Some(3.5), Some(137));
        let s = score("linear", &r, &fixed);
        assert_eq!(s.kind, Kind::Leak);
        assert!(s.prevented());
        assert_eq!(s.lead_seconds, Some(1.5));
        assert_eq!(s.fixed_lead_seconds, Some(0.5));
        assert_eq!(s.headroom_percent, Some(7.5));
        assert_eq!(s.warns, 1);
    }

    #[test]
    fn an_action_after_the_kill_is_not_a_prevention() {
        let r = replay(&[act(4.0, "stop")], Some(3.5), Some(137));
        let s = score("fast", &r, &r);
        assert!(!s.prevented());
        assert_eq!(s.acted, None);
    }

    #[test]
    fn a_healthy_job_stopped_is_a_false_action_and_a_warn_is_not() {
        let r = replay(&[act(1.0, "warn")], None, Some(0));
        assert!(!score("plateau", &r, &r).false_action());
        let r = replay(&[act(1.0, "warn"), act(2.0, "pause")], None, Some(0));
        assert!(score("plateau", &r, &r).false_action());
        let r = replay(&[], None, Some(1));
        assert_eq!(score("crashed", &r, &r).kind, Kind::Unscored);
    }

    #[test]
    fn the_fixed_threshold_keeps_only_level_rules() {
        let p = fixed_threshold(&Policy::default_with(
            80.0,
            92.0,
            crate::engine::policy::Action::Stop,
        ));
        let names: Vec<&str> = p.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["critical-headroom"]);
    }
}
