//! Growth findings: whether the private memory of the DataLoader workers
//! and of the trainer grew, and if it did, which of the field's canonical
//! causes it was. Every one of them first asks the policy's question
//! (`crate::vocab::growth`): is it still growing at its last readings, or did it
//! rise and stop?
//!
//! - Workers whose private memory (USS) rose while their RSS did not were
//!   copying pages they inherited from the trainer (reference counts
//!   written on read, pytorch/pytorch#13246): `worker_cow`, with the growth
//!   per worker and the level where it settled. Still growing at the end:
//!   `worker_leak`. Rose with their RSS and stopped: `worker_load`.
//! - A trainer still growing at the end leaks (`trainer_growth`); one that
//!   rose, held and gave it back accumulated something over a loop
//!   (`trainer_accumulation`, evaluation outputs kept to the end); one that
//!   rose and stayed loaded something (`trainer_load`).
//!
//! Each finding cites the per-process figures it states as numbers, so
//! they can be checked against an independent measurement.

use std::collections::BTreeMap;

use super::finding::{
    Cited, Finding, ProcSummary, Severity, and_list, held_spans, rate_text, time_text,
};
use super::run_log::{RunLog, SamplePoint};
use crate::vocab::growth::{self, lower_median};
use crate::vocab::model::{ETA_WINDOW_SECONDS, Role};
use crate::vocab::units::HumanBytes;

const MIB: u64 = 1 << 20;

/// A rise smaller than this (and than a quarter of where it started) is
/// not worth a finding: allocator slack, a worker's first batches.
pub(super) const RISE_MIN_BYTES: f64 = (8 * MIB) as f64;
/// Copying between readings that the footprint shows (see `settle`) is
/// only added from this much per worker: below it, the footprint's own
/// drift (3-4 MiB per worker was measured on workers truly flat; copying
/// the readings missed came to 7 MiB and more).
const EXTRA_MIN_BYTES: f64 = (6 * MIB) as f64;

/// One reading of one process: run time, USS, RSS.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reading {
    pub(super) t: f64,
    /// When the `smaps_rollup` readings behind it were taken (the list's
    /// time less their age): USS copied since then is not in it yet.
    pub(super) read_t: f64,
    pub(super) uss: f64,
    pub(super) rss: f64,
    /// The most RSS a tick saw since the previous list (at least `rss`).
    pub(super) rss_peak: f64,
}

/// Each process's readings, keyed by attempt and pid, oldest first; those
/// taken while oomguard held it (SIGSTOP) are left out, as in
/// `diagnose::processes`.
pub(super) fn readings(log: &RunLog) -> BTreeMap<(u32, u32), Vec<Reading>> {
    let held = held_spans(log);
    let was_held = |pid: u32, t: f64| {
        held.get(&pid)
            .is_some_and(|s| s.iter().any(|&(from, to)| from < t && t <= to))
    };
    let mut out: BTreeMap<(u32, u32), (String, Vec<Reading>)> = BTreeMap::new();
    for snap in &log.snapshots {
        for p in &snap.procs {
            // Not swept yet: zeros; an estimate is not a reading (see
            // `ProcPoint::estimated`). A process on its way out (the kernel
            // tore its memory down, RSS reads 0) holds nothing of its own
            // any more.
            if p.rss_bytes == 0 || p.estimated {
                continue;
            }
            let (comm, pts) = out
                .entry((snap.attempt, p.pid))
                .or_insert_with(|| (p.comm.clone(), Vec::new()));
            // Another program now (a shell that exec'd python).
            if *comm != p.comm {
                comm.clone_from(&p.comm);
                pts.clear();
            }
            // The same reading listed again (the family was not re-read
            // since the last list): no news, and counting it as a new point
            // would make growth that stopped look ongoing, or the reverse.
            // A trainer's figures follow its RSS between readings (read on
            // every tick): listed again, they are still news.
            let read_t = snap.read_t(p);
            let again = p.role == Role::Worker
                && pts.last().is_some_and(|r: &Reading| {
                    r.uss == p.uss_bytes as f64
                        && r.rss == p.rss_bytes as f64
                        && match p.read_age_seconds {
                            Some(_) => (read_t - r.read_t).abs() < 0.01,
                            None => snap.pss_age_seconds.unwrap_or(0.0) >= snap.t - r.t,
                        }
                });
            if !was_held(p.pid, snap.t) && !again {
                pts.push(Reading {
                    t: snap.t,
                    read_t,
                    uss: p.uss_bytes as f64,
                    rss: p.rss_bytes as f64,
                    rss_peak: p.rss_peak_bytes.unwrap_or(p.rss_bytes).max(p.rss_bytes) as f64,
                });
            }
        }
    }
    out.into_iter().map(|(k, (_, v))| (k, v)).collect()
}

/// How one process's private memory moved over the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Growth {
    Flat,
    /// Still growing at its last readings (the policy's definition), at
    /// the trend of the last window, bytes/s; `bytes` gained since its
    /// first reading, `rss_rise` what its RSS gained meanwhile, `rss` its
    /// RSS now.
    Continuing {
        rate: f64,
        bytes: f64,
        rss_rise: f64,
        rss: f64,
    },
    /// Rose by `bytes` over `seconds` and stopped, at `level`; `rss_rise`:
    /// what its RSS gained meanwhile.
    Ramp {
        bytes: f64,
        seconds: f64,
        level: f64,
        rss_rise: f64,
    },
}

pub(super) fn growth_of(pts: &[Reading]) -> Growth {
    let uss: Vec<(f64, f64)> = pts.iter().map(|r| (r.t, r.uss)).collect();
    match growth::shape(&uss, ETA_WINDOW_SECONDS) {
        growth::Shape::Flat => Growth::Flat,
        growth::Shape::Growing { rate } => {
            let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
                return Growth::Flat;
            };
            Growth::Continuing {
                rate,
                bytes: last.uss - first.uss,
                rss_rise: last.rss - first.rss,
                rss: last.rss,
            }
        }
        growth::Shape::Ramp { bytes, seconds } => {
            let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
                return Growth::Flat;
            };
            if bytes < RISE_MIN_BYTES || bytes < first.uss / 4.0 {
                return Growth::Flat;
            }
            let peak_rss = pts.iter().map(|r| r.rss).fold(0.0, f64::max);
            Growth::Ramp {
                bytes,
                seconds,
                level: last.uss,
                rss_rise: peak_rss - first.rss,
            }
        }
    }
}

/// The worker findings: leak, copy-on-write growth, a one-off load, or
/// flat memory.
pub(super) fn worker_growth(log: &RunLog, procs: &[ProcSummary], out: &mut Vec<Finding>) {
    let series = readings(log);
    let workers: Vec<(&ProcSummary, Growth)> = procs
        .iter()
        .filter(|p| p.role == Role::Worker)
        .filter_map(|p| {
            // Listed at least twice; the same reading listed again (the
            // family did not move enough to be re-read) counts as flat.
            let pts = series.get(&(p.attempt, p.pid))?;
            (p.snapshots >= 2 && p.last_t > p.first_t).then(|| (p, growth_of(pts)))
        })
        .collect();
    if workers.is_empty() {
        return;
    }
    let first_read = |p: &ProcSummary| {
        series
            .get(&(p.attempt, p.pid))
            .and_then(|pts| pts.first())
            .map_or(p.first_t, |r| r.read_t)
    };
    // Private memory that grew while RSS did not was copied, not
    // allocated (a leak allocates, and RSS shows it): copy-on-write, which
    // cannot go beyond what the worker maps, whether or not it had levelled
    // off by the end.
    let copying = |bytes: f64, rss_rise: f64| bytes >= RISE_MIN_BYTES && rss_rise < bytes / 2.0;
    let leaking: Vec<&ProcSummary> = workers
        .iter()
        .filter(|(p, g)| match *g {
            Growth::Continuing {
                bytes, rss_rise, ..
            } => !copying(bytes, rss_rise) && p.leaks(),
            _ => false,
        })
        .map(|(p, _)| *p)
        .collect();
    let cow: Vec<Copied<'_>> = workers
        .iter()
        .filter_map(|(p, g)| match *g {
            Growth::Ramp {
                bytes,
                seconds,
                level,
                rss_rise,
            } if copying(bytes, rss_rise) => Some(Copied {
                p,
                first_read: first_read(p),
                bytes,
                seconds,
                level,
                settled: true,
                rss: p.peak_rss_bytes as f64,
                reached: level,
            }),
            Growth::Continuing {
                bytes,
                rss_rise,
                rss,
                ..
            } if copying(bytes, rss_rise) => Some(Copied {
                p,
                first_read: first_read(p),
                bytes,
                seconds: p.last_t - p.first_t,
                level: rss,
                settled: false,
                rss,
                reached: p.last_uss_bytes as f64,
            }),
            _ => None,
        })
        .collect();
    let candidates = small_risers(&workers, &series, &leaking);
    let cow: Vec<Copied<'_>> = settle(log, &series, cow.into_iter().chain(candidates).collect())
        .into_iter()
        .filter(|c| c.bytes >= RISE_MIN_BYTES)
        .collect();
    let loads: Vec<(&ProcSummary, f64, f64, f64)> = workers
        .iter()
        .filter_map(|(p, g)| match *g {
            Growth::Ramp {
                bytes,
                seconds,
                level,
                rss_rise,
            } if !copying(bytes, rss_rise) => Some((*p, bytes, seconds, level)),
            _ => None,
        })
        .collect();
    if !leaking.is_empty() {
        out.push(worker_leak(&leaking, workers.len()));
    }
    if !cow.is_empty() {
        // Every worker the lists named, also one listed once: a set of
        // workers that copied before its first reading was still started.
        let started = procs.iter().filter(|p| p.role == Role::Worker).count();
        out.push(worker_cow(log, &cow, workers.len(), started));
    }
    if !loads.is_empty() {
        out.push(worker_load(&loads, workers.len()));
    }
    if leaking.is_empty() && cow.is_empty() && loads.is_empty() {
        out.push(worker_flat(&workers));
    }
}

/// Workers whose readings rose, but too little to call it on their
/// own, while their RSS stood still: readings a sweep or more apart
/// can miss most of a short-lived worker's copying (a set of workers
/// read twice, 7 MiB apart, was called flat while it copied 15 MiB).
/// What the footprint shows after their last reading decides.
fn small_risers<'a>(
    workers: &[(&'a ProcSummary, Growth)],
    series: &BTreeMap<(u32, u32), Vec<Reading>>,
    leaking: &[&ProcSummary],
) -> Vec<Copied<'a>> {
    workers
        .iter()
        .filter_map(|(p, g)| {
            let small = match *g {
                Growth::Flat => true,
                Growth::Continuing { bytes, .. } | Growth::Ramp { bytes, .. } => {
                    bytes < RISE_MIN_BYTES
                }
            };
            let pts = series.get(&(p.attempt, p.pid))?;
            let (first, last) = (pts.first()?, pts.last()?);
            let bytes = last.uss - first.uss;
            let rss_rise = pts.iter().map(|r| r.rss).fold(0.0, f64::max) - first.rss;
            (small
                && !leaking.iter().any(|l| std::ptr::eq(*l, *p))
                && bytes >= RISE_MIN_BYTES / 4.0
                && rss_rise < RISE_MIN_BYTES / 4.0)
                .then_some(Copied {
                    p,
                    first_read: first.read_t,
                    bytes,
                    seconds: last.t - first.t,
                    level: last.uss,
                    // Rising at its last reading.
                    settled: false,
                    rss: last.rss,
                    reached: last.uss,
                })
        })
        .collect()
}

fn worker_flat(workers: &[(&ProcSummary, Growth)]) -> Finding {
    let peak = workers
        .iter()
        .map(|(p, _)| p.peak_uss_bytes)
        .max()
        .unwrap_or(0);
    // A drift only where a worker's readings support a rate (`growth::
    // figure`): a worker caught mid-start by its first readings has a
    // least-squares slope, not a drift.
    let drift = (workers.iter())
        .filter_map(|(p, _)| p.uss_figure.rate())
        .reduce(f64::max);
    let mut numbers = vec![
        Cited::count("workers", "workers observed", workers.len() as u64),
        Cited::bytes(
            "per_worker_private_peak_bytes",
            "per-worker private peak",
            peak,
        ),
    ];
    numbers.extend(drift.map(|d| Cited::rate("max_growth_bytes_per_second", "largest drift", d)));
    Finding {
        kind: "worker_flat",
        severity: Severity::Info,
        title: "Worker memory is flat: no leak in the workers".to_string(),
        advice: format!(
            "Each of the {} workers observed held at most {} of private memory and did not grow. Their cost is a fixed amount per worker: the number of workers, not a leak, decides whether they fit.",
            workers.len(),
            HumanBytes(peak)
        ),
        numbers,
    }
}

fn worker_leak(leaking: &[&ProcSummary], observed: usize) -> Finding {
    let rates: Vec<f64> = leaking.iter().filter_map(|p| p.uss_slope).collect();
    let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    // The tree's growth: the leaking workers of one attempt run together.
    let mut per_attempt: BTreeMap<u32, f64> = BTreeMap::new();
    for p in leaking {
        *per_attempt.entry(p.attempt).or_default() += p.uss_slope.unwrap_or(0.0);
    }
    let together = per_attempt.values().copied().fold(0.0, f64::max);
    let first = leaking.iter().map(|p| p.first_uss_bytes).min().unwrap_or(0);
    let peak = leaking.iter().map(|p| p.peak_uss_bytes).max().unwrap_or(0);
    let names = name_workers(leaking);
    Finding {
        kind: "worker_leak",
        severity: Severity::Warning,
        title: format!(
            "{} of {observed} DataLoader workers leak: +{} each",
            leaking.len(),
            rate_text(mean)
        ),
        advice: format!(
            "The private memory (USS) of {names} grew steadily, from {} to {} per worker, at {} each: {} for the job while they ran together, and it was still growing at the end. Memory that keeps growing in every worker is a leak in the dataset or a cache it fills (a dict or list of samples, decoded images, a Python object per item touched). Bound the cache or keep it in the trainer, or set persistent_workers=False so workers are recycled each epoch. Fewer workers only postpones the kill.",
            HumanBytes(first),
            HumanBytes(peak),
            rate_text(mean),
            rate_text(together),
        ),
        numbers: vec![
            Cited::count("leaking_workers", "leaking workers", leaking.len() as u64),
            Cited::count("workers", "workers observed", observed as u64),
            Cited::rate(
                "per_worker_growth_bytes_per_second",
                "growth per worker",
                mean,
            ),
            Cited::bytes(
                "first_private_bytes",
                "private memory at first sight",
                first,
            ),
            Cited::bytes("peak_private_bytes", "private peak of a worker", peak),
        ],
    }
}

/// A worker whose private memory grew by copying pages it shared: by
/// `bytes` over `seconds`; `settled` at `level`, or still copying at the
/// end with `level` its RSS, the most it can copy.
struct Copied<'a> {
    p: &'a ProcSummary,
    /// When its first reading was taken.
    first_read: f64,
    bytes: f64,
    seconds: f64,
    level: f64,
    settled: bool,
    /// Its RSS at the last reading: the most it can copy.
    rss: f64,
    /// The private memory it reached: its last reading plus its share of
    /// the copying seen after it (see [`settle`]).
    reached: f64,
}

/// What the per-process lists missed: copying goes on between readings
/// (the sweeper re-reads within its budget, every few seconds), and a list
/// is only written when a worker moved enough. The job's footprint, on
/// every sample line, shows it: growth of the footprint that the RSS sum
/// does not explain, after a worker's last reading and while the workers
/// lived, is shared among the copying workers of the attempt; and if that
/// growth had stopped by the time they exited, they had settled.
fn settle<'a>(
    log: &RunLog,
    series: &BTreeMap<(u32, u32), Vec<Reading>>,
    mut cow: Vec<Copied<'a>>,
) -> Vec<Copied<'a>> {
    // Who shared the growth after each worker's last reading: the copying
    // workers of its attempt whose lives (as the lists saw them) overlap
    // its own. Sets of workers started every epoch do not overlap, and
    // counting them all divided each set's copying by the number of sets.
    let lives: Vec<(u32, f64, f64)> = cow
        .iter()
        .map(|c| (c.p.attempt, c.p.first_t, c.p.last_t))
        .collect();
    for c in &mut cow {
        let n = lives
            .iter()
            .filter(|(a, first, last)| {
                *a == c.p.attempt && *first <= c.p.last_t && *last >= c.p.first_t
            })
            .count()
            .max(1) as f64;
        let Some(pts) = series.get(&(c.p.attempt, c.p.pid)) else {
            continue;
        };
        let Some(last) = pts.last() else {
            continue;
        };
        // Its last step still rose: whatever the trend says of the
        // readings (a steep start makes later, slower copying look like
        // it had stopped), it settled after its last reading, if at all.
        // Lists seconds apart on a busy machine read a worker a sweep
        // before it exited at -5 % of its true level (pytorch#5902's
        // case, both cores busy).
        let still_rising =
            pts.len() >= 2 && last.uss - pts[pts.len() - 2].uss > growth::FLOOR_BYTES;
        // The tree as big as at the worker's last list: the workers alive.
        let alive = log
            .snapshots
            .iter()
            .find(|s| s.attempt == c.p.attempt && s.t >= c.p.last_t)
            .map_or(0, |s| s.procs.len() as u64);
        // From the sample before the reading (the footprint is read every
        // tick, the reading fell between two).
        let ours: Vec<&SamplePoint> = log
            .samples
            .iter()
            .filter(|s| s.attempt == c.p.attempt)
            .collect();
        let from = ours.iter().rposition(|s| s.t <= last.read_t).unwrap_or(0);
        let after: Vec<&SamplePoint> = ours[from..]
            .iter()
            .copied()
            .take_while(|s| s.procs.unwrap_or(0) >= alive)
            .collect();
        // The tick around the reading and one after: enough to see how
        // much was copied since (a worker read a second before the job's
        // end, after its copying stopped, was called still copying).
        if after.len() < 2 {
            continue;
        }
        // Footprint less RSS: what copying adds, and nothing else does.
        let copied: Vec<(f64, f64)> = after
            .iter()
            .map(|s| {
                let fp = s.footprint_bytes.unwrap_or(s.pss_bytes) as f64;
                (s.t, fp - s.rss_bytes as f64)
            })
            .collect();
        // What the footprint said when the reading was taken, between the
        // two ticks around it: from the tick before, the copying between
        // that tick and the reading was counted twice (+19 % on a worker's
        // growth).
        let (a, b) = (copied[0], copied[1]);
        let at_reading = if b.0 > a.0 {
            a.1 + (b.1 - a.1) * ((last.read_t - a.0) / (b.0 - a.0)).clamp(0.0, 1.0)
        } else {
            a.1
        };
        let extra = (copied[copied.len() - 1].1 - at_reading).max(0.0) / n;
        // Footprint less RSS also drifts for reasons of its own (kernel
        // memory, batches passed through shared memory): a few MiB per
        // worker is that, not copying the readings missed.
        if extra < EXTRA_MIN_BYTES {
            // Too little after its last reading to call it still copying:
            // it had settled. If its own readings were still rising, it
            // settled after the last of them, and the little the footprint
            // grew is what it copied meanwhile (a worker last read a sweep
            // before it exited was seen at -15 % of its last true level
            // without it); readings that had levelled off already say
            // where, and the footprint's drift is not added (+5 %).
            if !c.settled || still_rising {
                c.bytes += extra;
                c.reached = last.uss + extra;
            } else {
                c.reached = last.uss;
            }
            c.settled = true;
            c.level = c.reached;
            continue;
        }
        c.bytes += extra;
        // Whether that copying had stopped takes a trend's worth of ticks.
        c.settled = copied.len() >= growth::TAIL
            && !matches!(
                growth::shape(&copied, ETA_WINDOW_SECONDS),
                growth::Shape::Growing { .. }
            );
        c.reached = last.uss + extra;
        c.level = if c.settled { c.reached } else { c.rss };
    }
    cow
}

/// How many sets of workers ran: more than the most seen at once means the
/// DataLoader started new ones (`persistent_workers=False`, or a new
/// DataLoader per epoch).
fn generations(log: &RunLog, n: usize) -> usize {
    let at_once = log
        .attempts
        .iter()
        .map(|a| a.max_workers)
        .max()
        .unwrap_or(1)
        .max(1);
    n.div_ceil(at_once).max(1)
}

fn worker_cow(log: &RunLog, cow: &[Copied<'_>], observed: usize, started: usize) -> Finding {
    let growth = lower_median(cow.iter().map(|c| c.bytes).collect());
    let seconds = lower_median(cow.iter().map(|c| c.seconds).collect());
    let settled = cow.iter().all(|c| c.settled);
    // Settled: the level they reached; otherwise the bound of the copying
    // (their RSS), also for those of them that had settled.
    let level = if settled {
        lower_median(cow.iter().map(|c| c.level).collect())
    } else {
        lower_median(cow.iter().map(|c| c.rss).collect())
    };
    // What the lists missed between readings counts in the peak too.
    let peak = cow
        .iter()
        .map(|c| c.p.peak_uss_bytes.max(c.reached as u64))
        .max()
        .unwrap_or(0);
    let gens = generations(log, started.max(cow.len()));
    let names = name_workers(&cow.iter().map(|c| c.p).collect::<Vec<_>>());
    let again = if gens > 1 {
        format!(
            " The workers were started {gens} times (persistent_workers=False, or a new DataLoader each epoch), and every new set copied the pages again: persistent_workers=True pays for it once."
        )
    } else {
        String::new()
    };
    let (title_end, how_far, level_number) = if settled {
        (
            format!("settling at {}", HumanBytes(level as u64)),
            format!(
                "It levels off once a worker has touched the whole data set, at about {} per worker here: a fixed cost of every worker, not a leak.",
                HumanBytes(level as u64)
            ),
            Cited::bytes(
                "per_worker_settled_bytes",
                "private level per worker once settled",
                level as u64,
            ),
        )
    } else {
        (
            format!("still copying at the end (≤ {})", HumanBytes(level as u64)),
            format!(
                "They were still copying when the run ended; it stops once a worker has touched the whole data set, at most at its RSS ({} per worker here): a bounded cost of every worker, not a leak.",
                HumanBytes(level as u64)
            ),
            Cited::bytes(
                "per_worker_bound_bytes",
                "the most a worker can copy (its RSS)",
                level as u64,
            ),
        )
    };
    Finding {
        kind: "worker_cow",
        severity: Severity::Warning,
        title: format!(
            "Copy-on-read in DataLoader workers: +{} each, {title_end}",
            HumanBytes(growth as u64),
        ),
        advice: format!(
            "The private memory (USS) of {names} rose by {} each over {} while their RSS did not: they were not allocating, they were copying pages shared with the trainer since the fork. Reading a Python object writes its reference count, so every page of a Python list, dict or DataFrame of objects a worker reads becomes its own copy (pytorch/pytorch#13246). {how_far}{again} To share instead of copy, hold the data as numpy arrays (or tensors) rather than Python lists or object columns, or in shared storage (a memory-mapped file, torch tensors' shared memory); or run fewer workers, which lowers the cost in proportion.",
            HumanBytes(growth as u64),
            time_text(seconds.max(1.0)),
        ),
        numbers: vec![
            Cited::count("cow_workers", "workers copying", cow.len() as u64),
            Cited::count("workers", "workers observed", observed as u64),
            Cited::count("worker_generations", "sets of workers started", gens as u64),
            Cited::bytes(
                "per_worker_growth_bytes",
                "private growth per worker after its first reading",
                growth as u64,
            ),
            level_number,
            Cited::bytes(
                "per_worker_private_peak_bytes",
                "per-worker private peak",
                peak,
            ),
            Cited::seconds("settle_seconds", "time copying", seconds),
            Cited::seconds(
                "first_read_seconds",
                "run time of a worker's first reading (median)",
                lower_median(cow.iter().map(|c| c.first_read).collect()),
            ),
        ],
    }
}

fn worker_load(loads: &[(&ProcSummary, f64, f64, f64)], observed: usize) -> Finding {
    let growth = lower_median(loads.iter().map(|c| c.1).collect());
    let level = lower_median(loads.iter().map(|c| c.3).collect());
    let names = name_workers(&loads.iter().map(|c| c.0).collect::<Vec<_>>());
    Finding {
        kind: "worker_load",
        severity: Severity::Info,
        title: format!(
            "Each DataLoader worker allocated +{} once, then stayed at {}",
            HumanBytes(growth as u64),
            HumanBytes(level as u64)
        ),
        advice: format!(
            "The private memory of {names} rose by about {} and stopped: something each worker builds once (a cache filled in the first epoch, a decoder, its own copy of a file), not a leak. It is paid once per worker, so the number of workers decides whether it fits.",
            HumanBytes(growth as u64)
        ),
        numbers: vec![
            Cited::count("workers", "workers observed", observed as u64),
            Cited::bytes(
                "per_worker_growth_bytes",
                "private growth per worker",
                growth as u64,
            ),
            Cited::bytes(
                "per_worker_settled_bytes",
                "private level per worker once settled",
                level as u64,
            ),
        ],
    }
}

/// `workers 4110, 4111 (attempt 1) and 4210 (attempt 2), all
/// pt_data_worker`, capped so the sentence stays readable with 32 workers.
fn name_workers(ws: &[&ProcSummary]) -> String {
    let mut by: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for w in ws {
        by.entry(w.attempt).or_default().push(w.pid);
    }
    let several = by.len() > 1;
    let groups: Vec<String> = by
        .into_iter()
        .map(|(a, mut pids)| {
            pids.sort_unstable();
            let n = pids.len();
            let mut names: Vec<String> = pids.iter().take(8).map(u32::to_string).collect();
            if n > 8 {
                names.push(format!("{} more", n - 8));
            }
            let list = and_list(&names);
            if several {
                format!("{list} (attempt {a})")
            } else {
                list
            }
        })
        .collect();
    let plural = if ws.len() == 1 { "worker" } else { "workers" };
    let mut comms: Vec<&str> = ws.iter().map(|w| w.comm.as_str()).collect();
    comms.sort_unstable();
    comms.dedup();
    let comm = match comms.as_slice() {
        [one] if ws.len() > 1 => format!(", all {one},"),
        [one] => format!(" ({one})"),
        _ => String::new(),
    };
    let joined = if several {
        groups.join("; ")
    } else {
        groups.concat()
    };
    format!("{plural} {joined}{comm}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::report::{diagnose, load};

    const ENV: &str = r#""schema":"oomguard/1","ts":"2026-01-01T00:00:00.000Z""#;

    /// A trainer and three workers listed every second; each worker's USS
    /// at second `s` is `uss(s)` MiB and its RSS `rss(s)` MiB.
    fn log(seconds: u32, uss: impl Fn(u32) -> u64, rss: impl Fn(u32) -> u64) -> String {
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python","train.py"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            4096 * MIB
        )];
        for s in 1..=seconds {
            let mut procs = vec![format!(
                r#"{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":{},"pss_bytes":{},"uss_bytes":{}}}"#,
                700 * MIB,
                500 * MIB,
                400 * MIB
            )];
            for i in 0..3 {
                procs.push(format!(
                    r#"{{"pid":{},"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":{},"pss_bytes":{},"uss_bytes":{}}}"#,
                    101 + i,
                    rss(s) * MIB,
                    (uss(s) + 100) * MIB,
                    uss(s) * MIB
                ));
            }
            let fp = (400 + 300 + 3 * uss(s)) * MIB;
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{s},"attempt":1,"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"procs":4,"pss_bytes":{fp},"rss_bytes":{},"footprint_bytes":{fp},"pss_age_seconds":0.2}},"procs":[{}]}}"#,
                4096 * MIB - fp,
                4096 * MIB,
                700 * MIB + 3 * rss(s) * MIB,
                procs.join(",")
            ));
        }
        lines.join("\n")
    }

    fn kinds(f: &[Finding]) -> Vec<&'static str> {
        f.iter().map(|f| f.kind).collect()
    }

    #[test]
    fn copying_that_levels_off_is_copy_on_write_not_a_leak() {
        // 10 → 100 MiB in 6 s at a constant RSS, then level.
        let f = diagnose(&load(&log(14, |s| 10 + 15 * s.min(6) as u64, |_| 400)).unwrap());
        let k = kinds(&f);
        assert!(k.contains(&"worker_cow"), "{k:?}");
        assert!(!k.contains(&"worker_leak"), "{k:?}");
        let cow = f.iter().find(|f| f.kind == "worker_cow").unwrap();
        let n = |name: &str| cow.numbers.iter().find(|n| n.name == name).unwrap().value;
        assert_eq!(n("per_worker_settled_bytes"), (100 * MIB) as f64);
        assert_eq!(n("per_worker_growth_bytes"), (75 * MIB) as f64);
        assert!(cow.title.contains("settling at 100 MiB"), "{}", cow.title);
        assert!(!cow.advice.contains("postpones"), "{}", cow.advice);
        // The worker count is sized on the settled level.
        let fit = f.iter().find(|f| f.kind == "num_workers").unwrap();
        assert!(fit.advice.contains("Assumed"), "{}", fit.advice);
    }

    /// Two sets of two workers (`persistent_workers=False`), each alive
    /// for 8 s and copying 10 → 50 MiB over its first 5 s, last listed 3 s
    /// into its life: the rest of its copying shows only in the footprint.
    fn reforked_log() -> String {
        sets_log(8, 50, 3)
    }

    /// Two sets of two workers alive 8 s each, copying `rate` MiB/s from
    /// 10 MiB up to `cap`, listed until `listed` s into their lives.
    fn sets_log(rate: u64, cap: u64, listed: u64) -> String {
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python","train.py"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            4096 * MIB
        )];
        for s in 1..=22u64 {
            let set = [(1u64, 101u32), (12, 111)]
                .into_iter()
                .find(|&(start, _)| (start..start + 8).contains(&s));
            let age = set.map(|(start, _)| s - start);
            let uss = age.map_or(0, |a| (10 + rate * a).min(cap));
            let trainer = format!(
                r#"{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":{},"pss_bytes":{},"uss_bytes":{}}}"#,
                700 * MIB,
                500 * MIB,
                400 * MIB
            );
            let mut procs = vec![trainer];
            if let (Some((_, pid)), Some(a)) = (set, age) {
                for i in 0..2 {
                    procs.push(format!(
                        r#"{{"pid":{},"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":{},"pss_bytes":{},"uss_bytes":{}}}"#,
                        pid + i,
                        400 * MIB,
                        (uss + 100) * MIB,
                        uss * MIB
                    ));
                }
                if a > listed {
                    procs.clear();
                }
            }
            let n = if set.is_some() { 3 } else { 1 };
            let rss = 700 * MIB + (n - 1) * 400 * MIB;
            let fp = (700 + 2 * uss) * MIB;
            let list = if procs.is_empty() {
                String::new()
            } else {
                format!(r#","procs":[{}]"#, procs.join(","))
            };
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{s},"attempt":1,"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"procs":{n},"pss_bytes":{fp},"rss_bytes":{rss},"footprint_bytes":{fp},"pss_age_seconds":0.0}}{list}}}"#,
                4096 * MIB - fp,
                4096 * MIB,
            ));
        }
        lines.join("\n")
    }

    #[test]
    fn each_set_of_reforked_workers_is_charged_its_own_copying() {
        let f = diagnose(&load(&reforked_log()).unwrap());
        let cow = f
            .iter()
            .find(|f| f.kind == "worker_cow")
            .unwrap_or_else(|| panic!("{:?}", kinds(&f)));
        let n = |name: &str| cow.numbers.iter().find(|n| n.name == name).map(|n| n.value);
        assert_eq!(n("worker_generations"), Some(2.0));
        // 34 MiB at the last list; 16 MiB more per worker after it, in the
        // footprint the set's two workers grew by 32 MiB. Shared among the
        // four workers of both sets it was 42 MiB.
        let level = n("per_worker_settled_bytes").unwrap_or_else(|| panic!("{}", cow.title));
        assert_eq!(level, (50 * MIB) as f64, "{}", cow.title);
        assert_eq!(n("per_worker_private_peak_bytes"), Some((50 * MIB) as f64));
    }

    #[test]
    fn copying_the_readings_caught_only_the_start_of_is_still_copying() {
        // Read at 10 and 14 MiB (too little a rise to call on its own),
        // then 24 MiB more each in the footprint before they exit.
        let f = diagnose(&load(&sets_log(4, 50, 1)).unwrap());
        let k = kinds(&f);
        assert!(k.contains(&"worker_cow"), "{k:?}");
        assert!(!k.contains(&"worker_flat"), "{k:?}");
        // The same readings with nothing copied after them: flat.
        let f = diagnose(&load(&sets_log(4, 14, 1)).unwrap());
        let k = kinds(&f);
        assert!(k.contains(&"worker_flat"), "{k:?}");
        assert!(!k.contains(&"worker_cow"), "{k:?}");
    }

    #[test]
    fn growth_that_allocates_and_continues_is_a_leak() {
        let f = diagnose(&load(&log(14, |s| 10 + 10 * s as u64, |s| 400 + 10 * s as u64)).unwrap());
        let k = kinds(&f);
        assert!(k.contains(&"worker_leak"), "{k:?}");
        assert!(!k.contains(&"worker_cow"), "{k:?}");
    }
}
