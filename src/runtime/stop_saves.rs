//! The check behind the stop path's warning ("a stop would lose the work
//! since its last checkpoint"): which trainers a stop would reach with no
//! handler for the checkpoint signal or SIGTERM. Shared by
//! [`Actuator::check_stop_saves`](super::act::Actuator::check_stop_saves)
//! and `oomguard doctor -- CMD`.

use super::act::{SIG_TERM, Signaller, trainer_idents};
use crate::model::ProcSample;
pub use crate::verdict::StopVerdict;

/// The trainers of `tree` (or the job's process) and which of them a stop
/// would reach with no handler: neither `wanted` nor SIGTERM caught.
pub fn stop_verdict(
    tree: &[ProcSample],
    job_pid: u32,
    wanted: i32,
    companion: bool,
    sig: &dyn Signaller,
) -> StopVerdict {
    let trainers = trainer_idents(tree, job_pid);
    let mut verdict = StopVerdict {
        trainers: trainers.iter().map(|id| id.0).collect(),
        signal: wanted,
        deaf: Vec::new(),
        unknown: Vec::new(),
        companion,
        framework: None,
    };
    for id in &trainers {
        match (sig.catches(*id, wanted), sig.catches(*id, SIG_TERM)) {
            (Some(false), Some(false)) => verdict.deaf.push(id.0),
            (Some(true), _) | (_, Some(true)) => {}
            _ => verdict.unknown.push(id.0),
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;
    use crate::runtime::act::Ident;
    use crate::supervise::SignalError;
    use std::collections::HashMap;

    /// Which (pid, signal) pairs are caught; absent pids are unknown.
    struct Handlers(HashMap<u32, Vec<i32>>);

    impl Signaller for Handlers {
        fn signal(&mut self, _: Ident, _: i32) -> Result<(), SignalError> {
            Ok(())
        }
        fn is_alive(&self, _: Ident) -> bool {
            true
        }
        fn signal_group(&mut self, _: u32, _: i32) -> Result<(), SignalError> {
            Ok(())
        }
        fn catches(&self, (pid, _): Ident, sig: i32) -> Option<bool> {
            self.0.get(&pid).map(|s| s.contains(&sig))
        }
    }

    fn proc(pid: u32, role: Role) -> ProcSample {
        ProcSample {
            pid,
            ppid: 1,
            role,
            comm: "python".into(),
            rss_bytes: 0,
            pss_bytes: 0,
            uss_bytes: 0,
            swap_bytes: 0,
            rss_peak_bytes: None,
            gpu_bytes: None,
            torch: None,
            start_time: u64::from(pid),
            stopped: false,
        }
    }

    #[test]
    fn a_trainer_catching_neither_signal_loses_work_unless_a_companion_answers() {
        let tree = [proc(10, Role::Launcher), proc(11, Role::Trainer)];
        let usr1 = libc::SIGUSR1;
        let sig = Handlers(HashMap::from([(11, vec![libc::SIGINT])]));
        let v = stop_verdict(&tree, 10, usr1, false, &sig);
        assert_eq!((v.trainers.clone(), v.deaf.clone()), (vec![11], vec![11]));
        assert!(v.loses_work());
        assert!(!stop_verdict(&tree, 10, usr1, true, &sig).loses_work());
        // Either signal caught is enough.
        for caught in [usr1, SIG_TERM] {
            let sig = Handlers(HashMap::from([(11, vec![caught])]));
            let v = stop_verdict(&tree, 10, usr1, false, &sig);
            assert!(v.deaf.is_empty() && v.unknown.is_empty(), "{v:?}");
        }
    }

    #[test]
    fn without_a_trainer_the_job_is_judged_and_unreadable_handlers_are_unknown() {
        let tree = [proc(10, Role::Launcher)];
        let v = stop_verdict(&tree, 10, SIG_TERM, false, &Handlers(HashMap::new()));
        assert_eq!(
            (v.trainers.clone(), v.unknown.clone()),
            (vec![10], vec![10])
        );
        assert!(!v.loses_work());
    }
}
