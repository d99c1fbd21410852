//! Reading an `oomguard/1` NDJSON log back into a [`RunLog`]: the one place
//! that knows the log's field names on the reading side.
//!
//! Tolerant by design, because the log is written by a process that may be
//! killed at any moment and by versions of oomguard that add fields: unknown
//! fields and unknown events are ignored, missing fields are `None`, a line
//! that is not JSON (typically the last one, cut short), or a JSON line with
//! no `"schema"` string (a stray line from another tool, an edit by hand),
//! is skipped with a warning. Only a line that names another schema, or a
//! file with no oomguard line at all, is an error, since reading it as
//! `oomguard/1` would mislead.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

use super::ReportError;
use crate::log::SCHEMA;
use crate::model::Role;

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
    pub events: Vec<Event>,
    /// `run_end`, absent when oomguard itself died or is still running.
    pub end: Option<EndInfo>,
    /// One entry per attempt seen in the log, in order.
    pub attempts: Vec<Attempt>,
    /// Lines that were skipped, and why.
    pub warnings: Vec<String>,
    /// Every line that carried the job's training `progress`, in log order.
    pub progress: Vec<ProgressPoint>,
}

/// The job's training progress as one log line carried it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProgressPoint {
    pub t: f64,
    pub attempt: u32,
    /// The line's event (`sample`, `restart`, `run_end`, …).
    pub event: String,
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
    /// The effective rules (`policy.rules`).
    pub rules: Vec<PolicyRule>,
    pub gpu_available: Option<bool>,
    pub gpu_reason: Option<String>,
    pub version: Option<String>,
    pub interval_seconds: Option<f64>,
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
    pub action: String,
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
    pub gpus: Vec<GpuPoint>,
    /// PSS by role at this tick (lines that carry `roles`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub role_pss: Vec<(Role, u64)>,
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
}

/// One process in a [`Snapshot`].
#[derive(Debug, Clone, Serialize)]
pub struct ProcPoint {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub role: Role,
    pub comm: String,
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    pub uss_bytes: u64,
    pub swap_bytes: u64,
    pub gpu_bytes: Option<u64>,
}

/// A non-sample event. `seq` numbers the events that get a marker on the
/// timeline (1, 2, …) so tables and markers can refer to each other.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub seq: usize,
    pub t: f64,
    pub attempt: u32,
    /// 1-based line number in the log.
    pub line: usize,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened, with the fields each event carries (all optional where
/// the writer may leave them out).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    Rule {
        rule: String,
        metric: Option<String>,
        value: Option<f64>,
        threshold: Option<f64>,
        state: String,
    },
    Action {
        action: String,
        reason: Option<String>,
        pids: Vec<u32>,
        signal: Option<String>,
        result: Option<String>,
    },
    ChildExit {
        pid: Option<u32>,
        code: Option<i64>,
        signal: Option<String>,
    },
    Restart {
        /// The attempt that starts.
        next_attempt: Option<u32>,
        reason: Option<String>,
        checkpoint: Option<String>,
        /// `NAME -> [old, new]`, values as the log gives them.
        degraded: BTreeMap<String, (Value, Value)>,
        delay_seconds: Option<f64>,
    },
    OomKill {
        pid: Option<u32>,
        comm: Option<String>,
        role: Option<String>,
        anon_rss_bytes: Option<u64>,
        constraint: Option<String>,
    },
    CudaOom {
        device: Option<String>,
        pid: Option<u32>,
        tried_bytes: Option<u64>,
        total_bytes: Option<u64>,
        free_bytes: Option<u64>,
        allocated_bytes: Option<u64>,
        reserved_unallocated_bytes: Option<u64>,
        reserved_bytes: Option<u64>,
        advice: Option<String>,
    },
    WorkerDied {
        pid: Option<u32>,
        signal: Option<String>,
        exit_code: Option<i64>,
        shm_hint: bool,
    },
}

impl EventKind {
    /// The event name as the log spells it.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Rule { .. } => "rule",
            EventKind::Action { .. } => "action",
            EventKind::ChildExit { .. } => "child_exit",
            EventKind::Restart { .. } => "restart",
            EventKind::OomKill { .. } => "oom_kill",
            EventKind::CudaOom { .. } => "cuda_oom",
            EventKind::WorkerDied { .. } => "worker_died",
        }
    }

    /// Whether the timeline draws a marker for it (everything but
    /// `child_exit`, which the attempt boundaries already show).
    pub fn has_marker(&self) -> bool {
        !matches!(self, EventKind::ChildExit { .. })
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

/// Parses a whole log. See the module comment for what is tolerated.
///
/// Time: every line's `t` is kept as written, except when a new attempt
/// starts with a smaller `t` than the previous one (a writer that restarts
/// its clock per attempt); then the attempt is shifted to follow on, so the
/// timeline never runs backwards.
pub fn load(text: &str) -> Result<RunLog, ReportError> {
    let mut log = RunLog::default();
    let mut clock = Clock::default();
    let mut parsed_any = false;
    let mut first_foreign = None;
    let lines: Vec<&str> = text.lines().collect();
    let last_nonblank = lines.iter().rposition(|l| !l.trim().is_empty());
    let mut seq = 0;
    for (i, raw) in lines.iter().enumerate() {
        let n = i + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let obj = match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(obj)) => obj,
            Ok(_) => {
                log.warnings
                    .push(format!("line {n}: not a JSON object, skipped"));
                continue;
            }
            Err(e) => {
                if Some(i) == last_nonblank {
                    log.warnings.push(format!(
                        "line {n}: incomplete last line skipped (the log was cut short: {e})"
                    ));
                } else {
                    log.warnings
                        .push(format!("line {n}: not valid JSON, skipped ({e})"));
                }
                continue;
            }
        };
        match obj.get("schema") {
            Some(Value::String(s)) if s == SCHEMA => {}
            Some(other @ Value::String(_)) => {
                return Err(ReportError::Schema {
                    line: n,
                    found: match other {
                        Value::String(s) => s.clone(),
                        v => v.to_string(),
                    },
                });
            }
            Some(_) | None => {
                first_foreign.get_or_insert(n);
                log.warnings
                    .push(format!("line {n}: no \"schema\" string, skipped"));
                continue;
            }
        }
        parsed_any = true;
        let Some(event) = str_of(&obj, "event") else {
            log.warnings
                .push(format!("line {n}: no \"event\" field, skipped"));
            continue;
        };
        let attempt = u64_of(&obj, "attempt").map_or(clock.attempt.max(1), |a| {
            u32::try_from(a).unwrap_or(u32::MAX).max(1)
        });
        // A restart line may carry the attempt it starts (its body's
        // `attempt` overrides the envelope's) while stamped on the old
        // attempt's clock: it does not move the clock to the new attempt.
        let t = if event == "restart" {
            clock.place(clock.attempt.max(1), f64_of(&obj, "t"))
        } else {
            clock.place(attempt, f64_of(&obj, "t"))
        };
        if let Some(Value::Object(p)) = obj.get("progress") {
            log.progress.push(ProgressPoint {
                t,
                attempt,
                event: event.to_string(),
                step: u64_of(p, "step"),
                total: u64_of(p, "total"),
                epoch: p.get("epoch").and_then(|e| match e {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                }),
                phase: str_of(p, "phase").map(str::to_string),
                bytes_per_step: p.get("bytes_per_step").and_then(Value::as_i64),
                ceiling_step: u64_of(p, "ceiling_step"),
            });
        }
        if let Some(procs) = obj.get("procs").and_then(Value::as_array) {
            log.snapshots.push(Snapshot {
                t,
                attempt,
                procs: procs.iter().filter_map(proc_point).collect(),
            });
        }
        let kind = match event {
            "run_start" => {
                log.start = Some(start_info(&obj));
                continue;
            }
            "sample" => {
                let mut point = sample_point(&obj, t, attempt);
                // Per-GPU detail is written less often than the totals: a
                // line without it carries the last one forward.
                if !obj.contains_key("gpus")
                    && let Some(prev) = log.samples.last()
                {
                    point.gpus = prev.gpus.clone();
                }
                log.samples.push(point);
                continue;
            }
            "run_end" => {
                log.end = Some(end_info(&obj, t));
                continue;
            }
            "rule" => EventKind::Rule {
                rule: string_or(&obj, "rule", "?"),
                metric: string_of(&obj, "metric"),
                value: f64_of(&obj, "value"),
                threshold: f64_of(&obj, "threshold"),
                state: string_or(&obj, "state", "firing"),
            },
            "action" => EventKind::Action {
                action: string_or(&obj, "action", "?"),
                reason: string_of(&obj, "reason"),
                pids: obj
                    .get("pids")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(as_u32).collect())
                    .unwrap_or_default(),
                signal: name_of(&obj, "signal"),
                result: string_of(&obj, "result"),
            },
            "child_exit" => EventKind::ChildExit {
                pid: obj.get("pid").and_then(as_u32),
                code: i64_of(&obj, "code"),
                signal: name_of(&obj, "signal"),
            },
            "restart" => EventKind::Restart {
                next_attempt: obj.get("attempt").and_then(as_u32),
                reason: string_of(&obj, "reason"),
                checkpoint: string_of(&obj, "checkpoint"),
                degraded: degraded(&obj),
                delay_seconds: f64_of(&obj, "delay_seconds"),
            },
            "oom_kill" => EventKind::OomKill {
                pid: obj.get("pid").and_then(as_u32),
                comm: string_of(&obj, "comm"),
                role: role_text(obj.get("role")),
                anon_rss_bytes: u64_of(&obj, "anon_rss_bytes"),
                constraint: string_of(&obj, "constraint"),
            },
            "cuda_oom" => EventKind::CudaOom {
                device: obj.get("device").and_then(|v| match v {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                }),
                pid: obj.get("pid").and_then(as_u32),
                tried_bytes: u64_of(&obj, "tried_bytes"),
                total_bytes: u64_of(&obj, "total_bytes"),
                free_bytes: u64_of(&obj, "free_bytes"),
                allocated_bytes: u64_of(&obj, "allocated_bytes"),
                reserved_unallocated_bytes: u64_of(&obj, "reserved_unallocated_bytes"),
                reserved_bytes: u64_of(&obj, "reserved_bytes"),
                advice: string_of(&obj, "advice"),
            },
            "worker_died" => EventKind::WorkerDied {
                pid: obj.get("pid").and_then(as_u32),
                signal: name_of(&obj, "signal"),
                exit_code: i64_of(&obj, "exit_code"),
                shm_hint: obj
                    .get("shm_hint")
                    .is_some_and(|v| v.as_bool().unwrap_or(!v.is_null())),
            },
            // Events added later within oomguard/1: not ours to interpret.
            _ => continue,
        };
        if kind.has_marker() {
            seq += 1;
        }
        log.events.push(Event {
            seq: if kind.has_marker() { seq } else { 0 },
            t,
            attempt,
            line: n,
            kind,
        });
    }
    if !parsed_any {
        return Err(match first_foreign {
            Some(line) => ReportError::NotALog { line },
            None => ReportError::Empty,
        });
    }
    log.attempts = attempts(&log);
    Ok(log)
}

/// Places each line on one increasing time axis across attempts.
#[derive(Default)]
struct Clock {
    attempt: u32,
    offset: f64,
    last: f64,
}

impl Clock {
    fn place(&mut self, attempt: u32, t: Option<f64>) -> f64 {
        let attempt = attempt.max(1);
        let Some(raw) = t.filter(|t| t.is_finite()) else {
            self.attempt = self.attempt.max(attempt);
            return self.last;
        };
        // Time only runs backwards at a new attempt when the writer
        // restarted its clock; small disorder within an attempt (a sample
        // stamped with its own time after an event) is left alone.
        let placed = raw + self.offset;
        if attempt > self.attempt && self.attempt > 0 && placed < self.last {
            self.offset = self.last - raw;
        }
        self.attempt = self.attempt.max(attempt);
        let t = raw + self.offset;
        self.last = self.last.max(t);
        t
    }
}

fn attempts(log: &RunLog) -> Vec<Attempt> {
    let mut out: BTreeMap<u32, Attempt> = BTreeMap::new();
    fn touch(out: &mut BTreeMap<u32, Attempt>, n: u32, t: f64) {
        let a = out.entry(n).or_insert_with(|| Attempt {
            number: n,
            start_t: t,
            end_t: t,
            ..Default::default()
        });
        a.start_t = a.start_t.min(t);
        a.end_t = a.end_t.max(t);
    }
    for s in &log.samples {
        touch(&mut out, s.attempt, s.t);
    }
    for e in &log.events {
        // A restart line may carry the attempt it starts; it belongs to
        // the end of the previous one.
        if !matches!(e.kind, EventKind::Restart { .. }) {
            touch(&mut out, e.attempt, e.t);
        }
    }
    if out.is_empty() {
        touch(&mut out, 1, 0.0);
    }
    for s in &log.samples {
        if let Some(a) = out.get_mut(&s.attempt)
            && s.pss_bytes > a.peak_pss_bytes
        {
            a.peak_pss_bytes = s.pss_bytes;
            a.peak_pss_t = s.t;
        }
    }
    for snap in &log.snapshots {
        if let Some(a) = out.get_mut(&snap.attempt) {
            let workers = snap.procs.iter().filter(|p| p.role == Role::Worker).count();
            a.max_workers = a.max_workers.max(workers);
        }
    }
    for e in &log.events {
        match &e.kind {
            EventKind::ChildExit { code, signal, .. } => {
                if let Some(a) = out.get_mut(&e.attempt) {
                    a.exit_code = *code;
                    a.exit_signal.clone_from(signal);
                }
            }
            EventKind::Restart {
                next_attempt,
                reason,
                checkpoint,
                degraded,
                ..
            } => {
                let next = next_attempt
                    .unwrap_or(e.attempt.saturating_add(1))
                    .max(e.attempt);
                let ended = if next > e.attempt {
                    e.attempt
                } else {
                    e.attempt.saturating_sub(1)
                };
                let why = reason.clone().unwrap_or_else(|| "restart".into());
                if let Some(a) = out.get_mut(&ended) {
                    a.ended_by = format!("restarted: {why}");
                }
                // The envelope and the body may both say `attempt`; with
                // one key left, it names the attempt that starts.
                let n = next;
                let a = out.entry(n).or_insert_with(|| Attempt {
                    number: n,
                    start_t: e.t,
                    end_t: e.t,
                    ..Default::default()
                });
                a.degraded.clone_from(degraded);
                a.checkpoint.clone_from(checkpoint);
            }
            _ => {}
        }
    }
    let last = out.keys().next_back().copied();
    for a in out.values_mut() {
        if !a.ended_by.is_empty() {
            continue;
        }
        a.ended_by = if Some(a.number) == last {
            match &log.end {
                Some(end) => end
                    .outcome
                    .clone()
                    .map_or_else(|| "ended".to_string(), |o| o.replace('_', " ")),
                None => "log ends (no run_end)".to_string(),
            }
        } else {
            "ended".to_string()
        };
    }
    out.into_values().collect()
}

fn start_info(obj: &Map<String, Value>) -> StartInfo {
    let policy = obj.get("policy");
    let rules = policy
        .and_then(|p| p.get("rules"))
        .and_then(Value::as_array)
        .map(|rules| {
            rules
                .iter()
                .filter_map(Value::as_object)
                .map(|r| PolicyRule {
                    name: string_or(r, "name", ""),
                    metric: string_or(r, "metric", ""),
                    op: string_of(r, "op"),
                    threshold: f64_of(r, "threshold"),
                    unit: string_of(r, "unit"),
                    for_seconds: f64_of(r, "for_seconds"),
                    clear: f64_of(r, "clear"),
                    action: string_or(r, "action", ""),
                })
                .collect()
        })
        .unwrap_or_default();
    StartInfo {
        argv: obj
            .get("argv")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        pid: u64_of(obj, "pid"),
        ts: string_of(obj, "ts"),
        ceilings: obj
            .get("ceilings")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(ceiling).collect())
            .unwrap_or_default(),
        cgroup: obj
            .get("cgroup")
            .and_then(Value::as_object)
            .map(|c| (u64_of(c, "version").unwrap_or(0), string_or(c, "path", ""))),
        rules,
        gpu_available: obj
            .get("gpu")
            .and_then(|g| g.get("available"))
            .and_then(Value::as_bool),
        gpu_reason: obj
            .get("gpu")
            .and_then(|g| g.get("reason"))
            .and_then(Value::as_str)
            .map(str::to_string),
        version: string_of(obj, "version"),
        interval_seconds: f64_of(obj, "interval_seconds"),
    }
}

fn sample_point(obj: &Map<String, Value>, t: f64, attempt: u32) -> SamplePoint {
    let empty = Map::new();
    let tree = obj.get("tree").and_then(Value::as_object).unwrap_or(&empty);
    let system = obj
        .get("system")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let cgroup = obj.get("cgroup").and_then(Value::as_object);
    SamplePoint {
        t,
        attempt,
        procs: u64_of(tree, "procs"),
        pss_bytes: u64_of(tree, "pss_bytes").unwrap_or(0),
        rss_bytes: u64_of(tree, "rss_bytes").unwrap_or(0),
        uss_bytes: u64_of(tree, "uss_bytes").unwrap_or(0),
        tree_swap_bytes: u64_of(tree, "swap_bytes").unwrap_or(0),
        footprint_bytes: u64_of(tree, "footprint_bytes"),
        headroom_bytes: u64_of(obj, "headroom_bytes"),
        headroom_percent: f64_of(obj, "headroom_percent"),
        ceiling: obj.get("ceiling").and_then(ceiling),
        eta_seconds: f64_of(obj, "eta_seconds"),
        mem_total_bytes: u64_of(system, "mem_total_bytes"),
        mem_available_bytes: u64_of(system, "mem_available_bytes"),
        swap_total_bytes: u64_of(system, "swap_total_bytes"),
        swap_used_bytes: u64_of(system, "swap_used_bytes"),
        swap_in_bytes_per_s: f64_of(system, "swap_in_bytes_per_s"),
        swap_out_bytes_per_s: f64_of(system, "swap_out_bytes_per_s"),
        cgroup_usage_bytes: cgroup.and_then(|c| u64_of(c, "usage_bytes")),
        cgroup_limit_bytes: cgroup.and_then(|c| u64_of(c, "limit_bytes")),
        oom_kill_count: cgroup.and_then(|c| u64_of(c, "oom_kill_count")),
        role_pss: obj
            .get("roles")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|r| {
                        let r = r.as_object()?;
                        Some((role_of(r.get("role")), u64_of(r, "pss_bytes")?))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        gpus: obj
            .get("gpus")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .enumerate()
                    .filter_map(|(i, g)| {
                        let g = g.as_object()?;
                        Some(GpuPoint {
                            index: g.get("index").and_then(as_u32).unwrap_or(i as u32),
                            name: string_or(g, "name", "GPU"),
                            used_bytes: u64_of(g, "used_bytes")?,
                            total_bytes: u64_of(g, "total_bytes").unwrap_or(0),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn end_info(obj: &Map<String, Value>, t: f64) -> EndInfo {
    EndInfo {
        t,
        outcome: string_of(obj, "outcome"),
        exit_code: i64_of(obj, "exit_code"),
        peak: obj
            .get("peak")
            .and_then(Value::as_object)
            .map(|p| PeakInfo {
                tree_pss_bytes: u64_of(p, "tree_pss_bytes"),
                tree_rss_bytes: u64_of(p, "tree_rss_bytes"),
                swap_used_bytes: u64_of(p, "swap_used_bytes"),
                gpu_used_bytes: u64_of(p, "gpu_used_bytes"),
                t: f64_of(p, "t"),
            }),
        restarts: u64_of(obj, "restarts"),
        actions: obj
            .get("actions")
            .and_then(Value::as_object)
            .map(|a| {
                a.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default(),
        duration_seconds: f64_of(obj, "duration_seconds"),
        error: string_of(obj, "error"),
    }
}

fn proc_point(v: &Value) -> Option<ProcPoint> {
    let p = v.as_object()?;
    Some(ProcPoint {
        pid: p.get("pid").and_then(as_u32)?,
        ppid: p.get("ppid").and_then(as_u32),
        role: role_of(p.get("role")),
        comm: string_or(p, "comm", "?"),
        rss_bytes: u64_of(p, "rss_bytes").unwrap_or(0),
        pss_bytes: u64_of(p, "pss_bytes").unwrap_or(0),
        uss_bytes: u64_of(p, "uss_bytes").unwrap_or(0),
        swap_bytes: u64_of(p, "swap_bytes").unwrap_or(0),
        gpu_bytes: u64_of(p, "gpu_bytes"),
    })
}

fn ceiling(v: &Value) -> Option<CeilingInfo> {
    let c = v.as_object()?;
    Some(CeilingInfo {
        source: string_or(c, "source", "?"),
        bytes: u64_of(c, "bytes")?,
    })
}

fn degraded(obj: &Map<String, Value>) -> BTreeMap<String, (Value, Value)> {
    let Some(d) = obj.get("degraded").and_then(Value::as_object) else {
        return BTreeMap::new();
    };
    d.iter()
        .map(|(k, v)| {
            let pair = match v.as_array().map(Vec::as_slice) {
                Some([old, new, ..]) => (old.clone(), new.clone()),
                Some([new]) => (Value::Null, new.clone()),
                _ => (Value::Null, v.clone()),
            };
            (k.clone(), pair)
        })
        .collect()
}

/// A role name, or for the richer shapes other writers may use
/// (`{"role": "worker", "index": 3}`), its `role` member.
fn role_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => string_of(o, "role").or_else(|| string_of(o, "name")),
        _ => None,
    }
}

fn role_of(v: Option<&Value>) -> Role {
    match role_text(v).as_deref() {
        Some("launcher") => Role::Launcher,
        Some("trainer") => Role::Trainer,
        Some("worker") => Role::Worker,
        _ => Role::Other,
    }
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn u64_of(obj: &Map<String, Value>, key: &str) -> Option<u64> {
    let v = obj.get(key)?;
    // Writers may print a size as a float; a negative size is nonsense.
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| *f >= 0.0 && f.is_finite())
            .map(|f| f as u64)
    })
}

fn i64_of(obj: &Map<String, Value>, key: &str) -> Option<i64> {
    obj.get(key)?.as_i64()
}

fn f64_of(obj: &Map<String, Value>, key: &str) -> Option<f64> {
    obj.get(key)?.as_f64().filter(|f| f.is_finite())
}

fn str_of<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key)?.as_str()
}

fn string_of(obj: &Map<String, Value>, key: &str) -> Option<String> {
    str_of(obj, key).map(str::to_string)
}

fn string_or(obj: &Map<String, Value>, key: &str, default: &str) -> String {
    str_of(obj, key).unwrap_or(default).to_string()
}

/// A signal as a name: `"SIGKILL"` stays, a number becomes `signal 9`.
fn name_of(obj: &Map<String, Value>, key: &str) -> Option<String> {
    match obj.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(format!("signal {n}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(event: &str, t: f64, attempt: u32, body: &str) -> String {
        let sep = if body.is_empty() { "" } else { "," };
        format!(
            r#"{{"schema":"oomguard/1","event":"{event}","ts":"2026-01-01T00:00:00.000Z","t":{t},"attempt":{attempt}{sep}{body}}}"#
        )
    }

    fn sample(t: f64, attempt: u32, pss: u64) -> String {
        line(
            "sample",
            t,
            attempt,
            &format!(
                r#""tree":{{"procs":2,"pss_bytes":{pss},"rss_bytes":{}}},"gpus":[]"#,
                pss * 2
            ),
        )
    }

    #[test]
    fn reads_samples_and_ignores_unknown_fields_and_events() {
        let text = [
            line(
                "run_start",
                0.0,
                1,
                r#""argv":["python","t.py"],"future":{"x":1}"#,
            ),
            sample(1.0, 1, 100),
            line("telemetry_v9", 1.5, 1, r#""anything":true"#),
            line(
                "rule",
                2.0,
                1,
                r#""rule":"warn","value":12.5,"state":"firing","new_field":[1]"#,
            ),
            sample(2.0, 1, 150),
            line("run_end", 3.0, 1, r#""outcome":"exited","exit_code":0"#),
        ]
        .join("\n");
        let log = load(&text).unwrap();
        assert_eq!(log.start.unwrap().argv, ["python", "t.py"]);
        assert_eq!(log.samples.len(), 2);
        assert_eq!(log.samples[1].rss_bytes, 300);
        assert_eq!(log.events.len(), 1);
        assert_eq!(log.events[0].seq, 1);
        assert!(log.warnings.is_empty(), "{:?}", log.warnings);
        assert_eq!(log.end.unwrap().exit_code, Some(0));
    }

    #[test]
    fn truncated_last_line_is_skipped_with_a_warning() {
        let full = [sample(1.0, 1, 100), sample(2.0, 1, 200)].join("\n");
        let text = format!("{full}\n{}", &sample(3.0, 1, 300)[..40]);
        let log = load(&text).unwrap();
        assert_eq!(log.samples.len(), 2);
        assert_eq!(log.warnings.len(), 1);
        assert!(log.warnings[0].starts_with("line 3: incomplete last line"));
        assert!(log.end.is_none());
    }

    #[test]
    fn another_schema_is_an_error_naming_the_line() {
        let text = [
            sample(1.0, 1, 100),
            r#"{"schema":"oomguard/2","event":"sample","t":2}"#.to_string(),
        ]
        .join("\n");
        let e = load(&text).unwrap_err();
        assert!(matches!(e, ReportError::Schema { line: 2, .. }), "{e:?}");
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(e.to_string().contains("oomguard/2"), "{e}");
        let e = load("{\"event\":\"sample\"}\n").unwrap_err();
        assert!(matches!(e, ReportError::NotALog { line: 1 }), "{e:?}");
        assert!(matches!(load("\n\n").unwrap_err(), ReportError::Empty));
        assert!(matches!(load("garbage\n").unwrap_err(), ReportError::Empty));
    }

    #[test]
    fn a_line_without_a_schema_is_skipped_with_a_warning() {
        let text = [
            sample(1.0, 1, 100),
            r#"{"event":"sample","t":2}"#.to_string(),
            r#"{"schema":1,"event":"sample","t":3}"#.to_string(),
            sample(4.0, 1, 200),
        ]
        .join("\n");
        let log = load(&text).unwrap();
        assert_eq!(log.samples.len(), 2);
        assert_eq!(log.warnings.len(), 2, "{:?}", log.warnings);
        assert!(log.warnings[0].starts_with("line 2: no \"schema\""));
        assert!(log.warnings[1].starts_with("line 3: no \"schema\""));
    }

    #[test]
    fn attempts_restarts_and_clock_resets() {
        let text = [
            sample(1.0, 1, 100),
            sample(2.0, 1, 300),
            line("child_exit", 2.5, 1, r#""pid":10,"signal":"SIGTERM""#),
            line(
                "restart",
                3.0,
                2,
                r#""attempt":2,"reason":"critical","checkpoint":"ck/5.pt","degraded":{"NUM_WORKERS":[4,2]},"delay_seconds":1.0"#,
            ),
            // This writer restarted its clock for attempt 2.
            sample(0.5, 2, 120),
            sample(1.5, 2, 130),
            line("child_exit", 2.0, 2, r#""pid":11,"code":0"#),
            line("run_end", 2.1, 2, r#""outcome":"exited","exit_code":0"#),
        ]
        .join("\n");
        let log = load(&text).unwrap();
        let ts: Vec<f64> = log.samples.iter().map(|s| s.t).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
        assert_eq!(log.attempts.len(), 2);
        let (a1, a2) = (&log.attempts[0], &log.attempts[1]);
        assert_eq!(a1.peak_pss_bytes, 300);
        assert_eq!(a1.exit_signal.as_deref(), Some("SIGTERM"));
        assert_eq!(a1.ended_by, "restarted: critical");
        assert_eq!(a2.degraded["NUM_WORKERS"], (Value::from(4), Value::from(2)));
        assert_eq!(a2.checkpoint.as_deref(), Some("ck/5.pt"));
        assert_eq!(a2.exit_code, Some(0));
        assert_eq!(a2.ended_by, "exited");
        assert!(a2.start_t >= a1.end_t);
    }

    #[test]
    fn procs_from_any_line_and_unknown_roles() {
        let text = [
            line(
                "sample",
                1.0,
                1,
                r#""tree":{"pss_bytes":10},"procs":[{"pid":5,"role":"trainer","comm":"python","pss_bytes":7,"uss_bytes":6},{"pid":6,"role":"helper","pss_bytes":3},{"role":"worker"}]"#,
            ),
            line(
                "action",
                1.2,
                1,
                r#""action":"stop","reason":"critical","pids":[5],"signal":15,"result":"ok","procs":[{"pid":5,"role":"trainer","pss_bytes":8}]"#,
            ),
        ]
        .join("\n");
        let log = load(&text).unwrap();
        assert_eq!(log.snapshots.len(), 2);
        assert_eq!(log.snapshots[0].procs.len(), 2);
        assert_eq!(log.snapshots[0].procs[1].role, Role::Other);
        match &log.events[0].kind {
            EventKind::Action { signal, pids, .. } => {
                assert_eq!(signal.as_deref(), Some("signal 15"));
                assert_eq!(pids, &[5]);
            }
            k => panic!("{k:?}"),
        }
    }

    #[test]
    fn garbage_in_the_middle_is_skipped() {
        let text = [
            sample(1.0, 1, 1),
            "{not json".into(),
            "[1,2]".into(),
            sample(2.0, 1, 2),
        ]
        .join("\n");
        let log = load(&text).unwrap();
        assert_eq!(log.samples.len(), 2);
        assert_eq!(log.warnings.len(), 2, "{:?}", log.warnings);
        assert!(log.warnings[0].contains("line 2: not valid JSON"));
    }
}
