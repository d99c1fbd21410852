//! A cgroup of one's own without root, from the user's systemd manager: a
//! transient scope with `Delegate=yes` asked for over the session bus
//! (`StartTransientUnit`, as `systemd-run --user --scope` does), so that a
//! normal user on cgroup v2 gets the exact footprint, `memory.high` and
//! the job's `memory.events`.
//!
//! This module owns finding the user bus ([`user_scope_support`], cheap
//! and without side effects, also for `oomguard doctor`), deciding whether
//! leaving the current cgroup is allowed ([`may_leave`]: never SLURM's,
//! never one whose memory limit the scope would escape) and the D-Bus
//! exchange that moves oomguard into the scope ([`start_user_scope`]). What
//! happens inside the scope (the supervisor leaf, the job's cgroup) is
//! `probe::cgroup::OwnedCgroup`'s, as for any delegated cgroup.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zbus::Variant as Value;

use crate::engine::probe::cgroup::{self, Location, Version};

/// How long the user manager gets to move oomguard into the scope. It
/// takes milliseconds on a live manager; a stuck one must not hold the job.
pub const SCOPE_DEADLINE: Duration = Duration::from_secs(5);

/// Where the user's bus was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserBus {
    /// A D-Bus address (`unix:path=/run/user/1000/bus`).
    pub address: String,
    /// `DBUS_SESSION_BUS_ADDRESS`, or `$XDG_RUNTIME_DIR/bus`.
    pub found_in: &'static str,
}

/// Why oomguard did not get a scope from the user manager.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error(
        "cannot connect to the user bus at '{address}' ({found_in}): {source}; is the user's systemd manager running (`loginctl enable-linger` keeps it up)?"
    )]
    Connect {
        address: String,
        found_in: &'static str,
        source: zbus::Error,
    },
    #[error(
        "the user's systemd manager refused the scope '{unit}': {source}; `systemd-run --user --scope -p Delegate=yes oomguard run ...` shows whether a user scope works here"
    )]
    Start { unit: String, source: zbus::Error },
    #[error(
        "the user's systemd manager did not move oomguard into the scope '{unit}' within {waited:?} (oomguard is still in '{now}')"
    )]
    Timeout {
        unit: String,
        waited: Duration,
        now: String,
    },
    #[error("cannot read oomguard's own cgroup from /proc/self/cgroup")]
    Locate,
    #[error(
        "the user scope '{0}' has no memory controller: the user manager was not given it (`Delegate=` of user@.service lacks `memory`; a drop-in with `Delegate=pids memory cpu` gives it)"
    )]
    NoMemory(PathBuf),
}

/// Whether a session bus is there, to carry desktop notifications and to
/// ask the user's systemd for a scope: the one test of it.
pub fn session_bus() -> bool {
    user_scope_support().is_ok()
}

/// Whether a user scope can be asked for: the user bus's address, or why
/// there is none. Reads the environment and stats one socket, nothing else.
pub fn user_scope_support() -> Result<UserBus, String> {
    if let Some(a) = std::env::var_os("DBUS_SESSION_BUS_ADDRESS").filter(|a| !a.is_empty()) {
        return match a.into_string() {
            Ok(address) => Ok(UserBus {
                address,
                found_in: "DBUS_SESSION_BUS_ADDRESS",
            }),
            Err(_) => Err("DBUS_SESSION_BUS_ADDRESS is not valid UTF-8".to_string()),
        };
    }
    // Only what a login set up: guessing /run/user/<uid>/bus would hand
    // cron and batch jobs a scope outside the cgroup their runner chose.
    let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) else {
        return Err(no_bus(
            "DBUS_SESSION_BUS_ADDRESS and XDG_RUNTIME_DIR unset (as after su or sudo, in cron and batch jobs)",
        ));
    };
    let socket = PathBuf::from(runtime).join("bus");
    match fs::metadata(&socket) {
        Ok(m) if m.file_type().is_socket() => Ok(UserBus {
            address: format!("unix:path={}", socket.display()),
            found_in: "XDG_RUNTIME_DIR",
        }),
        _ => Err(no_bus(&format!(
            "DBUS_SESSION_BUS_ADDRESS unset and {} missing",
            socket.display()
        ))),
    }
}

fn no_bus(why: &str) -> String {
    format!(
        "no user bus: {why}; run under `systemd-run --user --scope -p Delegate=yes` or in a delegated cgroup for a cgroup of the job's own"
    )
}

/// Whether oomguard may leave `current` for a scope of the user manager
/// (below `/user.slice/user-<uid>.slice/user@<uid>.service`): not when the
/// cgroup is SLURM's (the job's accounting and limits are there), nor when
/// it or an ancestor the scope would not share has a memory limit (the
/// job would escape it).
pub fn may_leave(current: &Location, uid: u32) -> Result<(), String> {
    if current.version != Version::V2 {
        return Err("cgroup v1: the user manager cannot delegate a memory cgroup".to_string());
    }
    if current.path.contains("slurm") {
        return Err(format!(
            "'{}' is SLURM's: oomguard reads it and creates nothing, and never leaves it (SLURM accounts and limits the job by it)",
            current.path
        ));
    }
    let manager = format!("/user.slice/user-{uid}.slice/user@{uid}.service");
    let mut path = current.path.trim_end_matches('/').to_string();
    while !path.is_empty() && !is_ancestor(&path, &manager) {
        let dir = current.mount_point.join(path.trim_start_matches('/'));
        for file in ["memory.max", "memory.high"] {
            let limit = fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|t| cgroup::parse_limit(&t))
                .flatten();
            if let Some(bytes) = limit {
                return Err(format!(
                    "'{path}' has {file} {bytes} bytes, which a user scope would escape; oomguard stays and reads it"
                ));
            }
        }
        match path.rfind('/') {
            Some(i) => path.truncate(i),
            None => break,
        }
    }
    Ok(())
}

/// `a` is `b` or one of its ancestors (cgroup paths, `/`-separated).
fn is_ancestor(a: &str, b: &str) -> bool {
    b == a || b.strip_prefix(a).is_some_and(|rest| rest.starts_with('/'))
}

/// Asks the user manager on `bus` for a transient scope with `Delegate=yes`
/// holding oomguard, waits until oomguard is in it and returns its cgroup
/// (with `memory` available to its children). The scope is collected by
/// systemd when its last process exits.
pub async fn start_user_scope(
    bus: &UserBus,
    proc_root: &Path,
) -> Result<(String, Location), ScopeError> {
    let pid = std::process::id();
    // Unique when a pid is reused while an old scope of the same name is
    // still being collected.
    let unit = format!("oomguard-{pid}-{:08x}.scope", crate::vocab::clock::nonce());
    let conn = zbus::connection::Builder::address(bus.address.as_str())
        .build()
        .await
        .map_err(|source| connect_error(bus, source))?;
    let properties: Vec<(&str, Value<'_>)> = vec![
        ("PIDs", Value::from(vec![pid])),
        ("Delegate", Value::from(true)),
        (
            "Description",
            Value::from("oomguard: the job's own memory cgroup"),
        ),
        ("CollectMode", Value::from("inactive-or-failed")),
    ];
    let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
    conn.call_method(
        Some("org.freedesktop.systemd1"),
        "/org/freedesktop/systemd1",
        Some("org.freedesktop.systemd1.Manager"),
        "StartTransientUnit",
        &(unit.as_str(), "fail", properties, aux),
    )
    .await
    .map_err(|source| ScopeError::Start {
        unit: unit.clone(),
        source,
    })?;
    // The job that moves oomguard runs after the reply; /proc/self/cgroup
    // names the scope once it is done (no signal subscription to race).
    let started = Instant::now();
    let loc = loop {
        let loc = cgroup::locate(proc_root, "self").ok_or(ScopeError::Locate)?;
        if loc.path.ends_with(&format!("/{unit}")) {
            break loc;
        }
        if started.elapsed() > SCOPE_DEADLINE {
            return Err(ScopeError::Timeout {
                unit,
                waited: SCOPE_DEADLINE,
                now: loc.path,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let controllers = fs::read_to_string(loc.dir().join("cgroup.controllers")).unwrap_or_default();
    if !controllers.split_ascii_whitespace().any(|c| c == "memory") {
        return Err(ScopeError::NoMemory(loc.dir()));
    }
    Ok((unit, loc))
}

fn connect_error(bus: &UserBus, source: zbus::Error) -> ScopeError {
    ScopeError::Connect {
        address: bus.address.clone(),
        found_in: bus.found_in,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(root: &Path, path: &str) -> Location {
        Location {
            version: Version::V2,
            mount_point: root.to_path_buf(),
            path: path.to_string(),
        }
    }

    #[test]
    fn slurm_and_limited_cgroups_are_not_left() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let session = "/user.slice/user-1000.slice/session-3.scope";
        fs::create_dir_all(root.join(session.trim_start_matches('/'))).unwrap();
        fs::write(
            root.join("user.slice/user-1000.slice/memory.max"),
            "1073741824\n",
        )
        .unwrap();
        fs::write(root.join(format!("{}/memory.max", &session[1..])), "max\n").unwrap();
        // The per-user limit is shared with the user manager's scopes.
        assert_eq!(may_leave(&loc(root, session), 1000), Ok(()));
        fs::write(
            root.join(format!("{}/memory.high", &session[1..])),
            "500000000\n",
        )
        .unwrap();
        let why = may_leave(&loc(root, session), 1000).unwrap_err();
        assert!(why.contains("memory.high 500000000"), "{why}");
        let step = "/system.slice/slurmstepd.scope/job_7/step_0/user/task_0";
        let why = may_leave(&loc(root, step), 1000).unwrap_err();
        assert!(why.contains("SLURM"), "{why}");
        // A system service without limits (a batch runner's) may be left.
        fs::create_dir_all(root.join("system.slice/runner.service")).unwrap();
        assert_eq!(
            may_leave(&loc(root, "/system.slice/runner.service"), 1000),
            Ok(())
        );
    }

    #[test]
    fn ancestry() {
        assert!(is_ancestor("/user.slice", "/user.slice/user-1.slice"));
        assert!(!is_ancestor(
            "/user.slice/user-1",
            "/user.slice/user-1.slice"
        ));
        assert!(is_ancestor("/a", "/a"));
    }
}
