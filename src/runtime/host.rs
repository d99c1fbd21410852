//! What the loop asks of the operating system besides signals (those go
//! through `act::Signaller`): start an attempt, reap oomguard's children,
//! start a hook. Behind a trait, so the loop's tests run the real loop
//! with no process at all.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crate::engine::probe::cgroup::OwnedCgroup;
use crate::job::relay::JobStdio;
use crate::job::supervise::{self, Job, Reaped, SpawnError, SpawnSpec};

/// One attempt's start: what it runs, with what, and where its output goes.
pub(super) struct Launch<'a> {
    pub argv: &'a [OsString],
    pub env: Vec<(OsString, OsString)>,
    pub owned: Option<&'a OwnedCgroup>,
    /// The job gets the terminal's foreground.
    pub foreground: bool,
    /// The dashboard's pty, the job's terminal.
    pub pty_slave: Option<&'a OwnedFd>,
    /// The relay's ends, the job's stdout and stderr.
    pub relayed: Option<JobStdio>,
}

pub(super) trait Host {
    fn launch(&mut self, proc_root: &Path, launch: Launch<'_>) -> Result<Job, SpawnError>;
    /// Every child that has exited, reaped.
    fn reap(&mut self) -> Vec<Reaped>;
    /// Starts a hook; its pid.
    fn run_hook(&mut self, cmd: std::process::Command) -> std::io::Result<u32>;
}

/// The real one.
pub(super) struct Os;

impl Host for Os {
    fn launch(&mut self, proc_root: &Path, l: Launch<'_>) -> Result<Job, SpawnError> {
        launch(proc_root, l)
    }

    fn reap(&mut self) -> Vec<Reaped> {
        supervise::reap_all()
    }

    fn run_hook(&mut self, mut cmd: std::process::Command) -> std::io::Result<u32> {
        // Dropped, not waited for: oomguard's reaper reaps it.
        cmd.spawn().map(|child| child.id())
    }
}

/// Starts an attempt (also the first, before the loop has a host).
pub(super) fn launch(proc_root: &Path, l: Launch<'_>) -> Result<Job, SpawnError> {
    let stdin = std::io::stdin();
    let stdio = |fd: &OwnedFd| fd.try_clone().ok().map(std::process::Stdio::from);
    let (out, err) = match l.relayed {
        Some(j) => (Some(j.stdout), Some(j.stderr)),
        None => (l.pty_slave.and_then(stdio), l.pty_slave.and_then(stdio)),
    };
    supervise::spawn(
        SpawnSpec {
            argv: l.argv.to_vec(),
            env: l.env,
            cgroup_procs: l.owned.map(|o| o.procs_file()),
            foreground_tty: l.foreground.then(|| stdin.as_fd()),
            controlling_tty: l.pty_slave.map(|s| s.as_fd()),
            stdin: l.pty_slave.and_then(stdio),
            stdout: out,
            stderr: err,
        },
        proc_root,
    )
}
