//! How many DataLoader workers fit: the `num_workers` advice from the
//! measured per-worker private peak (raised by copy-on-write growth between
//! readings), the trainer's private memory while its workers ran and the
//! shared memory, all as parts of the footprint the policy compared with the
//! ceiling, and the `/dev/shm` share of batches in flight. A peak read
//! before the job's last growth gives no count; leaking workers give none
//! either (the leak, not the memory, sets it).

use std::collections::BTreeMap;

use super::finding::{Cited, FIT_SHARE, Finding, Severity, time_text};
use super::run_log::{CeilingInfo, RunLog, SamplePoint, Snapshot};
use crate::sinks::log::Event as Logged;
use crate::vocab::model::{CeilingSource, Role};
use crate::vocab::units::HumanBytes;

const MIB: u64 = 1 << 20;

/// The memory ceiling the job was closest to: that of the sample with the
/// least headroom, else the smallest ceiling `run_start` knew. `/dev/shm`
/// is left out: the footprint and the workers that fit are memory, not
/// shared-memory files (`report::shm` judges those).
pub fn nearest_ceiling(log: &RunLog) -> Option<(String, u64)> {
    let memory = |c: &&CeilingInfo| c.source != CeilingSource::Shm.as_str();
    log.samples
        .iter()
        .filter(|s| s.ceiling.as_ref().is_some_and(|c| memory(&c)))
        .min_by_key(|s| s.headroom_bytes.unwrap_or(u64::MAX))
        .and_then(|s| s.ceiling.as_ref())
        .map(|c| (c.source.clone(), c.bytes))
        .or_else(|| {
            log.start
                .as_ref()?
                .ceilings
                .iter()
                .filter(memory)
                .min_by_key(|c| c.bytes)
                .map(|c| (c.source.clone(), c.bytes))
        })
}

/// The sizing numbers behind the worker-count advice, all in the terms of
/// the footprint the policy compared with the ceiling (`tree.footprint_bytes`:
/// the cgroup's working set when the job had a cgroup of its own, else the
/// PSS sum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerFit {
    pub ceiling_bytes: u64,
    /// Private memory (USS) of everything that is not a worker, at its
    /// peak while the workers ran. Before the fork the trainer's private
    /// memory includes the pages its workers go on to share; after they
    /// exit it holds them again: neither is its share beside its workers.
    pub trainer_bytes: u64,
    /// The footprint before the first worker started, at its peak: the
    /// trainer alone, which must fit on its own (a limit of its own, never
    /// added to the shared pages).
    pub trainer_alone_bytes: u64,
    /// The footprint less every process's private memory while the
    /// workers ran (see [`worker_fit_numbers`]): the shared pages the
    /// footprint holds, counted once.
    pub shared_bytes: u64,
    pub per_worker_bytes: u64,
    /// The run's largest footprint, and the most workers its attempt ran.
    pub peak_footprint_bytes: u64,
    pub workers_at_peak: u64,
    /// Charged to the ceiling beside the job's footprint while the workers
    /// ran: a cgroup ceiling is compared with the working set of the
    /// cgroup that holds the limit, which holds oomguard itself too (and
    /// whatever else runs there). 0 for a budget, which is compared with
    /// the footprint alone.
    pub outside_bytes: u64,
    /// floor((ceiling × 0.9 − trainer − shared) / per-worker); 0 when the
    /// trainer alone is above ceiling × 0.9.
    pub fits: u64,
}

impl WorkerFit {
    /// What is left for workers: ceiling × 0.9 less the trainer and the
    /// shared memory.
    fn room(&self) -> f64 {
        self.ceiling_bytes as f64 * FIT_SHARE
            - self.trainer_bytes as f64
            - self.shared_bytes as f64
            - self.outside_bytes as f64
    }

    /// The trainer alone is above ceiling × 0.9: no worker count fits.
    fn trainer_alone_too_big(&self) -> bool {
        self.trainer_alone_bytes as f64 > self.ceiling_bytes as f64 * FIT_SHARE
    }

    /// What the parts come to with the run's workers: trainer + shared +
    /// workers × per-worker peak.
    pub fn parts_bytes(&self, workers: u64) -> u64 {
        self.trainer_bytes + self.shared_bytes + workers * self.per_worker_bytes
    }
}

/// When the workers of each attempt first held memory: the first sample
/// with worker PSS, or the first list with a worker's USS, whichever came
/// first. Attempts without workers are absent.
fn worker_starts(log: &RunLog) -> BTreeMap<u32, f64> {
    let mut starts: BTreeMap<u32, f64> = BTreeMap::new();
    let mut note = |attempt: u32, t: f64| {
        let e = starts.entry(attempt).or_insert(t);
        *e = e.min(t);
    };
    for s in &log.samples {
        if s.role_pss.iter().any(|&(r, b)| r == Role::Worker && b > 0) {
            note(s.attempt, s.t);
        }
    }
    for snap in &log.snapshots {
        if snap
            .procs
            .iter()
            .any(|p| p.role == Role::Worker && p.uss_bytes > 0)
        {
            note(snap.attempt, snap.t);
        }
    }
    starts
}

/// The footprint of the sample that carried a per-process list (or the
/// last one before it).
fn footprint_at(log: &RunLog, attempt: u32, t: f64) -> Option<u64> {
    log.samples
        .iter()
        .rfind(|s| s.attempt == attempt && s.t <= t)
        .map(SamplePoint::footprint)
}

/// Lists whose workers were read since their fork: the trainer is read
/// with them (a family is read at once), so its USS there is its share
/// beside them, not its reading from before the fork.
fn read_lists(log: &RunLog) -> impl Iterator<Item = &Snapshot> {
    log.snapshots.iter().filter(|s| {
        s.procs.iter().any(|p| p.role == Role::Worker) && !s.procs.iter().any(|p| p.estimated)
    })
}

/// The private memory of everything that is not a worker, at its peak
/// beside workers that were read (any list with workers when none was).
fn trainer_share(log: &RunLog) -> u64 {
    let fixed = |s: &Snapshot| -> u64 {
        s.procs
            .iter()
            .filter(|p| p.role != Role::Worker)
            .map(|p| p.uss_bytes)
            .sum()
    };
    read_lists(log)
        .map(fixed)
        .max()
        .or_else(|| {
            log.snapshots
                .iter()
                .filter(|s| s.procs.iter().any(|p| p.role == Role::Worker))
                .map(fixed)
                .max()
        })
        .unwrap_or(0)
}

/// Computes [`WorkerFit`] from the per-process lists; `None` without
/// workers or a ceiling.
pub fn worker_fit_numbers(log: &RunLog) -> Option<WorkerFit> {
    fit_with_peak(log, None)
}

/// [`worker_fit_numbers`] with the per-worker peak raised to `raised`
/// (copying measured between readings).
fn fit_with_peak(log: &RunLog, raised: Option<u64>) -> Option<WorkerFit> {
    let (_, ceiling) = nearest_ceiling(log)?;
    let per_worker = log
        .snapshots
        .iter()
        .flat_map(|s| s.procs.iter().filter(|p| p.role == Role::Worker))
        // A worker not read since its fork is listed with what its RSS
        // gained, an estimate (15.1 MiB for a worker read at 12.5 MiB in a
        // quiet run): the peak is of readings, as every worker finding's.
        .filter(|w| !w.estimated)
        .map(|w| w.uss_bytes)
        .max()
        .unwrap_or(0)
        .max(raised.unwrap_or(0));
    if per_worker == 0 {
        return None;
    }
    let trainer = trainer_share(log);
    let starts = worker_starts(log);
    let before_fork = |s: &&SamplePoint| starts.get(&s.attempt).is_none_or(|&t0| s.t < t0);
    let trainer_alone = log
        .samples
        .iter()
        .filter(before_fork)
        .map(SamplePoint::footprint)
        .max()
        .unwrap_or(0);
    // Shared memory as the footprint holds it: the footprint less every
    // process's private memory. With a cgroup of its own the footprint is
    // the working set, which leaves out file pages charged elsewhere (the
    // libraries every process maps, read before the job started): the PSS
    // sum less the USS sum would count them, and the parts would add up to
    // more than the ceiling the policy enforced ever saw. Sharing is
    // largest right after the workers are first read and shrinks as they
    // copy: every sample's totals see it, and every list's own figures.
    let while_workers = |s: &&SamplePoint| {
        s.uss_bytes > 0 && s.role_pss.iter().any(|&(r, b)| r == Role::Worker && b > 0)
    };
    let seen = log
        .samples
        .iter()
        .filter(while_workers)
        .map(|s| s.footprint().saturating_sub(s.uss_bytes))
        .chain(read_lists(log).filter_map(|snap| {
            let uss: u64 = snap.procs.iter().map(|p| p.uss_bytes).sum();
            footprint_at(log, snap.attempt, snap.t).map(|f| f.saturating_sub(uss))
        }))
        .max()
        .unwrap_or(0);
    let outside = log
        .samples
        .iter()
        .filter(while_workers)
        .filter_map(|s| {
            let c = s.ceiling.as_ref().filter(|c| c.bytes == ceiling)?;
            let used = c.bytes.checked_sub(s.headroom_bytes?)?;
            Some(used.saturating_sub(s.footprint()))
        })
        .max()
        .unwrap_or(0);
    let peak = log.samples.iter().max_by_key(|s| s.footprint());
    let peak_footprint = peak.map_or(0, SamplePoint::footprint);
    let workers_at_peak = peak
        .and_then(|p| log.attempt(p.attempt))
        .map_or(0, |a| a.max_workers) as u64;
    // Each part at its own peak may come from another moment: at most
    // what the run's peak footprint leaves beyond the private parts, so
    // that with the run's workers the parts never add up to more than the
    // footprint measured (a leak's parts all peak at the stop: equal).
    let left = peak_footprint.saturating_sub(trainer + workers_at_peak * per_worker);
    let shared = if workers_at_peak > 0 {
        seen.min(left)
    } else {
        seen
    };
    let mut fit = WorkerFit {
        ceiling_bytes: ceiling,
        trainer_bytes: trainer,
        trainer_alone_bytes: trainer_alone,
        shared_bytes: shared,
        per_worker_bytes: per_worker,
        peak_footprint_bytes: peak_footprint,
        workers_at_peak,
        outside_bytes: outside,
        fits: 0,
    };
    if !fit.trainer_alone_too_big() && fit.room() > 0.0 {
        fit.fits = (fit.room() / per_worker as f64).floor() as u64;
    }
    Some(fit)
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
fn with_copying(log: &RunLog, fit: &mut WorkerFit, out: &[Finding]) -> (Option<u64>, bool) {
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
        // The shared part is bounded by what the peak leaves beyond the
        // private parts: a larger per-worker peak leaves less.
        if let Some(raised) = fit_with_peak(log, Some(peak)) {
            *fit = raised;
        }
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

/// The workers' count in a title: `3 DataLoader workers fit`.
fn fit_count(n: u64) -> String {
    format!(
        "{} fit{}",
        workers(n, "DataLoader worker"),
        if n == 1 { "s" } else { "" }
    )
}

/// What the worker-count finding says, from the run it describes.
struct FitCase<'a> {
    fit: &'a WorkerFit,
    /// The most workers an attempt ran.
    used: u64,
    /// The workers leak (the `worker_leak` finding fired).
    leaking: bool,
    /// The run was stopped, restarted or killed.
    trouble: bool,
    /// `90% of the budget ceiling (…) leaves … after …`.
    room: String,
    /// What the footprint was (`cgroup working set`, `PSS sum`).
    kind: &'static str,
}

impl FitCase<'_> {
    /// Severity, title and the advice's first sentences.
    fn verdict(&self) -> (Severity, String, String) {
        let (fit, used, room) = (self.fit, self.used, &self.room);
        let each = HumanBytes(fit.per_worker_bytes);
        if fit.trainer_alone_too_big() {
            return (
                Severity::Warning,
                format!(
                    "The trainer alone does not fit: {} before its workers started",
                    HumanBytes(fit.trainer_alone_bytes)
                ),
                format!(
                    "Before its DataLoader workers started the job's footprint ({}) was already {}, above {:.0}% of the ceiling ({}): no num_workers fits, not even 0. Shrink what the trainer holds (batch size, data kept in memory) or raise the limit.",
                    self.kind,
                    HumanBytes(fit.trainer_alone_bytes),
                    FIT_SHARE * 100.0,
                    HumanBytes(fit.ceiling_bytes)
                ),
            );
        }
        if self.leaking {
            // A leaking worker's peak is the leak's size when the run
            // ended: any count computed from it moves with the run's
            // length, and fewer workers would only reach the same ceiling
            // later. The leak finding says what to do.
            return (
                if self.trouble {
                    Severity::Warning
                } else {
                    Severity::Info
                },
                format!(
                    "The workers' leak sets the worker count: fix the leak first (the run used {used})"
                ),
                format!(
                    "{room}. The per-worker peak ({each}) is what the leak had reached when the run ended, and it grows for as long as the leaking workers run: no num_workers is safe while they leak, and fewer workers would only reach the ceiling later. Fix the leak first, then size num_workers from a run without it."
                ),
            );
        }
        if fit.fits == 0 {
            return (
                Severity::Warning,
                "Not even one DataLoader worker fits: use num_workers=0 or more memory".to_string(),
                format!(
                    "{room}; one worker needs {each} at its peak. Load data in the main process (num_workers=0), shrink what each worker holds, or raise the limit."
                ),
            );
        }
        let n = fit.fits;
        if n < used {
            let severity = if self.trouble {
                Severity::Warning
            } else {
                Severity::Info
            };
            return (
                severity,
                format!(
                    "At most {}; the run used {used}: set num_workers={n}",
                    fit_count(n)
                ),
                format!(
                    "{room}: room for {} at {each} private each at their peak (set num_workers={n}).",
                    workers(n, "worker")
                ),
            );
        }
        (
            Severity::Info,
            format!("Up to {} (the run used {used})", fit_count(n)),
            format!(
                "{room}: room for {} at {each} private each at their peak, so num_workers={n} is within budget.",
                workers(n, "worker")
            ),
        )
    }

    /// The figures the finding cites.
    fn numbers(&self) -> Vec<Cited> {
        let fit = self.fit;
        let mut numbers = vec![
            Cited::bytes("ceiling_bytes", "ceiling", fit.ceiling_bytes),
            Cited::bytes(
                "trainer_private_bytes",
                "trainer (and launchers) private while the workers ran",
                fit.trainer_bytes,
            ),
            Cited::bytes(
                "shared_bytes",
                &format!("shared ({} − private)", self.kind),
                fit.shared_bytes,
            ),
            Cited::bytes(
                "per_worker_private_peak_bytes",
                "per-worker private peak",
                fit.per_worker_bytes,
            ),
        ];
        if fit.outside_bytes > 0 {
            numbers.push(Cited::bytes(
                "outside_bytes",
                "charged to the ceiling outside the job",
                fit.outside_bytes,
            ));
        }
        if fit.trainer_alone_bytes > 0 {
            numbers.push(Cited::bytes(
                "trainer_alone_bytes",
                "footprint before the workers started",
                fit.trainer_alone_bytes,
            ));
        }
        numbers.extend([
            Cited::bytes(
                "peak_footprint_bytes",
                &format!("peak footprint ({})", self.kind),
                fit.peak_footprint_bytes,
            ),
            Cited::count("workers_used", "workers in the run", self.used),
            Cited::count("workers_fit", "workers that fit", fit.fits),
        ]);
        numbers
    }
}

pub(super) fn worker_fit(log: &RunLog, out: &mut Vec<Finding>) {
    let Some(mut fit) = worker_fit_numbers(log) else {
        return;
    };
    let (cow, still_copying) = with_copying(log, &mut fit, out);
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
            e.event,
            Logged::OomKill(_) | Logged::Restart(_) | Logged::Action(_)
        )
    });
    let kind = log.footprint_kind();
    let outside = if fit.outside_bytes >= MIB {
        format!(
            ", and {} outside the job in the cgroup that holds the limit (oomguard itself among it)",
            HumanBytes(fit.outside_bytes)
        )
    } else {
        String::new()
    };
    let room = format!(
        "{:.0}% of the {source} ceiling ({}) leaves {} after the trainer's {} private (while its workers ran) and {} shared (the {kind} less every process's private memory){outside}",
        FIT_SHARE * 100.0,
        HumanBytes(fit.ceiling_bytes),
        HumanBytes(fit.room().max(0.0) as u64),
        HumanBytes(fit.trainer_bytes),
        HumanBytes(fit.shared_bytes),
    );
    let case = FitCase {
        fit: &fit,
        used,
        leaking,
        trouble,
        room,
        kind,
    };
    let (severity, title, mut advice) = case.verdict();
    if last != used && last > 0 {
        advice.push_str(&format!(" The last attempt ran with {last}."));
    }
    if fit.workers_at_peak > 0 {
        let parts = fit.parts_bytes(fit.workers_at_peak);
        advice.push_str(&format!(
            " With {} these parts come to {}, against the run's peak footprint ({kind}) of {}",
            workers(fit.workers_at_peak, "worker"),
            HumanBytes(parts),
            HumanBytes(fit.peak_footprint_bytes)
        ));
        advice.push_str(if parts as f64 > fit.peak_footprint_bytes as f64 * 1.05 {
            ": its workers did not all hold that peak at once, so the count is on the safe side."
        } else {
            "."
        });
    }
    advice.push_str(&format!(
        " Assumed: every worker holds the largest private memory measured in one ({}), the trainer's private and the shared memory stay at their measured peaks, and nothing more is charged to the ceiling.",
        HumanBytes(fit.per_worker_bytes)
    ));
    if still_copying {
        advice.push_str(
            " The workers were still copying shared pages when they exited: each could reach its RSS, so this count holds only for workers that live as long as these did.",
        );
    }
    out.push(Finding {
        kind: "num_workers",
        severity,
        title,
        advice,
        numbers: case.numbers(),
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
        title: format!("About {share:.0}% of the PSS sum is batches in flight"),
        advice: format!(
            "Shared memory grew from {} to {} while the workers ran (at {}): batches the workers prepared and handed over through /dev/shm, num_workers × prefetch_factor of them. Lowering prefetch_factor (default 2) or the batch size shrinks this part without giving up workers.",
            HumanBytes(base),
            HumanBytes(base + growth),
            time_text(t)
        ),
        numbers: vec![
            Cited::bytes("shared_growth_bytes", "shared growth", growth),
            Cited::bytes("tree_pss_bytes", "PSS sum then", pss),
            Cited::percent("prefetch_share_percent", "share of the PSS sum", share),
        ],
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::report::{diagnose, load};

    const MIB: u64 = 1 << 20;
    const ENV: &str = r#""schema":"oomguard/1","ts":"2026-01-01T00:00:00.000Z""#;

    /// A trainer whose footprint is `alone` MiB until t = 5, then two flat
    /// workers of 50 MiB private each beside a trainer of 200 MiB private
    /// and 100 MiB shared, under a 1 GiB cgroup ceiling.
    fn forked_log(alone: u64) -> String {
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            1024 * MIB
        )];
        let sample = |t: u32, footprint: u64, uss: u64, roles: &str, procs: &str| {
            format!(
                r#"{{{ENV},"event":"sample","t":{t},"attempt":1,"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"pss_bytes":{footprint},"uss_bytes":{uss},"rss_bytes":{footprint},"footprint_bytes":{footprint}}},"roles":[{roles}]{procs}}}"#,
                (1024 * MIB).saturating_sub(footprint),
                1024 * MIB
            )
        };
        for t in 1..5 {
            let b = alone * MIB;
            let roles = format!(r#"{{"role":"trainer","pss_bytes":{b},"rss_bytes":{b}}}"#);
            lines.push(sample(t, b, b, &roles, ""));
        }
        for t in 5..15 {
            let (trainer, shared, worker) = (200 * MIB, 100 * MIB, 50 * MIB);
            let footprint = trainer + shared + 2 * worker;
            let roles = format!(
                r#"{{"role":"trainer","pss_bytes":{},"rss_bytes":1}},{{"role":"worker","pss_bytes":{},"rss_bytes":1}}"#,
                trainer + shared / 3,
                2 * (worker + shared / 3)
            );
            let procs = format!(
                r#","procs":[{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":1,"pss_bytes":{},"uss_bytes":{trainer}}},{{"pid":101,"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":1,"pss_bytes":{p},"uss_bytes":{worker}}},{{"pid":102,"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":1,"pss_bytes":{p},"uss_bytes":{worker}}}]"#,
                trainer + shared / 3,
                p = worker + shared / 3
            );
            lines.push(sample(t, footprint, trainer + 2 * worker, &roles, &procs));
        }
        lines.join("\n")
    }

    #[test]
    fn the_trainer_alone_is_a_limit_of_its_own_never_added_to_the_shared_pages() {
        // 700 MiB before the fork, 400 MiB with both workers: the parts are
        // 200 + 100 + 2 × 50, and (921.6 − 300) / 50 → 12 workers fit.
        let log = load(&forked_log(700)).unwrap();
        let fit = worker_fit_numbers(&log).unwrap();
        assert_eq!(fit.trainer_bytes, 200 * MIB);
        assert_eq!(fit.trainer_alone_bytes, 700 * MIB);
        assert!(fit.shared_bytes.abs_diff(100 * MIB) <= 2, "{fit:?}");
        // The run's peak was the trainer alone; with its workers the parts
        // come to what the footprint held then.
        assert_eq!(fit.peak_footprint_bytes, 700 * MIB);
        assert!(fit.parts_bytes(2).abs_diff(400 * MIB) <= 2, "{fit:?}");
        assert_eq!(fit.fits, 12);
        // 950 MiB alone is above 90 % of the ceiling: no count fits.
        let log = load(&forked_log(950)).unwrap();
        assert_eq!(worker_fit_numbers(&log).unwrap().fits, 0);
        let f = diagnose(&log);
        let fit = f.iter().find(|f| f.kind == "num_workers").unwrap();
        assert!(
            fit.title.starts_with("The trainer alone does not fit"),
            "{}",
            fit.title
        );
    }

    #[test]
    fn a_worker_not_yet_read_does_not_set_the_per_worker_peak() {
        // A third worker forked at t = 15, listed before its first reading
        // with its RSS gain (70 MiB, PSS = USS): not a reading.
        let mut text = forked_log(700);
        text.push_str(&format!(
            r#"
{{{ENV},"event":"sample","t":15,"attempt":1,"headroom_bytes":{h},"ceiling":{{"source":"cgroup","bytes":{c}}},"tree":{{"pss_bytes":{f},"uss_bytes":{f},"rss_bytes":{f},"footprint_bytes":{f}}},"roles":[],"procs":[{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":1,"pss_bytes":{t},"uss_bytes":{t}}},{{"pid":103,"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":1,"pss_bytes":{w},"uss_bytes":{w}}}]}}"#,
            h = 524 * MIB,
            c = 1024 * MIB,
            f = 500 * MIB,
            t = 200 * MIB,
            w = 70 * MIB,
        ));
        let log = load(&text).unwrap();
        assert!(
            log.snapshots
                .iter()
                .any(|s| s.procs.iter().any(|p| p.estimated))
        );
        assert_eq!(worker_fit_numbers(&log).unwrap().per_worker_bytes, 50 * MIB);
    }
}
