//! The NDJSON contract (design.md §4.1), restated independently of the
//! implementation with `deny_unknown_fields`: a field added or renamed in
//! the code without updating the contract fails here.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;

use serde::Deserialize;

/// One log line: the envelope, and the event checked strictly.
#[derive(Debug)]
pub struct Line {
    pub schema: String,
    pub ts: String,
    pub t: f64,
    pub attempt: u32,
    /// Where training was, on events that mark a moment (and on samples
    /// when it moved).
    pub progress: Option<Progress>,
    pub event: Event,
}

/// The `progress` object.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Progress {
    pub step: Option<u64>,
    pub total: Option<u64>,
    pub epoch: Option<String>,
    pub phase: Option<String>,
    pub steps_per_second: Option<f64>,
    #[serde(default)]
    pub bytes_per_step: Option<i64>,
    #[serde(default)]
    pub ceiling_step: Option<u64>,
}

/// Parses a line: envelope fields must be present with the right types,
/// and the rest must be exactly one known event (serde's `flatten` cannot
/// be combined with `deny_unknown_fields`, hence the two steps).
pub fn parse_line(text: &str) -> Result<Line, String> {
    let mut v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let obj = v.as_object_mut().ok_or("not an object")?;
    let mut take = |k: &str| obj.remove(k).ok_or(format!("missing '{k}'"));
    let schema = take("schema")?
        .as_str()
        .ok_or("schema not a string")?
        .to_string();
    let ts = take("ts")?.as_str().ok_or("ts not a string")?.to_string();
    let t = take("t")?.as_f64().ok_or("t not a number")?;
    let attempt = take("attempt")?.as_u64().ok_or("attempt not an integer")? as u32;
    let progress = match obj.remove("progress") {
        Some(p) => Some(serde_json::from_value(p).map_err(|e| format!("progress: {e}"))?),
        None => None,
    };
    let event = serde_json::from_value(v).map_err(|e| e.to_string())?;
    Ok(Line {
        schema,
        ts,
        t,
        attempt,
        progress,
        event,
    })
}

/// Lines are read a log at a time in tests: a variant's size is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    RunStart(RunStart),
    Sample(Box<Sample>),
    ChildExit(ChildExit),
    RunEnd(RunEnd),
    Rule(Rule),
    Action(Action),
    Restart(serde_json::Value),
    Checkpoint(serde_json::Value),
    OomKill(serde_json::Value),
    CudaOom(serde_json::Value),
    WorkerDied(serde_json::Value),
    RankFailed(serde_json::Value),
    PhaseMemory(serde_json::Value),
    Companion(serde_json::Value),
    CheckpointRequest(serde_json::Value),
    CheckpointAck(serde_json::Value),
    CheckpointDone(serde_json::Value),
    Relieved(serde_json::Value),
    Fault(serde_json::Value),
    FaultPublished(serde_json::Value),
    StoreLost(serde_json::Value),
    StoreUnsteady(StoreUnsteady),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ceiling {
    pub source: String,
    pub bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunStart {
    pub argv: Vec<String>,
    pub pid: u32,
    pub ceilings: Vec<Ceiling>,
    pub cgroup: Option<CgroupInfo>,
    pub policy: serde_json::Value,
    pub gpu: GpuInfo,
    pub version: String,
    pub interval_seconds: f64,
    pub pss_interval_seconds: f64,
    /// `--log-every-tick` recordings only.
    #[serde(default)]
    pub every_tick: bool,
    /// The run within its job (absent when nothing identifies it).
    #[serde(default)]
    pub ids: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CgroupInfo {
    pub version: u8,
    pub path: String,
    pub owned: bool,
    #[serde(default)]
    pub not_owned_reason: Option<String>,
    #[serde(default)]
    pub via: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    /// Absent in logs written before `attach` used the job's cgroup.
    #[serde(default)]
    pub exclusive: bool,
    #[serde(default)]
    pub not_exclusive_reason: Option<String>,
    /// What oomguard wrote to its own v2 cgroup's `memory.high`.
    #[serde(default)]
    pub memory_high_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInfo {
    pub available: bool,
    pub reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    pub headroom_bytes: Option<u64>,
    pub headroom_percent: Option<f64>,
    pub ceiling: Option<Ceiling>,
    pub eta_seconds: Option<f64>,
    pub tree: Tree,
    /// Added within oomguard/1 (issue 12): older logs lack it.
    #[serde(default)]
    pub roles: Vec<RoleTotals>,
    pub system: System,
    pub cgroup: Option<Cgroup>,
    pub psi: Option<Psi>,
    /// `/dev/shm` as the job sees it, when it is a tmpfs (issue 50).
    #[serde(default)]
    pub shm: Option<Shm>,
    #[serde(default)]
    pub gpus: Vec<serde_json::Value>,
    #[serde(default)]
    pub procs: Option<Vec<Proc>>,
    #[serde(default)]
    pub torch: Vec<TorchProc>,
    /// Policy inputs for `oomguard replay` (absent when unknown or zero).
    #[serde(default)]
    pub fastest_growth_bytes_per_s: Option<f64>,
    #[serde(default)]
    pub gpu_eta_seconds: Option<f64>,
    #[serde(default)]
    pub torch_fragmentation_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleTotals {
    pub role: String,
    pub pss_bytes: u64,
    pub rss_bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TorchProc {
    pub pid: u32,
    pub devices: Vec<TorchDevice>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TorchDevice {
    pub device: u32,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub max_allocated_bytes: u64,
    pub alloc_retries: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tree {
    pub procs: u32,
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    pub uss_bytes: u64,
    pub swap_bytes: u64,
    pub footprint_bytes: u64,
    pub pss_age_seconds: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct System {
    pub mem_total_bytes: u64,
    pub mem_available_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_used_bytes: u64,
    pub swap_in_bytes_per_s: f64,
    pub swap_out_bytes_per_s: f64,
    #[serde(default)]
    pub oom_kill_total: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cgroup {
    pub version: u8,
    /// On lines with `procs` (and in `run_start`): fixed for the run.
    #[serde(default)]
    pub path: String,
    pub usage_bytes: u64,
    pub limit_bytes: Option<u64>,
    pub oom_kill_count: Option<u64>,
    #[serde(default)]
    pub limit_path: Option<String>,
    #[serde(default)]
    pub limit_working_set_bytes: Option<u64>,
    pub owned: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Psi {
    pub some_avg10: f64,
    pub full_avg10: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub role: String,
    pub comm: String,
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    pub uss_bytes: u64,
    pub swap_bytes: u64,
    #[serde(default)]
    pub rss_peak_bytes: Option<u64>,
    #[serde(default)]
    pub gpu_bytes: Option<u64>,
    #[serde(default)]
    pub torch: Option<Vec<TorchDevice>>,
    /// Absent while the process has not been read (its figures are the
    /// sweeper's estimate).
    #[serde(default)]
    pub read_age_seconds: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildExit {
    pub pid: u32,
    #[serde(default)]
    pub code: Option<i32>,
    #[serde(default)]
    pub signal: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peak {
    /// Absent in logs written before it (the fixtures).
    #[serde(default)]
    pub footprint_bytes: u64,
    #[serde(default)]
    pub footprint_t: f64,
    pub tree_pss_bytes: u64,
    pub tree_rss_bytes: u64,
    pub swap_used_bytes: u64,
    pub gpu_used_bytes: u64,
    pub t: f64,
    /// Absent in logs written before it.
    #[serde(default)]
    pub largest_process_rss_bytes: u64,
    /// The fullest `/dev/shm` was, when it was a ceiling.
    #[serde(default)]
    pub shm: Option<Shm>,
}

/// oomguard's link to the job's store failed and is trying again.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreUnsteady {
    pub addr: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shm {
    pub size_bytes: u64,
    pub used_bytes: u64,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShmSegments {
    pub files: u32,
    pub bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunEnd {
    pub outcome: String,
    pub exit_code: i32,
    pub peak: Peak,
    pub restarts: u32,
    pub actions: BTreeMap<String, u32>,
    pub duration_seconds: f64,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub fail_above: Option<FailAbove>,
    /// `attach` only: false (a non-parent never sees the job's code).
    #[serde(default)]
    pub exit_code_known: Option<bool>,
    /// `attach`, `outcome: detached`: why the watch ended, and the job's
    /// processes still alive then.
    #[serde(default)]
    pub detached_reason: Option<String>,
    #[serde(default)]
    pub still_running_pids: Option<Vec<u32>>,
    #[serde(default)]
    pub output_dropped_bytes: Option<u64>,
    /// The cheap loop's reads and their time, when it ran.
    #[serde(default)]
    pub cheap_loop: Option<CheapLoop>,
    /// Signals refused because the pid had become another process.
    #[serde(default)]
    pub reused_pids_refused: Option<u64>,
    #[serde(default)]
    pub not_saved: Option<String>,
    #[serde(default)]
    pub output_log_left_out_bytes: Option<u64>,
    /// `torch_<pid>_…` files the job left in `/dev/shm`, removed.
    #[serde(default)]
    pub shm_segments_removed: Option<ShmSegments>,
    /// Which wake-ups were armed and how often each woke the loop.
    #[serde(default)]
    pub wakeups: Option<Wakeups>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wakeups {
    pub usage_threshold: WakeSource,
    pub psi: WakeSource,
    pub memory_events: WakeSource,
    pub cheap_loop: WakeSource,
    pub poll: WakeSource,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WakeSource {
    pub armed: bool,
    pub woke: u64,
    #[serde(default)]
    pub refused: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheapLoop {
    pub reads: u64,
    pub seconds: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailAbove {
    pub limit_bytes: u64,
    pub exceeded: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub rule: String,
    pub metric: String,
    pub value: f64,
    pub threshold: f64,
    pub state: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    pub action: String,
    pub reason: String,
    pub pids: Vec<u32>,
    #[serde(default)]
    pub signal: Option<String>,
    pub result: String,
}

impl Line {
    pub fn sample(&self) -> Option<&Sample> {
        match &self.event {
            Event::Sample(s) => Some(s),
            _ => None,
        }
    }
}

/// Checks the envelope of every line and that run_end is last.
pub fn check_envelope(lines: &[Line]) {
    assert!(!lines.is_empty(), "empty log");
    for l in lines {
        assert_eq!(l.schema, "oomguard/1");
        assert!(l.ts.ends_with('Z') && l.ts.len() == 24, "ts {}", l.ts);
        assert!(l.t >= 0.0);
        assert!(l.attempt >= 1);
    }
    assert!(
        matches!(lines[0].event, Event::RunStart(_)),
        "run_start is not first"
    );
    // `t` never runs backwards (a millisecond of rounding aside): a line
    // an event caused comes after the sample that showed it.
    for w in lines.windows(2) {
        assert!(
            w[1].t + 0.001 >= w[0].t,
            "t runs backwards: {:?} at {} after {:?} at {}",
            w[1].event,
            w[1].t,
            w[0].event,
            w[0].t
        );
    }
    assert!(
        matches!(lines.last().unwrap().event, Event::RunEnd(_)),
        "run_end is not last"
    );
}

pub fn run_end(lines: &[Line]) -> &RunEnd {
    match &lines.last().unwrap().event {
        Event::RunEnd(e) => e,
        other => panic!("last line is {other:?}"),
    }
}
