//! `oomguard attach` against real processes in real cgroup v1 memory
//! cgroups: naming the job (pid, `--cgroup`, `--slurm-job`, `--match`), the
//! job's own cgroup as its footprint, honest endings (`detached` while the
//! job runs on, `exited` with an unknown code), and the warn / pause / stop
//! actions on a job oomguard did not launch.
//!
//! cgroup v2 attach is covered by fixture trees in `src/job/attach.rs`: no v2
//! memory controller is available on these machines.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::schema::{self, Event};
use common::*;

const MIB: u64 = 1 << 20;

/// A trainer holding `argv[1]` MiB of anonymous memory and `argv[3]` MiB in
/// a shared-memory file `argv[2]` that it does not map (charged to its
/// cgroup, invisible to PSS), with two forked workers that leave when it
/// does. Writes `argv[4]` when ready, then sleeps `argv[5]` seconds.
const HOLDER: &str = r#"
import os, sys, time
MiB = 1 << 20
anon = b"\x01" * (int(sys.argv[1]) * MiB)
if sys.argv[2] != "-":
    with open(sys.argv[2], "wb") as f:
        for _ in range(int(sys.argv[3])):
            f.write(b"\x02" * MiB)
for _ in range(2):
    if os.fork() == 0:
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(0.1)
        os._exit(0)
open(sys.argv[4], "w").close()
time.sleep(float(sys.argv[5]))
"#;

/// Removes a /dev/shm file however the test ends.
struct ShmFile(PathBuf);

impl ShmFile {
    fn new(name: &str) -> Self {
        Self(PathBuf::from(format!(
            "/dev/shm/oomguard-test-{name}-{}",
            std::process::id()
        )))
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Starts `python3 -c SCRIPT ARGS` as the only process of the cgroup
/// directory `dir` (its own process group), and waits for `ready`.
fn start_in(dir: &Path, script: &str, args: &[&str], ready: &Path) -> Child {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec python3 -c "$@""#)
        .arg(dir)
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .process_group(0);
    let child = c.spawn().unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || ready.exists()),
        "the job did not get ready"
    );
    child
}

fn attach(args: &[&str], log: &Path) -> Command {
    let mut c = oomguard();
    c.arg("attach")
        .args(args)
        .args(["--no-tui", "--no-notify", "--interval", "200ms", "--log"])
        .arg(log)
        .stderr(Stdio::piped());
    c
}

/// Waits for oomguard to exit (at most `secs`), returning its code and
/// stderr.
fn finish(mut og: Child, secs: u64) -> (Option<i32>, String) {
    let ok = wait_for(Duration::from_secs(secs), || {
        og.try_wait().unwrap().is_some()
    });
    if !ok {
        let _ = og.kill();
    }
    let out = og.wait_with_output().unwrap();
    assert!(ok, "oomguard did not end within {secs}s");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run_start(lines: &[schema::Line]) -> &schema::RunStart {
    match &lines[0].event {
        Event::RunStart(s) => s,
        other => panic!("first line is {other:?}"),
    }
}

fn actions(lines: &[schema::Line]) -> Vec<&schema::Action> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Action(a) => Some(a),
            _ => None,
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    matches!(proc_state(pid), Some('S' | 'R' | 'D'))
}

/// Every sample's footprint is the cgroup's working set: within 5 % of the
/// cgroup's own figures read in the same pass (and those are of `path`).
fn assert_footprint_is_the_cgroup(lines: &[schema::Line], path: &str, at_least: u64) {
    let samples: Vec<&schema::Sample> = lines.iter().filter_map(|l| l.sample()).collect();
    assert!(samples.len() >= 3, "only {} samples", samples.len());
    // The path is fixed for the run: the log writes it on the lines with
    // the process list only.
    let named = samples
        .iter()
        .filter_map(|s| s.cgroup.as_ref())
        .filter(|c| !c.path.is_empty())
        .count();
    assert!(named >= 1, "no sample names the cgroup");
    for s in samples {
        let cg = s.cgroup.as_ref().expect("a cgroup on every sample");
        if !cg.path.is_empty() {
            assert_eq!(cg.path, path);
        }
        assert!(!cg.owned);
        let fp = s.tree.footprint_bytes as f64;
        let usage = cg.usage_bytes as f64;
        let ws = cg.limit_working_set_bytes.unwrap() as f64;
        assert!(
            (fp - usage).abs() <= 0.05 * usage && (fp - ws).abs() <= 0.05 * ws,
            "footprint {fp} vs cgroup usage {usage} / working set {ws}"
        );
        assert!(
            s.tree.footprint_bytes >= at_least,
            "footprint {} below {at_least}: the shared memory is not counted",
            s.tree.footprint_bytes
        );
    }
}

/// The issue's repro: a parent holding memory with two forked workers,
/// watched by pid and ended by SIGTERM to oomguard. The job keeps running
/// and the log says `detached`, not `exited`; the job is alone in its
/// cgroup, so the footprint is that cgroup's working set (the 100 MiB in
/// /dev/shm that PSS cannot see included).
#[test]
fn serial_attach_by_pid_uses_the_jobs_own_cgroup_and_detaches_honestly() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("attach-pid", 512 * MIB) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (log, ready) = (dir.path().join("a.ndjson"), dir.path().join("ready"));
    let shm = ShmFile::new("attach-pid");
    let shm_path = shm.0.to_str().unwrap();
    let mut job = start_in(
        &cg.dir,
        HOLDER,
        &["60", shm_path, "100", ready.to_str().unwrap(), "60"],
        &ready,
    );
    let pid = job.id();
    let og = attach(&[&pid.to_string()], &log).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    send(og.id(), "TERM");
    let (code, err) = finish(og, 20);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "stopped watching pid {pid} (still running, 3 process(es))"
        )),
        "{err}"
    );
    assert!(alive(pid), "the job must still run");
    assert_eq!(children_of(pid).len(), 2, "both workers must still run");

    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let start = run_start(&lines);
    assert_eq!(start.pid, pid);
    let info = start.cgroup.as_ref().unwrap();
    assert_eq!(info.path, cg.path);
    assert!(!info.owned && info.exclusive, "{info:?}");
    assert_footprint_is_the_cgroup(&lines, &cg.path, 150 * MIB);
    let end = schema::run_end(&lines);
    assert_eq!(end.outcome, "detached");
    assert_eq!(end.exit_code_known, Some(false));
    assert_eq!(end.detached_reason.as_deref(), Some("SIGTERM received"));
    let mut still = end.still_running_pids.clone().unwrap();
    still.sort_unstable();
    let mut expected: Vec<u32> = children_of(pid).into_iter().map(|c| c.0).collect();
    expected.push(pid);
    expected.sort_unstable();
    assert_eq!(still, expected);
    drop(cg);
    let _ = job.wait();
}

/// A cgroup shared with a process outside the job is not the job's
/// footprint: the tree's PSS sum is used, and the log says why. The watch
/// ends by `--watch-for`.
#[test]
fn serial_attach_falls_back_to_the_tree_when_the_cgroup_is_shared() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("attach-shared", 512 * MIB) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (log, ready) = (dir.path().join("a.ndjson"), dir.path().join("ready"));
    let shm = ShmFile::new("attach-shared");
    let mut outsider = cg
        .command(Path::new("sleep"), &["60"])
        .process_group(0)
        .spawn()
        .unwrap();
    let mut job = start_in(
        &cg.dir,
        HOLDER,
        &[
            "30",
            shm.0.to_str().unwrap(),
            "100",
            ready.to_str().unwrap(),
            "60",
        ],
        &ready,
    );
    let pid = job.id();
    let og = attach(&[&pid.to_string(), "--watch-for", "1500ms"], &log)
        .spawn()
        .unwrap();
    let (code, err) = finish(og, 20);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("still running"), "{err}");
    assert!(alive(pid));
    let lines = read_log(&log);
    let info = run_start(&lines).cgroup.as_ref().unwrap();
    assert!(!info.exclusive, "{info:?}");
    let why = info.not_exclusive_reason.as_deref().unwrap();
    assert!(
        why.contains("1 process(es) outside the job")
            && why.contains(&format!("pid {} sleep", outsider.id())),
        "{why}"
    );
    for s in lines.iter().filter_map(|l| l.sample()) {
        let usage = s.cgroup.as_ref().unwrap().usage_bytes;
        // The PSS sum: the unmapped shared memory is not in it.
        assert!(
            s.tree.footprint_bytes < usage - 80 * MIB,
            "footprint {} vs usage {usage}",
            s.tree.footprint_bytes
        );
    }
    let end = schema::run_end(&lines);
    assert_eq!(end.outcome, "detached");
    assert!(
        end.detached_reason
            .as_deref()
            .is_some_and(|r| r.contains("--watch-for")),
        "{end:?}"
    );
    let _ = outsider.kill();
    let _ = outsider.wait();
    drop(cg);
    let _ = job.wait();
}

/// A SLURM-style job cgroup (v1: slurm/uid_U/job_ID/step_0/task_0) found
/// by `--slurm-job ID` and by `--cgroup PATH` (hierarchy path and
/// directory), its processes sitting in a leaf below it.
#[test]
fn serial_attach_by_slurm_job_and_by_cgroup_path() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("attach-slurm", 512 * MIB) else {
        return;
    };
    let id = (7_000_000 + std::process::id()).to_string();
    let job_rel = format!("slurm/uid_0/job_{id}");
    let task = cg.dir.join(&job_rel).join("step_0/task_0");
    fs::create_dir_all(&task).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let shm = ShmFile::new("attach-slurm");
    let mut job = start_in(
        &task,
        HOLDER,
        &[
            "40",
            shm.0.to_str().unwrap(),
            "60",
            ready.to_str().unwrap(),
            "60",
        ],
        &ready,
    );
    let pid = job.id();
    let job_path = format!("{}/{job_rel}", cg.path);
    let job_dir = cg.dir.join(&job_rel).display().to_string();
    for (i, args) in [
        vec!["--slurm-job", id.as_str()],
        vec!["--cgroup", job_path.as_str()],
        vec!["--cgroup", job_dir.as_str()],
    ]
    .into_iter()
    .enumerate()
    {
        let log = dir.path().join(format!("a{i}.ndjson"));
        let mut a = args.clone();
        a.extend(["--watch-for", "1500ms"]);
        let (code, err) = finish(attach(&a, &log).spawn().unwrap(), 20);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        let lines = read_log(&log);
        let start = run_start(&lines);
        assert_eq!(start.pid, pid, "{args:?}");
        if i == 0 {
            assert!(
                start.argv[0].starts_with(&format!("SLURM job {id}")),
                "{:?}",
                start.argv
            );
        }
        let info = start.cgroup.as_ref().unwrap();
        assert_eq!(info.path, job_path, "{args:?}");
        assert!(info.exclusive, "{info:?}");
        assert_footprint_is_the_cgroup(&lines, &job_path, 90 * MIB);
        let sample = lines.iter().filter_map(|l| l.sample()).next_back().unwrap();
        assert_eq!(sample.tree.procs, 3, "{args:?}");
        assert_eq!(schema::run_end(&lines).outcome, "detached");
    }
    assert!(alive(pid));
    let out = oomguard()
        .args(["attach", "--slurm-job", "4294967295999"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no cgroup of SLURM job 4294967295999"),
        "{err}"
    );
    drop(cg);
    let _ = job.wait();
}

/// A trainer whose worker leaks (8 MiB every `argv[4]` s): the trainer
/// checkpoints on SIGTERM after `argv[5]` s (its next step boundary), the
/// worker leaves when its parent does.
const LEAKER: &str = r#"
import os, signal, sys, time
ckpt, ready, go = sys.argv[1], sys.argv[2], sys.argv[3]
def on_term(sig, frame):
    time.sleep(float(sys.argv[5]))  # reaching a step boundary
    with open(ckpt + ".tmp", "w") as f:
        f.write("step 42")
    os.rename(ckpt + ".tmp", ckpt)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
base = b"\x01" * (20 << 20)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A session of its own (as torchrun's children have): the kernel's
    # SIGCONT to a stopped, orphaned process group does not reach it.
    os.setsid()
    parent = os.getppid()
    hog = []
    while not os.path.exists(go):
        time.sleep(0.05)
    while os.getppid() == parent:
        hog.append(b"\x03" * (8 << 20))
        time.sleep(float(sys.argv[4]))
    os._exit(0)
open(ready, "w").close()
while True:
    time.sleep(0.1)
"#;

/// A leak in a job oomguard did not launch, named by its cgroup, is
/// stopped by the default policy: the checkpoint signal to the trainer
/// only, the trainer checkpoints and exits, nothing is killed (no
/// `--allow-kill`), and the kernel kills nothing.
#[test]
fn serial_attach_stops_a_leak_with_the_checkpoint_signal() {
    let _serial = serial();
    stop_a_leak("attach-leak", 400, "0.1", "0");
}

/// A leak fast enough to reach the last-resort level: everything is frozen,
/// and since oomguard may not end the tree, the trainer alone is let run
/// to checkpoint while the leaking worker stays frozen.
#[test]
fn serial_attach_stops_a_fast_leak_frozen_at_the_last_resort() {
    let _serial = serial();
    let acts = stop_a_leak("attach-fast-leak", 320, "0.04", "1");
    assert!(
        acts.iter()
            .any(|(action, reason)| action == "pause" && reason.starts_with("last resort")),
        "the last-resort level was not reached: {acts:?}"
    );
}

/// Runs the leaker under `attach --cgroup` and checks the stop; returns
/// the logged actions (empty when the test is skipped).
fn stop_a_leak(name: &str, limit_mib: u64, pause: &str, to_step: &str) -> Vec<(String, String)> {
    let Some(cg) = MemCgroup::or_skip(name, limit_mib * MIB) else {
        return Vec::new();
    };
    let dir = tempfile::tempdir().unwrap();
    let (log, ready, go, ckpt) = (
        dir.path().join("a.ndjson"),
        dir.path().join("ready"),
        dir.path().join("go"),
        dir.path().join("ckpt"),
    );
    let mut job = start_in(
        &cg.dir,
        LEAKER,
        &[
            ckpt.to_str().unwrap(),
            ready.to_str().unwrap(),
            go.to_str().unwrap(),
            pause,
            to_step,
        ],
        &ready,
    );
    let trainer = job.id();
    let watch = OomWatch::start(&cg);
    let og = attach(&["--cgroup", &cg.path, "--grace", "20s"], &log)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    fs::write(&go, "").unwrap();
    let (code, err) = finish(og, 40);
    assert_eq!(code, Some(75), "{err}");
    assert_eq!(fs::read_to_string(&ckpt).unwrap(), "step 42");
    assert_eq!(
        watch.kills(),
        0,
        "the kernel OOM killer fired in the job's cgroup or below it"
    );
    assert!(
        job.wait().unwrap().success(),
        "the trainer exited by itself"
    );
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let acts = actions(&lines);
    let stop = acts
        .iter()
        .find(|a| a.action == "stop")
        .expect("a stop action");
    assert_eq!(stop.pids, vec![trainer], "only the trainer is signalled");
    assert_eq!(stop.signal.as_deref(), Some("SIGTERM"));
    // The summary names the rule, though the trainer ended the stop.
    let by = format!("was stopped by oomguard ({}) before", stop.reason);
    assert!(err.contains(&by), "no '{by}' in: {err}");
    assert!(
        !acts.iter().any(|a| a.action == "kill"),
        "nothing killed without --allow-kill: {acts:?}"
    );
    let end = schema::run_end(&lines);
    assert_eq!(end.outcome, "stopped_by_policy");
    assert_eq!(end.exit_code, 75);
    assert_eq!(end.exit_code_known, Some(false));
    drop(cg);
    let _ = job.wait();
    acts.iter()
        .map(|a| (a.action.clone(), a.reason.clone()))
        .collect()
}

/// A trainer with two idle workers holding `argv[1]` MiB, growing to
/// `argv[2]` MiB once the file `argv[4]` exists; `argv[3]` marks it ready.
const GROWER: &str = r#"
import os, sys, time
MiB = 1 << 20
held = [b"\x01" * (int(sys.argv[1]) * MiB)]
for _ in range(2):
    if os.fork() == 0:
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(0.1)
        os._exit(0)
open(sys.argv[3], "w").close()
while not os.path.exists(sys.argv[4]):
    time.sleep(0.05)
held.append(b"\x02" * ((int(sys.argv[2]) - int(sys.argv[1])) * MiB))
time.sleep(60)
"#;

/// Warn and pause on a job oomguard did not launch; ending the watch
/// resumes what it paused, and the job runs on.
#[test]
fn serial_attach_warns_pauses_and_resumes_on_detach() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("attach-pause", 256 * MIB) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (log, ready) = (dir.path().join("a.ndjson"), dir.path().join("ready"));
    let go = dir.path().join("go");
    let mut job = start_in(
        &cg.dir,
        GROWER,
        &["110", "170", ready.to_str().unwrap(), go.to_str().unwrap()],
        &ready,
    );
    let pid = job.id();
    let og = attach(
        &[
            &pid.to_string(),
            "--warn-at",
            "40%",
            "--critical-at",
            "60%",
            "--on-critical",
            "pause",
        ],
        &log,
    )
    .spawn()
    .unwrap();
    // The warning first (at 110 of 256 MiB), then growth to the critical
    // level.
    // An `action` line, not the policy in `run_start` (which names the
    // warn rule's action too).
    assert!(
        wait_for(Duration::from_secs(15), || fs::read_to_string(&log)
            .is_ok_and(|t| t.lines().any(|l| l
                .contains(r#""event":"action""#)
                && l.contains(r#""action":"warn""#)))),
        "no warning"
    );
    fs::write(&go, "").unwrap();
    let paused = |want: char| {
        let mut pids: Vec<u32> = children_of(pid).into_iter().map(|c| c.0).collect();
        pids.push(pid);
        pids.len() == 3 && pids.iter().all(|p| proc_state(*p) == Some(want))
    };
    assert!(
        wait_for(Duration::from_secs(15), || paused('T')),
        "the job was not paused"
    );
    send(og.id(), "TERM");
    let (code, err) = finish(og, 20);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        wait_for(Duration::from_secs(2), || paused('S')),
        "the job was left stopped"
    );
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let names: Vec<&str> = actions(&lines).iter().map(|a| a.action.as_str()).collect();
    let at = |n: &str| names.iter().position(|a| *a == n);
    assert!(
        at("warn").is_some() && at("warn") < at("pause") && at("pause") < at("resume"),
        "{names:?}"
    );
    let pause = actions(&lines)
        .into_iter()
        .find(|a| a.action == "pause")
        .unwrap();
    assert_eq!(pause.pids.len(), 3, "{pause:?}");
    assert_eq!(schema::run_end(&lines).outcome, "detached");
    drop(cg);
    let _ = job.wait();
}

/// `--match`: the one job whose command line matches, or exit 2 with the
/// candidates listed.
#[test]
fn attach_by_match_finds_one_job_or_lists_the_candidates() {
    let _machine = common::machine::beside();
    let marker = format!("oomguard-match-{}", std::process::id());
    let spawn = || {
        Command::new("python3")
            .args(["-c", "import time; time.sleep(30)", &marker])
            .spawn()
            .unwrap()
    };
    let mut first = spawn();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("a.ndjson");
    std::thread::sleep(Duration::from_millis(200));
    let (code, err) = finish(
        attach(&["--match", &marker, "--watch-for", "500ms"], &log)
            .spawn()
            .unwrap(),
        20,
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(run_start(&read_log(&log)).pid, first.id());
    let mut second = spawn();
    std::thread::sleep(Duration::from_millis(200));
    let out = oomguard()
        .args(["attach", "--match", &marker])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("2 unrelated processes")
            && err.contains(&first.id().to_string())
            && err.contains(&second.id().to_string()),
        "{err}"
    );
    let out = oomguard()
        .args(["attach", "--match", "no-such-process-[0-9]{40}"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    for c in [&mut first, &mut second] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A job that ends while watched is `exited`, and the summary says its
/// code is unknown (oomguard is not its parent).
#[test]
fn attach_reports_an_ended_job_with_an_unknown_code() {
    let _machine = common::machine::beside();
    let mut job = Command::new("python3")
        .args(["-c", "import time, sys; time.sleep(1.5); sys.exit(3)"])
        .spawn()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("a.ndjson");
    let og = attach(&[&job.id().to_string()], &log).spawn().unwrap();
    // Reaping here is what lets the process leave /proc.
    assert_eq!(job.wait().unwrap().code(), Some(3));
    let (code, err) = finish(og, 20);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("exit code unknown"), "{err}");
    let lines = read_log(&log);
    let end = schema::run_end(&lines);
    assert_eq!(end.outcome, "exited");
    assert_eq!(end.exit_code_known, Some(false));
}

/// A v2 cgroup without the memory controller (the unified hierarchy of
/// these machines), named with `--cgroup`: the job is still its members
/// (a process in its own session included), with the tree's PSS sum as the
/// footprint and the reason logged.
#[test]
fn attach_by_v2_cgroup_without_memory_files_watches_its_members() {
    let _machine = common::machine::beside();
    let unified = Path::new("/sys/fs/cgroup/unified");
    let ok = unified.join("cgroup.procs").exists()
        && fs::read_to_string("/proc/self/status")
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")));
    if !require(
        ok,
        "needs root and the cgroup v2 hierarchy at /sys/fs/cgroup/unified",
    ) {
        return;
    }
    let cg = unified.join(format!("test-attach-v2-{}", std::process::id()));
    fs::create_dir_all(&cg).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (log, ready) = (dir.path().join("a.ndjson"), dir.path().join("ready"));
    let mut job = start_in(
        &cg,
        HOLDER,
        &["10", "-", "0", ready.to_str().unwrap(), "60"],
        &ready,
    );
    // One more member, not below the job's pid: the cgroup says it is the
    // job's.
    let mut other = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec setsid sleep 60"#)
        .arg(&cg)
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(5), || {
        fs::read_to_string(cg.join("cgroup.procs")).is_ok_and(|t| t.lines().count() == 4)
    }));
    let arg = cg.display().to_string();
    let (code, err) = finish(
        attach(&["--cgroup", &arg, "--watch-for", "1500ms"], &log)
            .spawn()
            .unwrap(),
        20,
    );
    let lines = read_log(&log);
    for pid in fs::read_to_string(cg.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
    {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    let _ = job.wait();
    let _ = other.wait();
    assert!(wait_for(Duration::from_secs(5), || fs::remove_dir(&cg).is_ok()));
    assert_eq!(code, Some(0), "{err}");
    let start = run_start(&lines);
    assert_eq!(start.pid, job.id());
    let info = start.cgroup.as_ref().unwrap();
    assert_eq!(info.version, 2);
    assert!(!info.exclusive);
    assert!(
        info.not_exclusive_reason
            .as_deref()
            .is_some_and(|r| r.contains("no memory controller files")),
        "{info:?}"
    );
    let last = lines.iter().filter_map(|l| l.sample()).next_back().unwrap();
    assert_eq!(last.tree.procs, 4, "the cgroup's members are the job");
    assert_eq!(schema::run_end(&lines).outcome, "detached");
}

/// A trainer that ignores the checkpoint signal, holding `argv[1]` MiB,
/// with two idle workers; `argv[2]` marks it ready.
const DEAF: &str = r#"
import os, signal, sys, time
held = b"\x01" * (int(sys.argv[1]) << 20)
for _ in range(2):
    if os.fork() == 0:
        parent = os.getppid()
        while os.getppid() == parent:
            time.sleep(0.1)
        os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[2], "w").close()
time.sleep(60)
"#;

fn deaf_job(cg: &MemCgroup, dir: &Path) -> Child {
    let ready = dir.join("ready");
    start_in(&cg.dir, DEAF, &["170", ready.to_str().unwrap()], &ready)
}

const STOP_AT_60: [&str; 5] = ["--warn-at", "40%", "--critical-at", "60%", "--grace"];

/// Without `--allow-kill`, a trainer that does not exit within the grace
/// is resumed and left running: nothing is killed and the watch goes on.
#[test]
fn serial_attach_without_allow_kill_leaves_a_deaf_trainer_running() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("attach-deaf", 256 * MIB) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("a.ndjson");
    let mut job = deaf_job(&cg, dir.path());
    let pid = job.id();
    let mut args = STOP_AT_60.to_vec();
    let pid_s = pid.to_string();
    args.extend(["1s", "--watch-for", "4s", &pid_s]);
    let (code, err) = finish(attach(&args, &log).spawn().unwrap(), 30);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("leaving it running"), "{err}");
    assert!(alive(pid), "the trainer must be left running");
    let mut pids: Vec<u32> = children_of(pid).into_iter().map(|c| c.0).collect();
    assert_eq!(pids.len(), 2, "the workers must be left running");
    pids.push(pid);
    assert!(
        pids.iter().all(|p| proc_state(*p) != Some('T')),
        "left stopped"
    );
    let lines = read_log(&log);
    let acts = actions(&lines);
    assert!(acts.iter().any(|a| a.action == "stop"), "{acts:?}");
    assert!(!acts.iter().any(|a| a.action == "kill"), "{acts:?}");
    assert_eq!(schema::run_end(&lines).outcome, "detached");
    drop(cg);
    let _ = job.wait();
}

/// With `--allow-kill` the stopping ladder goes on as under `run`: SIGTERM
/// to the tree after the grace, SIGKILL after `--kill-after` (10 s).
#[test]
fn serial_attach_with_allow_kill_ends_a_deaf_trainer() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("attach-killable", 256 * MIB) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("a.ndjson");
    let mut job = deaf_job(&cg, dir.path());
    let pid = job.id();
    let mut args = STOP_AT_60.to_vec();
    let pid_s = pid.to_string();
    args.extend(["1s", "--allow-kill", &pid_s]);
    let (code, err) = finish(attach(&args, &log).spawn().unwrap(), 40);
    assert_eq!(code, Some(75), "{err}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        job.wait().unwrap().signal(),
        Some(9),
        "the trainer was killed"
    );
    let lines = read_log(&log);
    let end = schema::run_end(&lines);
    assert_eq!(end.outcome, "stopped_by_policy");
    assert_eq!(end.exit_code_known, Some(false));
    drop(cg);
}

/// The dashboard on an attached job, in a real terminal (tmux): `p` pauses
/// the job, `q` then `d` ends the watch — the job is resumed and keeps
/// running, and the log says `detached`.
#[test]
fn attach_dashboard_detach_resumes_and_leaves_the_job_running() {
    // Its job runs under the tmux server, not this test's process.
    let _lock = common::machine::beside();
    let have_tmux = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !require(have_tmux, "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (log, ready) = (dir.path().join("a.ndjson"), dir.path().join("ready"));
    let mut job = Command::new("python3")
        .args(["-c", HOLDER, "20", "-", "0", ready.to_str().unwrap(), "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = job.id();
    assert!(wait_for(Duration::from_secs(10), || ready.exists()));
    let session = format!("oomguard-attach-{}", std::process::id());
    let tmux = |args: &[&str]| {
        let out = Command::new("tmux").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let screen = || tmux(&["capture-pane", "-t", &session, "-p"]);
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "160",
        "-y",
        "48",
        "bash --norc --noprofile",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let cmd = format!(
        "{} attach {pid} --tui --no-notify --interval 200ms --log {}; echo EXIT=$?",
        env!("CARGO_BIN_EXE_oomguard"),
        log.display()
    );
    tmux(&["send-keys", "-t", &session, &cmd, "Enter"]);
    let all = || {
        let mut p: Vec<u32> = children_of(pid).into_iter().map(|c| c.0).collect();
        p.push(pid);
        p
    };
    let shown = wait_for(Duration::from_secs(15), || {
        let sc = screen();
        sc.contains("Processes") && sc.contains("worker")
    });
    let checks = || -> Result<(), String> {
        if !shown {
            return Err(format!("no dashboard:\n{}", screen()));
        }
        tmux(&["send-keys", "-t", &session, "p"]);
        if !wait_for(Duration::from_secs(5), || {
            all().iter().all(|&p| proc_state(p) == Some('T'))
        }) {
            return Err("not paused".into());
        }
        tmux(&["send-keys", "-t", &session, "q"]);
        std::thread::sleep(Duration::from_millis(300));
        tmux(&["send-keys", "-t", &session, "d"]);
        if !wait_for(Duration::from_secs(15), || {
            screen().lines().any(|l| l.starts_with("EXIT="))
        }) {
            return Err(format!("oomguard did not exit:\n{}", screen()));
        }
        Ok(())
    };
    let result = checks();
    let sc = screen();
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", &session])
        .status();
    let resumed = wait_for(Duration::from_secs(2), || {
        all()
            .iter()
            .all(|&p| matches!(proc_state(p), Some('S' | 'R')))
    });
    let still = all().len();
    let _ = Command::new("kill")
        .args(["-9", "--", &format!("-{pid}")])
        .status();
    let _ = job.wait();
    result.unwrap();
    assert!(sc.lines().any(|l| l.trim() == "EXIT=0"), "{sc}");
    assert!(
        sc.contains(&format!("stopped watching pid {pid} (still running")),
        "{sc}"
    );
    assert!(resumed, "the job was left stopped");
    assert_eq!(still, 3);
    let lines = read_log(&log);
    let end = schema::run_end(&lines);
    assert_eq!(end.outcome, "detached");
    assert_eq!(
        end.detached_reason.as_deref(),
        Some("detached from the dashboard")
    );
    let names: Vec<&str> = actions(&lines).iter().map(|a| a.action.as_str()).collect();
    assert_eq!(names, ["pause", "resume"]);
}
