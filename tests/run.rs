//! `oomguard run` against real processes: exit codes, signal forwarding,
//! reaping, accounting, the NDJSON log and a real memory cgroup.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::schema::{self, Event};
use common::*;

fn py(dir: &std::path::Path, name: &str, body: &str) -> String {
    script(dir, name, body).display().to_string()
}

#[test]
fn exit_codes_pass_through() {
    let _machine = common::machine::beside();
    for code in [0, 1, 2, 127, 255] {
        let st = oomguard()
            .args(["run", "-q", "--", "sh", "-c", &format!("exit {code}")])
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(code), "exit {code}");
    }
}

#[test]
fn death_by_signal_is_128_plus_n() {
    let _machine = common::machine::beside();
    for (sig, code) in [("SIGTERM", 143), ("SIGKILL", 137)] {
        let st = oomguard()
            .args([
                "run",
                "-q",
                "--",
                "python3",
                "-c",
                &format!("import os, signal; os.kill(os.getpid(), signal.{sig})"),
            ])
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(code), "{sig}");
    }
}

#[test]
fn missing_and_non_executable_commands() {
    let _machine = common::machine::beside();
    let out = oomguard()
        .args(["run", "--", "/no/such/cmd-xyz"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(
        err.contains("'/no/such/cmd-xyz'") && err.contains("not found"),
        "{err}"
    );
    // A cgroup that a killed run left behind (another test's) is removed
    // and said on a line of its own by whichever run comes next.
    let lines = (err.lines()).filter(|l| !l.ends_with("left behind by a run that was killed"));
    assert_eq!(lines.count(), 1, "one-line message: {err}");

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("not-exec.sh");
    fs::write(&f, "#!/bin/sh\necho hi\n").unwrap();
    let out = oomguard().args(["run", "--"]).arg(&f).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(err.contains(&f.display().to_string()), "{err}");
}

/// A job that cannot be started still gets a whole log: `run_start` with
/// the command (and pid 0: there was no job), then `run_end` with the code.
#[test]
fn a_command_that_cannot_start_still_opens_and_closes_the_log() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let st = oomguard()
        .args(["run", "-q", "--log"])
        .arg(&log)
        .args(["--", "/no/such/cmd-xyz", "--flag"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(127));
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let Event::RunStart(start) = &lines[0].event else {
        unreachable!("check_envelope: run_start is first")
    };
    assert_eq!(start.argv, ["/no/such/cmd-xyz", "--flag"]);
    assert_eq!(start.pid, 0);
    let end = schema::run_end(&lines);
    assert_eq!((end.outcome.as_str(), end.exit_code), ("exited", 127));
    assert!(
        end.error
            .as_deref()
            .is_some_and(|e| e.contains("not found"))
    );
}

/// What the shell that became oomguard had forked before `exec` — a
/// sidecar (`sleep 30 & exec oomguard run ...`) or the reader of bash's
/// `> >(...)` — is oomguard's child but not the job's: it is never
/// measured, never signalled when the job ends, and never waited for.
#[test]
fn processes_forked_before_exec_are_not_the_job() {
    let _machine = common::machine::beside();
    let og = env!("CARGO_BIN_EXE_oomguard");
    for cgroup in ["auto", "off"] {
        let dir = tempfile::tempdir().unwrap();
        let (log, pidfile, count, readerfile) = (
            dir.path().join("run.ndjson"),
            dir.path().join("sidecar.pid"),
            dir.path().join("count"),
            dir.path().join("reader.pid"),
        );
        // The reader writes its own pid: while oomguard runs it is still
        // bash (`wc` comes after the sleep), so a name proves nothing.
        let script = format!(
            "sleep 30 & echo $! > {pidfile}; exec {og} run -q --interval 100ms --cgroup {cgroup} \
             --log {log} -- sh -c 'seq 1 100000; sleep 0.5' \
             > >(echo $BASHPID > {reader}; sleep 1; wc -l > {count})",
            pidfile = pidfile.display(),
            log = log.display(),
            count = count.display(),
            reader = readerfile.display(),
        );
        let started = Instant::now();
        let st = std::process::Command::new("bash")
            .args(["-c", &script])
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(0), "--cgroup {cgroup}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "oomguard waited for the sidecar"
        );
        let sidecar: u32 = fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let alive = proc_state(sidecar).is_some_and(|s| s != 'Z');
        assert!(alive, "--cgroup {cgroup}: the sidecar was signalled");
        send(sidecar, "KILL");
        // The reader of the process substitution got every line.
        assert!(
            wait_for(Duration::from_secs(10), || fs::read_to_string(&count)
                .is_ok_and(|c| c.trim() == "100000")),
            "--cgroup {cgroup}: the `> >(...)` reader was signalled: {:?}",
            fs::read_to_string(&count)
        );
        let reader: u32 = fs::read_to_string(&readerfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let lines = read_log(&log);
        schema::check_envelope(&lines);
        for l in &lines {
            match &l.event {
                Event::Sample(s) => {
                    let procs = s.procs.iter().flatten();
                    assert!(
                        procs
                            .clone()
                            .all(|p| p.pid != sidecar && p.pid != reader && p.ppid != reader),
                        "--cgroup {cgroup}: a stranger measured: {:?}",
                        s.procs
                    );
                }
                Event::Action(a) => panic!("--cgroup {cgroup}: unexpected action {a:?}"),
                _ => {}
            }
        }
    }
}

#[test]
fn usage_errors_exit_2() {
    let _machine = common::machine::beside();
    let out = oomguard()
        .args(["run", "--budget", "lots", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'lots'"));
    assert_eq!(
        oomguard().args(["run"]).output().unwrap().status.code(),
        Some(2)
    );
    assert_eq!(
        oomguard()
            .args(["frobnicate"])
            .output()
            .unwrap()
            .status
            .code(),
        Some(2)
    );
}

/// Two oomguards given one log (two SLURM tasks of a node given `%N`)
/// would interleave their lines: the second is refused before its job
/// starts, and the first's log is untouched; once the first has ended the
/// file is free again.
#[test]
fn a_log_another_live_oomguard_writes_is_refused() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let marker = dir.path().join("second-ran");
    let mut first = oomguard()
        .args(["run", "--log"])
        .arg(&log)
        .args(["--", "sleep", "30"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = common::wait_for(std::time::Duration::from_secs(10), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("run_start"))
    });
    let second = oomguard()
        .args(["run", "--log"])
        .arg(&log)
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&first),
        rustix::process::Signal::TERM,
    );
    first.wait().unwrap();
    assert!(started, "the first oomguard never wrote its log");
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{err}");
    assert!(
        err.contains("another oomguard is writing it") && err.contains("%r"),
        "{err}"
    );
    assert!(!marker.exists(), "the refused run started its job");
    assert_eq!(common::read_log_runs(&log).len(), 1);
    let again = oomguard()
        .args(["run", "--log"])
        .arg(&log)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(0));
}

/// A run that finishes leaves nothing in its directory: not even its own
/// end record of an earlier stop (nothing to requeue, no count to carry);
/// another run's record stays.
#[test]
fn a_finished_run_leaves_no_end_record() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let record = |argv: &[&str]| {
        serde_json::json!({
            "v": 1, "argv": argv, "cwd": cwd, "slurm_job_id": null, "owner": "",
            "cause": {"kind": "policy", "reason": "critical-headroom"}, "exit_code": 75,
            "stops_without_progress": 2, "requeue": true, "why": "", "ended_at": 1.0
        })
        .to_string()
    };
    let ours = dir.path().join(".oomguard-end.json");
    let run_true = || {
        let out = oomguard()
            .args(["run", "--", "true"])
            .current_dir(dir.path())
            .env_remove("SLURM_JOB_ID")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    };
    std::fs::write(&ours, record(&["true"])).unwrap();
    run_true();
    assert!(!ours.exists(), "the finished run's record is still there");
    std::fs::write(&ours, record(&["python", "other.py"])).unwrap();
    run_true();
    assert!(ours.exists(), "another run's record was removed");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn stdout_and_stdin_pass_through_untouched() {
    let _machine = common::machine::beside();
    let mut child = oomguard()
        .args([
            "run",
            "-q",
            "--",
            "sh",
            "-c",
            "read x; echo \"got $x\"; echo err >&2",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got hello\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
}

const SIGNAL_RECORDER: &str = r#"
import os, signal, sys, time
out = sys.argv[1]
def handler(sig, frame):
    with open(out, "a") as f:
        f.write(signal.Signals(sig).name + "\n")
    if sig == signal.SIGTERM:
        sys.exit(0)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, handler)
open(out + ".ready", "w").close()
while True:
    time.sleep(0.05)
"#;

#[test]
fn each_forwarded_signal_reaches_the_job() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let rec = py(dir.path(), "rec.py", SIGNAL_RECORDER);
    let out = dir.path().join("got.txt");
    let log = dir.path().join("run.ndjson");
    let mut child = oomguard()
        .args(["run", "-q", "--log"])
        .arg(&log)
        .args(["--", "python3", &rec])
        .arg(&out)
        .spawn()
        .unwrap();
    let ready = dir.path().join("got.txt.ready");
    assert!(wait_for(Duration::from_secs(10), || ready.exists()));
    // Non-terminating signals first; INT/HUP/QUIT do not end this job (it
    // handles them), TERM does.
    let sigs = ["USR1", "USR2", "HUP", "QUIT", "INT", "TERM"];
    for (i, s) in sigs.iter().enumerate() {
        send(child.id(), s);
        let want = i + 1;
        assert!(
            wait_for(Duration::from_secs(5), || fs::read_to_string(&out)
                .map(|t| t.lines().count() >= want)
                .unwrap_or(false)),
            "signal {s} not received"
        );
    }
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0));
    let got = fs::read_to_string(&out).unwrap();
    let names: Vec<&str> = got.lines().collect();
    assert_eq!(
        names,
        [
            "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGINT", "SIGTERM"
        ]
    );
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    assert_eq!(schema::run_end(&lines).outcome, "exited");
}

#[test]
fn job_ignoring_sigterm_is_killed_after_kill_after() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = py(
        dir.path(),
        "stubborn.py",
        "import signal, time, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen(sys.argv[1], 'w').close()\ntime.sleep(600)\n",
    );
    let ready = dir.path().join("ready");
    let log = dir.path().join("run.ndjson");
    let mut child = oomguard()
        .args(["run", "-q", "--kill-after", "1s", "--log"])
        .arg(&log)
        .args(["--", "python3", &job])
        .arg(&ready)
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || ready.exists()));
    let t0 = Instant::now();
    send(child.id(), "TERM");
    let st = child.wait().unwrap();
    let took = t0.elapsed();
    assert_eq!(st.code(), Some(137));
    assert!(
        took >= Duration::from_millis(900),
        "killed too early: {took:?}"
    );
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let end = schema::run_end(&lines);
    assert_eq!(end.exit_code, 137);
    assert_eq!(end.outcome, "signaled");
}

#[test]
fn second_interrupt_kills_at_once() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = py(
        dir.path(),
        "stubborn.py",
        "import signal, time, sys\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nopen(sys.argv[1], 'w').close()\ntime.sleep(600)\n",
    );
    let ready = dir.path().join("ready");
    let mut child = oomguard()
        .args(["run", "-q", "--kill-after", "60s", "--", "python3", &job])
        .arg(&ready)
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || ready.exists()));
    send(child.id(), "INT");
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    send(child.id(), "INT");
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(137));
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn run_end_is_written_when_oomguard_gets_sigterm() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let mut child = oomguard()
        .args(["run", "-q", "--interval", "100ms", "--log"])
        .arg(&log)
        .args(["--", "sleep", "600"])
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || fs::read_to_string(
        &log
    )
    .is_ok_and(|t| t.contains("\"sample\""))));
    send(child.id(), "TERM");
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(143));
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let end = schema::run_end(&lines);
    assert_eq!((end.outcome.as_str(), end.exit_code), ("signaled", 143));
    assert!(lines.iter().any(
        |l| matches!(&l.event, Event::ChildExit(c) if c.signal.as_deref() == Some("SIGTERM"))
    ));
}

/// One TERM ends the run even while a reader holds the job's last output
/// up: oomguard passes bytes on as long as the reader takes them, gives up
/// after 2 s without progress, and counts what never arrived. (The job is
/// killed by the TERM, as it would be from a shell.)
#[test]
fn one_sigterm_ends_the_run_while_a_stalled_reader_holds_output() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    // stdout is a pipe this test never reads.
    let mut child = oomguard()
        .args(["run", "-q", "--interval", "100ms", "--log"])
        .arg(&log)
        .args(["--", "seq", "1", "100000000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(10), || fs::read_to_string(
        &log
    )
    .is_ok_and(|t| t.contains("\"sample\""))));
    send(child.id(), "TERM");
    let ended = wait_for(Duration::from_secs(20), || {
        child.try_wait().is_ok_and(|s| s.is_some())
    });
    if !ended {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    assert!(ended, "oomguard waited for the reader after SIGTERM");
    assert_eq!(status.code(), Some(143));
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let end = schema::run_end(&lines);
    assert!(
        end.output_dropped_bytes.is_some_and(|n| n > 0),
        "what the reader never took is not counted: {end:?}"
    );
    drop(child.stdout.take());
}

/// A destination that is always full.
fn dev_full() -> fs::File {
    fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap()
}

/// Output that could not be written (a full disk: /dev/full) fails a run
/// whose job succeeded, with exit 74, as `cat` in the same place would,
/// and every byte lost is counted, including those still in the job's
/// pipe. A reader that goes away (`| head`) is not such a failure. The
/// job is not ended for it: it still writes after the destination failed
/// (the pause), and finishes.
#[test]
fn output_that_cannot_be_written_fails_the_run_with_74() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let out = oomguard()
        .args(["run", "--log"])
        .arg(&log)
        .args(["--", "sh", "-c", "seq 1 50000; sleep 0.5; seq 50001 100000"])
        .stdout(dev_full())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(74), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    let lines = read_log(&log);
    let end = schema::run_end(&lines);
    assert_eq!((end.outcome.as_str(), end.exit_code), ("exited", 74));
    // `seq 1 100000` writes 588,895 bytes; none arrived.
    assert_eq!(end.output_dropped_bytes, Some(588_895));
    // A job that failed keeps its own code.
    let st = oomguard()
        .args(["run", "-q", "--", "sh", "-c", "seq 1 100000; exit 3"])
        .stdout(dev_full())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(3));
}

/// A TERM that comes after the main process has gone (while what it left
/// behind is being stopped) is passed on to those processes, and the
/// action line names them, not the main pid, which is gone.
#[test]
fn a_sigterm_after_the_main_process_exited_names_the_processes_it_reached() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let ready = dir.path().join("ready");
    let job = format!(
        "python3 -c 'import signal, sys, time; signal.signal(15, signal.SIG_IGN); open(sys.argv[1], \"w\").close(); time.sleep(600)' {r} &
         while [ ! -e {r} ]; do sleep 0.05; done",
        r = ready.display()
    );
    let mut child = oomguard()
        .args([
            "run",
            "-q",
            "--cgroup",
            "off",
            "--kill-after",
            "3s",
            "--log",
        ])
        .arg(&log)
        .args(["--", "sh", "-c", &job])
        .spawn()
        .unwrap();
    let left_behind = || {
        read_log_lossy(&log).iter().find_map(|l| match &l.event {
            Event::Action(a) if a.reason.contains("left behind") => Some(a.pids.clone()),
            _ => None,
        })
    };
    assert!(wait_for(Duration::from_secs(15), || left_behind().is_some()));
    let rest = left_behind().unwrap();
    send(child.id(), "TERM");
    child.wait().unwrap();
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let Event::RunStart(start) = &lines[0].event else {
        unreachable!()
    };
    let term = lines
        .iter()
        .find_map(|l| match &l.event {
            Event::Action(a) if a.reason == "SIGTERM received" => Some(a),
            _ => None,
        })
        .expect("no action for the SIGTERM");
    assert!(!term.pids.contains(&start.pid), "{term:?}");
    assert_eq!(term.pids, rest, "{term:?}");
}

const ORPHANS: &str = r#"
import os, sys, time
# 100 grandchildren orphaned at once: each child forks a grandchild and
# exits, so the grandchild is re-parented to the subreaper (oomguard).
for i in range(100):
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
open(sys.argv[1], "w").close()
time.sleep(float(sys.argv[2]))
"#;

/// Reaping while oomguard runs: orphans re-parented to it (a child
/// subreaper) are reaped as they exit, not when oomguard itself ends and
/// init takes what is left. Checked while the job still sleeps, with the
/// output keeper (oomguard's other child) set apart.
#[test]
fn orphaned_grandchildren_are_reaped_while_oomguard_runs() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = py(dir.path(), "orphans.py", ORPHANS);
    let ready = dir.path().join("ready");
    let mut child = oomguard()
        .args(["run", "-q", "--", "python3", &job])
        .arg(&ready)
        .arg("8")
        .spawn()
        .unwrap();
    let me = child.id();
    assert!(wait_for(Duration::from_secs(20), || ready.exists()));
    // The grandchildren exit 0.2 s after they were made: soon the job is
    // oomguard's only child besides the keeper, and nothing is a zombie.
    let only_the_job = || {
        let kids = children_of(me);
        kids.iter().all(|&(_, st)| st != 'Z')
            && kids.iter().filter(|&&(pid, _)| !is_keeper(pid)).count() == 1
    };
    assert!(
        wait_for(Duration::from_secs(5), only_the_job),
        "zombies or orphans left while oomguard runs: {:?}",
        children_of(me)
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "oomguard had already ended: the check proved nothing"
    );
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

const SETSID_WORKER: &str = r#"
import os, sys, time
ready, pidfile = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    os.setsid()              # like torchrun's ranks: a session of its own
    if os.fork() == 0:
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)      # outlives the job: oomguard must stop it
        os._exit(0)
    os._exit(0)
time.sleep(2.5)
open(ready, "w").close()
"#;

#[test]
fn double_forked_worker_in_its_own_session_stays_in_the_tree_and_is_reaped() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = py(dir.path(), "setsid.py", SETSID_WORKER);
    let (ready, pidfile) = (dir.path().join("ready"), dir.path().join("pid"));
    let log = dir.path().join("run.ndjson");
    let st = oomguard()
        .args([
            "run",
            "-q",
            "--cgroup",
            "off",
            "--interval",
            "200ms",
            "--procs-interval",
            "200ms",
        ])
        .args(["--kill-after", "2s", "--log"])
        .arg(&log)
        .args(["--", "python3", &job])
        .arg(&ready)
        .arg(&pidfile)
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    let gpid: u32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Gone (stopped and reaped), not a zombie, not running.
    assert_eq!(
        proc_state(gpid),
        None,
        "escaped process {gpid} still exists"
    );
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let seen = lines.iter().filter_map(|l| l.sample()).any(|s| {
        s.procs
            .as_ref()
            .is_some_and(|ps| ps.iter().any(|p| p.pid == gpid))
    });
    assert!(
        seen,
        "the setsid grandchild {gpid} never appeared in the tree"
    );
}

const COW_WORKERS: &str = r#"
import os, sys, time
MiB = 1 << 20
buf = bytearray(512 * MiB)
for i in range(0, len(buf), 4096):    # touch every page: resident, private
    buf[i] = 1
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:                       # workers only keep the shared pages
        time.sleep(float(sys.argv[1]))
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
"#;

#[test]
fn forked_workers_are_counted_once_by_pss() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("pss", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = py(dir.path(), "cow.py", COW_WORKERS);
    let log = dir.path().join("run.ndjson");
    let mut cmd = cg.command(
        std::path::Path::new(env!("CARGO_BIN_EXE_oomguard")),
        &[
            "run",
            "-q",
            "--interval",
            "250ms",
            "--pss-interval",
            "500ms",
            "--procs-interval",
            "250ms",
            "--log",
        ],
    );
    cmd.arg(&log).args(["--", "python3", &job, "4"]);
    let st = cmd.status().unwrap();
    assert_eq!(st.code(), Some(0));
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    // Samples with all 5 processes measured (PSS younger than a sweep).
    let full: Vec<&schema::Sample> = lines
        .iter()
        .filter_map(|l| l.sample())
        .filter(|s| {
            s.tree.procs >= 5
                && s.procs
                    .as_ref()
                    .is_some_and(|p| p.iter().all(|p| p.pss_bytes > 0))
        })
        .collect();
    assert!(!full.is_empty(), "no sample saw the whole tree measured");
    // The middle one: at either end a reading up to a sweep old stands
    // beside fresh ones (the trainer's from before the fork; a worker's
    // from before its exit while the trainer, read again, already holds
    // the pages alone), which on a loaded machine counts a share twice.
    let s = full[full.len() / 2];
    let truth = 512u64 << 20;
    let pss = s.tree.pss_bytes as f64;
    let rss = s.tree.rss_bytes as f64;
    // Interpreter overhead is a few MiB per process on top of the buffer.
    assert!(
        (pss - truth as f64).abs() / (truth as f64) < 0.10,
        "tree PSS {} vs true footprint {truth}",
        s.tree.pss_bytes
    );
    assert!(rss / pss > 4.5, "RSS sum {rss} should be ~5x PSS {pss}");
    // The owned cgroup's usage is the exact footprint: also within 10%.
    let cgu = s.cgroup.as_ref().unwrap().usage_bytes as f64;
    assert!(
        (pss - cgu).abs() / cgu < 0.10,
        "PSS {pss} vs cgroup usage {cgu}"
    );
    let roles: Vec<&str> = s
        .procs
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.role.as_str())
        .collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "worker").count(),
        4,
        "{roles:?}"
    );
    assert_eq!(
        roles.iter().filter(|r| **r == "trainer").count(),
        1,
        "{roles:?}"
    );
}

#[test]
fn reports_the_memory_cgroup_it_runs_in() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("limit", 300 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let mut cmd = cg.command(
        std::path::Path::new(env!("CARGO_BIN_EXE_oomguard")),
        &["run", "-q", "--interval", "100ms", "--log"],
    );
    cmd.arg(&log).args([
        "--",
        "python3",
        "-c",
        "b = bytearray(64 << 20); import time; time.sleep(1)",
    ]);
    assert_eq!(cmd.status().unwrap().code(), Some(0));
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let Event::RunStart(start) = &lines[0].event else {
        panic!("first line is not run_start")
    };
    let info = start.cgroup.as_ref().expect("cgroup in run_start");
    assert_eq!(info.version, 1);
    assert!(
        info.path.starts_with(&cg.path),
        "{} under {}",
        info.path,
        cg.path
    );
    assert!(
        start
            .ceilings
            .iter()
            .any(|c| c.source == "cgroup" && c.bytes == 300 << 20)
    );
    let s = lines
        .iter()
        .filter_map(|l| l.sample())
        .max_by_key(|s| s.cgroup.as_ref().map(|c| c.usage_bytes))
        .unwrap();
    let c = s.cgroup.as_ref().unwrap();
    assert_eq!(c.limit_bytes, Some(300 << 20));
    // The paths are fixed for the run: written on the lines with the
    // process list.
    let with_paths = lines
        .iter()
        .filter_map(|l| l.sample())
        .filter(|s| s.procs.is_some())
        .filter_map(|s| s.cgroup.as_ref())
        .next_back()
        .expect("a sample with the process list");
    assert_eq!(with_paths.limit_path.as_deref(), Some(cg.path.as_str()));
    assert!(c.usage_bytes >= 60 << 20, "usage {}", c.usage_bytes);
    let ceiling = s.ceiling.as_ref().unwrap();
    assert_eq!(
        (ceiling.source.as_str(), ceiling.bytes),
        ("cgroup", 300 << 20)
    );
    let head = s.headroom_bytes.unwrap();
    assert!(head < (300 << 20) - (60 << 20), "headroom {head}");
}

/// `--log` to a file that holds a run already adds this run after it:
/// the log of the stop that made the job run again is kept (a requeue
/// under the recipe logs to the same `logs/%j/run-%N.ndjson`). `report`
/// and `replay` read the last run, or the one `--run N` names; a last line
/// cut short (a run killed mid-write) does not swallow the next run_start.
#[test]
fn a_second_run_to_the_same_log_keeps_the_first() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let run = |code: i32| {
        let st = oomguard()
            .args([
                "run",
                "-q",
                "--no-tui",
                "--cgroup",
                "off",
                "--interval",
                "100ms",
                "--log",
            ])
            .arg(&log)
            .args(["--", "sh", "-c", &format!("sleep 0.3; exit {code}")])
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(code));
    };
    run(3);
    run(4);
    let runs = common::read_log_runs(&log);
    assert_eq!(runs.len(), 2, "{}", std::fs::read_to_string(&log).unwrap());
    for (run, code) in runs.iter().zip([3, 4]) {
        assert!(matches!(run[0].event, Event::RunStart(_)));
        assert_eq!(common::schema::run_end(run).exit_code, code);
    }
    let report = |extra: &[&str]| {
        let out = oomguard()
            .args(["report", "--format", "json", "-o", "-"])
            .args(extra)
            .arg(&log)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            err,
        )
    };
    for (extra, code, index) in [(&[][..], 4, 2), (&["--run", "1"][..], 3, 1)] {
        let (st, out, err) = report(extra);
        assert_eq!(st, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["exit_code"], code, "{extra:?}");
        assert_eq!(v["run"]["index"], index, "{extra:?}");
        assert_eq!(v["run"]["of"], 2, "{extra:?}");
    }
    let (st, _, err) = report(&["--run", "3"]);
    assert_eq!(st, Some(2), "{err}");
    assert!(err.contains("holds 2 runs: there is no run 3"), "{err}");
    // The last line cut short, as by a kill mid-write: the next run
    // starts a line of its own, and its report is the third run's.
    let mut text = std::fs::read_to_string(&log).unwrap();
    let cut = r#"{"schema":"oomguard/1","event":"sam"#;
    text.push_str(cut);
    std::fs::write(&log, &text).unwrap();
    run(5);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!(
            "{cut}\n{{\"schema\":\"oomguard/1\",\"event\":\"run_start\""
        )),
        "{text}"
    );
    let (st, out, err) = report(&[]);
    assert_eq!(st, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["exit_code"].as_i64(), v["run"]["of"].as_u64()),
        (Some(5), Some(3))
    );
    for extra in [&[][..], &["--run", "1"][..]] {
        let out = oomguard()
            .arg("replay")
            .args(extra)
            .arg(&log)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {err}");
        assert!(err.contains("holds 3 runs"), "{err}");
    }
}

/// `--output-log FILE --output-log-max SIZE`: the newest output stays, in
/// FILE and FILE.1, within SIZE; run_end counts what went. Without
/// `--output-log` the cap is a usage error.
#[test]
fn the_output_log_cap_keeps_the_newest_output_and_counts_the_rest() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let (out, log) = (dir.path().join("job.out"), dir.path().join("run.ndjson"));
    let run = oomguard()
        .args(["run", "-q", "--no-tui", "--cgroup", "off", "--output-log"])
        .arg(&out)
        .args(["--output-log-max", "1KiB", "--log"])
        .arg(&log)
        .args(["--", "sh", "-c", "seq 1 20000; echo the end"])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{said}");
    let newer = fs::read_to_string(&out).unwrap();
    let older = fs::read_to_string(dir.path().join("job.out.1")).unwrap_or_default();
    let kept = newer.len() + older.len();
    assert!(kept <= 1024, "{kept} bytes kept; {said}");
    // The last read can be "the end" alone, in a file of its own after a
    // rotation: the two files together end with the newest output.
    let both = format!("{older}{newer}");
    assert!(both.ends_with("20000\nthe end\n"), "{both}; {said}");
    let total = (1..=20000)
        .map(|i: u32| i.to_string().len() + 1)
        .sum::<usize>()
        + 8;
    let lines = read_log(&log);
    let end = schema::run_end(&lines);
    assert_eq!(
        end.output_log_left_out_bytes,
        Some((total - kept) as u64),
        "older {} bytes, newer {} bytes; {said}",
        older.len(),
        newer.len()
    );
    let st = oomguard()
        .args(["run", "--output-log-max", "1KiB", "--", "true"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(2));
}

/// A budget above the machine's memory runs (a shared `oomguard.toml`
/// serves smaller nodes too) and says so, naming MemTotal; one below it
/// says nothing.
#[test]
fn a_budget_above_the_machines_memory_is_said() {
    let _machine = common::machine::beside();
    let total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    for (budget, said) in [(total_kib * 4, true), (total_kib / 2, false)] {
        let out = oomguard()
            .args(["run", "--no-tui", "--cgroup", "off", "--budget"])
            .arg(format!("{budget}KiB"))
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert_eq!(
            err.contains("is more than this machine's memory (MemTotal "),
            said,
            "--budget {budget}KiB: {err}"
        );
    }
}

#[test]
fn budget_is_a_ceiling() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let st = oomguard()
        .args([
            "run",
            "-q",
            "--budget",
            "64MiB",
            "--interval",
            "100ms",
            "--log",
        ])
        .arg(&log)
        .args(["--", "sleep", "0.5"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    let lines = read_log(&log);
    let Event::RunStart(start) = &lines[0].event else {
        panic!()
    };
    assert!(
        start
            .ceilings
            .iter()
            .any(|c| c.source == "budget" && c.bytes == 64 << 20)
    );
    let s = lines.iter().filter_map(|l| l.sample()).next().unwrap();
    assert_eq!(s.ceiling.as_ref().unwrap().source, "budget");
}

#[test]
fn summary_on_stderr() {
    let _machine = common::machine::beside();
    let mut child = oomguard()
        .args([
            "run",
            "--interval",
            "100ms",
            "--",
            "python3",
            "-c",
            "import time; b = bytearray(32 << 20); time.sleep(0.6)",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(err.contains("exited with 0"), "{err}");
    assert!(err.contains("peak footprint"), "{err}");
    assert!(err.contains("nearest ceiling"), "{err}");
    for l in err.lines() {
        assert!(l.starts_with("oomguard: "), "unprefixed line: {l}");
    }
}

#[test]
fn fail_above_turns_a_memory_regression_into_exit_76() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = "import time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(1.5)\n";
    for (limit, code, exceeded) in [("16MiB", 76, true), ("1GiB", 0, false)] {
        let log = dir.path().join(format!("{limit}.ndjson"));
        let st = oomguard()
            .args([
                "run",
                "-q",
                "--interval",
                "200ms",
                "--pss-interval",
                "200ms",
                "--fail-above",
                limit,
                "--log",
            ])
            .arg(&log)
            .args(["--", "python3", "-c", job])
            .status()
            .unwrap();
        assert_eq!(st.code(), Some(code), "{limit}");
        let lines = read_log(&log);
        let fa = schema::run_end(&lines).fail_above.as_ref().unwrap();
        assert_eq!(fa.exceeded, exceeded);
    }
    // A job that failed keeps its own exit code.
    let st = oomguard()
        .args(["run", "-q", "--fail-above", "1MiB", "--", "python3", "-c"])
        .arg("import sys, time\nb = bytearray(32 << 20)\ntime.sleep(1)\nsys.exit(3)\n")
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(3));
}

/// A spike between two samples (a short job, a burst of a long one) is
/// still a regression: the kernel's high-water mark of each process is
/// read when the job has ended. A 0.3 s, 200 MiB job, and a 200 MiB burst
/// of 0.2 s in the middle of a 3 s job sampled every 10 s (at 2 s, a
/// loaded machine's start-up delay once put the second sample inside the
/// burst, and the sample, not the high-water mark, saw it).
#[test]
fn fail_above_catches_a_spike_between_samples() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let short = "import time\nb = bytearray(200 << 20)\ntime.sleep(0.3)\n";
    let burst = "import time\ntime.sleep(1.2)\nb = bytearray(200 << 20)\ntime.sleep(0.2)\ndel b\ntime.sleep(1.6)\n";
    for (name, job) in [("short", short), ("burst", burst)] {
        let log = dir.path().join(format!("{name}.ndjson"));
        let out = oomguard()
            .args([
                "run",
                "--cgroup",
                "off",
                "--interval",
                "10s",
                "--fail-above",
                "100MiB",
            ])
            .arg("--log")
            .arg(&log)
            .args(["--", "python3", "-c", job])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(76), "{name}: {err}");
        let lines = read_log(&log);
        // The short job lives 0.4 s: on a loaded machine the first sample
        // can land after its allocation (seen in a full run), and then the
        // sample, not the high-water mark, is what the summary names. The
        // high-water mark is read all the same (`largest_process_rss_bytes`
        // below); the burst falls between samples by construction.
        let sampled = lines
            .iter()
            .filter_map(schema::Line::sample)
            .any(|s| s.tree.footprint_bytes > 100 << 20);
        assert!(
            err.contains("kernel's high-water mark") || (name == "short" && sampled),
            "{name}: {err}"
        );
        let end = schema::run_end(&lines);
        assert!(end.fail_above.as_ref().unwrap().exceeded, "{name}");
        assert!(
            end.peak.largest_process_rss_bytes >= 200 << 20,
            "{name}: {:?}",
            end.peak
        );
    }
}

const FORKER: &str = "import os, sys, time\nb = bytearray(16 << 20)\nkids = []\nfor _ in range(2):\n    pid = os.fork()\n    if pid == 0:\n        time.sleep(float(sys.argv[1]))\n        os._exit(0)\n    kids.append(pid)\ntime.sleep(float(sys.argv[1]))\n";

#[test]
fn attach_watches_a_job_it_did_not_launch() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("attach.ndjson");
    let mut job = std::process::Command::new("python3")
        .args(["-c", FORKER, "3"])
        .spawn()
        .unwrap();
    // Attach once the workers exist (the first sample lists the tree).
    assert!(wait_for(Duration::from_secs(10), || children_of(job.id())
        .len()
        >= 2));
    let st = oomguard()
        .args([
            "attach",
            &job.id().to_string(),
            "--no-tui",
            "-q",
            "--interval",
            "200ms",
            "--log",
        ])
        .arg(&log)
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    assert!(
        job.wait().unwrap().success(),
        "the watched job must be left alone"
    );
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let tree = lines
        .iter()
        .filter_map(|l| l.sample())
        .filter_map(|s| s.procs.as_ref())
        .find(|p| p.len() == 3)
        .expect("a sample with the trainer and its 2 workers");
    let roles: Vec<&str> = tree.iter().map(|p| p.role.as_str()).collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "worker").count(),
        2,
        "{roles:?}"
    );
    assert!(roles.contains(&"trainer"), "{roles:?}");
}

#[test]
fn attach_detaches_on_sigterm_without_touching_the_job() {
    let _machine = common::machine::beside();
    let mut job = std::process::Command::new("python3")
        .args(["-c", FORKER, "30"])
        .process_group(0)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut og = oomguard()
        .args([
            "attach",
            &job.id().to_string(),
            "--no-tui",
            "-q",
            "--interval",
            "100ms",
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    send(og.id(), "TERM");
    assert_eq!(og.wait().unwrap().code(), Some(0));
    assert!(
        matches!(proc_state(job.id()), Some('S' | 'R')),
        "the job was touched"
    );
    // The job and its workers: the whole group (they hold our stdout).
    send(job.id(), "KILL");
    let _ = std::process::Command::new("kill")
        .args(["-9", "--", &format!("-{}", job.id())])
        .status();
    job.wait().unwrap();
    let out = oomguard().args(["attach", "999999999"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

const COPY_ON_READ: &str = r#"
import os, sys, time
MiB = 1 << 20
data = bytearray(200 * MiB)
for i in range(0, len(data), 4096):
    data[i] = 1
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        time.sleep(1.5)
        for i in range(0, len(data), 4096):   # copy-on-write breaks:
            data[i] = 2                       # RSS unchanged, USS +200 MiB
        time.sleep(float(sys.argv[1]))
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
"#;

/// The classic DataLoader "copy-on-read" growth does not change any
/// process's RSS; the PSS sweep must still see it.
#[test]
fn copy_on_write_growth_without_rss_change_is_measured() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("cow", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = py(dir.path(), "cow.py", COPY_ON_READ);
    let log = dir.path().join("run.ndjson");
    let mut cmd = cg.command(
        std::path::Path::new(env!("CARGO_BIN_EXE_oomguard")),
        &[
            "run",
            "-q",
            "--interval",
            "250ms",
            "--pss-interval",
            "1s",
            // The re-reading waits until the budget pays for it; a larger
            // one keeps this short job short (the budget has its own tests).
            "--pss-budget",
            "5%",
            "--procs-interval",
            "250ms",
            "--log",
        ],
    );
    cmd.arg(&log).args(["--", "python3", &job, "5"]);
    assert_eq!(cmd.status().unwrap().code(), Some(0));
    let lines = read_log(&log);
    let max_worker_uss = lines
        .iter()
        .filter_map(|l| l.sample())
        .filter_map(|s| s.procs.as_ref())
        .flat_map(|ps| {
            ps.iter()
                .filter(|p| p.role == "worker")
                .map(|p| p.uss_bytes)
        })
        .max()
        .unwrap();
    assert!(
        max_worker_uss > 150 << 20,
        "worker USS never grew: {max_worker_uss}"
    );
}

/// `--log` with a pattern: one file per node and rank (`srun oomguard run
/// --log run-%N-%r.ndjson …`), from SLURM's variables.
#[test]
fn a_log_pattern_gives_each_node_its_own_file() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let pattern = dir.path().join("run-%j-%N-%r.ndjson");
    let out = oomguard()
        .args(["run", "--no-tui", "--cgroup", "off", "--log"])
        .arg(&pattern)
        .args(["--", "true"])
        .env("SLURM_JOB_ID", "77")
        .env("SLURM_NODEID", "1")
        .env("SLURM_PROCID", "5")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = read_log(&dir.path().join("run-77-1-5.ndjson"));
    assert!(!lines.is_empty());
    let bad = oomguard()
        .args(["run", "--no-tui", "--log", "run-%q.ndjson", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("'%q' is not a pattern"));
}

/// Training that grows 1 MiB a step, printing `step N/100000`; an
/// interrupt starts its teardown, which takes 10 MiB a step for 12 more
/// steps (steps still print), then it exits 1. It writes the step it was
/// at when the interrupt came to argv[1].
const GROWS_THEN_TEARS_DOWN: &str = r#"
import signal, sys, time
held, stop = [], []
signal.signal(signal.SIGINT, lambda *_: stop.append(1))
step = 0
while not stop:
    step += 1
    held.append(b"x" * (1 << 20))
    print("step %d/100000" % step, flush=True)
    time.sleep(0.04)
open(sys.argv[1], "w").write(str(step))
time.sleep(0.5)
for _ in range(12):
    step += 1
    held.append(b"x" * (10 << 20))
    print("step %d/100000" % step, flush=True)
    time.sleep(0.1)
sys.exit(1)
"#;

/// The end's estimate of the ceiling's step is the last one made before
/// the job began to exit (the interrupt), not one skewed by the teardown;
/// and an interrupt passed on to the job reads as one.
#[test]
fn the_ceiling_estimate_is_the_last_before_the_job_began_to_exit() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = py(dir.path(), "job.py", GROWS_THEN_TEARS_DOWN);
    let at = dir.path().join("interrupted-at");
    let log = dir.path().join("run.ndjson");
    let child = oomguard()
        .args([
            "run",
            "--no-tui",
            "--no-companion",
            "--cgroup",
            "off",
            "--policy",
            "none",
            "--budget",
            "1GiB",
            "--interval",
            "100ms",
            "--log-every-tick",
            "--log",
        ])
        .arg(&log)
        .args(["--", "python3", &job])
        .arg(&at)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Long enough for the growth per step to be measured.
    std::thread::sleep(Duration::from_secs(3));
    send(child.id(), "INT");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let interrupted_at: u64 = fs::read_to_string(&at).unwrap().trim().parse().unwrap();
    let lines = read_log(&log);
    // The estimate the log carried while the job still trained.
    let before = lines
        .iter()
        .filter(|l| matches!(l.event, Event::Sample(_)))
        .filter_map(|l| l.progress.as_ref())
        .filter(|p| p.step.is_some_and(|s| s <= interrupted_at))
        .filter_map(|p| p.ceiling_step)
        .next_back()
        .unwrap_or_else(|| panic!("no estimate before step {interrupted_at}\n{err}"));
    let said: u64 = err
        .split("the ceiling would be reached near step ")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no estimate in the summary\n{err}"));
    assert_eq!(said, before, "{err}");
    assert!(err.contains("was interrupted (Ctrl-C)"), "{err}");
}
