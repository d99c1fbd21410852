//! What a report knows of one run: the [`RunLog`] the loader fills and
//! every renderer and diagnosis reads, with the few readings of a logged
//! event's fields (an empty text, a pid of 0) that they share. Below both
//! `load` and `attempts`, so neither needs the other's types.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::sinks::log::{ActionKind, Event as Logged, EventName};
use crate::vocab::model::Role;

/// Everything a report needs from one log.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunLog {
    /// `run_start`, when the log has one.
    pub start: Option<StartInfo>,
    /// Every `sample` line, in log order.
    pub samples: Vec<SamplePoint>,
    /// Every per-process list (`procs`), from whichever line carried it.
    pub snapshots: Vec<Snapshot>,
    /// Events other than samples, `run_start` and `run_end`, in log order.
    #[serde(skip)]
    pub events: Vec<Timed>,
    /// `run_end`, absent when oomguard itself died or is still running.
    pub end: Option<EndInfo>,
    /// One entry per attempt seen in the log, in order.
    pub attempts: Vec<Attempt>,
    /// Lines that were skipped, and why (the first [`LISTED_WARNINGS`]).
    pub warnings: Vec<String>,
    /// Lines skipped beyond those listed in `warnings`: a file of junk
    /// costs a count, not a message per line.
    pub unlisted_warnings: usize,
    /// Every line that carried the job's training `progress`, in log order.
    pub progress: Vec<ProgressPoint>,
    /// The job's global ranks whose companion said hello (`companion`
    /// lines), sorted, each once.
    pub ranks: Vec<u32>,
    /// Which run of the file this is, and how many it holds (a log that
    /// runs of a job were appended to; `sinks::log::runs`). `(1, 1)` for
    /// a log of one run.
    pub run_of: (usize, usize),
}

impl RunLog {
    /// The nearest ceiling at the sample with the least headroom of the
    /// run: the one the job came closest to.
    pub fn tightest_ceiling(&self) -> Option<&CeilingInfo> {
        (self.samples.iter())
            .filter(|s| s.ceiling.is_some())
            .min_by_key(|s| s.headroom_bytes.unwrap_or(u64::MAX))
            .and_then(|s| s.ceiling.as_ref())
    }

    /// Attempt `n`, when the log shows it.
    pub fn attempt(&self, n: u32) -> Option<&Attempt> {
        self.attempts.iter().find(|a| a.number == n)
    }

    /// The pids the kernel OOM killer took, as the `oom_kill` events name
    /// them.
    pub fn oom_killed_pids(&self) -> Vec<u32> {
        self.events
            .iter()
            .filter_map(|e| match &e.event {
                Logged::OomKill(k) => k.pid,
                _ => None,
            })
            .collect()
    }

    /// Whether the footprint (what the policy compared with the ceiling)
    /// was a cgroup's working set: the job ran in a cgroup of its own.
    /// Otherwise it was the PSS sum, carried forward by RSS changes.
    pub fn footprint_is_working_set(&self) -> bool {
        self.start.as_ref().is_some_and(|s| s.cgroup_exclusive)
            || self.samples.iter().any(|s| s.cgroup_owned)
    }

    /// What the footprint was, in words, for labels: `cgroup working set`
    /// or `PSS sum`.
    pub fn footprint_kind(&self) -> &'static str {
        if self.footprint_is_working_set() {
            "cgroup working set"
        } else {
            "PSS sum"
        }
    }
}

/// The job's training progress as one log line carried it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProgressPoint {
    pub t: f64,
    pub attempt: u32,
    /// The line's event (`sample`, `restart`, `run_end`, …), `None` for
    /// one this version does not know.
    pub event: Option<EventName>,
    pub step: Option<u64>,
    pub total: Option<u64>,
    pub epoch: Option<String>,
    pub phase: Option<String>,
    pub bytes_per_step: Option<i64>,
    pub ceiling_step: Option<u64>,
}

/// `run_start`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StartInfo {
    pub argv: Vec<String>,
    pub pid: Option<u64>,
    pub ts: Option<String>,
    pub ceilings: Vec<CeilingInfo>,
    /// `path` of the job's cgroup, with its version.
    pub cgroup: Option<(u64, String)>,
    /// The job's cgroup holds only the job (`cgroup.exclusive`, or `owned`
    /// in logs from before that field): its working set is the footprint.
    pub cgroup_exclusive: bool,
    /// The effective rules (`policy.rules`).
    pub rules: Vec<PolicyRule>,
    pub gpu_available: Option<bool>,
    pub gpu_reason: Option<String>,
    pub version: Option<String>,
    pub interval_seconds: Option<f64>,
    /// `run_start.ids`: the job, rank, host and SLURM place of the run.
    pub ids: std::collections::BTreeMap<String, String>,
}

/// A ceiling: `{source, bytes}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CeilingInfo {
    pub source: String,
    pub bytes: u64,
}

/// One rule of `run_start.policy.rules`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PolicyRule {
    pub name: String,
    pub metric: String,
    pub op: Option<String>,
    pub threshold: Option<f64>,
    pub unit: Option<String>,
    pub for_seconds: Option<f64>,
    pub clear: Option<f64>,
    pub action: ActionKind,
}

/// One `sample` line. `t` is on the report's time axis (see [`load`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SamplePoint {
    pub t: f64,
    pub attempt: u32,
    pub procs: Option<u64>,
    pub pss_bytes: u64,
    pub rss_bytes: u64,
    pub uss_bytes: u64,
    pub tree_swap_bytes: u64,
    pub footprint_bytes: Option<u64>,
    pub headroom_bytes: Option<u64>,
    pub headroom_percent: Option<f64>,
    /// The nearest ceiling at this tick.
    pub ceiling: Option<CeilingInfo>,
    pub eta_seconds: Option<f64>,
    pub mem_total_bytes: Option<u64>,
    pub mem_available_bytes: Option<u64>,
    pub swap_total_bytes: Option<u64>,
    /// Machine-wide swap in use.
    pub swap_used_bytes: Option<u64>,
    pub swap_in_bytes_per_s: Option<f64>,
    pub swap_out_bytes_per_s: Option<f64>,
    pub cgroup_usage_bytes: Option<u64>,
    pub cgroup_limit_bytes: Option<u64>,
    pub oom_kill_count: Option<u64>,
    /// The sample's cgroup is the one oomguard created for the job.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cgroup_owned: bool,
    pub gpus: Vec<GpuPoint>,
    /// PSS by role at this tick (lines that carry `roles`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub role_pss: Vec<(Role, u64)>,
    /// RSS by role at this tick (lines that carry `roles`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub role_rss: Vec<(Role, u64)>,
    /// `/dev/shm` as the job saw it (lines that carry `shm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm: Option<crate::vocab::model::ShmSample>,
}

impl SamplePoint {
    /// The footprint the policy compared with the ceiling at this tick
    /// (`tree.footprint_bytes`); the PSS sum in logs without it.
    pub fn footprint(&self) -> u64 {
        self.footprint_bytes.unwrap_or(self.pss_bytes)
    }
}

/// One GPU in one sample.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuPoint {
    pub index: u32,
    pub name: String,
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// A per-process list at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub t: f64,
    pub attempt: u32,
    pub procs: Vec<ProcPoint>,
    /// Age of the oldest `smaps_rollup` reading behind the list (the
    /// sample's `tree.pss_age_seconds`), when its line says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pss_age_seconds: Option<f64>,
}

impl Snapshot {
    /// When the reading behind `p`'s figures was taken: its own age when
    /// the line gives it, else the oldest reading's (older logs).
    pub fn read_t(&self, p: &ProcPoint) -> f64 {
        self.t - p.read_age_seconds.or(self.pss_age_seconds).unwrap_or(0.0)
    }
}

/// One process in a [`Snapshot`].
#[derive(Debug, Clone, Serialize)]
pub struct ProcPoint {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub role: Role,
    pub comm: String,
    pub rss_bytes: u64,
    /// The most RSS a tick saw since the previous list (see
    /// `ProcSample::rss_peak_bytes`), when more than `rss_bytes`.
    pub rss_peak_bytes: Option<u64>,
    pub pss_bytes: u64,
    pub uss_bytes: u64,
    pub swap_bytes: u64,
    pub gpu_bytes: Option<u64>,
    /// See `ProcSample::read_age_seconds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_age_seconds: Option<f64>,
    /// Not a reading but the sweeper's estimate, which per-process figures
    /// leave out: a worker not read since its fork, listed with what it
    /// gained as both its PSS and USS (a worker that was read shares pages
    /// with its parent, so its PSS is above its USS). Its parent's figure
    /// in the same list is an estimate too (its reading from before the
    /// fork plus the RSS it gained since), which the sweeper holds to its
    /// figure at the last tick before the fork (`pss::across_forks`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

/// A logged event other than a sample, `run_start` or `run_end`, placed on
/// the report's clock. `seq` numbers the events that get a marker on the
/// timeline (1, 2, …) so tables and markers can refer to each other.
#[derive(Debug, Clone)]
pub struct Timed {
    pub seq: usize,
    pub t: f64,
    pub attempt: u32,
    /// 1-based line number in the log.
    pub line: usize,
    /// The line's own `attempt`: on a `restart`, the attempt that starts
    /// (`attempt` above is the one it ends, whose clock stamped it).
    pub line_attempt: Option<u32>,
    pub event: Logged,
}

impl Timed {
    /// Whether the timeline draws a marker for it (everything but
    /// `child_exit`, which the attempt boundaries already show).
    pub fn has_marker(&self) -> bool {
        !matches!(self.event, Logged::ChildExit(_))
    }
}

/// `run_end`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EndInfo {
    pub t: f64,
    pub outcome: Option<String>,
    pub exit_code: Option<i64>,
    pub peak: Option<PeakInfo>,
    pub restarts: Option<u64>,
    pub actions: BTreeMap<String, u64>,
    pub duration_seconds: Option<f64>,
    pub error: Option<String>,
    /// `attach`: false (the job's exit code was never seen).
    pub exit_code_known: Option<bool>,
    /// `attach` that ended `detached`: why, and what was still running.
    pub detached_reason: Option<String>,
    pub still_running_pids: Vec<u32>,
}

/// `run_end.peak`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeakInfo {
    pub tree_pss_bytes: Option<u64>,
    pub tree_rss_bytes: Option<u64>,
    pub swap_used_bytes: Option<u64>,
    pub gpu_used_bytes: Option<u64>,
    pub t: Option<f64>,
}

/// One launch of the job, as far as the log shows it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Attempt {
    pub number: u32,
    /// First and last time a line of this attempt was written.
    pub start_t: f64,
    pub end_t: f64,
    pub peak_pss_bytes: u64,
    pub peak_pss_t: f64,
    /// The largest footprint (what the policy compared with the ceiling).
    pub peak_footprint_bytes: u64,
    /// Most workers seen at once in a per-process list.
    pub max_workers: usize,
    /// The job's exit, when logged.
    pub exit_code: Option<i64>,
    pub exit_signal: Option<String>,
    /// Why the attempt ended, in words.
    pub ended_by: String,
    /// Values changed for this attempt by the restart that started it.
    pub degraded: BTreeMap<String, (Value, Value)>,
    /// The checkpoint it resumed from.
    pub checkpoint: Option<String>,
}

/// The job's pid as `child_exit` gives it (0: not known).
pub(super) fn child_pid(c: &crate::sinks::log::ChildExit) -> Option<u32> {
    Some(c.pid).filter(|&p| p > 0)
}

/// A text field the writer leaves empty when it has nothing to say.
pub(super) fn said(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// `NAME -> [old, new]` as the writer gives it; a lone value is the new one.
pub(super) fn degraded(d: &BTreeMap<String, Value>) -> BTreeMap<String, (Value, Value)> {
    d.iter()
        .map(|(k, v)| {
            let pair = match v.clone() {
                Value::Array(a) => {
                    let mut it = a.into_iter();
                    match (it.next(), it.next()) {
                        (Some(old), Some(new)) => (old, new),
                        (Some(new), None) => (Value::Null, new),
                        _ => (Value::Null, Value::Array(Vec::new())),
                    }
                }
                v => (Value::Null, v),
            };
            (k.clone(), pair)
        })
        .collect()
}
