//! The supervisor's side of the companion channel: what the companion's
//! records become (log lines, exact progress, the user's messages), the
//! channel each new attempt gets, and the checkpoint line of the summary.
//! The requests themselves are the actuator's (`act.rs`).

use crate::sinks::log::{
    CheckpointAckEvent, CheckpointDoneEvent, CheckpointRequestEvent, CompanionEvent, Event,
    FaultEvent, FaultPublishedEvent, RelievedEvent, StoreLostEvent, StoreUnsteadyEvent,
};
use crate::vocab::companion::{Channel, Kind, Record};
use crate::vocab::forensics::progress::{Phase, ProgressUpdate};

use super::Supervisor;

/// A progress word older than this (seconds, by the companion's stamp) is
/// taken as this old: the records are read every tick, so only a clock
/// stepped between writing and reading makes one older.
const MAX_WORD_AGE: f64 = 5.0;

impl Supervisor {
    /// A request went to the companion.
    pub(super) fn log_request(&mut self, id: u64, kind: Kind, reason: &str) {
        self.sinks
            .emit(&Event::CheckpointRequest(CheckpointRequestEvent {
                id,
                kind: kind.name().into(),
                reason: Some(reason.into()),
                ..CheckpointRequestEvent::default()
            }));
    }

    /// One record of the companion.
    pub(super) fn companion_said(&mut self, r: Record) {
        match r {
            hello @ Record::Hello { .. } => {
                if let Some(e) = hello_event(hello) {
                    self.sinks.emit(&Event::Companion(e));
                }
            }
            Record::Progress {
                step,
                epoch,
                phase,
                t,
                ..
            } => self.companion_progress(step, epoch, phase.as_deref(), t),
            Record::Ack { id, rank, step } => {
                let ack = CheckpointAckEvent { id, rank, step };
                self.sinks.emit(&Event::CheckpointAck(ack));
            }
            Record::Done {
                id,
                rank,
                step,
                paths,
                ok,
                seconds,
                not_counted,
            } => {
                if let Some(why) = &not_counted
                    && !self.cfg.quiet
                {
                    self.say(format!(
                        "the save of step {} does not count: {why}; nothing is resumed from it",
                        step.map_or_else(|| "?".to_string(), |s| s.to_string())
                    ));
                }
                let done = CheckpointDoneEvent {
                    id,
                    rank,
                    step,
                    paths,
                    ok,
                    save_seconds: seconds,
                    not_counted,
                };
                self.companion_saved(done);
            }
            Record::Remote {
                id,
                kind,
                node,
                step,
                cause_rank,
                reason,
                detail,
                then,
                task,
            } => {
                self.sinks
                    .emit(&Event::CheckpointRequest(CheckpointRequestEvent {
                        id,
                        kind: kind.name().into(),
                        reason,
                        remote: true,
                        node: Some(node),
                        cause_rank,
                        detail,
                        step,
                        then,
                        task,
                    }));
            }
            Record::Fault {
                id,
                node,
                cause_rank,
                reason,
                detail,
                then,
            } => {
                self.sinks.emit(&Event::Fault(FaultEvent {
                    id: Some(id),
                    remote: true,
                    node: Some(node),
                    cause_rank,
                    reason,
                    detail,
                    then,
                }));
            }
            Record::StoreLost { addr } => {
                self.sinks.emit(&Event::StoreLost(StoreLostEvent { addr }));
            }
            Record::StoreUnsteady { addr, reason } => {
                self.sinks
                    .emit(&Event::StoreUnsteady(StoreUnsteadyEvent { addr, reason }));
            }
            Record::FaultPublished { id } => {
                self.sinks
                    .emit(&Event::FaultPublished(FaultPublishedEvent { id }));
            }
            // A rank's end: a fault names it, when it is one.
            Record::Crash { .. } | Record::Bye { .. } => {}
            Record::Relieved { id, rank, freed } => {
                self.sinks.emit(&Event::Relieved(RelievedEvent {
                    id,
                    rank,
                    freed_bytes: freed,
                }));
            }
        }
    }

    /// A rank's progress record, written at `sent` (Unix seconds): the
    /// run's progress (the companion's is exact; the output's guesses give
    /// way to it).
    fn companion_progress(
        &mut self,
        step: Option<u64>,
        epoch: Option<f64>,
        phase: Option<&str>,
        sent: Option<f64>,
    ) {
        let u = ProgressUpdate {
            step,
            total: None,
            epoch: epoch.map(|e| {
                if e.fract() == 0.0 {
                    format!("{e:.0}")
                } else {
                    format!("{e:.2}")
                }
            }),
            phase: phase.and_then(phase_of),
            printed_rate: None,
        };
        // The step was reached when the word was written, not when this
        // tick read it: stamped with the reading's time, a word up to a
        // second old put the step of every reading 0 to 20 steps behind
        // (as the two clocks drift), and the growth per step read low.
        let age = sent.map_or(0.0, |sent| {
            (crate::vocab::clock::unix_seconds() - sent).clamp(0.0, MAX_WORD_AGE)
        });
        let t = (self.run_t() - age).max(0.0);
        self.output.progress_mut().update_exact(u, t);
        self.publish_progress();
    }

    /// A rank's save ended: logged, counted, the step it saved taken as
    /// progress, the file kept for a restart, and said.
    fn companion_saved(&mut self, done: CheckpointDoneEvent) {
        let (step, ok) = (done.step, done.ok);
        let first = done.paths.first().cloned();
        self.sinks.emit(&Event::CheckpointDone(done));
        if let Some(step) = step.filter(|_| ok) {
            self.sinks.saved(step);
        }
        if step.is_some() {
            let u = ProgressUpdate {
                step,
                ..ProgressUpdate::default()
            };
            let t = self.run_t();
            self.output.progress_mut().update(u, t);
            self.publish_progress();
        }
        // The newest saved checkpoint is the one a restart resumes from,
        // whether a stop or a `checkpoint` rule asked for it.
        if let Some(p) = first.filter(|p| ok && p.exists()) {
            self.attempts.saved(p);
        }
        // Without the dashboard, a save that ends the run is said once, by
        // the summary that follows in moments (with the steps the end
        // lost); the dashboard's events pane has it when it happens.
        let summary_says_it = self.sinks.app().is_none() && self.save_ends_run();
        if !self.cfg.quiet
            && !summary_says_it
            && let Some(line) = self.checkpoint_line(self.core.act().stop().is_some())
        {
            self.say(line);
        }
    }

    /// Whether the attempt ended short of its own end (a stop, a kill, a
    /// failure): the steps since the checkpoint are then lost.
    pub(super) fn attempt_lost_work(&self) -> bool {
        self.core.act().policy_end().is_some()
            || !matches!(
                self.child.status(),
                Some(crate::job::supervise::Status::Exited(0))
            )
    }

    /// Whether the save under way ends the run: a stop's or a signal's,
    /// or a restart's when no restart is left.
    fn save_ends_run(&self) -> bool {
        self.core.act().stop().is_some_and(|st| {
            st.action() != crate::engine::policy::Action::Restart
                || self.attempts.restarts() >= self.cfg.max_restarts
        })
    }

    /// Whether the companion reports progress (the output's progress bars
    /// are then not read for it: the companion's step is exact).
    pub(super) fn exact_progress(&self) -> bool {
        self.core.act().companion().step.is_some()
    }

    /// "checkpoint at step 580 (2.1 s after the request), 0 steps lost:
    /// ckpt/step-580.pt"; the steps lost only when the save ends the
    /// attempt (`ending`). The path is what the user needs next (to
    /// resume, to copy it off the node), so it is in the line.
    pub(super) fn checkpoint_line(&self, ending: bool) -> Option<String> {
        let c = &self.core.act().companion();
        let saved = c.done.as_ref()?;
        if !saved.ok {
            return Some(match &saved.not_counted {
                Some(why) => format!("the save did not count ({why})"),
                None => "the companion's checkpoint failed".to_string(),
            });
        }
        let at = saved.step.map_or_else(
            || "checkpoint".to_string(),
            |s| format!("checkpoint at step {s}"),
        );
        let lost = match (c.step, saved.step) {
            (Some(now), Some(at)) if ending => {
                let n = now.saturating_sub(at);
                format!(", {n} step{} lost", if n == 1 { "" } else { "s" })
            }
            _ => String::new(),
        };
        let after = if self.core.act().signal_end().is_some() {
            "the signal"
        } else {
            "the request"
        };
        Some(format!(
            "{at} ({:.1} s after {after}){lost}{}",
            saved.after_request_seconds,
            paths_said(&saved.paths)
        ))
    }

    /// The next attempt's channel (and its variable), in the hook's
    /// directory.
    pub(super) fn next_channel(&mut self) -> Option<[(std::ffi::OsString, std::ffi::OsString); 2]> {
        self.core.act_mut().set_channel(None);
        let dir = self.sampler.torch_injector()?.dir().to_path_buf();
        if !self.cfg.companion() {
            return None;
        }
        match Channel::create(&dir, self.attempts.number()) {
            Ok(c) => {
                let env = c.env();
                self.core.act_mut().set_channel(Some(c));
                Some(env)
            }
            Err(e) => {
                if !self.cfg.quiet {
                    self.say(format!("no checkpoint companion for this attempt: {e}"));
                }
                None
            }
        }
    }
}

fn phase_of(name: &str) -> Option<Phase> {
    Some(match name {
        "train" => Phase::Train,
        "validation" | "val" => Phase::Validation,
        "test" => Phase::Test,
        "predict" => Phase::Predict,
        "sanity" => Phase::Sanity,
        _ => return None,
    })
}

/// ": a.ckpt", ": a.ckpt, b.ckpt", ": a.ckpt, b.ckpt and 6 more" (a save
/// of many ranks names a few; the log has every one).
fn paths_said(paths: &[std::path::PathBuf]) -> String {
    const NAMED: usize = 2;
    if paths.is_empty() {
        return String::new();
    }
    let named: Vec<String> = paths
        .iter()
        .take(NAMED)
        .map(|p| p.display().to_string())
        .collect();
    let more = paths.len().saturating_sub(NAMED);
    let rest = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(": {}{rest}", named.join(", "))
}

/// The log's `companion` event of a companion's hello.
fn hello_event(r: Record) -> Option<CompanionEvent> {
    match r {
        Record::Hello {
            pid,
            rank,
            framework,
            world,
            v,
            version,
            path,
            local_rank,
            node,
            task,
            ..
        } => Some(CompanionEvent {
            pid,
            rank,
            framework,
            world,
            protocol: v,
            version,
            path,
            local_rank,
            node,
            task,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::paths_said;
    use std::path::PathBuf;

    #[test]
    fn a_save_names_its_files() {
        assert_eq!(paths_said(&[]), "");
        assert_eq!(paths_said(&[PathBuf::from("ckpt/a.pt")]), ": ckpt/a.pt");
        let many: Vec<PathBuf> = (0..5).map(|i| PathBuf::from(format!("r{i}.pt"))).collect();
        assert_eq!(paths_said(&many), ": r0.pt, r1.pt and 3 more");
    }
}
