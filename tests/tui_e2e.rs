//! The dashboard end to end in a real terminal (tmux): `oomguard demo`
//! shows the gauge, the tree and the events; `p` pauses the job (every
//! process in state T) and resumes it; `q` then `s` stops it and leaves the
//! terminal sane.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::schema;
use common::*;

/// A tmux session and the test's hold on the machine: its jobs run under
/// the tmux server, outside the test's own processes, so starting them
/// does not take the lock for it (common::machine).
struct Session(String, #[allow(dead_code)] common::machine::Held);

impl Session {
    /// A detached tmux session of `w`×`h` running a bare bash.
    fn start(name: String, w: u16, h: u16) -> Session {
        let s = Session(name, common::machine::beside());
        s.tmux(&[
            "new-session",
            "-d",
            "-s",
            &s.0,
            "-x",
            &w.to_string(),
            "-y",
            &h.to_string(),
            "bash --norc --noprofile",
        ]);
        std::thread::sleep(Duration::from_millis(300));
        s
    }

    /// Waits up to `secs` for `f(screen)`, failing with the screen.
    fn wait_screen(&self, secs: u64, what: &str, f: impl Fn(&str) -> bool) {
        assert!(
            wait_for(Duration::from_secs(secs), || f(&self.screen())),
            "{what}:\n{}",
            self.screen()
        );
    }

    /// `q` then `s` on the dashboard, and the shell's `EXIT=` line (a line
    /// of its own: the echoed command line also contains "EXIT="). Returns
    /// the screen then.
    fn quit_with_stop(&self) -> String {
        self.keys("q");
        self.wait_screen(3, "no stop prompt", |sc| sc.contains("stop it gracefully"));
        self.keys("s");
        self.wait_screen(30, "oomguard did not end", |sc| sc.lines().any(is_exit));
        let screen = self.screen();
        assert!(
            screen.contains("was stopped from the dashboard; exit"),
            "{screen}"
        );
        screen
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Lines the terminal wrapped are joined (`-J`): a long temporary
    /// directory in the summary's job line must not split its words.
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-t", &self.0, "-p", "-J"])
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", &self.0, keys]);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .status();
    }
}

/// The job's processes under oomguard: its descendants but its output
/// keeper, which is oomguard's own.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        for (c, _) in children_of(p) {
            if p == pid && is_keeper(c) {
                continue;
            }
            out.push(c);
            stack.push(c);
        }
    }
    out
}

#[test]
fn dashboard_in_tmux_pauses_resumes_and_quits_cleanly() {
    let _machine = common::machine::beside();
    let have_tmux = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !require(have_tmux, "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stty = dir.path().join("stty.txt");
    let s = Session::start(format!("oomguard-test-{}", std::process::id()), 160, 48);
    let cmd = format!(
        // Written aside and renamed: the redirection creates the file
        // before `stty` writes it, and the test read it empty (once in CI,
        // once here beside the other dashboard tests).
        "{} demo --tui; echo EXIT=$?; stty -a > {stty}.part && mv {stty}.part {stty}",
        env!("CARGO_BIN_EXE_oomguard"),
        stty = stty.display()
    );
    s.tmux(&["send-keys", "-t", &s.0, &cmd, "Enter"]);
    assert!(
        wait_for(Duration::from_secs(15), || {
            let sc = s.screen();
            sc.contains("Processes")
                && sc.contains("worker")
                && sc.contains('█')
                && sc.contains("budget")
        }),
        "no dashboard:\n{}",
        s.screen()
    );
    let shell: u32 = s
        .tmux(&["list-panes", "-t", &s.0, "-F", "#{pane_pid}"])
        .trim()
        .parse()
        .unwrap();
    let og = children_of(shell)
        .first()
        .map(|c| c.0)
        .expect("oomguard under the shell");
    assert!(
        wait_for(Duration::from_secs(10), || descendants(og).len() >= 5),
        "the demo tree did not start"
    );

    s.keys("p");
    assert!(
        wait_for(Duration::from_secs(5), || {
            let d = descendants(og);
            !d.is_empty() && d.iter().all(|&p| proc_state(p).is_none_or(|st| st == 'T'))
        }),
        "not paused: {:?}",
        descendants(og)
            .iter()
            .map(|&p| (p, proc_state(p)))
            .collect::<Vec<_>>()
    );
    assert!(
        wait_for(Duration::from_secs(3), || s.screen().contains("PAUSED")),
        "{}",
        s.screen()
    );
    s.keys("p");
    assert!(
        wait_for(Duration::from_secs(5), || descendants(og)
            .iter()
            .all(|&p| proc_state(p) != Some('T'))),
        "not resumed"
    );
    assert!(
        wait_for(Duration::from_secs(3), || s.screen().contains("resume")),
        "{}",
        s.screen()
    );

    let screen = s.quit_with_stop();
    assert!(screen.lines().any(|l| l.trim() == "EXIT=0"), "{screen}");
    // The terminal is back in cooked mode with echo.
    assert!(wait_for(Duration::from_secs(5), || stty.exists()));
    let modes = std::fs::read_to_string(&stty).unwrap();
    let words: Vec<&str> = modes.split_whitespace().collect();
    assert!(
        words.contains(&"icanon") && words.contains(&"echo"),
        "{modes}"
    );
}

/// A job that ignores SIGHUP (as `nohup` would) and writes its pid.
const IGNORES_HUP: &str = r#"
import os, signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.1)
"#;

/// A job that SIGHUP would end (the default disposition): a detached run
/// must not pass the hangup on.
const DIES_ON_HUP: &str = r#"
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.1)
"#;

fn have_tmux() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Starts `oomguard run --tui EXTRA -- python3 JOB PID_FILE` under bash in
/// a tmux session and returns (session, oomguard's pid, the job's pid, log).
fn dashboard_under_a_shell(
    dir: &std::path::Path,
    name: &str,
    extra: &str,
    job: &str,
) -> (Session, u32, u32, std::path::PathBuf) {
    let job = script(dir, "job.py", job);
    let pid_file = dir.join("job.pid");
    let log = dir.join("run.ndjson");
    let s = Session::start(format!("oomguard-{name}-{}", std::process::id()), 140, 40);
    let cmd = format!(
        "{} run --tui --kill-after 2s --log {} {extra} -- python3 {} {}",
        env!("CARGO_BIN_EXE_oomguard"),
        log.display(),
        job.display(),
        pid_file.display()
    );
    s.keys(&cmd);
    s.keys("Enter");
    assert!(
        wait_for(Duration::from_secs(15), || s.screen().contains("Processes")
            && std::fs::read_to_string(&pid_file)
                .is_ok_and(|p| !p.trim().is_empty())),
        "no dashboard:\n{}",
        s.screen()
    );
    let shell: u32 = s
        .tmux(&["list-panes", "-t", &s.0, "-F", "#{pane_pid}"])
        .trim()
        .parse()
        .unwrap();
    let og = children_of(shell)
        .first()
        .map(|c| c.0)
        .expect("oomguard under the shell");
    let job_pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (s, og, job_pid, log)
}

fn last_event(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let last = text.lines().last().unwrap_or("").to_string();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
    v["event"].as_str().unwrap_or("").to_string()
}

#[test]
fn closing_the_terminal_ends_the_run_with_run_end() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, og, job, log) = dashboard_under_a_shell(dir.path(), "hangup", "", IGNORES_HUP);
    // The terminal goes away with oomguard running under its shell.
    s.tmux(&["kill-session", "-t", &s.0]);
    // The job ignores SIGHUP: it is ended after --kill-after (2 s), and
    // oomguard ends instead of spinning on the dead terminal.
    let ended = wait_for(Duration::from_secs(15), || proc_state(og).is_none());
    let job_state = proc_state(job);
    if job_state.is_some() {
        let _ = Command::new("kill").args(["-9", &job.to_string()]).status();
    }
    if !ended {
        let _ = Command::new("kill").args(["-9", &og.to_string()]).status();
    }
    assert!(ended, "oomguard still running after its terminal hung up");
    assert_eq!(job_state, None, "the job outlived the hangup");
    let lines = read_log(&log);
    schema::check_envelope(&lines);
    let end = schema::run_end(&lines);
    assert_eq!(end.exit_code, 137);
    assert_eq!(last_event(&log), "run_end");
    let hangup = lines.iter().any(|l| {
        matches!(&l.event, schema::Event::Action(a)
            if a.reason == "terminal hangup"
                && a.result == "ok"
                && a.signal.as_deref() == Some("SIGHUP"))
    });
    assert!(hangup, "no hangup action");
}

#[test]
fn with_on_hangup_detach_the_run_goes_on_and_sigterm_ends_it() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, og, job, log) =
        dashboard_under_a_shell(dir.path(), "detach", "--on-hangup detach", DIES_ON_HUP);
    s.tmux(&["kill-session", "-t", &s.0]);
    std::thread::sleep(Duration::from_secs(3));
    let og_alive = proc_state(og).is_some();
    let job_alive = proc_state(job).is_some();
    // Still supervising, and not spinning on the dead terminal: at most a
    // few ticks of CPU over the next second.
    let cpu = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after = s.rfind(')').map_or("", |i| &s[i + 2..]);
        let f: Vec<&str> = after.split_whitespace().collect();
        f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    let before = cpu(og);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu(og) - before;
    if og_alive {
        send(og, "TERM");
    }
    let ended = wait_for(Duration::from_secs(15), || proc_state(og).is_none());
    if proc_state(job).is_some() {
        let _ = Command::new("kill").args(["-9", &job.to_string()]).status();
    }
    assert!(og_alive && job_alive, "detach ended the run");
    assert!(
        used < 50,
        "oomguard used {used} ticks of CPU in 1 s after the hangup"
    );
    assert!(ended, "SIGTERM did not end oomguard after the hangup");
    assert_eq!(last_event(&log), "run_end");
}

#[test]
fn a_killed_dashboard_leaves_the_trainer_its_terminal_to_checkpoint() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_s, og, job, _log) = dashboard_under_a_shell(dir.path(), "killed", "", SAVES_ON_TERM);
    let keeper = keeper_of(og).expect("no output keeper beside the job");
    // SIGKILL: the job gets its death signal, and its prints go on reaching
    // the terminal through the keeper (without it: EIO, and no checkpoint).
    let _ = Command::new("kill").args(["-9", &og.to_string()]).status();
    let ckpt = dir.path().join("ckpt");
    let saved = wait_for(Duration::from_secs(10), || ckpt.exists());
    if proc_state(job).is_some() {
        let _ = Command::new("kill").args(["-9", &job.to_string()]).status();
    }
    assert!(saved, "no checkpoint after the dashboard was killed");
    assert!(
        wait_for(Duration::from_secs(5), || proc_state(keeper)
            .is_none_or(|s| s == 'Z')),
        "the keeper outlived the job"
    );
}

/// A job that says it is ready, then waits for the test to stop it (at
/// most 30 s).
const READY_THEN_WAITS: &str = r#"
import sys, time
print("JOB-READY", flush=True)
time.sleep(float(sys.argv[1]))
"#;

/// `oomguard run` with neither `--tui` nor `--no-tui`, typed into a bash in
/// a tmux pane (a real terminal), its environment cleared of `CI` and of
/// every `OOMGUARD_*` variable (the tmux server's environment is not the
/// test's: the shell unsets them, whatever they are) and then given
/// `ci_env`. Returns the session once the job has printed its marker or
/// the dashboard is up, with the pane's alternate-screen flag seen then.
fn default_run(dir: &std::path::Path, name: &str, ci_env: &str, job_s: u32) -> (Session, bool) {
    let job = script(dir, "job.py", READY_THEN_WAITS);
    let s = Session::start(format!("oomguard-{name}-{}", std::process::id()), 140, 40);
    let cmd = format!(
        "for v in $(compgen -e | grep '^OOMGUARD_'); do unset $v; done; \
         env -u CI {ci_env} {} run -- python3 {} {job_s}; echo EXIT=$?",
        env!("CARGO_BIN_EXE_oomguard"),
        job.display()
    );
    s.keys(&cmd);
    s.keys("Enter");
    let mut alt = false;
    let up = wait_for(Duration::from_secs(15), || {
        let sc = s.screen();
        alt = s
            .tmux(&["display-message", "-p", "-t", &s.0, "#{alternate_on}"])
            .trim()
            == "1";
        (sc.contains("Processes") && sc.contains("q quit"))
            || sc.lines().any(|l| l.trim() == "JOB-READY")
    });
    assert!(
        up,
        "neither the dashboard nor the job's output:\n{}",
        s.screen()
    );
    (s, alt)
}

#[test]
fn default_dashboard_on_a_terminal_without_ci() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    common::deadline::arm_for(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let (s, alt) = default_run(dir.path(), "default-tui", "", 30);
    let screen = s.screen();
    assert!(
        alt && screen.contains("Processes") && screen.contains("q quit"),
        "no dashboard by default on a terminal without CI (alternate screen: {alt}):\n{screen}"
    );
    // The job's own output goes to the dashboard's Output pane, not over it.
    s.wait_screen(10, "the job's output is not in the Output pane", |sc| {
        sc.lines().any(|l| l.contains("│JOB-READY"))
    });
    s.quit_with_stop();
}

#[test]
fn default_with_ci_set_is_plain_output_on_a_terminal() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    common::deadline::arm_for(Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let (s, alt) = default_run(dir.path(), "default-ci", "CI=true", 2);
    s.wait_screen(20, "oomguard did not end", |sc| sc.lines().any(is_exit));
    let screen = s.screen();
    assert!(!alt, "alternate screen with CI=true:\n{screen}");
    assert!(
        screen.lines().any(|l| l.trim() == "JOB-READY"),
        "the job's output is not on the terminal:\n{screen}"
    );
    assert!(
        !screen.contains("Processes") && !screen.contains('█'),
        "a dashboard with CI=true:\n{screen}"
    );
    assert!(screen.lines().any(|l| l.trim() == "EXIT=0"), "{screen}");
}

/// Holds 150 MiB (written, so resident) and waits to be stopped.
const HOLDS_150_MIB: &str = r#"
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
held = b"x" * (150 << 20)
time.sleep(120)
"#;

/// The dashboard says WARNING while a warn rule fires, through the real
/// loop: a job that holds 150 MiB under a 200 MiB budget is past the 50 %
/// warning and short of the 95 % critical level, so nothing else happens.
#[test]
fn the_dashboard_shows_warning_while_the_warn_rule_fires() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, _og, _job, log) = dashboard_under_a_shell(
        dir.path(),
        "warning",
        "--budget 200MiB --warn-at 50% --critical-at 95%",
        HOLDS_150_MIB,
    );
    s.wait_screen(20, "the dashboard never said WARNING", |sc| {
        sc.contains("WARNING")
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(r#""event":"rule""#) && l.contains("firing")),
        "no warn rule fired:\n{text}"
    );
    s.keys("q");
    s.wait_screen(3, "no stop prompt", |sc| sc.contains("stop it gracefully"));
    s.keys("s");
    s.wait_screen(30, "oomguard did not end", |sc| {
        sc.contains("was stopped from the dashboard; exit")
    });
}

/// `oomguard run --tui` of the plain companion loop in tmux, its output
/// copied to a file: (session, the job's output file, the log, the
/// checkpoints' directory).
fn plain_loop_in_the_dashboard(
    dir: &std::path::Path,
    name: &str,
    save_seconds: u32,
) -> (Session, std::path::PathBuf, std::path::PathBuf) {
    let plain = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jobs/companion/plain.py");
    let log = dir.join("run.ndjson");
    let out = dir.join("job.out");
    let s = Session::start(format!("oomguard-{name}-{}", std::process::id()), 140, 40);
    let cmd = format!(
        "CKPT_DIR={d} LEAK_MB=0 SAVE_SECONDS={save_seconds} {} run --tui --cgroup off --no-notify \
         --log {} --output-log {} -- python3 {} 100000; echo EXIT=$?",
        env!("CARGO_BIN_EXE_oomguard"),
        log.display(),
        out.display(),
        plain.display(),
        d = dir.display(),
    );
    s.keys(&cmd);
    s.keys("Enter");
    assert!(
        wait_for(Duration::from_secs(30), || std::fs::read_to_string(&out)
            .is_ok_and(|t| t.contains("rank 0 completed step 10\r\n"))),
        "the job did not train:\n{}",
        s.screen()
    );
    (s, out, log)
}

/// The shell's `EXIT=` line: `EXIT=` and a number. The typed command's own
/// `EXIT=$?` can start a line too, where the pane wraps it (how depends on
/// the paths' length).
fn is_exit(line: &str) -> bool {
    line.strip_prefix("EXIT=")
        .is_some_and(|c| c.trim().parse::<i32>().is_ok())
}

fn exit_line(s: &Session, secs: u64) -> String {
    s.wait_screen(secs, "oomguard did not end", |sc| sc.lines().any(is_exit));
    let screen = s.screen();
    screen.lines().find(|l| is_exit(l)).unwrap().to_string()
}

/// Ctrl-C in the dashboard is a key: the first asks every rank to save
/// its last step (and says so), and the run exits 130 after the save.
#[test]
fn a_first_ctrl_c_in_the_dashboard_saves_the_last_step_and_exits_130() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, out, log) = plain_loop_in_the_dashboard(dir.path(), "ctrl-c", 0);
    s.keys("C-c");
    assert_eq!(exit_line(&s, 40), "EXIT=130", "{}", s.screen());
    let lines = read_log(&log);
    let done = lines.iter().rev().find_map(|l| match &l.event {
        schema::Event::CheckpointDone(v) => v["step"].as_u64(),
        _ => None,
    });
    let step = done.unwrap_or_else(|| panic!("no save\n{}", s.screen()));
    let job = std::fs::read_to_string(&out).unwrap();
    assert!(
        job.contains(&format!("rank 0 left after its checkpoint at step {step}")),
        "{job}"
    );
    assert!(dir.path().join(format!("ckpt-r0-{step}.json")).exists());
    assert_eq!(schema::run_end(&lines).outcome, "stopped_by_signal");
    // What the interrupt got, in the summary's first line.
    assert!(
        s.screen().contains(&format!(
            "was interrupted (Ctrl-C): checkpoint at step {step} ("
        )),
        "{}",
        s.screen()
    );
}

/// Ctrl-C in the dashboard with no companion to save is typed into the
/// job's terminal; the job ends as it handles an interrupt, and the
/// summary says it was interrupted (not just "was killed by SIGINT").
#[test]
fn a_ctrl_c_in_the_dashboard_without_a_companion_reads_as_an_interrupt() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, _og, _job, log) =
        dashboard_under_a_shell(dir.path(), "ctrl-c-plain", "--no-companion", DIES_ON_HUP);
    s.keys("C-c");
    // Python dies of the SIGINT its KeyboardInterrupt re-raises.
    s.wait_screen(20, "no interrupt in the summary", |sc| {
        sc.contains("was interrupted (Ctrl-C) and killed by SIGINT (exit 130)")
    });
    assert!(
        wait_for(Duration::from_secs(5), || last_event(&log) == "run_end"),
        "no run_end"
    );
    assert_eq!(schema::run_end(&read_log(&log)).outcome, "signaled");
}

/// The whole pane: what scrolled off the screen too.
fn scrollback(s: &Session) -> String {
    s.tmux(&["capture-pane", "-t", &s.0, "-p", "-S", "-"])
}

/// When the dashboard closes, the terminal keeps what it showed: the
/// run's events (the warning, the checkpoint with its file, the stop) and
/// the job's last output, then the summary.
#[test]
fn the_dashboard_leaves_its_events_and_the_jobs_last_output_behind() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let plain = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jobs/companion/plain.py");
    let log = dir.path().join("run.ndjson");
    let s = Session::start(
        format!("oomguard-afterword-{}", std::process::id()),
        140,
        40,
    );
    let cmd = format!(
        "CKPT_DIR={d} {} run --tui --cgroup off --no-notify --budget 400M --output-lines 5 \
         --log {} -- python3 {} 100000; echo EXIT=$?",
        env!("CARGO_BIN_EXE_oomguard"),
        log.display(),
        plain.display(),
        d = dir.path().display(),
    );
    s.keys(&cmd);
    s.keys("Enter");
    assert_eq!(exit_line(&s, 90), "EXIT=75", "{}", s.screen());
    let lines = read_log(&log);
    let (step, path) = lines
        .iter()
        .rev()
        .find_map(|l| match &l.event {
            schema::Event::CheckpointDone(v) => {
                Some((v["step"].as_u64()?, v["paths"][0].as_str()?.to_string()))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no save\n{}", s.screen()));
    let back = scrollback(&s);
    let after = back
        .split_once("oomguard: events:")
        .map(|(_, a)| a)
        .unwrap_or_else(|| panic!("no events after the dashboard closed:\n{back}"));
    let event = |what: &str| {
        after
            .lines()
            .any(|l| l.starts_with("oomguard: ") && l.contains(what))
    };
    assert!(event("warn"), "no warning:\n{back}");
    assert!(event(&path), "no checkpoint path:\n{back}");
    // The job's last lines, as it printed them.
    let (_, tail) = after
        .split_once("oomguard: the job's last 5 lines of output:")
        .unwrap_or_else(|| panic!("no output:\n{back}"));
    let last = tail.lines().take(5).collect::<Vec<_>>().join("\n");
    assert!(
        last.contains(&format!("rank 0 completed step {step}")),
        "{last}\n---\n{back}"
    );
    assert!(tail.contains("was stopped by oomguard ("), "{back}");
}

/// A second Ctrl-C while the save is under way is typed into the job's
/// terminal, as before: the person means now.
#[test]
fn a_second_ctrl_c_during_the_save_reaches_the_job() {
    let _machine = common::machine::beside();
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, out, _log) = plain_loop_in_the_dashboard(dir.path(), "ctrl-c-twice", 30);
    s.keys("C-c");
    assert!(
        wait_for(Duration::from_secs(20), || std::fs::read_to_string(&out)
            .is_ok_and(|t| t.contains("rank 0 saving step"))),
        "no save began:\n{}",
        s.screen()
    );
    s.keys("C-c");
    // Far sooner than the 30 s save: the job got the interrupt.
    exit_line(&s, 15);
    let job = std::fs::read_to_string(&out).unwrap();
    assert!(job.contains("KeyboardInterrupt"), "{job}\n{}", s.screen());
    assert!(!job.contains("left after its checkpoint"), "{job}");
}

/// In a cgroup of its own the job's footprint is that cgroup's working
/// set, and the dashboard's gauge shows that figure, named: 200 MiB
/// written to /dev/shm is charged to the job but mapped by no process, so
/// a gauge of the PSS sum (a few MiB) could not show it.
#[test]
fn the_dashboard_gauges_the_working_set_the_policy_compares() {
    if !require(have_tmux(), "needs tmux") {
        return;
    }
    let Some(cg) = MemCgroup::or_skip("tui-footprint", 1 << 30) else {
        return;
    };
    let _serial = common::machine::beside();
    common::deadline::arm_for(Duration::from_secs(120));
    let dir = tempfile::tempdir().unwrap();
    let job = ShmJob::new(dir.path(), "tui-footprint", 6);
    let log = dir.path().join("run.ndjson");
    let s = Session::start(
        format!("oomguard-footprint-{}", std::process::id()),
        160,
        45,
    );
    let cmd = format!(
        "sh -c 'echo $$ > {cg}/cgroup.procs && exec \"$@\"' sh {bin} run --tui --no-notify \
         --budget 900MiB --log {log} -- bash {job}; echo EXIT=$?",
        cg = cg.dir.display(),
        bin = env!("CARGO_BIN_EXE_oomguard"),
        log = log.display(),
        job = job.script.display(),
    );
    s.keys(&cmd);
    s.keys("Enter");
    // The gauge's figure once the file is written: "footprint (working
    // set) N MiB / 900 MiB".
    let figure = |screen: &str| -> Option<f64> {
        screen.lines().find_map(|l| {
            let (before, _) = l.split_once(" MiB / 900 MiB")?;
            let (label, n) = before.rsplit_once(' ')?;
            label
                .ends_with("footprint (working set)")
                .then(|| n.parse().ok())?
        })
    };
    s.wait_screen(20, "no gauge of the working set above 200 MiB", |sc| {
        figure(sc).is_some_and(|n| n >= 200.0)
    });
    let shown = figure(&s.screen()).unwrap();
    assert_eq!(exit_line(&s, 30), "EXIT=0", "{}", s.screen());
    drop(job);
    let lines = read_log(&log);
    let samples: Vec<_> = lines.iter().filter_map(|l| l.sample()).collect();
    let top = samples
        .iter()
        .map(|s| s.tree.footprint_bytes)
        .max()
        .unwrap();
    let pss = samples.iter().map(|s| s.tree.pss_bytes).max().unwrap();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    assert!(
        shown <= mib(top) + 0.5,
        "{shown} MiB shown, {} MiB logged",
        mib(top)
    );
    assert!(mib(pss) + 100.0 < shown, "PSS sum {} MiB", mib(pss));
}
