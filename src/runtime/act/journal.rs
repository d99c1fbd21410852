//! What the actuator did, in the order it did it: the records the loop
//! drains for the sinks each tick, and the tally of the stops' parts taken
//! from the same lines as they are written, so the summary's count and the
//! log can never disagree.

use std::path::PathBuf;
use std::time::Duration;

use super::parts::{Part, StopParts};
use super::{Acted, Sent};
use crate::engine::policy::Action;
use crate::sinks::log::ActionKind;

#[derive(Debug, Default)]
pub struct Journal {
    out: Vec<Acted>,
    /// The parts of the run's stops, for the summary (kept across
    /// attempts, as the log's counts are).
    parts: StopParts,
}

impl Journal {
    pub fn push(&mut self, acted: Acted) {
        self.out.push(acted);
    }

    pub fn say(&mut self, text: String) {
        self.out.push(Acted::Say(text));
    }

    /// An `action` line for signals sent (`sent`) with `signal`.
    pub fn record(&mut self, action: ActionKind, reason: &str, sent: Sent, signal: i32) {
        self.out.push(Acted::Action {
            action,
            reason: reason.to_string(),
            pids: sent.0,
            signal: Some(signal),
            result: sent.1,
        });
    }

    /// [`Journal::record`] for a line that is `part` of the stop or
    /// restart `of`, not a decision of its own.
    pub fn record_part(
        &mut self,
        (of, part): (Action, Part),
        action: ActionKind,
        reason: &str,
        sent: Sent,
        signal: i32,
    ) {
        let mark = self.mark();
        self.record(action, reason, sent, signal);
        self.parts_since(mark, of, part);
    }

    /// The `checkpoint` event: the confirmed checkpoint, or none (said
    /// unless `quiet`).
    pub fn checkpoint(&mut self, path: Option<PathBuf>, waited: Duration, quiet: bool) {
        if path.is_none() && !quiet {
            self.say("no new checkpoint was confirmed in the checkpoint directory".to_string());
        }
        self.out.push(Acted::Checkpoint {
            path,
            waited_seconds: (waited.as_secs_f64() * 1000.0).round() / 1000.0,
        });
    }

    /// Where the next line would start (see [`Journal::parts_since`]).
    pub fn mark(&self) -> usize {
        self.out.len()
    }

    /// Every action line written since `mark` is `part` of the stop or
    /// restart `of`.
    pub fn parts_since(&mut self, mark: usize, of: Action, part: Part) {
        let logged: Vec<&'static str> = self.out[mark.min(self.out.len())..]
            .iter()
            .filter_map(|a| match a {
                Acted::Action { action, .. } => Some(action.as_str()),
                _ => None,
            })
            .collect();
        for name in logged {
            self.parts.note(of, part, name);
        }
    }

    /// Whether what [`Journal::drain`] would give holds a rule change or
    /// an action (the tick's sample line then carries the process list).
    pub fn acting(&self) -> bool {
        self.out
            .iter()
            .any(|a| matches!(a, Acted::Action { .. } | Acted::Rule(_)))
    }

    /// What was done since the last call.
    pub fn drain(&mut self) -> Vec<Acted> {
        std::mem::take(&mut self.out)
    }

    pub fn parts(&self) -> &StopParts {
        &self.parts
    }
}
