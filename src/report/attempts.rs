//! The attempts of one run (`restart` starts a new one): when each ran,
//! its peaks and workers, how it ended, and what its restart changed, as
//! far as the log shows it.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::load::{EventKind, RunLog};
use crate::model::Role;

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

/// The attempts of a run from its samples, events and per-process lists.
pub(super) fn attempts(log: &RunLog) -> Vec<Attempt> {
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
        let Some(a) = out.get_mut(&s.attempt) else {
            continue;
        };
        if s.pss_bytes > a.peak_pss_bytes {
            a.peak_pss_bytes = s.pss_bytes;
            a.peak_pss_t = s.t;
        }
        a.peak_footprint_bytes = a.peak_footprint_bytes.max(s.footprint());
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
