//! How a run ended, kept for whatever decides whether it runs again: the
//! `sbatch` recipe's requeue (`oomguard ended --requeue`,
//! docs/preemption.md). Exit 75 says only "saved, safe to retry"; this
//! record says whether retrying is what should happen:
//!
//! - oomguard's own stop (on this task or another) and the time limit's
//!   warning (the `--signal` the recipe asks SLURM for: USR1, USR2) are
//!   requeued;
//! - a SIGTERM is not: under SLURM it is a person's `scancel`, or a time
//!   limit or preemption without warning (SLURM requeues a preempted job
//!   itself under `PreemptMode=REQUEUE`); Ctrl-C neither;
//! - a run that stops again without passing the step it resumed from, for
//!   the `--requeue-limit`-th time in a row, is not: the next run would stop
//!   at the same place. The count lives here, so runs that saved nothing
//!   count too.
//!
//! One record per oomguard, beside its resume record (`.oomguard-end.json`,
//! `-node<N>`, `-task<P>`), written at every stop, saved or not; a run that
//! finishes or fails on its own removes its own (nothing to requeue, no
//! count to carry), so a finished job leaves nothing behind.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file names' common start.
pub const PREFIX: &str = ".oomguard-end";

/// The exit code of a stop that is not to be requeued because the job made
/// no progress (EX_CONFIG: the budget, or the job, needs changing).
pub const NO_PROGRESS_EXIT: i32 = 78;

/// What ended the run, as far as a requeue is concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    /// The job exited 0.
    Finished,
    /// The job failed on its own (a crash, a kernel OOM kill, a signal
    /// from elsewhere): not a stop of oomguard's.
    Failed { exit_code: i32 },
    /// oomguard's policy stopped it (here, or another task's or node's,
    /// named in `reason`).
    Policy { reason: String },
    /// A warning signal the scheduler was asked for (`--signal=USR1@N`).
    Warning { signal: String },
    /// A signal that means "end" (SIGTERM, SIGINT, SIGHUP).
    Terminated { signal: String },
}

/// The record of how one oomguard's run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndRecord {
    pub v: u32,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    #[serde(default)]
    pub slurm_job_id: Option<String>,
    /// Whose record: `task 3`, `node 1`, or empty for a job's only one.
    #[serde(default)]
    pub owner: String,
    pub cause: Cause,
    pub exit_code: i32,
    /// The step every rank saved before the end, if a save counted.
    #[serde(default)]
    pub saved_step: Option<u64>,
    /// The step this run resumed from, if it resumed.
    #[serde(default)]
    pub resumed_from: Option<u64>,
    /// Stops in a row, this one included, that passed no step beyond the
    /// one they resumed from.
    #[serde(default)]
    pub stops_without_progress: u32,
    pub requeue: bool,
    /// Why (or why not), in words for the batch script's output.
    pub why: String,
    /// Unix seconds.
    pub ended_at: f64,
}

/// The advice for a run that ended by `cause`, having saved `saved` after
/// resuming from `resumed`, after `before` stops in a row without progress;
/// `limit` of them end the requeues. Returns (requeue, why, the new count).
pub fn advise(
    cause: &Cause,
    saved: Option<u64>,
    resumed: Option<u64>,
    before: u32,
    limit: u32,
) -> (bool, String, u32) {
    let stop = !matches!(cause, Cause::Finished | Cause::Failed { .. });
    let progress = match (saved, resumed) {
        (Some(s), Some(r)) => s > r,
        (Some(_), None) => true,
        (None, _) => false,
    };
    let stalls = if stop && !progress { before + 1 } else { 0 };
    let at = resumed.or(saved).map_or_else(
        || "before its first save".to_string(),
        |s| format!("at step {s}"),
    );
    let saved_words = saved.map_or_else(
        || "nothing saved".to_string(),
        |s| format!("saved step {s}"),
    );
    match cause {
        Cause::Finished => (false, "the job finished".into(), 0),
        Cause::Failed { exit_code } => (
            false,
            format!("the job failed on its own (exit {exit_code}), not stopped by oomguard"),
            0,
        ),
        _ if stop && stalls >= limit && limit > 0 => (
            false,
            format!(
                "stopped {stalls} times {at} without progress: the budget is too small for this job, \
                 or the job leaks before its first step"
            ),
            stalls,
        ),
        Cause::Terminated { signal } => (
            false,
            format!(
                "{signal} ({saved_words}): a person's scancel, or a time limit or preemption \
                 without warning (SLURM requeues a preempted job itself under PreemptMode=REQUEUE)"
            ),
            stalls,
        ),
        Cause::Warning { signal } => (
            true,
            format!("the time limit's warning ({signal}), {saved_words}"),
            stalls,
        ),
        Cause::Policy { reason } => (
            true,
            format!("oomguard stopped the job ({reason}), {saved_words}"),
            stalls,
        ),
    }
}

/// The record's path beside a resume record at `resume` (the same owner's).
pub fn path_beside(resume: &Path) -> PathBuf {
    let name = resume
        .file_name()
        .map(|n| n.to_string_lossy().replace(".oomguard-resume", PREFIX))
        .unwrap_or_else(|| format!("{PREFIX}.json"));
    resume.with_file_name(name)
}

/// Reads the record at `path`; `None` when absent or unreadable.
pub fn read(path: &Path) -> Option<EndRecord> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Every end record in `dir`, with its path, by name.
pub fn all_in(dir: &Path) -> std::io::Result<Vec<(PathBuf, Option<EndRecord>)>> {
    let mut found: Vec<(PathBuf, Option<EndRecord>)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(".json"))
        })
        .map(|p| {
            let rec = read(&p);
            (p, rec)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// The job's advice from its records (one per oomguard): requeue only when
/// at least one says so and none says not to (a task that was cancelled,
/// or that stopped without progress, speaks for the job).
pub fn verdict<'a>(records: impl IntoIterator<Item = &'a EndRecord>) -> Option<bool> {
    let mut any = None;
    for r in records {
        if !r.requeue {
            return Some(false);
        }
        any = Some(true);
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warning() -> Cause {
        Cause::Warning {
            signal: "SIGUSR1".into(),
        }
    }

    #[test]
    fn stops_of_oomguards_and_the_warning_come_back_and_a_cancel_does_not() {
        let (yes, why, n) = advise(&warning(), Some(84), None, 0, 3);
        assert!(
            yes && why.contains("SIGUSR1") && why.contains("saved step 84"),
            "{why}"
        );
        assert_eq!(n, 0);
        let policy = Cause::Policy {
            reason: "critical-headroom".into(),
        };
        assert!(advise(&policy, Some(90), Some(84), 0, 3).0);
        let term = Cause::Terminated {
            signal: "SIGTERM".into(),
        };
        let (yes, why, _) = advise(&term, Some(84), None, 0, 3);
        assert!(!yes && why.contains("scancel"), "{why}");
        assert!(!advise(&Cause::Finished, None, None, 2, 3).0);
        assert!(!advise(&Cause::Failed { exit_code: 1 }, None, None, 0, 3).0);
    }

    #[test]
    fn the_third_stop_in_a_row_without_progress_ends_the_requeues() {
        let policy = Cause::Policy {
            reason: "critical-headroom".into(),
        };
        // Resumed from 1200, stopped again at 1200: twice is still tried.
        let (yes, _, n) = advise(&policy, Some(1200), Some(1200), 0, 3);
        assert!(yes && n == 1);
        let (yes, _, n) = advise(&policy, None, Some(1200), n, 3);
        assert!(yes && n == 2, "a run that saved nothing counts");
        let (yes, why, n) = advise(&policy, Some(1200), Some(1200), n, 3);
        assert!(!yes && n == 3);
        assert!(
            why.contains("stopped 3 times at step 1200 without progress"),
            "{why}"
        );
        // Progress resets the count.
        let (yes, _, n) = advise(&policy, Some(1300), Some(1200), 2, 3);
        assert!(yes && n == 0);
        // A job that leaks before its first save.
        let (_, why, _) = advise(&policy, None, None, 2, 3);
        assert!(why.contains("before its first save"), "{why}");
    }

    #[test]
    fn the_record_sits_beside_its_owners_resume_record() {
        let at = |p: &str| path_beside(Path::new(p));
        assert_eq!(
            at("/c/.oomguard-resume.json"),
            Path::new("/c/.oomguard-end.json")
        );
        assert_eq!(
            at("/c/.oomguard-resume-task3.json"),
            Path::new("/c/.oomguard-end-task3.json")
        );
    }

    #[test]
    fn one_task_that_should_not_come_back_speaks_for_the_job() {
        let rec = |requeue| EndRecord {
            v: 1,
            argv: vec![],
            cwd: PathBuf::new(),
            slurm_job_id: None,
            owner: String::new(),
            cause: Cause::Finished,
            exit_code: 75,
            saved_step: None,
            resumed_from: None,
            stops_without_progress: 0,
            requeue,
            why: String::new(),
            ended_at: 0.0,
        };
        assert_eq!(verdict(&[rec(true), rec(true)]), Some(true));
        assert_eq!(verdict(&[rec(true), rec(false)]), Some(false));
        assert_eq!(verdict(&[]), None);
    }
}
