//! The stop's own steps while it waits for the checkpoint: the holding
//! pattern (throttle of the growers, last-resort freeze), whether the save
//! asked for (of the companion, or by the checkpoint signal) is done, was
//! given up, or must fall back to the signal, and the checkpoint signal
//! itself, sent only to processes that catch it.

use std::collections::HashSet;
use std::time::Instant;

use super::journal::Journal;
use super::parts::Part;
use super::{
    Acted, EXIT_AFTER_DONE, Hands, Ident, LAST_RESORT_HOLD, Levels, SIG_CONT, SIG_KILL, SIG_STOP,
    SIG_TERM, Signaller, Stop, StopStep, THROTTLE_CYCLE, THROTTLE_RUN, idents, signal_all,
};
use crate::job::supervise;
use crate::sinks::log::ActionKind;
use crate::vocab::model::ProcSample;
use crate::vocab::units::human_duration;

/// How a checkpoint step left the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waited {
    /// Still the stop in progress (waiting, or on to its next step).
    Going,
    /// Ended here (attach): the trainer did not exit within the grace, and
    /// oomguard may not end it; what was held is given back.
    GaveUp,
    /// Ended here (attach): the trainer checkpointed and left.
    Released,
}

impl Stop {
    /// The checkpoint step's holding pattern: the last-resort freeze, and
    /// the throttle of the growers (held, with a short run slice per cycle
    /// so a data-bound trainer still gets its batches).
    pub(super) fn hold(
        &mut self,
        (hard, levels): (Option<f64>, Levels),
        new_growers: HashSet<Ident>,
        tree: &[ProcSample],
        now: Instant,
        sig: &mut dyn Signaller,
        out: &mut Journal,
    ) {
        let st = self;
        let low = hard.is_some_and(|h| h < levels.last_resort);
        if low && !st.frozen_all {
            let all = idents(tree, |_| true);
            let sent = signal_all(sig, &all, SIG_STOP);
            st.frozen_all = true;
            st.frozen_since = Some(now);
            st.throttle_running = false;
            let why = format!("last resort during {}", st.reason);
            out.record_part(
                (st.action, Part::Freeze),
                ActionKind::Pause,
                &why,
                sent,
                SIG_STOP,
            );
        } else if st.frozen_all && hard.is_some_and(|h| h >= levels.last_resort * 1.5) {
            // Room again: the trainers may go on to their checkpoint.
            let sent = signal_all(sig, &st.signalled, SIG_CONT);
            let why = format!("room again during {}", st.reason);
            out.record_part(
                (st.action, Part::Thaw),
                ActionKind::Resume,
                &why,
                sent,
                SIG_CONT,
            );
            st.frozen_all = false;
            st.frozen_since = None;
        }
        if st.done_at.is_some() {
            // The save is done and the ranks are leaving: a held process
            // would take ten times as long to exit (a torchrun job's ranks
            // are its growers), so nothing is held any more.
            let held: Vec<Ident> = st.throttled.drain().collect();
            if st.throttle_running || held.is_empty() {
                return;
            }
            signal_all(sig, &held, SIG_CONT);
            st.throttle_running = true;
            return;
        }
        st.throttled.extend(new_growers);
        let signalled = st.signalled.clone();
        st.throttled.retain(|id| !signalled.contains(id));
        if st.frozen_all || st.throttled.is_empty() || now < st.throttle_switch {
            return;
        }
        let targets: Vec<Ident> = st.throttled.iter().copied().collect();
        if st.throttle_running {
            let (held, result) = signal_all(sig, &targets, SIG_STOP);
            st.throttle_running = false;
            st.throttle_switch = now + THROTTLE_CYCLE - THROTTLE_RUN;
            // Logged when a process is first held, not at every cycle.
            let new: Vec<u32> = held
                .into_iter()
                .filter(|pid| st.announced.insert(*pid))
                .collect();
            if !new.is_empty() {
                let why = format!(
                    "throttle during {}: growing, held except {} ms in every {} ms",
                    st.reason,
                    THROTTLE_RUN.as_millis(),
                    THROTTLE_CYCLE.as_millis()
                );
                out.record_part(
                    (st.action, Part::Throttle),
                    ActionKind::Pause,
                    &why,
                    (new, result),
                    SIG_STOP,
                );
            }
        } else {
            signal_all(sig, &targets, SIG_CONT);
            st.throttle_running = true;
            st.throttle_switch = now + THROTTLE_RUN;
        }
    }

    /// Lets go of everything a graceful stop holds (throttled or frozen
    /// processes): a job oomguard stops watching, or whose stop it gives
    /// up, must not be left stopped. Logged as a `resume` when it reached
    /// anyone.
    pub(super) fn release(
        &self,
        why: &str,
        tree: &[ProcSample],
        sig: &mut dyn Signaller,
        out: &mut Journal,
    ) {
        let mut held: Vec<Ident> = self.throttled.iter().copied().collect();
        if self.frozen_all {
            held.extend(idents(tree, |_| true));
        }
        held.sort_unstable();
        held.dedup();
        let sent = signal_all(sig, &held, SIG_CONT);
        if !sent.0.is_empty() {
            out.record(ActionKind::Resume, why, sent, SIG_CONT);
        }
    }

    /// Decides whether the checkpoint wait is over and, if so, moves the
    /// ladder on.
    pub(super) fn checkpoint_step(
        &mut self,
        tree: &[ProcSample],
        now: Instant,
        h: &mut Hands<'_>,
    ) -> Waited {
        let st = self;
        let trainers_alive = st
            .signalled
            .iter()
            .any(|id| tree.iter().any(|p| (p.pid, p.start_time) == *id));
        let may_kill = h.cfg.may_kill;
        let stuck = st.frozen_since.is_some_and(|f| now - f >= LAST_RESORT_HOLD);
        if stuck && !may_kill {
            // attach: oomguard may not end a frozen tree, so the trainer
            // alone runs (the growers stay frozen) and gets the rest of the
            // grace to checkpoint.
            signal_all(h.sig, &st.signalled, SIG_CONT);
        }
        let grace_over = now >= st.grace_end || (stuck && may_kill);
        // With --checkpoint-dir, a new complete checkpoint is the signal to
        // go on; the trainer is never cut off while it is still writing one
        // within the grace period.
        let confirmed = st.watch.as_mut().and_then(|w| w.poll(now));
        st.follow_request(now, h);
        if grace_over && trainers_alive && !may_kill {
            // attach: as far as a non-parent can go. Give back what was
            // held and keep watching.
            let why = format!("{}: the stop is given up (attach)", st.reason);
            st.release(&why, tree, h.sig, h.out);
            h.out.say(
                "the trainer did not exit within the grace period; leaving it running \
                 (oomguard did not launch it; --allow-kill to let it stop the tree)"
                    .to_string(),
            );
            return Waited::GaveUp;
        }
        if !may_kill && !trainers_alive {
            // attach: the trainer checkpointed and left; the rest is not
            // ours to end (nor to leave stopped).
            let why = format!("{}: the trainer exited (attach)", st.reason);
            st.release(&why, tree, h.sig, h.out);
            return Waited::Released;
        }
        let waiting = match st.done_at {
            Some(done) => now < done + EXIT_AFTER_DONE,
            None => confirmed.is_none(),
        };
        if trainers_alive && !grace_over && waiting {
            return Waited::Going;
        }
        if st.done_at.is_some() {
            // The companion's checkpoint was reported when it came.
        } else if let Some(w) = &st.watch {
            let path = confirmed.or_else(|| (!trainers_alive).then(|| w.written()).flatten());
            h.out.checkpoint(path, now - st.began, h.cfg.quiet);
        }
        let rest = idents(tree, |_| true);
        if st.frozen_all && grace_over {
            // Resuming a tree at the edge would hand the kernel the kill;
            // end it here instead.
            let sent = signal_all(h.sig, &rest, SIG_KILL);
            let why = format!("last resort during {}", st.reason);
            h.out.record_part(
                (st.action, Part::Kill),
                ActionKind::Kill,
                &why,
                sent,
                SIG_KILL,
            );
            st.step = StopStep::Killed;
        } else {
            let sent = signal_all(h.sig, &rest, SIG_TERM);
            signal_all(h.sig, &rest, SIG_CONT);
            if !sent.0.is_empty() {
                let why = format!("{}: terminating the rest of the tree", st.reason);
                let part = (st.action, Part::Cleanup);
                h.out
                    .record_part(part, ActionKind::Stop, &why, sent, SIG_TERM);
            }
            st.step = StopStep::Terminate {
                until: now + st.kill_after,
            };
        }
        if grace_over && trainers_alive && !h.cfg.quiet {
            h.out.say(if now >= st.grace_end {
                format!(
                    "the trainer did not exit within the {} grace; terminating the job",
                    human_duration(h.cfg.grace)
                )
            } else {
                format!(
                    "no room appeared within {} of freezing the tree at the edge of memory; \
                     killing it before the kernel does",
                    human_duration(LAST_RESORT_HOLD)
                )
            });
        }
        Waited::Going
    }

    /// The stop's request: its checkpoint when the save is done; the signal
    /// after all when the companion does not acknowledge in time.
    fn follow_request(&mut self, now: Instant, h: &mut Hands<'_>) {
        let st = self;
        let Some(id) = st.request else {
            return;
        };
        if st.done_at.is_none()
            && let Some(saved) = h.companion.done.clone().filter(|s| s.id == id)
        {
            st.done_at = Some(now);
            let path = saved.paths.first().cloned().filter(|_| saved.ok);
            if !saved.ok {
                h.out
                    .say("the companion reports that the checkpoint failed".to_string());
            }
            h.out.push(Acted::Checkpoint {
                path,
                waited_seconds: (saved.after_request_seconds * 1000.0).round() / 1000.0,
            });
            return;
        }
        let acked = h.companion.acked(id);
        let wait = st.ack_wait;
        if st.done_at.is_none() && !acked && !st.fell_back && now - st.began >= wait {
            st.fell_back = true;
            h.out.say(format!(
                "the companion did not acknowledge the checkpoint request within {}; signalling",
                human_duration(wait)
            ));
            let why = format!("{}: the companion did not answer", st.reason);
            let mark = h.out.mark();
            checkpoint_signal(h, ActionKind::Stop, &why, &st.signalled);
            h.out.parts_since(mark, st.action, Part::SignalFallback);
        }
    }
}

/// The checkpoint signal to the trainers, as `action`. A process that
/// does not catch it would die of a signal other than TERM (USR1's
/// default is to terminate, with no checkpoint and a confusing cause):
/// it gets SIGTERM instead, and the log says so. A trainer that does
/// not catch SIGTERM either loses the work since its last checkpoint:
/// the user is told.
pub(super) fn checkpoint_signal(
    h: &mut Hands<'_>,
    action: ActionKind,
    reason: &str,
    trainers: &[Ident],
) {
    let wanted = h.cfg.checkpoint_signal;
    let sig = &mut *h.sig;
    let (asked, plain): (Vec<Ident>, Vec<Ident>) = trainers
        .iter()
        .partition(|id| wanted == SIG_TERM || sig.catches(**id, wanted) != Some(false));
    if !asked.is_empty() || plain.is_empty() {
        let sent = signal_all(sig, &asked, wanted);
        h.out.record(action, reason, sent, wanted);
    }
    if !plain.is_empty() {
        let pids: Vec<String> = plain.iter().map(|p| p.0.to_string()).collect();
        let why = format!(
            "{reason}: pid {} does not catch {}",
            pids.join(", "),
            supervise::signal_name(wanted)
        );
        let sent = signal_all(sig, &plain, SIG_TERM);
        h.out.record(action, &why, sent, SIG_TERM);
        h.out.say(format!(
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
        h.out.say(format!(
            "warning: the trainer (pid {}) catches neither the checkpoint signal nor SIGTERM: \
             this stop loses the work since its last checkpoint (the companion, \
             python/oomguard, saves on request)",
            deaf.join(", ")
        ));
    } else if let Some(why) = h
        .checks
        .warn_framework(trainers, h.companion.connected, sig)
    {
        h.out.say(format!(
            "warning: {why}: this stop loses the work since its last checkpoint"
        ));
    }
}
