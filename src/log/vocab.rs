//! The log's closed vocabularies: what oomguard did ([`ActionKind`]) and
//! how a rule changed ([`RuleState`]). Typed from the actuator to every
//! sink and reader; a value written by a later version reads as `Other`.

use serde::{Deserialize, Serialize};

use crate::policy::Action;

/// What oomguard did: the policy's actions, and `resume` (a pause ended).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    Warn,
    Relieve,
    Checkpoint,
    Pause,
    Resume,
    Restart,
    Stop,
    Kill,
    /// An action this version does not know (read, never written).
    #[default]
    #[serde(other)]
    Other,
}

impl ActionKind {
    /// The name the log spells it with (`?` for one not known).
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Warn => "warn",
            ActionKind::Relieve => "relieve",
            ActionKind::Checkpoint => "checkpoint",
            ActionKind::Pause => "pause",
            ActionKind::Resume => "resume",
            ActionKind::Restart => "restart",
            ActionKind::Stop => "stop",
            ActionKind::Kill => "kill",
            ActionKind::Other => "?",
        }
    }
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Action> for ActionKind {
    fn from(a: Action) -> Self {
        match a {
            Action::Warn => ActionKind::Warn,
            Action::Relieve => ActionKind::Relieve,
            Action::Checkpoint => ActionKind::Checkpoint,
            Action::Pause => ActionKind::Pause,
            Action::Restart => ActionKind::Restart,
            Action::Stop => ActionKind::Stop,
            Action::Kill => ActionKind::Kill,
        }
    }
}

/// Whether a rule started or stopped firing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleState {
    #[default]
    Firing,
    Cleared,
    /// A state this version does not know (read, never written).
    #[serde(other)]
    Other,
}

impl RuleState {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleState::Firing => "firing",
            RuleState::Cleared => "cleared",
            RuleState::Other => "changed",
        }
    }
}
