//! Acting before the OOM killer, against real processes and the real kernel
//! OOM killer inside small memory cgroups (design.md §5).
//!
//! Tests named `serial_*` grow memory against a limit or measure reaction
//! time; nextest runs them one at a time.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::schema::{self, Event};
use common::*;

fn train_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/train.py")
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_oomguard"))
}

/// Runs oomguard inside `cg` and returns (exit code, log lines, stderr).
fn run_in(
    cg: &MemCgroup,
    log: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, Vec<schema::Line>, String) {
    let mut cmd = cg.command(bin(), &["run", "--log", log.to_str().unwrap()]);
    cmd.args(args).stderr(Stdio::piped()).stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let lines = read_log(log);
    schema::check_envelope(&lines);
    (
        out.status.code(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `run_in`, also counting the kernel's OOM kills anywhere in `cg`'s
/// subtree (oomguard's own child cgroup included) while it runs.
fn run_watched(
    cg: &MemCgroup,
    log: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, Vec<schema::Line>, String, u64) {
    let watch = OomWatch::start(cg);
    let (code, lines, err) = run_in(cg, log, args, env);
    (code, lines, err, watch.kills())
}

/// `run_in` of a trainer leaking 100 MiB/s under `--budget 160MiB`:
/// `flags` go to oomguard, `job` to train.py after its leak options.
fn run_leaking_trainer(
    cg: &MemCgroup,
    log: &Path,
    flags: &[&str],
    job: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, Vec<schema::Line>, String) {
    let train = train_py();
    let mut args = vec!["--budget", "160MiB"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "python3", train.to_str().unwrap()]);
    args.extend_from_slice(&[
        "--leak-in",
        "trainer",
        "--chunk-mib",
        "2",
        "--period",
        "0.02",
    ]);
    args.extend_from_slice(job);
    run_in(cg, log, &args, env)
}

fn max_oom_kill_count(lines: &[schema::Line]) -> u64 {
    lines
        .iter()
        .filter_map(|l| l.sample())
        .filter_map(|s| s.cgroup.as_ref().and_then(|c| c.oom_kill_count))
        .max()
        .unwrap_or(0)
}

fn actions(lines: &[schema::Line]) -> Vec<(String, String, Option<String>)> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Action(a) => Some((a.action.clone(), a.reason.clone(), a.signal.clone())),
            _ => None,
        })
        .collect()
}

/// A leak of 40 MiB/s (2 MiB every 0.05 s) in 512 MiB: past the
/// critical level before its ETA has held for the 2 s `critical-eta`
/// needs, so `critical-headroom` decides.
fn prevented(leak_in: &str, workers: &str) {
    prevented_with(leak_in, workers, &[], "0.05", "critical-headroom");
}

/// A leak of 2 MiB every `period` seconds in a 512 MiB cgroup, stopped
/// before the kernel by `rule`.
fn prevented_with(leak_in: &str, workers: &str, extra: &[&str], period: &str, rule: &str) {
    let name = format!("prevent-{leak_in}{}", extra.join("").replace('-', ""));
    let Some(cg) = MemCgroup::or_skip(&name, 512 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, sigs) = (dir.path().join("ckpt"), dir.path().join("sigs"));
    fs::create_dir(&sigs).unwrap();
    let train = train_py();
    let mut args = extra.to_vec();
    args.extend([
        "--",
        "python3",
        train.to_str().unwrap(),
        "--leak-in",
        leak_in,
        "--chunk-mib",
        "2",
        "--period",
        period,
        "--ckpt-dir",
        ckpt.to_str().unwrap(),
        "--signals-dir",
        sigs.to_str().unwrap(),
    ]);
    let (code, lines, err, kills) = run_watched(
        &cg,
        &dir.path().join("run.ndjson"),
        &args,
        &[("NUM_WORKERS", workers)],
    );
    assert_eq!(code, Some(75), "stderr:\n{err}");
    let decided = common::stop_decision(&lines).expect("a stop action after a sample");
    // The rule that decided, and the ceiling it read.
    assert_eq!(
        (decided.0.as_str(), decided.1.as_str(), decided.2),
        (rule, "cgroup", 512 << 20),
        "stderr:\n{err}"
    );
    assert_eq!(schema::run_end(&lines).outcome, "stopped_by_policy");
    assert_eq!(
        kills, 0,
        "the kernel killed something in the test cgroup or below it"
    );
    assert_eq!(
        max_oom_kill_count(&lines),
        0,
        "the kernel killed something in the job's cgroup"
    );
    let acts = actions(&lines);
    assert!(
        acts.iter()
            .any(|(a, _, s)| a == "stop" && s.as_deref() == Some("SIGTERM")),
        "{acts:?}"
    );
    // The trainer reached its checkpoint.
    let saved: Vec<_> = fs::read_dir(&ckpt).unwrap().flatten().collect();
    assert!(!saved.is_empty(), "no checkpoint written; stderr:\n{err}");
}

#[test]
fn serial_leaking_workers_are_stopped_before_the_kernel() {
    let _serial = serial();
    prevented("workers", "4");
}

#[test]
fn serial_leaking_trainer_is_stopped_before_the_kernel() {
    let _serial = serial();
    prevented("trainer", "2");
}

/// A slower leak (10 MiB/s): its ETA falls under 10 s while the headroom
/// is still well above the critical 8 %, and holds for 2 s, so
/// `critical-eta` (not `critical-headroom`) stops it.
#[test]
fn serial_a_steady_leak_is_stopped_by_its_eta_before_the_critical_level() {
    let _serial = serial();
    prevented_with("trainer", "2", &[], "0.2", "critical-eta");
}

#[test]
fn serial_without_a_policy_the_kernel_kills_and_oomguard_says_so() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("nopolicy", 512 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (code, lines, err) = run_in(
        &cg,
        &dir.path().join("run.ndjson"),
        &[
            "--policy",
            "none",
            "--interval",
            "200ms",
            "--",
            "python3",
            train_py().to_str().unwrap(),
            "--leak-in",
            "trainer",
            "--chunk-mib",
            "4",
            "--period",
            "0.02",
        ],
        &[("NUM_WORKERS", "0")],
    );
    assert_eq!(code, Some(137), "stderr:\n{err}");
    let end = schema::run_end(&lines);
    assert_eq!(end.outcome, "oom_killed");
    assert!(
        max_oom_kill_count(&lines) >= 1,
        "oom_kill_count never rose in the samples"
    );
    assert!(err.contains("OOM killer"), "{err}");
}

#[test]
fn serial_fast_leak_is_stopped_before_the_kernel() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("fast", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // 200 MiB chunks as fast as memset goes: well over 1 GB/s.
    let leak = "import time\nkeep = []\nwhile True:\n    keep.append(bytearray(200 << 20))\n";
    let t0 = Instant::now();
    let (code, lines, err, kills) = run_watched(
        &cg,
        &dir.path().join("run.ndjson"),
        &["--", "python3", "-c", leak],
        &[],
    );
    assert_eq!(code, Some(75), "stderr:\n{err}");
    let decided = common::stop_decision(&lines).expect("a stop action after a sample");
    // The rule that decided, and the ceiling it read.
    assert_eq!(
        (decided.0.as_str(), decided.1.as_str(), decided.2),
        ("critical-headroom", "cgroup", 1 << 30),
        "stderr:\n{err}"
    );
    assert_eq!(kills, 0, "the kernel killed something");
    assert_eq!(max_oom_kill_count(&lines), 0);
    assert!(t0.elapsed() < Duration::from_secs(30));
}

#[test]
fn checkpoint_signal_reaches_the_trainer_and_not_the_workers() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("ckptsig", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sigs = dir.path().join("sigs");
    fs::create_dir(&sigs).unwrap();
    let (code, lines, err) = run_leaking_trainer(
        &cg,
        &dir.path().join("run.ndjson"),
        &["--checkpoint-signal", "USR1"],
        &[
            "--ckpt-signal",
            "USR1",
            "--signals-dir",
            sigs.to_str().unwrap(),
        ],
        &[("NUM_WORKERS", "3")],
    );
    assert_eq!(code, Some(75), "stderr:\n{err}");
    let decided = common::stop_decision(&lines).expect("a stop action after a sample");
    // The rule that decided, and the ceiling it read.
    assert_eq!(
        (decided.0.as_str(), decided.1.as_str(), decided.2),
        ("critical-headroom", "budget", 160 << 20),
        "stderr:\n{err}"
    );
    let mut trainer_got = String::new();
    for e in fs::read_dir(&sigs).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let text = fs::read_to_string(e.path()).unwrap();
        if name.starts_with("trainer-") {
            trainer_got.push_str(&text);
        } else {
            assert!(
                !text.contains("SIGUSR1"),
                "worker {name} got the checkpoint signal: {text}"
            );
        }
    }
    assert!(
        trainer_got.contains("SIGUSR1"),
        "trainer got: {trainer_got:?}"
    );
    let acts = actions(&lines);
    assert!(
        acts.iter()
            .any(|(a, _, s)| a == "stop" && s.as_deref() == Some("SIGUSR1")),
        "{acts:?}"
    );
}

#[test]
fn a_trainer_that_saves_and_leaves_at_once_has_its_checkpoint_logged() {
    let _machine = common::machine::beside();
    // No workers: the tree is gone the moment the trainer has saved, before
    // any tick sees it go, and the checkpoint event must still be written.
    let Some(cg) = MemCgroup::or_skip("ckptquick", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt_arg = ckpt.to_str().unwrap();
    let (code, lines, err) = run_leaking_trainer(
        &cg,
        &dir.path().join("run.ndjson"),
        &[
            "--checkpoint-dir",
            ckpt_arg,
            "--checkpoint-glob",
            "step-*.ckpt",
        ],
        &["--ckpt-dir", ckpt_arg],
        &[("NUM_WORKERS", "0")],
    );
    assert_eq!(code, Some(75), "stderr:\n{err}");
    let decided = common::stop_decision(&lines).expect("a stop action after a sample");
    // The rule that decided, and the ceiling it read.
    assert_eq!(
        (decided.0.as_str(), decided.1.as_str(), decided.2),
        ("critical-headroom", "budget", 160 << 20),
        "stderr:\n{err}"
    );
    let saved = fs::read_dir(&ckpt)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "ckpt"))
        .expect("the trainer saved no checkpoint");
    let at = lines
        .iter()
        .position(|l| matches!(l.event, Event::Checkpoint(_)))
        .unwrap_or_else(|| panic!("no checkpoint event; stderr:\n{err}"));
    let Event::Checkpoint(v) = &lines[at].event else {
        unreachable!()
    };
    assert_eq!(v["confirmed"], true, "{v}");
    assert_eq!(v["path"], saved.to_str().unwrap(), "{v}");
    assert!(at < lines.len() - 1, "the checkpoint event after run_end");
    assert!(!err.contains("no new checkpoint"), "{err}");
}

#[test]
fn trainer_ignoring_the_signal_is_stopped_after_grace_and_kill_after() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("stubborn", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let (code, lines, err) = run_leaking_trainer(
        &cg,
        &dir.path().join("run.ndjson"),
        &["--grace", "1s", "--kill-after", "1s"],
        &["--ignore-signal"],
        &[("NUM_WORKERS", "2")],
    );
    let took = t0.elapsed();
    assert_eq!(code, Some(75), "stderr:\n{err}");
    let decided = common::stop_decision(&lines).expect("a stop action after a sample");
    // The rule that decided, and the ceiling it read.
    assert_eq!(
        (decided.0.as_str(), decided.1.as_str(), decided.2),
        ("critical-headroom", "budget", 160 << 20),
        "stderr:\n{err}"
    );
    assert!(err.contains("did not exit within"), "{err}");
    assert_eq!(schema::run_end(&lines).outcome, "stopped_by_policy");
    let stop_t = lines
        .iter()
        .find_map(|l| matches!(&l.event, Event::Action(a) if a.action == "stop").then_some(l.t))
        .expect("stop action");
    let end_t = lines.last().unwrap().t;
    assert!(
        end_t - stop_t >= 1.0,
        "stopped before the grace ran out ({stop_t} -> {end_t})"
    );
    // Each step of the stop (the signal, the TERM to the rest, the kill) is
    // on a tick whose sample line carries the process list.
    for (i, l) in lines.iter().enumerate() {
        if !matches!(&l.event, Event::Action(_)) {
            continue;
        }
        // The tick's sample line comes just before the lines it led to.
        let listed = lines[i.saturating_sub(6)..=i].iter().any(|m| {
            matches!(&m.event, Event::Sample(x) if x.procs.is_some() && (m.t - l.t).abs() < 0.1)
        });
        assert!(listed, "no process list with the action at {}: {l:?}", l.t);
    }
    assert!(took < Duration::from_secs(40));
}

#[test]
fn serial_pause_freezes_the_tree_and_resume_thaws_it() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("pause", 512 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pause.toml");
    fs::write(
        &cfg,
        "[[rule]]\nname = \"squeeze\"\nmetric = \"headroom_percent\"\nbelow = \"30%\"\nclear = \"60%\"\naction = \"pause\"\n",
    )
    .unwrap();
    let log = dir.path().join("run.ndjson");
    let ready = dir.path().join("ready");
    let mut sup = cg.command(bin(), &["run", "-q", "--interval", "100ms", "--config"]);
    sup.arg(&cfg).arg("--log").arg(&log);
    sup.args([
        "--",
        "python3",
        train_py().to_str().unwrap(),
        "--period",
        "0.2",
        "--ready",
    ]);
    sup.arg(&ready)
        .env("NUM_WORKERS", "2")
        .stdout(Stdio::null());
    let mut sup = sup.spawn().unwrap();
    assert!(wait_for(Duration::from_secs(10), || ready.exists()));
    // Another process in the same cgroup (not the job) takes the room.
    let release = dir.path().join("release");
    let mut noise = cg.command(
        Path::new("python3"),
        &["-c", &format!(
            "import os, time\nb = bytearray(380 << 20)\nwhile not os.path.exists({:?}): time.sleep(0.05)\n",
            release.display().to_string()
        )],
    );
    let mut noise = noise.spawn().unwrap();
    let paused_pids = || -> Option<Vec<u32>> {
        read_log_lossy(&log).iter().find_map(|l| match &l.event {
            Event::Action(a) if a.action == "pause" => Some(a.pids.clone()),
            _ => None,
        })
    };
    assert!(
        wait_for(Duration::from_secs(15), || paused_pids().is_some()),
        "never paused"
    );
    let pids = paused_pids().unwrap();
    assert_eq!(pids.len(), 3, "trainer and 2 workers: {pids:?}");
    assert!(
        wait_for(Duration::from_secs(5), || pids.iter().all(|&p| proc_state(
            p
        ) == Some(
            'T'
        ))),
        "not all stopped: {:?}",
        pids.iter().map(|&p| proc_state(p)).collect::<Vec<_>>()
    );
    fs::write(&release, "").unwrap();
    noise.wait().unwrap();
    let resumed = || {
        read_log_lossy(&log)
            .iter()
            .any(|l| matches!(&l.event, Event::Action(a) if a.action == "resume"))
    };
    assert!(wait_for(Duration::from_secs(15), resumed), "never resumed");
    assert!(
        wait_for(Duration::from_secs(5), || pids
            .iter()
            .all(|&p| proc_state(p).is_some_and(|s| s != 'T'))),
        "still stopped: {:?}",
        pids.iter().map(|&p| proc_state(p)).collect::<Vec<_>>()
    );
    send(sup.id(), "TERM");
    let code = sup.wait().unwrap().code();
    // The job ends on the forwarded TERM (how is its own business).
    assert!(code.is_some(), "{code:?}");
}

#[test]
fn warn_runs_the_hook_with_the_event() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hook.env");
    let hook = format!("env | grep ^OOMGUARD_ | sort > {}", out.display());
    let st = oomguard()
        .args([
            "run",
            "-q",
            "--budget",
            "200MiB",
            "--warn-at",
            "50%",
            "--critical-at",
            "99%",
        ])
        .args(["--interval", "100ms", "--on-warn", &hook, "--"])
        .args([
            "python3",
            "-c",
            "import time\nb = bytearray(130 << 20)\ntime.sleep(1.5)\n",
        ])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    assert!(wait_for(Duration::from_secs(5), || out.exists()));
    let env = fs::read_to_string(&out).unwrap();
    assert!(env.contains("OOMGUARD_ACTION=warn"), "{env}");
    assert!(env.contains("OOMGUARD_RULE=warn-headroom"), "{env}");
    assert!(env.contains("OOMGUARD_CEILING_SOURCE=budget"), "{env}");
    let pct: f64 = env
        .lines()
        .find_map(|l| l.strip_prefix("OOMGUARD_HEADROOM_PERCENT="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(pct < 50.0, "{pct}");
}

#[test]
fn invalid_configs_are_rejected_before_the_job_starts() {
    let _machine = common::machine::beside();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs/invalid");
    let mut n = 0;
    let marker = tempfile::tempdir().unwrap();
    let started = marker.path().join("started");
    for e in fs::read_dir(&dir).unwrap().flatten() {
        let path = e.path();
        let text = fs::read_to_string(&path).unwrap();
        let expect = text
            .lines()
            .next()
            .unwrap()
            .strip_prefix("# expect: ")
            .unwrap();
        let out = oomguard()
            .args(["run", "--config"])
            .arg(&path)
            .args(["--", "touch"])
            .arg(&started)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", path.display());
        let want = format!("oomguard: cannot read '{}' {expect}", path.display());
        assert!(
            err.starts_with(&want),
            "{}:\n got: {err}\nwant: {want}",
            path.display()
        );
        assert!(
            !started.exists(),
            "the job started despite {}",
            path.display()
        );
        n += 1;
    }
    assert!(n >= 10, "only {n} bad configs");
}

#[test]
fn bad_flags_exit_2() {
    let _machine = common::machine::beside();
    let marker = tempfile::tempdir().unwrap();
    let started = marker.path().join("started");
    // (flags, what the message must name)
    for (args, named) in [
        (vec!["--on-critical", "explode"], "explode"),
        (vec!["--warn-at", "120%"], "120%"),
        (vec!["--checkpoint-signal", "SIGNOPE"], "SIGNOPE"),
        (
            vec!["--warn-at", "90%", "--critical-at", "80%"],
            "must be above",
        ),
        (
            vec!["--config", "/no/such/oomguard.toml"],
            "/no/such/oomguard.toml",
        ),
        // A misspelt flag before `--` is not the command to run.
        (vec!["--budjet", "4G"], "--budjet"),
        (vec!["--budget", "0"], "'0' must be greater than zero"),
        (vec!["--budget", "0.75"], "'0.75' looks like a fraction"),
        (vec!["--warn-at", "0.8"], "'0.8' looks like a fraction"),
        (
            vec!["--checkpoint-signal", "KILL"],
            "'KILL' cannot be caught",
        ),
        (
            vec!["--nvml-lib", "/no/such/libnvidia-ml.so.1"],
            "/no/such/libnvidia-ml.so.1",
        ),
        (
            vec!["--metrics-addr", "localhost"],
            "'localhost' has no port",
        ),
        (
            vec!["--log", "/proc/version"],
            "'/proc/version' is on the proc pseudo file system",
        ),
    ] {
        let out = oomguard()
            .arg("run")
            .args(&args)
            .args(["--", "touch"])
            .arg(&started)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(named),
            "{args:?} does not name {named:?}: {err}"
        );
        assert!(!started.exists(), "the job started despite {args:?}");
    }
}

#[test]
fn metrics_addr_takes_a_host_name() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let out = oomguard()
        .args(["run", "--no-tui", "--metrics-addr", "localhost:0", "--log"])
        .arg(&log)
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn serial_a_kernel_oom_kill_is_explained_with_the_victims_role() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("oomkill", 384 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("leaker.pid");
    let (code, lines, err) = run_in(
        &cg,
        &dir.path().join("run.ndjson"),
        &[
            "--policy",
            "none",
            "--",
            "python3",
            train_py().to_str().unwrap(),
            "--leak-in",
            "workers",
            "--leak-worker",
            "2",
            "--pid-file",
            pid_file.to_str().unwrap(),
            "--chunk-mib",
            "4",
            "--period",
            "0.02",
        ],
        &[("NUM_WORKERS", "4")],
    );
    // The trainer fails when its worker is killed, and the summary gives
    // the exit code oomguard returns (the trainer's, not 137).
    assert_ne!(code, Some(0), "stderr:\n{err}");
    let code = code.unwrap();
    assert_eq!(schema::run_end(&lines).outcome, "oom_killed");
    assert!(
        err.contains(&format!(
            "failed after the kernel OOM killer killed one of its processes; exit {code}"
        )),
        "{err}"
    );
    let victim: u32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let kill = lines
        .iter()
        .find_map(|l| match &l.event {
            Event::OomKill(v) => Some(v.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no oom_kill event; stderr:\n{err}"));
    assert_eq!(kill["pid"], victim, "{kill}");
    assert_eq!(kill["role"], "worker", "{kill}");
    common::assert_from_the_kernels_report(&kill);
    assert!(
        kill["place"]
            .as_str()
            .unwrap()
            .starts_with("worker 3 of the trainer"),
        "{kill}"
    );
    assert!(!kill["memory"].as_array().unwrap().is_empty(), "{kill}");
    assert!(
        err.contains(&format!("killed python3 (pid {victim}, worker 3")),
        "{err}"
    );
    // The same kill, found by `oomguard forensics` in the live kernel log.
    let out = oomguard()
        .args(["forensics", "--since", "10m", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let found = json["kills"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["pid"] == victim && k["constraint"] == "memcg");
    assert!(found, "forensics did not find pid {victim}: {json}");
}

/// A trainer whose worker takes 512 MiB at once in a 384 MiB cgroup: the
/// kernel kills it before any tick sees memory near the ceiling, and the
/// trainer reports the death as PyTorch does.
const SUDDEN_WORKER_KILL: &str = r#"
import os, sys, time
time.sleep(1.5)
pid = os.fork()
if pid == 0:
    b = b"\x01" * (512 << 20)
    time.sleep(60)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(f"RuntimeError: DataLoader worker (pid {pid}) is killed by signal: Killed.", file=sys.stderr, flush=True)
sys.exit(1)
"#;

#[test]
fn serial_a_sudden_kernel_kill_is_advised_as_one_and_logged_before_the_death() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("suddenkill", 384 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "sudden.py", SUDDEN_WORKER_KILL);
    let (code, lines, err) = run_in(
        &cg,
        &dir.path().join("run.ndjson"),
        &["--policy", "none", "--", "python3", job.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(1), "stderr:\n{err}");
    let kill = lines
        .iter()
        .position(|l| matches!(l.event, Event::OomKill(_)))
        .unwrap_or_else(|| panic!("no oom_kill event; stderr:\n{err}"));
    let (died, event) = lines
        .iter()
        .enumerate()
        .find_map(|(i, l)| match &l.event {
            Event::WorkerDied(v) => Some((i, v)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no worker_died event; stderr:\n{err}"));
    assert!(kill < died, "the kill is logged after the death it caused");
    let advice = event["advice"].to_string();
    assert!(advice.contains("OOM killer most likely took"), "{advice}");
    assert!(!advice.contains("something outside"), "{advice}");
}

/// Prevention without a cgroup of oomguard's own: the tree is followed
/// through /proc and the ceiling is the cgroup oomguard runs in.
#[test]
fn serial_leaking_workers_are_stopped_before_the_kernel_with_cgroup_off() {
    let _serial = serial();
    prevented_with(
        "workers",
        "4",
        &["--cgroup", "off"],
        "0.05",
        "critical-headroom",
    );
}

fn leaking_workers(sigs: &Path) -> Vec<String> {
    [
        "--",
        "python3",
        train_py().to_str().unwrap(),
        "--leak-in",
        "workers",
        "--chunk-mib",
        "2",
        "--period",
        "0.05",
        "--signals-dir",
        sigs.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn serial_the_kill_action_ends_the_tree_before_the_kernel() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("kill-action", 512 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sigs = dir.path().join("sigs");
    fs::create_dir(&sigs).unwrap();
    let mut args = vec!["--on-critical".to_string(), "kill".into()];
    args.extend(leaking_workers(&sigs));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, lines, err, kills) = run_watched(
        &cg,
        &dir.path().join("run.ndjson"),
        &args,
        &[("NUM_WORKERS", "4")],
    );
    assert_eq!(code, Some(75), "stderr:\n{err}");
    let decided = common::stop_decision(&lines).expect("a stop action after a sample");
    // The rule that decided, and the ceiling it read.
    assert_eq!(
        (decided.0.as_str(), decided.1.as_str(), decided.2),
        ("critical-headroom", "cgroup", 512 << 20),
        "stderr:\n{err}"
    );
    assert_eq!(kills, 0, "the kernel killed something");
    assert_eq!(schema::run_end(&lines).outcome, "stopped_by_policy");
    let acts = actions(&lines);
    assert!(
        acts.iter().any(|(a, r, s)| a == "kill"
            && r == "critical-headroom"
            && s.as_deref() == Some("SIGKILL")),
        "{acts:?}"
    );
    // A kill is not a graceful stop: nobody was asked to checkpoint.
    assert!(!acts.iter().any(|(a, _, _)| a == "stop"), "{acts:?}");
    // Nothing of the tree is left in the cgroup.
    assert!(cg.read("cgroup.procs").trim().is_empty());
}

#[test]
fn serial_a_pause_longer_than_max_pause_escalates_to_a_stop() {
    let _serial = serial();
    let Some(cg) = MemCgroup::or_skip("max-pause", 512 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sigs = dir.path().join("sigs");
    fs::create_dir(&sigs).unwrap();
    let mut args: Vec<String> = ["--on-critical", "pause", "--max-pause", "1s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(leaking_workers(&sigs));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, lines, err, kills) = run_watched(
        &cg,
        &dir.path().join("run.ndjson"),
        &args,
        &[("NUM_WORKERS", "4")],
    );
    assert_eq!(code, Some(75), "stderr:\n{err}");
    let decided = common::stop_decision(&lines).expect("a stop action after a sample");
    // The rule that decided, and the ceiling it read.
    assert_eq!(
        (decided.0.as_str(), decided.1.as_str(), decided.2),
        ("max-pause (critical-headroom)", "cgroup", 512 << 20),
        "stderr:\n{err}"
    );
    assert_eq!(kills, 0, "the kernel killed something");
    assert_eq!(schema::run_end(&lines).outcome, "stopped_by_policy");
    let at = |name: &str| {
        lines.iter().find_map(|l| match &l.event {
            Event::Action(a) if a.action == name => Some(l.t),
            _ => None,
        })
    };
    let pause = at("pause").expect("no pause action");
    let stop = at("stop").expect("the pause never escalated to a stop");
    assert!(
        stop - pause >= 0.9,
        "stopped {:.2}s after the pause, before --max-pause",
        stop - pause
    );
    // The trainer got the checkpoint signal.
    let trainer_got: String = fs::read_dir(&sigs)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("trainer-"))
        .map(|e| fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(trainer_got.contains("SIGTERM"), "{trainer_got:?}");
}

/// The figure in `--budget`'s place: with a cgroup of its own the job's
/// footprint is that cgroup's working set. 200 MiB written to /dev/shm is
/// charged to the job but mapped by no process, so the working set stands
/// ≥ 100 MiB above the PSS sum by construction. The summary's peak
/// footprint is the largest `tree.footprint_bytes` logged, named as the
/// working set; PSS appears only labelled as PSS, and `--fail-above` still
/// compares the PSS sum (the working set would exceed it).
#[test]
fn serial_the_footprint_shown_is_the_working_set_the_policy_compared() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("footprint", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = ShmJob::new(dir.path(), "footprint-test", 4);
    let log = dir.path().join("run.ndjson");
    let (code, lines, err) = run_in(
        &cg,
        &log,
        &[
            "--budget",
            "900MiB",
            "--fail-above",
            "100MiB",
            "--",
            "bash",
            job.script.to_str().unwrap(),
        ],
        &[],
    );
    drop(job);
    assert_eq!(
        code,
        Some(0),
        "the PSS sum stayed under --fail-above; stderr:\n{err}"
    );
    let start = lines
        .iter()
        .find_map(|l| match &l.event {
            Event::RunStart(s) => Some(s),
            _ => None,
        })
        .unwrap();
    assert!(
        start
            .cgroup
            .as_ref()
            .is_some_and(|c| c.owned && c.exclusive),
        "oomguard ran the job in a cgroup of its own: {err}"
    );
    let samples: Vec<&schema::Sample> = lines.iter().filter_map(|l| l.sample()).collect();
    let top = samples
        .iter()
        .max_by_key(|s| s.tree.footprint_bytes)
        .unwrap();
    assert!(
        top.tree.footprint_bytes >= top.tree.pss_bytes + (100 << 20),
        "the working set is above the PSS sum by construction: {:?}",
        top.tree
    );
    let end = schema::run_end(&lines);
    assert_eq!(end.peak.footprint_bytes, top.tree.footprint_bytes);
    assert!(end.peak.tree_pss_bytes < 100 << 20, "{:?}", end.peak);
    // The summary's figure, to its printed precision.
    let line = err
        .lines()
        .find(|l| l.starts_with("oomguard: peak footprint "))
        .unwrap_or_else(|| panic!("no peak line:\n{err}"));
    let mib = line["oomguard: peak footprint ".len()..]
        .split_once(" MiB (the cgroup's working set)")
        .and_then(|(n, _)| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let want = top.tree.footprint_bytes as f64 / (1 << 20) as f64;
    assert!((mib - want).abs() <= 0.5, "{mib} MiB vs {want} MiB: {line}");
    for l in err.lines().filter(|l| l.contains("PSS")) {
        for (i, _) in l.match_indices("PSS") {
            assert!(
                l[i..].starts_with("PSS sum") || l[..i].ends_with("B "),
                "PSS unlabelled: {l}"
            );
        }
    }
    // The report states the same peak and plots that figure.
    let report = |format: &str| {
        let out = std::process::Command::new(bin())
            .args(["report", "--format", format, "-o", "-"])
            .arg(&log)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&report("json")).unwrap();
    assert_eq!(json["peak"]["footprint_bytes"], top.tree.footprint_bytes);
    let html = report("html");
    assert!(
        html.contains(r#"<div class="k">Peak footprint</div>"#),
        "no peak card"
    );
    assert!(html.contains("series-footprint"), "no footprint line drawn");
    assert!(html.contains(">footprint (cgroup working set)<"), "legend");
}
