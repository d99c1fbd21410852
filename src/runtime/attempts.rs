//! One attempt after another. [`Attempts`] owns the run's attempts (their
//! number, when the current one started, the restart budget, the newest
//! checkpoint, the environment changes, when the next one starts) and
//! decides, as a function of how an attempt ended and of the time it is
//! given, whether another follows ([`Attempts::plan`]). The supervisor's
//! side below gathers how the attempt ended, announces the restart and
//! relaunches.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{EXIT_INTERNAL, Supervisor, words};
use crate::engine::policy::Action;
use crate::job::restart::{Budget, RestartOn};
use crate::job::supervise::{self, Status};
use crate::vocab::units::human_duration;

/// The least delay before a job that spans nodes is started again (see
/// [`Supervisor::plan_restart`]).
const MULTINODE_SETTLE: Duration = Duration::from_secs(5);

/// What follows an attempt that ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Next {
    /// The run is over: nothing called for a restart, or oomguard is
    /// stopping, or a relaunch already failed.
    Over,
    /// A restart was called for, but `--max-restarts` is reached.
    GaveUp,
    /// The next attempt starts after this delay.
    Restart(Duration),
}

/// The run's attempts.
pub(super) struct Attempts {
    /// 1-based number of the current attempt.
    number: u32,
    started: Instant,
    budget: Budget,
    /// Environment changes for the next attempts (degradation).
    env: BTreeMap<String, String>,
    /// The newest known checkpoint: what the next attempt resumes from.
    checkpoint: Option<PathBuf>,
    /// When the next attempt starts (between attempts).
    relaunch_at: Option<Instant>,
    /// A restart was called for after the budget ran out.
    gave_up: bool,
    /// One line per finished attempt, for the summary.
    lines: Vec<String>,
    /// Restarts so far (never reset, unlike the budget).
    restarts: u32,
    /// A relaunch failed: no more attempts.
    no_more: bool,
}

impl Attempts {
    pub(super) fn new(budget: Budget, now: Instant) -> Self {
        Self {
            number: 1,
            started: now,
            budget,
            env: BTreeMap::new(),
            checkpoint: None,
            relaunch_at: None,
            gave_up: false,
            lines: Vec::new(),
            restarts: 0,
            no_more: false,
        }
    }

    pub(super) fn number(&self) -> u32 {
        self.number
    }

    /// How long the current attempt has run.
    pub(super) fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// Whether this attempt is the last the budget allows.
    pub(super) fn is_last(&self, now: Instant) -> bool {
        !self.budget.allows(self.age(now))
    }

    pub(super) fn checkpoint(&self) -> Option<&Path> {
        self.checkpoint.as_deref()
    }

    /// A checkpoint the job reported as saved and complete.
    pub(super) fn saved(&mut self, path: PathBuf) {
        self.checkpoint = Some(path);
    }

    pub(super) fn restarts(&self) -> u32 {
        self.restarts
    }

    pub(super) fn gave_up(&self) -> bool {
        self.gave_up
    }

    pub(super) fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The summary's line for the current attempt, once.
    pub(super) fn note(&mut self, line: impl FnOnce(u32) -> String) {
        if self.lines.len() < self.number as usize {
            self.lines.push(line(self.number));
        }
    }

    /// Between attempts: the next one is scheduled.
    pub(super) fn between(&self) -> bool {
        self.relaunch_at.is_some()
    }

    pub(super) fn relaunch_at(&self) -> Option<Instant> {
        self.relaunch_at
    }

    pub(super) fn due(&self, now: Instant) -> bool {
        self.relaunch_at.is_some_and(|at| now >= at)
    }

    /// An interrupt or a hangup between attempts: no next attempt.
    pub(super) fn cancel(&mut self) {
        self.relaunch_at = None;
    }

    /// A relaunch failed: the run ends with this attempt.
    pub(super) fn no_more(&mut self) {
        self.no_more = true;
    }

    /// Decides what follows the attempt that ended at `now`. `reason`: why
    /// a restart is called for (`restart::restart_reason`), `None` when
    /// nothing calls for one; `stopping`: oomguard was told to stop;
    /// `newest`: the newest checkpoint on disk, read only when a restart
    /// follows.
    pub(super) fn plan(
        &mut self,
        reason: Option<&str>,
        stopping: bool,
        spans_nodes: bool,
        newest: impl FnOnce() -> Option<PathBuf>,
        now: Instant,
    ) -> Next {
        if reason.is_none() || stopping || self.no_more {
            return Next::Over;
        }
        let Some(delay) = self.budget.next(self.age(now)) else {
            self.gave_up = true;
            return Next::GaveUp;
        };
        // Every node's old launcher must be gone before this node's new one
        // starts: torchrun's c10d backend joins whatever store answers on
        // the rendezvous endpoint, and the old attempt's store (hosted by
        // another node's launcher, still exiting) holds a closed
        // rendezvous. Those launchers leave their exit barrier together,
        // so a few seconds cover them, whatever --restart-delay says.
        let delay = if spans_nodes {
            delay.max(MULTINODE_SETTLE)
        } else {
            delay
        };
        if let Some(p) = newest() {
            self.checkpoint = Some(p);
        }
        self.restarts += 1;
        self.relaunch_at = Some(now + delay);
        Next::Restart(delay)
    }

    /// The environment the next attempts get changed (`--degrade`).
    pub(super) fn degrade(&mut self, changes: &[crate::job::restart::EnvChange]) {
        for (name, _, new) in changes {
            self.env.insert(name.clone(), new.clone());
        }
    }

    pub(super) fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// The next attempt begins at `now`: its number.
    pub(super) fn begin(&mut self, now: Instant) -> u32 {
        self.relaunch_at = None;
        self.number += 1;
        self.started = now;
        self.number
    }

    /// What the current attempt runs: `--resume-cmd` with the checkpoint
    /// once there is one, else the job's own command.
    pub(super) fn argv(&self, resume_cmd: Option<&str>, argv: &[OsString]) -> Vec<OsString> {
        match resume_cmd {
            Some(cmd) if self.checkpoint.is_some() => vec![
                OsString::from("/bin/sh"),
                OsString::from("-c"),
                OsString::from(crate::job::restart::substitute(cmd, self.checkpoint())),
            ],
            _ => argv.to_vec(),
        }
    }

    /// The variables that tell the current attempt which it is and what it
    /// resumes from, and the degraded ones.
    pub(super) fn job_env(&self) -> Vec<(OsString, OsString)> {
        job_env(self.number, self.checkpoint(), &self.env)
    }

    /// The first attempt's variables (before there is an `Attempts`).
    pub(super) fn first_env() -> Vec<(OsString, OsString)> {
        job_env(1, None, &BTreeMap::new())
    }
}

fn job_env(
    number: u32,
    checkpoint: Option<&Path>,
    degraded: &BTreeMap<String, String>,
) -> Vec<(OsString, OsString)> {
    let mut env = vec![(
        OsString::from("OOMGUARD_ATTEMPT"),
        OsString::from(number.to_string()),
    )];
    if let Some(c) = checkpoint {
        env.push((
            OsString::from("OOMGUARD_CHECKPOINT"),
            c.as_os_str().to_owned(),
        ));
    }
    env.extend(
        degraded
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    env
}

impl Supervisor {
    /// Whether a kernel OOM kill leads to a restart: with
    /// `--on-critical restart` (the policy meant to restart anyway) or
    /// `--restart-on oom-kill`.
    pub(super) fn restart_enabled(&self) -> bool {
        let p = self.core.policy();
        self.cfg.restart.restart_on.contains(&RestartOn::OomKill)
            || p.after_pause == Action::Restart
            || p.rules.iter().any(|r| r.action == Action::Restart)
    }

    /// The attempt is over (the tree is empty). Decides whether to start
    /// another: after a `restart` action, or when the kernel OOM killer took
    /// part of the job and restarts are configured. Returns false when the
    /// run is over.
    pub(super) fn plan_restart(&mut self) -> bool {
        // The attempt's processes are gone: the rest of its output is in the
        // channels. Read it and log what it said, in this attempt.
        self.output.finish(false);
        self.log_output_events();
        // The companion's last words (its final step, written at exit, or
        // a done that came after the last tick) belong to this attempt.
        self.core.act_mut().poll_channel(crate::vocab::clock::now());
        // Another node's fault that came after this node's ranks had
        // already failed in their collectives is still why they did.
        let failed = self.child.status().is_some_and(|s| s != Status::Exited(0));
        self.core.act_mut().adopt_remote_fault(failed);
        self.core.act_mut().adopt_remote_stop();
        self.core
            .act_mut()
            .conclude_checkpoint(crate::vocab::clock::now());
        self.acted(None);
        let sample = self.sample(true);
        // A kill the kernel made in this attempt is logged in it, not
        // found by the next attempt's first tick.
        self.check_oom_kills(&sample);
        let end = crate::job::restart::AttemptEnd {
            policy_end: self.core.act().policy_end(),
            stop_reason: (self.core.act().stop().map(|st| st.reason().to_string()))
                .or_else(|| self.core.act().policy_reason().map(str::to_string)),
            kernel_killed: self.oom.kernel_killed(&sample),
            memory_death: self.output.memory_death(),
            cuda_oom: self.output.cuda_oom(),
            succeeded: self.child.status().unwrap_or(Status::Exited(0)) == Status::Exited(0),
        };
        let rules = crate::job::restart::RestartRules {
            on_memory: self.restart_enabled(),
            on_cuda_oom: self.cfg.restart.restart_on.contains(&RestartOn::CudaOom),
        };
        let reason =
            crate::job::restart::restart_reason(&end, &rules).filter(|_| self.target.restarts());
        let now = crate::vocab::clock::now();
        let (dir, glob) = (
            self.cfg.checkpoint_dir.as_deref(),
            &self.cfg.checkpoint_glob,
        );
        let newest = || {
            dir.and_then(|d| crate::job::restart::newest(d, glob, None))
                .map(|(p, ..)| p)
        };
        let stopping =
            self.child.shutdown_signal().is_some() || self.core.act().signal_end().is_some();
        let spans_nodes = self.core.act().companion().spans_nodes();
        let next = self
            .attempts
            .plan(reason.as_deref(), stopping, spans_nodes, newest, now);
        // After the plan: a restart that had none left reads as such.
        self.note_attempt(&end, !matches!(next, Next::GaveUp));
        let delay = match next {
            Next::Over => return false,
            Next::GaveUp => {
                if !self.cfg.quiet {
                    self.say(format!(
                        "not restarting: --max-restarts {} reached",
                        self.cfg.max_restarts
                    ));
                }
                return false;
            }
            Next::Restart(delay) => delay,
        };
        let reason = reason.unwrap_or_default();
        let fragmented = reason == "CUDA out of memory" && self.output.cuda_oom() == Some(true);
        let env = self.attempts.env();
        let (changes, problems) = crate::job::restart::degrade_env(
            &self.cfg.restart.degrade,
            |name| env.get(name).cloned().or_else(|| std::env::var(name).ok()),
            fragmented,
        );
        for p in problems {
            self.say(p);
        }
        self.attempts.degrade(&changes);
        self.announce_restart(&reason, &changes, delay);
        if self.child.foreground() {
            // Between attempts Ctrl-C must reach oomguard.
            supervise::reclaim_foreground(std::io::stdin().as_fd());
        }
        true
    }

    /// The summary's line for the attempt that just ended.
    /// `restart_left`: a `restart` that ended it was not refused for
    /// want of restarts.
    pub(super) fn note_attempt(
        &mut self,
        end: &crate::job::restart::AttemptEnd,
        restart_left: bool,
    ) {
        if self.attempts.lines().len() >= self.attempts.number() as usize {
            return;
        }
        let status = self.child.status().unwrap_or(Status::Exited(0));
        let how = match status {
            _ if self.internal_error.is_some() => {
                format!(
                    "not started ({})",
                    self.internal_error.as_deref().unwrap_or("")
                )
            }
            _ if end.policy_end.is_some() => {
                let action = end.policy_end.unwrap_or(Action::Stop);
                let reason = end.stop_reason.as_deref().unwrap_or(action.name());
                words::ended_by(action, reason, restart_left)
            }
            _ if end.kernel_killed => "hit by the kernel OOM killer".to_string(),
            Status::Exited(c) => format!("exited with {c}"),
            Status::Signaled(s) => format!("killed by {}", supervise::signal_name(s)),
        };
        let at = self
            .output
            .progress()
            .current()
            .map(|p| p.describe())
            .filter(|d| !d.is_empty())
            .map_or(String::new(), |d| format!(" at {d}"));
        let saved = self
            .checkpoint_line(self.attempt_lost_work())
            .map_or(String::new(), |l| format!("; {l}"));
        let ran = human_duration(self.attempts.age(crate::vocab::clock::now()));
        self.attempts
            .note(|n| format!("attempt {n}: {how} after {ran}{at}{saved}"));
    }

    /// The `restart` line, the dashboard's event and the user's message.
    pub(super) fn announce_restart(
        &mut self,
        reason: &str,
        changes: &[crate::job::restart::EnvChange],
        delay: Duration,
    ) {
        let next = self.attempts.number() + 1;
        let checkpoint = self.attempts.checkpoint().map(Path::to_path_buf);
        // The restart line belongs to the attempt it starts: its envelope
        // `attempt` is the new number.
        self.sinks.set_attempt(next);
        self.sinks.emit(&crate::sinks::log::Event::Restart(
            crate::sinks::log::RestartEvent {
                reason: Some(reason.to_string()),
                checkpoint: checkpoint.clone(),
                degraded: changes
                    .iter()
                    .map(|(k, old, new)| (k.clone(), serde_json::json!([old, new])))
                    .collect(),
                delay_seconds: Some(delay.as_secs_f64()),
            },
        ));
        if self.cfg.quiet {
            return;
        }
        let listed: Vec<String> = changes
            .iter()
            .map(|(k, old, new)| format!("{k} {} -> {new}", old.as_deref().unwrap_or("unset")))
            .collect();
        let with = if listed.is_empty() {
            String::new()
        } else {
            format!(" with {}", listed.join(", "))
        };
        self.say(format!(
            "restarting in {} (attempt {} of at most {}){with}{}",
            human_duration(delay),
            next,
            self.cfg.max_restarts + 1,
            checkpoint
                .as_ref()
                .map_or(String::new(), |c| format!(" from {}", c.display()))
        ));
    }

    /// Starts the next attempt.
    pub(super) fn relaunch(&mut self) {
        let attempt = self.attempts.begin(crate::vocab::clock::now());
        self.sinks.set_attempt(attempt);
        let resume_cmd = self.cfg.restart.resume_cmd.as_deref();
        let argv = self.attempts.argv(resume_cmd, &self.cfg.argv);
        let mut env = self.attempts.job_env();
        if let Some(inj) = self.sampler.torch_injector() {
            let base = (self.attempts.env())
                .get("PYTHONPATH")
                .map(OsString::from)
                .or_else(|| std::env::var_os("PYTHONPATH"));
            env.extend(inj.env(base.as_deref()));
        }
        env.extend(self.next_channel().into_iter().flatten());
        let slave = match self.screen.open_job_pty(self.sinks.app()) {
            Some(Ok(s)) => {
                self.keep_pty();
                Some(s)
            }
            Some(Err(e)) => {
                self.say(format!("cannot open a terminal for the job: {e}"));
                None
            }
            None => None,
        };
        let relayed = match self
            .output
            .relay_mut()
            .map(|r| r.next_attempt())
            .transpose()
        {
            Ok(s) => s,
            Err(e) => {
                self.say(format!("cannot restart: {e}"));
                self.attempts.no_more();
                self.internal_error = Some(format!("cannot restart: {e}"));
                self.child.ended(Status::Exited(EXIT_INTERNAL));
                return;
            }
        };
        let launched = self
            .child
            .launch(&self.cfg.proc_root, &argv, env, slave.as_ref(), relayed);
        drop(slave);
        let relay = self.output.relay_mut();
        let keeper = relay.map(|r| {
            r.after_spawn();
            r.keeper_pid()
        });
        if let Some(pid) = keeper.flatten() {
            self.sampler.exclude(pid);
        }
        if let Some(app) = self.sinks.app_mut() {
            app.set_attempt(attempt);
        }
        match launched {
            Ok(job) => {
                let now = crate::vocab::clock::now();
                self.sampler.new_attempt(job.pid);
                self.child.started(job);
                self.core.reset();
                self.output.new_attempt();
                self.screen.new_attempt();
                self.sinks.clear_progress();
                self.wakeups.tick_now(now);
                self.sinks.start_attempt(self.run_t());
                let cg = self.sampler.cgroup().and_then(|c| c.read());
                let machine = self.sampler.machine_oom_kills(now);
                self.oom
                    .start_attempt(cg.and_then(|c| c.oom_kill_count), machine);
            }
            // oomguard was told to restart the job and cannot: its own
            // failure (exit 70), with the reason in `run_end.error`.
            Err(e) => {
                self.say(format!("cannot restart: {e}"));
                self.attempts.no_more();
                self.internal_error = Some(format!("cannot restart: {e}"));
                self.child.ended(Status::Exited(EXIT_INTERNAL));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempts(max: u32, t0: Instant) -> Attempts {
        let s = Duration::from_secs;
        Attempts::new(Budget::new(max, s(5), s(300), s(1800)), t0)
    }

    const OOM: Option<&str> = Some("the kernel OOM killer");

    #[test]
    fn giving_up_when_the_restarts_are_spent_and_not_before() {
        let t0 = Instant::now();
        let mut a = attempts(2, t0);
        let s = Duration::from_secs;
        // Two restarts, each after its (doubling) delay and no sooner.
        assert_eq!(
            a.plan(OOM, false, false, || None, t0 + s(10)),
            Next::Restart(s(5))
        );
        assert!(!a.due(t0 + s(14)) && a.due(t0 + s(15)));
        assert_eq!(a.begin(t0 + s(15)), 2);
        assert!(!a.is_last(t0 + s(16)));
        assert_eq!(
            a.plan(OOM, false, false, || None, t0 + s(20)),
            Next::Restart(s(10))
        );
        assert_eq!(a.begin(t0 + s(30)), 3);
        assert!(a.is_last(t0 + s(31)), "the third attempt is the last");
        // The third attempt fails too: the budget is spent.
        assert_eq!(a.plan(OOM, false, false, || None, t0 + s(40)), Next::GaveUp);
        assert!(a.gave_up() && !a.between());
        assert_eq!((a.number(), a.restarts()), (3, 2));
        // An attempt that succeeded, or one oomguard was told to end, is
        // the end of the run whatever is left of the budget.
        let mut b = attempts(2, t0);
        assert_eq!(b.plan(None, false, false, || None, t0 + s(10)), Next::Over);
        assert_eq!(b.plan(OOM, true, false, || None, t0 + s(10)), Next::Over);
        b.no_more();
        assert_eq!(b.plan(OOM, false, false, || None, t0 + s(10)), Next::Over);
        assert!(!b.gave_up());
        // An attempt that ran past --restart-reset earns the budget back.
        let mut c = attempts(1, t0);
        assert!(matches!(
            c.plan(OOM, false, false, || None, t0 + s(1)),
            Next::Restart(_)
        ));
        c.begin(t0 + s(6));
        assert!(matches!(
            c.plan(OOM, false, false, || None, t0 + s(6 + 1801)),
            Next::Restart(_)
        ));
    }

    #[test]
    fn the_next_attempt_resumes_from_the_newest_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("step-100.ckpt");
        let new = dir.path().join("step-200.ckpt");
        std::fs::write(&old, b"a").unwrap();
        let past = std::time::SystemTime::now() - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(past)
            .unwrap();
        std::fs::write(&new, b"b").unwrap();
        std::fs::write(dir.path().join(".step-300.ckpt.tmp"), b"c").unwrap();
        let t0 = Instant::now();
        let mut a = attempts(3, t0);
        let argv = [OsString::from("python"), OsString::from("train.py")];
        let resume = Some("python train.py --resume {checkpoint}");
        // No checkpoint yet: the first command, as given.
        assert_eq!(a.argv(resume, &argv), argv);
        // A checkpoint the companion confirmed during the attempt...
        a.saved(old.clone());
        assert_eq!(a.checkpoint(), Some(old.as_path()));
        // ... is replaced by the newest complete one on disk when the
        // attempt ends; a temporary file never counts.
        let newest = || crate::job::restart::newest(dir.path(), "*.ckpt", None).map(|(p, ..)| p);
        let now = t0 + Duration::from_secs(30);
        assert!(matches!(
            a.plan(OOM, false, false, newest, now),
            Next::Restart(_)
        ));
        assert_eq!(a.checkpoint(), Some(new.as_path()));
        a.degrade(&[("NUM_WORKERS".into(), Some("8".into()), "4".into())]);
        assert_eq!(a.begin(now + Duration::from_secs(5)), 2);
        let run = a.argv(resume, &argv);
        let quoted = format!("python train.py --resume '{}'", new.display());
        assert_eq!(run, [OsString::from("/bin/sh"), "-c".into(), quoted.into()]);
        let env = a.job_env();
        let var = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(var("OOMGUARD_ATTEMPT"), Some("2".into()));
        assert_eq!(var("OOMGUARD_CHECKPOINT"), Some(new.into_os_string()));
        assert_eq!(var("NUM_WORKERS"), Some("4".into()));
        // Without a --resume-cmd the job's own command runs again.
        assert_eq!(a.argv(None, &argv), argv);
    }

    #[test]
    fn a_job_on_several_nodes_waits_for_the_old_launchers_and_a_cancel_ends_the_wait() {
        let t0 = Instant::now();
        let mut a = attempts(3, t0);
        let next = a.plan(OOM, false, true, || None, t0);
        assert_eq!(next, Next::Restart(MULTINODE_SETTLE));
        assert!(a.between());
        a.cancel();
        assert!(!a.between() && !a.due(t0 + Duration::from_secs(60)));
    }
}
