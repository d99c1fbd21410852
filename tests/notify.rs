//! Desktop notifications end to end: a private session bus, a monitor on
//! it, and the real binary warning about a job. No notification server is
//! needed: the monitor sees the `Notify` method call on its way.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// A child process killed (by its own pid) when the test ends.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// A session bus of its own at `dir/bus`, and its address.
fn private_bus(dir: &Path) -> (Owned, String) {
    let mut bus = Command::new("dbus-daemon")
        .arg("--session")
        .arg("--nofork")
        .arg("--print-address=1")
        .arg(format!("--address=unix:path={}", dir.join("bus").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The address is printed once the bus listens.
    let mut address = String::new();
    BufReader::new(bus.stdout.take().unwrap())
        .read_line(&mut address)
        .unwrap();
    let address = address.trim().to_string();
    assert!(
        address.starts_with("unix:"),
        "dbus-daemon printed {address:?}"
    );
    (Owned(bus), address)
}

/// Watches the bus for calls on the notification interface; what it sees
/// goes to `out`.
fn monitor(address: &str, out: &Path) -> Owned {
    let m = Command::new("dbus-monitor")
        .args(["--address", address])
        .arg("interface='org.freedesktop.Notifications'")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // dbus-monitor drops its bus name once it has become a monitor.
    assert!(
        wait_for(Duration::from_secs(10), || std::fs::read_to_string(out)
            .unwrap_or_default()
            .contains("NameLost")),
        "dbus-monitor never became a monitor"
    );
    Owned(m)
}

/// A run whose default warn rule fires at once (usage over 5 % of a
/// 64 MiB budget: python alone is more) and nothing else does.
fn warned_run(address: &str, extra: &[&str], ci: Option<&str>) -> String {
    let mut cmd = oomguard();
    cmd.args([
        "run",
        "--no-tui",
        "--cgroup",
        "off",
        "--budget",
        "64MiB",
        "--warn-at",
        "5%",
    ])
    .args(extra)
    .args(["--", "python3", "-c", "import time; time.sleep(2)"])
    .env("DBUS_SESSION_BUS_ADDRESS", address)
    .env_remove("CI")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if let Some(v) = ci {
        cmd.env("CI", v);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "stderr:\n{err}");
    assert!(
        err.contains("warning (warn-headroom)"),
        "the warn rule never fired; stderr:\n{err}"
    );
    err
}

fn notify_calls(seen: &Path) -> usize {
    std::fs::read_to_string(seen)
        .unwrap_or_default()
        .matches("member=Notify")
        .count()
}

#[test]
fn a_warning_is_a_desktop_notification_on_the_session_bus() {
    let _machine = common::machine::beside();
    if !require(
        have("dbus-daemon") && have("dbus-monitor"),
        "needs dbus-daemon and dbus-monitor (Debian: dbus-daemon, dbus-bin)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_bus, address) = private_bus(dir.path());
    let seen = dir.path().join("monitor.txt");
    let _monitor = monitor(&address, &seen);

    // Switched off: by the flag, and under CI=true.
    warned_run(&address, &["--no-notify"], None);
    warned_run(&address, &[], Some("true"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        notify_calls(&seen),
        0,
        "a notification was sent although switched off:\n{}",
        std::fs::read_to_string(&seen).unwrap()
    );

    warned_run(&address, &[], None);
    assert!(
        wait_for(Duration::from_secs(5), || notify_calls(&seen) == 1),
        "no Notify call on the bus:\n{}",
        std::fs::read_to_string(&seen).unwrap()
    );
    let text = std::fs::read_to_string(&seen).unwrap();
    let start = text[..text.find("member=Notify").unwrap()]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let call = &text[start..];
    assert!(
        call.starts_with("method call")
            && call
                .lines()
                .next()
                .unwrap()
                .contains("destination=org.freedesktop.Notifications"),
        "{text}"
    );
    // The app name, then the summary and a body naming the ceiling.
    assert!(call.contains(r#"string "oomguard""#), "{call}");
    assert!(
        call.contains(r#"string "oomguard: memory warning (warn-headroom)""#),
        "{call}"
    );
    assert!(
        call.contains("under the budget ceiling of 64.0 MiB"),
        "{call}"
    );
}
