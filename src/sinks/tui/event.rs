//! What the events pane says: the things that happen during a run
//! (`UiEvent`, as the supervision loop reports them), how each is coloured
//! and the one line of text each becomes. Kept apart from the state
//! (`app`) because the wording is its own concern: rule names, metric
//! units and pids become words here, and nowhere else.

use crate::vocab::model::Role;
use crate::vocab::units::HumanBytes;

/// An action the policy (or the user) took, for the events pane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    Warn,
    Checkpoint,
    Pause,
    Resume,
    Stop,
    Kill,
    Restart,
}

impl ActionKind {
    /// The action's name as the NDJSON log spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Warn => "warn",
            ActionKind::Checkpoint => "checkpoint",
            ActionKind::Pause => "pause",
            ActionKind::Resume => "resume",
            ActionKind::Stop => "stop",
            ActionKind::Kill => "kill",
            ActionKind::Restart => "restart",
        }
    }
}

/// How an event is coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Neutral information.
    Info,
    /// Something got better (a rule cleared, the job resumed).
    Ok,
    /// A warning threshold was crossed.
    Warn,
    /// oomguard intervened (pause, stop, restart).
    Act,
    /// Something died or failed (OOM kill, CUDA OOM, worker death, kill).
    Critical,
}

/// Something that happened, for the events pane. `t` is seconds since the
/// run started, like `Sample::t`.
#[derive(Debug, Clone, PartialEq)]
pub enum UiEvent {
    /// A rule started firing.
    RuleFiring {
        t: f64,
        rule: String,
        metric: String,
        value: f64,
        threshold: f64,
    },
    /// A rule stopped firing.
    RuleCleared {
        t: f64,
        rule: String,
        metric: String,
        value: f64,
        threshold: f64,
    },
    /// An action was taken; `error` is `None` when it succeeded.
    Action {
        t: f64,
        action: ActionKind,
        reason: String,
        pids: Vec<u32>,
        error: Option<String>,
    },
    /// A new attempt started; `degraded` lists the settings lowered for it
    /// (`("NUM_WORKERS", "2")`).
    Restart {
        t: f64,
        attempt: u32,
        degraded: Vec<(String, String)>,
    },
    /// The kernel OOM killer killed a process (`role` when it was ours).
    OomKill {
        t: f64,
        pid: u32,
        comm: String,
        role: Option<Role>,
    },
    /// PyTorch reported CUDA out of memory.
    CudaOom {
        t: f64,
        pid: Option<u32>,
        device: Option<u32>,
        tried_bytes: Option<u64>,
    },
    /// A worker process died; `how` is e.g. `killed by SIGKILL`.
    WorkerDied {
        t: f64,
        pid: u32,
        comm: String,
        how: String,
    },
    /// The job's main process exited; `how` is e.g. `exited with 0`.
    ChildExit { t: f64, pid: u32, how: String },
    /// Anything else worth a line (oomguard's own messages while the
    /// dashboard owns the terminal, where stderr would garble it).
    Note {
        t: f64,
        severity: Severity,
        text: String,
    },
}

/// One line of the events pane.
#[derive(Debug, Clone, PartialEq)]
pub struct EventLine {
    pub t: f64,
    pub severity: Severity,
    pub text: String,
}

/// A metric's name for people: `headroom_percent` → `headroom`,
/// `psi_some_avg10` → `psi some avg10` (the value carries the unit).
pub(crate) fn metric_name(metric: &str) -> String {
    let base = ["_percent", "_bytes", "_seconds"]
        .iter()
        .find_map(|suffix| metric.strip_suffix(suffix))
        .unwrap_or(metric);
    base.replace('_', " ")
}

/// A metric value the way its name says it is measured.
pub(crate) fn metric_value(metric: &str, v: f64) -> String {
    if v.is_nan() {
        // A value the log did not have.
        "?".to_string()
    } else if metric.ends_with("_bytes") {
        let s = HumanBytes(v.abs() as u64).to_string();
        if v < 0.0 { format!("-{s}") } else { s }
    } else if metric.ends_with("_percent") {
        format!("{v:.1}%")
    } else if metric.ends_with("_seconds") {
        // An ETA of never is logged as the largest number.
        std::time::Duration::try_from_secs_f64(v.max(0.0))
            .map_or_else(|_| "never".to_string(), crate::vocab::units::human_duration)
    } else {
        let r = (v * 100.0).round() / 100.0;
        format!("{r}")
    }
}

pub(crate) fn describe(ev: &UiEvent) -> EventLine {
    let line = |t: f64, severity: Severity, text: String| EventLine { t, severity, text };
    match ev {
        UiEvent::RuleFiring {
            t,
            rule,
            metric,
            value,
            threshold,
        } => line(
            *t,
            Severity::Warn,
            format!(
                "{rule} firing: {} {} (threshold {})",
                metric_name(metric),
                metric_value(metric, *value),
                metric_value(metric, *threshold)
            ),
        ),
        UiEvent::RuleCleared {
            t,
            rule,
            metric,
            value,
            threshold,
        } => line(
            *t,
            Severity::Ok,
            format!(
                "{rule} cleared: {} {} (threshold {})",
                metric_name(metric),
                metric_value(metric, *value),
                metric_value(metric, *threshold)
            ),
        ),
        UiEvent::Action {
            t,
            action,
            reason,
            pids,
            error,
        } => {
            let severity = match (action, error) {
                (_, Some(_)) | (ActionKind::Kill, _) => Severity::Critical,
                (ActionKind::Warn, _) => Severity::Warn,
                (ActionKind::Resume, _) => Severity::Ok,
                _ => Severity::Act,
            };
            let mut text = format!("{} ({reason})", action.as_str());
            match pids.len() {
                0 => {}
                1 => text.push_str(&format!(" pid {}", pids[0])),
                n => text.push_str(&format!(" {n} pids")),
            }
            if let Some(e) = error {
                text.push_str(&format!(" failed: {e}"));
            }
            line(*t, severity, text)
        }
        UiEvent::Restart {
            t,
            attempt,
            degraded,
        } => {
            let mut text = format!("restart: attempt {attempt}");
            if !degraded.is_empty() {
                let vars: Vec<String> = degraded.iter().map(|(k, v)| format!("{k}={v}")).collect();
                text.push_str(&format!(" with {}", vars.join(" ")));
            }
            line(*t, Severity::Act, text)
        }
        UiEvent::OomKill { t, pid, comm, role } => {
            let who = match role {
                Some(r) => format!("{} {comm} ({})", pid, r.as_str()),
                None => format!("{pid} {comm} (not in the tree)"),
            };
            line(*t, Severity::Critical, format!("OOM kill: {who}"))
        }
        UiEvent::CudaOom {
            t,
            pid,
            device,
            tried_bytes,
        } => {
            let mut text = String::from("CUDA out of memory");
            if let Some(d) = device {
                text.push_str(&format!(" on GPU {d}"));
            }
            if let Some(b) = tried_bytes {
                text.push_str(&format!(", tried {}", HumanBytes(*b)));
            }
            if let Some(p) = pid {
                text.push_str(&format!(" (pid {p})"));
            }
            line(*t, Severity::Critical, text)
        }
        UiEvent::WorkerDied { t, pid, comm, how } => line(
            *t,
            Severity::Critical,
            format!("worker {pid} {comm} died: {how}"),
        ),
        UiEvent::ChildExit { t, pid, how } => line(*t, Severity::Info, format!("job {pid} {how}")),
        UiEvent::Note { t, severity, text } => line(*t, *severity, text.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_values_follow_their_unit_suffix() {
        assert_eq!(metric_value("headroom_bytes", 1536.0), "1.5 KiB");
        assert_eq!(metric_value("headroom_percent", 9.75), "9.8%");
        assert_eq!(metric_value("eta_seconds", 90.0), "1m 30s");
        assert_eq!(metric_value("eta_seconds", f64::MAX), "never");
        assert_eq!(metric_value("headroom_percent", f64::NAN), "?");
        assert_eq!(metric_value("psi_some_avg10", 12.345), "12.35");
        assert_eq!(metric_name("headroom_percent"), "headroom");
        assert_eq!(metric_name("psi_some_avg10"), "psi some avg10");
    }
}
