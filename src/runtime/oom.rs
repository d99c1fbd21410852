//! The kernel's OOM kills, explained: the last minute of every tree
//! process's memory (and where it sat in the tree), the OOM-kill counters
//! of the job's cgroup and of the machine, and, when one rises, the
//! kernel's own report of the kill matched to a process of ours; and the
//! supervisor's side of it: checking the counters and logging each kill.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use super::act::Ident;
use crate::vocab::forensics::kernel::OomKill;
use crate::vocab::model::{Role, Sample};

/// How much of a process's memory history an `oom_kill` event carries.
const RECENT_WINDOW: f64 = 60.0;

/// What oomguard remembers of a process for explaining its death.
#[derive(Debug, Clone)]
struct Recent {
    comm: String,
    role: Role,
    /// e.g. "worker 3 of trainer 1234".
    place: String,
    last_seen: f64,
    /// (t, RSS, PSS) over the last minute.
    points: VecDeque<(f64, u64, u64)>,
}

/// A kill the kernel made, matched to a process of the tree.
#[derive(Debug, Clone)]
pub struct Explained {
    pub kill: OomKill,
    pub comm: String,
    pub role: Role,
    pub place: String,
    /// (t, RSS, PSS) over the process's last minute.
    pub memory: Vec<(f64, u64, u64)>,
}

/// A process the kernel's kill is attributed to without its report.
#[derive(Debug, Clone)]
pub struct Victim {
    pub pid: u32,
    pub comm: String,
    pub role: Role,
    pub place: String,
    /// RSS at its last reading.
    pub rss_bytes: Option<u64>,
    /// (t, RSS, PSS) over the process's last minute.
    pub memory: Vec<(f64, u64, u64)>,
}

/// What a rise of an OOM-kill counter turned out to be.
#[derive(Debug, Clone)]
pub enum Finding {
    Kill(Box<Explained>),
    /// No kernel report could be read (a normal user under
    /// `dmesg_restrict`): the victim attributed from what anyone can read —
    /// the counter rose as this process of the tree vanished, the largest
    /// of those that did. `why`: what could not be read.
    Attributed {
        victim: Box<Victim>,
        why: String,
    },
    /// The counter rose but no report names a process of ours: why.
    Unexplained(String),
}

/// How long after a counter rose its victim may still be on its way out
/// (the kill is counted before the process is gone).
const VANISH_WAIT: f64 = 2.0;

#[derive(Debug, Default)]
pub struct OomWatch {
    recent: HashMap<Ident, Recent>,
    /// The counters last seen (job cgroup, machine).
    seen: (Option<u64>, Option<u64>),
    /// The counters when the attempt started.
    at_start: (Option<u64>, Option<u64>),
    /// Kills already reported.
    reported: HashSet<u32>,
    /// A rise no report explained, waiting for its victim to vanish:
    /// (when it was seen, why no report named it).
    pending: Option<(f64, String)>,
}

impl OomWatch {
    /// A new attempt: kills are counted from these counter values (job
    /// cgroup, machine).
    pub fn start_attempt(&mut self, cgroup: Option<u64>, machine: Option<u64>) {
        self.at_start = (cgroup, machine);
    }

    /// Whether the OOM killer struck during this attempt, by the counters
    /// last seen (the tree's cgroup's, or without one the machine's): a
    /// worker's SIGKILL then came from the kernel, even where its log
    /// cannot be read to name the victim.
    pub fn struck_this_attempt(&self) -> bool {
        rose_since(self.seen, self.at_start)
    }

    /// Whether the kernel killed this pid (and it was reported).
    pub fn reported(&self, pid: u32) -> bool {
        self.reported.contains(&pid)
    }

    /// Keeps the last minute of each process's memory and where it sits in
    /// the tree.
    pub fn remember(&mut self, sample: &Sample) {
        let t = sample.t;
        for p in &sample.procs {
            let place = match p.role {
                Role::Worker => {
                    let mut siblings: Vec<u32> = sample
                        .procs
                        .iter()
                        .filter(|q| q.role == Role::Worker && q.ppid == p.ppid)
                        .map(|q| q.pid)
                        .collect();
                    siblings.sort_unstable();
                    let n = siblings.iter().position(|&q| q == p.pid).unwrap_or(0) + 1;
                    format!(
                        "worker {n} of {} (pid {})",
                        if sample
                            .procs
                            .iter()
                            .any(|q| q.pid == p.ppid && q.role == Role::Trainer)
                        {
                            "the trainer"
                        } else {
                            "process"
                        },
                        p.ppid
                    )
                }
                r => r.as_str().to_string(),
            };
            let e = self
                .recent
                .entry((p.pid, p.start_time))
                .or_insert_with(|| Recent {
                    comm: p.comm.clone(),
                    role: p.role,
                    place: place.clone(),
                    last_seen: t,
                    points: Default::default(),
                });
            e.comm.clone_from(&p.comm);
            e.role = p.role;
            e.place = place;
            e.last_seen = t;
            e.points.push_back((t, p.rss_bytes, p.pss_bytes));
            while e
                .points
                .front()
                .is_some_and(|&(pt, _, _)| t - pt > RECENT_WINDOW)
            {
                e.points.pop_front();
            }
        }
        self.recent
            .retain(|_, e| t - e.last_seen <= 2.0 * RECENT_WINDOW);
    }

    /// Whether an OOM-kill counter rose since the last sample: the job
    /// cgroup's, or without a cgroup the machine's ("someone").
    pub fn counter_rose(&mut self, sample: &Sample) -> bool {
        let (cg, vm) = counters(sample);
        let (seen_cg, seen_vm) = self.seen;
        self.seen = (cg, vm);
        match (cg, seen_cg) {
            (Some(now), Some(before)) => now > before,
            (None, _) => vm.zip(seen_vm).is_some_and(|(n, b)| n > b),
            _ => false,
        }
    }

    /// Reads the kernel's recent reports and matches them to processes
    /// seen in the tree; each kill is reported once. When none can be read
    /// or none names ours, the victim is looked for among the processes
    /// that vanished from `sample` (now and for [`VANISH_WAIT`] after, by
    /// [`OomWatch::follow_up`]).
    pub fn explain(&mut self, sample: &Sample) -> Vec<Finding> {
        let log = crate::vocab::forensics::kmsg::read_kernel_log(Some(Duration::from_secs(300)));
        let kills = match &log {
            Ok(l) => crate::vocab::forensics::kernel::parse(&l.text),
            Err(_) => Vec::new(),
        };
        let found = self.match_kills(kills);
        if !found.is_empty() {
            return found;
        }
        let why = match &log {
            Ok(_) => "no matching report in the kernel log".to_string(),
            Err(e) => format!("the kernel log could not be read ({e})"),
        };
        self.pending = Some((sample.t, why));
        self.follow_up(sample).into_iter().collect()
    }

    /// A rise still unexplained: its victim, once it has vanished from
    /// the tree; `Unexplained` when none did within [`VANISH_WAIT`].
    pub fn follow_up(&mut self, sample: &Sample) -> Option<Finding> {
        let (since, why) = self.pending.clone()?;
        let alive: HashSet<Ident> = sample.procs.iter().map(|p| (p.pid, p.start_time)).collect();
        // Vanished since the rise's last reading: seen on a sample shortly
        // before it, absent now; the OOM killer takes the largest.
        let victim = self
            .recent
            .iter()
            .filter(|(id, who)| {
                !alive.contains(id)
                    && !self.reported.contains(&id.0)
                    && since - who.last_seen <= VANISH_WAIT
                    && who.last_seen < sample.t
            })
            .max_by_key(|(_, who)| who.points.back().map_or(0, |p| p.1));
        if let Some((&(pid, _), who)) = victim {
            self.pending = None;
            self.reported.insert(pid);
            return Some(Finding::Attributed {
                victim: Box::new(Victim {
                    pid,
                    comm: who.comm.clone(),
                    role: who.role,
                    place: who.place.clone(),
                    rss_bytes: who.points.back().map(|p| p.1),
                    memory: who.points.iter().copied().collect(),
                }),
                why,
            });
        }
        if sample.t - since > VANISH_WAIT {
            self.pending = None;
            return Some(Finding::Unexplained(why));
        }
        None
    }

    /// The newest report first; only processes of the tree, each once.
    fn match_kills(&mut self, kills: Vec<OomKill>) -> Vec<Finding> {
        let mut found = Vec::new();
        for kill in kills.into_iter().rev() {
            if self.reported.contains(&kill.pid) {
                continue;
            }
            let Some((_, who)) = self.recent.iter().find(|((pid, _), _)| *pid == kill.pid) else {
                continue;
            };
            self.reported.insert(kill.pid);
            // The kernel's name is the one at the kill: the last sample
            // may predate an exec (a launcher that became the trainer).
            let comm = if kill.comm.is_empty() {
                who.comm.clone()
            } else {
                kill.comm.clone()
            };
            found.push(Finding::Kill(Box::new(Explained {
                comm,
                role: who.role,
                place: who.place.clone(),
                memory: who.points.iter().copied().collect(),
                kill,
            })));
        }
        found
    }

    /// Whether the kernel OOM killer took a process of the job during this
    /// attempt (the job cgroup's counter; with no cgroup to ask, the
    /// machine-wide counter is the best hint).
    pub fn kernel_killed(&self, sample: &Sample) -> bool {
        rose_since(counters(sample), self.at_start)
    }
}

/// A sample's OOM-kill counters: (job cgroup, machine).
fn counters(sample: &Sample) -> (Option<u64>, Option<u64>) {
    (
        sample.cgroup.as_ref().and_then(|c| c.oom_kill_count),
        sample.system.oom_kill_total,
    )
}

/// Whether the counters rose since `before`: the job cgroup's when both
/// readings have it, otherwise the machine's.
fn rose_since(now: (Option<u64>, Option<u64>), before: (Option<u64>, Option<u64>)) -> bool {
    match (now.0, before.0) {
        (Some(n), Some(b)) => n > b,
        _ => now.1.zip(before.1).is_some_and(|(n, b)| n > b),
    }
}

/// The supervisor's side: kills found in the counters, attributed and logged.
impl super::Supervisor {
    /// When an OOM-kill counter rises, finds the kernel's report of the kill
    /// (by pid, among the processes oomguard has seen in the tree) and
    /// writes an `oom_kill` event.
    pub(super) fn check_oom_kills(&mut self, sample: &Sample) {
        let findings = if self.oom.counter_rose(sample) {
            self.oom.explain(sample)
        } else {
            self.oom.follow_up(sample).into_iter().collect()
        };
        for finding in findings {
            self.write_oom_kill(sample.t, finding);
        }
    }

    /// An `oom_kill` the kernel's report could not name: the victim from
    /// the counter and the tree, and what could not be read.
    pub(super) fn write_attributed_kill(&mut self, t: f64, v: &Victim, why: String) {
        let rss = v.rss_bytes.map_or(String::new(), |b| {
            format!(
                ", RSS {} at its last reading",
                crate::vocab::units::HumanBytes(b)
            )
        });
        let reason = format!(
            "{why}: attributed from the OOM-kill counter and the tree (pid {} vanished as the counter rose, the largest that did{rss}); the kernel's own report (its choice of victim, oom_score_adj, constraint) is not known",
            v.pid
        );
        let event = crate::sinks::log::OomKillEvent {
            pid: Some(v.pid),
            comm: Some(v.comm.clone()),
            role: Some(v.role.as_str().to_string()),
            place: Some(v.place.clone()),
            anon_rss_bytes: None,
            memory: super::memory_points(&v.memory),
            reason: Some(reason),
            ..crate::sinks::log::OomKillEvent::default()
        };
        self.sinks
            .emit_at(t, &crate::sinks::log::Event::OomKill(Box::new(event)));
        self.tell_peers_of_kill(v.pid, &v.comm);
        if !self.cfg.quiet {
            self.say(format!(
                "the kernel OOM killer killed {} (pid {}, {}), by the OOM-kill counter and the process list ({why})",
                v.comm, v.pid, v.place
            ));
        }
    }

    /// A job across nodes: the other nodes learn of the kill (peers.rs).
    fn tell_peers_of_kill(&mut self, pid: u32, comm: &str) {
        let restart = self.restart_enabled() && self.target.restarts();
        self.core
            .act_mut()
            .raise_kill(pid, comm, restart, crate::vocab::clock::now());
        self.acted(None);
    }

    pub(super) fn write_oom_kill(&mut self, t: f64, finding: Finding) {
        let e = match finding {
            Finding::Kill(e) => e,
            Finding::Unexplained(why) => {
                let event = crate::sinks::log::OomKillEvent {
                    reason: Some(why),
                    ..crate::sinks::log::OomKillEvent::default()
                };
                self.sinks
                    .emit_at(t, &crate::sinks::log::Event::OomKill(Box::new(event)));
                return;
            }
            Finding::Attributed { victim, why } => {
                self.write_attributed_kill(t, &victim, why);
                return;
            }
        };
        let event = crate::sinks::log::OomKillEvent {
            pid: Some(e.kill.pid),
            comm: Some(e.comm.clone()),
            role: Some(e.role.as_str().to_string()),
            place: Some(e.place.clone()),
            anon_rss_bytes: e.kill.anon_rss_bytes,
            constraint: e.kill.constraint.clone(),
            cgroup: e.kill.cgroup.clone(),
            kill: Some(e.kill.clone()),
            memory: super::memory_points(&e.memory),
            reason: None,
        };
        self.sinks
            .emit_at(t, &crate::sinks::log::Event::OomKill(Box::new(event)));
        self.tell_peers_of_kill(e.kill.pid, &e.comm);
        if !self.cfg.quiet {
            self.say(format!(
                "the kernel OOM killer killed {} (pid {}, {}){}",
                e.comm,
                e.kill.pid,
                e.place,
                e.kill.anon_rss_bytes.map_or(String::new(), |b| format!(
                    " holding {} anonymous memory",
                    crate::vocab::units::HumanBytes(b)
                ))
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::model::ProcSample;
    use crate::vocab::model::testing::budget_sample;

    const MIB: u64 = 1 << 20;

    fn proc(pid: u32, ppid: u32, role: Role, rss: u64) -> ProcSample {
        ProcSample {
            ppid,
            ..crate::vocab::model::testing::proc_sample(pid, role, rss)
        }
    }

    fn sample(t: f64, procs: Vec<ProcSample>) -> Sample {
        let mut s = budget_sample(t, 0);
        s.procs = procs;
        s
    }

    fn watched() -> OomWatch {
        let mut w = OomWatch::default();
        w.remember(&sample(
            1.0,
            vec![
                proc(10, 1, Role::Trainer, 100 * MIB),
                proc(11, 10, Role::Worker, 500 * MIB),
                proc(12, 10, Role::Worker, 50 * MIB),
            ],
        ));
        w
    }

    #[test]
    fn without_the_kernel_log_the_largest_process_that_vanished_is_the_victim() {
        let mut w = watched();
        w.pending = Some((1.5, "the kernel log could not be read".into()));
        // Still dying at the rise: nothing yet.
        let all = vec![
            proc(10, 1, Role::Trainer, 100 * MIB),
            proc(11, 10, Role::Worker, 500 * MIB),
            proc(12, 10, Role::Worker, 50 * MIB),
        ];
        assert!(w.follow_up(&sample(1.5, all)).is_none());
        let after = vec![proc(10, 1, Role::Trainer, 100 * MIB)];
        match w.follow_up(&sample(1.6, after)) {
            Some(Finding::Attributed { victim, why }) => {
                assert_eq!(victim.pid, 11);
                assert_eq!(victim.rss_bytes, Some(500 * MIB));
                assert_eq!(victim.place, "worker 1 of the trainer (pid 10)");
                assert!(why.contains("could not be read"));
            }
            other => panic!("{other:?}"),
        }
        assert!(w.reported(11));
        assert!(w.follow_up(&sample(1.7, Vec::new())).is_none());
    }

    #[test]
    fn a_rise_whose_victim_never_vanishes_is_unexplained_after_the_wait() {
        let mut w = watched();
        w.pending = Some((1.5, "no matching report in the kernel log".into()));
        let all = || {
            vec![
                proc(10, 1, Role::Trainer, 100 * MIB),
                proc(11, 10, Role::Worker, 500 * MIB),
                proc(12, 10, Role::Worker, 50 * MIB),
            ]
        };
        w.remember(&sample(2.0, all()));
        assert!(w.follow_up(&sample(2.0, all())).is_none());
        w.remember(&sample(4.0, all()));
        match w.follow_up(&sample(4.0, all())) {
            Some(Finding::Unexplained(why)) => assert!(why.contains("no matching report")),
            other => panic!("{other:?}"),
        }
    }
}
