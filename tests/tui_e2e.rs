//! The dashboard end to end in a real terminal (tmux): `oomguard demo`
//! shows the gauge, the tree and the events; `p` pauses the job (every
//! process in state T) and resumes it; `q` then `s` stops it and leaves the
//! terminal sane.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

struct Session(String);

impl Session {
    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-t", &self.0, "-p"])
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

fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        for (c, _) in children_of(p) {
            out.push(c);
            stack.push(c);
        }
    }
    out
}

#[test]
fn dashboard_in_tmux_pauses_resumes_and_quits_cleanly() {
    let have_tmux = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !require(have_tmux, "needs tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stty = dir.path().join("stty.txt");
    let s = Session(format!("oomguard-test-{}", std::process::id()));
    s.tmux(&[
        "new-session",
        "-d",
        "-s",
        &s.0,
        "-x",
        "160",
        "-y",
        "48",
        "bash --norc --noprofile",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let cmd = format!(
        "{} demo --tui; echo EXIT=$?; stty -a > {}",
        env!("CARGO_BIN_EXE_oomguard"),
        stty.display()
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

    s.keys("q");
    assert!(
        wait_for(Duration::from_secs(3), || s
            .screen()
            .contains("stop it gracefully")),
        "{}",
        s.screen()
    );
    s.keys("s");
    assert!(
        // A line of its own: the echoed command line also contains "EXIT=".
        wait_for(Duration::from_secs(30), || s
            .screen()
            .lines()
            .any(|l| l.starts_with("EXIT="))),
        "{}",
        s.screen()
    );
    let screen = s.screen();
    assert!(screen.lines().any(|l| l.trim() == "EXIT=0"), "{screen}");
    assert!(
        screen.contains("stopped by oomguard (manual stop (dashboard))"),
        "{screen}"
    );
    // The terminal is back in cooked mode with echo.
    assert!(wait_for(Duration::from_secs(5), || stty.exists()));
    let modes = std::fs::read_to_string(&stty).unwrap();
    let words: Vec<&str> = modes.split_whitespace().collect();
    assert!(
        words.contains(&"icanon") && words.contains(&"echo"),
        "{modes}"
    );
}
