//! The vocabulary every diagnosis shares: a [`Finding`], the numbers it
//! cites, the per-process summary they are drawn from, and the wording of
//! times, rates and outcomes. Below `diagnose` and the modules it calls
//! (`did`, `fit`, `workers`), so that they all use it and none another.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::run_log::RunLog;
use crate::sinks::log::ActionEvent;
use crate::sinks::log::Event as Logged;
use crate::vocab::growth::{self, Figure};
use crate::vocab::model::{Role, least_squares_slope};
use crate::vocab::units::{HumanBytes, human_duration};

pub(super) const MIB: u64 = 1 << 20;

/// The share of the ceiling the worker-count advice plans to use, leaving
/// room for the page cache, the allocator's slack and the thresholds.
pub const FIT_SHARE: f64 = 0.9;

/// A rise over this early in its attempt was a load "at start-up".
pub(super) const EARLY_SECONDS: f64 = 15.0;

/// How urgent a finding is. Ordered from most to least urgent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The job was killed or failed because of memory.
    Critical,
    /// Something to change before the next run.
    Warning,
    /// Context and sizing.
    Info,
    /// What went right (e.g. a kill that oomguard prevented).
    Ok,
}

impl Severity {
    /// Lower-case name, as in the JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
            Severity::Ok => "ok",
        }
    }
}

/// What a cited number measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Bytes,
    BytesPerSecond,
    Seconds,
    Percent,
    Count,
}

/// A number a finding is based on: machine-readable value and the text a
/// person reads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cited {
    /// Stable snake_case name (`per_worker_private_peak_bytes`).
    pub name: String,
    /// What it is, in words.
    pub label: String,
    pub value: f64,
    pub unit: Unit,
    /// `value` in human units.
    pub text: String,
}

impl Cited {
    pub(super) fn bytes(name: &str, label: &str, v: u64) -> Self {
        Self {
            name: name.into(),
            label: label.into(),
            value: v as f64,
            unit: Unit::Bytes,
            text: HumanBytes(v).to_string(),
        }
    }

    pub(super) fn rate(name: &str, label: &str, v: f64) -> Self {
        Self {
            name: name.into(),
            label: label.into(),
            value: v,
            unit: Unit::BytesPerSecond,
            text: rate_text(v),
        }
    }

    pub(super) fn seconds(name: &str, label: &str, v: f64) -> Self {
        Self {
            name: name.into(),
            label: label.into(),
            value: v,
            unit: Unit::Seconds,
            text: time_text(v),
        }
    }

    pub(super) fn percent(name: &str, label: &str, v: f64) -> Self {
        Self {
            name: name.into(),
            label: label.into(),
            value: v,
            unit: Unit::Percent,
            text: format!("{v:.1}%"),
        }
    }

    pub(super) fn count(name: &str, label: &str, v: u64) -> Self {
        Self {
            name: name.into(),
            label: label.into(),
            value: v as f64,
            unit: Unit::Count,
            text: v.to_string(),
        }
    }
}

/// One piece of diagnosis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Stable identifier of the kind of finding (`worker_leak`,
    /// `num_workers`, `fragmentation`, …), for scripts and tests.
    pub kind: &'static str,
    pub severity: Severity,
    pub title: String,
    /// What it means and what to change, in sentences.
    pub advice: String,
    pub numbers: Vec<Cited>,
}

/// One process over the run: its peaks and how its private memory moved.
#[derive(Debug, Clone, Serialize)]
pub struct ProcSummary {
    pub attempt: u32,
    pub pid: u32,
    pub role: Role,
    pub comm: String,
    pub first_t: f64,
    /// When the reading behind its first figure was taken (`first_t` less
    /// the reading's age).
    pub first_read_t: f64,
    pub last_t: f64,
    /// Per-process lists it appeared in.
    pub snapshots: usize,
    pub peak_pss_bytes: u64,
    pub peak_uss_bytes: u64,
    pub peak_rss_bytes: u64,
    pub peak_swap_bytes: u64,
    pub first_uss_bytes: u64,
    pub last_uss_bytes: u64,
    /// Least-squares growth of USS, bytes/s (`None` with fewer than two
    /// readings at distinct times).
    pub uss_slope: Option<f64>,
    /// The growth figure of its USS readings (`growth::figure`): what the
    /// report shows as its rate, a number only where the readings support
    /// one. `uss_slope` stays the leak test's trend.
    #[serde(skip)]
    pub uss_figure: Figure,
    /// Its private memory grew and then stopped (no longer growing at its
    /// last readings, by the policy's definition in `growth`): a one-off
    /// load, `(bytes, seconds)` from its first reading to the level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ramp: Option<(f64, f64)>,
}

impl ProcSummary {
    /// Whether its private memory grew like a leak: steadily up, by a
    /// margin that is not allocator noise — a quarter of what it started
    /// with, or at least 1 MiB/s (a run stopped seconds after its leak
    /// showed has per-process lists only a few seconds apart).
    pub fn leaks(&self) -> bool {
        let growth = self.last_uss_bytes.saturating_sub(self.first_uss_bytes);
        let slope = self.uss_slope.unwrap_or(0.0);
        slope > 0.0
            && growth >= 8 * MIB
            && (growth >= self.first_uss_bytes / 4 || slope >= MIB as f64)
    }

    /// Whether its private memory rose to its peak by a margin that is not
    /// allocator noise (8 MiB and a quarter of where it began): a load, which
    /// need not be rising at the end. Not [`Self::leaks`]: a trainer's last
    /// list, after its workers exited, can read below the lists before it
    /// (an estimate that takes a fall in RSS from private pages first), and
    /// a whole-run slope made negative by it hid the load in 17 of 160 runs
    /// of the diagnosis cases.
    pub fn rose(&self) -> bool {
        let rise = self.peak_uss_bytes.saturating_sub(self.first_uss_bytes);
        rise >= 8 * MIB && rise >= self.first_uss_bytes / 4
    }
}

/// When oomguard held each process, by pid: from a `SIGSTOP` to the
/// `SIGCONT` that released it (to the end of the log without one). Held,
/// a process's memory does not move, so readings taken then would dilute
/// its growth (a worker leaking 50 MiB/s, frozen at the edge for 5 s
/// before the kill, read as 3 MiB/s).
pub(super) fn held_spans(log: &RunLog) -> BTreeMap<u32, Vec<(f64, f64)>> {
    let mut open: BTreeMap<u32, f64> = BTreeMap::new();
    let mut spans: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    for e in &log.events {
        let Logged::Action(ActionEvent {
            pids,
            signal: Some(sig),
            ..
        }) = &e.event
        else {
            continue;
        };
        for &pid in pids {
            match sig.as_str() {
                "SIGSTOP" => {
                    open.entry(pid).or_insert(e.t);
                }
                "SIGCONT" => {
                    if let Some(from) = open.remove(&pid) {
                        spans.entry(pid).or_default().push((from, e.t));
                    }
                }
                _ => {}
            }
        }
    }
    for (pid, from) in open {
        spans.entry(pid).or_default().push((from, f64::INFINITY));
    }
    spans
}

/// Every process seen in a per-process list, keyed by attempt and pid,
/// sorted by attempt then peak PSS (largest first).
pub fn processes(log: &RunLog) -> Vec<ProcSummary> {
    // (attempt, pid) -> summary so far and its (t, USS) readings.
    type Acc = (ProcSummary, Vec<(f64, f64)>);
    let mut by: BTreeMap<(u32, u32), Acc> = BTreeMap::new();
    let held = held_spans(log);
    // A reading on the tick that held it was taken before the signal.
    let was_held = |pid: u32, t: f64| {
        held.get(&pid)
            .is_some_and(|s| s.iter().any(|&(from, to)| from < t && t <= to))
    };
    for snap in &log.snapshots {
        for p in &snap.procs {
            let (s, pts) = by.entry((snap.attempt, p.pid)).or_insert_with(|| {
                (
                    ProcSummary {
                        attempt: snap.attempt,
                        pid: p.pid,
                        role: p.role,
                        comm: p.comm.clone(),
                        first_t: snap.t,
                        first_read_t: snap.t,
                        last_t: snap.t,
                        snapshots: 0,
                        peak_pss_bytes: 0,
                        peak_uss_bytes: 0,
                        peak_rss_bytes: 0,
                        peak_swap_bytes: 0,
                        first_uss_bytes: p.uss_bytes,
                        last_uss_bytes: p.uss_bytes,
                        uss_slope: None,
                        uss_figure: Figure::Unknown,
                        ramp: None,
                    },
                    Vec::new(),
                )
            });
            // A process that has not been swept yet reports zeros; an
            // estimate is not a reading (see `ProcPoint::estimated`).
            if (p.pss_bytes == 0 && p.uss_bytes == 0 && p.rss_bytes == 0) || p.estimated {
                continue;
            }
            // Another program now (a launcher's shell that exec'd python):
            // its memory so far was the old program's, not growth.
            if s.snapshots > 0 && s.comm != p.comm {
                s.snapshots = 0;
                s.peak_pss_bytes = 0;
                s.peak_uss_bytes = 0;
                s.peak_rss_bytes = 0;
                s.peak_swap_bytes = 0;
                pts.clear();
            }
            if s.snapshots == 0 {
                s.first_uss_bytes = p.uss_bytes;
                s.first_t = snap.t;
                s.first_read_t = snap.read_t(p);
            }
            s.snapshots += 1;
            s.last_t = snap.t;
            s.last_uss_bytes = p.uss_bytes;
            s.role = p.role;
            s.comm.clone_from(&p.comm);
            s.peak_pss_bytes = s.peak_pss_bytes.max(p.pss_bytes);
            s.peak_uss_bytes = s.peak_uss_bytes.max(p.uss_bytes);
            s.peak_rss_bytes = s
                .peak_rss_bytes
                .max(p.rss_bytes)
                .max(p.rss_peak_bytes.unwrap_or(0));
            s.peak_swap_bytes = s.peak_swap_bytes.max(p.swap_bytes);
            if !was_held(p.pid, snap.t) {
                pts.push((snap.t, p.uss_bytes as f64));
            }
        }
    }
    let mut out: Vec<ProcSummary> = by
        .into_values()
        .filter(|(s, _)| s.snapshots > 0)
        .map(|(mut s, pts)| {
            s.uss_slope = least_squares_slope(pts.iter().copied());
            s.uss_figure = growth::figure(&pts, 0.0);
            if let growth::Shape::Ramp { bytes, seconds } =
                growth::shape(&pts, crate::vocab::model::ETA_WINDOW_SECONDS)
            {
                s.ramp = Some((bytes, seconds));
            }
            s
        })
        .collect();
    out.sort_by(|a, b| {
        a.attempt
            .cmp(&b.attempt)
            .then(b.peak_pss_bytes.cmp(&a.peak_pss_bytes))
            .then(a.pid.cmp(&b.pid))
    });
    out
}

/// `a`, `a and b`, `a, b and c`.
pub(super) fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// A rate in human units: `4.0 MiB/s`; slow leaks per hour (`3.4 MiB/h`),
/// which is how they are felt.
pub fn rate_text(bytes_per_s: f64) -> String {
    let sign = if bytes_per_s < 0.0 { "-" } else { "" };
    let v = bytes_per_s.abs();
    if v > 0.0 && v < 16.0 * 1024.0 {
        format!("{sign}{}/h", HumanBytes((v * 3600.0).round() as u64))
    } else {
        format!("{sign}{}/s", HumanBytes(v.round() as u64))
    }
}

/// A run time in human units: `12.5s`, `3m 05s`.
pub fn time_text(seconds: f64) -> String {
    // A damaged log can hold any number; Duration panics beyond its range.
    let s = if seconds.is_finite() {
        seconds.clamp(0.0, 1e10)
    } else {
        0.0
    };
    human_duration(Duration::from_secs_f64(s))
}

/// The outcome in words: `stopped by policy (exit 75)`.
pub(super) fn outcome_text(log: &RunLog) -> String {
    match &log.end {
        // A detached watch: the job was still running, its exit code is
        // not oomguard's to know (run_end's 0 is oomguard's own).
        Some(end) if end.outcome.as_deref() == Some("detached") => {
            let mut s = "detached: the job was still running".to_string();
            if let Some(why) = &end.detached_reason {
                s.push_str(&format!(" ({why})"));
            }
            if !end.still_running_pids.is_empty() {
                let pids: Vec<String> = end.still_running_pids.iter().map(u32::to_string).collect();
                s.push_str(&format!(", pids {}", pids.join(" ")));
            }
            s
        }
        Some(end) => {
            let o = end.outcome.as_deref().unwrap_or("ended").replace('_', " ");
            match end.exit_code {
                Some(c) if end.exit_code_known != Some(false) => format!("{o} (exit {c})"),
                _ => o,
            }
        }
        None => "unknown: the log has no run_end".to_string(),
    }
}
