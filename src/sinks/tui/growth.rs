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
//! decrease, a worker that exits takes its private pages with it. The
//! sampler reads a family in one burst (see `probe::pss`), so a sum never
//! mixes readings from before and after a fork. A process without children
//! is its own family. The table marks a family figure with `Σ`.

use std::collections::{HashMap, VecDeque};

use crate::vocab::model::{Sample, least_squares_slope};

/// Seconds of history a process needs before it shows a growth rate.
const MIN_GROWTH_SPAN_SECONDS: f64 = 5.0;
/// Seconds of per-process history behind the growth column.
const GROWTH_WINDOW_SECONDS: f64 = 60.0;

/// Per-process family PSS over the last minute.
#[derive(Debug, Clone, Default)]
pub(crate) struct Growth {
    /// (pid, start time) -> (t, family PSS) oldest first.
    series: HashMap<(u32, u64), VecDeque<(f64, u64)>>,
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
        let family = family_pss(sample);
        // A PSS of 0 is one not read yet (a process newer than the last
        // sweep), not a size: a rate from it would be the whole process.
        // A child not read yet counts 0 in its parent's family, which is
        // right: its shared pages are still in the parent's reading.
        for (p, &sum) in sample.procs.iter().zip(&family) {
            if p.pss_bytes == 0 {
                continue;
            }
            let s = self.series.entry((p.pid, p.start_time)).or_default();
            if s.back().is_some_and(|&(last, _)| t < last) {
                s.clear();
            }
            s.push_back((t, sum));
            while s
                .front()
                .is_some_and(|&(old, _)| t - old > GROWTH_WINDOW_SECONDS)
                && s.len() > 2
            {
                s.pop_front();
            }
        }
    }

    /// Bytes per minute, `None` with too little history: a few seconds
    /// of a process's start-up (loading a model) are not a trend.
    pub(crate) fn per_minute(&self, pid: u32, start: u64) -> Option<f64> {
        let s = self.series.get(&(pid, start))?;
        let span = match (s.front(), s.back()) {
            (Some(&(first, _)), Some(&(last, _))) => last - first,
            _ => 0.0,
        };
        if s.len() < 2 || span < MIN_GROWTH_SPAN_SECONDS {
            return None;
        }
        least_squares_slope(s.iter().map(|&(t, b)| (t, b as f64))).map(|v| v * 60.0)
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
    /// and a worker at 20 s.
    fn fork_run(fork: f64, own: u64) -> [Option<f64>; 3] {
        let shared = 2048 * MIB;
        let mut g = Growth::default();
        for i in 0..=20 {
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
        [
            g.per_minute(1, 1),
            g.per_minute(10, 10),
            g.per_minute(20, 20),
        ]
    }

    #[test]
    fn pss_handed_to_forked_children_is_not_a_decrease() {
        // Nothing allocated: the fork moved 1.6 GiB of PSS from the trainer
        // to its workers, plus 64 MiB the workers own.
        let [launcher, trainer, worker] = fork_run(10.0, 0);
        let trainer = trainer.unwrap();
        // A step of 64 MiB (the workers' own pages) halfway through a 20 s
        // window: its least-squares slope, not the -1.6 GiB the trainer's
        // own PSS dropped by.
        assert!(trainer > 0.0 && trainer < 300.0 * MIB as f64, "{trainer}");
        assert!((launcher.unwrap() - trainer).abs() < 1.0);
        // The workers' own PSS stood still since they were forked.
        assert!(worker.unwrap().abs() < 1.0);
    }

    #[test]
    fn family_growth_adds_up_what_the_family_allocates() {
        let [_, trainer, worker] = fork_run(0.0, MIB);
        let trainer = trainer.unwrap() / MIB as f64;
        let worker = worker.unwrap() / MIB as f64;
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
        let trainer = g.per_minute(10, 10).unwrap() / MIB as f64;
        assert!((trainer + 600.0).abs() < 1e-6, "{trainer}");
    }

    #[test]
    fn a_worker_that_exits_frees_its_private_pages() {
        let mut g = Growth::default();
        for i in 0..=20 {
            let t = f64::from(i);
            let mut procs = vec![proc(10, 1, 1024 * MIB)];
            if i < 10 {
                procs.push(proc(20, 10, 512 * MIB));
            }
            g.push(&sample(t, procs));
        }
        assert!(g.per_minute(10, 10).unwrap() < -512.0 * MIB as f64);
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
