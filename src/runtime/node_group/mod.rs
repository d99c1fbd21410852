//! The oomguards of one node, when SLURM started each rank as a task of its
//! own (`srun --ntasks-per-node=N python train.py`): one oomguard per rank,
//! several per node, and the node's memory is one ceiling. They pool what
//! they measure and make one decision per node:
//!
//! - The first oomguard of the node (for a job step) **leads**; the others
//!   **join** it. Each member sends its rank's footprint every tick; the
//!   leader adds the others' to its own where `--budget` is the ceiling
//!   (the node's budget; a SLURM job cgroup already counts every task), and
//!   it alone acts on a critical rule. Its stop names the task whose
//!   memory grew the most over the last [`GROWTH_WINDOW`].
//! - A member defers its own critical actions to the leader while it hears
//!   it. The leader's stop reaches every rank through the companion's vote
//!   (each member's oomguard then joins it as another's request); a leader
//!   whose rank has no companion tells the members to stop themselves.
//! - A leader that goes away (its rank ended) is replaced: the first member
//!   to notice leads.
//!
//! They meet on a Unix socket in the abstract namespace (nothing on disk,
//! so nothing to leave behind or to plant): `oomguard/<uid>/<job>.<step>/
//! node<N>`. Anyone could bind that name first, so both ends check the
//! other's user (`SO_PEERCRED`) and refuse a stranger; the group then
//! falls back to each deciding alone, and says so.

mod part;
mod wire;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use wire::{Conn, Message};

use crate::engine::policy::Action;
use crate::vocab::units::HumanBytes;

/// How far back a task's growth is measured when the leader names the
/// task behind a stop.
pub const GROWTH_WINDOW: Duration = Duration::from_secs(10);
/// A member not heard from for this long no longer counts.
const STALE: Duration = Duration::from_secs(5);
/// A leader no other task joined in this long says so (the tasks may not
/// share a network namespace, where the abstract socket lives).
const LONELY: Duration = Duration::from_secs(30);

/// Where this oomguard sits in its job step, from SLURM's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub job: String,
    pub step: String,
    pub node: u32,
    pub task: u32,
    /// How many tasks the step runs on this node.
    pub node_tasks: u32,
}

impl Place {
    /// From SLURM's step variables, read through `var`; `None` unless this
    /// node runs two tasks or more of the step.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<Place> {
        let number = |name: &str| var(name)?.trim().parse::<u32>().ok();
        let node = number("SLURM_NODEID").unwrap_or(0);
        let spec = var("SLURM_STEP_TASKS_PER_NODE").or_else(|| var("SLURM_TASKS_PER_NODE"));
        let node_tasks = spec
            .and_then(|s| tasks_on(&s, node))
            .or_else(|| number("SLURM_NTASKS_PER_NODE"))?;
        (node_tasks > 1).then_some(())?;
        Some(Place {
            job: var("SLURM_JOB_ID").filter(|j| !j.is_empty())?,
            step: var("SLURM_STEP_ID").unwrap_or_else(|| "batch".into()),
            node,
            task: number("SLURM_PROCID")?,
            node_tasks,
        })
    }

    /// The socket's name in the abstract namespace.
    fn name(&self, uid: u32) -> String {
        format!(
            "oomguard/{uid}/{}.{}/node{}",
            self.job, self.step, self.node
        )
    }
}

/// Node `node`'s entry of SLURM's compressed task list: `2(x3),1` is 2, 2,
/// 2, 1.
fn tasks_on(spec: &str, node: u32) -> Option<u32> {
    let mut seen = 0u32;
    for part in spec.split(',') {
        let (n, times) = match part.split_once("(x") {
            Some((n, rest)) => (n, rest.trim_end_matches(')').parse::<u32>().ok()?),
            None => (part, 1),
        };
        let n = n.trim().parse::<u32>().ok()?;
        seen = seen.checked_add(times)?;
        if node < seen {
            return Some(n);
        }
    }
    None
}

/// What a tick hands the group: this oomguard's rank and its tree's
/// footprint now.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    pub rank: u32,
    pub footprint_bytes: u64,
}

/// A stop the leader decided for the node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStop {
    /// `node 0 (rank 1): critical-headroom: …`.
    pub why: String,
    /// Whether it went to the ranks through the companion's vote (then a
    /// member joins the vote's request instead of stopping itself).
    pub voted: bool,
}

/// What the group tells the tick.
#[derive(Debug, Default)]
pub struct Heard {
    /// The footprint of the node's other tasks (the leader's view; 0 for a
    /// member).
    pub others_bytes: u64,
    /// A leader is heard: this oomguard's critical actions are its to take.
    pub defer_to: Option<u32>,
    /// The leader's stop, once.
    pub stop: Option<NodeStop>,
    /// Words for the user, once each.
    pub said: Vec<String>,
}

/// This oomguard's part in its node's decisions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum NodeRole {
    /// The only oomguard of its node, or one that decides for itself.
    #[default]
    Alone,
    /// Another task's oomguard decides for the node.
    Defer,
    /// Decides for the node; the task that grew the most, if any did.
    Lead(Option<Grower>),
}

impl NodeRole {
    /// What this oomguard does with a decided `action` and its `reason`:
    /// `None` when it is the node leader's to take (all but `warn` and
    /// `relieve`, for a member: the leader's stop reaches this rank through
    /// the vote); else the reason, which names the task that grew the most
    /// when this oomguard decides for the node, and that task.
    pub fn take(self, action: Action, reason: String) -> Option<(String, Option<Grower>)> {
        match self {
            NodeRole::Defer if !matches!(action, Action::Warn | Action::Relieve) => None,
            NodeRole::Lead(Some(g)) if action.is_critical() || action == Action::Checkpoint => {
                Some((
                    format!(
                        "{reason}; rank {} (task {}) grew the most on this node ({} in the last {} s)",
                        g.rank,
                        g.task,
                        HumanBytes(g.grew_bytes),
                        GROWTH_WINDOW.as_secs()
                    ),
                    Some(g),
                ))
            }
            _ => Some((reason, None)),
        }
    }
}

/// The node's task whose memory grew the most lately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grower {
    pub task: u32,
    pub rank: u32,
    pub grew_bytes: u64,
}

/// One oomguard's end of its node's group.
#[derive(Debug)]
pub struct NodeGroup {
    place: Place,
    uid: u32,
    role: Role,
    /// Footprints by task (this one's too), oldest first, for the growth.
    history: HashMap<u32, (u32, VecDeque<(Instant, u64)>)>,
    /// Said once: a stranger on the socket, a group that could not form.
    warned: bool,
}

#[derive(Debug)]
enum Role {
    Leader {
        listener: std::os::unix::net::UnixListener,
        members: Vec<(Conn, Option<u32>)>,
        /// Each member's last report: (when, rank, footprint).
        last: HashMap<u32, (Instant, u32, u64)>,
        /// When it began to lead, until a member joins.
        alone_since: Option<Instant>,
    },
    Member {
        conn: Conn,
        leader: Option<u32>,
    },
    /// Neither (yet): tried again each tick.
    Apart,
}

impl NodeGroup {
    /// This oomguard's end, for `place`; leads or joins at the first tick.
    pub fn new(place: Place) -> Self {
        NodeGroup {
            place,
            uid: rustix::process::geteuid().as_raw(),
            role: Role::Apart,
            history: HashMap::new(),
            warned: false,
        }
    }

    pub fn place(&self) -> &Place {
        &self.place
    }

    /// Whether this oomguard leads its node now.
    pub fn leads(&self) -> bool {
        matches!(self.role, Role::Leader { .. })
    }

    /// One tick's exchange: sends `mine`, takes in what the others sent.
    pub fn exchange(&mut self, mine: Report, now: Instant) -> Heard {
        let mut heard = Heard::default();
        if matches!(self.role, Role::Apart) {
            self.form(&mut heard);
        }
        self.remember(self.place.task, mine.rank, mine.footprint_bytes, now);
        let task = self.place.task;
        let mut lost_leader = None;
        match &mut self.role {
            Role::Leader {
                listener,
                members,
                last,
                alone_since,
            } => {
                admit(
                    listener,
                    members,
                    (self.uid, task),
                    &mut heard,
                    &mut self.warned,
                );
                let since = *alone_since.get_or_insert(now);
                if !members.is_empty() {
                    *alone_since = None;
                } else if now.duration_since(since) >= LONELY && !self.warned {
                    self.warned = true;
                    heard.said.push(format!(
                        "no other task of node {} joined task {task}'s oomguard in {} s (tasks in \
                         other network namespaces cannot meet): each decides for itself",
                        self.place.node,
                        LONELY.as_secs()
                    ));
                }
                let mut reports = Vec::new();
                members.retain_mut(|(conn, from)| {
                    let (messages, open) = conn.receive();
                    for m in messages {
                        if let Message::Report {
                            task,
                            rank,
                            footprint,
                        } = m
                        {
                            *from = Some(task);
                            reports.push((task, rank, footprint));
                        }
                    }
                    open
                });
                for (t, rank, footprint) in reports {
                    last.insert(t, (now, rank, footprint));
                }
                last.retain(|_, (at, _, _)| now.duration_since(*at) < STALE);
                heard.others_bytes = last.values().map(|(_, _, f)| *f).sum();
                let fresh: Vec<(u32, u32, u64)> =
                    last.iter().map(|(t, (_, r, f))| (*t, *r, *f)).collect();
                for (t, r, f) in fresh {
                    self.remember(t, r, f, now);
                }
            }
            Role::Member { conn, leader } => {
                conn.send(&Message::Report {
                    task,
                    rank: mine.rank,
                    footprint: mine.footprint_bytes,
                });
                let (messages, open) = conn.receive();
                for m in messages {
                    match m {
                        Message::Hello { task } => *leader = Some(task),
                        Message::Stop { why, voted } => heard.stop = Some(NodeStop { why, voted }),
                        Message::Report { .. } => {}
                    }
                }
                if open {
                    heard.defer_to = Some(leader.unwrap_or(0));
                } else {
                    lost_leader = Some(*leader);
                }
            }
            Role::Apart => {}
        }
        if let Some(was) = lost_leader {
            let who = was.map_or_else(
                || "the node's leader".to_string(),
                |t| format!("task {t}'s oomguard"),
            );
            heard.said.push(format!(
                "{who}, which decided for this node's tasks, is gone; task {task}'s decides for itself until another leads"
            ));
            self.role = Role::Apart;
        }
        heard
    }

    /// Tells the members of the leader's stop (a no-op for a member).
    pub fn tell_stop(&mut self, stop: &NodeStop) {
        if let Role::Leader { members, .. } = &mut self.role {
            for (conn, _) in members.iter_mut() {
                conn.send(&Message::Stop {
                    why: stop.why.clone(),
                    voted: stop.voted,
                });
            }
        }
    }

    /// The task whose footprint grew the most over [`GROWTH_WINDOW`], if
    /// any grew.
    pub fn grower(&self) -> Option<Grower> {
        self.history
            .iter()
            .filter_map(|(task, (rank, points))| {
                let (first, last) = (points.front()?, points.back()?);
                let grew = last.1.saturating_sub(first.1);
                (grew > 0).then_some(Grower {
                    task: *task,
                    rank: *rank,
                    grew_bytes: grew,
                })
            })
            .max_by_key(|g| (g.grew_bytes, std::cmp::Reverse(g.task)))
    }

    fn remember(&mut self, task: u32, rank: u32, footprint: u64, now: Instant) {
        let (r, points) = self.history.entry(task).or_default();
        *r = rank;
        points.push_back((now, footprint));
        while points
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > GROWTH_WINDOW)
        {
            points.pop_front();
        }
    }

    /// Leads (binds the node's name) or joins (connects to it).
    fn form(&mut self, heard: &mut Heard) {
        let name = self.place.name(self.uid);
        match wire::listen(&name) {
            Ok(listener) => {
                heard.said.push(format!(
                    "task {}'s oomguard decides for the {} tasks of node {} (one view of the node's memory, one decision)",
                    self.place.task, self.place.node_tasks, self.place.node
                ));
                self.role = Role::Leader {
                    listener,
                    members: Vec::new(),
                    last: HashMap::new(),
                    alone_since: None,
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                match wire::connect(&name, self.uid) {
                    Ok(conn) => self.role = Role::Member { conn, leader: None },
                    Err(e) => self.cannot(heard, &e),
                }
            }
            Err(e) => self.cannot(heard, &e),
        }
    }

    fn cannot(&mut self, heard: &mut Heard, e: &std::io::Error) {
        if !self.warned && e.kind() != std::io::ErrorKind::ConnectionRefused {
            self.warned = true;
            heard.said.push(format!(
                "the tasks of node {} cannot pool their measurements ({e}); each decides for itself",
                self.place.node
            ));
        }
    }
}

/// Takes in the members that connected since the last tick: ours only.
fn admit(
    listener: &std::os::unix::net::UnixListener,
    members: &mut Vec<(Conn, Option<u32>)>,
    (uid, task): (u32, u32),
    heard: &mut Heard,
    warned: &mut bool,
) {
    while let Ok((stream, _)) = listener.accept() {
        match Conn::checked(stream, uid) {
            Ok(mut conn) => {
                conn.send(&Message::Hello { task });
                members.push((conn, None));
            }
            Err(e) => {
                if !*warned {
                    *warned = true;
                    heard
                        .said
                        .push(format!("refused a connection to this node's group: {e}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
