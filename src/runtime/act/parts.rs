//! The actions a stop is made of. A graceful stop logs more than one
//! `action` line: the throttle of the growers is a `pause`, the end of the
//! rest of the tree is a second `stop`, a last-resort freeze or kill has
//! lines of its own. The log counts each line (docs/log-schema.md), but the
//! user decided, or the policy did, once: the summary counts the decision
//! and names its parts, which are tallied here.

use std::collections::BTreeMap;

use crate::engine::policy::Action;

/// One step of a stop's ladder that is logged as an action of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// The growers held but for short slices (a `pause` line).
    Throttle,
    /// The whole tree frozen at the last-resort level (a `pause` line).
    Freeze,
    /// The freeze let go when room came back (a `resume` line).
    Thaw,
    /// The checkpoint signal after all, the companion having not answered.
    SignalFallback,
    /// SIGTERM to the rest of the tree once the save is over (a `stop` line).
    Cleanup,
    /// SIGKILL: `--kill-after` expired, or the last resort (a `kill` line).
    Kill,
}

impl Part {
    /// How the summary names it.
    pub fn label(self) -> &'static str {
        match self {
            Part::Throttle => "throttle",
            Part::Freeze => "freeze",
            Part::Thaw => "thaw",
            Part::SignalFallback => "signal fallback",
            Part::Cleanup => "tree cleanup",
            Part::Kill => "kill",
        }
    }
}

/// The parts of the run's stops (across attempts): what they are, and
/// which logged actions they account for.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StopParts {
    /// (the decision's action, its part) → how many times.
    parts: BTreeMap<(&'static str, Part), u32>,
    /// Logged action name → how many of its lines were parts of a stop.
    logged: BTreeMap<&'static str, u32>,
}

impl StopParts {
    /// Lines of `action` (as logged) that belong to a decision, not made
    /// one of their own.
    pub fn logged_as_parts(&self, action: &str) -> u32 {
        self.logged.get(action).copied().unwrap_or(0)
    }

    /// The parts of the decisions logged as `of` (`stop`, `restart`), in
    /// ladder order.
    pub fn of(&self, of: &str) -> Vec<Part> {
        self.parts
            .iter()
            .filter(|((a, _), _)| *a == of)
            .map(|((_, p), _)| *p)
            .collect()
    }

    /// One more `part` of a decision logged as `of`, its line logged as
    /// `logged`.
    pub fn note(&mut self, of: Action, part: Part, logged: &'static str) {
        *self.parts.entry((of.name(), part)).or_insert(0) += 1;
        *self.logged.entry(logged).or_insert(0) += 1;
    }
}
