//! The log's closed vocabularies: what oomguard did ([`ActionKind`]) and
//! how a rule changed ([`RuleState`]). Typed from the actuator to every
//! sink and reader; a value written by a later version reads as `Other`.

use serde::{Deserialize, Serialize};

use crate::engine::policy::Action;

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
    /// An action this version does not know (read, never written; a
    /// reader's own output spells it as [`ActionKind::as_str`] does).
    #[default]
    #[serde(other, rename = "?")]
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

    /// The kind a name spells, as a line's `action` reads (one not known
    /// is `Other`): for names the log holds as text, such as a rule's.
    pub fn from_name(name: &str) -> ActionKind {
        [
            ActionKind::Warn,
            ActionKind::Relieve,
            ActionKind::Checkpoint,
            ActionKind::Pause,
            ActionKind::Resume,
            ActionKind::Restart,
            ActionKind::Stop,
            ActionKind::Kill,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
        .unwrap_or_default()
    }

    /// Actions that end the attempt (the policy's critical ones).
    pub fn ends_attempt(self) -> bool {
        matches!(
            self,
            ActionKind::Stop | ActionKind::Restart | ActionKind::Kill
        )
    }

    /// Actions that end or hold the job: a warning or a request is not one.
    pub fn is_decisive(self) -> bool {
        self == ActionKind::Pause || self.ends_attempt()
    }
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for ActionKind {
    fn from(name: &str) -> Self {
        ActionKind::from_name(name)
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
