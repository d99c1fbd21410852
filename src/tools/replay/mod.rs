//! `oomguard replay LOG`: runs the samples a run recorded through a policy
//! (the recorded one, or one given by flags or `--config`) and sets what
//! that policy would have done, and when, beside what was done. Tuning
//! thresholds on yesterday's run needs no re-run of the training.
//!
//! It works because the engine is pure: readings in, decisions out, time
//! from the samples. Each logged `sample` line carries every input the
//! engine reads (the few that are not derivable, such as the fastest
//! grower's rate, are logged for this purpose). Lines are read through the
//! same types the log is written with (`log::SampleEvent`,
//! `log::ActionEvent`).

use std::fmt::Write as _;
use std::io::BufRead;

pub mod score;

use crate::engine::policy::{Decision, Engine, Inputs, Metric, Policy, Readings};
use crate::sinks::log::read::{Item, LogLines};
use crate::sinks::log::{ActionKind, Event, EventName, PolicyInfo, SampleEvent};
use crate::vocab::model::{CeilingState, GpuSample, History};

/// Two actions are the same when they agree in kind and rule and lie
/// within this many seconds of each other.
pub const SAME_WITHIN_SECONDS: f64 = 1.0;

/// Why a log cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read '{path}': {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("'{path}' line {line}: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
    #[error(
        "'{0}' has no run_start line with a policy: pass --policy, --warn-at, --critical-at or --config"
    )]
    NoPolicy(String),
    #[error("'{0}' has no sample lines to replay")]
    NoSamples(String),
}

/// One action, recorded or replayed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Act {
    pub t: f64,
    pub attempt: u32,
    pub action: ActionKind,
    pub reason: String,
}

/// A recorded action and the replayed one that matches it, either may be
/// missing.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub recorded: Option<Act>,
    pub replayed: Option<Act>,
}

impl Row {
    pub fn same(&self) -> bool {
        self.recorded.is_some() && self.replayed.is_some()
    }

    fn t(&self) -> f64 {
        self.recorded
            .as_ref()
            .or(self.replayed.as_ref())
            .map_or(0.0, |a| a.t)
    }
}

/// What a replay found.
#[derive(Debug, Clone)]
pub struct Replay {
    pub samples: usize,
    pub rows: Vec<Row>,
    /// "recorded" or where the policy came from.
    pub policy_source: String,
    /// The policy replayed.
    pub policy: Policy,
    /// Rules this replay could not judge fairly, and why.
    pub notes: Vec<String>,
    /// The kernel's OOM kills the run logged, `(attempt, t)`.
    pub oom_kills: Vec<(u32, f64)>,
    /// `run_end.exit_code`, when the log has its end.
    pub exit_code: Option<i32>,
    /// Each sample's `(attempt, t, headroom %)`.
    pub headroom: Vec<(u32, f64, Option<f64>)>,
    /// The run was recorded with `--log-every-tick`: the growth estimates
    /// were derived here from the samples rather than read from them.
    pub every_tick: bool,
}

impl Replay {
    pub fn recorded(&self) -> usize {
        self.rows.iter().filter(|r| r.recorded.is_some()).count()
    }

    pub fn replayed(&self) -> usize {
        self.rows.iter().filter(|r| r.replayed.is_some()).count()
    }

    pub fn same(&self) -> usize {
        self.rows.iter().filter(|r| r.same()).count()
    }
}

/// Reads a log and replays it under `policy` (`None`: the recorded one).
pub fn replay(
    path: &str,
    input: impl BufRead,
    policy: Option<(Policy, String)>,
) -> Result<Replay, ReplayError> {
    let mut recorded_policy: Option<Policy> = None;
    let mut samples: Vec<(u32, f64, SampleEvent)> = Vec::new();
    let mut actions: Vec<(Act, bool)> = Vec::new();
    let mut job_ended: Vec<(u32, f64)> = Vec::new();
    let mut oom_kills: Vec<(u32, f64)> = Vec::new();
    let mut exit_code = None;
    let mut every_tick = false;
    let line_err = |line: usize, message: String| ReplayError::Line {
        path: path.to_string(),
        line,
        message,
    };
    for item in LogLines::new(input) {
        let item = item.map_err(|source| ReplayError::Read {
            path: path.to_string(),
            source,
        })?;
        // Not one of ours (a job's stray output, a cut line, another
        // schema): not for the engine.
        let Item::Line(line) = item else { continue };
        let attempt = line
            .head
            .attempt
            .map_or(1, |a| u32::try_from(a).unwrap_or(u32::MAX));
        let Some(t) = line.head.t else { continue };
        let name = line.head.event.as_deref().unwrap_or_default();
        let named = EventName::from_name(name);
        let event = match line.event {
            Ok(Some(e)) => e,
            Ok(None) => continue,
            // The engine's inputs must read; the ends of the job count
            // whatever their bodies say.
            Err(e) if engine_input(named) => {
                return Err(line_err(line.n, format!("bad {name} line: {e}")));
            }
            Err(_) => {
                match named {
                    Some(EventName::OomKill) => oom_kills.push((attempt, t)),
                    Some(EventName::RunEnd | EventName::ChildExit) => job_ended.push((attempt, t)),
                    _ => {}
                }
                continue;
            }
        };
        match event {
            Event::RunStart(start) => {
                recorded_policy = start.policy.as_ref().and_then(PolicyInfo::to_policy);
                every_tick = start.every_tick;
            }
            Event::Sample(s) => samples.push((attempt, t, *s)),
            Event::Action(a) => actions.push((
                Act {
                    t,
                    attempt,
                    action: a.action,
                    reason: a.reason,
                },
                a.result != "ok",
            )),
            Event::OomKill(_) => oom_kills.push((attempt, t)),
            Event::RunEnd(end) => {
                job_ended.push((attempt, t));
                exit_code = Some(end.exit_code);
            }
            Event::ChildExit(_) => job_ended.push((attempt, t)),
            _ => {}
        }
    }
    let (policy, source) = match (policy, recorded_policy.clone()) {
        (Some(p), _) => p,
        (None, Some(p)) => (p, "recorded".to_string()),
        (None, None) => return Err(ReplayError::NoPolicy(path.to_string())),
    };
    if samples.is_empty() {
        return Err(ReplayError::NoSamples(path.to_string()));
    }
    // What the recorded policy decided (not what the actuator did after it:
    // the stop ladder's TERM and KILL, a key press, a signal to oomguard).
    let rule_names: Vec<String> = recorded_policy
        .as_ref()
        .map(|p| p.rules.iter().map(|r| r.name.clone()).collect())
        .unwrap_or_default();
    let decided_by_policy =
        |a: &Act| a.reason.starts_with("max-pause") || rule_names.contains(&a.reason);
    let manual: Vec<&Act> = actions
        .iter()
        .map(|(a, _)| a)
        .filter(|a| {
            a.reason.starts_with("manual")
                && matches!(a.action, ActionKind::Pause | ActionKind::Resume)
        })
        .collect();
    let recorded: Vec<Act> = actions
        .iter()
        .filter(|(a, refused)| decided_by_policy(a) && !(*refused && a.action == ActionKind::Warn))
        .map(|(a, _)| a.clone())
        .collect();
    let notes = unrecorded_inputs(&policy, &samples);
    let replayed = run_engine(policy.clone(), &samples, &manual, &job_ended, every_tick);
    Ok(Replay {
        samples: samples.len(),
        rows: pair(recorded, replayed),
        policy_source: source,
        policy,
        notes,
        oom_kills,
        exit_code,
        headroom: samples
            .iter()
            .map(|(a, t, s)| (*a, *t, s.headroom_percent))
            .collect(),
        every_tick,
    })
}

/// The lines the engine reads: one of these that does not read stops the
/// replay, where any other is passed over.
fn engine_input(named: Option<EventName>) -> bool {
    matches!(
        named,
        Some(EventName::RunStart | EventName::Sample | EventName::Action)
    )
}

/// A run logs the inputs that cannot be derived from its samples only when
/// its own policy read them: a replayed rule on one the run did not record
/// can never fire, and the user is told so.
fn unrecorded_inputs(policy: &Policy, samples: &[(u32, f64, SampleEvent)]) -> Vec<String> {
    let recorded = |m: Metric| {
        samples.iter().any(|(_, _, s)| match m {
            Metric::FastestGrowth => s.fastest_growth_bytes_per_s.is_some(),
            Metric::GpuEta => s.gpu_eta_seconds.is_some(),
            Metric::TorchFragmentation => s.torch_fragmentation_bytes.is_some(),
            _ => true,
        })
    };
    policy
        .rules
        .iter()
        .filter(|r| !recorded(r.metric))
        .map(|r| {
            format!(
                "rule '{}' reads {}, which this run did not record (its policy had no rule on it): it cannot fire here",
                r.name,
                r.metric.name()
            )
        })
        .collect()
}

/// The engine over the samples, attempt by attempt, as the loop runs it:
/// nothing more is decided once the attempt's job ended or a critical
/// action began.
fn run_engine(
    policy: Policy,
    samples: &[(u32, f64, SampleEvent)],
    manual: &[&Act],
    job_ended: &[(u32, f64)],
    every_tick: bool,
) -> Vec<Act> {
    let mut engine = Engine::new(policy);
    // A recording has every tick the live loop saw: the ETA is derived
    // again, so a changed growth estimate is judged too.
    let mut history = every_tick.then(|| History::new(crate::vocab::model::ETA_WINDOW_SECONDS));
    let mut out = Vec::new();
    let mut attempt = 0;
    let mut manual = manual.iter().peekable();
    let mut gpus: &[GpuSample] = &[];
    for (a, t, s) in samples {
        if !s.gpus.is_empty() {
            gpus = &s.gpus;
        }
        if *a != attempt {
            attempt = *a;
            engine.reset();
            if let Some(h) = history.as_mut() {
                h.clear();
            }
        }
        let mut r = readings(*t, s, gpus);
        if let Some(h) = history.as_mut() {
            let view = h.push_reading(*t, nearest(s), Vec::new());
            r.set(
                Metric::Eta,
                s.ceiling
                    .is_some()
                    .then(|| view.eta_seconds.unwrap_or(f64::INFINITY)),
            );
        }
        while let Some(m) = manual.next_if(|m| m.t <= *t) {
            if m.action == ActionKind::Pause {
                engine.paused_externally(m.t);
            } else {
                engine.resumed_externally();
            }
        }
        if job_ended.iter().any(|(ea, et)| *ea == attempt && *et < *t) {
            continue;
        }
        for d in engine.step(&r) {
            let (action, reason) = match d {
                Decision::Act { action, reason, .. } => (ActionKind::from(action), reason),
                Decision::Resume { reason } => (ActionKind::Resume, reason),
                Decision::Rule { .. } => continue,
            };
            out.push(Act {
                t: *t,
                attempt,
                action,
                reason,
            });
        }
    }
    out
}

/// The nearest ceiling and its headroom, as a logged sample states them.
fn nearest(s: &SampleEvent) -> Option<CeilingState> {
    let ceiling = s.ceiling?;
    let headroom_bytes = s.headroom_bytes?;
    Some(CeilingState {
        ceiling,
        used_bytes: ceiling.bytes.saturating_sub(headroom_bytes),
        headroom_bytes,
    })
}

/// The engine's inputs, from a logged sample. `gpus`: the newest per-GPU
/// detail (a line may leave it out to keep the log small; it stands until
/// the next line that has it).
pub fn readings(t: f64, s: &SampleEvent, gpus: &[GpuSample]) -> Readings {
    Readings::from_inputs(&Inputs {
        t,
        headroom_percent: s.headroom_percent,
        headroom_bytes: s.headroom_bytes,
        footprint_bytes: s.tree.footprint_bytes,
        pss_bytes: s.tree.pss_bytes,
        system: &s.system,
        psi: s.psi,
        has_ceiling: s.ceiling.is_some(),
        eta_seconds: s.eta_seconds,
        fastest_growth: Some(s.fastest_growth_bytes_per_s.unwrap_or(0.0)),
        gpus,
        gpu_eta: s.gpu_eta_seconds,
        frag: s.torch_fragmentation_bytes.map(|b| b as f64),
    })
}

/// Pairs each replayed action with the nearest unpaired recorded one of the
/// same kind, rule and attempt within `SAME_WITHIN_SECONDS`.
fn pair(recorded: Vec<Act>, replayed: Vec<Act>) -> Vec<Row> {
    let mut left: Vec<Option<Act>> = recorded.into_iter().map(Some).collect();
    let mut rows = Vec::new();
    for r in replayed {
        let best = left
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().map(|a| (i, a)))
            .filter(|(_, a)| {
                a.action == r.action
                    && a.reason == r.reason
                    && a.attempt == r.attempt
                    && (a.t - r.t).abs() <= SAME_WITHIN_SECONDS
            })
            .min_by(|(_, a), (_, b)| (a.t - r.t).abs().total_cmp(&(b.t - r.t).abs()))
            .map(|(i, _)| i);
        let recorded = best.and_then(|i| left[i].take());
        rows.push(Row {
            recorded,
            replayed: Some(r),
        });
    }
    rows.extend(left.into_iter().flatten().map(|a| Row {
        recorded: Some(a),
        replayed: None,
    }));
    rows.sort_by(|a, b| a.t().total_cmp(&b.t()));
    rows
}

/// The side-by-side table.
pub fn render_text(path: &str, r: &Replay) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "oomguard replay of {path}: {} samples, policy: {}",
        r.samples, r.policy_source
    );
    let _ = writeln!(out, "{:>9}  {:<34}  {:<34}", "t", "recorded", "replayed");
    let cell = |a: &Option<Act>| {
        a.as_ref()
            .map_or("-".to_string(), |a| format!("{} ({})", a.action, a.reason))
    };
    for row in &r.rows {
        let mark = if row.same() { "  same" } else { "" };
        let _ = writeln!(
            out,
            "{:>8.1}s  {:<34}  {:<34}{mark}",
            row.t(),
            cell(&row.recorded),
            cell(&row.replayed)
        );
    }
    for note in &r.notes {
        let _ = writeln!(out, "note: {note}");
    }
    let _ = writeln!(
        out,
        "{} recorded, {} replayed, {} the same (kind, rule and attempt, within {SAME_WITHIN_SECONDS} s)",
        r.recorded(),
        r.replayed(),
        r.same()
    );
    out
}

/// One JSON object per row.
pub fn render_json(r: &Replay) -> String {
    let mut out = String::new();
    for row in &r.rows {
        let line = serde_json::json!({
            "recorded": row.recorded,
            "replayed": row.replayed,
            "same": row.same(),
        });
        let _ = writeln!(out, "{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(t: f64, event: &str, body: &str) -> String {
        format!(
            r#"{{"schema":"oomguard/1","event":"{event}","ts":"2026-01-01T00:00:00.000Z","t":{t},"attempt":1,{body}}}"#
        )
    }

    fn sample(t: f64, headroom_pct: f64) -> String {
        let used = 100.0 - headroom_pct;
        line(
            t,
            "sample",
            &format!(
                r#""headroom_bytes":{hb},"headroom_percent":{headroom_pct},"ceiling":{{"source":"budget","bytes":1073741824}},"eta_seconds":null,"tree":{{"procs":2,"rss_bytes":1,"pss_bytes":1,"uss_bytes":1,"swap_bytes":0,"footprint_bytes":{fp},"pss_age_seconds":0.0}},"system":{{"mem_total_bytes":0,"mem_available_bytes":0,"swap_total_bytes":0,"swap_used_bytes":0,"swap_in_bytes_per_s":0.0,"swap_out_bytes_per_s":0.0}},"cgroup":null,"psi":null,"gpus":[]"#,
                hb = (headroom_pct / 100.0 * GIB) as u64,
                fp = (used / 100.0 * GIB) as u64
            ),
        )
    }

    const GIB: f64 = 1073741824.0;

    fn log(levels: &[(f64, f64)], actions: &[(f64, &str, &str)]) -> String {
        log_with(levels, actions, false)
    }

    fn log_with(levels: &[(f64, f64)], actions: &[(f64, &str, &str)], every_tick: bool) -> String {
        let policy = serde_json::to_string(&PolicyInfo::of(&Policy::default_with(
            80.0,
            92.0,
            crate::engine::policy::Action::Stop,
        )))
        .unwrap();
        let mut lines = vec![line(
            0.0,
            "run_start",
            &format!(
                r#""argv":["x"],"pid":1,"ceilings":[],"cgroup":null,"policy":{policy},"gpu":{{"available":false,"reason":null}},"version":"0","interval_seconds":1.0,"pss_interval_seconds":5.0,"every_tick":{every_tick}"#
            ),
        )];
        let mut events: Vec<(f64, String)> =
            levels.iter().map(|(t, h)| (*t, sample(*t, *h))).collect();
        for (t, action, reason) in actions {
            events.push((
                *t,
                line(
                    *t,
                    "action",
                    &format!(r#""action":"{action}","reason":"{reason}","pids":[],"signal":null,"result":"ok""#),
                ),
            ));
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        lines.extend(events.into_iter().map(|(_, l)| l));
        lines.join("\n")
    }

    /// A recording of every tick: the ETA is derived from the samples
    /// (here logged as null, as an older estimate might have had it), so
    /// `critical-eta` is judged on the growth itself.
    #[test]
    fn a_recording_of_every_tick_derives_the_eta_again() {
        // Headroom 40 % → 15 % at 5 %/s in 100 ms ticks, then flat.
        let mut levels: Vec<(f64, f64)> = (0..=50)
            .map(|i| (1.0 + f64::from(i) * 0.1, 40.0 - 0.5 * f64::from(i)))
            .collect();
        levels.extend((1..=30).map(|i| (6.0 + f64::from(i) * 0.1, 15.0)));
        let r = replay("rec.ndjson", log_with(&levels, &[], true).as_bytes(), None).unwrap();
        assert!(r.every_tick);
        let stops: Vec<&Act> = r
            .rows
            .iter()
            .filter_map(|row| row.replayed.as_ref())
            .filter(|a| a.action == ActionKind::Stop)
            .collect();
        assert_eq!(stops.len(), 1, "{:?}", r.rows);
        assert_eq!(stops[0].reason, "critical-eta");
        assert!(
            stops[0].t <= 6.0,
            "decided while still growing: {}",
            stops[0].t
        );
        // The same samples in an ordinary log: the logged (null) ETA rules.
        let r = replay("run.ndjson", log_with(&levels, &[], false).as_bytes(), None).unwrap();
        assert!(
            r.rows
                .iter()
                .filter_map(|row| row.replayed.as_ref())
                .all(|a| a.action != ActionKind::Stop),
            "{:?}",
            r.rows
        );
    }

    #[test]
    fn the_recorded_policy_reproduces_the_recorded_actions() {
        let levels = [
            (1.0, 50.0),
            (2.0, 30.0),
            (3.0, 15.0),
            (4.0, 10.0),
            (5.0, 5.0),
        ];
        let text = log(
            &levels,
            &[
                (3.0, "warn", "warn-headroom"),
                (4.0, "checkpoint", "checkpoint-headroom"),
                (5.0, "stop", "critical-headroom"),
            ],
        );
        let r = replay("run.ndjson", text.as_bytes(), None).unwrap();
        assert_eq!(
            (r.recorded(), r.replayed(), r.same()),
            (3, 3, 3),
            "{:?}",
            r.rows
        );
        assert_eq!(r.policy_source, "recorded");
    }

    #[test]
    fn a_stricter_policy_acts_earlier() {
        let levels = [
            (1.0, 50.0),
            (2.0, 30.0),
            (3.0, 15.0),
            (4.0, 10.0),
            (5.0, 5.0),
        ];
        let text = log(
            &levels,
            &[
                (3.0, "warn", "warn-headroom"),
                (5.0, "stop", "critical-headroom"),
            ],
        );
        let strict = Policy::default_with(60.0, 80.0, crate::engine::policy::Action::Stop);
        let r = replay(
            "run.ndjson",
            text.as_bytes(),
            Some((strict, "flags".into())),
        )
        .unwrap();
        let stop = r
            .rows
            .iter()
            .filter_map(|row| row.replayed.as_ref())
            .find(|a| a.action == ActionKind::Stop)
            .unwrap();
        assert_eq!(stop.t, 3.0);
        assert!(r.same() < 2, "{:?}", r.rows);
        let text = render_text("run.ndjson", &r);
        assert!(text.contains("stop (critical-headroom)"), "{text}");
    }

    #[test]
    fn actuator_follow_ups_are_not_policy_decisions() {
        let levels = [(1.0, 50.0), (2.0, 5.0)];
        let text = log(
            &levels,
            &[
                (2.0, "stop", "critical-headroom"),
                (12.0, "kill", "kill-after"),
            ],
        );
        let r = replay("run.ndjson", text.as_bytes(), None).unwrap();
        assert_eq!(r.recorded(), 1, "{:?}", r.rows);
    }

    #[test]
    fn garbage_lines_are_skipped_and_bad_samples_named() {
        let mut text = log(&[(1.0, 50.0)], &[]);
        text.push_str("\nnot json\n{\"half\":");
        assert!(replay("x", text.as_bytes(), None).is_ok());
        text.push_str("\n{\"schema\":\"oomguard/1\",\"event\":\"sample\",\"t\":2,\"tree\":7}");
        let e = replay("x", text.as_bytes(), None).unwrap_err().to_string();
        assert!(e.contains("line 5") && e.contains("bad sample line"), "{e}");
        assert!(matches!(
            replay("x", &b""[..], Some((Policy::none(), "f".into()))),
            Err(ReplayError::NoSamples(_))
        ));
    }

    #[test]
    fn a_rule_on_an_unrecorded_input_is_named() {
        let text = log(&[(1.0, 50.0), (2.0, 40.0)], &[]);
        let mut p = Policy::none();
        p.rules.push(crate::engine::policy::Rule::new(
            "grower",
            Metric::FastestGrowth,
            crate::engine::policy::Op::Above,
            1e6,
            crate::engine::policy::Action::Warn,
        ));
        let r = replay("x", text.as_bytes(), Some((p, "f".into()))).unwrap();
        assert_eq!(r.notes.len(), 1);
        assert!(
            r.notes[0].contains("'grower' reads fastest_growth"),
            "{:?}",
            r.notes
        );
        assert!(render_text("x", &r).contains("note: rule 'grower'"));
    }

    #[test]
    fn the_recorded_policy_reads_back() {
        let p = Policy::default_with(70.0, 90.0, crate::engine::policy::Action::Restart);
        let mut p = p;
        p.max_pause_seconds = 42.0;
        let text = serde_json::to_string(&PolicyInfo::of(&p)).unwrap();
        let info: PolicyInfo = serde_json::from_str(&text).unwrap();
        assert_eq!(info.to_policy(), Some(p));
        assert!(text.contains(r#""metric":"headroom_percent""#), "{text}");
        assert!(text.contains(r#""unit":"percent""#), "{text}");
        let mut unknown = info.clone();
        unknown.rules[0].metric = "moon_phase".into();
        assert_eq!(
            unknown.to_policy(),
            None,
            "an unknown metric is not guessed"
        );
    }
}
