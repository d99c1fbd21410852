//! The job as oomguard's child: its leader process, how it ended, the
//! signal that began a shutdown, the cgroup oomguard runs it in, the
//! foreground it may hold, and oomguard's other children (the hooks). Every
//! signal the loop sends goes through its `Signaller`, and every process it
//! starts or reaps through its `Host`: the loop's tests pass fakes of both
//! to the constructor.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::Path;

use crate::engine::probe::cgroup::OwnedCgroup;
use crate::job::relay::JobStdio;
use crate::job::supervise::{Job, SpawnError, Status};

use super::act::Signaller;
use super::hooks::Hooks;
use super::host::{Host, Launch};

pub(super) struct Child {
    job: Job,
    /// How the job's leader ended, once it has (this attempt).
    status: Option<Status>,
    /// The INT or TERM (or HUP) that started the shutdown, if one did.
    shutdown_signal: Option<i32>,
    /// The cgroup oomguard made for the job (removed when dropped).
    owned: Option<OwnedCgroup>,
    /// The job holds the terminal's foreground (given back at the end).
    foreground: bool,
    /// The hooks running, and when a hung one is killed.
    hooks: Hooks,
    sig: Box<dyn Signaller>,
    host: Box<dyn Host>,
}

impl Child {
    pub fn new(
        job: Job,
        owned: Option<OwnedCgroup>,
        foreground: bool,
        sig: Box<dyn Signaller>,
        host: Box<dyn Host>,
    ) -> Self {
        Self {
            job,
            status: None,
            shutdown_signal: None,
            owned,
            foreground,
            hooks: Hooks::default(),
            sig,
            host,
        }
    }

    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The job's leader.
    pub fn pid(&self) -> u32 {
        self.job.pid
    }

    /// The next attempt's leader, not ended yet.
    pub fn started(&mut self, job: Job) {
        self.job = job;
        self.status = None;
    }

    pub fn status(&self) -> Option<Status> {
        self.status
    }

    pub fn ended(&mut self, status: Status) {
        self.status = Some(status);
    }

    pub fn shutdown_signal(&self) -> Option<i32> {
        self.shutdown_signal
    }

    pub fn shutting_down(&mut self, sig: i32) {
        self.shutdown_signal = Some(sig);
    }

    pub fn owned(&self) -> Option<&OwnedCgroup> {
        self.owned.as_ref()
    }

    /// Removes the cgroup oomguard made (the job is gone).
    pub fn drop_cgroup(&mut self) {
        drop(self.owned.take());
    }

    pub fn foreground(&self) -> bool {
        self.foreground
    }

    /// The job no longer holds the foreground (it was given back).
    pub fn left_foreground(&mut self) {
        self.foreground = false;
    }

    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    pub fn hooks_mut(&mut self) -> &mut Hooks {
        &mut self.hooks
    }

    pub fn sig(&self) -> &dyn Signaller {
        &*self.sig
    }

    pub fn sig_mut(&mut self) -> &mut dyn Signaller {
        &mut *self.sig
    }

    pub fn host(&mut self) -> &mut dyn Host {
        &mut *self.host
    }

    /// Starts an attempt in the job's cgroup, holding the foreground the
    /// job holds; on success it is the job.
    pub fn launch(
        &mut self,
        proc_root: &Path,
        argv: &[OsString],
        env: Vec<(OsString, OsString)>,
        pty_slave: Option<&OwnedFd>,
        relayed: Option<JobStdio>,
    ) -> Result<Job, SpawnError> {
        self.host.launch(
            proc_root,
            Launch {
                argv,
                env,
                owned: self.owned.as_ref(),
                foreground: self.foreground,
                pty_slave,
                relayed,
            },
        )
    }
}
