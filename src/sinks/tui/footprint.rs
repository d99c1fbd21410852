//! What the dashboard calls each memory figure. The policy compares the
//! tree's footprint (`tree.footprint_bytes`) with the ceilings: the working
//! set of the job's own cgroup where it has one, otherwise the PSS sum.
//! PSS, RSS and USS are breakdowns by process and are only ever shown
//! under their own names; a gauge names the figure it shows, so a working
//! set 300 MiB under the PSS sum is never read as a second PSS.

use crate::vocab::model::{CeilingSource, CeilingState, Sample};

/// Where the footprint comes from on a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The PSS sum of the tree (no cgroup of its own).
    Pss,
    /// The working set of the job's own cgroup (exact: page cache and
    /// `/dev/shm` included, which PSS does not see).
    WorkingSet,
}

impl Kind {
    /// How the dashboard says it, after "footprint".
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Pss => "PSS",
            Kind::WorkingSet => "working set",
        }
    }
}

/// The footprint of `sample` and where it comes from.
///
/// The sampler sets the footprint to the PSS sum unless the job has a
/// cgroup of its own, so a footprint other than the PSS sum is a working
/// set; an owned cgroup says so even when the two happen to agree. A
/// sample without a footprint (0: hand-built, or an old log) has its PSS.
pub(crate) fn of(sample: &Sample) -> (u64, Kind) {
    let t = &sample.tree;
    let owned = sample.cgroup.as_ref().is_some_and(|c| c.owned);
    if t.footprint_bytes == 0 && !owned {
        return (t.pss_bytes, Kind::Pss);
    }
    if owned || t.footprint_bytes != t.pss_bytes {
        (t.footprint_bytes, Kind::WorkingSet)
    } else {
        (t.footprint_bytes, Kind::Pss)
    }
}

/// Whether no process of the tree holds memory any more: none is left, or
/// every process left is being torn down (a zombie, or exiting with its
/// pages already unmapped). Its PSS and USS are then stale estimates and
/// its RSS 0, while the cgroup still holds what the kernel has not
/// uncharged yet: totals of such a tree would contradict the gauge.
pub(crate) fn tree_released(sample: &Sample) -> bool {
    if sample.procs.is_empty() {
        sample.tree.procs == 0
    } else {
        sample.procs.iter().all(|p| p.rss_bytes == 0)
    }
}

/// The name of what a ceiling's gauge counts as used: `footprint` where it
/// is the figure the policy holds against that ceiling for the job (a
/// budget; a cgroup limit on the job's own cgroup), the cgroup's `working
/// set` where the limit covers more than the job, the machine's `used`.
pub(crate) fn used_label(sample: &Sample, state: &CeilingState) -> &'static str {
    let (bytes, kind) = of(sample);
    match state.ceiling.source {
        CeilingSource::Budget if tree_released(sample) && kind == Kind::WorkingSet => "working set",
        CeilingSource::Budget => "footprint",
        CeilingSource::Cgroup => {
            let ws = sample
                .cgroup
                .as_ref()
                .is_some_and(|c| c.limit_working_set_bytes.is_some());
            if kind == Kind::WorkingSet && state.used_bytes == bytes && !tree_released(sample) {
                "footprint"
            } else if ws {
                "working set"
            } else {
                "usage"
            }
        }
        CeilingSource::System | CeilingSource::Shm => "used",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::fixtures::{self, Run};

    #[test]
    fn a_working_set_apart_from_the_pss_sum_is_named_so() {
        let s = fixtures::sample(&Run::default(), 100);
        let (bytes, kind) = of(&s);
        assert_eq!(kind, Kind::WorkingSet);
        assert_eq!(bytes, s.tree.footprint_bytes);
        let labels: Vec<&str> = s.ceilings().iter().map(|c| used_label(&s, c)).collect();
        assert_eq!(labels, ["footprint", "used"]);

        let mut pss = s.clone();
        pss.tree.footprint_bytes = pss.tree.pss_bytes;
        pss.budget_bytes = Some(32 << 30);
        assert_eq!(of(&pss).1, Kind::Pss);
        let labels: Vec<&str> = pss.ceilings().iter().map(|c| used_label(&pss, c)).collect();
        assert_eq!(labels, ["working set", "footprint", "used"]);
        assert!(!tree_released(&pss));
    }

    #[test]
    fn a_tree_whose_processes_hold_no_pages_is_released() {
        let run = Run {
            exiting_at: Some(100),
            ..Run::default()
        };
        let s = fixtures::sample(&run, 100);
        assert!(tree_released(&s));
        // The cgroup still holds its working set: the gauge says so.
        let labels: Vec<&str> = s.ceilings().iter().map(|c| used_label(&s, c)).collect();
        assert_eq!(labels, ["working set", "used"]);
        assert!(!tree_released(&fixtures::sample(&run, 98)));
        let none = crate::sinks::tui::fixtures::bare_sample(1.0, vec![]);
        assert!(tree_released(&none));
    }
}
