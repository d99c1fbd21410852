//! Whom the actuator signals, and how: processes by identity (pid, start
//! time), picked from the tree by role or by growth, and signalled so that
//! one that is gone is skipped and no recycled pid is ever hit.

use std::collections::{HashMap, HashSet};

use super::{Ident, Signaller};
use crate::job::supervise::SignalError;
use crate::vocab::model::{CeilingSource, ProcSample, Role, Sample};

/// The pids reached and the first error (`"ok"` when none).
pub type Sent = (Vec<u32>, String);

/// Signals processes by identity; a process that is gone is skipped
/// silently.
pub fn signal_all(sig: &mut dyn Signaller, targets: &[Ident], signal: i32) -> Sent {
    let mut reached = Vec::new();
    let mut err = None;
    for &id in targets {
        match sig.signal(id, signal) {
            Ok(()) => reached.push(id.0),
            Err(SignalError::Gone(_)) => {}
            Err(e) => {
                err.get_or_insert(e.to_string());
            }
        }
    }
    (reached, err.unwrap_or_else(|| "ok".into()))
}

/// The identities of the tree's processes that match.
/// The trainers, or the job's main process when none is named one.
pub fn trainer_idents(tree: &[ProcSample], job_pid: u32) -> Vec<Ident> {
    let trainers = idents(tree, |p| p.role == Role::Trainer);
    if trainers.is_empty() {
        return idents(tree, |p| p.pid == job_pid);
    }
    trainers
}

pub fn idents(tree: &[ProcSample], pred: impl Fn(&ProcSample) -> bool) -> Vec<Ident> {
    tree.iter()
        .filter(|p| pred(p))
        .map(|p| (p.pid, p.start_time))
        .collect()
}

/// Non-trainer processes whose memory grew since `prev` (usually
/// DataLoader workers with a leaking cache), new ones included.
pub fn growers(tree: &[ProcSample], prev: Option<&Sample>) -> HashSet<Ident> {
    let Some(prev) = prev else {
        return HashSet::new();
    };
    let before: HashMap<Ident, u64> = prev
        .procs
        .iter()
        .map(|p| ((p.pid, p.start_time), p.rss_bytes))
        .collect();
    tree.iter()
        .filter(|p| matches!(p.role, Role::Worker | Role::Other))
        .filter(|p| {
            before
                .get(&(p.pid, p.start_time))
                .is_none_or(|&b| p.rss_bytes > b)
        })
        .map(|p| (p.pid, p.start_time))
        .collect()
}

/// The least headroom (percent) under a ceiling the kernel enforces:
/// freezing everything is only for those, since a budget overrun is not an
/// OOM kill and the trainer keeps its chance to checkpoint there.
pub(super) fn kernel_headroom(sample: &Sample) -> Option<f64> {
    sample
        .ceilings()
        .into_iter()
        .filter(|c| c.ceiling.source != CeilingSource::Budget)
        .map(|c| c.headroom_percent())
        .min_by(f64::total_cmp)
}
