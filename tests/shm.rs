//! `/dev/shm` as a ceiling (`engine::probe::shm`): DataLoader workers hand
//! batches through a 64 MiB tmpfs (Docker's default) in a mount namespace
//! of its own; a trainer that keeps every batch is asked to save and
//! stopped before a write fails, whether oomguard is in that namespace (a
//! container's entrypoint) or outside it (reading the trainer's view); a
//! steady one is left alone. And the `torch_<pid>_…` files the job's
//! killed workers leave are removed after it ends, no one else's.
//!
//! Mount namespaces need root here; the jobs need the torch environment.
//! Both skip outside CI. Each run is in a memory cgroup of its own.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::MemCgroup;
use common::schema::{self, Event, Line};

const MIB: u64 = 1 << 20;

/// What the trainer dies of when a full `/dev/shm` reaches it: the
/// DataLoader re-raising its worker's error, a bus error. The job's main
/// process must end by itself, with 0. (Whether a worker's own prefetch
/// met the full tmpfs is each test's to judge: one CI run, before the
/// cheap loop read `/dev/shm`, stopped at 60 of 64 MiB and a worker's
/// feeder thread met it after the save was asked for.)
fn assert_the_trainer_never_failed(all: &str, lines: &[Line], why: &str) {
    for failure in [
        "Caught RuntimeError in DataLoader worker",
        "Bus error",
        "killed by signal",
    ] {
        assert!(!all.contains(failure), "{failure}\n{why}");
    }
    let exits: Vec<(Option<i32>, Option<String>)> = (lines.iter())
        .filter_map(|l| match &l.event {
            Event::ChildExit(e) => Some((e.code, e.signal.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(exits, [(Some(0), None)], "{why}");
}

fn job(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jobs/shm")
        .join(name)
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_oomguard")
}

/// What a namespace of its own with a 64 MiB `/dev/shm` runs `exec`ed.
fn in_shm_64m(cmd: &str) -> String {
    format!("mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {cmd}")
}

struct Run {
    out: Output,
    lines: Vec<Line>,
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
    fn why(&self) -> String {
        let out = self.stdout();
        let tail: Vec<&str> = out.lines().rev().take(6).collect();
        format!(
            "exit {:?}\nstderr:\n{}\nstdout tail:\n{}\nlog tail:\n{}",
            self.out.status.code(),
            self.stderr(),
            tail.join("\n"),
            self.raw
                .lines()
                .rev()
                .take(4)
                .collect::<Vec<_>>()
                .join("\n")
        )
    }
    /// `oomguard report --format text` of the run's log.
    fn report(&self) -> String {
        let out = common::oomguard()
            .args(["report", "--format", "text"])
            .arg(self.dir.path().join("run.ndjson"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    fn actions(&self, kind: &str) -> usize {
        (self.lines.iter())
            .filter(|l| matches!(&l.event, Event::Action(a) if a.action == kind))
            .count()
    }
}

/// A job of `tests/fixtures/jobs/shm` (`env`) under `oomguard run
/// --cgroup off`, with oomguard inside the 64 MiB namespace
/// (`oomguard_inside`) or only the job; None where this machine cannot
/// (no root, no torch environment).
fn run(oomguard_inside: bool, script: &str, env: &[(&str, &str)]) -> Option<Run> {
    run_with(oomguard_inside, script, env, "")
}

/// [`run`] with more of oomguard's flags (`flags`, space-separated).
fn run_with(oomguard_inside: bool, script: &str, env: &[(&str, &str)], flags: &str) -> Option<Run> {
    let venv = common::torch_venv()?;
    let cg = MemCgroup::or_skip("shm", 3 << 30)?;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let py = format!(
        "{} {}",
        venv.join("bin/python").display(),
        job(script).display()
    );
    let og = format!(
        "{} run --no-tui --cgroup off {flags} --log {}",
        bin(),
        log.display()
    );
    let script = if oomguard_inside {
        in_shm_64m(&format!("{og} -- {py}"))
    } else {
        format!("{og} -- unshare -m sh -c '{}'", in_shm_64m(&py))
    };
    // Inside: the namespace runs oomguard. Outside: sh runs oomguard,
    // and only the job makes a namespace.
    let mut c = if oomguard_inside {
        cg.command(Path::new("unshare"), &["-m", "sh", "-c", &script])
    } else {
        cg.command(Path::new("sh"), &["-c", &script])
    };
    c.env("CKPT_DIR", dir.path()).env_remove("OOMGUARD_CONTROL");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let raw = std::fs::read_to_string(&log).unwrap_or_default();
    let lines = common::read_log(&log);
    Some(Run {
        out,
        lines,
        raw,
        dir,
    })
}

/// The trainer keeps every 4 MiB batch: `/dev/shm` fills a batch a step.
/// oomguard warns, the companion saves the last completed step, and the
/// job leaves with 75 before any write fails; the stop, the summary and
/// `run_end` name `/dev/shm`, its size and its peak.
fn kept_batches_are_saved_and_stopped(oomguard_inside: bool) {
    let _machine = common::machine::beside();
    let Some(r) = run(
        oomguard_inside,
        "batches.py",
        &[("KEEP", "1"), ("BATCH_MB", "4")],
    ) else {
        return;
    };
    let all = format!("{}{}", r.stdout(), r.stderr());
    assert_eq!(r.out.status.code(), Some(75), "{}", r.why());
    assert_the_trainer_never_failed(&all, &r.lines, &r.why());
    // No write of the job's met the full tmpfs, a worker's neither.
    assert!(!all.contains("No space left on device"), "{}", r.why());
    // Warned: the warn rule fired (its action is left out when a checkpoint
    // or stop level was crossed at the same tick, a step of 4 MiB later).
    let warned = r.lines.iter().any(
        |l| matches!(&l.event, Event::Rule(w) if w.rule == "warn-headroom" && w.state == "firing"),
    );
    assert!(warned, "no warning\n{}", r.why());
    let (rule, source, bytes) = common::stop_decision(&r.lines).expect("no stop");
    assert_eq!(
        (source.as_str(), bytes),
        ("shm", 64 * MIB),
        "{rule}\n{}",
        r.why()
    );
    let saved = r.lines.iter().rev().find_map(|l| match &l.event {
        Event::CheckpointDone(v) => v["step"].as_u64(),
        _ => None,
    });
    let last = (r.stdout().lines())
        .filter_map(|l| l.strip_prefix("completed step ")?.parse::<u64>().ok())
        .max();
    assert!(
        saved.is_some() && saved == last,
        "saved {saved:?}, last {last:?}\n{}",
        r.why()
    );
    let ckpt = r.dir.path().join(format!("ckpt-{}.json", saved.unwrap()));
    assert!(ckpt.exists(), "{}", r.why());
    let end = schema::run_end(&r.lines);
    let peak = end.peak.shm.expect("run_end.peak.shm");
    assert_eq!(peak.size_bytes, 64 * MIB);
    assert!(peak.used_bytes > 40 * MIB, "{peak:?}");
    let err = r.stderr();
    assert!(
        err.contains("before /dev/shm filled; exit 75")
            && err.contains("nearest ceiling: /dev/shm 64.0 MiB (peak ")
            && err.contains("DataLoader batches held in shared memory"),
        "{}",
        r.why()
    );
    // The report tells growth with the steps (a leak) from a size too small.
    let report = r.report();
    assert!(
        report.contains("ceiling   /dev/shm 64.0 MiB · peak ")
            && report.contains("/dev/shm filled as training went on")
            && report.contains("stopped the job before /dev/shm filled"),
        "{report}"
    );
}

#[test]
fn serial_oomguard_inside_a_64_mib_dev_shm_saves_and_stops_a_job_keeping_batches() {
    kept_batches_are_saved_and_stopped(true);
}

/// oomguard outside the namespace sees the host's large `/dev/shm`: only
/// reading it through the trainer's `/proc/PID/root` finds the 64 MiB one.
#[test]
fn serial_oomguard_outside_reads_the_jobs_own_64_mib_dev_shm() {
    kept_batches_are_saved_and_stopped(false);
}

/// Batches not kept: shared memory holds steady at the batches in flight
/// (2 workers × prefetch 2 of 6 MiB, and the one in hand), about half of
/// 64 MiB. Not stopped, not warned; the peak share is said.
#[test]
fn serial_a_steady_half_full_dev_shm_is_left_alone_and_its_peak_said() {
    let _machine = common::machine::beside();
    let env = [("KEEP", "0"), ("BATCH_MB", "6"), ("STEPS", "40")];
    let Some(r) = run(true, "batches.py", &env) else {
        return;
    };
    assert_eq!(r.out.status.code(), Some(0), "{}", r.why());
    assert_eq!(r.actions("warn") + r.actions("stop"), 0, "{}", r.why());
    let peak = schema::run_end(&r.lines)
        .peak
        .shm
        .expect("run_end.peak.shm");
    let share = peak.used_bytes as f64 / peak.size_bytes as f64;
    assert!((0.25..0.8).contains(&share), "{peak:?}");
    assert!(
        r.stderr()
            .contains("nearest ceiling: /dev/shm 64.0 MiB (peak "),
        "{}",
        r.why()
    );
    let report = r.report();
    assert!(report.contains("/dev/shm peaked at "), "{report}");
}

/// An unmodified Lightning script whose training step keeps its batches
/// (2 workers) in the 64 MiB namespace: Lightning's own checkpoint of the
/// last completed step, through the companion's callback, and exit 75.
#[test]
fn serial_unmodified_lightning_keeping_batches_saves_its_last_step() {
    let _machine = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some(r) = run(true, "lightning_batches.py", &[]) else {
        return;
    };
    assert_eq!(r.out.status.code(), Some(75), "{}", r.why());
    let all = format!("{}{}", r.stdout(), r.stderr());
    assert_the_trainer_never_failed(&all, &r.lines, &r.why());
    let (_, source, _) = common::stop_decision(&r.lines).expect("no stop");
    assert_eq!(source, "shm", "{}", r.why());
    let (step, ckpt) = r
        .lines
        .iter()
        .rev()
        .find_map(|l| match &l.event {
            Event::CheckpointDone(v) => Some((
                v["step"].as_u64()?,
                PathBuf::from(v["paths"].as_array()?.first()?.as_str()?),
            )),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no checkpoint_done\n{}", r.why()));
    assert!(
        r.stdout()
            .contains(&format!("fit ended at global step {step}\n")),
        "{}",
        r.why()
    );
    assert_eq!(
        ckpt.parent(),
        Some(r.dir.path().join("checkpoints").as_path())
    );
    let py = common::torch_venv().unwrap().join("bin/python");
    let check = std::process::Command::new(py)
        .arg("-c")
        .arg("import sys, torch; print(torch.load(sys.argv[1], weights_only=False)['global_step'])")
        .arg(&ckpt)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&check.stdout).trim(),
        step.to_string(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// A normal user (uid 65534) whose DataLoader job (the kept-batches one)
/// makes an unprivileged user and mount namespace with a 64 MiB
/// `/dev/shm`: oomguard, outside that namespace and not root, reads the
/// job's view, has it save its last step and stops it before a write
/// fails.
#[test]
fn serial_a_normal_user_in_its_own_user_and_mount_namespace_is_saved_and_stopped() {
    let _machine = common::machine::beside_with(&[common::machine::Need::Torch]);
    let setpriv = Path::new("/usr/bin/setpriv");
    if !common::require(setpriv.exists(), "needs setpriv (util-linux)") {
        return;
    }
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let Some(cg) = MemCgroup::or_skip("shm-user", 3 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // Root's home (mode 700) holds the torch environment and the Python it
    // was made from: in the test's own mount namespace a world-readable
    // tmpfs covers /root, with just those two bound back in place.
    let py = venv.join("bin/python");
    let base = std::process::Command::new(&py)
        .args(["-c", "import sys; print(sys.base_prefix)"])
        .output()
        .unwrap();
    let base = String::from_utf8_lossy(&base.stdout).trim().to_string();
    let real_root = dir.path().join("real-root");
    std::fs::create_dir(&real_root).unwrap();
    let log = dir.path().join("run.ndjson");
    let inner = in_shm_64m(&format!("{} {}", py.display(), job("batches.py").display()));
    let outer = format!(
        "set -e; mount --bind /root {real}; mount -t tmpfs -o mode=755 tmpfs /root; \
         for p in {venv} {base}; do case $p in /root/*) mkdir -p $p; \
         mount --bind {real}/${{p#/root/}} $p;; esac; done; \
         exec {} --reuid=65534 --regid=65534 --clear-groups \
         {} run --no-tui --cgroup off --log {} -- unshare -Urm sh -c '{inner}'",
        setpriv.display(),
        bin(),
        log.display(),
        real = real_root.display(),
        venv = venv.display(),
    );
    let out = cg
        .command(Path::new("unshare"), &["-m", "sh", "-c", &outer])
        .envs([("KEEP", "1"), ("BATCH_MB", "4")])
        .env("CKPT_DIR", dir.path())
        // oomguard's own files (the companion's channel) and the job's
        // caches go where the user may write.
        .env("TMPDIR", dir.path())
        .env("HOME", dir.path())
        .env_remove("OOMGUARD_CONTROL")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let why = format!("exit {:?}\n{stderr}\n{stdout}", out.status.code());
    assert_eq!(out.status.code(), Some(75), "{why}");
    let lines = common::read_log(&log);
    assert_the_trainer_never_failed(&format!("{stdout}{stderr}"), &lines, &why);
    let (_, source, bytes) = common::stop_decision(&lines).expect("no stop");
    assert_eq!((source.as_str(), bytes), ("shm", 64 * MIB), "{why}");
    let saved = lines.iter().rev().find_map(|l| match &l.event {
        Event::CheckpointDone(v) => v["step"].as_u64(),
        _ => None,
    });
    let last = (stdout.lines())
        .filter_map(|l| l.strip_prefix("completed step ")?.parse::<u64>().ok())
        .max();
    assert!(
        saved.is_some() && saved == last,
        "saved {saved:?}, last {last:?}\n{why}"
    );
    // oomguard wrote its log as the user it ran as.
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&log).unwrap());
    assert_eq!(owner, 65534);
}

/// PyTorch's `file_system` sharing strategy names a shared tensor's file
/// `torch_<pid>_…` after the process that made it and unlinks it only when
/// that process ends normally: a worker killed leaves it. After the job,
/// its workers' files are gone and counted; a file of another live
/// process is untouched. (The workers live 3 s: oomguard knows the
/// processes its scans saw, one a second.)
/// `/dev/shm` filling faster than the ticks come (`--interval 5s`, far
/// from every level: one tick in 5 s, and the 64 MiB tmpfs fills in 2.6):
/// the cheap loop's `fstatfs` between ticks sees each level crossed, and
/// the job is stopped before a write fails. With `--without cheap-loop`
/// the job's write fails first.
#[test]
fn serial_dev_shm_filling_between_ticks_is_stopped_before_a_write_fails() {
    let _machine = common::machine::beside();
    let Some(r) = run_with(true, "burst.py", &[], "--interval 5s") else {
        return;
    };
    let why = r.why();
    let out = r.stdout();
    assert!(
        out.contains("stopped at ") && !out.contains("ENOSPC"),
        "{why}"
    );
    assert_eq!(r.out.status.code(), Some(75), "{why}");
    let (rule, source, _) = common::stop_decision(&r.lines).expect("no stop");
    assert_eq!(source, "shm", "{rule}\n{why}");
    let end = schema::run_end(&r.lines);
    let w = end.wakeups.as_ref().expect("run_end.wakeups");
    assert!(w.cheap_loop.woke > 0, "{:?}\n{why}", w.cheap_loop);
}

#[test]
fn serial_segments_the_jobs_killed_workers_left_are_removed_and_no_one_elses() {
    let _machine = common::machine::beside();
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = common::script(
        dir.path(),
        "leave.py",
        "import os, signal, time\n\
         import torch, torch.multiprocessing as mp\n\
         mp.set_sharing_strategy('file_system')\n\
         def worker(q):\n    \
             t = torch.ones(1 << 20)\n    \
             t.share_memory_()\n    \
             q.put(t)\n    \
             time.sleep(60)\n\
         if __name__ == '__main__':\n    \
             q = mp.Queue()\n    \
             ps = [mp.Process(target=worker, args=(q,)) for _ in range(2)]\n    \
             for p in ps:\n        \
                 p.start()\n    \
             got = [q.get() for _ in ps]\n    \
             print('segments', *[p.pid for p in ps], flush=True)\n    \
             time.sleep(3)\n    \
             for p in ps:\n        \
                 os.kill(p.pid, signal.SIGKILL)\n    \
             for p in ps:\n        \
                 p.join()\n    \
             os._exit(0)\n",
    );
    // Another job's segment: its pid alive throughout.
    let mut other = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let theirs = PathBuf::from(format!("/dev/shm/torch_{}_4242_0", other.id()));
    std::fs::write(&theirs, b"not the job's").unwrap();
    let log = dir.path().join("run.ndjson");
    let out = common::oomguard()
        .args(["run", "--no-tui", "--cgroup", "off", "--log"])
        .arg(&log)
        .arg("--")
        .arg(venv.join("bin/python"))
        .arg(&job)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let kept = theirs.exists();
    let _ = std::fs::remove_file(&theirs);
    let _ = other.kill();
    let _ = other.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let pids: Vec<&str> = (stdout.lines())
        .find_map(|l| l.strip_prefix("segments "))
        .expect("no worker pids")
        .split(' ')
        .collect();
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| pids.iter().any(|p| n.starts_with(&format!("torch_{p}_"))))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}\n{stderr}");
    assert!(kept, "another process's segment was removed");
    let end = schema::run_end(&common::read_log(&log)).shm_segments_removed;
    let end = end.expect("run_end.shm_segments_removed");
    assert_eq!(end.files, 2, "{stderr}");
    assert!(end.bytes >= 2 * 4 * MIB, "{end:?}");
    assert!(stderr.contains("removed 2 torch_* segment(s)"), "{stderr}");
}
