//! Checkpoint on request, end to end: oomguard stops a leaking trainer by
//! asking its companion for a checkpoint, and the checkpoint holds the last
//! completed step. A plain loop (the package's API, no torch), unmodified
//! Lightning and Hugging Face scripts (the callbacks come on their own),
//! and two torchrun ranks that must save the same step. Every run is a
//! normal user's: `--cgroup off` and a `--budget`, no root needed.
//!
//! The torch tests use the virtual environment `.ci/run` builds
//! (`OOMGUARD_TEST_VENV`, default `~/.cache/oomguard/test-venv`): they skip
//! without it, and fail under CI=true.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::schema::Event;

fn job(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jobs/companion")
        .join(name)
}

struct Run {
    out: Output,
    log: Vec<common::schema::Line>,
    raw: String,
    dir: tempfile::TempDir,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }
    /// The step of the companion's last `checkpoint_done` (the stop's; the
    /// `checkpoint` rule may have asked for one before), and its paths.
    fn done(&self) -> Option<(u64, Vec<PathBuf>)> {
        self.log.iter().rev().find_map(|l| match &l.event {
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
    }
    fn has(&self, pred: impl Fn(&Event) -> bool) -> bool {
        self.log.iter().any(|l| pred(&l.event))
    }
    /// The stop's checkpoint, which must be there.
    fn saved(&self) -> (u64, Vec<PathBuf>) {
        self.done()
            .unwrap_or_else(|| panic!("no checkpoint_done\n{}", self.why()))
    }
    /// Stdout and stderr together (frameworks log to either).
    fn all(&self) -> String {
        format!("{}{}", self.stdout(), self.stderr())
    }
    /// Signals the stop sent (names), in order.
    fn stop_signals(&self) -> Vec<Option<String>> {
        self.log
            .iter()
            .filter_map(|l| match &l.event {
                Event::Action(a) if a.action == "stop" || a.action == "restart" => {
                    Some(a.signal.clone())
                }
                _ => None,
            })
            .collect()
    }
    fn why(&self) -> String {
        format!(
            "exit {}\nstderr:\n{}\nstdout tail:\n{}\nlog:\n{}",
            self.code(),
            self.stderr(),
            self.stdout()
                .lines()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .join("\n"),
            self.raw
        )
    }
}

/// `oomguard run --cgroup off --budget BUDGET [extra] -- argv` with the
/// job's checkpoints in a fresh directory (`CKPT_DIR`).
fn run(budget: &str, extra: &[&str], argv: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.ndjson");
    let mut c = common::oomguard();
    c.args([
        "run", "--no-tui", "--cgroup", "off", "--budget", budget, "--log",
    ])
    .arg(&log)
    .args(extra)
    .arg("--")
    .args(argv)
    .env("CKPT_DIR", dir.path())
    .env_remove("OOMGUARD_CONTROL");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let raw = fs::read_to_string(&log).unwrap_or_default();
    let log = common::read_log(&log);
    Run { out, log, raw, dir }
}

/// The last step every rank printed as completed.
fn last_completed(stdout: &str, rank: u32) -> Option<u64> {
    let prefix = format!("rank {rank} completed step ");
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .max()
}

/// `script` (a fixture) run by the torch environment's Python under a
/// 1.5 GB budget, with the Python it used; None when there is no
/// environment (skipped outside CI).
fn torch_script(
    script: &str,
    extra: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<(Run, PathBuf)> {
    let py = common::torch_venv()?.join("bin/python");
    let script = job(script);
    let mut argv = vec![py.to_str().unwrap(), script.to_str().unwrap()];
    argv.extend(args);
    Some((run("1500M", extra, &argv, env), py))
}

fn plain() -> String {
    job("plain.py").to_string_lossy().into_owned()
}

#[test]
fn serial_a_plain_loop_is_stopped_with_a_checkpoint_of_its_last_step() {
    let _serial = common::machine::beside();
    let r = run("400M", &[], &["python3", &plain()], &[]);
    assert_eq!(r.code(), 75, "{}", r.why());
    let (step, paths) = r.saved();
    assert_eq!(Some(step), last_completed(&r.stdout(), 0), "{}", r.why());
    assert_eq!(
        paths,
        vec![r.dir.path().join(format!("ckpt-r0-{step}.json"))]
    );
    assert!(paths[0].exists());
    assert!(r.has(|e| matches!(e, Event::CheckpointRequest(_))));
    assert!(r.has(|e| matches!(e, Event::CheckpointAck(_))));
    // The request replaced the signal: the trainer was never signalled.
    assert_eq!(r.stop_signals(), vec![None], "{}", r.why());
    // Said once (by the summary), with the file it saved.
    let said: Vec<String> = r
        .stderr()
        .lines()
        .filter(|l| l.contains(&format!("checkpoint at step {step} (")))
        .map(str::to_string)
        .collect();
    assert_eq!(said.len(), 1, "{}", r.why());
    assert!(said[0].contains("0 steps lost"), "{}", r.why());
    assert!(
        said[0].ends_with(&format!(": {}", paths[0].display())),
        "{}",
        r.why()
    );
}

/// A stop is one decision, whatever it took: the log counts each of its
/// `action` lines (here the request, then SIGTERM to a process the trainer
/// left behind), the summary counts one stop and names its parts.
#[test]
fn serial_one_stop_is_counted_as_one_stop() {
    let _serial = common::machine::beside();
    let cmd = format!("sleep 60 & exec python3 {}", plain());
    let r = run("400M", &[], &["bash", "-c", &cmd], &[]);
    assert_eq!(r.code(), 75, "{}", r.why());
    let logged = r
        .log
        .iter()
        .filter(|l| matches!(&l.event, Event::Action(a) if a.action == "stop"))
        .count();
    assert!(logged >= 2, "the stop's parts were not logged\n{}", r.why());
    let end = common::schema::run_end(&r.log);
    assert_eq!(end.actions.get("stop").copied(), Some(logged as u32));
    let actions = r
        .stderr()
        .lines()
        .find(|l| l.starts_with("oomguard: actions: "))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no actions line\n{}", r.why()));
    assert!(actions.contains("stop ×1 ("), "{actions}");
    assert!(actions.contains("tree cleanup"), "{actions}");
}

/// The control: without the companion the stop is SIGTERM, which a plain
/// loop does not catch: no checkpoint. (The package is importable as if
/// installed, with no oomguard channel to talk to.)
#[test]
fn serial_without_the_companion_the_plain_loop_loses_its_work() {
    let _serial = common::machine::beside();
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let r = run(
        "400M",
        &["--no-companion"],
        &["python3", &plain()],
        &[("PYTHONPATH", pkg.to_str().unwrap())],
    );
    assert_eq!(r.code(), 75, "{}", r.why());
    assert!(r.done().is_none());
    assert_eq!(r.stop_signals(), vec![Some("SIGTERM".to_string())]);
    let saved = fs::read_dir(r.dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("ckpt-"));
    assert!(!saved, "a checkpoint without the companion?");
    // Said once the loop showed progress, before the stop.
    let err = r.stderr();
    let warned = err
        .find("a stop would lose the work")
        .unwrap_or_else(|| panic!("no warning\n{}", r.why()));
    assert!(warned < err.find("critical").unwrap_or(usize::MAX), "{err}");
}

#[test]
fn serial_a_restart_resumes_from_the_companions_checkpoint() {
    let _serial = common::machine::beside();
    let r = run(
        "400M",
        &["--on-critical", "restart", "--restart-delay", "1s"],
        &["python3", &plain(), "120"],
        &[],
    );
    assert_eq!(r.code(), 0, "{}", r.why());
    let (step, _) = r.saved();
    let out = r.stdout();
    assert!(
        out.contains(&format!("rank 0 resumed from step {step}")),
        "{}",
        r.why()
    );
    assert!(out.contains("rank 0 finished at step 120"), "{}", r.why());
    // The second attempt did not redo the first's steps.
    let redone = out
        .lines()
        .filter(|l| *l == format!("rank 0 completed step {step}"))
        .count();
    assert_eq!(redone, 1, "{}", r.why());
    // The report counts the steps lost from the companion's exact steps.
    let report = common::oomguard()
        .args(["report", "--format", "text"])
        .arg(r.dir.path().join("log.ndjson"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    let want =
        format!("attempt 2 resumed from the companion's checkpoint at step {step}: 0 steps lost");
    assert!(text.contains(&want), "{text}");
    assert!(
        text.contains(&format!("checkpoint at step {step}")),
        "{text}"
    );
}

#[test]
fn serial_an_unmodified_lightning_script_saves_its_last_step() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some((r, py)) = torch_script("lightning_job.py", &[], &[], &[]) else {
        return;
    };
    assert_eq!(r.code(), 75, "{}", r.why());
    let (step, paths) = r.saved();
    let ended = format!("fit ended at global step {step}");
    assert!(r.stdout().contains(&ended), "{}", r.why());
    let ckpt = &paths[0];
    assert_eq!(
        ckpt.parent().unwrap(),
        r.dir.path().join("checkpoints"),
        "not where Lightning puts checkpoints"
    );
    let check = std::process::Command::new(&py)
        .arg("-c")
        .arg("import sys, torch; print(torch.load(sys.argv[1], weights_only=False)['global_step'])")
        .arg(ckpt)
        .output()
        .unwrap();
    let saved = String::from_utf8_lossy(&check.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&check.stderr);
    assert_eq!(saved, step.to_string(), "{err}");
    assert_eq!(r.stop_signals(), vec![None], "{}", r.why());
    assert!(!r.stderr().contains("PyTorch Lightning"), "{}", r.why());
    // Lightning's own ModelCheckpoint does not save the same step again
    // (`…-v1.ckpt`), the companion's save says nothing about
    // `weights_only`, and the fit's end is said in the job's output.
    let files: Vec<String> = std::fs::read_dir(ckpt.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !files.iter().any(|f| f.contains("-v1")),
        "a second checkpoint of the step: {files:?}"
    );
    let all = format!("{}{}", r.stdout(), r.stderr());
    assert!(!all.contains("weights_only"), "{}", r.why());
    assert!(
        all.contains(&format!(
            "oomguard: stopping the fit after the checkpoint at step {step} ("
        )),
        "no stop line in the job's output\n{}",
        r.why()
    );
}

/// The control, and the warning: without the companion Lightning gets
/// SIGTERM, which it catches (so the `SigCgt` check is satisfied) only to
/// end `fit` at the next step: nothing is saved, and oomguard says so
/// because the job's output showed Lightning's banner.
#[test]
fn serial_lightning_without_the_companion_is_warned_about() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some((r, _)) = torch_script("lightning_job.py", &["--no-companion"], &[], &[]) else {
        return;
    };
    assert_eq!(
        r.stop_signals(),
        vec![Some("SIGTERM".to_string())],
        "{}",
        r.why()
    );
    assert!(r.done().is_none(), "{}", r.why());
    assert!(
        !r.dir.path().join("checkpoints").exists(),
        "Lightning saved on SIGTERM?\n{}",
        r.why()
    );
    let err = r.stderr();
    assert!(
        err.contains(
            "the trainer is PyTorch Lightning, which takes SIGTERM as \"stop at the next step\""
        ),
        "{}",
        r.why()
    );
    assert!(
        err.contains("loses the work since its last checkpoint"),
        "{}",
        r.why()
    );
}

#[test]
fn serial_an_unmodified_hf_trainer_script_saves_its_last_step() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some((r, _)) = torch_script("hf_job.py", &[], &[], &[]) else {
        return;
    };
    assert_eq!(r.code(), 75, "{}", r.why());
    let (step, paths) = r.saved();
    let ended = format!("train ended at global step {step}");
    assert!(r.stdout().contains(&ended), "{}", r.why());
    assert_eq!(paths, vec![r.dir.path().join(format!("checkpoint-{step}"))]);
    assert!(paths[0].join("model.safetensors").exists(), "{}", r.why());
}

#[test]
fn serial_two_torchrun_ranks_save_the_same_step() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let torchrun = venv.join("bin/torchrun");
    // Room for the two ranks' start (torch imported twice: up to 1.55 GB
    // PSS in the tick before their first readings split the shared pages,
    // seen once in CI) below the critical level: the stop must come from
    // the leak, after the companions said hello.
    let r = run(
        "2200M",
        &[],
        &[
            torchrun.to_str().unwrap(),
            "--nproc-per-node",
            "2",
            "--master-port",
            "29613",
            &plain(),
        ],
        &[("DIST", "1"), ("LEAK_RANK", "1")],
    );
    assert_eq!(r.code(), 75, "{}", r.why());
    let (step, _) = r.saved();
    let out = r.stdout();
    for rank in 0..2 {
        assert!(
            r.dir
                .path()
                .join(format!("ckpt-r{rank}-{step}.json"))
                .exists(),
            "rank {rank} did not save step {step}\n{}",
            r.why()
        );
        assert!(
            out.contains(&format!(
                "rank {rank} left after its checkpoint at step {step}"
            )),
            "rank {rank} did not leave on its own\n{}",
            r.why()
        );
    }
    // Never through the agent: torchrun would end the job on a signal.
    assert_eq!(r.stop_signals(), vec![None], "{}", r.why());
}

/// Without the companion, a trainer that does not catch the checkpoint
/// signal is never sent it (USR1 would kill it with a misleading cause):
/// it gets SIGTERM, and the user is told the stop loses work.
#[test]
fn serial_a_trainer_that_does_not_catch_usr1_is_never_sent_usr1() {
    let _serial = common::machine::beside();
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let r = run(
        "400M",
        &["--no-companion", "--checkpoint-signal", "USR1"],
        &["python3", &plain()],
        &[("PYTHONPATH", pkg.to_str().unwrap())],
    );
    assert_eq!(r.code(), 75, "{}", r.why());
    assert_eq!(
        r.stop_signals(),
        vec![Some("SIGTERM".to_string())],
        "{}",
        r.why()
    );
    let err = r.stderr();
    assert!(
        err.contains("does not catch SIGUSR1: sent SIGTERM instead"),
        "{err}"
    );
    assert!(err.contains("this stop loses the work"), "{err}");
}

#[test]
fn serial_an_accelerate_loop_saves_its_last_step_and_resumes_from_it() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let extra = ["--on-critical", "restart", "--restart-delay", "1s"];
    let Some((r, _)) = torch_script("accelerate_job.py", &extra, &["150"], &[]) else {
        return;
    };
    assert_eq!(r.code(), 0, "{}", r.why());
    let (step, paths) = r.saved();
    let out = r.stdout();
    let left = format!("left after its checkpoint at step {step}\n");
    assert!(out.contains(&left), "{}", r.why());
    assert_eq!(paths, vec![r.dir.path().join(format!("step_{step}"))]);
    let resumed = format!("resumed from step {step}\n");
    assert!(out.contains(&resumed), "{}", r.why());
    assert!(out.contains("finished at step 150"), "{}", r.why());
}

/// `--on-critical restart` with unmodified scripts: the second attempt's
/// `fit`/`train` is given the first attempt's checkpoint and finishes.
#[test]
fn serial_unmodified_lightning_and_hf_scripts_resume_from_the_checkpoint() {
    let _serial = common::machine::beside_with(&[common::machine::Need::Torch]);
    let extra = ["--on-critical", "restart", "--restart-delay", "1s"];
    let env = [
        ("LEAK_ONLY_ATTEMPT", "1"),
        ("TRANSFORMERS_VERBOSITY", "info"),
    ];
    let Some((r, _)) = torch_script("lightning_job.py", &extra, &["150"], &env) else {
        return;
    };
    assert_eq!(r.code(), 0, "{}", r.why());
    let (_, paths) = r.saved();
    let restored = format!(
        "Restoring states from the checkpoint path at {}",
        paths[0].display()
    );
    assert!(r.all().contains(&restored), "{}", r.why());
    assert!(
        r.all().contains("fit ended at global step 150"),
        "{}",
        r.why()
    );
    let (r, _) = torch_script("hf_job.py", &extra, &["150"], &env).unwrap();
    assert_eq!(r.code(), 0, "{}", r.why());
    let (step, _) = r.saved();
    let resumed = format!("Resuming training from checkpoint with epoch 0 and global step {step}");
    assert!(r.all().contains(&resumed), "{}", r.why());
    assert!(
        r.all().contains("train ended at global step 150"),
        "{}",
        r.why()
    );
}

/// The default ladder's `checkpoint` rule: a job that climbs past it and
/// levels off below the critical level gets a checkpoint and trains on to
/// its end (exit 0): a save, not the run.
#[test]
fn serial_a_job_that_levels_off_near_the_ceiling_is_checkpointed_and_goes_on() {
    let _serial = common::machine::beside();
    let r = run(
        "400M",
        &[],
        &["python3", &plain(), "200"],
        &[("MAX_MB", "340")],
    );
    assert_eq!(r.code(), 0, "{}", r.why());
    let (step, paths) = r.saved();
    assert!(paths[0].exists());
    assert!(step < 200);
    assert!(
        r.stdout().contains("rank 0 finished at step 200"),
        "{}",
        r.why()
    );
    let asked: Vec<_> = r
        .log
        .iter()
        .filter_map(|l| match &l.event {
            Event::Action(a) => Some((a.action.clone(), a.signal.clone())),
            _ => None,
        })
        .collect();
    assert!(
        asked.contains(&("checkpoint".to_string(), None)),
        "{asked:?}\n{}",
        r.why()
    );
    assert!(r.stop_signals().is_empty(), "{}", r.why());
    assert!(!r.stderr().contains("steps lost"), "{}", r.why());
}

/// `attach` to a job that was started with a control channel (the package
/// on its path, `OOMGUARD_CONTROL` set by whoever started it): the stop
/// asks its companion instead of signalling, the checkpoint holds the last
/// completed step, and the directory, not oomguard's, is left in place.
#[test]
fn serial_attach_asks_a_job_started_with_a_channel() {
    use std::os::unix::fs::DirBuilderExt;
    let _serial = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control");
    fs::DirBuilder::new().mode(0o700).create(&control).unwrap();
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let stdout = dir.path().join("job.out");
    let mut job = std::process::Command::new("python3")
        .args([&plain(), "4000"])
        .env("PYTHONPATH", &pkg)
        .env("OOMGUARD_CONTROL", &control)
        .env("CKPT_DIR", dir.path())
        .env("LEAK_MB", "4")
        .stdout(fs::File::create(&stdout).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = common::wait_for(std::time::Duration::from_secs(20), || {
        fs::read_to_string(&stdout).is_ok_and(|t| t.contains("completed step 5\n"))
    });
    let log = dir.path().join("log.ndjson");
    let out = started.then(|| {
        common::oomguard()
            .args(["attach", &job.id().to_string(), "--no-tui", "--no-notify"])
            .args(["--interval", "200ms", "--budget", "300M", "--log"])
            .arg(&log)
            .output()
            .unwrap()
    });
    let left = common::wait_for(std::time::Duration::from_secs(20), || {
        job.try_wait().unwrap().is_some()
    });
    if !left {
        let _ = job.kill();
    }
    let _ = job.wait();
    assert!(started, "the job never showed progress");
    let out = out.unwrap();
    let r = Run {
        out,
        raw: fs::read_to_string(&log).unwrap_or_default(),
        log: common::read_log(&log),
        dir,
    };
    let job_out = fs::read_to_string(&stdout).unwrap();
    assert!(
        left,
        "the job did not leave after its checkpoint\n{}",
        r.why()
    );
    assert_eq!(r.code(), 75, "{}", r.why());
    assert!(
        r.stderr().contains("the job has a control channel"),
        "{}",
        r.why()
    );
    let (step, paths) = r.saved();
    assert!(
        job_out.contains(&format!("rank 0 left after its checkpoint at step {step}")),
        "{job_out}\n{}",
        r.why()
    );
    assert_eq!(Some(step), last_completed(&job_out, 0), "{}", r.why());
    assert!(paths[0].exists());
    assert_eq!(r.stop_signals(), vec![None], "{}", r.why());
    assert!(control.is_dir(), "the job's control directory was removed");
}

/// A user's `relieve` rule: the companion frees what it can at its next
/// step (gc, malloc_trim, PyTorch's caches) and says how much, and the job
/// runs on to its end.
#[test]
fn serial_a_relieve_rule_frees_caches_and_training_goes_on() {
    let _serial = common::machine::beside();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    fs::write(
        cfg.path(),
        // Held 4 s: the companion has spoken by then, also when the job's
        // start (a shell, pyenv's shims, the import) takes seconds on a
        // busy machine (it took 2 s in the run at 70556a5, and the relief
        // asked at 1 s found no companion).
        "[[rule]]\nname = \"tidy\"\nmetric = \"headroom_percent\"\nbelow = \"100%\"\nfor = \"4s\"\naction = \"relieve\"\n",
    )
    .unwrap();
    let r = run(
        "2G",
        &["--config", cfg.path().to_str().unwrap()],
        &["python3", &plain(), "200"],
        &[("LEAK_MB", "0")],
    );
    assert_eq!(r.code(), 0, "{}", r.why());
    assert!(
        r.stdout().contains("rank 0 finished at step 200"),
        "{}",
        r.why()
    );
    let relieved: Vec<&serde_json::Value> = r
        .log
        .iter()
        .filter_map(|l| match &l.event {
            Event::Relieved(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(relieved.len(), 1, "{}", r.why());
    let freed = relieved[0]["freed_bytes"].as_object().unwrap();
    assert!(freed.contains_key("gc"), "{}", r.why());
    assert!(r.done().is_none(), "a relief is not a checkpoint");
    // The companion's last progress record, written as the job exits, is
    // read before the summary.
    assert!(r.stderr().contains("finished at step 200"), "{}", r.why());
}

/// Another copy of the `oomguard` package in the job's environment (first
/// on its path, as a `pip install` of another version would be): `python/
/// oomguard` copied, with a version of its own, or a protocol of its own.
fn other_copy(version: &str, protocol: u32) -> tempfile::TempDir {
    let site = tempfile::tempdir().unwrap();
    let pkg = site.path().join("oomguard");
    fs::create_dir(&pkg).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/oomguard");
    for e in fs::read_dir(&src).unwrap().flatten() {
        fs::copy(e.path(), pkg.join(e.file_name())).unwrap();
    }
    fs::write(pkg.join("_embedded.py"), format!("VERSION = {version:?}\n")).unwrap();
    let init = fs::read_to_string(pkg.join("__init__.py")).unwrap();
    assert!(init.contains("\nPROTOCOL = 1\n"));
    let init = init.replace("\nPROTOCOL = 1\n", &format!("\nPROTOCOL = {protocol}\n"));
    fs::write(pkg.join("__init__.py"), init).unwrap();
    site
}

/// Version skew: a job whose environment holds another version of the
/// companion runs with it, and the log names the copy that spoke; one of
/// another protocol is not asked (its records are not read) and the stop
/// falls back to the signal, saying why.
#[test]
fn serial_another_copy_of_the_companion_runs_and_another_protocol_falls_back_to_signals() {
    let _serial = common::machine::beside();
    let site = other_copy("0.0.9", 1);
    let path = site.path().to_str().unwrap();
    let r = run("400M", &[], &["python3", &plain()], &[("PYTHONPATH", path)]);
    assert_eq!(r.code(), 75, "{}", r.why());
    r.saved();
    let hello = r
        .log
        .iter()
        .find_map(|l| match &l.event {
            Event::Companion(v) => Some(v.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no companion event\n{}", r.why()));
    assert_eq!(hello["version"], "0.0.9", "{hello}");
    assert!(
        hello["path"].as_str().is_some_and(|p| p.starts_with(path)),
        "{hello}"
    );
    assert_eq!(hello["protocol"], 1, "{hello}");

    let site = other_copy("9.0.0", 2);
    let path = site.path().to_str().unwrap();
    let r = run("400M", &[], &["python3", &plain()], &[("PYTHONPATH", path)]);
    assert!(
        r.stderr().contains("speaks protocol 2, this oomguard 1"),
        "{}",
        r.why()
    );
    assert!(
        r.done().is_none(),
        "a foreign companion was asked\n{}",
        r.why()
    );
    assert!(
        r.stop_signals().contains(&Some("SIGTERM".to_string())),
        "{}",
        r.why()
    );
    assert_eq!(r.code(), 75, "{}", r.why());
}
