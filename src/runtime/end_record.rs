//! The record of how this run ended (`vocab::ended`), written when a run
//! oomguard launched ends in a stop (its own, a signal's): the cause as a
//! requeue sees it, the step resumed from and the step saved, and the count
//! of stops in a row that made no progress, carried over from the previous
//! run's record. A run that ends otherwise removes its own record.

use super::{Supervisor, resume, resume_place};
use crate::job::supervise::Status;
use crate::sinks::log::Outcome;
use crate::vocab::ended::{self, Cause, EndRecord};
use crate::vocab::model::signal_name;

impl Supervisor {
    /// The step this run resumed from: the resume record it started with,
    /// read before this run's end replaces it.
    fn resumed_step(&self) -> Option<u64> {
        if self.cfg.run.fresh || !self.target.is_parent() || self.cfg.doctor.is_some() {
            return None;
        }
        let (path, run) = resume_place(&self.cfg)?;
        match resume::find(&path, &run) {
            resume::Found::Resume(rec) => rec.step,
            _ => None,
        }
    }

    /// The run's resume record and end record, written (or removed) as
    /// its end says; returns the exit code (see [`Self::keep_end_record`]).
    pub(super) fn keep_records(&mut self, outcome: Outcome, status: Status, exit_code: i32) -> i32 {
        let resumed = self.resumed_step();
        self.keep_resume_record(outcome);
        self.keep_end_record(outcome, status, exit_code, resumed)
    }

    /// Writes this run's end record and returns the exit code: a stop that
    /// is the `--requeue-limit`-th in a row without progress exits
    /// [`ended::NO_PROGRESS_EXIT`] instead of the stop code.
    fn keep_end_record(
        &mut self,
        outcome: Outcome,
        status: Status,
        exit_code: i32,
        resumed: Option<u64>,
    ) -> i32 {
        if !self.target.is_parent() || self.cfg.doctor.is_some() {
            return exit_code;
        }
        let Some((resume_path, run)) = resume_place(&self.cfg) else {
            return exit_code;
        };
        let path = ended::path_beside(&resume_path);
        let cause = self.end_cause(outcome, status, exit_code);
        let ours = |r: &EndRecord| {
            r.argv == run.argv && r.cwd == run.cwd && r.slurm_job_id == run.slurm_job_id
        };
        if matches!(cause, Cause::Finished | Cause::Failed { .. }) {
            // Not a stop: nothing to requeue, and no count of stops to
            // carry. A finished run leaves nothing behind in its directory.
            if ended::read(&path).is_some_and(|r| ours(&r)) {
                let _ = std::fs::remove_file(&path);
            }
            return exit_code;
        }
        let saved = self
            .core
            .act()
            .companion()
            .done
            .as_ref()
            .filter(|d| d.ok)
            .and_then(|d| d.step);
        // Stops in a row are a loop only where something runs the job
        // again on its own: a SLURM job (a requeue keeps its id), or a run
        // that resumed an earlier one's save. The same command typed again
        // by a person is not counted.
        let again = resumed.is_some() || run.slurm_job_id.is_some();
        let before = ended::read(&path)
            .filter(|r| again && ours(r))
            .map_or(0, |r| r.stops_without_progress);
        let limit = if again { self.cfg.requeue_limit } else { 0 };
        let (requeue, why, stalls) = ended::advise(&cause, saved, resumed, before, limit);
        let code = if limit > 0 && stalls >= limit && exit_code == self.cfg.stop_code {
            ended::NO_PROGRESS_EXIT
        } else {
            exit_code
        };
        if code != exit_code && !self.cfg.quiet {
            self.say(format!("{why}; not to be requeued (exit {code})"));
        }
        let rec = EndRecord {
            v: 1,
            owner: owner_words(&resume_path),
            argv: run.argv,
            cwd: run.cwd,
            slurm_job_id: run.slurm_job_id,
            cause,
            exit_code: code,
            saved_step: saved,
            resumed_from: resumed,
            stops_without_progress: stalls,
            requeue,
            why,
            ended_at: crate::vocab::clock::unix_seconds(),
        };
        if let Err(e) = resume::write(&path, &rec)
            && !self.cfg.quiet
        {
            self.say(format!(
                "cannot write {} (a requeue cannot tell how this run ended): {e}",
                path.display()
            ));
        }
        code
    }

    fn end_cause(&self, outcome: Outcome, status: Status, exit_code: i32) -> Cause {
        let signal = self.core.act().signal_end();
        match outcome {
            Outcome::StoppedBySignal => match signal {
                Some(s) if s == libc::SIGUSR1 || s == libc::SIGUSR2 => Cause::Warning {
                    signal: signal_name(s),
                },
                Some(s) => Cause::Terminated {
                    signal: signal_name(s),
                },
                None => Cause::Terminated {
                    signal: "a signal".into(),
                },
            },
            Outcome::StoppedByPolicy | Outcome::RestartLimit => Cause::Policy {
                reason: self
                    .core
                    .act()
                    .policy_reason()
                    .unwrap_or("a stop")
                    .to_string(),
            },
            Outcome::Exited if status == Status::Exited(0) => Cause::Finished,
            _ => Cause::Failed { exit_code },
        }
    }
}

/// `task 3`, `node 1`, or empty, from the resume record's name.
fn owner_words(resume_path: &std::path::Path) -> String {
    let name = resume_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    ["task", "node"]
        .iter()
        .find_map(|kind| {
            let rest = name.strip_prefix(&format!(".oomguard-resume-{kind}"))?;
            Some(format!("{kind} {}", rest.trim_end_matches(".json")))
        })
        .unwrap_or_default()
}
