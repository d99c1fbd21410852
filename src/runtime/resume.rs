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

/// The record's path for a run with `--checkpoint-dir dir` (or none).
/// `node`: this node's number in a job of several (`SLURM_NODEID` when
/// `SLURM_NNODES` is above 1): each node's oomguard keeps its own record
/// (its ranks saved their own files) in the shared directory.
pub fn path(checkpoint_dir: Option<&Path>, cwd: &Path, node: Option<u32>) -> PathBuf {
    let dir = checkpoint_dir.unwrap_or(cwd);
    match node {
        Some(n) => dir.join(format!(".oomguard-resume-node{n}.json")),
        None => dir.join(FILE),
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
pub fn write(path: &Path, rec: &Record) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(rec).unwrap_or_default())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
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
        let at = path(Some(t.path()), Path::new("/elsewhere"), None);
        assert_eq!(at, t.path().join(FILE));
        assert_eq!(
            path(None, t.path(), Some(1)),
            t.path().join(".oomguard-resume-node1.json")
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
