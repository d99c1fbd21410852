//! The actuator's side of the companion channel: what this attempt's
//! companion has said (hello, progress, acknowledgements, saves, another
//! node's request the ranks agreed on) and the requests written to it. The
//! stop that waits on them is the ladder's (`act.rs`); the log lines they
//! become are the supervisor's (`channel.rs`).

use std::path::PathBuf;
use std::time::Instant;

use super::super::store_link::News;
use super::{Acted, Actuator, RemoteStop};
use crate::vocab::companion::{Kind, Record};

/// What the companion of this attempt has said.
#[derive(Debug, Default)]
pub struct CompanionState {
    /// A companion said hello: requests reach the trainer.
    pub connected: bool,
    /// The newest training step it reported.
    pub step: Option<u64>,
    /// The outstanding request: id, kind, when, acknowledged.
    pub(super) pending: Option<(u64, Kind, Instant, bool)>,
    /// The last finished save: step, seconds after its request, paths.
    pub done: Option<Saved>,
    /// The job's ranks in all, and on this node, as the companion says.
    pub world: Option<(u32, u32)>,
    /// A companion that speaks another protocol said hello: nothing it
    /// writes is read, and stops signal as without a companion.
    pub(super) foreign: bool,
}

impl CompanionState {
    /// The job has ranks on other nodes: holding this node's ranks would
    /// stall every node in its next collective.
    pub fn spans_nodes(&self) -> bool {
        self.world.is_some_and(|(all, here)| all > here)
    }
}

/// A checkpoint the companion reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Saved {
    pub id: u64,
    pub step: Option<u64>,
    pub after_request_seconds: f64,
    pub paths: Vec<PathBuf>,
    pub ok: bool,
}

impl Actuator {
    /// Reads what the companion appended since the last tick.
    pub fn poll_channel(&mut self, now: Instant) {
        let Some(ch) = self.channel.as_mut() else {
            return;
        };
        let mut records = ch.poll();
        // The other nodes' faults, and the store's news, as the companion
        // said them before oomguard carried faults itself.
        for news in self.peers.link_news() {
            match news {
                News::Heard(r) => records.push(r),
                News::CannotTell(why) => {
                    self.push(Acted::Say(format!("cannot tell the other nodes: {why}")));
                }
            }
        }
        for r in records {
            if self.companion.foreign {
                continue;
            }
            if let Record::Hello {
                v: Some(v),
                version,
                path,
                ..
            } = &r
                && *v != crate::vocab::companion::PROTOCOL
            {
                self.companion.foreign = true;
                self.companion.connected = false;
                self.say(format!(
                    "the companion in the job ({}, version {}) speaks protocol {v}, this oomguard {}: \
                     its records are not read, and a stop signals the trainer instead of asking it \
                     (install the oomguard that matches, or remove the other from the job's environment)",
                    path.as_deref().unwrap_or("?"),
                    version.as_deref().unwrap_or("?"),
                    crate::vocab::companion::PROTOCOL
                ));
                self.push(Acted::Companion(r));
                continue;
            }
            self.peers.note(&r, now);
            let c = &mut self.companion;
            match &r {
                Record::Hello {
                    world, local_world, ..
                } => {
                    c.connected = true;
                    if let Some(w) = *world {
                        c.world = Some((w, local_world.unwrap_or(w)));
                    }
                }
                Record::Progress { step, .. } => {
                    c.connected = true;
                    c.step = step.or(c.step);
                }
                Record::Ack { id, .. } => {
                    if let Some(p) = c.pending.as_mut().filter(|p| p.0 == *id) {
                        p.3 = true;
                    }
                }
                Record::Done {
                    id,
                    step,
                    paths,
                    ok,
                    ..
                } => {
                    if let Some((pid, _, at, _)) = c.pending.filter(|p| p.0 == *id) {
                        c.pending = None;
                        c.done = Some(Saved {
                            id: pid,
                            step: *step,
                            after_request_seconds: (now - at).as_secs_f64(),
                            paths: paths.clone(),
                            ok: *ok,
                        });
                    }
                    c.step = (*step).max(c.step);
                }
                Record::Remote {
                    id,
                    kind,
                    node,
                    cause_rank,
                    reason,
                    detail,
                    then,
                    ..
                } => {
                    if *kind != Kind::Relieve && c.pending.is_none_or(|p| p.0 != *id) {
                        c.pending = Some((*id, *kind, now, true));
                        if *kind == Kind::CheckpointAndExit {
                            self.remote_stop = Some(RemoteStop {
                                id: *id,
                                why: crate::vocab::companion::remote_cause(
                                    *node,
                                    *cause_rank,
                                    reason.as_deref().unwrap_or("a stop"),
                                    detail.as_deref(),
                                ),
                                restart: then.as_deref() == Some("restart"),
                            });
                        }
                    }
                }
                Record::Relieved { .. }
                | Record::Fault { .. }
                | Record::FaultPublished { .. }
                | Record::StoreLost { .. }
                | Record::Crash { .. }
                | Record::Bye { .. } => {}
            }
            self.push(Acted::Companion(r));
        }
    }

    /// At the attempt's end: another node's stop whose save this node's
    /// ranks made and then left, before a tick could join it (the request,
    /// the save and the exit all fell between two ticks), is still why the
    /// attempt ended, however the launcher reported the ranks' exit (a rank
    /// aborted by its store's teardown fails it). True when it did.
    pub fn adopt_remote_stop(&mut self) -> bool {
        let Some(remote) = self.remote_stop.take() else {
            return false;
        };
        let saved = self
            .companion
            .done
            .as_ref()
            .is_some_and(|d| d.id == remote.id);
        if !saved || self.policy_end.is_some() || self.stop.is_some() {
            return false;
        }
        self.end_after_the_ranks(
            remote.restart,
            remote.why,
            "the ranks had already saved and left",
        );
        true
    }

    /// Writes a request to the companion, when one is listening. `None`:
    /// no companion (or the file could not be written: said).
    pub fn ask(&mut self, kind: Kind, reason: &str, now: Instant) -> Option<u64> {
        self.ask_then(kind, reason, false, now)
    }

    /// [`Actuator::ask`]; `restart`: the stop ends in a restart of the
    /// whole job (the other nodes restart with it).
    pub fn ask_then(
        &mut self,
        kind: Kind,
        reason: &str,
        restart: bool,
        now: Instant,
    ) -> Option<u64> {
        if !self.companion.connected {
            return None;
        }
        let ch = self.channel.as_mut()?;
        let wait = self.cfg.grace;
        let cause = self.cause_rank;
        match ch.request_then(kind, reason, self.detail.as_deref(), wait, restart, cause) {
            Ok(id) => {
                self.companion.pending = Some((id, kind, now, false));
                self.push(Acted::Requested {
                    id,
                    kind,
                    reason: reason.to_string(),
                });
                Some(id)
            }
            Err(e) => {
                self.say(format!("cannot ask the companion for a checkpoint: {e}"));
                None
            }
        }
    }
}
