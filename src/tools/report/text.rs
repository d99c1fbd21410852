//! The terminal and JSON renderings of a report, and the one-line wording
//! of events that every rendering shares.

use std::fmt::Write;

use serde_json::{Value, json};

use super::finding::{Finding, outcome_text, processes, time_text};
use super::run_log::{RunLog, Timed, child_pid, degraded, said};
use crate::sinks::log::Event as Logged;
use crate::sinks::log::{CudaOomEvent, FaultEvent, OomKillEvent, RestartEvent, WorkerDiedEvent};
use crate::vocab::model::CeilingSource;
use crate::vocab::units::HumanBytes;

/// One line saying what an event was, with its figures.
pub(super) fn event_summary(e: &Timed) -> String {
    match &e.event {
        Logged::Rule(r) => rule_summary(
            &r.rule,
            r.metric.as_deref(),
            r.value,
            r.threshold,
            r.state.as_str(),
        ),
        Logged::Action(a) => action_summary(
            a.action,
            said(&a.reason),
            &a.pids,
            a.signal.as_deref(),
            said(&a.result),
        ),
        Logged::ChildExit(c) => {
            let who = child_pid(c)
                .map_or_else(|| "the job".to_string(), |p| format!("the job (pid {p})"));
            match (c.code, &c.signal) {
                (_, Some(sig)) => format!("{who} was killed by {sig}"),
                (Some(c), None) => format!("{who} exited with {c}"),
                _ => format!("{who} ended"),
            }
        }
        Logged::Restart(r) => restart_summary(r, e.line_attempt),
        Logged::OomKill(k) => oom_kill_summary(k),
        Logged::CudaOom(c) => cuda_oom_summary(c),
        Logged::WorkerDied(w) => worker_died_summary(w),
        Logged::RankFailed(r) => r.describe(),
        Logged::PhaseMemory(p) => phase_memory_summary(p),
        Logged::CheckpointDone(d) => {
            let at = d.step.map_or(String::new(), |s| format!(" at step {s}"));
            let to = d
                .paths
                .first()
                .map_or(String::new(), |p| format!(" to {}", p.display()));
            let failed = if d.ok { "" } else { " (failed)" };
            format!("checkpoint{at}{to}{failed}")
        }
        Logged::Fault(f) => fault_summary(f),
        // The loader keeps none of the others as events.
        other => other.name().replace('_', " "),
    }
}

fn worker_died_summary(w: &WorkerDiedEvent) -> String {
    let mut s = match w.pid {
        Some(p) => format!("DataLoader worker {p} died"),
        None => "a DataLoader worker died".to_string(),
    };
    match (&w.signal, w.exit_code) {
        (Some(sig), _) => {
            let _ = write!(s, " ({sig})");
        }
        (None, Some(c)) => {
            let _ = write!(s, " (exit {c})");
        }
        _ => {}
    }
    if w.shm_hint {
        s.push_str(": shared memory (/dev/shm) exhausted");
    }
    s
}

fn fault_summary(f: &FaultEvent) -> String {
    let reason = f.reason.as_deref().unwrap_or("fault");
    match (f.remote, f.node) {
        (true, Some(n)) => format!(
            "another node's fault: {}",
            crate::vocab::companion::remote_cause(n, f.cause_rank, reason, f.detail.as_deref())
        ),
        _ => {
            let what = f
                .detail
                .as_deref()
                .map_or(String::new(), |d| format!(": {d}"));
            format!("fault of this node, told to the others: {reason}{what}")
        }
    }
}

fn rule_summary(
    rule: &str,
    metric: Option<&str>,
    value: Option<f64>,
    threshold: Option<f64>,
    state: &str,
) -> String {
    let m = metric.unwrap_or("");
    let mut s = format!("rule {rule} {state}");
    if let Some(v) = value {
        let _ = write!(s, ": {} {}", m, metric_value(m, v));
        if let Some(th) = threshold {
            let _ = write!(s, " (threshold {})", metric_value(m, th));
        }
    }
    s
}

fn action_summary(
    action: crate::sinks::log::ActionKind,
    reason: Option<&str>,
    pids: &[u32],
    signal: Option<&str>,
    result: Option<&str>,
) -> String {
    let mut s = action.to_string();
    if let Some(r) = reason {
        let _ = write!(s, " (rule {r})");
    }
    if let Some(sig) = signal {
        let _ = write!(s, ", {sig}");
    }
    if !pids.is_empty() {
        let shown: Vec<String> = pids.iter().take(8).map(u32::to_string).collect();
        let more = if pids.len() > 8 {
            format!(" +{}", pids.len() - 8)
        } else {
            String::new()
        };
        let _ = write!(s, " to pid {}{more}", shown.join(", "));
    }
    if let Some(r) = result
        && r != "ok"
    {
        let _ = write!(s, ": {r}");
    }
    s
}

fn restart_summary(r: &RestartEvent, next_attempt: Option<u32>) -> String {
    let mut s = match next_attempt {
        Some(n) => format!("restart as attempt {n}"),
        None => "restart".to_string(),
    };
    if let Some(why) = &r.reason {
        let _ = write!(s, " ({why})");
    }
    for (k, (old, new)) in degraded(&r.degraded) {
        let _ = write!(s, "; {k} {} → {}", plain(&old), plain(&new));
    }
    match &r.checkpoint {
        Some(c) => {
            let _ = write!(s, "; from checkpoint {}", c.display());
        }
        None => s.push_str("; no checkpoint confirmed"),
    }
    if let Some(d) = r.delay_seconds {
        let _ = write!(s, "; after {}", time_text(d));
    }
    s
}

fn oom_kill_summary(k: &OomKillEvent) -> String {
    let OomKillEvent {
        pid,
        comm,
        role,
        anon_rss_bytes,
        ..
    } = k;
    let mut s = "kernel OOM killer killed".to_string();
    if let Some(p) = pid {
        let _ = write!(s, " pid {p}");
    }
    match (comm, role) {
        (Some(c), Some(r)) => {
            let _ = write!(s, " ({c}, {r})");
        }
        (Some(c), None) => {
            let _ = write!(s, " ({c})");
        }
        (None, Some(r)) => {
            let _ = write!(s, " ({r})");
        }
        (None, None) => {}
    }
    if let Some(a) = anon_rss_bytes {
        let _ = write!(s, ", anon RSS {}", HumanBytes(*a));
    }
    s
}

fn cuda_oom_summary(c: &CudaOomEvent) -> String {
    let CudaOomEvent {
        device,
        tried_bytes,
        free_bytes,
        reserved_unallocated_bytes,
        reserved_bytes,
        allocated_bytes,
        ..
    } = c;
    let mut s = match device {
        Some(d) => format!("CUDA out of memory on GPU {d}"),
        None => "CUDA out of memory".to_string(),
    };
    let slack = reserved_unallocated_bytes.or_else(|| {
        reserved_bytes
            .zip(*allocated_bytes)
            .map(|(r, a)| r.saturating_sub(a))
    });
    for (label, v) in [
        ("tried", tried_bytes),
        ("free", free_bytes),
        ("reserved unallocated", &slack),
    ] {
        if let Some(v) = v {
            let _ = write!(s, ", {label} {}", HumanBytes(*v));
        }
    }
    s
}

/// "validation adds 800 MiB (epoch 2, from 3.1 GiB)".
fn phase_memory_summary(p: &crate::sinks::log::PhaseMemoryEvent) -> String {
    let mut s = format!("{} adds {}", p.phase, HumanBytes(p.added_bytes));
    let mut at = Vec::new();
    if let Some(e) = &p.epoch {
        at.push(format!("epoch {e}"));
    }
    if p.before_bytes > 0 {
        at.push(format!("from {}", HumanBytes(p.before_bytes)));
    }
    if !at.is_empty() {
        let _ = write!(s, " ({})", at.join(", "));
    }
    s
}

fn metric_value(metric: &str, v: f64) -> String {
    if metric.ends_with("_percent") || metric.ends_with("avg10") {
        format!("{v:.1}%")
    } else if metric.ends_with("_bytes") {
        HumanBytes(v.max(0.0) as u64).to_string()
    } else if metric.ends_with("_seconds") {
        time_text(v)
    } else if metric.ends_with("_per_s") {
        format!("{}/s", HumanBytes(v.max(0.0) as u64))
    } else {
        format!("{v}")
    }
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "unset".into(),
        v => v.to_string(),
    }
}

/// The command line as one string.
pub(super) fn command_text(log: &RunLog) -> String {
    log.start
        .as_ref()
        .map(|s| {
            s.argv
                .iter()
                .map(|a| {
                    if a.is_empty() || a.contains(char::is_whitespace) || a.contains('\'') {
                        format!("'{}'", a.replace('\'', r"'\''"))
                    } else {
                        a.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "(command unknown: no run_start)".to_string())
}

/// The duration of the run: `run_end`'s, else up to the last line.
pub(super) fn duration(log: &RunLog) -> f64 {
    log.end
        .as_ref()
        .and_then(|e| e.duration_seconds)
        .unwrap_or_else(|| {
            log.samples
                .iter()
                .map(|s| s.t)
                .chain(log.events.iter().map(|e| e.t))
                .fold(0.0, f64::max)
        })
}

/// Peak figures: from `run_end.peak` when present, else from the samples.
pub(super) struct Peaks {
    /// The largest footprint a sample carried: what the policy compared
    /// with the ceiling (`run_end` has no such peak).
    pub footprint: u64,
    pub footprint_t: f64,
    pub pss: u64,
    pub pss_t: f64,
    pub rss: u64,
    pub swap: u64,
    pub gpu: u64,
}

pub(super) fn peaks(log: &RunLog) -> Peaks {
    let from_samples = || {
        let top = log.samples.iter().max_by_key(|s| s.pss_bytes);
        let fp = log.samples.iter().max_by_key(|s| s.footprint());
        Peaks {
            footprint: fp.map_or(0, |s| s.footprint()),
            footprint_t: fp.map_or(0.0, |s| s.t),
            pss: top.map_or(0, |s| s.pss_bytes),
            pss_t: top.map_or(0.0, |s| s.t),
            rss: log.samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0),
            swap: log
                .samples
                .iter()
                .filter_map(|s| s.swap_used_bytes)
                .max()
                .unwrap_or(0),
            gpu: log
                .samples
                .iter()
                .map(|s| s.gpus.iter().map(|g| g.used_bytes).sum::<u64>())
                .max()
                .unwrap_or(0),
        }
    };
    let s = from_samples();
    // run_end's peaks see every tick, the log only the logged ones; a
    // run_end below the samples would be a writer's bug, so the larger wins.
    match log.end.as_ref().and_then(|e| e.peak.as_ref()) {
        Some(p) => {
            let pss = p.tree_pss_bytes.unwrap_or(0);
            // Without a cgroup of its own the footprint is the PSS sum, and
            // run_end's peak of it saw every tick.
            let (footprint, footprint_t) = if !log.footprint_is_working_set() && pss > s.footprint {
                (pss, p.t.unwrap_or(s.footprint_t))
            } else {
                (s.footprint, s.footprint_t)
            };
            Peaks {
                footprint,
                footprint_t,
                pss: pss.max(s.pss),
                pss_t: if pss >= s.pss {
                    p.t.unwrap_or(s.pss_t)
                } else {
                    s.pss_t
                },
                rss: p.tree_rss_bytes.unwrap_or(0).max(s.rss),
                swap: p.swap_used_bytes.unwrap_or(0).max(s.swap),
                gpu: p.gpu_used_bytes.unwrap_or(0).max(s.gpu),
            }
        }
        None => s,
    }
}

/// Greedy word wrap with a hanging indent.
fn wrap(text: &str, indent: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty()
            && indent.len() + line.chars().count() + 1 + word.chars().count() > width
        {
            let _ = writeln!(out, "{indent}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{indent}{line}");
    }
    out
}

/// The summary lines under the command: outcome, peak footprint and its
/// breakdowns, ceiling.
fn summary(o: &mut String, log: &RunLog) {
    let attempts = log.attempts.len().max(1);
    let _ = writeln!(
        o,
        "  outcome   {} after {}, {attempts} attempt{}",
        outcome_text(log),
        time_text(duration(log)),
        if attempts == 1 { "" } else { "s" }
    );
    let p = peaks(log);
    let _ = writeln!(
        o,
        "  peak      footprint {} ({}) at {}",
        HumanBytes(p.footprint),
        log.footprint_kind(),
        time_text(p.footprint_t)
    );
    // The sums split or recount the footprint: breakdowns, not the figure
    // the policy compared with the ceiling.
    let mut sums = format!(
        "  breakdown PSS sum {} · RSS sum {} · swap {}",
        HumanBytes(p.pss),
        HumanBytes(p.rss),
        HumanBytes(p.swap)
    );
    if p.gpu > 0 {
        let _ = write!(sums, " · GPU {}", HumanBytes(p.gpu));
    }
    let _ = writeln!(o, "{sums}");
    // The ceiling with the least headroom of the run; the memory one when
    // that was /dev/shm, with the tmpfs said on a line of its own.
    let shm_nearest = (log.tightest_ceiling()).filter(|c| c.source == CeilingSource::Shm.as_str());
    if let Some(c) = shm_nearest {
        let peak = (log.samples.iter())
            .filter_map(|s| s.shm.map(|m| m.used_bytes))
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            o,
            "  ceiling   /dev/shm {} · peak {} used ({:.0}%)",
            HumanBytes(c.bytes),
            HumanBytes(peak),
            peak as f64 / c.bytes.max(1) as f64 * 100.0
        );
    }
    if let Some((source, bytes)) = super::fit::nearest_ceiling(log) {
        let least = log
            .samples
            .iter()
            .filter(|s| {
                shm_nearest.is_none() || s.ceiling.as_ref().is_some_and(|c| c.source == source)
            })
            .filter_map(|s| s.headroom_percent)
            .fold(f64::INFINITY, f64::min);
        let mut line = format!("  ceiling   {source} {}", HumanBytes(bytes));
        if least.is_finite() {
            let _ = write!(line, " · least headroom {least:.1}%");
        }
        let _ = writeln!(o, "{line}");
    }
}

/// The summary and advice for a terminal (plain text, 80 columns, no
/// colour: the caller knows whether stdout is a terminal, this does not).
pub fn render_text(log: &RunLog, findings: &[Finding]) -> String {
    let mut o = String::new();
    // Long command lines are cut so the summary stays readable (the HTML
    // report has the whole command).
    let mut cmd = command_text(log);
    if cmd.chars().count() > 80 {
        cmd = cmd.chars().take(79).collect::<String>() + "…";
    }
    let _ = writeln!(o, "oomguard report: {cmd}");
    if let (n, of @ 2..) = log.run_of {
        let _ = writeln!(
            o,
            "  run {n} of the {of} in this log (`--run N` reports another)"
        );
    }
    summary(&mut o, log);

    let _ = writeln!(o, "\nFindings");
    if findings.is_empty() {
        let _ = writeln!(o, "  (none: the log has too little data)");
    }
    for f in findings {
        let _ = writeln!(o, "\n  [{}] {}", f.severity.as_str(), f.title);
        o.push_str(&wrap(&f.advice, "      ", 80));
        if !f.numbers.is_empty() {
            let nums: Vec<String> = f
                .numbers
                .iter()
                .map(|n| format!("{} {}", n.label, n.text))
                .collect();
            o.push_str(&wrap(
                &format!("based on: {}", nums.join("; ")),
                "      ",
                80,
            ));
        }
    }

    if log.attempts.len() > 1 {
        let _ = writeln!(o, "\nAttempts");
        let _ = writeln!(
            o,
            "  {:>3}  {:>8}  {:>8}  {:>9}  {:>7}  ended by",
            "#", "start", "end", "footprint", "workers"
        );
        for a in &log.attempts {
            let _ = writeln!(
                o,
                "  {:>3}  {:>8}  {:>8}  {:>9}  {:>7}  {}",
                a.number,
                time_text(a.start_t),
                time_text(a.end_t),
                HumanBytes(a.peak_footprint_bytes).to_string(),
                a.max_workers,
                a.ended_by
            );
        }
    }

    let markers: Vec<&Timed> = log.events.iter().filter(|e| e.has_marker()).collect();
    if !markers.is_empty() {
        let _ = writeln!(o, "\nEvents");
        for e in markers.iter().take(40) {
            let prefix = format!("  {:>4}  {:>8}  ", format!("#{}", e.seq), time_text(e.t));
            let hang = " ".repeat(prefix.chars().count());
            let body = wrap(&event_summary(e), &hang, 80);
            o.push_str(&prefix);
            o.push_str(body.trim_start());
        }
        if markers.len() > 40 {
            let _ = writeln!(
                o,
                "  … {} more (see --format html or json)",
                markers.len() - 40
            );
        }
    }
    if !log.warnings.is_empty() {
        let _ = writeln!(o, "\nLog warnings");
        for w in &log.warnings {
            let _ = writeln!(o, "  {w}");
        }
        if log.unlisted_warnings > 0 {
            let _ = writeln!(o, "  … {} more lines skipped", log.unlisted_warnings);
        }
    }
    o
}

/// An event as the report's JSON gives it: where it sits (`seq`, `t`,
/// `attempt`, `line`), its name, and the figures the report reads, in
/// the shape `oomguard-report/1` has always had (not the log line's).
fn event_json(e: &Timed) -> Value {
    let body = match &e.event {
        Logged::Rule(r) => json!({
            "rule": r.rule, "metric": r.metric, "value": r.value,
            "threshold": r.threshold, "state": r.state,
        }),
        Logged::Action(a) => json!({
            "action": a.action, "reason": said(&a.reason), "pids": a.pids,
            "signal": a.signal, "result": said(&a.result),
        }),
        Logged::ChildExit(c) => json!({"pid": child_pid(c), "code": c.code, "signal": c.signal}),
        Logged::Restart(r) => json!({
            "next_attempt": e.line_attempt, "reason": r.reason,
            "checkpoint": r.checkpoint.as_ref().map(|p| p.display().to_string()),
            "degraded": degraded(&r.degraded), "delay_seconds": r.delay_seconds,
        }),
        Logged::OomKill(k) => json!({
            "pid": k.pid, "comm": k.comm, "role": k.role,
            "anon_rss_bytes": k.anon_rss_bytes, "constraint": k.constraint,
        }),
        Logged::CudaOom(c) => json!({
            "device": c.device.map(|d| d.to_string()), "pid": c.pid,
            "tried_bytes": c.tried_bytes, "total_bytes": c.total_bytes,
            "free_bytes": c.free_bytes, "allocated_bytes": c.allocated_bytes,
            "reserved_unallocated_bytes": c.reserved_unallocated_bytes,
            "reserved_bytes": c.reserved_bytes, "advice": c.advice.first(),
        }),
        Logged::WorkerDied(w) => json!({
            "pid": w.pid, "signal": w.signal, "exit_code": w.exit_code, "shm_hint": w.shm_hint,
        }),
        Logged::CheckpointDone(d) => json!({
            "step": d.step, "ok": d.ok,
            "path": d.paths.first().map(|p| p.display().to_string()),
        }),
        Logged::Fault(f) => json!({
            "remote": f.remote, "node": f.node, "cause_rank": f.cause_rank,
            "reason": f.reason, "detail": f.detail,
        }),
        // Told in full, as the log's own type writes them.
        Logged::RankFailed(r) => serde_json::to_value(r).unwrap_or(Value::Null),
        Logged::PhaseMemory(p) => serde_json::to_value(p).unwrap_or(Value::Null),
        // The loader keeps none of the others as events.
        _ => json!({}),
    };
    let mut v = json!({
        "seq": e.seq, "t": e.t, "attempt": e.attempt, "line": e.line, "event": e.event.name(),
    });
    if let (Value::Object(m), Value::Object(fields)) = (&mut v, body) {
        m.extend(fields);
    }
    v
}

/// The report as data: the same facts and findings as the other formats.
pub fn render_json(log: &RunLog, findings: &[Finding]) -> Value {
    let p = peaks(log);
    let procs = processes(log);
    let events: Vec<Value> = log
        .events
        .iter()
        .map(|e| {
            let mut v = event_json(e);
            if let Value::Object(m) = &mut v {
                m.insert("summary".into(), Value::String(event_summary(e)));
            }
            v
        })
        .collect();
    json!({
        "schema": "oomguard-report/1",
        "log_schema": crate::sinks::log::SCHEMA,
        "run": {"index": log.run_of.0, "of": log.run_of.1},
        "command": log.start.as_ref().map(|s| s.argv.clone()),
        "version": log.start.as_ref().and_then(|s| s.version.clone()),
        "outcome": log.end.as_ref().and_then(|e| e.outcome.clone()),
        "exit_code": log.end.as_ref().and_then(|e| e.exit_code),
        "duration_seconds": duration(log),
        "restarts": log.end.as_ref().and_then(|e| e.restarts),
        "actions": log.end.as_ref().map(|e| e.actions.clone()),
        "peak": {
            "footprint_bytes": p.footprint,
            "footprint_t": p.footprint_t,
            "footprint_is": log.footprint_kind(),
            "tree_pss_bytes": p.pss,
            "t": p.pss_t,
            "tree_rss_bytes": p.rss,
            "swap_used_bytes": p.swap,
            "gpu_used_bytes": p.gpu,
        },
        "ceiling": super::fit::nearest_ceiling(log)
            .map(|(source, bytes)| json!({"source": source, "bytes": bytes})),
        "policy": log.start.as_ref().map(|s| s.rules.clone()),
        "attempts": log.attempts,
        "processes": procs,
        "events": events,
        "findings": findings,
        "warnings": log.warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping() {
        let w = wrap("aaa bbb ccc ddd", "  ", 10);
        assert_eq!(w, "  aaa bbb\n  ccc ddd\n");
    }

    #[test]
    fn metric_values() {
        assert_eq!(metric_value("headroom_percent", 7.56), "7.6%");
        assert_eq!(metric_value("headroom_bytes", 1048576.0), "1.0 MiB");
        assert_eq!(metric_value("eta_seconds", 9.0), "9.0s");
    }
}
