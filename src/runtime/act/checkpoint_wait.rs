//! The stop ladder's checkpoint wait: whether the save asked for (of the
//! companion, or by the checkpoint signal) is done, was given up, or must
//! fall back to the signal, and the checkpoint signal itself, sent only to
//! processes that catch it.

use std::time::Instant;

use super::parts::Part;
use super::{
    Acted, Actuator, EXIT_AFTER_DONE, Ident, LAST_RESORT_HOLD, SIG_CONT, SIG_KILL, SIG_TERM,
    Signaller, Stop, StopStep, idents, signal_all,
};
use crate::job::supervise;
use crate::sinks::log::ActionKind;
use crate::vocab::model::ProcSample;
use crate::vocab::units::human_duration;

impl Actuator {
    /// Decides whether the checkpoint wait is over and, if so, moves the
    /// ladder on. Returns false when the stop ended here (attach: given up
    /// or released), true when `st` is still the stop in progress.
    pub(super) fn checkpoint_step(
        &mut self,
        st: &mut Stop,
        tree: &[ProcSample],
        now: Instant,
        sig: &mut dyn Signaller,
    ) -> bool {
        let trainers_alive = st
            .signalled
            .iter()
            .any(|id| tree.iter().any(|p| (p.pid, p.start_time) == *id));
        let may_kill = self.cfg.may_kill;
        let stuck = st.frozen_since.is_some_and(|f| now - f >= LAST_RESORT_HOLD);
        if stuck && !may_kill {
            // attach: oomguard may not end a frozen tree, so the trainer
            // alone runs (the growers stay frozen) and gets the rest of the
            // grace to checkpoint.
            signal_all(sig, &st.signalled, SIG_CONT);
        }
        let grace_over = now >= st.grace_end || (stuck && may_kill);
        // With --checkpoint-dir, a new complete checkpoint is the signal to
        // go on; the trainer is never cut off while it is still writing one
        // within the grace period.
        let confirmed = st.watch.as_mut().and_then(|w| w.poll(now));
        self.follow_request(st, now, sig);
        if grace_over && trainers_alive && !may_kill {
            // attach: as far as a non-parent can go. Give back what was
            // held and keep watching.
            let why = format!("{}: the stop is given up (attach)", st.reason);
            self.release(st, &why, tree, sig);
            self.say(
                "the trainer did not exit within the grace period; leaving it running \
                 (oomguard did not launch it; --allow-kill to let it stop the tree)"
                    .to_string(),
            );
            self.policy_end = None;
            self.policy_reason = None;
            self.out.push(Acted::GaveUp);
            return false;
        }
        if !may_kill && !trainers_alive {
            // attach: the trainer checkpointed and left; the rest is not
            // ours to end (nor to leave stopped).
            let why = format!("{}: the trainer exited (attach)", st.reason);
            self.release(st, &why, tree, sig);
            return false;
        }
        let waiting = match st.done_at {
            Some(done) => now < done + EXIT_AFTER_DONE,
            None => confirmed.is_none(),
        };
        if trainers_alive && !grace_over && waiting {
            return true;
        }
        if st.done_at.is_some() {
            // The companion's checkpoint was reported when it came.
        } else if let Some(w) = &st.watch {
            let path = confirmed.or_else(|| (!trainers_alive).then(|| w.written()).flatten());
            self.report_checkpoint(path, now - st.began);
        }
        let rest = idents(tree, |_| true);
        if st.frozen_all && grace_over {
            // Resuming a tree at the edge would hand the kernel the kill;
            // end it here instead.
            let sent = signal_all(sig, &rest, SIG_KILL);
            let why = format!("last resort during {}", st.reason);
            let mark = self.mark();
            self.record(ActionKind::Kill, &why, sent, SIG_KILL);
            self.parts_since(mark, st.action, Part::Kill);
            self.killed = true;
            st.step = StopStep::Killed;
        } else {
            let sent = signal_all(sig, &rest, SIG_TERM);
            signal_all(sig, &rest, SIG_CONT);
            if !sent.0.is_empty() {
                let why = format!("{}: terminating the rest of the tree", st.reason);
                let mark = self.mark();
                self.record(ActionKind::Stop, &why, sent, SIG_TERM);
                self.parts_since(mark, st.action, Part::Cleanup);
            }
            st.step = StopStep::Terminate {
                until: now + st.kill_after,
            };
        }
        if grace_over && trainers_alive && !self.cfg.quiet {
            self.say(if now >= st.grace_end {
                format!(
                    "the trainer did not exit within the {} grace; terminating the job",
                    human_duration(self.cfg.grace)
                )
            } else {
                format!(
                    "no room appeared within {} of freezing the tree at the edge of memory; \
                     killing it before the kernel does",
                    human_duration(LAST_RESORT_HOLD)
                )
            });
        }
        true
    }

    /// The stop's request: its checkpoint when the save is done; the signal
    /// after all when the companion does not acknowledge in time.
    fn follow_request(&mut self, st: &mut Stop, now: Instant, sig: &mut dyn Signaller) {
        let Some(id) = st.request else {
            return;
        };
        if st.done_at.is_none()
            && let Some(saved) = self.companion.done.clone().filter(|s| s.id == id)
        {
            st.done_at = Some(now);
            let path = saved.paths.first().cloned().filter(|_| saved.ok);
            if !saved.ok {
                self.say("the companion reports that the checkpoint failed".to_string());
            }
            self.out.push(Acted::Checkpoint {
                path,
                waited_seconds: (saved.after_request_seconds * 1000.0).round() / 1000.0,
            });
            return;
        }
        let acked = self.companion.pending.is_some_and(|p| p.0 == id && p.3);
        let wait = st.ack_wait;
        if st.done_at.is_none() && !acked && !st.fell_back && now - st.began >= wait {
            st.fell_back = true;
            self.say(format!(
                "the companion did not acknowledge the checkpoint request within {}; signalling",
                human_duration(wait)
            ));
            let why = format!("{}: the companion did not answer", st.reason);
            let targets = st.signalled.clone();
            let mark = self.mark();
            self.checkpoint_signal(ActionKind::Stop, &why, &targets, sig);
            self.parts_since(mark, st.action, Part::SignalFallback);
        }
    }

    /// The checkpoint signal to the trainers, as `action`. A process that
    /// does not catch it would die of a signal other than TERM (USR1's
    /// default is to terminate, with no checkpoint and a confusing cause):
    /// it gets SIGTERM instead, and the log says so. A trainer that does
    /// not catch SIGTERM either loses the work since its last checkpoint:
    /// the user is told.
    pub(super) fn checkpoint_signal(
        &mut self,
        action: ActionKind,
        reason: &str,
        trainers: &[Ident],
        sig: &mut dyn Signaller,
    ) {
        let wanted = self.cfg.checkpoint_signal;
        let (asked, plain): (Vec<Ident>, Vec<Ident>) = trainers
            .iter()
            .partition(|id| wanted == SIG_TERM || sig.catches(**id, wanted) != Some(false));
        if !asked.is_empty() || plain.is_empty() {
            let sent = signal_all(sig, &asked, wanted);
            self.record(action, reason, sent, wanted);
        }
        if !plain.is_empty() {
            let pids: Vec<String> = plain.iter().map(|p| p.0.to_string()).collect();
            let why = format!(
                "{reason}: pid {} does not catch {}",
                pids.join(", "),
                supervise::signal_name(wanted)
            );
            let sent = signal_all(sig, &plain, SIG_TERM);
            self.record(action, &why, sent, SIG_TERM);
            self.say(format!(
                "pid {} does not catch {}: sent SIGTERM instead",
                pids.join(", "),
                supervise::signal_name(wanted)
            ));
        }
        let deaf: Vec<String> = trainers
            .iter()
            .filter(|id| sig.catches(**id, SIG_TERM) == Some(false))
            .filter(|id| wanted == SIG_TERM || sig.catches(**id, wanted) != Some(true))
            .map(|id| id.0.to_string())
            .collect();
        if !deaf.is_empty() {
            self.say(format!(
                "warning: the trainer (pid {}) catches neither the checkpoint signal nor SIGTERM: \
                 this stop loses the work since its last checkpoint (the companion, \
                 python/oomguard, saves on request)",
                deaf.join(", ")
            ));
        } else if let Some(why) = self.framework_loses_work(trainers, sig) {
            self.framework_warned = true;
            self.say(format!(
                "warning: {why}: this stop loses the work since its last checkpoint"
            ));
        }
    }
}
