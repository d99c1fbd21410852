//! Sending signals and notifications for real, behind the traits the
//! actuator and the loop use: `kill(2)` by identity (pid and start time)
//! under an injectable `/proc`, which signals a process catches or
//! ignores, and desktop notifications over the session bus. Tests put
//! recording fakes in their place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::job::supervise::{self, SignalError};

/// Identity of a process: pid and start time.
pub type Ident = (u32, u64);

pub const SIG_TERM: i32 = libc::SIGTERM;
pub const SIG_KILL: i32 = libc::SIGKILL;
pub const SIG_CONT: i32 = libc::SIGCONT;
pub const SIG_STOP: i32 = libc::SIGSTOP;

/// Sends signals to processes by identity.
pub trait Signaller {
    /// Sends `sig` to `id` only if the pid still is that process.
    fn signal(&mut self, id: Ident, sig: i32) -> Result<(), SignalError>;
    /// Whether `id` is still that process (and not a zombie).
    fn is_alive(&self, id: Ident) -> bool;
    /// Sends `sig` to a process group (the job's, while its leader lives).
    fn signal_group(&mut self, pgid: u32, sig: i32) -> Result<(), SignalError>;
    /// Whether `id`'s pid now belongs to another process (its start time
    /// changed): a stranger, never to be signalled.
    fn reused(&self, _id: Ident) -> bool {
        false
    }
    /// Whether `id` catches `sig` (`SigCgt`); `None` when unknown.
    fn catches(&self, _id: Ident, _sig: i32) -> Option<bool> {
        None
    }
    /// Whether `sig` would leave `id` alive: caught or ignored (`SigCgt`,
    /// `SigIgn`), not the default action; `None` when unknown.
    fn takes(&self, id: Ident, sig: i32) -> Option<bool> {
        self.catches(id, sig)
    }
}

/// Shows a desktop notification.
pub trait Notifier {
    fn notify(&mut self, summary: String, body: String);
}

/// The real signaller: `kill(2)` after checking the start time under
/// `proc_root`.
#[derive(Debug, Clone)]
pub struct ProcSignaller {
    proc_root: PathBuf,
}

impl ProcSignaller {
    pub fn new(proc_root: &Path) -> Self {
        Self {
            proc_root: proc_root.to_path_buf(),
        }
    }
}

impl ProcSignaller {
    /// `/proc/PID/status` of `id`, while the pid is still that process.
    fn status(&self, (pid, start): Ident) -> Option<String> {
        if !supervise::is_alive(&self.proc_root, pid, start) {
            return None;
        }
        std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("status")).ok()
    }
}

/// Whether signal `sig`'s bit (n−1) is set in `mask`.
fn has(mask: u64, sig: i32) -> bool {
    (1..=64).contains(&sig) && mask >> (sig - 1) & 1 == 1
}

/// A hex signal mask of a `/proc/PID/status` text (`SigCgt:`, `SigIgn:`).
fn mask_of(status: &str, key: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix(key))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

impl Signaller for ProcSignaller {
    fn signal(&mut self, (pid, start): Ident, sig: i32) -> Result<(), SignalError> {
        if sig == SIG_STOP {
            // Told first: if oomguard dies right after the stop, the
            // keeper already knows to let the process run again.
            crate::job::keeper::note_stopped(pid, start);
        }
        supervise::signal_process(&self.proc_root, pid, start, sig)
    }

    fn is_alive(&self, (pid, start): Ident) -> bool {
        supervise::is_alive(&self.proc_root, pid, start)
    }

    fn reused(&self, (pid, start): Ident) -> bool {
        supervise::start_time(&self.proc_root, pid).is_some_and(|st| st != start)
    }

    fn signal_group(&mut self, pgid: u32, sig: i32) -> Result<(), SignalError> {
        supervise::signal_group(pgid, sig).map_err(|e| SignalError::Failed {
            pid: pgid,
            sig,
            errno: e.to_string(),
        })
    }

    fn catches(&self, id: Ident, sig: i32) -> Option<bool> {
        let status = self.status(id)?;
        caught_signals(&status).map(|mask| has(mask, sig))
    }

    fn takes(&self, id: Ident, sig: i32) -> Option<bool> {
        let status = self.status(id)?;
        let caught = caught_signals(&status)?;
        let ignored = mask_of(&status, "SigIgn:").unwrap_or(0);
        Some(has(caught | ignored, sig))
    }
}

/// The `SigCgt` mask of a `/proc/PID/status` text: bit n−1 is signal n.
pub fn caught_signals(status: &str) -> Option<u64> {
    mask_of(status, "SigCgt:")
}

/// The real notifier: a desktop notification over the session bus, when
/// there is one; never waits for it more than a moment.
#[derive(Debug, Default, Clone, Copy)]
pub struct DesktopNotifier;

const NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);

impl Notifier for DesktopNotifier {
    fn notify(&mut self, summary: String, body: String) {
        if !crate::job::systemd::session_bus() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        tokio::spawn(async move {
            let mut n = notify_rust::Notification::new();
            n.summary(&summary).body(&body).appname("oomguard");
            let _ = tokio::time::timeout(NOTIFY_TIMEOUT, n.show_async()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigcgt_bit_n_minus_one_is_signal_n() {
        // Python's default: SIGINT (2) caught, TERM (15) and USR1 (10) not.
        let status = "Name:\tpython3\nSigBlk:\t0000000000000000\nSigIgn:\t0000000001001000\nSigCgt:\t0000000180000002\n";
        let mask = caught_signals(status).unwrap();
        assert_eq!(mask & (1 << (libc::SIGINT - 1)), 1 << (libc::SIGINT - 1));
        assert_eq!(mask & (1 << (libc::SIGTERM - 1)), 0);
        assert_eq!(mask & (1 << (libc::SIGUSR1 - 1)), 0);
        assert_eq!(caught_signals("Name:\tx\n"), None);
        assert_eq!(caught_signals("SigCgt:\tzz\n"), None);
    }

    #[test]
    fn a_signal_is_taken_when_caught_or_ignored() {
        let status = "SigIgn:\t0000000000000200\nSigCgt:\t0000000000000002\n";
        let caught = caught_signals(status).unwrap();
        let ignored = mask_of(status, "SigIgn:").unwrap();
        assert!(has(caught | ignored, libc::SIGUSR1), "USR1 (10) is ignored");
        assert!(has(caught, libc::SIGINT));
        assert!(!has(caught | ignored, libc::SIGUSR2));
        assert!(!has(u64::MAX, 0) && !has(u64::MAX, 65));
    }
}
