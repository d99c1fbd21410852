//! Launching the job and owning its processes: spawn in its own process
//! group (and cgroup), become a child subreaper, reap everything that is
//! ours, and signal only processes that are provably in the tree.
//!
//! One reaper owns every `waitpid`: oomguard never uses `tokio::process`
//! or `Command::wait`, which would race with the subreaper loop for the
//! same statuses. Signals go through a pidfd opened *before* the start time
//! is checked, so a pid recycled between the scan and the signal is never
//! hit.

use std::ffi::{CString, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};

use crate::engine::probe::proc::parse_stat;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Exited(i32),
    Signaled(i32),
}

impl Status {
    /// The shell convention: the exit code, or 128 + the signal number.
    pub fn code(self) -> i32 {
        match self {
            Status::Exited(c) => c,
            Status::Signaled(s) => 128 + s,
        }
    }
}

/// Why the job could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot run '{cmd}': command not found")]
    NotFound { cmd: String },
    #[error("cannot run '{cmd}': permission denied (is it executable?)")]
    NotExecutable { cmd: String },
    #[error("cannot run '{cmd}': {source}")]
    Other { cmd: String, source: io::Error },
    /// oomguard itself ran short (descriptors, memory, processes): nothing
    /// is wrong with the command, so this is an internal error, not 126.
    #[error("cannot start '{cmd}': {source}")]
    OutOfResources { cmd: String, source: io::Error },
    #[error("no command given (usage: oomguard run [OPTIONS] -- COMMAND [ARGS...])")]
    Empty,
}

impl SpawnError {
    /// 127 for a missing command, 126 for one that cannot be executed;
    /// `None` when oomguard, not the command, is at fault.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            SpawnError::NotFound { .. } | SpawnError::Empty => Some(127),
            SpawnError::NotExecutable { .. } | SpawnError::Other { .. } => Some(126),
            SpawnError::OutOfResources { .. } => None,
        }
    }

    fn of(cmd: &str, e: io::Error) -> SpawnError {
        let cmd = cmd.to_owned();
        match e.kind() {
            io::ErrorKind::NotFound => SpawnError::NotFound { cmd },
            io::ErrorKind::PermissionDenied => SpawnError::NotExecutable { cmd },
            _ if out_of_resources(&e) => SpawnError::OutOfResources { cmd, source: e },
            _ => SpawnError::Other { cmd, source: e },
        }
    }
}

/// oomguard (not the user's command or path) ran short: descriptors,
/// memory or processes. Such failures are internal errors (exit 70).
pub fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN)
    )
}

/// What to start and how.
#[derive(Debug, Default)]
pub struct SpawnSpec<'a> {
    pub argv: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// `cgroup.procs` of a cgroup the child joins before exec.
    pub cgroup_procs: Option<&'a CString>,
    /// The controlling terminal, when the job should become its foreground
    /// process group (interactive runs: Ctrl-C, pdb and tqdm work as
    /// without oomguard).
    pub foreground_tty: Option<BorrowedFd<'a>>,
    /// A terminal (the dashboard's pty) to become the job's controlling
    /// terminal, in a session of its own (`setsid` + `TIOCSCTTY`).
    pub controlling_tty: Option<BorrowedFd<'a>>,
    /// Replacement stdout/stderr (the TUI and output scanning pipe them).
    pub stdout: Option<Stdio>,
    pub stderr: Option<Stdio>,
    pub stdin: Option<Stdio>,
}

/// The job's main process.
#[derive(Debug)]
pub struct Job {
    pub pid: u32,
    pub start_time: u64,
    /// A pidfd, where the kernel has them (5.3+).
    pub pidfd: Option<OwnedFd>,
}

/// Makes oomguard a child subreaper, so orphaned workers and processes that
/// left the job's session are re-parented to it, stay in the tree and are
/// reaped by it.
pub fn become_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).map_err(io::Error::from)
}

/// Starts the job in a new process group (in a session of its own unless it
/// takes the terminal's foreground).
pub fn spawn(spec: SpawnSpec<'_>, proc_root: &Path) -> Result<Job, SpawnError> {
    let Some(program) = spec.argv.first() else {
        return Err(SpawnError::Empty);
    };
    let cmd_name = program.to_string_lossy().into_owned();
    let mut cmd = Command::new(program);
    cmd.args(&spec.argv[1..]);
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    // A job that does not take the terminal's foreground gets a session of
    // its own, not only a process group: were it in oomguard's session,
    // oomguard's death would orphan its group, and if oomguard had paused
    // it, the kernel would send the group SIGHUP (with SIGCONT), which is
    // delivered before the death signal and kills a trainer that does not
    // catch it before it can save. A group in another session is never
    // "orphaned" that way. A foreground job must stay in the terminal's
    // session to be its foreground group. A new session is also a new
    // process group (pgid = pid), and setsid fails for a group leader, so
    // only one of the two.
    let own_session = spec.controlling_tty.is_some() || spec.foreground_tty.is_none();
    if !own_session {
        cmd.process_group(0);
    }
    if let Some(s) = spec.stdout {
        cmd.stdout(s);
    }
    if let Some(s) = spec.stderr {
        cmd.stderr(s);
    }
    if let Some(s) = spec.stdin {
        cmd.stdin(s);
    }
    let cgroup = spec.cgroup_procs.cloned();
    let tty = spec.foreground_tty.map(|fd| fd.as_raw_fd());
    let ctty = spec.controlling_tty.map(|fd| fd.as_raw_fd());
    let supervisor = std::process::id() as libc::pid_t;
    child_setup(&mut cmd, supervisor, cgroup, tty, ctty, own_session);
    let child = cmd.spawn().map_err(|e| SpawnError::of(&cmd_name, e))?;
    let pid = child.id();
    // `child` is dropped without waiting: the reaper owns the status. Its
    // pid cannot be reused before we reap it, so this pidfd is the child.
    drop(child);
    let pidfd = Pid::from_raw(pid as i32)
        .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
    let start_time = read_start_time(proc_root, pid).unwrap_or(0);
    Ok(Job {
        pid,
        start_time,
        pidfd,
    })
}

/// The signal the job's main process gets when oomguard dies (however it
/// dies, SIGKILL included): SIGTERM, so a trainer can still checkpoint and
/// a launcher such as torchrun passes it on to its ranks.
pub const DEATH_SIGNAL: i32 = libc::SIGTERM;

/// Runs in the forked child before exec: ask for a death signal, join the
/// cgroup, take the terminal.
#[allow(unsafe_code)]
fn child_setup(
    cmd: &mut Command,
    supervisor: libc::pid_t,
    cgroup: Option<CString>,
    tty: Option<i32>,
    ctty: Option<i32>,
    own_session: bool,
) {
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (prctl, getppid, open, write, close, sigaction,
    // tcsetpgrp, getpid, setsid, ioctl) on data prepared before the fork; it
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // The job must not outlive its supervisor unsupervised. The
            // signal comes when the forking *thread* ends: oomguard spawns
            // from its main thread, which lives as long as the process.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                DEATH_SIGNAL as libc::c_ulong,
                0,
                0,
                0,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            // Killed between the fork and the prctl, oomguard sent no death
            // signal and never will: the job would start unsupervised (and
            // fill a cgroup nobody removes). Leave instead.
            if libc::getppid() != supervisor {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(path) = &cgroup {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
            }
            if own_session && libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(fd) = ctty
                && libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0
            {
                return Err(io::Error::last_os_error());
            }
            if let Some(fd) = tty {
                // We are in a background group now; without ignoring
                // SIGTTOU, tcsetpgrp would stop us.
                let mut old: libc::sigaction = std::mem::zeroed();
                let mut ign: libc::sigaction = std::mem::zeroed();
                ign.sa_sigaction = libc::SIG_IGN;
                libc::sigaction(libc::SIGTTOU, &ign, &mut old);
                libc::tcsetpgrp(fd, libc::getpid());
                libc::sigaction(libc::SIGTTOU, &old, std::ptr::null_mut());
            }
            Ok(())
        });
    }
}

/// The highest RSS any one of oomguard's reaped descendants reached, as
/// the kernel recorded it (`ru_maxrss` of RUSAGE_CHILDREN: the job's main
/// process, the orphans oomguard reaped, and whatever each of them
/// waited for). A spike shorter than a tick shows here and nowhere else.
#[allow(unsafe_code)]
pub fn largest_child_rss_bytes() -> u64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct it is
    // given and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) != 0 {
            return 0;
        }
        usage
    };
    // Linux reports kilobytes.
    u64::try_from(usage.ru_maxrss)
        .unwrap_or(0)
        .saturating_mul(1024)
}

/// Gives the terminal's foreground back to oomguard's own process group
/// (so a second Ctrl-C during shutdown reaches oomguard).
#[allow(unsafe_code)]
pub fn reclaim_foreground(tty: BorrowedFd<'_>) {
    // SAFETY: plain syscalls on a valid fd; SIGTTOU is ignored around the
    // call because a background process calling tcsetpgrp receives it.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        let mut ign: libc::sigaction = std::mem::zeroed();
        ign.sa_sigaction = libc::SIG_IGN;
        libc::sigaction(libc::SIGTTOU, &ign, &mut old);
        libc::tcsetpgrp(tty.as_raw_fd(), libc::getpgrp());
        libc::sigaction(libc::SIGTTOU, &old, std::ptr::null_mut());
    }
}

/// Whether oomguard's process group is in the foreground of this terminal
/// (it should only hand the terminal over if it had it).
pub fn owns_foreground(tty: BorrowedFd<'_>) -> bool {
    rustix::termios::tcgetpgrp(tty).is_ok_and(|pg| pg == rustix::process::getpgrp())
}

/// Whether the process with this identity (pid and start time) still
/// exists and is not a zombie.
pub fn is_alive(proc_root: &Path, pid: u32, start_time: u64) -> bool {
    fs::read_to_string(proc_root.join(pid.to_string()).join("stat"))
        .ok()
        .and_then(|t| parse_stat(&t))
        .is_some_and(|s| s.start_time == start_time && s.state != 'Z')
}

fn read_start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let text = fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_stat(&text).map(|s| s.start_time)
}

/// A reaped process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    pub pid: u32,
    pub status: Status,
}

/// Reaps every child that has exited: the job's main process, adopted
/// orphans and oomguard's own helpers alike. Never blocks.
pub fn reap_all() -> Vec<Reaped> {
    let mut out = Vec::new();
    // Ok(None): children remain but none has exited; ECHILD: none left.
    while let Ok(Some((pid, st))) = rustix::process::wait(WaitOptions::NOHANG) {
        let status = match st.terminating_signal() {
            Some(sig) => Status::Signaled(sig),
            None => Status::Exited(st.exit_status().unwrap_or(0)),
        };
        out.push(Reaped {
            pid: pid.as_raw_nonzero().get() as u32,
            status,
        });
    }
    out
}

/// Why a signal was not delivered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignalError {
    #[error("pid {0} is gone")]
    Gone(u32),
    #[error("pid {0} is now another process (start time changed); not signalled")]
    Reused(u32),
    #[error("signal {sig} to pid {pid} failed: {errno}")]
    Failed { pid: u32, sig: i32, errno: String },
}

/// Signals refused because their pid had become another process.
static REUSED_REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many signals were refused because the pid was reused (a stranger
/// was met and spared), since oomguard started.
pub fn reused_pids_refused() -> u64 {
    REUSED_REFUSED.load(std::sync::atomic::Ordering::Relaxed)
}

fn refuse_reused(pid: u32) -> SignalError {
    count_reused_refused();
    SignalError::Reused(pid)
}

/// One more process not signalled because its pid was reused.
pub fn count_reused_refused() {
    REUSED_REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The start time of the process with this pid now, if there is one.
pub fn start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    read_start_time(proc_root, pid)
}

/// Signals one tree process, identified by pid and start time.
pub fn signal_process(
    proc_root: &Path,
    pid: u32,
    start_time: u64,
    sig: i32,
) -> Result<(), SignalError> {
    let signal = Signal::from_named_raw(sig).ok_or(SignalError::Failed {
        pid,
        sig,
        errno: "unknown signal".into(),
    })?;
    let raw = Pid::from_raw(pid as i32).ok_or(SignalError::Gone(pid))?;
    match rustix::process::pidfd_open(raw, PidfdFlags::empty()) {
        Ok(fd) => {
            // The pidfd now pins one process; checking the start time after
            // opening it closes the reuse race.
            match read_start_time(proc_root, pid) {
                Some(st) if st == start_time => {}
                Some(_) => return Err(refuse_reused(pid)),
                None => return Err(SignalError::Gone(pid)),
            }
            rustix::process::pidfd_send_signal(fd.as_fd(), signal).map_err(|e| {
                if e == rustix::io::Errno::SRCH {
                    SignalError::Gone(pid)
                } else {
                    SignalError::Failed {
                        pid,
                        sig,
                        errno: e.to_string(),
                    }
                }
            })
        }
        Err(rustix::io::Errno::SRCH) => Err(SignalError::Gone(pid)),
        Err(_) => {
            // No pidfds (kernel < 5.3): check, then kill. A small race
            // remains, as in every tool on such kernels.
            match read_start_time(proc_root, pid) {
                Some(st) if st == start_time => {}
                Some(_) => return Err(refuse_reused(pid)),
                None => return Err(SignalError::Gone(pid)),
            }
            rustix::process::kill_process(raw, signal).map_err(|e| SignalError::Failed {
                pid,
                sig,
                errno: e.to_string(),
            })
        }
    }
}

/// Signals a process group (forwarding, as a terminal would).
pub fn signal_group(pgid: u32, sig: i32) -> io::Result<()> {
    let signal = Signal::from_named_raw(sig)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "unknown signal"))?;
    let pid = Pid::from_raw(pgid as i32)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pgid 0"))?;
    rustix::process::kill_process_group(pid, signal).map_err(io::Error::from)
}

pub use crate::vocab::model::{parse_signal, signal_name};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes() {
        assert_eq!(Status::Exited(3).code(), 3);
        assert_eq!(Status::Signaled(9).code(), 137);
        let of = |e| SpawnError::of("x", e).exit_code();
        assert_eq!(of(io::Error::from_raw_os_error(libc::ENOENT)), Some(127));
        assert_eq!(of(io::Error::from_raw_os_error(libc::EACCES)), Some(126));
        assert_eq!(of(io::Error::from_raw_os_error(libc::ENOEXEC)), Some(126));
        assert_eq!(of(io::Error::from_raw_os_error(libc::EMFILE)), None);
        assert_eq!(of(io::Error::from_raw_os_error(libc::EAGAIN)), None);
    }

    #[test]
    fn signal_names() {
        assert_eq!(parse_signal("TERM"), Some(15));
        assert_eq!(parse_signal("sigusr1"), Some(10));
        assert_eq!(parse_signal("SIGINT"), Some(2));
        assert_eq!(parse_signal("12"), Some(12));
        assert_eq!(parse_signal("0"), None);
        assert_eq!(parse_signal("TREM"), None);
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(40), "SIG40");
    }

    #[test]
    fn never_signals_a_reused_pid() {
        // Our own pid with a wrong start time must be refused.
        let me = std::process::id();
        let err = signal_process(Path::new("/proc"), me, 1, libc::SIGCONT).unwrap_err();
        assert_eq!(err, SignalError::Reused(me));
        let st = read_start_time(Path::new("/proc"), me).unwrap();
        assert_eq!(
            signal_process(Path::new("/proc"), me, st, libc::SIGCONT),
            Ok(())
        );
    }
}
