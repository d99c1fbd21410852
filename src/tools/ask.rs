//! `oomguard checkpoint TARGET`: asks a running job's companion to save
//! now, and training goes on. The job is named as for `attach`; its
//! control directory is the one `oomguard run` named in the job's
//! environment (`OOMGUARD_CONTROL`). The request is written there as the
//! supervising oomguard writes its own, and the answer is the companion's
//! `done` record, printed as JSON on stdout.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    #[error("the companion did not finish a save within {0}")]
    NoAnswer(String),
    #[error("the companion reports that the checkpoint failed: {0}")]
    Failed(String),
}

/// Asks the job `target` names for a checkpoint and waits up to `timeout`
/// for its `done` record, which is returned as a JSON line.
pub fn checkpoint(
    target: &crate::job::attach::Target,
    proc_root: &Path,
    timeout: Duration,
) -> Result<String, AskError> {
    let spec = crate::job::attach::resolve(target, proc_root)?;
    if !proc_root.join(spec.pid.to_string()).exists() {
        return Err(AskError::NoSuchProcess(spec.pid));
    }
    let mut pids: BTreeSet<u32> = crate::job::attach::descendants(proc_root, spec.pid)
        .into_iter()
        .collect();
    pids.insert(spec.pid);
    let dir = pids
        .iter()
        .find_map(|&pid| Channel::of_process(proc_root, pid))
        .ok_or_else(|| AskError::NoChannel {
            label: spec.label.clone(),
        })?;
    let mut ch = Channel::join(&dir)?;
    let said = ch.poll();
    if !said.iter().any(|r| matches!(r, Record::Hello { .. })) {
        let age = age(proc_root, spec.pid);
        return Err(AskError::Silent { dir, age });
    }
    if let Some((id, left)) = pending(&dir, &said) {
        return Err(AskError::Busy { dir, id, left });
    }
    let id = ch.request(Kind::Checkpoint, "oomguard checkpoint", None, timeout)?;
    let began = Instant::now();
    while began.elapsed() < timeout {
        for r in ch.poll() {
            if let Record::Done { id: done, ok, .. } = &r
                && *done == id
            {
                let line = serde_json::to_string(&r).unwrap_or_default();
                return if *ok {
                    Ok(line)
                } else {
                    Err(AskError::Failed(line))
                };
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(AskError::NoAnswer(crate::vocab::units::human_duration(
        timeout,
    )))
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
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
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
