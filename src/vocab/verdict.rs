//! What a stop would save, as a value: the verdict the stop path's warning
//! and `oomguard doctor -- CMD` share, and the slot through which a
//! supervised run hands it to the doctor. A leaf: the runtime fills it in,
//! the doctor reads it, the settings carry the slot, and none of them
//! imports another for it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

/// Whether a stop would save the trainer's work: the check behind
/// `Actuator::check_stop_saves`'s warning, also run by `oomguard doctor
/// -- CMD`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StopVerdict {
    /// The trainers checked (the job's process when no trainer is known).
    pub trainers: Vec<u32>,
    /// The checkpoint signal.
    pub signal: i32,
    /// Trainers known to catch neither the checkpoint signal nor SIGTERM.
    pub deaf: Vec<u32>,
    /// Trainers whose handlers could not be read (gone, or not ours).
    pub unknown: Vec<u32>,
    /// A companion said hello: the stop asks it for a checkpoint.
    pub companion: bool,
    /// Why the framework the job's output named saves nothing on the
    /// signal it catches (Lightning without its companion), when so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
}

impl StopVerdict {
    /// A stop would lose the work since the last checkpoint.
    pub fn loses_work(&self) -> bool {
        !self.companion && (!self.deaf.is_empty() || self.framework.is_some())
    }
}

/// The doctor's hold on a supervised run: how long to wait for progress,
/// and where the supervisor leaves its finding.
#[derive(Debug, Clone)]
pub struct Watch {
    pub wait: Duration,
    finding: Arc<Mutex<Option<Finding>>>,
    /// The run's age when the job first showed a step.
    stepped: Arc<Mutex<Option<Duration>>>,
}

/// What the supervisor saw when it judged the job.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub verdict: StopVerdict,
    /// The step the job had reached; `None` when the wait ran out first.
    pub step: Option<u64>,
    /// Seconds from the start to the judgement.
    pub waited_seconds: f64,
}

impl Watch {
    pub fn new(wait: Duration) -> Self {
        Self {
            wait,
            finding: Arc::new(Mutex::new(None)),
            stepped: Arc::new(Mutex::new(None)),
        }
    }

    /// How long the job has shown steps, `age` being the run's age now
    /// (the first call starts the count).
    pub fn stepping_for(&self, age: Duration) -> Duration {
        let Ok(mut first) = self.stepped.lock() else {
            return Duration::MAX;
        };
        age.saturating_sub(*first.get_or_insert(age))
    }

    /// Whether the supervisor already judged the job.
    pub fn concluded(&self) -> bool {
        self.finding.lock().map(|f| f.is_some()).unwrap_or(true)
    }

    pub fn conclude(&self, finding: Finding) {
        if let Ok(mut slot) = self.finding.lock() {
            *slot = Some(finding);
        }
    }

    pub fn finding(&self) -> Option<Finding> {
        self.finding.lock().ok().and_then(|f| f.clone())
    }
}
