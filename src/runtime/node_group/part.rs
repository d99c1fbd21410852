//! The loop's side of the node group: each tick's exchange, a member's
//! stop on the leader's word, and the leader's word to the members.

use std::time::Instant;

use super::{NodeRole, NodeStop, Report};
use crate::engine::policy::Action;
use crate::runtime::Supervisor;
use crate::vocab::model::Sample;

impl Supervisor {
    /// Sends this tick's footprint to the node's group and takes in the
    /// others': the leader counts theirs against `--budget`; a member
    /// defers, and stops on the leader's word when no vote carries it.
    pub(in crate::runtime) fn node_exchange(
        &mut self,
        sample: &mut Sample,
        now: Instant,
    ) -> NodeRole {
        // A stop under way, or a job that ended, has nothing left to pool
        // (and the leader's going is no news then).
        if self.core.act().stop().is_some() || self.child.status().is_some() {
            return NodeRole::Alone;
        }
        let Some(group) = self.node.as_mut() else {
            return NodeRole::Alone;
        };
        let mine = Report {
            rank: group.place().task,
            footprint_bytes: sample.tree.footprint_bytes,
        };
        let heard = group.exchange(mine, now);
        let role = if group.leads() {
            sample.others_bytes = heard.others_bytes;
            NodeRole::Lead(group.grower())
        } else if heard.defer_to.is_some() {
            NodeRole::Defer
        } else {
            NodeRole::Alone
        };
        if !self.cfg.quiet {
            for s in heard.said {
                self.say(s);
            }
        }
        if let Some(stop) = heard.stop.filter(|s| !s.voted)
            && self.core.act().stop().is_none()
            && self.child.status().is_none()
        {
            if !self.cfg.quiet {
                self.say(format!("{}; this task's rank stops with it", stop.why));
            }
            let (tree, pid) = (self.sampler.tree().to_vec(), self.child.pid());
            self.core.begin_stop(
                (Action::Stop, &stop.why),
                &tree,
                pid,
                now,
                self.child.sig_mut(),
            );
        }
        role
    }

    /// The leader's stop, begun this tick, told to the members: they join
    /// the companion's vote, or stop themselves when there is none.
    pub(in crate::runtime) fn node_decided(&mut self, was_stopping: bool, role: NodeRole) {
        let NodeRole::Lead(grower) = role else {
            return;
        };
        if was_stopping || self.core.act().stop().is_none() {
            return;
        }
        let Some(group) = self.node.as_mut() else {
            return;
        };
        let place = group.place().clone();
        let rank = grower.map_or(place.task, |g| g.rank);
        let reason = self.core.act().policy_reason().unwrap_or("a stop");
        let stop = NodeStop {
            why: format!("node {} (rank {rank}): {reason}", place.node),
            voted: self.core.act().companion().connected,
        };
        group.tell_stop(&stop);
    }
}
