//! The process table's growth column: how fast a process's memory grows,
//! in bytes per minute.
//!
//! A process with children shows its *family's* growth: the least-squares
//! slope of the PSS of the process and all its descendants, summed. A
//! process's own PSS is the wrong figure there: when a trainer forks its
//! DataLoader workers, the pages they share copy-on-write are split among
//! the sharers, so the trainer's PSS drops by what the workers' rises and
//! nothing was freed; when a worker exits, its share comes back. Summed
//! over the family, those moves cancel, and what is left is what the
//! family allocated or freed: a trainer releasing memory still shows as a
//! decrease, a worker that exits takes its private pages with it (a
//! one-off drop, so no rate: the family reads flat, not growing). The
//! sampler reads a family in one burst (see `probe::pss`), so a sum never
//! mixes readings from before and after a fork. A process without children
//! is its own family. The table marks a family figure with `Σ`.
//!
//! The figure itself is [`growth::figure`]'s, the one every growth figure
//! goes through: "…" until a minute's readings can say, "flat" where they
//! are not sure of a direction or growth stopped (a load at start-up), a
//! rate only where they are.

use std::collections::{HashMap, VecDeque};

use crate::vocab::growth::{self, Figure};
use crate::vocab::model::Sample;

/// Seconds of history a process needs before it shows a growth rate.
const MIN_GROWTH_SPAN_SECONDS: f64 = 5.0;

/// Per-process family PSS over the last minute.
#[derive(Debug, Clone, Default)]
pub(crate) struct Growth {
    /// (pid, start time) -> (t, family PSS) oldest first, as
    /// `growth::keep_for_figure` keeps it.
    series: HashMap<(u32, u64), VecDeque<(f64, f64)>>,
    /// Each series' figure, made when a reading was added to it (not at
    /// each frame drawn).
    figures: HashMap<(u32, u64), Figure>,
}

impl Growth {
    pub(crate) fn push(&mut self, sample: &Sample) {
        let t = sample.t;
        self.series.retain(|&(pid, start), _| {
            sample
                .procs
                .iter()
                .any(|p| p.pid == pid && p.start_time == start)
        });
        self.figures.retain(|key, _| self.series.contains_key(key));
        let family = family_pss(sample);
        // A PSS of 0 is one not read yet (a process newer than the last
        // sweep), not a size: a rate from it would be the whole process.
        // A child not read yet counts 0 in its parent's family, which is
        // right: its shared pages are still in the parent's reading.
        for (p, &sum) in sample.procs.iter().zip(&family) {
            if p.pss_bytes == 0 {
                continue;
            }
            let key = (p.pid, p.start_time);
            let s = self.series.entry(key).or_default();
            let replace = growth::keep_for_figure(s, t, sum as f64);
            if !replace || !self.figures.contains_key(&key) {
                let points: Vec<(f64, f64)> = s.iter().copied().collect();
                let figure = growth::figure(&points, MIN_GROWTH_SPAN_SECONDS);
                self.figures.insert(key, figure);
            }
        }
    }

    /// The family's growth (a rate in bytes/s): unknown with too little
    /// history, since a few seconds of a process's start-up (loading a
    /// model) are not a trend.
    pub(crate) fn figure(&self, pid: u32, start: u64) -> Figure {
        self.figures
            .get(&(pid, start))
            .copied()
            .unwrap_or(Figure::Unknown)
    }
}

/// Whether the process at each index of `sample.procs` has a child in the
/// sample.
pub(crate) fn has_children(sample: &Sample) -> Vec<bool> {
    let index = pid_index(sample);
    let mut out = vec![false; sample.procs.len()];
    for p in &sample.procs {
        if let Some(&j) = index.get(&p.ppid)
            && p.ppid != p.pid
        {
            out[j] = true;
        }
    }
    out
}

fn pid_index(sample: &Sample) -> HashMap<u32, usize> {
    sample
        .procs
        .iter()
        .enumerate()
        .map(|(i, p)| (p.pid, i))
        .collect()
}

/// The PSS of each process plus its descendants', by index: each process
/// adds its PSS to every ancestor in the sample, once even where stale
/// data has a cycle of parents.
fn family_pss(sample: &Sample) -> Vec<u64> {
    let procs = &sample.procs;
    let index = pid_index(sample);
    let mut out: Vec<u64> = procs.iter().map(|p| p.pss_bytes).collect();
    // The walk that last reached each process: a walk that comes back to
    // one went round a cycle.
    let mut reached = vec![usize::MAX; procs.len()];
    for (i, p) in procs.iter().enumerate() {
        reached[i] = i;
        let mut cur = p;
        while let Some(&j) = index.get(&cur.ppid) {
            if reached[j] == i {
                break;
            }
            reached[j] = i;
            out[j] = out[j].saturating_add(p.pss_bytes);
            cur = &procs[j];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::fixtures::{bare_proc as proc, bare_sample as sample};

    const MIB: u64 = 1 << 20;

    /// A trainer (10) of 3 GiB, 2 GiB of it shared, under a launcher (1),
    /// forks 4 workers at `fork` s; every process allocates `own` bytes a
    /// second of its own. Returns the growth of the launcher, the trainer
    /// and a worker at 30 s.
    fn fork_run(fork: f64, own: u64) -> [Figure; 3] {
        let shared = 2048 * MIB;
        let mut g = Growth::default();
        for i in 0..=30 {
            let t = f64::from(i);
            let grown = i as u64 * own;
            let mut procs = vec![proc(1, 0, 4 * MIB)];
            if t < fork {
                procs.push(proc(10, 1, 1024 * MIB + shared + grown));
            } else {
                // Five sharers now: each counts a fifth of the shared pages.
                procs.push(proc(10, 1, 1024 * MIB + shared / 5 + grown));
                for w in 0..4 {
                    let since = (t - fork) as u64 * own;
                    procs.push(proc(20 + w, 10, 16 * MIB + shared / 5 + since));
                }
            }
            g.push(&sample(t, procs));
        }
        [g.figure(1, 1), g.figure(10, 10), g.figure(20, 20)]
    }

    #[test]
    fn pss_handed_to_forked_children_is_not_a_decrease() {
        // Nothing allocated: the fork moved 1.6 GiB of PSS from the trainer
        // to its workers, plus 64 MiB the workers own.
        let [launcher, trainer, worker] = fork_run(10.0, 0);
        // The family's one step of 64 MiB (the workers' own pages) stopped
        // at once: flat, not the -1.6 GiB the trainer's own PSS dropped by
        // nor a rate spread over the window.
        assert_eq!(trainer, Figure::Flat);
        assert_eq!(launcher, Figure::Flat);
        // The workers' own PSS stood still since they were forked.
        assert_eq!(worker, Figure::Flat);
    }

    #[test]
    fn family_growth_adds_up_what_the_family_allocates() {
        let per_minute = |f: Figure| match f {
            Figure::Rate(r) => r * 60.0 / MIB as f64,
            other => panic!("{other:?}"),
        };
        let [_, trainer, worker] = fork_run(0.0, MIB);
        let (trainer, worker) = (per_minute(trainer), per_minute(worker));
        // 60 MiB/min each, five processes.
        assert!((worker - 60.0).abs() < 1e-6, "{worker}");
        assert!((trainer - 300.0).abs() < 1e-6, "{trainer}");
    }

    #[test]
    fn a_trainer_freeing_memory_still_shows_a_decrease() {
        let mut g = Growth::default();
        for i in 0..=20 {
            let t = f64::from(i);
            let procs = vec![
                proc(10, 1, 4096 * MIB - i as u64 * 10 * MIB),
                proc(20, 10, 400 * MIB),
                proc(21, 10, 400 * MIB),
            ];
            g.push(&sample(t, procs));
        }
        assert_eq!(g.figure(10, 10), Figure::Rate(-10.0 * MIB as f64));
    }

    #[test]
    fn a_worker_that_exits_frees_its_private_pages() {
        // The trainer grows 1 MiB/s; its worker of 512 MiB exits at 10 s.
        let mut g = Growth::default();
        for i in 0..=40 {
            let t = f64::from(i);
            let mut procs = vec![proc(10, 1, 1024 * MIB + i as u64 * MIB)];
            if i < 10 {
                procs.push(proc(20, 10, 512 * MIB));
            }
            g.push(&sample(t, procs));
        }
        // The drop is the worker's pages going, once: neither a fall nor
        // a rise of the family, whose rate since is the trainer's own.
        assert_eq!(g.figure(10, 10), Figure::Rate(MIB as f64));
    }

    /// Ticks every 20 ms near a ceiling: the series keeps a reading a
    /// second, and the figure is the growth's.
    #[test]
    fn fast_ticks_keep_a_reading_a_second() {
        let mut g = Growth::default();
        for i in 0..=2000u64 {
            let t = i as f64 * 0.02;
            g.push(&sample(t, vec![proc(10, 1, 1024 * MIB + i * MIB / 50)]));
        }
        assert!(
            g.series[&(10, 10)].len() <= 42,
            "{}",
            g.series[&(10, 10)].len()
        );
        let Figure::Rate(r) = g.figure(10, 10) else {
            panic!("{:?}", g.figure(10, 10));
        };
        assert!((r / MIB as f64 - 1.0).abs() < 0.01, "{r}");
    }

    #[test]
    fn cycles_and_children_are_found_without_looping() {
        let s = sample(
            0.0,
            vec![proc(1, 2, 10), proc(2, 1, 20), proc(3, 3, 5), proc(4, 1, 1)],
        );
        assert_eq!(has_children(&s), [true, true, false, false]);
        let f = family_pss(&s);
        assert_eq!(f[3], 1);
        assert_eq!(f[2], 5);
        assert_eq!(f[0], 10 + 20 + 1);
        assert_eq!(f[1], 20 + 10 + 1);
    }
}
