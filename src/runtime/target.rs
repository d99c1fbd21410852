//! What the loop supervises: a job oomguard launched, or a running job it
//! attached to. The loop asks the target what it may do (reap, forward a
//! signal, relaunch, leave the job running on a quit) and never tests the
//! mode itself; what an attached job adds (its cgroup, how the watch ends)
//! lives in [`Attached`].

use super::attach::Attached;

/// The job under supervision.
#[derive(Debug)]
pub(super) enum Target {
    /// oomguard started it and is its parent.
    Launched,
    /// oomguard started it for `oomguard doctor`, which it ends once
    /// judged, leaving the finding here.
    Judged(crate::vocab::verdict::Watch),
    /// oomguard watches a job it did not start.
    Attached(Attached),
}

impl Target {
    pub fn new(attached: Option<Attached>, doctor: Option<crate::vocab::verdict::Watch>) -> Self {
        match (attached, doctor) {
            (Some(a), _) => Self::Attached(a),
            (None, Some(w)) => Self::Judged(w),
            (None, None) => Self::Launched,
        }
    }

    /// Its parent: the job's end is learnt by reaping it (with its exit
    /// code), and what it leaves behind is oomguard's to stop. A watcher
    /// learns of the end by looking, never gets the code, and leaves the
    /// orphans to init.
    pub fn is_parent(&self) -> bool {
        matches!(self, Self::Launched | Self::Judged(_))
    }

    /// Whether a failed attempt may be started again: only a job oomguard
    /// started can be started again.
    pub fn restarts(&self) -> bool {
        self.is_parent()
    }

    /// Whether a signal oomguard receives goes on to the job. A job it did
    /// not launch is never sent one: INT and TERM end the watch instead.
    pub fn forwards_signals(&self) -> bool {
        self.is_parent()
    }

    /// Whether leaving the dashboard (or losing its terminal) ends the
    /// watch with the job left running, rather than only closing the
    /// dashboard over a job that goes on under oomguard.
    pub fn quit_detaches(&self) -> bool {
        !self.is_parent()
    }

    /// A run that ended with the job still running (only a watch can).
    pub fn detached(&self, job_ended: bool) -> bool {
        !self.is_parent() && !job_ended
    }

    /// The doctor's hold, when the run is its probe.
    pub fn judged(&self) -> Option<&crate::vocab::verdict::Watch> {
        match self {
            Self::Judged(w) => Some(w),
            _ => None,
        }
    }

    pub fn attached(&self) -> Option<&Attached> {
        match self {
            Self::Attached(a) => Some(a),
            Self::Launched | Self::Judged(_) => None,
        }
    }

    pub fn attached_mut(&mut self) -> Option<&mut Attached> {
        match self {
            Self::Attached(a) => Some(a),
            Self::Launched | Self::Judged(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_launched_job_is_reaped_signalled_and_restarted() {
        let launched = Target::new(None, None);
        assert!(launched.is_parent() && launched.restarts() && launched.forwards_signals());
        assert!(!launched.quit_detaches());
        assert!(!launched.detached(false));
        let watched = Target::new(Some(Attached::default()), None);
        assert!(!watched.is_parent() && !watched.restarts() && !watched.forwards_signals());
        assert!(watched.quit_detaches());
        assert!(watched.detached(false));
        assert!(!watched.detached(true));
        assert!(watched.attached().is_some());
    }
}
