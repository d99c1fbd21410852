//! What oomguard did in a run, as one finding: the kill it prevented (its
//! actions and restarts in order, with the least headroom left), a warning
//! that sufficed, a quiet run, or, when the kernel killed anyway, why the
//! policy did not prevent it.

use std::collections::BTreeMap;

use super::finding::{Cited, Finding, Severity, outcome_text, time_text};
use super::run_log::{RunLog, degraded, said};
use crate::sinks::log::ActionKind;
use crate::sinks::log::Event as Logged;

/// The figures behind what oomguard did: least headroom, firings, actions.
fn did_numbers(log: &RunLog, firings: usize, actions: usize, restarts: usize) -> Vec<Cited> {
    let min_headroom = log
        .samples
        .iter()
        .filter_map(|s| s.headroom_percent.map(|p| (p, s.t)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let mut numbers = Vec::new();
    if let Some((p, t)) = min_headroom {
        numbers.push(Cited::percent(
            "min_headroom_percent",
            "least headroom left",
            p,
        ));
        numbers.push(Cited::seconds(
            "min_headroom_t_seconds",
            "least headroom at",
            t,
        ));
    }
    numbers.push(Cited::count("rules_fired", "rule firings", firings as u64));
    numbers.push(Cited::count("actions", "actions taken", actions as u64));
    if restarts > 0 {
        numbers.push(Cited::count("restarts", "restarts", restarts as u64));
    }
    numbers
}

/// Why the kernel still killed: title and advice of `not_prevented`.
fn not_prevented(
    actions: &[(f64, ActionKind, Option<&str>)],
    no_firings: bool,
    first_kill: Option<f64>,
    rules: Option<usize>,
    did: &str,
    numbers: &mut Vec<Cited>,
) -> (String, String) {
    let before: Vec<_> = actions
        .iter()
        .filter(|(t, a, _)| a.is_decisive() && first_kill.is_none_or(|k| *t <= k))
        .collect();
    if let Some((t, a, _)) = before.first() {
        let lead = first_kill.map(|k| k - t);
        if let Some(lead) = lead {
            numbers.push(Cited::seconds(
                "action_lead_seconds",
                "action before the kill",
                lead,
            ));
        }
        (
            "oomguard acted, but the kernel killed first".to_string(),
            format!(
                "{did} The {a} at {} came {} before the kernel's kill: memory grew faster than the action could take effect. Act earlier (a higher critical headroom, or an ETA rule), and prefer pause or a graceful stop that freezes the growing workers.",
                time_text(*t),
                lead.map_or_else(|| "too little time".to_string(), time_text),
            ),
        )
    } else if rules == Some(0) {
        (
            "No policy was active: oomguard only observed".to_string(),
            "The run had no rules (--policy none), so nothing stopped the job before the kernel did. Run with the default policy (warn under 20% headroom, graceful stop under 8%) to have the job checkpoint and stop, or restart it with fewer workers, before the ceiling.".to_string(),
        )
    } else if no_firings {
        (
            "No rule fired before the kernel killed".to_string(),
            format!(
                "{did} The thresholds were never crossed at a sample before the kill: the growth was faster than the sampling. Raise the critical headroom or add an ETA rule."
            ),
        )
    } else {
        (
            "Rules fired but took no decisive action before the kill".to_string(),
            format!(
                "{did} Only warnings were issued. Give the critical rule an action (stop, pause or restart)."
            ),
        )
    }
}

pub(super) fn what_oomguard_did(log: &RunLog, out: &mut Vec<Finding>) {
    let kills: Vec<f64> = log
        .events
        .iter()
        .filter(|e| matches!(e.event, Logged::OomKill(_)))
        .map(|e| e.t)
        .collect();
    let oom_killed = !kills.is_empty()
        || log
            .end
            .as_ref()
            .is_some_and(|e| e.outcome.as_deref() == Some("oom_killed"));
    let first_kill = kills.first().copied();
    let mut actions = Vec::new();
    let mut restarts = Vec::new();
    let mut firings = Vec::new();
    for e in &log.events {
        match &e.event {
            Logged::Action(a) => {
                actions.push((e.t, a.action, said(&a.reason)));
            }
            Logged::Restart(r) => restarts.push(Restart {
                t: e.t,
                attempt: e.line_attempt.unwrap_or(e.attempt),
                reason: r.reason.as_deref(),
                degraded: degraded(&r.degraded),
            }),
            Logged::Rule(r) if r.state == crate::sinks::log::RuleState::Firing => {
                firings.push((e.t, r.rule.as_str(), r.value))
            }
            _ => {}
        }
    }
    let mut numbers = did_numbers(log, firings.len(), actions.len(), restarts.len());
    let did = describe_actions(&actions, &restarts);
    if oom_killed {
        let rules = log.start.as_ref().map(|s| s.rules.len());
        let (title, advice) = not_prevented(
            &actions,
            firings.is_empty(),
            first_kill,
            rules,
            &did,
            &mut numbers,
        );
        out.push(Finding {
            kind: "not_prevented",
            severity: Severity::Critical,
            title,
            advice,
            numbers,
        });
        return;
    }
    let acted = actions.iter().any(|(_, a, _)| a.is_decisive());
    if acted && log.end.is_none() {
        // No run_end: oomguard was killed or still runs; a kill after the
        // log's last line would not be in it, so nothing is claimed.
        out.push(Finding {
            kind: "prevented",
            severity: Severity::Info,
            title: "oomguard acted; the log ends before the run did".to_string(),
            advice: format!(
                "{did} No kernel OOM kill is in the log, but it has no run_end (oomguard was killed, or still runs): how the run ended is unknown."
            ),
            numbers,
        });
    } else if acted {
        let outcome = outcome_text(log);
        // A stop against /dev/shm prevented a failed write, not a kill.
        let shm = (log.tightest_ceiling()).is_some_and(|c| c.source == "shm");
        let title = if shm {
            "oomguard stopped the job before /dev/shm filled"
        } else {
            "oomguard prevented a kernel OOM kill"
        };
        out.push(Finding {
            kind: "prevented",
            severity: Severity::Ok,
            title: title.to_string(),
            advice: format!("{did} The kernel killed nothing, and the run ended: {outcome}."),
            numbers,
        });
    } else if !actions.is_empty() || !firings.is_empty() {
        out.push(Finding {
            kind: "warned",
            severity: Severity::Info,
            title: "oomguard warned; memory stayed under the ceiling".to_string(),
            advice: format!("{did} No decisive action was needed."),
            numbers,
        });
    } else if !log.samples.is_empty() {
        out.push(Finding {
            kind: "quiet",
            severity: Severity::Ok,
            title: "No rule fired".to_string(),
            advice: "Memory stayed clear of every threshold for the whole run.".to_string(),
            numbers,
        });
    }
}

/// A restart as [`describe_actions`] tells it.
struct Restart<'a> {
    t: f64,
    attempt: u32,
    reason: Option<&'a str>,
    degraded: BTreeMap<String, (serde_json::Value, serde_json::Value)>,
}

fn describe_actions(
    actions: &[(f64, ActionKind, Option<&str>)],
    restarts: &[Restart<'_>],
) -> String {
    if actions.is_empty() && restarts.is_empty() {
        return "oomguard took no action.".to_string();
    }
    let mut parts: Vec<(f64, String)> = actions
        .iter()
        .map(|(t, a, r)| {
            let s = match r {
                Some(r) => format!("{a} at {} (rule {r})", time_text(*t)),
                None => format!("{a} at {}", time_text(*t)),
            };
            (*t, s)
        })
        .collect();
    for r in restarts {
        let changes: Vec<String> = r
            .degraded
            .iter()
            .map(|(k, (old, new))| format!("{k} {} → {}", value_text(old), value_text(new)))
            .collect();
        let mut s = format!("attempt {} launched at {}", r.attempt, time_text(r.t));
        if let Some(reason) = r.reason {
            s.push_str(&format!(" after {reason}"));
        }
        if !changes.is_empty() {
            s.push_str(&format!(" with {}", changes.join(", ")));
        }
        parts.push((r.t, s));
    }
    parts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let parts: Vec<String> = parts.into_iter().map(|(_, s)| s).collect();
    format!("oomguard: {}.", parts.join("; "))
}

fn value_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "unset".to_string(),
        v => v.to_string(),
    }
}
