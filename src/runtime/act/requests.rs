//! The actuator's side of the companion channel, a part of its own: the
//! attempt's channel, what the companion has said on it (hello, progress,
//! acknowledgements, saves, another node's request the ranks agreed on) and
//! the requests written to it. The stop that waits on them is the ladder's
//! (`act.rs`); the log lines they become are the supervisor's
//! (`channel.rs`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::super::store_link::News;
use super::journal::Journal;
use super::peers::Peers;
use super::{Acted, RemoteStop};
use crate::vocab::companion::{Channel, Kind, Record};

/// What the companion of this attempt has said.
#[derive(Debug, Default)]
pub struct CompanionState {
    /// A companion said hello: requests reach the trainer.
    pub connected: bool,
    /// The newest training step it reported.
    pub step: Option<u64>,
    /// The outstanding request: id, kind, when, acknowledged.
    pending: Option<(u64, Kind, Instant, bool)>,
    /// The last finished save: step, seconds after its request, paths.
    pub done: Option<Saved>,
    /// The job's ranks in all, and on this node, as the companion says.
    pub world: Option<(u32, u32)>,
    /// A companion that speaks another protocol said hello: nothing it
    /// writes is read, and stops signal as without a companion.
    foreign: bool,
}

impl CompanionState {
    /// The job has ranks on other nodes: holding this node's ranks would
    /// stall every node in its next collective.
    pub fn spans_nodes(&self) -> bool {
        self.world.is_some_and(|(all, here)| all > here)
    }

    /// The kind of the request still outstanding, if one is.
    pub fn pending_kind(&self) -> Option<Kind> {
        self.pending.map(|p| p.1)
    }

    /// The companion acknowledged the request `id`, and is still on it.
    pub fn acked(&self, id: u64) -> bool {
        self.pending.is_some_and(|p| p.0 == id && p.3)
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
    /// Why oomguard did not count a save the companion called done.
    pub not_counted: Option<String>,
}

/// The companion of this attempt: the channel to it and what it said.
#[derive(Debug, Default)]
pub struct Companion {
    /// This attempt's control channel (`run`, unless `--no-companion`).
    channel: Option<Channel>,
    state: CompanionState,
    /// What the deciding tick saw (headroom under which ceiling), for the
    /// request's `detail`.
    detail: Option<String>,
    /// The rank behind the fastest-growing process at the deciding tick.
    cause_rank: Option<u32>,
    /// Another node's request the ranks agreed on: the stop this node
    /// joins (its id, and who asked and why).
    remote_stop: Option<RemoteStop>,
}

impl Companion {
    pub fn state(&self) -> &CompanionState {
        &self.state
    }

    #[cfg(test)]
    pub fn state_mut(&mut self) -> &mut CompanionState {
        &mut self.state
    }

    /// Tests stand in for another node's request the ranks agreed on.
    #[cfg(test)]
    pub fn agreed_stop(&mut self, remote: RemoteStop) {
        self.remote_stop = Some(remote);
    }

    /// The job has ranks on other nodes (see [`CompanionState::spans_nodes`]).
    pub fn spans_nodes(&self) -> bool {
        self.state.spans_nodes()
    }

    /// A request can go to a companion that said hello on this channel.
    pub fn can_ask(&self) -> bool {
        self.state.connected && self.channel.is_some()
    }

    /// This attempt's control channel changes (one that could not be read
    /// is dropped, a new one replaces it).
    pub fn set_channel(&mut self, channel: Option<Channel>) {
        self.channel = channel;
    }

    pub fn channel_mut(&mut self) -> Option<&mut Channel> {
        self.channel.as_mut()
    }

    /// A new attempt: its companion has said nothing yet (the channel is
    /// the attempt's, set apart).
    pub fn reset(&mut self) {
        self.state = CompanionState::default();
        self.remote_stop = None;
    }

    /// What the deciding tick saw, for the request's `detail`, and the rank
    /// behind the fastest-growing process.
    pub fn note_cause(&mut self, detail: Option<String>, cause_rank: Option<u32>) {
        self.detail = detail;
        self.cause_rank = cause_rank;
    }

    /// Another node's stop to join, taken once.
    pub fn take_remote_stop(&mut self) -> Option<RemoteStop> {
        self.remote_stop.take()
    }

    /// Another node's stop whose save this node's ranks made (the request,
    /// the save and the exit may all fall between two ticks), taken once.
    pub fn take_saved_remote_stop(&mut self) -> Option<RemoteStop> {
        let remote = self.remote_stop.take()?;
        let saved = self.state.done.as_ref().is_some_and(|d| d.id == remote.id);
        saved.then_some(remote)
    }

    /// Reads what the companion appended since the last tick, and the
    /// store's news that `peers` heard; the other nodes' faults go to
    /// `peers`.
    pub fn poll(&mut self, now: Instant, peers: &mut Peers, out: &mut Journal, stopping: bool) {
        let Some(ch) = self.channel.as_mut() else {
            return;
        };
        let mut records = ch.poll();
        let news = peers.link_news();
        // Rank 0 said it ends normally (its process serves the store): the
        // store's going that follows is no news either.
        let closing = peers.store_closing()
            || news.iter().any(|n| {
                matches!(n, News::Heard(Record::Fault { reason: Some(r), .. })
                    if r == crate::vocab::companion::STORE_CLOSING)
            });
        // The other nodes' faults, and the store's news, as the companion
        // said them before oomguard carried faults itself.
        for news in news {
            match news {
                News::Heard(r) => records.push(r),
                News::CannotTell(why) => {
                    out.say(format!("cannot tell the other nodes: {why}"));
                }
                News::Unsteady(..) if stopping || closing => {}
                News::Unsteady(addr, reason, within) => {
                    out.say(format!(
                        "the job's store at {addr}: {reason}; trying again for up to {within} s"
                    ));
                    records.push(Record::StoreUnsteady {
                        addr: Some(addr),
                        reason,
                    });
                }
            }
        }
        for r in records {
            if self.state.foreign {
                continue;
            }
            if let Some(why) = foreign(&r) {
                self.state.foreign = true;
                self.state.connected = false;
                out.say(why);
                out.push(Acted::Companion(r));
                continue;
            }
            peers.note(&r, now);
            self.take_in(&r, now);
            out.push(Acted::Companion(r));
        }
    }

    /// One record of a companion that speaks this oomguard's protocol.
    fn take_in(&mut self, r: &Record, now: Instant) {
        let c = &mut self.state;
        match r {
            Record::Hello {
                world,
                local_world,
                task,
                ..
            } => {
                c.connected = true;
                // With one oomguard per rank (a SLURM task each), every
                // other rank is another oomguard's, on this node or not.
                let here = if task.is_some() {
                    Some(1)
                } else {
                    *local_world
                };
                if let Some(w) = *world {
                    c.world = Some((w, here.unwrap_or(w)));
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
                not_counted,
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
                        not_counted: not_counted.clone(),
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
            | Record::StoreUnsteady { .. }
            | Record::Crash { .. }
            | Record::Bye { .. } => {}
        }
    }

    /// Writes a request to the companion, when one is listening, to be
    /// served within `wait`; `restart`: the stop ends in a restart of the
    /// whole job (the other nodes restart with it). `None`: no companion
    /// (or the file could not be written: said).
    pub fn ask(
        &mut self,
        (kind, reason): (Kind, &str),
        restart: bool,
        wait: Duration,
        now: Instant,
        out: &mut Journal,
    ) -> Option<u64> {
        if !self.state.connected {
            return None;
        }
        let ch = self.channel.as_mut()?;
        let cause = self.cause_rank;
        match ch.request_then(kind, reason, self.detail.as_deref(), wait, restart, cause) {
            Ok(id) => {
                self.state.pending = Some((id, kind, now, false));
                out.push(Acted::Requested {
                    id,
                    kind,
                    reason: reason.to_string(),
                });
                Some(id)
            }
            Err(e) => {
                out.say(format!("cannot ask the companion for a checkpoint: {e}"));
                None
            }
        }
    }
}

/// What to say of a hello in another protocol than this oomguard's, whose
/// companion is not read from then on.
fn foreign(r: &Record) -> Option<String> {
    let Record::Hello {
        v: Some(v),
        version,
        path,
        ..
    } = r
    else {
        return None;
    };
    (*v != crate::vocab::companion::PROTOCOL).then(|| {
        format!(
            "the companion in the job ({}, version {}) speaks protocol {v}, this oomguard {}: \
             its records are not read, and a stop signals the trainer instead of asking it \
             (install the oomguard that matches, or remove the other from the job's environment)",
            path.as_deref().unwrap_or("?"),
            version.as_deref().unwrap_or("?"),
            crate::vocab::companion::PROTOCOL
        )
    })
}
