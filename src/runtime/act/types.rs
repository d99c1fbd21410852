//! What the actuator is told and what it tells: its settings, where a stop
//! begins, the levels it works against, another node's stop it joins, and
//! the [`Acted`] records it hands back for the sinks. Plain data, kept
//! apart from the ladder that uses it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::engine::policy::Action;
use crate::vocab::companion::{Kind, Record};
use crate::vocab::model::{ProcSample, Sample};

/// Another node's stop the ranks agreed on, which this node joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteStop {
    pub id: u64,
    /// Who asked and why ("node 0 (rank 1): critical-headroom: …").
    pub why: String,
    /// The asking node restarts the job after the save: so does this one.
    pub restart: bool,
}

/// What the actuator did, for the sinks.
#[derive(Debug, Clone, PartialEq)]
pub enum Acted {
    /// An `action` line: what, why, the pids reached, the signal and the
    /// first error (`"ok"` when none).
    Action {
        action: crate::sinks::log::ActionKind,
        reason: String,
        pids: Vec<u32>,
        signal: Option<i32>,
        result: String,
    },
    /// A message for the user (stderr or the dashboard).
    Say(String),
    /// The checkpoint wait ended (with `--checkpoint-dir`).
    Checkpoint {
        path: Option<PathBuf>,
        waited_seconds: f64,
    },
    /// A rule changed state.
    Rule(crate::sinks::log::RuleEvent),
    /// A hook command to run for an action.
    Hook {
        cmd: String,
        action: Action,
        reason: String,
    },
    /// A stop that could not end the job (attach without `--allow-kill`)
    /// was given up: the policy starts over.
    GaveUp,
    /// A request was written to the companion.
    Requested { id: u64, kind: Kind, reason: String },
    /// This node's fault went to the companion for the other nodes (`id`:
    /// none when it could not be written).
    Fault {
        id: Option<u64>,
        fault: crate::vocab::companion::Fault,
    },
    /// The companion said something (progress, an acknowledgement, a
    /// finished save), for the log and the progress tracker.
    Companion(Record),
}

/// What the actuator needs to know of the settings.
#[derive(Debug, Clone)]
pub struct ActConfig {
    pub checkpoint_signal: i32,
    pub grace: Duration,
    pub kill_after: Duration,
    /// Always for a job oomguard launched; under `attach` only with
    /// `--allow-kill`.
    pub may_kill: bool,
    pub quiet: bool,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_glob: String,
}

/// How the `--signal-budget` is spent: the save and the ranks' exit get
/// the budget less the last part, SIGTERM to the rest to SIGKILL, which is
/// `--kill-after` or a third of the budget if that is less (a long
/// `--kill-after` must not leave the save no time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveBudget {
    pub total: Duration,
    pub kill_after: Duration,
}

impl SaveBudget {
    pub fn kill_after(self) -> Duration {
        self.kill_after.min(self.total / 3)
    }

    pub fn window(self) -> Duration {
        self.total.saturating_sub(self.kill_after())
    }
}

/// Where a stop begins: the tree now, the last tick's sample (to find the
/// growers), the job's main process and the time.
#[derive(Debug, Clone, Copy)]
pub struct Scene<'a> {
    pub tree: &'a [ProcSample],
    pub prev: Option<&'a Sample>,
    pub job_pid: u32,
    pub now: Instant,
}

/// The levels the stop ladder works against, from the policy.
#[derive(Debug, Clone, Copy)]
pub struct Levels {
    /// Headroom (percent) under which the whole tree is frozen during a
    /// stop, for ceilings the kernel enforces.
    pub last_resort: f64,
}
