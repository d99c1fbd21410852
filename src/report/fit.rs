//! How many DataLoader workers fit: the `num_workers` advice from the
//! measured per-worker private peak (raised by copy-on-write growth between
//! readings), the trainer's private memory and the shared memory, and the
//! `/dev/shm` share of batches in flight. A peak read before the job's last
//! growth gives no count.

use std::collections::BTreeMap;

use super::diagnose::{Cited, FIT_SHARE, Finding, Severity, time_text};
use super::load::{EventKind, RunLog, SamplePoint};
use crate::model::Role;
use crate::units::HumanBytes;

const MIB: u64 = 1 << 20;

/// The ceiling the job was closest to: that of the sample with the least
/// headroom, else the smallest ceiling `run_start` knew.
pub fn nearest_ceiling(log: &RunLog) -> Option<(String, u64)> {
    log.samples
        .iter()
        .filter(|s| s.ceiling.is_some())
        .min_by_key(|s| s.headroom_bytes.unwrap_or(u64::MAX))
        .and_then(|s| s.ceiling.as_ref())
        .map(|c| (c.source.clone(), c.bytes))
        .or_else(|| {
            log.start
                .as_ref()?
                .ceilings
                .iter()
                .min_by_key(|c| c.bytes)
                .map(|c| (c.source.clone(), c.bytes))
        })
}

/// The sizing numbers behind the worker-count advice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerFit {
    pub ceiling_bytes: u64,
    /// Private memory of everything that is not a worker, at its peak.
    pub trainer_bytes: u64,
    /// PSS sum − USS sum: pages shared between processes, counted once.
    pub shared_bytes: u64,
    pub per_worker_bytes: u64,
    /// floor((ceiling × 0.9 − trainer − shared) / per-worker).
    pub fits: u64,
}

/// Computes [`WorkerFit`] from the per-process lists; `None` without
/// workers or a ceiling.
pub fn worker_fit_numbers(log: &RunLog) -> Option<WorkerFit> {
    let (_, ceiling) = nearest_ceiling(log)?;
    let mut trainer = 0u64;
    let mut shared = 0u64;
    let mut per_worker = 0u64;
    for snap in &log.snapshots {
        let fixed: u64 = snap
            .procs
            .iter()
            .filter(|p| p.role != Role::Worker)
            .map(|p| p.uss_bytes)
            .sum();
        let pss: u64 = snap.procs.iter().map(|p| p.pss_bytes).sum();
        let uss: u64 = snap.procs.iter().map(|p| p.uss_bytes).sum();
        trainer = trainer.max(fixed);
        shared = shared.max(pss.saturating_sub(uss));
        for w in snap.procs.iter().filter(|p| p.role == Role::Worker) {
            per_worker = per_worker.max(w.uss_bytes);
        }
    }
    if per_worker == 0 {
        return None;
    }
    // The lists are a minute apart (or a few seconds while memory moves):
    // the trainer's peak before its fork (when its PSS is its USS) may fall
    // between two. Every sample line carries PSS by role.
    let fixed_pss = log
        .samples
        .iter()
        .map(|s| {
            s.role_pss
                .iter()
                .filter(|(r, _)| *r != Role::Worker)
                .map(|(_, b)| *b)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let trainer = trainer.max(fixed_pss);
    // Sharing is largest right after the workers are first read, and
    // shrinks as they copy: the tree's totals on every sample see it.
    let shared = log
        .samples
        .iter()
        .filter(|s| s.uss_bytes > 0)
        .map(|s| s.pss_bytes.saturating_sub(s.uss_bytes))
        .fold(shared, u64::max);
    let budget = ceiling as f64 * FIT_SHARE - trainer as f64 - shared as f64;
    let fits = if budget <= 0.0 {
        0
    } else {
        (budget / per_worker as f64).floor() as u64
    };
    Some(WorkerFit {
        ceiling_bytes: ceiling,
        trainer_bytes: trainer,
        shared_bytes: shared,
        per_worker_bytes: per_worker,
        fits,
    })
}

/// `1 worker`, `3 workers`.
fn workers(n: u64, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// When the newest per-process list with workers was read (its time less
/// the age of its readings) and how much the job's footprint grew after
/// that, in its attempt: `(seconds, bytes)` when it grew by more than
/// 16 MiB and 5 %. A per-worker peak read before such growth may be far
/// below the real one (workers copying what they share grow without any
/// RSS change), so no worker count is given from it.
fn stale_peak(log: &RunLog) -> Option<(f64, u64)> {
    let snap = log
        .snapshots
        .iter()
        .rev()
        .find(|s| s.procs.iter().any(|p| p.role == Role::Worker))?;
    let read = snap.t - snap.pss_age_seconds.unwrap_or(0.0);
    let fp = |s: &SamplePoint| s.footprint_bytes.unwrap_or(s.pss_bytes);
    let ours = || log.samples.iter().filter(|s| s.attempt == snap.attempt);
    let at_read = ours()
        .rfind(|s| s.t <= read)
        .or_else(|| ours().next())
        .map(fp)?;
    let (t_max, max) = ours()
        .filter(|s| s.t > read)
        .map(|s| (s.t, fp(s)))
        .max_by_key(|&(_, b)| b)?;
    let grew = max.saturating_sub(at_read);
    (grew > (16 * MIB).max(at_read / 20)).then_some((t_max - read, grew))
}

/// Copy-on-write growth between readings, measured from the footprint
/// (`workers::settle`), raises the per-worker peak, and accounts for the
/// growth after the newest list. Returns the copying peak, and whether the
/// workers were still copying at the end.
fn with_copying(fit: &mut WorkerFit, out: &[Finding]) -> (Option<u64>, bool) {
    let cow_finding = out.iter().find(|f| f.kind == "worker_cow");
    let still_copying =
        cow_finding.is_some_and(|f| f.numbers.iter().any(|n| n.name == "per_worker_bound_bytes"));
    let cow = cow_finding
        .and_then(|f| {
            f.numbers
                .iter()
                .find(|n| n.name == "per_worker_private_peak_bytes")
        })
        .map(|n| n.value as u64);
    if let Some(peak) = cow.filter(|&p| p > fit.per_worker_bytes) {
        fit.per_worker_bytes = peak;
        let budget = fit.ceiling_bytes as f64 * FIT_SHARE
            - fit.trainer_bytes as f64
            - fit.shared_bytes as f64;
        fit.fits = (budget.max(0.0) / peak as f64).floor() as u64;
    }
    (cow, still_copying)
}

/// The finding that gives no count: the peak reading predates the job's
/// last growth by `age`, and the job grew by `grew` after it.
fn stale_fit(fit: &WorkerFit, age: f64, grew: u64) -> Finding {
    Finding {
        kind: "num_workers",
        severity: Severity::Info,
        title: "No worker count: the per-worker peak predates the job's last growth".to_string(),
        advice: format!(
            "The largest private memory measured in a worker was {}, but the per-process readings behind it are {} older than the job's peak, and the job grew by {} after them: the workers may have grown too (copying shared pages does not show in RSS), so a count from this figure could be too high. Rerun with a shorter --pss-interval or --procs-interval to measure it.",
            HumanBytes(fit.per_worker_bytes),
            time_text(age),
            HumanBytes(grew)
        ),
        numbers: vec![
            Cited::bytes("ceiling_bytes", "ceiling", fit.ceiling_bytes),
            Cited::bytes(
                "per_worker_private_peak_bytes",
                "per-worker private peak (as read)",
                fit.per_worker_bytes,
            ),
            Cited::seconds(
                "readings_age_seconds",
                "readings older than the peak by",
                age,
            ),
            Cited::bytes("growth_since_bytes", "growth after the readings", grew),
        ],
    }
}

pub(super) fn worker_fit(log: &RunLog, out: &mut Vec<Finding>) {
    let Some(mut fit) = worker_fit_numbers(log) else {
        return;
    };
    let (cow, still_copying) = with_copying(&mut fit, out);
    // Leaking workers' peak depends on how long they ran anyway: their
    // advice says so below.
    let leaking = out.iter().any(|f| f.kind == "worker_leak");
    if let Some((age, grew)) = stale_peak(log).filter(|_| cow.is_none() && !leaking) {
        out.push(stale_fit(&fit, age, grew));
        return;
    }
    let source = nearest_ceiling(log).map_or_else(String::new, |(s, _)| s);
    let used = log
        .attempts
        .iter()
        .map(|a| a.max_workers)
        .max()
        .unwrap_or(0) as u64;
    let last = log.attempts.last().map_or(0, |a| a.max_workers) as u64;
    let trouble = log.events.iter().any(|e| {
        matches!(
            e.kind,
            EventKind::OomKill { .. } | EventKind::Restart { .. } | EventKind::Action { .. }
        )
    });
    let left =
        (fit.ceiling_bytes as f64 * FIT_SHARE - fit.trainer_bytes as f64 - fit.shared_bytes as f64)
            .max(0.0) as u64;
    let room = format!(
        "{:.0}% of the {source} ceiling ({}) leaves {} after the trainer's {} private and {} shared",
        FIT_SHARE * 100.0,
        HumanBytes(fit.ceiling_bytes),
        HumanBytes(left),
        HumanBytes(fit.trainer_bytes),
        HumanBytes(fit.shared_bytes),
    );
    let (severity, title, mut advice) = if fit.fits == 0 {
        (
            Severity::Warning,
            "Not even one DataLoader worker fits: use num_workers=0 or more memory".to_string(),
            format!(
                "{room}; one worker needs {} at its peak. Load data in the main process (num_workers=0), shrink what each worker holds, or raise the limit.",
                HumanBytes(fit.per_worker_bytes)
            ),
        )
    } else if fit.fits < used {
        (
            if trouble {
                Severity::Warning
            } else {
                Severity::Info
            },
            format!(
                "At most {} fit{}; the run used {used}: set num_workers={}",
                workers(fit.fits, "DataLoader worker"),
                if fit.fits == 1 { "s" } else { "" },
                fit.fits
            ),
            format!(
                "{room}: room for {} at {} private each at their peak (set num_workers={}).",
                workers(fit.fits, "worker"),
                HumanBytes(fit.per_worker_bytes),
                fit.fits
            ),
        )
    } else {
        (
            Severity::Info,
            format!(
                "Up to {} fit{} (the run used {used})",
                workers(fit.fits, "DataLoader worker"),
                if fit.fits == 1 { "s" } else { "" },
            ),
            format!(
                "{room}: room for {} at {} private each at their peak, so num_workers={} is within budget.",
                workers(fit.fits, "worker"),
                HumanBytes(fit.per_worker_bytes),
                fit.fits
            ),
        )
    };
    if last != used && last > 0 {
        advice.push_str(&format!(" The last attempt ran with {last}."));
    }
    advice.push_str(&format!(
        " Assumed: every worker holds the largest private memory measured in one ({}), the trainer's private and the shared memory stay at their measured peaks, and nothing else is charged to the ceiling.",
        HumanBytes(fit.per_worker_bytes)
    ));
    if still_copying {
        advice.push_str(
            " The workers were still copying shared pages when they exited: each could reach its RSS, so this count holds only for workers that live as long as these did.",
        );
    }
    if leaking {
        advice.push_str(
            " The workers leak, so their peak depends on how long they ran: this count holds for a run as long as this one, and fixing the leak matters more.",
        );
    }
    out.push(Finding {
        kind: "num_workers",
        severity,
        title,
        advice,
        numbers: vec![
            Cited::bytes("ceiling_bytes", "ceiling", fit.ceiling_bytes),
            Cited::bytes(
                "trainer_private_bytes",
                "trainer (and launchers) private",
                fit.trainer_bytes,
            ),
            Cited::bytes(
                "shared_bytes",
                "shared (PSS sum − USS sum)",
                fit.shared_bytes,
            ),
            Cited::bytes(
                "per_worker_private_peak_bytes",
                "per-worker private peak",
                fit.per_worker_bytes,
            ),
            Cited::count("workers_used", "workers in the run", used),
            Cited::count("workers_fit", "workers that fit", fit.fits),
        ],
    });
}

/// Shared memory that appears once the workers run is mostly batches in
/// flight through `/dev/shm`: `num_workers × prefetch_factor` of them.
pub(super) fn prefetch_share(log: &RunLog, out: &mut Vec<Finding>) {
    let mut best: Option<(u64, u64, u64, f64)> = None;
    let mut attempts: BTreeMap<u32, Vec<(f64, u64, u64)>> = BTreeMap::new();
    for snap in &log.snapshots {
        if !snap.procs.iter().any(|p| p.role == Role::Worker) {
            continue;
        }
        // A worker not read since its fork is listed with PSS = USS (what
        // it gained): the trainer's reading still counts their shared pages
        // as its own, and the first full reading would look like shared
        // memory appearing (the fork's sharing, not batches).
        if snap.procs.iter().any(|p| p.estimated) {
            continue;
        }
        let pss: u64 = snap.procs.iter().map(|p| p.pss_bytes).sum();
        let uss: u64 = snap.procs.iter().map(|p| p.uss_bytes).sum();
        if pss == 0 {
            continue;
        }
        attempts
            .entry(snap.attempt)
            .or_default()
            .push((snap.t, pss.saturating_sub(uss), pss));
    }
    for pts in attempts.values() {
        let Some(&(_, base, _)) = pts.first() else {
            continue;
        };
        let Some(&(t, peak_shared, pss)) = pts.iter().max_by_key(|p| p.1) else {
            continue;
        };
        let growth = peak_shared.saturating_sub(base);
        if best.is_none_or(|b| growth > b.0) {
            best = Some((growth, base, pss, t));
        }
    }
    let Some((growth, base, pss, t)) = best else {
        return;
    };
    let share = growth as f64 / pss as f64 * 100.0;
    if growth < 32 * MIB || share < 10.0 {
        return;
    }
    out.push(Finding {
        kind: "prefetch",
        severity: Severity::Info,
        title: format!("About {share:.0}% of the footprint is batches in flight"),
        advice: format!(
            "Shared memory grew from {} to {} while the workers ran (at {}): batches the workers prepared and handed over through /dev/shm, num_workers × prefetch_factor of them. Lowering prefetch_factor (default 2) or the batch size shrinks this part without giving up workers.",
            HumanBytes(base),
            HumanBytes(base + growth),
            time_text(t)
        ),
        numbers: vec![
            Cited::bytes("shared_growth_bytes", "shared growth", growth),
            Cited::bytes("tree_pss_bytes", "footprint then (PSS sum)", pss),
            Cited::percent("prefetch_share_percent", "share of the footprint", share),
        ],
    });
}
