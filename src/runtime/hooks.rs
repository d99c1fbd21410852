//! The hooks oomguard runs (`--on-warn`, a rule's `hook`): which pids are
//! hooks rather than the job (the reaper must tell their statuses apart),
//! and the deadline after which a hung hook is killed. Time comes in as an
//! argument, so the timeout is tested without a process.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Hooks are killed after this long.
pub(super) const HOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// The hooks still running: pid → (command, deadline).
#[derive(Debug, Default)]
pub(super) struct Hooks {
    running: HashMap<u32, (String, Instant)>,
}

impl Hooks {
    /// A hook started at `now`.
    pub fn started(&mut self, pid: u32, cmd: String, now: Instant) {
        self.running.insert(pid, (cmd, now + HOOK_TIMEOUT));
    }

    /// `pid` was reaped: the command, if it was a hook.
    pub fn finished(&mut self, pid: u32) -> Option<String> {
        self.running.remove(&pid).map(|(cmd, _)| cmd)
    }

    /// The hooks past their deadline at `now`, no longer tracked (the
    /// caller kills them; their exit is then nobody's business).
    pub fn overdue(&mut self, now: Instant) -> Vec<u32> {
        let mut late = Vec::new();
        self.running.retain(|&pid, (_, deadline)| {
            let due = now >= *deadline;
            if due {
                late.push(pid);
            }
            !due
        });
        late
    }

    /// When the loop must wake to kill the next hung hook.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.running.values().map(|(_, d)| *d).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hook_is_killed_at_its_timeout_and_not_before() {
        let t0 = Instant::now();
        let mut hooks = Hooks::default();
        hooks.started(7, "notify.sh".into(), t0);
        hooks.started(8, "quick.sh".into(), t0 + Duration::from_secs(5));
        assert_eq!(hooks.next_deadline(), Some(t0 + HOOK_TIMEOUT));
        assert!(
            hooks
                .overdue(t0 + HOOK_TIMEOUT - Duration::from_millis(1))
                .is_empty()
        );
        assert_eq!(hooks.overdue(t0 + HOOK_TIMEOUT), vec![7]);
        // Killed once: no longer a hook to wait for or to kill again.
        assert!(hooks.overdue(t0 + HOOK_TIMEOUT * 2).contains(&8));
        assert_eq!(hooks.finished(7), None);
        assert_eq!(hooks.next_deadline(), None);
    }

    #[test]
    fn a_hook_that_ended_is_told_apart_from_the_job_and_never_killed() {
        let t0 = Instant::now();
        let mut hooks = Hooks::default();
        hooks.started(7, "notify.sh".into(), t0);
        assert_eq!(hooks.finished(7).as_deref(), Some("notify.sh"));
        assert_eq!(hooks.finished(100), None);
        assert!(hooks.overdue(t0 + HOOK_TIMEOUT * 2).is_empty());
    }
}
