//! The trainer's growth findings: still growing at the end and allocating
//! (`trainer_growth`, a leak), rose, held and gave it back
//! (`trainer_accumulation`, outputs kept over a loop), or rose and stayed
//! (`trainer_load`). The trainer is judged on its per-process readings and,
//! with one trainer in its attempt, on its figures on every sample line.

use super::finding::{Cited, EARLY_SECONDS, Finding, ProcSummary, Severity, rate_text, time_text};
use super::run_log::{RunLog, SamplePoint};
use super::workers::{Growth, RISE_MIN_BYTES, Reading, growth_of, readings};
use crate::sinks::log::ActionKind;
use crate::sinks::log::Event as Logged;
use crate::vocab::growth;
use crate::vocab::model::{ETA_WINDOW_SECONDS, Role};
use crate::vocab::units::HumanBytes;

const MIB: u64 = 1 << 20;

/// Share of the trainer's peak RSS that it must gather and give back to
/// be called an accumulation.
const ACCUMULATION_SHARE: f64 = 0.2;

/// The trainer findings: a leak, outputs accumulated and released, or a
/// load.
pub(super) fn trainer_growth(log: &RunLog, procs: &[ProcSummary], out: &mut Vec<Finding>) {
    let series = readings(log);
    for p in procs.iter().filter(|p| p.role == Role::Trainer) {
        let Some(pts) = series.get(&(p.attempt, p.pid)) else {
            continue;
        };
        // The lists are seconds apart: growth that ended between the last
        // two still spans their tail, and growth after the last is not in
        // them. With one trainer in its attempt, the trainer's figures on
        // every sample line (they follow RSS between readings) answer the
        // policy's question at the policy's cadence. Another trainer listed
        // once is no rank beside it: a `python3` started through a pyenv
        // shim lists a `pyenv-hooks` trainer of 0 MiB at start-up, and its
        // leak was judged on its lists alone.
        let sole = !procs.iter().any(|q| {
            q.attempt == p.attempt && q.role == Role::Trainer && q.pid != p.pid && q.snapshots > 1
        });
        // oomguard's first hand on the job, where the trainer was read after
        // it: the figures below stop there, and the finding says so.
        let acted = acted_at(log, p.attempt).filter(|a| sole && a.0 < p.last_t);
        let (role, judged, rss) = if sole {
            // Its PSS to its last reading, for the rate it states (over
            // the window of its readings); for its shape, every sample to
            // the one before its last (a leak's last list 2 s before its
            // end left the start-up in the trend's window, and it read as
            // a load; its last sample can catch its exit tearing its memory
            // down, or its workers' exit: where its last list was on that
            // sample, its RSS 14 MiB up on a level held for 11 s read as
            // still growing, and its load went unnamed). Beside workers,
            // its PSS falls as they are read and rises as they exit and
            // hand their shares back, with no byte allocated (a trainer
            // re-forking its workers each epoch read as still growing at
            // the end, and its load went unnamed): its RSS moves only with
            // what it maps.
            // Neither past oomguard's first hand on the job: a trainer
            // saving after a stop is level for seconds, and a leak stopped
            // at its budget read as a load.
            let acted = acted.map_or(f64::INFINITY, |a| a.0);
            let until = (log.samples.iter())
                .filter(|s| s.attempt == p.attempt)
                .filter(|s| s.role_pss.iter().any(|r| r.0 == Role::Trainer))
                .rev()
                .nth(1)
                .map_or(p.last_t, |s| s.t)
                .min(acted);
            let of: fn(&SamplePoint) -> &[(Role, u64)] = if with_workers(log, p.attempt) {
                |s| &s.role_rss
            } else {
                |s| &s.role_pss
            };
            (
                role_series(log, p.attempt, p.last_t.min(acted), |s| &s.role_pss),
                role_series(log, p.attempt, until, of),
                role_series(log, p.attempt, until, |s| &s.role_rss),
            )
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
        let growth = judge(growth_of(pts), pts, p, &role, &judged);
        // Whether it gave memory back is a matter of RSS, which every
        // sample line carries: a release read by the trainer's last list
        // was held for 5 s on the samples after it, and read as a load.
        let mut seen = pts.clone();
        let last = pts.last().map_or(0.0, |r| r.t);
        seen.extend(
            rss.iter()
                .filter(|&&(t, _)| t > last)
                .map(|&(t, b)| Reading {
                    t,
                    read_t: t,
                    uss: b,
                    rss: b,
                    rss_peak: b,
                }),
        );
        match growth {
            Growth::Continuing { rate, .. } if p.leaks() && allocating(pts) => {
                // Only the sample lines' series stops at oomguard's action.
                let (shown, cut) = if role.len() >= growth::TAIL {
                    (shown_rate(&role, rate), acted)
                } else {
                    let lists: Vec<(f64, f64)> = pts.iter().map(|r| (r.t, r.uss)).collect();
                    (shown_rate(&lists, rate), None)
                };
                out.extend(shown.map(|shown| trainer_leak(p, shown, cut)));
            }
            Growth::Ramp { bytes, seconds, .. } => match released(&seen) {
                Some((held, freed)) => out.push(trainer_accumulation(p, held, freed)),
                None if p.rose() => out.push(trainer_load(log, p, pts, bytes, seconds)),
                None => {}
            },
            _ => {}
        }
    }
}

/// When oomguard first paused, stopped, checkpointed, restarted or killed
/// the job in `attempt`, and which.
fn acted_at(log: &RunLog, attempt: u32) -> Option<(f64, ActionKind)> {
    (log.events.iter())
        .filter(|e| e.attempt == attempt)
        .find_map(|e| match &e.event {
            Logged::Action(a)
                if matches!(
                    a.action,
                    ActionKind::Checkpoint
                        | ActionKind::Pause
                        | ActionKind::Restart
                        | ActionKind::Stop
                        | ActionKind::Kill
                ) =>
            {
                Some((e.t, a.action))
            }
            _ => None,
        })
}

/// The trainer role's figure (`of`) on each sample line of `attempt` up to
/// `until`.
fn role_series(
    log: &RunLog,
    attempt: u32,
    until: f64,
    of: fn(&SamplePoint) -> &[(Role, u64)],
) -> Vec<(f64, f64)> {
    (log.samples.iter())
        .filter(|s| s.attempt == attempt && s.t <= until)
        .filter_map(|s| {
            let b = of(s).iter().find(|r| r.0 == Role::Trainer)?.1;
            Some((s.t, b as f64))
        })
        .collect()
}

/// The trainer's growth from its readings (`growth` of `pts`), judged again
/// on the sample series `judged` where there is one: growth the readings
/// call continuing may have stopped, and growth they call a load may have
/// gone on after the last of them. `role` (its PSS) gives the rate.
fn judge(
    growth: Growth,
    pts: &[Reading],
    p: &ProcSummary,
    role: &[(f64, f64)],
    judged: &[(f64, f64)],
) -> Growth {
    let continuing = matches!(growth, Growth::Continuing { .. });
    if judged.len() < growth::TAIL || !(continuing || matches!(growth, Growth::Ramp { .. })) {
        return growth;
    }
    let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
        return growth;
    };
    match growth::shape(judged, ETA_WINDOW_SECONDS) {
        growth::Shape::Growing { rate } => {
            // The rate stated is its PSS's, as the policy's.
            let rate = match growth::shape(role, ETA_WINDOW_SECONDS) {
                growth::Shape::Growing { rate } => rate,
                _ => rate,
            };
            Growth::Continuing {
                rate,
                bytes: last.uss - first.uss,
                rss_rise: last.rss - first.rss,
                rss: last.rss,
            }
        }
        growth::Shape::Ramp { bytes, seconds } if continuing => {
            // The size in its own private memory, as the finding's other
            // figures: the series judged (its RSS beside workers, else its
            // PSS) also counts pages it shares with its workers (its PSS
            // stated loads +10–17 % over the truth in the worker cases).
            let own = p.peak_uss_bytes.saturating_sub(p.first_uss_bytes) as f64;
            Growth::Ramp {
                bytes: if own >= RISE_MIN_BYTES { own } else { bytes },
                seconds,
                level: last.uss,
                rss_rise: 0.0,
            }
        }
        growth::Shape::Flat if continuing => Growth::Flat,
        _ => growth,
    }
}

/// Whether any list of `attempt` holds a DataLoader worker.
fn with_workers(log: &RunLog, attempt: u32) -> bool {
    (log.snapshots.iter())
        .filter(|s| s.attempt == attempt)
        .any(|s| s.procs.iter().any(|q| q.role == Role::Worker))
}

/// Whether the growth of the last window was allocated: RSS rose, by
/// more than the noise floor and by at least half of what USS did. A
/// trainer's USS also rises, with no RSS change, when workers that shared
/// its pages exit (with `persistent_workers=False`, every epoch): its
/// pages are its own again, nothing was allocated. A window that began
/// before the workers' fork (its USS fell there, its RSS did not move)
/// and ends after they exited holds no allocation either, though USS
/// less RSS rose at its end.
fn allocating(pts: &[Reading]) -> bool {
    let Some(last) = pts.last() else {
        return false;
    };
    let Some(first) = pts.iter().find(|r| last.t - r.t <= ETA_WINDOW_SECONDS) else {
        return false;
    };
    let rss_rise = last.rss - first.rss;
    rss_rise > growth::FLOOR_BYTES && rss_rise >= (last.uss - first.uss) / 2.0
}

/// Whether the trainer gave back most of what it gathered: `(rise, freed)`
/// when its RSS fell from its peak by at least half of what it gained
/// since it was last as low as it ended (and by [`RISE_MIN_BYTES`]). RSS,
/// not USS: a trainer's USS also falls when it forks workers (its pages
/// become shared), which frees nothing. Counting from where it was last
/// that low leaves out a start-up load before a plateau.
///
/// The RSS, not the USS, and the trainer's own: evaluation outputs are
/// plain allocations, and all of them show in RSS.
fn released(pts: &[Reading]) -> Option<(f64, f64)> {
    // The peak a tick saw, also between two lists: a list after the peak
    // carries it, and its own RSS is already the level after it.
    let (i_peak, peak) = pts
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.rss_peak.total_cmp(&b.1.rss_peak))
        .map(|(i, r)| (i, r.rss_peak))?;
    let first_after = if pts[i_peak].rss_peak > pts[i_peak].rss {
        i_peak
    } else {
        i_peak + 1
    };
    // The level it fell to: the lowest after the peak (a last reading
    // taken while Python tears down may sit above it).
    let after = &pts[first_after..];
    let end = after.iter().map(|r| r.rss).fold(f64::INFINITY, f64::min);
    let freed = peak - end;
    let low = end + RISE_MIN_BYTES.max(0.1 * freed);
    // Held at that level for two readings: a process that frees its
    // memory only as it exits (Python tearing down its globals) released
    // nothing while it ran.
    if after.iter().filter(|r| r.rss <= low).count() < 2 {
        return None;
    }
    let base = pts[..i_peak].iter().rev().find(|r| r.rss <= low)?.rss;
    let rise = peak - base;
    // Smaller swings are the DataLoader's own buffers, freed with its
    // iterator at the end of each epoch.
    let worth = RISE_MIN_BYTES.max(ACCUMULATION_SHARE * peak);
    (rise >= worth && freed >= worth && freed >= rise / 2.0).then_some((rise, freed))
}

/// The rate a growing trainer is reported with, `(bytes/s, seconds)`: the
/// figure the dashboard showed for it at the end (`growth::newest_figure`:
/// its newest minute, a reading a second), over the seconds that figure
/// spans; where those readings are too few to say (a leak stopped seconds
/// after it began), `trend`, the least-squares rate of its last
/// [`ETA_WINDOW_SECONDS`] that found it growing. `None` where they say it
/// is flat: allocator noise on a plateau lined up in the last seconds
/// ("+4.4 MiB/s over its last 9.2s, still growing" on `load_plateau`, in 2
/// of 7 runs) is no leak.
fn shown_rate(series: &[(f64, f64)], trend: f64) -> Option<(f64, f64)> {
    let (figure, span) = growth::newest_figure(series, 0.0);
    match figure {
        growth::Figure::Rate(r) if r > 0.0 => return Some((r, span)),
        growth::Figure::Unknown => {}
        growth::Figure::Rate(_) | growth::Figure::Flat => return None,
    }
    let last = series.last().map_or(0.0, |p| p.0);
    let first = (series.iter())
        .find(|p| last - p.0 <= ETA_WINDOW_SECONDS)
        .map_or(last, |p| p.0);
    Some((trend, last - first))
}

/// The leak finding, its rate over the `seconds` up to the trainer's end,
/// or up to oomguard's first action where it was read after that (`acted`):
/// a window that ends before the trainer did is named as such, so that
/// nobody reads the rate against its last seconds (a leak's pace halved
/// in the 2 s between a checkpoint and the stop, beside other work).
fn trainer_leak(
    p: &ProcSummary,
    (rate, seconds): (f64, f64),
    acted: Option<(f64, ActionKind)>,
) -> Finding {
    let (window, then) = match acted {
        Some((t, action)) => (
            format!(
                "the {} before oomguard's {action} at {}",
                time_text(seconds),
                time_text(t)
            ),
            "then",
        ),
        None => (format!("its last {}", time_text(seconds)), "at the end"),
    };
    Finding {
        kind: "trainer_growth",
        severity: Severity::Warning,
        title: format!(
            "The trainer ({} {}) grew +{} over {window} and was still growing {then}",
            p.pid,
            p.comm,
            rate_text(rate),
        ),
        advice: format!(
            "The training process's private memory went from {} to {} and did not level off: something accumulates across steps. Usually losses or outputs kept with their autograd graph (use loss.item() / detach()), a growing list of metrics, or a cache in the model code.",
            HumanBytes(p.first_uss_bytes),
            HumanBytes(p.peak_uss_bytes)
        ),
        numbers: vec![
            Cited::count("pid", "trainer pid", u64::from(p.pid)),
            Cited::rate("growth_bytes_per_second", "growth", rate),
            Cited::seconds("growth_window_seconds", "over", seconds),
            Cited::bytes("peak_private_bytes", "private peak", p.peak_uss_bytes),
        ]
        .into_iter()
        .chain(
            acted.map(|(t, _)| Cited::seconds("growth_window_end_seconds", "window ending at", t)),
        )
        .collect(),
    }
}

fn trainer_accumulation(p: &ProcSummary, held: f64, freed: f64) -> Finding {
    Finding {
        kind: "trainer_accumulation",
        severity: Severity::Info,
        title: format!(
            "The trainer ({} {}) accumulated {} over a loop and released it at the end",
            p.pid,
            p.comm,
            HumanBytes(held as u64)
        ),
        advice: format!(
            "Its memory grew by {} and then gave {} back: outputs kept until the end of a loop, typically evaluation predictions gathered for the metrics (the Hugging Face Trainer keeps every prediction until evaluation ends, transformers#7158). Not a leak, but the peak grows with the size of the evaluation set: move outputs to the CPU in chunks (eval_accumulation_steps), compute metrics batch by batch, or keep only what the metric needs.",
            HumanBytes(held as u64),
            HumanBytes(freed as u64)
        ),
        numbers: vec![
            Cited::count("pid", "trainer pid", u64::from(p.pid)),
            Cited::bytes("accumulated_bytes", "accumulated", held as u64),
            Cited::bytes("released_bytes", "released", freed as u64),
            Cited::bytes("peak_private_bytes", "private peak", p.peak_uss_bytes),
        ],
    }
}

/// A trainer whose memory rose and then stayed: a load, not a leak. "At
/// start-up" only when the rise was over within the start-up window: one
/// that went on while the job trained is named by when it ran (from its
/// last reading still near the first level), and not called a one-off
/// read.
fn trainer_load(
    log: &RunLog,
    p: &ProcSummary,
    pts: &[Reading],
    bytes: f64,
    seconds: f64,
) -> Finding {
    let to = p.first_t + seconds;
    // The start-up of its own attempt: a restarted job loads again.
    let began = log.attempt(p.attempt).map_or(0.0, |a| a.start_t);
    let (title, advice) = if to - began <= EARLY_SECONDS {
        (
            format!(
                "The trainer ({} {}) loaded {} in {:.0} s at start-up, then stayed level",
                p.pid,
                p.comm,
                HumanBytes(bytes as u64),
                seconds.max(1.0)
            ),
            format!(
                "Its private memory rose from {} to {} and then stopped growing: a data set, a checkpoint or a cache read in once, not a leak. It is part of the job's fixed cost; if it is too large, load it lazily, memory-map it, or keep it as numpy arrays shared with the workers.",
                HumanBytes(p.first_uss_bytes),
                HumanBytes(p.peak_uss_bytes)
            ),
        )
    } else {
        // Readings wander by a few MiB at a level.
        let near_first = p.first_uss_bytes as f64 + (0.05 * bytes).min(8.0 * MIB as f64);
        let from = pts
            .iter()
            .rev()
            .find(|r| r.t <= to && r.uss < near_first)
            .map(|r| r.t)
            .unwrap_or(p.first_t);
        (
            format!(
                "The trainer ({} {}) gained {} between {} and {}, then stayed level",
                p.pid,
                p.comm,
                HumanBytes(bytes as u64),
                time_text(from),
                time_text(to)
            ),
            format!(
                "Its private memory rose from {} to {} while the job ran, then stayed level for the last {} of its readings: a cache or pool that filled to its size (a dataset or tokenizer cache, the pinned-memory pool), or growth that stopped. It is part of the job's peak; a longer run that grows again is a leak.",
                HumanBytes(p.first_uss_bytes),
                HumanBytes(p.peak_uss_bytes),
                time_text(p.last_t - to)
            ),
        )
    };
    Finding {
        kind: "trainer_load",
        severity: Severity::Info,
        title,
        advice,
        numbers: vec![
            Cited::count("pid", "trainer pid", u64::from(p.pid)),
            Cited::bytes("loaded_bytes", "loaded", bytes as u64),
            Cited::bytes("peak_private_bytes", "private peak", p.peak_uss_bytes),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_at_exit_is_not_an_accumulation() {
        let pts: Vec<Reading> = [(1.0, 10.0), (2.0, 700.0), (3.0, 700.0), (4.0, 300.0)]
            .iter()
            .map(|&(t, m)| Reading {
                t,
                read_t: t,
                uss: m * MIB as f64,
                rss: m * MIB as f64,
                rss_peak: m * MIB as f64,
            })
            .collect();
        assert_eq!(released(&pts), None);
        let mut held = pts.clone();
        held.push(Reading {
            t: 5.0,
            read_t: 5.0,
            uss: 300.0 * MIB as f64,
            rss: 300.0 * MIB as f64,
            rss_peak: 300.0 * MIB as f64,
        });
        assert!(released(&held).is_some(), "given back while it ran");
        // 300 → 700 over a loop, back to 300, held.
        let eval: Vec<Reading> = [300.0, 300.0, 500.0, 700.0, 300.0, 300.0]
            .iter()
            .enumerate()
            .map(|(i, &m)| Reading {
                t: i as f64,
                read_t: i as f64,
                uss: m * MIB as f64,
                rss: m * MIB as f64,
                rss_peak: m * MIB as f64,
            })
            .collect();
        let mib = MIB as f64;
        assert_eq!(released(&eval), Some((400.0 * mib, 400.0 * mib)));
        // The lists missed the top (900 between the lists at 700 and at
        // 300): the list after it carries the peak a tick saw.
        let mut missed = eval.clone();
        missed[4].rss_peak = 900.0 * mib;
        assert_eq!(released(&missed), Some((600.0 * mib, 600.0 * mib)));
    }
}
