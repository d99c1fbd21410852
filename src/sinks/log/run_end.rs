//! `run_end`, the log's last line: how the run ended, its peaks, the
//! actions counted, and what the loop itself did (the cheap loop's reads,
//! the wake-ups, pids refused).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Peaks over the run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Peak {
    /// The largest footprint, the figure the policy compares with the
    /// ceilings (`sample.tree.footprint_bytes`: the owned cgroup's working
    /// set, or the PSS sum), and when it was reached.
    pub footprint_bytes: u64,
    pub footprint_t: f64,
    /// The largest PSS sum (`--fail-above` compares it: it is repeatable,
    /// where a working set includes page cache).
    pub tree_pss_bytes: u64,
    pub tree_rss_bytes: u64,
    pub swap_used_bytes: u64,
    pub gpu_used_bytes: u64,
    /// When the tree PSS peaked.
    pub t: f64,
    /// The highest RSS one process of the job reached, as the kernel
    /// recorded it when the process ended (0 under `attach`, and in logs
    /// older than it): a spike between two samples, which no sampled
    /// figure shows, is here.
    #[serde(default)]
    pub largest_process_rss_bytes: u64,
    /// The fullest `/dev/shm` (the job's view) was, with its size, when it
    /// was a ceiling (`ShmSample::is_ceiling`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm: Option<crate::vocab::model::ShmSample>,
}

/// `run_end`: always the last line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    pub outcome: Outcome,
    pub exit_code: i32,
    #[serde(default)]
    pub peak: Peak,
    #[serde(default)]
    pub restarts: u32,
    #[serde(default)]
    pub actions: BTreeMap<String, u32>,
    #[serde(default)]
    pub duration_seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `--fail-above`, when given, and whether the peak exceeded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_above: Option<FailAbove>,
    /// Bytes of the job's stdout and stderr read but never passed on:
    /// dropped under `--output-drop`, or left when the reader closed its
    /// end. Absent when oomguard did not relay the output (the dashboard,
    /// `attach`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dropped_bytes: Option<u64>,
    /// `attach`: always false (a non-parent never sees the job's exit
    /// code). Absent under `run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code_known: Option<bool>,
    /// `attach`, outcome `detached`: why the watch ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached_reason: Option<String>,
    /// `attach`, outcome `detached`: the job's processes still alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub still_running_pids: Option<Vec<u32>>,
    /// The cheap loop's reads of the limit's usage counter and the time
    /// they took: its whole cost. Absent when it did not run (no cgroup
    /// limit, or kernel thresholds watch the limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cheap_loop: Option<CheapLoopStats>,
    /// Signals not sent because the pid had become another process
    /// (its start time changed since it was a tree process): each one a
    /// stranger spared. Absent when there was none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reused_pids_refused: Option<u64>,
    /// What could wake the loop between ticks, and how often each did.
    /// Absent when the run ended before its loop ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wakeups: Option<Wakeups>,
    /// A signal asked for a save and exit (a scheduler's USR1 or USR2)
    /// before any companion had spoken: why no save was made. The run
    /// still ends with the stop code, so the job is requeued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_saved: Option<String>,
    /// `--output-log-max`: bytes of the output log this run removed from
    /// disk to keep it (the oldest). Absent without the cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_log_left_out_bytes: Option<u64>,
    /// `torch_<pid>_…` segments the job's processes left in `/dev/shm`
    /// (PyTorch's `file_system` sharing strategy, a worker killed before
    /// it unlinked them), removed after the job ended. Absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_segments_removed: Option<ShmSegments>,
}

/// `run_end.shm_segments_removed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ShmSegments {
    pub files: u32,
    pub bytes: u64,
}

/// `run_end.wakeups`: each source of a wake-up, armed or not, and the
/// times it woke the loop to a tick.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Wakeups {
    /// The kernel's v1 usage threshold (`cgroup.event_control`).
    pub usage_threshold: WakeSource,
    /// A PSI trigger on `memory.pressure` (the job's v2 cgroup, or the
    /// machine's).
    pub psi: WakeSource,
    /// A v2 `memory.events` change (`high`, `max`, `oom`).
    pub memory_events: WakeSource,
    /// The cheap loop's read of the limit's usage counter, closer to the
    /// limit than the tick.
    pub cheap_loop: WakeSource,
    /// The `--interval` tick itself.
    pub poll: WakeSource,
}

/// One source of wake-ups.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WakeSource {
    pub armed: bool,
    pub woke: u64,
    /// Why it could not be armed, when the kernel refused it (absent when
    /// it was armed, turned off, or does not apply here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl RunEnd {
    /// The `run_end` of a run that ended before its job ran (it could not
    /// be started, or oomguard failed first): nothing measured, the error
    /// said.
    pub fn without_a_run(
        outcome: Outcome,
        exit_code: i32,
        duration_seconds: f64,
        error: &str,
    ) -> Self {
        Self {
            outcome,
            exit_code,
            peak: Peak::default(),
            restarts: 0,
            actions: BTreeMap::new(),
            duration_seconds,
            error: Some(error.to_string()),
            fail_above: None,
            output_dropped_bytes: None,
            exit_code_known: None,
            detached_reason: None,
            still_running_pids: None,
            cheap_loop: None,
            reused_pids_refused: None,
            wakeups: None,
            not_saved: None,
            output_log_left_out_bytes: None,
            shm_segments_removed: None,
        }
    }
}

/// `run_end.cheap_loop`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CheapLoopStats {
    pub reads: u64,
    pub seconds: f64,
}

/// The CI memory gate's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailAbove {
    pub limit_bytes: u64,
    pub exceeded: bool,
}

/// How the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Exited,
    Signaled,
    StoppedByPolicy,
    /// A signal oomguard received (a scheduler's TERM or USR1, an
    /// interrupt) asked for a save, and the job ended after it.
    StoppedBySignal,
    OomKilled,
    RestartLimit,
    InternalError,
    /// `attach`: the watch ended while the job was still running.
    Detached,
}
