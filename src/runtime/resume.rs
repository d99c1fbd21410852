//! Resuming a job that is run again: a SLURM requeue, a new pod on the same
//! volume, the same command typed again. A run that ends after a save every
//! rank agreed on (a signal's, or a stop's) leaves a record of it; the next
//! `oomguard run` of the same job finds the record and its first attempt
//! resumes from that save, as a restart's would (`OOMGUARD_CHECKPOINT`).
//!
//! The record is `.oomguard-resume.json` in `--checkpoint-dir` when one is
//! given (beside the checkpoints, so a new pod that mounts them finds it),
//! else in the directory oomguard was started in. A run is the same job
//! when the command, that directory and `SLURM_JOB_ID` (a requeue keeps it)
//! are all the same: a changed command never resumes an old run's save. A
//! job that ends normally removes the record; `--fresh` ignores and
//! removes it.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The record's file name.
pub const FILE: &str = ".oomguard-resume.json";

/// Which run a record belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    #[serde(default)]
    pub slurm_job_id: Option<String>,
}

impl Identity {
    /// This run's: its command, the directory it was started in and its
    /// SLURM job, if any.
    pub fn of(argv: &[OsString], cwd: &Path, slurm_job_id: Option<String>) -> Self {
        Identity {
            argv: argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            cwd: cwd.to_path_buf(),
            slurm_job_id: slurm_job_id.filter(|s| !s.is_empty()),
        }
    }

    /// Why `other` is not this run (`None`: it is).
    fn differs(&self, other: &Identity) -> Option<String> {
        if self.argv != other.argv {
            return Some(format!("it was saved by '{}'", other.argv.join(" ")));
        }
        if self.cwd != other.cwd {
            return Some(format!("it was saved by a run in {}", other.cwd.display()));
        }
        if self.slurm_job_id != other.slurm_job_id {
            let id = |j: &Option<String>| j.clone().unwrap_or_else(|| "none".into());
            return Some(format!(
                "it was saved by SLURM job {}, this is {}",
                id(&other.slurm_job_id),
                id(&self.slurm_job_id)
            ));
        }
        None
    }
}

/// A save every rank agreed on, that the next run of the job resumes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub v: u32,
    #[serde(flatten)]
    pub run: Identity,
    pub step: Option<u64>,
    pub paths: Vec<PathBuf>,
    /// Why the run ended ("SIGTERM received", "critical-headroom").
    pub reason: String,
    /// Unix seconds of the save.
    pub saved_at: f64,
}

/// What the start of a run finds.
#[derive(Debug, PartialEq)]
pub enum Found {
    Nothing,
    /// This run's record, with a checkpoint that is still there.
    Resume(Record),
    /// A record this run does not resume from, and why.
    NotOurs(String),
}

/// Whose record it is, in a job of several oomguards that share the
/// directory: each keeps its own (its ranks saved their own files), so no
/// oomguard overwrites or removes a record another's save stands behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The only oomguard of its job.
    Alone,
    /// One oomguard per node (`srun` of one task per node over torchrun):
    /// `SLURM_NODEID`.
    Node(u32),
    /// Several oomguards per node (`srun --ntasks-per-node=N`, one per
    /// rank): `SLURM_PROCID`.
    Task(u32),
}

impl Owner {
    /// From SLURM's step variables, read through `var`: a task's own record
    /// when the step has more tasks than nodes, a node's when it spans
    /// nodes with one task each.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Self {
        let number = |name: &str| var(name)?.trim().parse::<u32>().ok();
        let nodes = number("SLURM_NNODES").unwrap_or(1);
        let tasks = number("SLURM_NTASKS").unwrap_or(1);
        match (number("SLURM_PROCID"), number("SLURM_NODEID")) {
            (Some(task), _) if tasks > nodes => Owner::Task(task),
            (_, Some(node)) if nodes > 1 => Owner::Node(node),
            _ => Owner::Alone,
        }
    }
}

/// The record's path for a run with `--checkpoint-dir dir` (or none), kept
/// by `owner`.
pub fn path(checkpoint_dir: Option<&Path>, cwd: &Path, owner: Owner) -> PathBuf {
    let dir = checkpoint_dir.unwrap_or(cwd);
    match owner {
        Owner::Node(n) => dir.join(format!(".oomguard-resume-node{n}.json")),
        Owner::Task(t) => dir.join(format!(".oomguard-resume-task{t}.json")),
        Owner::Alone => dir.join(FILE),
    }
}

/// Whether the saved `paths` lie under the record's directory: the record
/// is kept only beside the checkpoints it names (a relative path is the
/// job's, under the directory it was started in). Never for a save with
/// no path.
pub fn beside(record: &Path, paths: &[PathBuf]) -> bool {
    let Some(dir) = record.parent() else {
        return false;
    };
    !paths.is_empty() && paths.iter().all(|p| p.is_relative() || p.starts_with(dir))
}

/// Reads the record at `path` for `run`.
pub fn find(path: &Path, run: &Identity) -> Found {
    let Ok(text) = std::fs::read(path) else {
        return Found::Nothing;
    };
    let Ok(rec) = serde_json::from_slice::<Record>(&text) else {
        return Found::NotOurs(format!(
            "{} cannot be read as a resume record",
            path.display()
        ));
    };
    if let Some(why) = run.differs(&rec.run) {
        return Found::NotOurs(why);
    }
    match rec.paths.first() {
        Some(p) if p.exists() => Found::Resume(rec),
        Some(p) => Found::NotOurs(format!("its checkpoint {} is gone", p.display())),
        None => Found::NotOurs("it names no checkpoint".into()),
    }
}

/// Removes the record at `path` if it is `run`'s (a finished job's):
/// another run's record is not this run's to remove.
pub fn remove_if_ours(path: &Path, run: &Identity) {
    let ours = std::fs::read(path)
        .ok()
        .and_then(|t| serde_json::from_slice::<Record>(&t).ok())
        .is_some_and(|rec| run.differs(&rec.run).is_none());
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

/// Writes `rec` at `path`, atomically (a temporary file renamed over it),
/// and durably: the file, then its directory (the rename), are on disk
/// before the run ends with "safe to requeue".
/// The temporary file is this process's alone (its pid in the name, made
/// with `O_EXCL`, not followed if a link is in its place): two writers never
/// share one.
pub fn write<T: Serialize>(path: &Path, rec: &T) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(&serde_json::to_vec_pretty(rec).unwrap_or_default())?;
            f.write_all(b"\n")?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// The variables of a first attempt that resumes from `rec`: what a
/// restart's attempt gets (`OOMGUARD_CHECKPOINT`), and `OOMGUARD_RESUMED`
/// for the companion, which otherwise resumes only on a restart.
pub fn env(rec: &Record) -> Vec<(OsString, OsString)> {
    let mut env = vec![(OsString::from("OOMGUARD_RESUMED"), OsString::from("1"))];
    if let Some(p) = rec.paths.first() {
        env.push((OsString::from("OOMGUARD_CHECKPOINT"), p.as_os_str().into()));
    }
    if let Some(s) = rec.step {
        env.push((OsString::from("OOMGUARD_RESUME_STEP"), s.to_string().into()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(argv: &[&str], job: Option<&str>) -> Identity {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        Identity::of(&argv, Path::new("/work"), job.map(str::to_string))
    }

    fn record(run: Identity, ckpt: &Path) -> Record {
        Record {
            v: 1,
            run,
            step: Some(580),
            paths: vec![ckpt.to_path_buf()],
            reason: "SIGTERM received".into(),
            saved_at: 1.0,
        }
    }

    #[test]
    fn only_the_same_command_in_the_same_place_and_job_resumes() {
        let t = tempfile::tempdir().unwrap();
        let ckpt = t.path().join("step-580.ckpt");
        std::fs::write(&ckpt, "x").unwrap();
        let at = path(Some(t.path()), Path::new("/elsewhere"), Owner::Alone);
        assert_eq!(at, t.path().join(FILE));
        assert_eq!(
            path(None, t.path(), Owner::Node(1)),
            t.path().join(".oomguard-resume-node1.json")
        );
        assert_eq!(
            path(None, t.path(), Owner::Task(3)),
            t.path().join(".oomguard-resume-task3.json")
        );
        let ours = run(&["torchrun", "train.py"], Some("42"));
        assert_eq!(find(&at, &ours), Found::Nothing);
        write(&at, &record(ours.clone(), &ckpt)).unwrap();
        match find(&at, &ours) {
            Found::Resume(r) => assert_eq!(r.step, Some(580)),
            other => panic!("{other:?}"),
        }
        let changed = run(&["torchrun", "train.py", "--lr", "3"], Some("42"));
        assert!(
            matches!(find(&at, &changed), Found::NotOurs(w) if w.contains("saved by 'torchrun train.py'"))
        );
        let other_job = run(&["torchrun", "train.py"], Some("43"));
        assert!(matches!(find(&at, &other_job), Found::NotOurs(w) if w.contains("SLURM job 42")));
        std::fs::remove_file(&ckpt).unwrap();
        assert!(matches!(find(&at, &ours), Found::NotOurs(w) if w.contains("is gone")));
    }

    #[test]
    fn each_oomguard_of_a_slurm_step_keeps_its_own_record() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        // Two tasks per node on two nodes: one record per task.
        let per_rank = env(&[
            ("SLURM_NNODES", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NODEID", "1"),
        ]);
        assert_eq!(Owner::from_env(per_rank), Owner::Task(3));
        // Two tasks on one node: still one each, not one shared file.
        let one_node = env(&[("SLURM_NTASKS", "2"), ("SLURM_PROCID", "1")]);
        assert_eq!(Owner::from_env(one_node), Owner::Task(1));
        // One task per node over torchrun: the node's.
        let per_node = env(&[
            ("SLURM_NNODES", "2"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NODEID", "1"),
        ]);
        assert_eq!(Owner::from_env(per_node), Owner::Node(1));
        assert_eq!(Owner::from_env(env(&[])), Owner::Alone);
    }

    #[test]
    fn two_writers_of_one_record_never_share_a_temporary_file() {
        let t = tempfile::tempdir().unwrap();
        let at = t.path().join(FILE);
        let rec = record(run(&["python", "x.py"], None), Path::new("/c/x"));
        // Another writer's temporary file, mid-write: untouched by this one.
        let theirs = at.with_extension("json.1.tmp");
        std::fs::write(&theirs, "half").unwrap();
        write(&at, &rec).unwrap();
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "half");
        let names: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(find(&at, &rec.run) != Found::Nothing);
    }

    #[test]
    fn a_record_is_kept_only_beside_its_checkpoints() {
        let at = Path::new("/work/run/.oomguard-resume.json");
        assert!(beside(at, &[PathBuf::from("/work/run/ckpt/step-5.pt")]));
        assert!(beside(at, &[PathBuf::from("ckpt/step-5.pt")]));
        assert!(!beside(at, &[PathBuf::from("/scratch/step-5.pt")]));
        assert!(!beside(at, &[]));
    }

    #[test]
    fn the_first_attempt_is_told_where_to_resume() {
        let rec = record(
            run(&["python", "x.py"], None),
            Path::new("/c/step-580.ckpt"),
        );
        let env = env(&rec);
        assert!(env.contains(&("OOMGUARD_RESUMED".into(), "1".into())));
        assert!(env.contains(&("OOMGUARD_CHECKPOINT".into(), "/c/step-580.ckpt".into())));
        assert!(env.contains(&("OOMGUARD_RESUME_STEP".into(), "580".into())));
    }
}
