//! Reading an `oomguard/1` NDJSON log back into a [`RunLog`]: the one place
//! that knows the log's field names on the reading side.
//!
//! Tolerant by design, because the log is written by a process that may be
//! killed at any moment and by versions of oomguard that add fields: unknown
//! fields and unknown events are ignored, missing fields are `None` (every
//! line is read through its type in `crate::sinks::log`, the same type that writes
//! it; a field of the wrong type reads as absent), a line
//! that is not JSON (typically the last one, cut short), or a JSON line with
//! no `"schema"` string (a stray line from another tool, an edit by hand),
//! is skipped with a warning. Only a line that names another schema, or a
//! file with no oomguard line at all, is an error, since reading it as
//! `oomguard/1` would mislead.

use super::error::ReportError;
pub use super::run_log::{
    Attempt, CeilingInfo, EndInfo, GpuPoint, PeakInfo, PolicyRule, ProcPoint, ProgressPoint,
    RunLog, SamplePoint, Snapshot, StartInfo, Timed,
};
use crate::sinks::log::read::{Item, Line, LogLines, Skip};
use crate::sinks::log::{ActionKind, EventName};
use crate::sinks::log::{Event as Logged, LineProcs, RunEnd, RunStart, SampleEvent};
use crate::vocab::forensics::progress::Progress;
use crate::vocab::model::{Ceiling, ProcSample, Role, SystemSample};

/// How many skipped lines are listed one by one.
pub const LISTED_WARNINGS: usize = 20;

/// Parses a whole log held in memory; see [`load_from`].
pub fn load(text: &str) -> Result<RunLog, ReportError> {
    load_from(text.as_bytes()).map_err(|e| match e {
        LoadError::Log(e) => e,
        // A byte slice cannot fail to read.
        LoadError::Read(source) => ReportError::Read {
            path: "-".into(),
            source,
        },
    })
}

/// Why [`load_from`] failed: the input could not be read, or what it
/// holds is not a log.
#[derive(Debug)]
pub enum LoadError {
    Read(std::io::Error),
    Log(ReportError),
}

/// Parses a log a line at a time. See the module comment for what is
/// tolerated. Memory follows what the report keeps (samples, events), not
/// the text: a line longer than [`crate::vocab::forensics::MAX_LINE_BYTES`] is
/// skipped without being held, and bytes that are not UTF-8 are replaced.
///
/// Time: every line's `t` is kept as written, except when a new attempt
/// starts with a smaller `t` than the previous one (a writer that restarts
/// its clock per attempt); then the attempt is shifted to follow on, so the
/// timeline never runs backwards.
pub fn load_from(input: impl std::io::BufRead) -> Result<RunLog, LoadError> {
    let mut r = Reader::default();
    for item in LogLines::new(input) {
        match item.map_err(LoadError::Read)? {
            Item::Line(line) => r.line(*line),
            Item::Skipped { n, why } => r.skipped(n, why).map_err(LoadError::Log)?,
        }
    }
    if !r.parsed_any {
        return Err(LoadError::Log(match r.first_foreign {
            Some(line) => ReportError::NotALog { line },
            None => ReportError::Empty,
        }));
    }
    let mut log = r.log;
    log.run_of = (1, 1);
    tie_ranks_to_oom_kills(&mut log);
    log.attempts = super::attempts::attempts(&log);
    Ok(log)
}

/// A failed rank whose pid the kernel OOM killer took: said so on the
/// rank's event, wherever the two lines are in the log (torchrun may
/// report the failure before oomguard reads the kernel's report).
fn tie_ranks_to_oom_kills(log: &mut RunLog) {
    let killed = log.oom_killed_pids();
    for e in &mut log.events {
        if let Logged::RankFailed(r) = &mut e.event
            && r.pid.is_some_and(|p| killed.contains(&p))
        {
            r.tie_to_oom_kill();
        }
    }
}

/// The state of a [`load`] between lines.
#[derive(Default)]
struct Reader {
    log: RunLog,
    clock: Clock,
    parsed_any: bool,
    first_foreign: Option<usize>,
    /// The last marker number given.
    seq: usize,
}

impl Reader {
    /// A skipped line: listed while few, counted after.
    fn warn(&mut self, text: String) {
        if self.log.warnings.len() < LISTED_WARNINGS {
            self.log.warnings.push(text);
        } else {
            self.log.unlisted_warnings += 1;
        }
    }

    /// Takes a line of ours.
    fn line(&mut self, line: Line) {
        let Line {
            n,
            head,
            raw,
            event: read,
        } = line;
        self.parsed_any = true;
        let Some(event) = head.event.clone() else {
            self.warn(format!("line {n}: no \"event\" field, skipped"));
            return;
        };
        let attempt = head.attempt.map_or(self.clock.attempt.max(1), |a| {
            u32::try_from(a).unwrap_or(u32::MAX).max(1)
        });
        // A restart line may carry the attempt it starts (its body's
        // `attempt` overrides the envelope's) while stamped on the old
        // attempt's clock: it does not move the clock to the new attempt.
        let named = EventName::from_name(&event);
        let t = if named == Some(EventName::Restart) {
            self.clock.place(self.clock.attempt.max(1), head.t)
        } else {
            self.clock.place(attempt, head.t)
        };
        if let Some(p) = &head.progress {
            self.log.progress.push(progress_point(p, t, attempt, named));
        }
        let procs = if named == Some(EventName::Sample) {
            None
        } else {
            serde_json::from_str::<LineProcs>(&raw)
                .unwrap_or_default()
                .procs
        };
        self.snapshot(procs.as_deref(), t, attempt, None);
        match read.map(|e| e.map_or(Read::Unknown, read_as)) {
            Ok(Read::Start(s)) => self.log.start = Some(start_info(*s, head.ts)),
            Ok(Read::Sample(s)) => {
                self.snapshot(s.procs.as_deref(), t, attempt, Some(s.tree.pss_age_seconds));
                let mut point = sample_point(&s, t, attempt);
                // Per-GPU detail is written less often than the totals: a
                // line without it carries the last one forward.
                if s.gpus.is_empty()
                    && let Some(prev) = self.log.samples.last()
                {
                    point.gpus = prev.gpus.clone();
                }
                self.log.samples.push(point);
            }
            Ok(Read::End(e)) => self.log.end = Some(end_info(&e, t)),
            Ok(Read::Event(event)) => {
                let mut timed = Timed {
                    seq: 0,
                    t,
                    attempt,
                    line: n,
                    line_attempt: head.attempt.and_then(|a| u32::try_from(a).ok()),
                    event,
                };
                if timed.has_marker() {
                    self.seq += 1;
                    timed.seq = self.seq;
                }
                self.log.events.push(timed);
            }
            Ok(Read::Rank(rank)) => {
                if let Some(r) = rank
                    && let Err(at) = self.log.ranks.binary_search(&r)
                {
                    self.log.ranks.insert(at, r);
                }
            }
            Ok(Read::Unknown) => {}
            Err(e) => {
                self.warn(format!("line {n}: {event} not readable, skipped ({e})"));
                if named == Some(EventName::RunEnd) {
                    self.log.end = Some(EndInfo {
                        t,
                        ..EndInfo::default()
                    });
                }
            }
        }
    }

    fn snapshot(&mut self, procs: Option<&[ProcSample]>, t: f64, attempt: u32, age: Option<f64>) {
        if let Some(procs) = procs {
            self.log.snapshots.push(Snapshot {
                t,
                attempt,
                pss_age_seconds: age,
                procs: procs.iter().map(proc_point).collect(),
            });
        }
    }

    /// A line that is not ours: a warning, or an error when it names
    /// another schema (reading it as `oomguard/1` would mislead).
    fn skipped(&mut self, n: usize, why: Skip) -> Result<(), ReportError> {
        let text = match why {
            Skip::TooLong => format!(
                "line {n}: longer than {} MiB, skipped",
                crate::vocab::forensics::MAX_LINE_BYTES >> 20
            ),
            Skip::NotAnObject => format!("line {n}: not a JSON object, skipped"),
            Skip::NotJson { error, last: true } => {
                format!("line {n}: incomplete last line skipped (the log was cut short: {error})")
            }
            Skip::NotJson { error, last: false } => {
                format!("line {n}: not valid JSON, skipped ({error})")
            }
            Skip::NoSchema => {
                self.first_foreign.get_or_insert(n);
                format!("line {n}: no \"schema\" string, skipped")
            }
            Skip::OtherSchema(found) => return Err(ReportError::Schema { line: n, found }),
        };
        self.warn(text);
        Ok(())
    }
}

/// What one line is, read through its type in `crate::sinks::log`.
enum Read {
    Start(Box<RunStart>),
    Sample(Box<SampleEvent>),
    End(Box<RunEnd>),
    Event(Logged),
    /// A companion's hello, with its global rank.
    Rank(Option<u32>),
    /// An event added later within `oomguard/1`: not ours to interpret.
    Unknown,
}

/// What a line's event means to the report.
fn read_as(event: Logged) -> Read {
    match event {
        Logged::RunStart(s) => Read::Start(s),
        Logged::Sample(s) => Read::Sample(s),
        Logged::RunEnd(e) => Read::End(e),
        Logged::Companion(c) => Read::Rank(Some(c.rank)),
        Logged::Rule(mut r) => {
            // Figures a writer could not state (an ETA of never) read as
            // absent, and a rule with no name still gets a mark.
            if r.rule.is_empty() {
                r.rule = "?".into();
            }
            r.value = r.value.filter(|x| x.is_finite());
            r.threshold = r.threshold.filter(|x| x.is_finite());
            Read::Event(Logged::Rule(r))
        }
        Logged::Restart(mut r) => {
            r.delay_seconds = r.delay_seconds.filter(|x| x.is_finite());
            Read::Event(Logged::Restart(r))
        }
        e @ (Logged::Action(_)
        | Logged::ChildExit(_)
        | Logged::OomKill(_)
        | Logged::CudaOom(_)
        | Logged::WorkerDied(_)
        | Logged::RankFailed(_)
        | Logged::PhaseMemory(_)
        | Logged::Fault(_)
        | Logged::CheckpointDone(_)) => Read::Event(e),
        // Not drawn: the requests and acks are told by the saves they
        // lead to, and the store's state by the faults.
        Logged::Checkpoint(_)
        | Logged::CheckpointRequest(_)
        | Logged::CheckpointAck(_)
        | Logged::FaultPublished(_)
        | Logged::StoreLost(_)
        | Logged::StoreUnsteady(_)
        | Logged::Relieved(_) => Read::Unknown,
    }
}

fn nonempty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn progress_point(p: &Progress, t: f64, attempt: u32, event: Option<EventName>) -> ProgressPoint {
    ProgressPoint {
        t,
        attempt,
        event,
        step: p.step,
        total: p.total,
        epoch: p.epoch.clone(),
        phase: p.phase.map(|ph| ph.as_str().to_string()),
        bytes_per_step: p.bytes_per_step,
        ceiling_step: p.ceiling_step,
    }
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

fn start_info(s: RunStart, ts: Option<String>) -> StartInfo {
    let policy = s.policy.clone().unwrap_or_default();
    StartInfo {
        argv: s.argv,
        pid: Some(u64::from(s.pid)).filter(|&p| p > 0),
        ts,
        ceilings: s.ceilings.iter().map(ceiling).collect(),
        cgroup_exclusive: s.cgroup.as_ref().is_some_and(|c| c.exclusive || c.owned),
        cgroup: s.cgroup.map(|c| (u64::from(c.version), c.path)),
        rules: policy
            .rules
            .into_iter()
            .map(|r| PolicyRule {
                name: r.name,
                metric: r.metric,
                op: r.op,
                threshold: r.threshold,
                unit: r.unit,
                for_seconds: r.for_seconds,
                clear: r.clear,
                action: ActionKind::from_name(&r.action),
            })
            .collect(),
        gpu_available: Some(s.gpu.available),
        gpu_reason: s.gpu.reason,
        version: nonempty(s.version),
        interval_seconds: Some(s.interval_seconds).filter(|&i| i > 0.0),
        ids: s.ids.unwrap_or_default(),
    }
}

fn sample_point(s: &SampleEvent, t: f64, attempt: u32) -> SamplePoint {
    // A line without `system` reads as all zeros: the machine's figures
    // are then unknown, not zero.
    let sys = (s.system != SystemSample::default()).then_some(&s.system);
    let cgroup = s.cgroup.as_ref();
    SamplePoint {
        t,
        attempt,
        procs: Some(u64::from(s.tree.procs)).filter(|&p| p > 0),
        pss_bytes: s.tree.pss_bytes,
        rss_bytes: s.tree.rss_bytes,
        uss_bytes: s.tree.uss_bytes,
        tree_swap_bytes: s.tree.swap_bytes,
        footprint_bytes: Some(s.tree.footprint_bytes).filter(|&f| f > 0),
        headroom_bytes: s.headroom_bytes,
        headroom_percent: s.headroom_percent.filter(|p| p.is_finite()),
        ceiling: s.ceiling.as_ref().map(ceiling),
        eta_seconds: s.eta_seconds.filter(|e| e.is_finite()),
        mem_total_bytes: sys.map(|s| s.mem_total_bytes),
        mem_available_bytes: sys.map(|s| s.mem_available_bytes),
        swap_total_bytes: sys.map(|s| s.swap_total_bytes),
        swap_used_bytes: sys.map(|s| s.swap_used_bytes),
        swap_in_bytes_per_s: sys.map(|s| s.swap_in_bytes_per_s),
        swap_out_bytes_per_s: sys.map(|s| s.swap_out_bytes_per_s),
        cgroup_usage_bytes: cgroup.map(|c| c.usage_bytes),
        cgroup_limit_bytes: cgroup.and_then(|c| c.limit_bytes),
        oom_kill_count: cgroup.and_then(|c| c.oom_kill_count),
        cgroup_owned: cgroup.is_some_and(|c| c.owned),
        role_pss: s.roles.iter().map(|r| (r.role, r.pss_bytes)).collect(),
        role_rss: s.roles.iter().map(|r| (r.role, r.rss_bytes)).collect(),
        shm: s.shm,
        gpus: s
            .gpus
            .iter()
            .map(|g| GpuPoint {
                index: g.index,
                name: nonempty(g.name.clone()).unwrap_or_else(|| "GPU".into()),
                used_bytes: g.used_bytes,
                total_bytes: g.total_bytes,
            })
            .collect(),
    }
}

fn end_info(e: &RunEnd, t: f64) -> EndInfo {
    EndInfo {
        t,
        outcome: serde_json::to_value(e.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string)),
        exit_code: Some(i64::from(e.exit_code)),
        peak: Some(PeakInfo {
            tree_pss_bytes: Some(e.peak.tree_pss_bytes),
            tree_rss_bytes: Some(e.peak.tree_rss_bytes),
            swap_used_bytes: Some(e.peak.swap_used_bytes),
            gpu_used_bytes: Some(e.peak.gpu_used_bytes),
            t: Some(e.peak.t),
        }),
        restarts: Some(u64::from(e.restarts)),
        actions: e
            .actions
            .iter()
            .map(|(k, v)| (k.clone(), u64::from(*v)))
            .collect(),
        duration_seconds: Some(e.duration_seconds),
        error: e.error.clone(),
        exit_code_known: e.exit_code_known,
        detached_reason: e.detached_reason.clone(),
        still_running_pids: e.still_running_pids.clone().unwrap_or_default(),
    }
}

fn proc_point(p: &ProcSample) -> ProcPoint {
    ProcPoint {
        estimated: p.role == Role::Worker && p.pss_bytes == p.uss_bytes,
        pid: p.pid,
        ppid: Some(p.ppid).filter(|&pp| pp > 0),
        role: p.role,
        comm: nonempty(p.comm.clone()).unwrap_or_else(|| "?".into()),
        rss_bytes: p.rss_bytes,
        rss_peak_bytes: p.rss_peak_bytes,
        pss_bytes: p.pss_bytes,
        uss_bytes: p.uss_bytes,
        swap_bytes: p.swap_bytes,
        gpu_bytes: p.gpu_bytes,
        read_age_seconds: p.read_age_seconds,
    }
}

fn ceiling(c: &Ceiling) -> CeilingInfo {
    CeilingInfo {
        source: c.source.as_str().to_string(),
        bytes: c.bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

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
        match &log.events[0].event {
            Logged::Action(crate::sinks::log::ActionEvent { signal, pids, .. }) => {
                assert_eq!(signal.as_deref(), Some("signal 15"));
                assert_eq!(pids, &[5]);
            }
            k => panic!("{k:?}"),
        }
    }

    #[test]
    fn a_field_of_the_wrong_type_costs_the_field_not_the_line() {
        let text = [
            line(
                "sample",
                1.0,
                1,
                r#""headroom_percent":"n/a","tree":{"pss_bytes":10},"cgroup":"none","gpus":{}"#,
            ),
            line(
                "rule",
                2.0,
                1,
                r#""rule":"warn","value":"high","state":"firing""#,
            ),
            line("rank_failed", 3.0, 1, r#""rank":"one","pid":42,"signal":9"#),
            // An event this version does not read must not become one.
            line("phase_memory", 4.0, 1, r#""phase":"warmup""#),
        ]
        .join("\n");
        let log = load(&text).unwrap();
        assert_eq!(log.samples.len(), 1);
        assert_eq!(log.samples[0].pss_bytes, 10);
        assert_eq!(log.samples[0].headroom_percent, None);
        assert_eq!(log.samples[0].cgroup_usage_bytes, None);
        assert_eq!(log.events.len(), 2, "{:?}", log.events);
        assert!(matches!(
            &log.events[0].event,
            Logged::Rule(crate::sinks::log::RuleEvent { value: None, .. })
        ));
        match &log.events[1].event {
            Logged::RankFailed(r) => {
                assert_eq!((r.rank, r.pid), (None, Some(42)));
                assert_eq!(r.signal.as_deref(), Some("signal 9"));
            }
            k => panic!("{k:?}"),
        }
        assert_eq!(log.warnings.len(), 1, "{:?}", log.warnings);
        assert!(
            log.warnings[0].starts_with("line 4: phase_memory not readable"),
            "{:?}",
            log.warnings
        );
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
