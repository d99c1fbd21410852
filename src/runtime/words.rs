//! The summary's words for what was decided and how the job ended. The
//! log keeps the machine's vocabulary (the rule that fired, one `action`
//! line per signal sent); the summary says it as a user would: one stop
//! is one stop, a restart that was refused is not a restart, a stop asked
//! for from the dashboard is not oomguard's.

use std::collections::BTreeMap;

use super::act::parts::StopParts;
use crate::engine::policy::Action;

/// The reasons the dashboard's keys give their actions (the log keeps
/// them as they are).
pub(super) const MANUAL_STOP: &str = "manual stop (dashboard)";
pub(super) const MANUAL_RESTART: &str = "manual restart (dashboard)";

/// "stopped by oomguard (critical-headroom)", or "stopped from the
/// dashboard": how an attempt that a stop, restart or kill ended reads.
/// `restart_left`: whether a `restart` was followed by another attempt.
pub(super) fn ended_by(action: Action, reason: &str, restart_left: bool) -> String {
    match (action, reason) {
        (Action::Restart, MANUAL_RESTART) if restart_left => "restarted from the dashboard".into(),
        (Action::Restart, _) if restart_left => format!("restarted by oomguard ({reason})"),
        (Action::Restart, MANUAL_RESTART) => {
            "stopped from the dashboard (a restart; --max-restarts reached)".into()
        }
        (Action::Restart, _) => format!("stopped by oomguard ({reason}; --max-restarts reached)"),
        (Action::Kill, _) => format!("killed by oomguard ({reason})"),
        (_, MANUAL_STOP) => "stopped from the dashboard".into(),
        _ => format!("stopped by oomguard ({reason})"),
    }
}

/// The summary's `actions:` line: each decision once, the steps of a stop
/// (the throttle, the tree's cleanup, …) named in it rather than counted
/// as decisions of their own, and restarts as many as happened. `actions`
/// are the log's counts (`run_end.actions`).
pub(super) fn actions_line(
    actions: &BTreeMap<String, u32>,
    parts: &StopParts,
    restarts: u32,
) -> Option<String> {
    let mut decisions: BTreeMap<&str, u32> = actions
        .iter()
        .map(|(a, &n)| (a.as_str(), n.saturating_sub(parts.logged_as_parts(a))))
        .filter(|&(_, n)| n > 0)
        .collect();
    // A `restart` with none left ended the run as a stop does.
    let refused = decisions
        .get("restart")
        .map_or(0, |&n| n.saturating_sub(restarts));
    if refused > 0 {
        decisions.insert("restart", restarts);
        *decisions.entry("stop").or_insert(0) += refused;
        decisions.retain(|_, n| *n > 0);
    }
    let mut stop_parts = parts.of("stop");
    let mut restart_parts = parts.of("restart");
    if !decisions.contains_key("restart") {
        stop_parts.append(&mut restart_parts);
        stop_parts.sort_unstable();
        stop_parts.dedup();
    }
    let list: Vec<String> = decisions
        .iter()
        .map(|(&a, n)| {
            let mut notes: Vec<&str> = match a {
                "stop" => stop_parts.iter().map(|p| p.label()).collect(),
                "restart" => restart_parts.iter().map(|p| p.label()).collect(),
                _ => Vec::new(),
            };
            if a == "stop" && refused > 0 {
                notes.push("--max-restarts reached");
            }
            if notes.is_empty() {
                format!("{a} ×{n}")
            } else {
                format!("{a} ×{n} ({})", notes.join(", "))
            }
        })
        .collect();
    (!list.is_empty()).then(|| format!("actions: {}", list.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::act::parts::Part;

    fn counts(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(a, n)| (a.to_string(), *n)).collect()
    }

    #[test]
    fn words_for_an_attempts_end() {
        assert_eq!(
            ended_by(Action::Stop, MANUAL_STOP, false),
            "stopped from the dashboard"
        );
        assert_eq!(
            ended_by(Action::Restart, "critical-headroom", false),
            "stopped by oomguard (critical-headroom; --max-restarts reached)"
        );
        assert_eq!(
            ended_by(Action::Restart, "critical-headroom", true),
            "restarted by oomguard (critical-headroom)"
        );
        assert_eq!(
            ended_by(Action::Stop, "critical-eta", false),
            "stopped by oomguard (critical-eta)"
        );
    }

    #[test]
    fn plain_counts_read_as_logged() {
        let line = actions_line(
            &counts(&[("warn", 2), ("pause", 1)]),
            &StopParts::default(),
            0,
        );
        assert_eq!(line.as_deref(), Some("actions: pause ×1, warn ×2"));
        assert_eq!(actions_line(&counts(&[]), &StopParts::default(), 0), None);
    }

    #[test]
    fn a_stop_is_one_decision_with_its_parts() {
        let mut parts = StopParts::default();
        parts.note(Action::Stop, Part::Throttle, "pause");
        parts.note(Action::Stop, Part::Cleanup, "stop");
        let line = actions_line(
            &counts(&[("pause", 1), ("stop", 2), ("warn", 1)]),
            &parts,
            0,
        );
        assert_eq!(
            line.as_deref(),
            Some("actions: stop ×1 (throttle, tree cleanup), warn ×1")
        );
    }

    #[test]
    fn a_refused_restart_is_a_stop() {
        let line = actions_line(
            &counts(&[("restart", 2), ("warn", 1)]),
            &StopParts::default(),
            1,
        );
        assert_eq!(
            line.as_deref(),
            Some("actions: restart ×1, stop ×1 (--max-restarts reached), warn ×1")
        );
    }
}
