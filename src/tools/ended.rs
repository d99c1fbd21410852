//! `oomguard ended`: reads the end records a job's runs left
//! (`vocab::ended`) and says, one line per oomguard, how each ended; with
//! `--requeue`, the job's verdict as an exit code a batch script tests.

use std::path::{Path, PathBuf};

use crate::settings::cli::EndedArgs;
use crate::vocab::ended::{self, EndRecord};

/// What to print and the exit code.
#[derive(Debug, PartialEq)]
pub struct Answer {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

/// Answers `args`, with `$SLURM_JOB_ID` as `slurm_job` when no `--job`.
pub fn answer(args: &EndedArgs, slurm_job: Option<String>, cwd: &Path) -> Answer {
    let dir: PathBuf = args
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| cwd.to_path_buf());
    let job = args.job.clone().or(slurm_job).filter(|j| !j.is_empty());
    let found = match ended::all_in(&dir) {
        Ok(f) => f,
        Err(e) => {
            return Answer {
                stdout: String::new(),
                stderr: format!("oomguard: ended: cannot read {}: {e}\n", dir.display()),
                code: 2,
            };
        }
    };
    let mut stderr = String::new();
    let mut records: Vec<EndRecord> = Vec::new();
    for (path, rec) in found {
        match rec {
            Some(r) if job.is_none() || r.slurm_job_id == job => records.push(r),
            Some(_) => {}
            None => stderr.push_str(&format!(
                "oomguard: ended: {} cannot be read as an end record; ignored\n",
                path.display()
            )),
        }
    }
    let lines: String = records.iter().map(|r| format!("{}\n", line(r))).collect();
    let of = job.map_or_else(String::new, |j| format!(" of SLURM job {j}"));
    let Some(requeue) = ended::verdict(&records) else {
        stderr.push_str(&format!(
            "oomguard: ended: no run{of} left an end record in {}\n",
            dir.display()
        ));
        return Answer {
            stdout: String::new(),
            stderr,
            code: 2,
        };
    };
    if !args.requeue {
        return Answer {
            stdout: lines,
            stderr,
            code: 0,
        };
    }
    // A batch script's output keeps why it did (not) requeue.
    stderr.push_str(
        &lines
            .lines()
            .map(|l| format!("oomguard: {l}\n"))
            .collect::<String>(),
    );
    stderr.push_str(if requeue {
        "oomguard: requeue\n"
    } else {
        "oomguard: do not requeue\n"
    });
    Answer {
        stdout: String::new(),
        stderr,
        code: if requeue { 0 } else { 1 },
    }
}

/// `task 1: requeue: oomguard stopped the job (…), saved step 84`.
fn line(r: &EndRecord) -> String {
    let who = if r.owner.is_empty() {
        "the run".to_string()
    } else {
        r.owner.clone()
    };
    let verdict = if r.requeue {
        "requeue"
    } else {
        "do not requeue"
    };
    format!("{who}: {verdict}: {} (exit {})", r.why, r.exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::ended::Cause;

    fn record(owner: &str, job: &str, requeue: bool, why: &str) -> EndRecord {
        EndRecord {
            v: 1,
            argv: vec!["python".into()],
            cwd: PathBuf::from("/w"),
            slurm_job_id: Some(job.into()),
            owner: owner.into(),
            cause: Cause::Finished,
            exit_code: 75,
            saved_step: Some(84),
            resumed_from: None,
            stops_without_progress: 0,
            requeue,
            why: why.into(),
            ended_at: 0.0,
        }
    }

    fn put(dir: &Path, name: &str, r: &EndRecord) {
        std::fs::write(dir.join(name), serde_json::to_vec(r).unwrap()).unwrap();
    }

    fn args(requeue: bool) -> EndedArgs {
        EndedArgs {
            requeue,
            checkpoint_dir: None,
            job: None,
        }
    }

    #[test]
    fn a_job_is_requeued_only_when_no_task_says_otherwise() {
        let t = tempfile::tempdir().unwrap();
        let (dir, job) = (t.path(), Some("42".to_string()));
        assert_eq!(answer(&args(true), job.clone(), dir).code, 2, "no record");
        put(
            dir,
            ".oomguard-end-task0.json",
            &record("task 0", "42", true, "the time limit's warning (SIGUSR1)"),
        );
        put(
            dir,
            ".oomguard-end-task1.json",
            &record("task 1", "42", true, "oomguard stopped the job"),
        );
        // Another job's record, in the same directory: not this job's say.
        put(
            dir,
            ".oomguard-end-task2.json",
            &record("task 2", "41", false, "SIGTERM"),
        );
        let a = answer(&args(true), job.clone(), dir);
        assert_eq!(a.code, 0, "{a:?}");
        assert!(
            a.stderr
                .contains("task 1: requeue: oomguard stopped the job"),
            "{a:?}"
        );
        put(
            dir,
            ".oomguard-end-task1.json",
            &record(
                "task 1",
                "42",
                false,
                "SIGTERM (saved step 84): a person's scancel",
            ),
        );
        let a = answer(&args(true), job.clone(), dir);
        assert_eq!(a.code, 1, "{a:?}");
        assert!(a.stderr.ends_with("oomguard: do not requeue\n"), "{a:?}");
        // Without --requeue: the lines, on stdout, and success.
        let a = answer(&args(false), job, dir);
        assert_eq!((a.code, a.stdout.lines().count()), (0, 2), "{a:?}");
    }
}
