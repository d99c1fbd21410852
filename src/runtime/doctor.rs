//! `oomguard doctor -- CMD`: the run ends itself once the job shows
//! progress (or after the doctor's wait), after the checks the stop path's
//! warnings make ([`stop_saves::stop_verdict`], and the framework check):
//! would a stop lose the work? The job is then ended with a SIGTERM to its
//! process group (SIGKILL after `--kill-after`), so nothing is left
//! running, and without the save a SIGTERM to oomguard would ask for: a
//! check must not change what it checks (a save would land beside the
//! job's own checkpoints, and a script that resumes from its newest file,
//! or Lightning's `last.ckpt`, would then resume from the doctor's step).

use std::time::Duration;

use super::Supervisor;
use super::act::{self, stop_saves};

/// How long a job that shows steps has to say hello before it is judged
/// without its companion.
const HELLO_GRACE: Duration = Duration::from_secs(3);

impl Supervisor {
    /// Once per run, on a tick: judges the trainer when progress has been
    /// shown (signal handlers are installed by then) or the wait is over,
    /// hands the finding to the doctor and starts the end.
    pub(super) fn doctor_watch(&mut self) {
        let Some(watch) = self.target.judged().cloned() else {
            return;
        };
        if watch.concluded()
            || self.child.shutdown_signal().is_some()
            || self.child.status().is_some()
        {
            return;
        }
        let waited = self.attempts.age(crate::vocab::clock::now());
        let step = self.output.progress().current().and_then(|p| p.step);
        if step.is_none() && waited < watch.wait {
            return;
        }
        // The companion's hello is a record read once a tick, the step a
        // line read as it is printed: a Lightning job judged at its first
        // step, beside other tests, had said hello but was judged as
        // "companion: false". Its first step gives it a few ticks.
        let connected = self.core.act().companion().connected;
        if !connected && waited < watch.wait && watch.stepping_for(waited) < HELLO_GRACE {
            return;
        }
        let mut verdict = stop_saves::stop_verdict(
            self.sampler.tree(),
            self.child.pid(),
            self.core.act().cfg().checkpoint_signal,
            self.core.act().companion().connected,
            self.child.sig(),
        );
        // The other warning of the stop path: a framework that catches
        // the signal only to stop.
        let trainers = act::trainer_idents(self.sampler.tree(), self.child.pid());
        verdict.framework = self
            .core
            .act_mut()
            .framework_loses_work(&trainers, self.child.sig());
        watch.conclude(crate::vocab::verdict::Finding {
            verdict,
            step,
            waited_seconds: (waited.as_secs_f64() * 10.0).round() / 10.0,
        });
        let (pids, result) = self.forward(libc::SIGTERM);
        self.begin_shutdown("doctor: the check is done", pids, libc::SIGTERM, result);
        self.core
            .act_mut()
            .rearm_kill_after(crate::vocab::clock::now());
    }
}
