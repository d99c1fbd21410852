//! The check behind the stop path's warning ("a stop would lose the work
//! since its last checkpoint"): which trainers a stop would reach with no
//! handler for the checkpoint signal or SIGTERM, shared by the actuator and
//! `oomguard doctor -- CMD`; and the actuator's warnings built on it,
//! including a framework (Lightning) whose own handler saves nothing.

use std::time::Instant;

use super::{FRAMEWORK_GRACE, Ident, SIG_TERM, Signaller, trainer_idents};
use crate::job::supervise;
use crate::vocab::forensics::torch::Framework;
use crate::vocab::model::ProcSample;
pub use crate::vocab::verdict::StopVerdict;

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

/// The warnings of an attempt that a stop would lose work: what the job's
/// output said of its framework, and which warnings were given.
#[derive(Debug)]
pub struct SaveChecks {
    /// The signal a stop sends the trainers (`--checkpoint-signal`).
    wanted: i32,
    /// `--quiet`: no warning is said.
    quiet: bool,
    /// This attempt's trainer was checked for a handler of the checkpoint
    /// signal ([`SaveChecks::check_stop_saves`]).
    stop_checked: bool,
    /// The job's output showed a framework whose own signal handling
    /// loses work (Lightning stops on SIGTERM without saving), and when.
    framework: Option<(Framework, Instant)>,
    /// The framework's warning was given this attempt.
    framework_warned: bool,
}

impl SaveChecks {
    pub fn new(wanted: i32, quiet: bool) -> Self {
        Self {
            wanted,
            quiet,
            stop_checked: false,
            framework: None,
            framework_warned: false,
        }
    }

    /// A new attempt is checked again.
    pub fn reset(&mut self) {
        *self = Self::new(self.wanted, self.quiet);
    }

    /// The job's output named its framework.
    pub fn note_framework(&mut self, framework: Framework, now: Instant) {
        self.framework.get_or_insert((framework, now));
    }

    /// A framework that would lose work on a stop, with no companion
    /// [`FRAMEWORK_GRACE`] after its banner (the companion says hello as
    /// the framework's `Trainer` is built, so by then it would have): the
    /// warning, given once, before any stop.
    pub fn check_framework(
        &mut self,
        now: Instant,
        (tree, job_pid): (&[ProcSample], u32),
        connected: bool,
        sig: &dyn Signaller,
    ) -> Option<String> {
        let (_, seen) = self.framework?;
        if self.framework_warned || self.quiet || now.duration_since(seen) < FRAMEWORK_GRACE {
            return None;
        }
        let trainers = trainer_idents(tree, job_pid);
        self.warn_framework(&trainers, connected, sig).map(|why| {
            format!("warning: {why}: a stop would lose the work since its last checkpoint")
        })
    }

    /// [`SaveChecks::framework_loses_work`], marked as told (the caller
    /// says it).
    pub fn warn_framework(
        &mut self,
        trainers: &[Ident],
        connected: bool,
        sig: &dyn Signaller,
    ) -> Option<String> {
        let why = self.framework_loses_work(trainers, connected, sig)?;
        self.framework_warned = true;
        Some(why)
    }

    /// Once per attempt, when the trainer has shown progress (its signal
    /// handlers are installed by then): the warning, if a stop would lose
    /// its work: no companion speaks and the trainer catches neither the
    /// checkpoint signal nor SIGTERM. Users learn it before the stop, not
    /// from a lost run.
    pub fn check_stop_saves(
        &mut self,
        tree: &[ProcSample],
        job_pid: u32,
        connected: bool,
        sig: &dyn Signaller,
    ) -> Option<String> {
        if self.stop_checked || connected || self.quiet {
            return None;
        }
        self.stop_checked = true;
        let verdict = stop_verdict(tree, job_pid, self.wanted, false, sig);
        if verdict.deaf.is_empty() {
            return None;
        }
        Some(format!(
            "warning: the trainer (pid {}) does not catch {}: a stop would lose the work \
             since its last checkpoint (a Lightning or Hugging Face Trainer saves on request \
             under oomguard; a plain loop can with python/oomguard)",
            verdict
                .deaf
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            supervise::signal_name(verdict.signal)
        ))
    }

    /// Why the framework the job's output named would not save on the
    /// signal a stop sends, though its trainer catches it: Lightning's
    /// SIGTERM handler only ends `fit` at the next step, and its SIGUSR1
    /// handler (save, then requeue) is installed only under SLURM's
    /// auto-requeue. `None` once a companion speaks (`connected`: it
    /// saves on request).
    pub fn framework_loses_work(
        &self,
        trainers: &[Ident],
        connected: bool,
        sig: &dyn Signaller,
    ) -> Option<String> {
        if connected || self.framework.map(|(f, _)| f) != Some(Framework::Lightning) {
            return None;
        }
        let wanted = self.wanted;
        // A Lightning that catches the checkpoint signal other than TERM
        // was set up for it (SLURMEnvironment(auto_requeue=True) saves on
        // USR1): trust it.
        if wanted != SIG_TERM
            && trainers
                .iter()
                .any(|id| sig.catches(*id, wanted) == Some(true))
        {
            return None;
        }
        Some(
            "the trainer is PyTorch Lightning, which takes SIGTERM as \"stop at the next step\" \
             and saves nothing (oomguard's companion makes it save on request: it is off here, \
             or Python did not load it; see docs/companion.md)"
                .to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::supervise::SignalError;
    use crate::runtime::act::Ident;
    use crate::vocab::model::Role;
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
        crate::vocab::model::testing::proc_sample(pid, role, 0)
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
