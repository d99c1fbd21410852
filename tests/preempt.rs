//! Losing no work to a signal: a scheduler's preemption or time-limit
//! SIGTERM, its advance warning (`--signal=USR1@90`), an interrupt sent to
//! oomguard, and `oomguard checkpoint` all become a save every rank agrees
//! on. Each test sends the signal to oomguard itself (as `srun` and
//! Kubernetes do: the ranks never get it) while the job trains, and checks
//! the step saved against the steps the ranks printed as completed.
//!
//! The single-rank cases need only python3 (the companion is put on the
//! job's path by `oomguard run`); the two-rank ones use torch's gloo
//! backend from the test environment (`OOMGUARD_TEST_VENV`; skipped
//! without it, failing under CI=true).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::schema::{Event, Line};

fn plain() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py")
}

/// A job under `oomguard run --no-tui --cgroup off`, with its stdout and
/// stderr in files so the test can watch its progress.
struct Live {
    child: Child,
    /// Taken by [`Live::end`].
    dir: Option<tempfile::TempDir>,
    started: Instant,
}

struct Ended {
    code: i32,
    stdout: String,
    stderr: String,
    log: Vec<Line>,
    raw: String,
    /// From the signal to oomguard's exit.
    took: Duration,
    dir: tempfile::TempDir,
}

impl Live {
    fn start(extra: &[&str], argv: &[&str], env: &[(&str, &str)]) -> Live {
        Live::start_in(tempfile::tempdir().unwrap(), extra, argv, env)
    }

    /// [`Live::start`] in `dir` (the job's working directory and its
    /// checkpoints' place): a run again in the same place resumes.
    fn start_in(
        dir: tempfile::TempDir,
        extra: &[&str],
        argv: &[&str],
        env: &[(&str, &str)],
    ) -> Live {
        let mut c = common::oomguard();
        c.current_dir(dir.path());
        c.args(["run", "--no-tui", "--no-notify", "--cgroup", "off", "--log"])
            .arg(dir.path().join("log.ndjson"))
            .args(extra)
            .arg("--")
            .args(argv)
            .env("CKPT_DIR", dir.path())
            .env("LEAK_MB", "0")
            .stdout(fs::File::create(dir.path().join("out")).unwrap())
            .stderr(fs::File::create(dir.path().join("err")).unwrap());
        for (k, v) in env {
            c.env(k, v);
        }
        Live {
            child: c.spawn().unwrap(),
            dir: Some(dir),
            started: Instant::now(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn path(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }

    fn stdout(&self) -> String {
        fs::read_to_string(self.path().join("out")).unwrap_or_default()
    }

    /// Stdout and stderr (frameworks log to either).
    fn output(&self) -> String {
        let err = fs::read_to_string(self.path().join("err")).unwrap_or_default();
        self.stdout() + &err
    }

    /// Waits until `text` is in the job's output (and fails with what
    /// there is when it never comes).
    /// Waits for `text` in the job's output; the line it is on.
    fn wait_for(&mut self, text: &str) -> String {
        let seen = common::wait_for(Duration::from_secs(120), || {
            self.output().contains(text) || self.child.try_wait().unwrap().is_some()
        });
        let out = self.output();
        assert!(
            seen && out.contains(text),
            "no '{text}' after {:.0?}\nstdout tail:\n{}\nstderr:\n{}",
            self.started.elapsed(),
            tail(&self.stdout()),
            fs::read_to_string(self.path().join("err")).unwrap_or_default()
        );
        out.lines()
            .find(|l| l.contains(text.trim_end()))
            .unwrap_or_default()
            .to_string()
    }

    fn signal(&self, sig: &str) -> Instant {
        common::send(self.pid(), sig);
        Instant::now()
    }

    /// Waits for oomguard to exit (60 s at most: the budget is 30).
    fn end(mut self, since: Instant) -> Ended {
        let done = common::wait_for(Duration::from_secs(60), || {
            self.child.try_wait().unwrap().is_some()
        });
        if !done {
            let _ = self.child.kill();
        }
        let status = self.child.wait().unwrap();
        let took = since.elapsed();
        let path = self.path().join("log.ndjson");
        let raw = fs::read_to_string(&path).unwrap_or_default();
        Ended {
            code: status.code().unwrap_or(-1),
            stdout: self.stdout(),
            stderr: fs::read_to_string(self.path().join("err")).unwrap_or_default(),
            log: if raw.is_empty() {
                Vec::new()
            } else {
                common::read_log(&path)
            },
            raw,
            took,
            dir: self.dir.take().unwrap(),
        }
    }
}

impl Drop for Live {
    /// A test that failed midway leaves no job behind: oomguard is killed,
    /// and its death signal (SIGTERM) reaches the job.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

impl Ended {
    fn why(&self) -> String {
        format!(
            "exit {} after {:.1?}\nstderr:\n{}\nstdout tail:\n{}\nlog:\n{}",
            self.code,
            self.took,
            self.stderr,
            tail(&self.stdout),
            self.raw
        )
    }

    /// The step of the last `checkpoint_done`, and its paths.
    fn saved(&self) -> (u64, Vec<PathBuf>) {
        self.log
            .iter()
            .rev()
            .find_map(|l| match &l.event {
                Event::CheckpointDone(v) => Some((
                    v["step"].as_u64()?,
                    v["paths"]
                        .as_array()?
                        .iter()
                        .filter_map(|p| p.as_str().map(PathBuf::from))
                        .collect(),
                )),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no checkpoint_done\n{}", self.why()))
    }

    fn last_completed(&self, rank: u32) -> Option<u64> {
        let prefix = format!("rank {rank} completed step ");
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
            .max()
    }

    fn outcome(&self) -> String {
        common::schema::run_end(&self.log).outcome.clone()
    }

    /// Every rank saved the step it last completed, and left on its own.
    fn every_rank_saved_its_last_step(&self, ranks: u32) -> u64 {
        let (step, _) = self.saved();
        for rank in 0..ranks {
            assert_eq!(
                self.last_completed(rank),
                Some(step),
                "rank {rank} went past the saved step\n{}",
                self.why()
            );
            assert!(
                self.dir
                    .path()
                    .join(format!("ckpt-r{rank}-{step}.json"))
                    .exists(),
                "rank {rank} did not save step {step}\n{}",
                self.why()
            );
            assert!(
                self.stdout.contains(&format!(
                    "rank {rank} left after its checkpoint at step {step}"
                )),
                "rank {rank} did not leave after its save\n{}",
                self.why()
            );
        }
        step
    }
}

/// Two gloo ranks under torchrun, training without a leak.
fn two_ranks(extra: &[&str], env: &[(&str, &str)], port: &str) -> Option<Live> {
    let venv = common::torch_venv()?;
    let torchrun = venv.join("bin/torchrun");
    let mut all_env = vec![("DIST", "1")];
    all_env.extend_from_slice(env);
    Some(Live::start(
        extra,
        &[
            torchrun.to_str().unwrap(),
            "--nproc-per-node",
            "2",
            "--master-port",
            port,
            plain().to_str().unwrap(),
            "100000",
        ],
        &all_env,
    ))
}

/// One rank, no torch: python3 and the companion `oomguard run` injects.
fn one_rank(extra: &[&str], env: &[(&str, &str)]) -> Live {
    Live::start(
        extra,
        &["python3", plain().to_str().unwrap(), "100000"],
        env,
    )
}

fn preempted_by(sig: &str, port: &str) {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some(mut live) = two_ranks(&[], &[], port) else {
        return;
    };
    live.wait_for("rank 1 completed step 20\n");
    let at = live.signal(sig);
    let r = live.end(at);
    assert_eq!(r.code, 75, "{}", r.why());
    let step = r.every_rank_saved_its_last_step(2);
    assert!(step >= 20, "{}", r.why());
    assert_eq!(r.outcome(), "stopped_by_signal", "{}", r.why());
    assert!(
        r.took < Duration::from_secs(30),
        "the end took longer than the 30 s budget\n{}",
        r.why()
    );
    assert!(
        r.stderr
            .contains(&format!("was preempted (SIG{sig}) and saved first")),
        "{}",
        r.why()
    );
    assert!(
        r.stderr.contains(&format!("checkpoint at step {step}"))
            && r.stderr.contains("after the signal"),
        "{}",
        r.why()
    );
}

#[test]
fn serial_a_sigterm_to_oomguard_saves_every_ranks_last_step_and_exits_75() {
    preempted_by("TERM", "29631");
}

#[test]
fn serial_a_sigusr1_to_oomguard_saves_every_ranks_last_step_instead_of_killing_torchrun() {
    preempted_by("USR1", "29632");
}

#[test]
fn serial_a_second_sigterm_during_the_save_changes_nothing() {
    let _serial = common::machine::beside();
    let mut live = one_rank(&[], &[("SAVE_SECONDS", "2")]);
    live.wait_for("rank 0 completed step 10\n");
    let at = live.signal("TERM");
    live.wait_for("rank 0 saving step");
    live.signal("TERM");
    let r = live.end(at);
    assert_eq!(r.code, 75, "{}", r.why());
    r.every_rank_saved_its_last_step(1);
    assert!(
        r.stderr
            .contains("SIGTERM received: the save under way already ends the job"),
        "{}",
        r.why()
    );
    // The second TERM was never passed on: only the save's request.
    let signalled = r.log.iter().any(|l| {
        matches!(&l.event, Event::Action(a) if a.signal.as_deref() == Some("SIGTERM") && a.reason.starts_with("SIGTERM received"))
    });
    assert!(!signalled, "{}", r.why());
}

#[test]
fn serial_a_sigint_to_oomguard_saves_first_and_exits_130() {
    let _serial = common::machine::beside();
    let mut live = one_rank(&[], &[]);
    live.wait_for("rank 0 completed step 10\n");
    let at = live.signal("INT");
    let r = live.end(at);
    assert_eq!(r.code, 130, "{}", r.why());
    r.every_rank_saved_its_last_step(1);
    assert!(r.stderr.contains("was interrupted (Ctrl-C)"), "{}", r.why());
}

#[test]
fn serial_a_second_sigint_during_the_save_kills_at_once() {
    let _serial = common::machine::beside();
    let mut live = one_rank(&[], &[("SAVE_SECONDS", "20")]);
    live.wait_for("rank 0 completed step 10\n");
    let at = live.signal("INT");
    live.wait_for("rank 0 saving step");
    live.signal("INT");
    let r = live.end(at);
    assert!(
        r.took < Duration::from_secs(10),
        "a second interrupt must not wait for the save\n{}",
        r.why()
    );
    assert!(
        r.log.iter().any(|l| matches!(&l.event, Event::Action(a) if a.action == "kill" && a.reason == "second interrupt")),
        "{}",
        r.why()
    );
}

#[test]
fn serial_the_stop_code_is_a_setting() {
    let _serial = common::machine::beside();
    let mut live = one_rank(&["--stop-code", "138"], &[]);
    live.wait_for("rank 0 completed step 10\n");
    let at = live.signal("TERM");
    let r = live.end(at);
    assert_eq!(r.code, 138, "{}", r.why());
    r.every_rank_saved_its_last_step(1);
    for taken in ["70", "74", "76"] {
        let out = common::oomguard()
            .args(["run", "--stop-code", taken, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--stop-code {taken}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("already means"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Without a companion, a USR1 is passed on only to a process that catches
/// or ignores it: one that does neither would die of it (exit 138, no
/// save, a cause nobody guesses) and gets SIGTERM instead.
#[test]
fn serial_without_a_companion_usr1_never_kills_a_process_that_does_not_catch_it() {
    let _serial = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let deaf = common::script(
        dir.path(),
        "deaf.py",
        "import time\nprint('ready', flush=True)\ntime.sleep(60)\n",
    );
    let mut live = Live::start(
        &["--no-companion"],
        &["python3", deaf.to_str().unwrap()],
        &[],
    );
    live.wait_for("ready\n");
    let at = live.signal("USR1");
    let r = live.end(at);
    assert_ne!(r.code, 128 + libc::SIGUSR1, "died of USR1\n{}", r.why());
    // The warning still requeues: the stop code, though nothing was saved.
    assert_eq!(r.code, 75, "{}", r.why());
    let substituted = r.log.iter().any(|l| {
        matches!(&l.event, Event::Action(a) if a.signal.as_deref() == Some("SIGTERM")
            && a.reason.contains("neither catches nor ignores it, so SIGTERM instead"))
    });
    assert!(substituted, "{}", r.why());

    let catcher = common::script(
        dir.path(),
        "catcher.py",
        "import signal, sys, time\n\
         def on_usr1(*_):\n    print('got USR1', flush=True)\n    sys.exit(0)\n\
         signal.signal(signal.SIGUSR1, on_usr1)\n\
         print('ready', flush=True)\ntime.sleep(60)\n",
    );
    let mut live = Live::start(
        &["--no-companion"],
        &["python3", catcher.to_str().unwrap()],
        &[],
    );
    live.wait_for("ready\n");
    let at = live.signal("USR1");
    let r = live.end(at);
    // It handles the warning itself: its exit stands.
    assert_eq!(r.code, 0, "{}", r.why());
    assert!(r.stdout.contains("got USR1"), "{}", r.why());
}

/// A scheduler's warning during start-up (a Python job still loading, its
/// companion not yet spoken): no save can be made, the job ends of the
/// SIGTERM it gets instead, and the run still ends with the stop code, so
/// the recipe requeues it; `run_end` says no save was made and why. A bare
/// TERM keeps its meaning (143).
#[test]
fn serial_a_usr1_while_the_job_is_still_loading_ends_with_the_stop_code_and_no_save() {
    let _serial = common::machine::beside();
    let body = "import time\nprint('loading', flush=True)\ntime.sleep(10)\n\
                import oomguard\ng = oomguard.guard()\nfor i in range(1000):\n    g.step(i)\n    time.sleep(0.05)\n";
    for (sig, code) in [("USR1", 75), ("USR2", 75), ("TERM", 143)] {
        let dir = tempfile::tempdir().unwrap();
        let job = common::script(dir.path(), "train.py", body);
        let mut live = Live::start(&[], &["python3", job.to_str().unwrap()], &[]);
        live.wait_for("loading\n");
        let at = live.signal(sig);
        let r = live.end(at);
        assert_eq!(r.code, code, "{sig}: {}", r.why());
        let saved = r
            .log
            .iter()
            .any(|l| matches!(l.event, Event::CheckpointDone(_)));
        assert!(!saved, "{sig}: a save?\n{}", r.why());
        let end = common::schema::run_end(&r.log);
        if code == 75 {
            assert_eq!(end.outcome, "stopped_by_signal", "{}", r.why());
            let why = end.not_saved.clone().unwrap_or_default();
            assert!(
                why.contains("no companion had spoken"),
                "{sig}: {why}\n{}",
                r.why()
            );
            assert!(r.stderr.contains("ended with no save"), "{}", r.why());
        } else {
            assert_eq!(end.not_saved, None, "{}", r.why());
        }
    }
}

/// `oomguard ended --requeue` in the run's directory, as the recipe runs
/// it: its exit code and stderr.
fn ended_in(dir: &Path) -> (Option<i32>, String) {
    let out = common::oomguard()
        .args(["ended", "--requeue"])
        .current_dir(dir)
        .env("SLURM_JOB_ID", "77")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The end record decides the recipe's requeue. The time limit's warning
/// (USR1) is requeued, though the job was still loading and nothing was
/// saved; the third such stop in a row, none past the step it resumed
/// from, exits 78 and is not. A SIGTERM after a save (a person's
/// `scancel`) exits 75 and is not requeued either; the count of stops
/// without progress, carried by the end record across runs that saved
/// nothing, starts again after a run that saved.
#[test]
fn serial_oomguard_ended_requeues_a_warning_but_not_a_cancel_nor_a_third_stop_without_progress() {
    let _serial = common::machine::beside();
    let mut dir = tempfile::tempdir().unwrap();
    let slow = common::script(
        dir.path(),
        "slow.py",
        "import time\nprint('loading', flush=True)\ntime.sleep(20)\n",
    );
    let slurm = [("SLURM_JOB_ID", "77")];
    for (run, want) in [(1, 75), (2, 75), (3, 78)] {
        let mut live = Live::start_in(dir, &[], &["python3", slow.to_str().unwrap()], &slurm);
        live.wait_for("loading\n");
        let at = live.signal("USR1");
        let r = live.end(at);
        assert_eq!(r.code, want, "run {run}: {}", r.why());
        let (code, why) = ended_in(r.dir.path());
        if want == 75 {
            assert_eq!(code, Some(0), "run {run}: {why}");
            assert!(why.contains("SIGUSR1"), "{why}");
        } else {
            assert_eq!(code, Some(1), "run {run}: {why}");
            assert!(
                why.contains("stopped 3 times before its first save without progress"),
                "{why}"
            );
            assert!(
                r.stderr.contains("not to be requeued (exit 78)"),
                "{}",
                r.why()
            );
        }
        dir = r.dir;
    }
    let job = plain();
    let mut live = Live::start_in(dir, &[], &["python3", job.to_str().unwrap(), "400"], &slurm);
    live.wait_for("rank 0 completed step 5\n");
    let at = live.signal("TERM");
    let r = live.end(at);
    assert_eq!(r.code, 75, "{}", r.why());
    let (code, why) = ended_in(r.dir.path());
    assert_eq!(code, Some(1), "{why}");
    assert!(why.contains("SIGTERM") && why.contains("scancel"), "{why}");
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(r.dir.path().join(".oomguard-end.json")).unwrap())
            .unwrap();
    assert_eq!(
        rec["stops_without_progress"], 0,
        "a save is progress: {rec}"
    );
}

/// `oomguard checkpoint PID`: every rank saves one step, the `done`
/// record is printed, and training goes on.
#[test]
fn serial_oomguard_checkpoint_saves_a_running_job_and_training_goes_on() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some(mut live) = two_ranks(&[], &[], "29633") else {
        return;
    };
    live.wait_for("rank 1 completed step 10\n");
    let job = common::children_of(live.pid())
        .into_iter()
        .map(|c| c.0)
        .find(|&p| !common::is_keeper(p))
        .unwrap();
    let out = common::oomguard()
        .args(["checkpoint", &job.to_string(), "--timeout", "60s"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{said}\n{err}");
    let done: serde_json::Value = serde_json::from_str(said.trim()).unwrap();
    assert_eq!(done["type"], "done", "{said}");
    assert_eq!(done["ok"], true, "{said}");
    let step = done["step"].as_u64().unwrap();
    // Training goes on past the saved step, on both ranks.
    live.wait_for(&format!("rank 1 completed step {}\n", step + 20));
    live.wait_for(&format!("rank 0 completed step {}\n", step + 20));
    let at = live.signal("TERM");
    let r = live.end(at);
    for rank in 0..2 {
        assert!(
            r.dir
                .path()
                .join(format!("ckpt-r{rank}-{step}.json"))
                .exists(),
            "rank {rank} did not save step {step}\n{}",
            r.why()
        );
    }
    assert_eq!(r.code, 75, "{}", r.why());
}

/// `oomguard checkpoint` refused on a Python job (`body`) that `oomguard
/// run` started with `extra`, once it printed `ready`: its stderr.
fn checkpoint_refused(extra: &[&str], body: &str, ready: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let job = common::script(dir.path(), "job.py", body);
    let mut live = Live::start(extra, &["python3", job.to_str().unwrap()], &[]);
    live.wait_for(ready);
    let job = common::children_of(live.pid())
        .into_iter()
        .map(|c| c.0)
        .find(|&p| !common::is_keeper(p))
        .unwrap();
    let out = common::oomguard()
        .args(["checkpoint", &job.to_string(), "--timeout", "5s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    let at = live.signal("TERM");
    live.end(at);
    err
}

#[test]
fn serial_oomguard_checkpoint_says_why_a_job_without_a_companion_cannot_save() {
    let _serial = common::machine::beside();
    let err = checkpoint_refused(
        &["--no-companion"],
        "import time\nfor i in range(100000):\n    print('step', i, flush=True)\n    time.sleep(0.05)\n",
        "step 5\n",
    );
    assert!(err.contains("has no control channel"), "{err}");
}

/// A save whose file is empty (a write cut short, a full disk) does not
/// count: the log says why, nothing is said to be saved, and no resume
/// record is left for the next run to load it from.
#[test]
fn serial_a_save_whose_file_is_empty_does_not_count() {
    let _serial = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = common::script(
        dir.path(),
        "empty_save.py",
        "import os, time\nimport oomguard\ng = oomguard.guard()\n\
         for step in range(1, 100000):\n    print('completed step %d' % step, flush=True)\n\
         \x20   if g.step(step):\n\
         \x20       path = os.path.join(os.environ['CKPT_DIR'], 'empty-%d.pt' % step)\n\
         \x20       open(path, 'w').close()\n\
         \x20       g.checkpointed([path])\n\
         \x20       if g.should_exit():\n            break\n\
         \x20   time.sleep(0.05)\n",
    );
    let mut live = Live::start(&[], &["python3", job.to_str().unwrap()], &[]);
    live.wait_for("completed step 5\n");
    let at = live.signal("TERM");
    let r = live.end(at);
    let done = r
        .log
        .iter()
        .find_map(|l| match &l.event {
            Event::CheckpointDone(v) => Some(v.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no checkpoint_done\n{}", r.why()));
    assert_eq!(done["ok"], false, "{}", r.why());
    let why = done["not_counted"].as_str().unwrap_or_default();
    assert!(why.ends_with(".pt is empty"), "{why}\n{}", r.why());
    assert!(r.stderr.contains("does not count"), "{}", r.why());
    assert!(!r.stderr.contains("saved first"), "{}", r.why());
    assert!(
        !r.dir.path().join(".oomguard-resume.json").exists(),
        "a resume record of an empty save\n{}",
        r.why()
    );
}

/// A shell that started two jobs, each under `oomguard run` with a
/// companion that has spoken: `oomguard checkpoint <the shell>` does not
/// pick one by pid order; it exits 2 and lists both. Each job by its own
/// pid is asked alone.
#[test]
fn serial_oomguard_checkpoint_of_a_shell_with_two_jobs_refuses_and_lists_both() {
    let _serial = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let og = env!("CARGO_BIN_EXE_oomguard");
    let plain = plain();
    let script = format!(
        "cd {d}/a && {og} run -q --no-tui --cgroup off -- python3 {p} 100000 > out 2>&1 &\n\
         cd {d}/b && {og} run -q --no-tui --cgroup off -- python3 {p} 100000 > out 2>&1 &\n\
         wait\n",
        d = dir.path().display(),
        p = plain.display()
    );
    for job in ["a", "b"] {
        fs::create_dir(dir.path().join(job)).unwrap();
    }
    common::deadline::arm();
    let mut shell = Command::new("sh")
        .args(["-c", &script])
        .env("CKPT_DIR", dir.path())
        .env("LEAK_MB", "0")
        .env_remove("OOMGUARD_CONTROL")
        .process_group(0)
        .spawn()
        .unwrap();
    let stepped = |job: &str| {
        fs::read_to_string(dir.path().join(job).join("out"))
            .unwrap_or_default()
            .contains("completed step 3")
    };
    assert!(common::wait_for(Duration::from_secs(60), || stepped("a") && stepped("b")));
    let out = common::oomguard()
        .args(["checkpoint", &shell.id().to_string(), "--timeout", "5s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    // The shell's whole group: both oomguards end their jobs.
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{}", shell.id())])
        .status();
    let _ = shell.wait();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("2 different jobs"), "{err}");
    for job in ["a", "b"] {
        assert!(
            err.contains(&format!("/{job})")),
            "job {job} not listed: {err}"
        );
    }
    assert_eq!(err.matches(plain.to_str().unwrap()).count(), 2, "{err}");
}

/// A Python job under `oomguard run` that has not completed a step: its
/// companion has not spoken, and `oomguard checkpoint` says that, with how
/// long ago the job started, not that the job does not load it.
#[test]
fn serial_oomguard_checkpoint_says_a_starting_job_has_not_spoken_yet() {
    let _serial = common::machine::beside();
    let err = checkpoint_refused(
        &[],
        "import time\nprint('importing', flush=True)\ntime.sleep(60)\n",
        "importing\n",
    );
    assert!(err.contains("has not spoken yet (started "), "{err}");
    let age: f64 = err
        .split("(started ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.trim_end_matches('s').parse().ok())
        .unwrap_or_else(|| panic!("no age in {err}"));
    assert!(age < 30.0, "the job started seconds ago: {err}");
    assert!(!err.contains("is not a Python job"), "{err}");
}

/// oomguard as a container's PID 1 (Kubernetes' entrypoint): the kernel
/// drops a signal to a namespace's init that it does not handle, so
/// oomguard must handle TERM itself, and a TERM from outside saves.
#[test]
fn serial_as_pid_1_a_sigterm_from_outside_saves_and_exits_75() {
    let _serial = common::machine::beside();
    let root = rustix::process::geteuid().is_root();
    let unshare = Path::new("/usr/bin/unshare").exists();
    if !common::require(root && unshare, "root and unshare(1) for a PID namespace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    common::deadline::arm();
    let mut child = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "--no-tui", "--no-notify", "--cgroup", "off", "--"])
        .args(["python3", plain().to_str().unwrap(), "100000"])
        .env("CKPT_DIR", dir.path())
        .env("LEAK_MB", "0")
        .env_remove("OOMGUARD_CONTROL")
        .stdin(Stdio::null())
        .stdout(fs::File::create(dir.path().join("out")).unwrap())
        .stderr(fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    let out = || fs::read_to_string(dir.path().join("out")).unwrap_or_default();
    assert!(
        common::wait_for(Duration::from_secs(60), || out()
            .contains("rank 0 completed step 10\n")),
        "{}",
        out()
    );
    // unshare's child is oomguard, PID 1 inside.
    let og = common::children_of(child.id())
        .into_iter()
        .map(|c| c.0)
        .next()
        .unwrap();
    let status = fs::read_to_string(format!("/proc/{og}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.trim_end().ends_with("\t1")),
        "oomguard is not PID 1 of its namespace\n{status}"
    );
    common::send(og, "TERM");
    assert!(common::wait_for(Duration::from_secs(60), || child
        .try_wait()
        .unwrap()
        .is_some()));
    let code = child.wait().unwrap().code();
    let err = fs::read_to_string(dir.path().join("err")).unwrap_or_default();
    assert_eq!(code, Some(75), "{err}\n{}", out());
    let step = out()
        .lines()
        .filter_map(|l| l.strip_prefix("rank 0 left after its checkpoint at step "))
        .next()
        .map(str::to_string);
    assert!(step.is_some(), "no save\n{err}\n{}", out());
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jobs/companion")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// A framework script (unmodified but for its step lines) under the torch
/// environment's Python, in `dir`.
fn framework(dir: tempfile::TempDir, script: &str, extra: &[&str], py: &Path) -> Live {
    Live::start_in(
        dir,
        extra,
        &[py.to_str().unwrap(), &fixture(script), "100000"],
        &[
            ("LEAK_ONLY_ATTEMPT", "0"),
            ("STEP_SECONDS", "0.02"),
            ("PRINT_STEPS", "1"),
            ("TRANSFORMERS_VERBOSITY", "info"),
        ],
    )
}

/// SIGTERM to oomguard saves an unmodified framework script's last step
/// (exit 75); the same command run again resumes from that step, a
/// changed one does not, nor does one with --fresh.
fn framework_is_preempted_and_resumes(script: &str, resumed: impl Fn(u64) -> String) {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some(venv) = common::torch_venv() else {
        return;
    };
    common::deadline::arm_for(Duration::from_secs(600));
    let py = venv.join("bin/python");
    let mut live = framework(tempfile::tempdir().unwrap(), script, &[], &py);
    live.wait_for("completed step 30\n");
    let at = live.signal("TERM");
    let r = live.end(at);
    assert_eq!(r.code, 75, "{}", r.why());
    let (step, _) = r.saved();
    assert!(r.took < Duration::from_secs(30), "{}", r.why());
    assert!(
        r.dir.path().join(".oomguard-resume.json").exists(),
        "{}",
        r.why()
    );

    // The same command again: resumes from the saved step.
    let mut live = framework(r.dir, script, &[], &py);
    live.wait_for(&resumed(step));
    live.wait_for(&format!("completed step {}\n", step + 5));
    let at = live.signal("TERM");
    let again = live.end(at);
    assert!(
        again.stderr.contains("resuming from the save of step"),
        "{}",
        again.why()
    );
    assert_eq!(again.code, 75, "{}", again.why());
    let (step2, _) = again.saved();
    assert!(step2 > step, "{step2} after {step}\n{}", again.why());

    // A changed command does not resume: it says why and starts afresh.
    let mut live = Live::start_in(
        again.dir,
        &[],
        &[py.to_str().unwrap(), &fixture(script), "99999"],
        &[
            ("LEAK_ONLY_ATTEMPT", "0"),
            ("STEP_SECONDS", "0.02"),
            ("PRINT_STEPS", "1"),
            ("TRANSFORMERS_VERBOSITY", "info"),
        ],
    );
    live.wait_for("completed step 3\n");
    let at = live.signal("TERM");
    let changed = live.end(at);
    assert!(
        changed.stderr.contains("not resuming from") && changed.stderr.contains("it was saved by"),
        "{}",
        changed.why()
    );
    let all = format!("{}{}", changed.stdout, changed.stderr);
    assert!(!all.contains(&resumed(step2)), "{}", changed.why());

    // --fresh: the record of the same command is set aside. And USR1
    // (`#SBATCH --signal=USR1@N`) saves the same way as TERM.
    let mut live = framework(changed.dir, script, &["--fresh"], &py);
    live.wait_for("completed step 3\n");
    let at = live.signal("USR1");
    let fresh = live.end(at);
    let all = format!("{}{}", fresh.stdout, fresh.stderr);
    assert!(!all.contains("resuming from the save"), "{}", fresh.why());
    assert_eq!(fresh.code, 75, "{}", fresh.why());
    let (usr1_step, _) = fresh.saved();
    assert!(usr1_step >= 3, "{}", fresh.why());
    assert!(fresh.took < Duration::from_secs(30), "{}", fresh.why());
}

#[test]
fn serial_lightning_is_preempted_with_a_save_and_resumes_when_run_again() {
    framework_is_preempted_and_resumes("lightning_job.py", |_| {
        "Restoring states from the checkpoint path at".to_string()
    });
}

#[test]
fn serial_the_hf_trainer_is_preempted_with_a_save_and_resumes_when_run_again() {
    framework_is_preempted_and_resumes("hf_job.py", |step| {
        format!("Resuming training from checkpoint with epoch 0 and global step {step}")
    });
}

/// A SIGTERM that arrives while Lightning validates (no training step for
/// `seconds`) under `--signal-budget 30s`.
fn lightning_validating(val_seconds: &str) -> Option<(Ended, u64)> {
    let venv = common::torch_venv()?;
    common::deadline::arm_for(Duration::from_secs(300));
    let py = venv.join("bin/python");
    let mut live = Live::start_in(
        tempfile::tempdir().unwrap(),
        &[],
        &[py.to_str().unwrap(), &fixture("lightning_job.py"), "100000"],
        &[
            ("LEAK_ONLY_ATTEMPT", "0"),
            ("STEP_SECONDS", "0.02"),
            ("PRINT_STEPS", "1"),
            ("VAL_EVERY", "40"),
            ("VAL_BATCHES", "4"),
            ("VAL_SECONDS", val_seconds),
        ],
    );
    let line = live.wait_for("validation started after step ");
    let val_step = line
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{line:?}"));
    let at = live.signal("TERM");
    Some((live.end(at), val_step))
}

/// A request that arrives during a validation loop is served at the next
/// training step: the save is of the step after the validation, inside the
/// budget.
#[test]
fn serial_a_signal_during_a_short_validation_is_served_at_the_next_step() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some((r, val_step)) = lightning_validating("1") else {
        return;
    };
    assert_eq!(r.code, 75, "{}", r.why());
    let (step, _) = r.saved();
    assert_eq!(step, val_step + 1, "{}", r.why());
    assert!(r.took < Duration::from_secs(30), "{}", r.why());
    assert!(!r.stderr.contains("did not acknowledge"), "{}", r.why());
}

/// A validation loop longer than the wait for the acknowledgement (half
/// the save's part of the budget): the trainer gets the checkpoint signal
/// instead, the log says so, and the end still comes inside the budget.
#[test]
fn serial_a_signal_during_a_validation_longer_than_the_budget_falls_back_and_says_so() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some((r, _)) = lightning_validating("5") else {
        return;
    };
    assert!(
        r.stderr
            .contains("the companion did not acknowledge the checkpoint request within"),
        "{}",
        r.why()
    );
    assert!(r.took < Duration::from_secs(32), "{}", r.why());
}

/// The plain loop resumes through `resume_path()`: the same command run
/// again after a SIGTERM's save starts from the saved step, and a run that
/// ends normally leaves nothing to resume.
#[test]
fn serial_a_plain_loop_run_again_resumes_from_the_step_its_preemption_saved() {
    let _serial = common::machine::beside();
    let plain = plain();
    let argv = ["python3", plain.to_str().unwrap(), "300"];
    let mut live = Live::start(&[], &argv, &[]);
    live.wait_for("rank 0 completed step 10\n");
    let at = live.signal("TERM");
    let r = live.end(at);
    assert_eq!(r.code, 75, "{}", r.why());
    let (step, _) = r.saved();
    let record = r.dir.path().join(".oomguard-resume.json");
    assert!(record.exists(), "{}", r.why());
    let live = Live::start_in(r.dir, &[], &argv, &[]);
    let again = live.end(Instant::now());
    assert_eq!(again.code, 0, "{}", again.why());
    assert!(
        again
            .stdout
            .contains(&format!("rank 0 resumed from step {step}\n")),
        "{}",
        again.why()
    );
    assert!(
        !again
            .stdout
            .contains(&format!("rank 0 completed step {step}\n")),
        "step {step} was trained again\n{}",
        again.why()
    );
    assert!(!record.exists(), "a finished job left its record");
}
