//! `attach` inside the supervision loop: whether the job's own cgroup
//! counts it exactly (then its members are the tree and its working set the
//! footprint), when a job oomguard did not launch has ended, and how a
//! watch ends while the job is still running (`detached`, with everything
//! oomguard held let go first).
//!
//! oomguard is not the parent of an attached job, so it can never learn
//! its exit code: an ended job is `exited` with `exit_code_known: false`,
//! and a watch that ends first is `detached`, never `exited`.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use super::Supervisor;
use crate::engine::probe::cgroup::{CgroupReader, Location};
use crate::sinks::log::Outcome;
use crate::vocab::units::human_duration;

/// What the loop knows about a job it did not launch.
#[derive(Debug, Default)]
pub(super) struct Attached {
    /// The cgroup that holds only the job, when there is one.
    pub exclusive: Option<Location>,
    /// The cgroup whose members are the job: the exclusive one, or the one
    /// the user named (even without memory files to read).
    pub members_of: Option<Location>,
    /// Why the job's cgroup is not used for its footprint.
    pub not_exclusive_reason: Option<String>,
    /// `--watch-for`: the watch ends then.
    pub until: Option<Instant>,
    /// Why the watch ended while the job was still running.
    pub detached: Option<String>,
}

impl Attached {
    /// Decides, once at attach time, whether the job's cgroup counts
    /// exactly the job: every process in it (and below it) is the job's.
    pub fn new(
        spec: Option<&crate::job::attach::AttachSpec>,
        reader: Option<&CgroupReader>,
        proc_root: &Path,
        pid: u32,
        started: Instant,
    ) -> Self {
        let me = std::process::id();
        let until = spec.and_then(|s| s.watch_for).map(|d| started + d);
        let named = spec.and_then(|s| s.cgroup.clone());
        let Some(reader) = reader else {
            return Self {
                not_exclusive_reason: Some("no memory cgroup was found for the job".into()),
                members_of: named,
                until,
                ..Self::default()
            };
        };
        let loc = reader.location();
        // A job named by its cgroup is its members; one named by a pid is
        // that process and its descendants.
        let job: HashSet<u32> = match spec.and_then(|s| s.cgroup.as_ref()) {
            Some(_) => crate::job::attach::subtree_procs(&loc.dir())
                .into_iter()
                .collect(),
            None => crate::job::attach::descendants(proc_root, pid),
        };
        match crate::job::attach::exclusive(loc, proc_root, &job, me) {
            Ok(()) => Self {
                exclusive: Some(loc.clone()),
                members_of: Some(loc.clone()),
                until,
                ..Self::default()
            },
            Err(why) => Self {
                not_exclusive_reason: Some(why),
                members_of: named,
                until,
                ..Self::default()
            },
        }
    }

    /// When the watch ends by `--watch-for`, while it has not ended yet.
    pub fn deadline(&self) -> Option<Instant> {
        self.until.filter(|_| self.detached.is_none())
    }

    /// `--watch-for` ran out at `now` on a watch still going.
    pub fn watch_due(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|u| now >= u)
    }

    /// The job's processes by its cgroup (oomguard itself left out), when
    /// the job is that cgroup's members.
    pub fn members(&self) -> Option<Vec<u32>> {
        let loc = self.members_of.as_ref()?;
        let me = std::process::id();
        Some(
            crate::job::attach::subtree_procs(&loc.dir())
                .into_iter()
                .filter(|&p| p != me)
                .collect(),
        )
    }
}

impl Supervisor {
    /// Whether the job's cgroup is its exact footprint (and member list).
    pub(super) fn attached_exclusive(&self) -> bool {
        self.target
            .attached()
            .is_some_and(|a| a.exclusive.is_some())
    }

    /// The tree's members from the job's cgroup, when the job is defined by
    /// it (`None`: find the tree through /proc).
    pub(super) fn attached_members(&self) -> Option<Vec<u32>> {
        self.target.attached().and_then(Attached::members)
    }

    /// A job named by (or alone in) its cgroup has ended when no live
    /// process is left in it: its orphans are still the job.
    pub(super) fn attached_cgroup_empty(&self) -> Option<bool> {
        let members = self.attached_members()?;
        let alive = members.iter().any(|pid| {
            std::fs::read_to_string(self.cfg.proc_root.join(pid.to_string()).join("stat"))
                .ok()
                .and_then(|t| crate::engine::probe::proc::parse_stat(&t))
                .is_some_and(|st| st.state != 'Z')
        });
        Some(!alive)
    }

    /// Ends the watch with the job still running: anything oomguard paused
    /// or holds is resumed first.
    pub(super) fn end_watch(&mut self, why: String) {
        self.core
            .act_mut()
            .let_go(&why, self.sampler.tree(), self.child.sig_mut());
        self.acted(None);
        if let Some(a) = self.target.attached_mut()
            && a.detached.is_none()
        {
            a.detached = Some(why);
        }
    }

    /// `--watch-for` ran out.
    pub(super) fn check_watch_time(&mut self, now: Instant) {
        let due = self.target.attached().is_some_and(|a| a.watch_due(now));
        if due && self.child.status().is_none() {
            let limit = self
                .cfg
                .attach_spec
                .as_ref()
                .and_then(|s| s.watch_for)
                .unwrap_or_default();
            self.end_watch(format!("--watch-for {} elapsed", human_duration(limit)));
        }
    }

    pub(super) fn watch_deadline(&self) -> Option<Instant> {
        self.target.attached().and_then(Attached::deadline)
    }

    pub(super) fn watch_ended(&self) -> bool {
        self.target.attached().is_some_and(|a| a.detached.is_some())
    }

    /// Writes `run_end`, with what `attach` adds: that the job's exit code
    /// is unknown, and the pids still running when the watch ended.
    pub(super) fn write_run_end(&mut self, outcome: Outcome, end: &crate::sinks::log::RunEnd) {
        let mut end = end.clone();
        if !self.target.is_parent() {
            // A non-parent cannot reap the job, so its code is never seen.
            end.exit_code_known = Some(false);
            if outcome == Outcome::Detached {
                end.detached_reason = self.target.attached().and_then(|a| a.detached.clone());
                end.still_running_pids = Some(self.sampler.tree().iter().map(|p| p.pid).collect());
            }
        }
        self.sinks
            .emit(&crate::sinks::log::Event::RunEnd(Box::new(end)));
    }

    /// The summary's first line under `attach` (`None`: the usual one).
    pub(super) fn attach_headline(
        &self,
        outcome: Outcome,
        duration: std::time::Duration,
    ) -> Option<String> {
        if self.target.is_parent() {
            return None;
        }
        let label = self
            .cfg
            .attach_spec
            .as_ref()
            .map_or_else(|| format!("pid {}", self.child.pid()), |s| s.label.clone());
        let after = human_duration(duration);
        match outcome {
            Outcome::Detached => {
                let why = self
                    .target
                    .attached()
                    .and_then(|a| a.detached.as_deref())
                    .unwrap_or("ended");
                Some(format!(
                    "stopped watching {label} (still running, {} process(es)) after {after}: {why}",
                    self.sampler.tree().len()
                ))
            }
            Outcome::Exited => Some(format!(
                "'{label}' ended after {after} (exit code unknown: oomguard is not its parent)"
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_for_ends_the_watch_at_its_time_and_once() {
        let t0 = Instant::now();
        let limit = std::time::Duration::from_secs(60);
        let mut a = Attached {
            until: Some(t0 + limit),
            ..Attached::default()
        };
        assert_eq!(a.deadline(), Some(t0 + limit));
        assert!(!a.watch_due(t0 + limit / 2));
        assert!(a.watch_due(t0 + limit));
        // Ended (by it or by anything else): nothing more to wait for.
        a.detached = Some("--watch-for 1m elapsed".into());
        assert!(!a.watch_due(t0 + limit * 2));
        assert_eq!(a.deadline(), None);
        // Without --watch-for the watch has no end of its own.
        assert!(!Attached::default().watch_due(t0 + limit * 100));
    }
}
