//! The dashboard's terminal plumbing with real processes and real
//! pseudo-terminals: the job's pty (output, size, Ctrl-C, controlling
//! terminal), and the dashboard itself run inside a pty (raw mode, keys,
//! resize, and the terminal restored on exit and on panic).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oomguard::sinks::tui::{self, App, PtyMaster, TermEvent, Tui, UiCommand, UiEvent};

/// Generous: these wait for other processes on a shared machine.
const TIMEOUT: Duration = Duration::from_secs(30);

/// `cmd` with the pty's slave as its terminal: stdin, stdout, stderr and
/// controlling terminal, in a session of its own.
fn spawn_on(slave: &OwnedFd, cmd: &mut Command) -> Child {
    common::deadline::arm();
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    set_controlling(cmd);
    cmd.spawn().unwrap()
}

#[allow(unsafe_code)]
fn set_controlling(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only calls
    // `make_controlling`, which makes two system calls on fd 0 (set up by
    // then) and allocates nothing.
    unsafe {
        cmd.pre_exec(|| tui::make_controlling(rustix::stdio::stdin()));
    }
}

/// Everything the master has produced so far, collected by a thread.
#[derive(Clone)]
struct Screen(Arc<Mutex<Vec<u8>>>);

impl Screen {
    fn collect(master: OwnedFd) -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let mut file = std::fs::File::from(master);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            // Ends with EIO once nobody has the slave open.
            while let Ok(n) = file.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        Self(buf)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    fn wait_for(&self, what: &str) -> String {
        let end = Instant::now() + TIMEOUT;
        loop {
            let t = self.text();
            if t.contains(what) {
                return t;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {what:?}; got:\n{}",
                t.escape_debug()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let end = Instant::now() + TIMEOUT;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("child did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn canonical_with_echo(fd: impl AsFd) -> bool {
    let t = rustix::termios::tcgetattr(fd).unwrap();
    let l = t.local_modes;
    l.contains(rustix::termios::LocalModes::ICANON) && l.contains(rustix::termios::LocalModes::ECHO)
}

#[test]
fn job_sees_a_terminal_and_its_output_arrives_through_the_master() {
    let _machine = common::machine::beside();
    let (master, slave) = tui::open_pty(91, 27).unwrap();
    let mut child = spawn_on(
        &slave,
        Command::new("sh").args(["-c", r#"tty; stty size; printf 'a\rb\n'"#]),
    );
    drop(slave);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(async {
        let m = PtyMaster::new(master).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // Until every holder of the slave has gone (Ok(0)).
        loop {
            let n = tokio::time::timeout(TIMEOUT, m.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    assert!(wait_exit(&mut child).success());
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("/dev/pts/"), "{text:?}");
    assert!(text.contains("27 91\r\n"), "{text:?}");
    assert!(text.ends_with("a\rb\r\n"), "{text:?}");
    // As the output pane shows it: the carriage return rewrote the line.
    let mut app_out = tui::OutputBuffer::default();
    app_out.feed(&out);
    assert_eq!(app_out.plain_line(app_out.len() - 1).unwrap(), "b");
}

#[test]
fn ctrl_c_and_resize_reach_the_job_like_in_a_terminal() {
    let _machine = common::machine::beside();
    let (master, slave) = tui::open_pty(80, 24).unwrap();
    // Python, not sh: a shell cannot trap a signal ignored when it started,
    // and SIGINT is ignored in the background jobs of a script (a test
    // run started with `&`).
    let script = r#"
import os, signal, sys, time
def winch(*_):
    size = os.get_terminal_size(0)
    print(size.lines, size.columns, flush=True)
def interrupted(*_):
    print("got-int", flush=True)
    sys.exit(3)
signal.signal(signal.SIGWINCH, winch)
signal.signal(signal.SIGINT, interrupted)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"#;
    let mut child = spawn_on(&slave, Command::new("python3").args(["-c", script]));
    drop(slave);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(async {
        let m = PtyMaster::new(master).unwrap();
        let mut out = String::new();
        let mut buf = [0u8; 4096];
        let mut step = 0;
        loop {
            let n = tokio::time::timeout(TIMEOUT, m.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&String::from_utf8_lossy(&buf[..n]));
            if step == 0 && out.contains("ready") {
                m.resize(132, 43).unwrap();
                step = 1;
            }
            if step == 1 && out.contains("43 132") {
                m.interrupt().unwrap();
                step = 2;
            }
        }
        out
    });
    let st = wait_exit(&mut child);
    assert_eq!(st.code(), Some(3), "{out:?}");
    assert!(out.contains("got-int"), "{out:?}");
    // The interrupt character is echoed as a terminal does.
    assert!(out.contains("^C"), "{out:?}");
}

/// The dashboard side of `the_dashboard_takes_and_gives_back_the_terminal`:
/// runs only when started by it, inside a pty (ignored otherwise, so a
/// plain run does not report it as a test that passed).
#[test]
#[ignore = "run by the_dashboard_takes_and_gives_back_the_terminal in a pty"]
fn dashboard_child_process() {
    let mode = std::env::var("OOMGUARD_TUI_CHILD")
        .expect("run by the_dashboard_takes_and_gives_back_the_terminal only");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let quit = rt.block_on(async {
        let mut tui = Tui::new().unwrap();
        let mut app = App::new("child under test".into());
        tui.draw(&app).unwrap();
        assert!(tui::term::is_active());
        if mode == "panic" {
            panic!("deliberate panic inside the dashboard");
        }
        loop {
            match tui.next_event().await.unwrap() {
                TermEvent::Key(k) => {
                    if let Some(UiCommand::Quit { stop_job }) = app.on_key(k) {
                        break stop_job;
                    }
                }
                TermEvent::Resize { cols, rows } => app.on_event(UiEvent::Note {
                    t: 0.0,
                    severity: tui::Severity::Info,
                    text: format!("resized-to-{cols}x{rows}"),
                }),
            }
            tui.draw(&app).unwrap();
        }
    });
    assert!(!tui::term::is_active());
    let mut out = std::io::stdout();
    writeln!(out, "CHILD-DONE stop_job={quit}").unwrap();
    out.flush().unwrap();
}

fn dashboard_in_pty(mode: &str) -> (Child, Screen, OwnedFd, OwnedFd) {
    let (master, slave) = tui::open_pty(100, 30).unwrap();
    let writer = master.try_clone().unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "--ignored",
        "tui::dashboard_child_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("OOMGUARD_TUI_CHILD", mode)
    .env(common::machine::CHILD, "1")
    .env("TERM", "xterm-256color");
    let child = spawn_on(&slave, &mut cmd);
    // The parent keeps the slave so the terminal's settings can be read
    // after the child has gone.
    (child, Screen::collect(master), writer, slave)
}

#[test]
fn the_dashboard_takes_and_gives_back_the_terminal() {
    let _machine = common::machine::beside();
    let (mut child, screen, master, slave) = dashboard_in_pty("keys");
    screen.wait_for("Processes");
    // Raw mode while the dashboard runs.
    assert!(!canonical_with_echo(&slave));
    // A resize is noticed and redrawn.
    tui::set_window_size(&master, 120, 40).unwrap();
    screen.wait_for("resized-to-120x40");
    let mut keys = std::fs::File::from(master.try_clone().unwrap());
    keys.write_all(b"?").unwrap();
    screen.wait_for("Keys");
    keys.write_all(b"?").unwrap();
    keys.write_all(b"q").unwrap();
    screen.wait_for("detach");
    keys.write_all(b"d").unwrap();
    let text = screen.wait_for("CHILD-DONE stop_job=false");
    assert!(wait_exit(&mut child).success(), "{}", text.escape_debug());
    let enter = text
        .find("\x1b[?1049h")
        .expect("entered the alternate screen");
    let leave = text
        .rfind("\x1b[?1049l")
        .expect("left the alternate screen");
    let done = text.find("CHILD-DONE").unwrap();
    assert!(enter < leave && leave < done, "{}", text.escape_debug());
    assert!(canonical_with_echo(&slave), "terminal left in raw mode");
}

#[test]
fn a_panic_restores_the_terminal_before_it_is_reported() {
    let _machine = common::machine::beside();
    let (mut child, screen, _master, slave) = dashboard_in_pty("panic");
    let text = screen.wait_for("deliberate panic");
    let st = wait_exit(&mut child);
    assert!(!st.success());
    let leave = text
        .rfind("\x1b[?1049l")
        .expect("left the alternate screen");
    let report = text.find("deliberate panic").unwrap();
    assert!(leave < report, "{}", text.escape_debug());
    assert!(canonical_with_echo(&slave), "terminal left in raw mode");
}
