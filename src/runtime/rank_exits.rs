//! The moment a rank of a job across nodes ends: a pidfd per rank whose
//! companion said hello, readable when that process is gone.
//!
//! The ranks are torchrun's children, not oomguard's, so no `waitpid` tells
//! of them; and the tick (1 s) is too slow: torchrun sees a dead rank within
//! 0.1 s and ends the node's others, and on node 0 the job's store with
//! them, so a fault told a tick later might find no store to go into.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

/// The ranks watched, by pid.
#[derive(Default)]
pub struct RankExits {
    fds: HashMap<u32, AsyncFd<OwnedFd>>,
}

impl RankExits {
    /// Watches exactly `pids` (new ranks added, gone ones dropped). A rank
    /// that cannot be watched (already gone, or a kernel before 5.3, which
    /// has no pidfds) is not: its end is then told only by what its
    /// launcher and its output say.
    pub fn follow(&mut self, pids: &[u32]) {
        self.fds.retain(|pid, _| pids.contains(pid));
        for &pid in pids {
            if self.fds.contains_key(&pid) {
                continue;
            }
            let Some(p) = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            else {
                continue;
            };
            if let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                && let Some(w) = watch_pidfd(fd)
            {
                self.fds.insert(pid, w);
            }
        }
    }

    /// Stops watching `pid` (it ended, and was handled).
    pub fn forget(&mut self, pid: u32) {
        self.fds.remove(&pid);
    }

    /// Resolves with the pid of a rank that ended.
    pub async fn ended(&self) -> u32 {
        if self.fds.is_empty() {
            return std::future::pending().await;
        }
        let mut futs: Vec<_> = self
            .fds
            .iter()
            .map(|(pid, fd)| (*pid, Box::pin(fd.readable())))
            .collect();
        std::future::poll_fn(move |cx| {
            for (pid, f) in &mut futs {
                if let std::task::Poll::Ready(Ok(_)) = f.as_mut().poll(cx) {
                    return std::task::Poll::Ready(*pid);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

impl super::Supervisor {
    /// A rank of a job across nodes ended. Its wait status, then a full
    /// tick: it reads the kernel's OOM kill (the better cause, and told as
    /// such) and the rank's last records (its exception, its shutdown);
    /// then the end becomes a fault when it is one.
    pub(super) fn on_rank_end(&mut self, pid: u32) {
        // First, while its launcher has not reaped it yet (torchrun polls
        // every 0.1 s): how it ended.
        let status = std::fs::read_to_string(self.cfg.proc_root.join(format!("{pid}/stat")))
            .ok()
            .and_then(|t| crate::engine::probe::proc::zombie_status(&t));
        self.tick(false);
        // With one oomguard per rank the rank is the job itself: its end is
        // the run's, and still news for the others.
        let the_job = pid == self.child.pid();
        if self.child.shutdown_signal().is_some() || (!the_job && self.child.status().is_some()) {
            return; // the job is ending anyway
        }
        self.core
            .act_mut()
            .rank_ended(pid, status, crate::vocab::clock::now());
        self.acted(None);
    }
}

impl super::Supervisor {
    /// The job ended, and it is a rank of a job across oomguards (one
    /// oomguard per rank): its end is news for the others, told (if it is
    /// one) before this oomguard exits, waiting up to [`TELL_WAIT`] for the
    /// store to take it.
    pub(super) fn tell_the_jobs_end(&mut self) {
        use crate::job::supervise::Status;
        let Some(status) = self.child.status() else {
            return;
        };
        if self.child.shutdown_signal().is_some() {
            return;
        }
        let raw = match status {
            Status::Exited(code) => code << 8,
            Status::Signaled(sig) => sig,
        };
        let now = crate::vocab::clock::now();
        self.core
            .act_mut()
            .rank_ended(self.child.pid(), Some(raw), now);
        self.acted(None);
        while self.core.act().fault_untold() && crate::vocab::clock::since(now) < TELL_WAIT {
            std::thread::sleep(std::time::Duration::from_millis(20));
            self.core.act_mut().poll_channel(crate::vocab::clock::now());
        }
        self.acted(None);
    }
}

/// How long an oomguard whose rank died waits for the job's store to take
/// the news before it exits.
const TELL_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

#[allow(unsafe_code)]
fn watch_pidfd(fd: OwnedFd) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: the pidfd is owned here and never replaced or closed while
    // the AsyncFd holds it.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn a_process_that_ends_is_named_at_once() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let mut r = RankExits::default();
        r.follow(&[child.id()]);
        let pid = tokio::time::timeout(Duration::from_secs(5), r.ended())
            .await
            .expect("the end is seen");
        assert_eq!(pid, child.id());
        child.wait().unwrap();
        r.forget(pid);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), r.ended())
                .await
                .is_err(),
            "nothing is left to end"
        );
    }
}
