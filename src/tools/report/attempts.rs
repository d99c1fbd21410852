//! The attempts of one run (`restart` starts a new one): when each ran,
//! its peaks and workers, how it ended, and what its restart changed, as
//! far as the log shows it.

use std::collections::BTreeMap;

use super::run_log::{Attempt, RunLog, degraded};
use crate::sinks::log::Event as Logged;
use crate::vocab::model::Role;

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
        if !matches!(e.event, Logged::Restart(_)) {
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
        match &e.event {
            Logged::ChildExit(c) => {
                if let Some(a) = out.get_mut(&e.attempt) {
                    a.exit_code = c.code.map(i64::from);
                    a.exit_signal.clone_from(&c.signal);
                }
            }
            Logged::Restart(r) => {
                let next = e
                    .line_attempt
                    .unwrap_or(e.attempt.saturating_add(1))
                    .max(e.attempt);
                let ended = if next > e.attempt {
                    e.attempt
                } else {
                    e.attempt.saturating_sub(1)
                };
                let why = r.reason.clone().unwrap_or_else(|| "restart".into());
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
                a.degraded = degraded(&r.degraded);
                a.checkpoint = r.checkpoint.as_ref().map(|p| p.display().to_string());
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
