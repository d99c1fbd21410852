//! `oomguard checkpoint TARGET`: asks a running job's companion to save
//! now, and training goes on. The job is named as for `attach`; its
//! control directory is the one `oomguard run` named in the job's
//! environment (`OOMGUARD_CONTROL`). The request is written there as the
//! supervising oomguard writes its own, and the answer is the companion's
//! `done` record, printed as JSON on stdout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::vocab::companion::{Channel, Kind, Record};

/// Why a checkpoint could not be had (exit 1), each naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("{0}")]
    Target(#[from] crate::job::attach::AttachError),
    #[error("there is no process {0}: it has ended, or never ran")]
    NoSuchProcess(u32),
    #[error(
        "{label} has no control channel: it was not started by `oomguard run` \
         (or was, with --no-companion), so nothing in it can be asked to save"
    )]
    NoChannel { label: String },
    #[error(transparent)]
    Channel(#[from] crate::vocab::companion::ChannelError),
    #[error(
        "the job's companion has not spoken yet{} ({dir}): it speaks at the first training \
         step the job completes, and before that there is nothing to save. If the job is \
         training, it does not load the companion: a plain loop calls \
         oomguard.guard().step(); Lightning and the HF Trainer get it under `oomguard run`",
        started(*.age)
    )]
    Silent {
        dir: PathBuf,
        /// How long ago the job's process started; `None` if unreadable.
        age: Option<Duration>,
    },
    #[error(
        "a request is already being served in {dir} (id {id}, until {left:.0} s from now): \
         ask again once it is done"
    )]
    Busy { dir: PathBuf, id: u64, left: f64 },
    #[error(
        "{label} holds the control channels of {} different jobs, so which to ask is not clear; \
         name one by its pid (or use --slurm-job ID for every task of one SLURM job):\n{}",
        .jobs.len(),
        jobs_list(.jobs)
    )]
    Ambiguous { label: String, jobs: Vec<JobSeen> },
    #[error("the companion did not finish a save within {0}")]
    NoAnswer(String),
    #[error("the companion reports that the checkpoint failed: {0}")]
    Failed(String),
}

/// A job whose control channel a target holds: the first of its
/// processes found, its command and its working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSeen {
    pub pid: u32,
    pub command: String,
    pub cwd: String,
}

fn jobs_list(jobs: &[JobSeen]) -> String {
    jobs.iter()
        .map(|j| format!("  pid {}  {}  (in {})", j.pid, j.command, j.cwd))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asks the job `target` names for a checkpoint and waits up to `timeout`
/// for its `done` record, returned as a JSON line; for the tasks of one
/// SLURM job (each an `oomguard run` of its own), every task is asked and
/// each `done` is a line.
pub fn checkpoint(
    target: &crate::job::attach::Target,
    proc_root: &Path,
    timeout: Duration,
) -> Result<String, AskError> {
    let spec = crate::job::attach::resolve(target, proc_root)?;
    if !proc_root.join(spec.pid.to_string()).exists() {
        return Err(AskError::NoSuchProcess(spec.pid));
    }
    let dirs = channels(&spec, proc_root)?;
    let mut asked = Vec::new();
    for (dir, pid) in dirs {
        asked.push(ask(dir, pid, proc_root, timeout)?);
    }
    let began = Instant::now();
    let mut lines: Vec<Option<String>> = vec![None; asked.len()];
    while began.elapsed() < timeout {
        for ((ch, id), line) in asked.iter_mut().zip(lines.iter_mut()) {
            for r in ch.poll() {
                if let Record::Done { id: done, ok, .. } = &r
                    && *done == *id
                {
                    let text = serde_json::to_string(&r).unwrap_or_default();
                    if !*ok {
                        return Err(AskError::Failed(text));
                    }
                    *line = Some(text);
                }
            }
        }
        if lines.iter().all(Option::is_some) {
            return Ok(lines.into_iter().flatten().collect::<Vec<_>>().join("\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(AskError::NoAnswer(crate::vocab::units::human_duration(
        timeout,
    )))
}

/// The control channels the target's processes hold, each with the first
/// process found holding it. One job, or the tasks of one SLURM job (every
/// one holds `SLURM_JOB_ID` alike); channels of different jobs are refused,
/// listed, rather than one picked by pid order.
fn channels(
    spec: &crate::job::attach::AttachSpec,
    proc_root: &Path,
) -> Result<Vec<(PathBuf, u32)>, AskError> {
    let mut pids: BTreeSet<u32> = crate::job::attach::descendants(proc_root, spec.pid)
        .into_iter()
        .collect();
    pids.insert(spec.pid);
    if let Some(loc) = &spec.cgroup {
        pids.extend(crate::job::attach::subtree_procs(&loc.dir()));
    }
    let mut dirs: BTreeMap<PathBuf, u32> = BTreeMap::new();
    for &pid in &pids {
        if let Some(dir) = Channel::of_process(proc_root, pid) {
            dirs.entry(dir).or_insert(pid);
        }
    }
    if dirs.is_empty() {
        return Err(AskError::NoChannel {
            label: spec.label.clone(),
        });
    }
    let slurm_jobs: BTreeSet<Option<std::ffi::OsString>> = dirs
        .values()
        .map(|&pid| crate::vocab::companion::environ_var(proc_root, pid, "SLURM_JOB_ID"))
        .collect();
    let one_slurm_job = slurm_jobs.len() == 1 && slurm_jobs.iter().all(Option::is_some);
    if dirs.len() > 1 && !one_slurm_job {
        let jobs = dirs.values().map(|&pid| job_seen(proc_root, pid)).collect();
        return Err(AskError::Ambiguous {
            label: spec.label.clone(),
            jobs,
        });
    }
    Ok(dirs.into_iter().collect())
}

/// Joins one channel and writes the request, once its companion has
/// spoken and no other request is being served there.
fn ask(
    dir: PathBuf,
    pid: u32,
    proc_root: &Path,
    timeout: Duration,
) -> Result<(Channel, u64), AskError> {
    let mut ch = Channel::join(&dir)?;
    let said = ch.poll();
    if !said.iter().any(|r| matches!(r, Record::Hello { .. })) {
        let age = age(proc_root, pid);
        return Err(AskError::Silent { dir, age });
    }
    // Asked and written under the channel's lock: a stop the supervisor
    // writes meanwhile comes after this request, never under it.
    let asked =
        ch.request_unless_pending(Kind::Checkpoint, "oomguard checkpoint", timeout, |d| {
            pending(d, &said)
        })?;
    match asked {
        Ok(id) => Ok((ch, id)),
        Err((id, left)) => Err(AskError::Busy { dir, id, left }),
    }
}

fn job_seen(proc_root: &Path, pid: u32) -> JobSeen {
    let dir = proc_root.join(pid.to_string());
    let command = std::fs::read(dir.join("cmdline"))
        .map(|c| {
            c.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let cwd = std::fs::read_link(dir.join("cwd"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "?".to_string());
    JobSeen { pid, command, cwd }
}

/// How long ago process `pid` started: its start time in `stat` (clock
/// ticks after boot) against the machine's `uptime`, both under
/// `proc_root`.
fn age(proc_root: &Path, pid: u32) -> Option<Duration> {
    use procfs::FromRead as _;
    let stat =
        procfs::process::Stat::from_file(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let up = procfs::Uptime::from_file(proc_root.join("uptime")).ok()?;
    let born = stat.starttime as f64 / procfs::ticks_per_second() as f64;
    Some(Duration::from_secs_f64((up.uptime - born).max(0.0)))
}

/// " (started 0.5 s ago)", or nothing when the age is unknown.
fn started(age: Option<Duration>) -> String {
    match age {
        Some(a) if a < Duration::from_secs(10) => {
            format!(" (started {:.1} s ago)", a.as_secs_f64())
        }
        Some(a) => format!(
            " (started {} ago)",
            crate::vocab::units::human_duration(Duration::from_secs(a.as_secs()))
        ),
        None => String::new(),
    }
}

/// The request in `dir` still being served: its id, and the seconds until
/// its deadline. One that a `done` answered, or whose deadline passed, is
/// over. Writing over a stop's request would lose the stop.
fn pending(dir: &Path, said: &[Record]) -> Option<(u64, f64)> {
    let text = std::fs::read(dir.join("request")).ok()?;
    let req: crate::vocab::companion::Request = serde_json::from_slice(&text).ok()?;
    let answered = said
        .iter()
        .any(|r| matches!(r, Record::Done { id, .. } if *id == req.id));
    let now = crate::vocab::clock::unix_seconds();
    (!answered && req.deadline > now).then_some((req.id, req.deadline - now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Record {
        Record::Hello {
            pid: 1,
            rank: 0,
            framework: "plain".into(),
            world: None,
            local_world: None,
            v: None,
            version: None,
            path: None,
            node: None,
            task: None,
            local_rank: None,
            store: None,
        }
    }

    #[test]
    fn a_request_not_yet_answered_is_pending_until_its_deadline() {
        let t = tempfile::tempdir().unwrap();
        let mut ch = Channel::create(t.path(), 1).unwrap();
        let dir = ch.dir().to_path_buf();
        assert_eq!(pending(&dir, &[]), None, "no request at all");
        let id = ch
            .request(
                Kind::CheckpointAndExit,
                "critical",
                None,
                Duration::from_secs(60),
            )
            .unwrap();
        let (p, left) = pending(&dir, &[hello()]).unwrap();
        assert_eq!(p, id);
        assert!(left > 50.0 && left <= 60.0, "{left}");
        let done = Record::Done {
            id,
            rank: 0,
            step: Some(3),
            paths: vec![],
            ok: true,
            seconds: 0.1,
            not_counted: None,
        };
        assert_eq!(pending(&dir, &[hello(), done]), None, "answered");
        ch.request(Kind::Checkpoint, "old", None, Duration::ZERO)
            .unwrap();
        assert_eq!(pending(&dir, &[]), None, "past its deadline");
    }

    /// A fake `/proc` with `uptime` and process 4242 started `born`
    /// seconds after boot, its environment naming `control`.
    fn fake_proc(root: &Path, uptime: f64, born: f64, control: &Path) {
        let ticks = (born * procfs::ticks_per_second() as f64) as u64;
        std::fs::create_dir_all(root.join("4242")).unwrap();
        std::fs::write(root.join("uptime"), format!("{uptime:.2} 10.00\n")).unwrap();
        // A command name with a space and a parenthesis: the fields count
        // from the last ')'.
        let mut fields = vec!["S".to_string()];
        fields.extend(std::iter::repeat_n("0".to_string(), 18));
        fields.push(ticks.to_string());
        fields.extend(std::iter::repeat_n("0".to_string(), 30));
        std::fs::write(
            root.join("4242/stat"),
            format!("4242 (py (x) y) {}\n", fields.join(" ")),
        )
        .unwrap();
        let mut env = b"PATH=/bin\0OOMGUARD_CONTROL=".to_vec();
        env.extend(control.as_os_str().as_encoded_bytes());
        env.push(0);
        std::fs::write(root.join("4242/environ"), env).unwrap();
    }

    #[test]
    fn a_job_whose_companion_has_not_spoken_is_told_so_with_its_age() {
        let t = tempfile::tempdir().unwrap();
        let ch = Channel::create(t.path(), 1).unwrap();
        let proc_root = t.path().join("proc");
        let ask = || {
            checkpoint(
                &crate::job::attach::Target::Pid(4242),
                &proc_root,
                Duration::from_secs(1),
            )
            .unwrap_err()
        };
        fake_proc(&proc_root, 1000.0, 999.5, ch.dir());
        let e = ask();
        let text = e.to_string();
        assert!(
            matches!(e, AskError::Silent { age: Some(a), .. } if (a.as_secs_f64() - 0.5).abs() < 0.02),
            "{e:?}"
        );
        assert!(
            text.contains("has not spoken yet (started 0.5 s ago)"),
            "{text}"
        );
        assert!(!text.contains("is not a Python job"), "{text}");
        // Two hours in, the same words with the age in hours.
        fake_proc(&proc_root, 8000.0, 800.0, ch.dir());
        let e = ask();
        assert!(e.to_string().contains("(started 2h 00m ago)"), "{e}");
    }

    /// A shell (pid 1) that started two jobs (pids 10 and 20), each with
    /// a control channel of its own (`a`, `b`) whose companion spoke;
    /// `slurm`: both are tasks of that SLURM job.
    fn two_jobs(root: &Path, slurm: Option<&str>) -> (Channel, Channel) {
        let proc_root = root.join("proc");
        let mut chans = Vec::new();
        for (pid, ppid, name) in [(1, 0, "sh"), (10, 1, "a"), (20, 1, "b")] {
            let d = proc_root.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("stat"),
                format!(
                    "{pid} ({name}) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0\n"
                ),
            )
            .unwrap();
            std::fs::write(d.join("cmdline"), format!("python\0train_{name}.py\0")).unwrap();
            let mut env = b"PATH=/bin\0".to_vec();
            if pid != 1 {
                let ch = Channel::create(&root.join(name), 1).unwrap();
                std::fs::write(
                    ch.dir().join("events"),
                    "{\"type\":\"hello\",\"v\":1,\"pid\":7}\n",
                )
                .unwrap();
                env.extend(format!("OOMGUARD_CONTROL={}\0", ch.dir().display()).bytes());
                if let Some(id) = slurm {
                    env.extend(format!("SLURM_JOB_ID={id}\0").bytes());
                }
                chans.push(ch);
            }
            std::fs::write(d.join("environ"), env).unwrap();
        }
        let b = chans.pop().unwrap();
        (chans.pop().unwrap(), b)
    }

    #[test]
    fn a_target_that_holds_two_jobs_is_refused_with_both_listed() {
        let t = tempfile::tempdir().unwrap();
        for dir in ["a", "b"] {
            std::fs::create_dir(t.path().join(dir)).unwrap();
        }
        let (a, b) = two_jobs(t.path(), None);
        let e = checkpoint(
            &crate::job::attach::Target::Pid(1),
            &t.path().join("proc"),
            Duration::from_millis(100),
        )
        .unwrap_err();
        let AskError::Ambiguous { jobs, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(jobs.iter().map(|j| j.pid).collect::<Vec<_>>(), [10, 20]);
        let text = e.to_string();
        assert!(text.contains("2 different jobs"), "{text}");
        assert!(text.contains("pid 10  python train_a.py"), "{text}");
        assert!(text.contains("pid 20  python train_b.py"), "{text}");
        for ch in [&a, &b] {
            assert!(!ch.dir().join("request").exists(), "nothing is asked");
        }
        // Either job by its own pid is asked alone.
        let _ = checkpoint(
            &crate::job::attach::Target::Pid(20),
            &t.path().join("proc"),
            Duration::from_millis(100),
        );
        assert!(!a.dir().join("request").exists());
        assert!(b.dir().join("request").exists());
    }

    #[test]
    fn the_tasks_of_one_slurm_job_are_each_asked() {
        let t = tempfile::tempdir().unwrap();
        for dir in ["a", "b"] {
            std::fs::create_dir(t.path().join(dir)).unwrap();
        }
        let (a, b) = two_jobs(t.path(), Some("4242"));
        let e = checkpoint(
            &crate::job::attach::Target::Pid(1),
            &t.path().join("proc"),
            Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(matches!(e, AskError::NoAnswer(_)), "{e:?}");
        for ch in [&a, &b] {
            assert!(
                ch.dir().join("request").exists(),
                "{} not asked",
                ch.dir().display()
            );
        }
    }

    #[test]
    fn a_pid_that_does_not_exist_is_said_to_be_none() {
        let t = tempfile::tempdir().unwrap();
        let e = checkpoint(
            &crate::job::attach::Target::Pid(999_999),
            t.path(),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "there is no process 999999: it has ended, or never ran"
        );
    }

    #[test]
    fn a_process_without_a_channel_is_refused_with_its_name() {
        let t = tempfile::tempdir().unwrap();
        let proc_root = t.path();
        std::fs::create_dir_all(proc_root.join("4242")).unwrap();
        std::fs::write(proc_root.join("4242/environ"), b"PATH=/bin\0").unwrap();
        let e = checkpoint(
            &crate::job::attach::Target::Pid(4242),
            proc_root,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("pid 4242 has no control channel"),
            "{e}"
        );
    }
}
