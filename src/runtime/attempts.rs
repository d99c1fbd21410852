//! One attempt after another: whether a restart follows, what the ended
//! attempt is remembered as, the announcement, and the relaunch.

use super::*;
use crate::restart::RestartOn;

/// The least delay before a job that spans nodes is started again (see
/// [`Supervisor::plan_restart`]).
const MULTINODE_SETTLE: Duration = Duration::from_secs(5);

impl Supervisor {
    /// Whether a kernel OOM kill leads to a restart: with
    /// `--on-critical restart` (the policy meant to restart anyway) or
    /// `--restart-on oom-kill`.
    pub(super) fn restart_enabled(&self) -> bool {
        let p = self.core.engine.policy();
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
        if let Some(r) = self.relay.as_mut() {
            r.finish();
        }
        self.pty_scanner.finish();
        self.log_output_events();
        // The companion's last words (its final step, written at exit, or
        // a done that came after the last tick) belong to this attempt.
        self.core.act.poll_channel(Instant::now());
        // Another node's fault that came after this node's ranks had
        // already failed in their collectives is still why they did.
        let failed = self.main_status.is_some_and(|s| s != Status::Exited(0));
        self.core.act.adopt_remote_fault(failed);
        self.core.act.adopt_remote_stop();
        self.core.act.conclude_checkpoint(Instant::now());
        self.acted(None);
        let sample = self.sample(true);
        // A kill the kernel made in this attempt is logged in it, not
        // found by the next attempt's first tick.
        self.check_oom_kills(&sample);
        let end = crate::restart::AttemptEnd {
            policy_end: self.core.act.policy_end,
            stop_reason: (self.core.act.stop.as_ref().map(|st| st.reason.clone()))
                .or_else(|| self.core.act.policy_reason.clone()),
            kernel_killed: self.oom.kernel_killed(&sample),
            memory_death: self.memory_death,
            cuda_oom: self.cuda_oom,
            succeeded: self.main_status.unwrap_or(Status::Exited(0)) == Status::Exited(0),
        };
        self.note_attempt(&end);
        let rules = crate::restart::RestartRules {
            on_memory: self.restart_enabled(),
            on_cuda_oom: self.cfg.restart.restart_on.contains(&RestartOn::CudaOom),
        };
        let reason =
            crate::restart::restart_reason(&end, &rules).filter(|_| self.target.restarts());
        let Some(reason) = reason else {
            return false;
        };
        if self.shutdown_signal.is_some() || self.no_more_attempts {
            return false;
        }
        let Some(delay) = self.budget.next(self.attempt_started.elapsed()) else {
            self.restart_limit = true;
            if !self.cfg.quiet {
                self.say(format!(
                    "not restarting: --max-restarts {} reached",
                    self.cfg.max_restarts
                ));
            }
            return false;
        };
        // Every node's old launcher must be gone before this node's new one
        // starts: torchrun's c10d backend joins whatever store answers on
        // the rendezvous endpoint, and the old attempt's store (hosted by
        // another node's launcher, still exiting) holds a closed
        // rendezvous. Those launchers leave their exit barrier together,
        // so a few seconds cover them, whatever --restart-delay says.
        let delay = if self.core.act.companion.spans_nodes() {
            delay.max(MULTINODE_SETTLE)
        } else {
            delay
        };
        if let Some(dir) = &self.cfg.checkpoint_dir
            && let Some((path, _, _)) = crate::restart::newest(dir, &self.cfg.checkpoint_glob, None)
        {
            self.checkpoint = Some(path);
        }
        let fragmented = reason == "CUDA out of memory" && self.cuda_oom == Some(true);
        let env = self.env.clone();
        let (changes, problems) = crate::restart::degrade_env(
            &self.cfg.restart.degrade,
            |name| env.get(name).cloned().or_else(|| std::env::var(name).ok()),
            fragmented,
        );
        for p in problems {
            self.say(p);
        }
        for (name, _, new) in &changes {
            self.env.insert(name.clone(), new.clone());
        }
        self.announce_restart(&reason, &changes, delay);
        if self.foreground {
            // Between attempts Ctrl-C must reach oomguard.
            supervise::reclaim_foreground(std::io::stdin().as_fd());
        }
        self.relaunch_at = Some(Instant::now() + delay);
        true
    }

    /// The summary's line for the attempt that just ended.
    pub(super) fn note_attempt(&mut self, end: &crate::restart::AttemptEnd) {
        if self.attempts.len() >= self.attempt as usize {
            return;
        }
        let status = self.main_status.unwrap_or(Status::Exited(0));
        let how = match status {
            _ if self.internal_error.is_some() => {
                format!(
                    "not started ({})",
                    self.internal_error.as_deref().unwrap_or("")
                )
            }
            _ if end.policy_end.is_some() => format!(
                "stopped by oomguard ({})",
                end.policy_end.map_or("", |a| a.name())
            ),
            _ if end.kernel_killed => "hit by the kernel OOM killer".to_string(),
            Status::Exited(c) => format!("exited with {c}"),
            Status::Signaled(s) => format!("killed by {}", supervise::signal_name(s)),
        };
        let at = self
            .progress
            .current()
            .map(|p| p.describe())
            .filter(|d| !d.is_empty())
            .map_or(String::new(), |d| format!(" at {d}"));
        let saved = self
            .checkpoint_line(self.attempt_lost_work())
            .map_or(String::new(), |l| format!("; {l}"));
        self.attempts.push(format!(
            "attempt {}: {how} after {}{at}{saved}",
            self.attempt,
            human_duration(self.attempt_started.elapsed())
        ));
    }

    /// The `restart` line, the dashboard's event and the user's message.
    pub(super) fn announce_restart(
        &mut self,
        reason: &str,
        changes: &[crate::restart::EnvChange],
        delay: Duration,
    ) {
        self.restarts += 1;
        // The restart line belongs to the attempt it starts: its envelope
        // `attempt` is the new number.
        self.sinks.log.set_attempt(self.attempt + 1);
        self.sinks.ui(crate::tui::UiEvent::Restart {
            t: self.started.elapsed().as_secs_f64(),
            attempt: self.attempt + 1,
            degraded: changes
                .iter()
                .map(|(k, _, new)| (k.clone(), new.clone()))
                .collect(),
        });
        self.sinks
            .log
            .write(&crate::log::Event::Restart(crate::log::RestartEvent {
                reason: Some(reason.to_string()),
                checkpoint: self.checkpoint.clone(),
                degraded: changes
                    .iter()
                    .map(|(k, old, new)| (k.clone(), serde_json::json!([old, new])))
                    .collect(),
                delay_seconds: Some(delay.as_secs_f64()),
            }));
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
            self.attempt + 1,
            self.cfg.max_restarts + 1,
            self.checkpoint
                .as_ref()
                .map_or(String::new(), |c| format!(" from {}", c.display()))
        ));
    }

    /// Starts the next attempt.
    pub(super) fn relaunch(&mut self) {
        self.relaunch_at = None;
        self.attempt += 1;
        self.sinks.log.set_attempt(self.attempt);
        let argv = match &self.cfg.restart.resume_cmd {
            Some(cmd) if self.checkpoint.is_some() => vec![
                OsString::from("/bin/sh"),
                OsString::from("-c"),
                OsString::from(crate::restart::substitute(cmd, self.checkpoint.as_deref())),
            ],
            _ => self.cfg.argv.clone(),
        };
        let mut env = attempt_env(self.attempt, self.checkpoint.as_deref(), &self.env);
        if let Some(inj) = &self.torch {
            let base = self
                .env
                .get("PYTHONPATH")
                .map(OsString::from)
                .or_else(|| std::env::var_os("PYTHONPATH"));
            env.extend(inj.env(base.as_deref()));
        }
        env.extend(self.next_channel());
        let slave = match (&self.tui, &self.sinks.app) {
            (Some(t), Some(a)) => match open_job_pty(t, a) {
                Ok((m, s)) => {
                    self.pty = Some(m);
                    self.keep_pty();
                    Some(s)
                }
                Err(e) => {
                    self.say(format!("cannot open a terminal for the job: {e}"));
                    None
                }
            },
            _ => None,
        };
        let relayed = match self.relay.as_mut().map(|r| r.next_attempt()).transpose() {
            Ok(s) => s,
            Err(e) => {
                self.say(format!("cannot restart: {e}"));
                self.no_more_attempts = true;
                self.internal_error = Some(format!("cannot restart: {e}"));
                self.main_status = Some(Status::Exited(EXIT_INTERNAL));
                return;
            }
        };
        let launched = launch(
            &self.cfg,
            &argv,
            env,
            self.owned.as_ref(),
            self.foreground,
            slave.as_ref(),
            relayed,
        );
        drop(slave);
        if let Some(r) = self.relay.as_mut() {
            r.after_spawn();
        }
        if let Some(pid) = self.relay.as_ref().and_then(|r| r.keeper_pid()) {
            self.sampler.scanner.exclude(pid);
        }
        if let Some(app) = self.sinks.app.as_mut() {
            app.set_attempt(self.attempt);
        }
        match launched {
            Ok(job) => {
                let now = Instant::now();
                self.sampler.scanner.set_job(Some(job.pid));
                self.job = job;
                self.main_status = None;
                self.sampler.tree.clear();
                self.sampler.zombie_children = 0;
                self.core.reset();
                self.cuda_oom = None;
                self.memory_death = false;
                self.progress = crate::forensics::progress::ProgressTracker::new();
                self.sinks.log.set_progress(None, false);
                self.sinks.metrics.set_progress(None, None);
                self.next_tick = now;
                self.next_full = now;
                self.sinks
                    .start_attempt(self.started.elapsed().as_secs_f64());
                self.attempt_started = now;
                let cg = self.sampler.cgroup.as_ref().and_then(|c| c.read());
                let machine = self.sampler.system.read(now).oom_kill_total;
                self.oom
                    .start_attempt(cg.and_then(|c| c.oom_kill_count), machine);
            }
            // oomguard was told to restart the job and cannot: its own
            // failure (exit 70), with the reason in `run_end.error`.
            Err(e) => {
                self.say(format!("cannot restart: {e}"));
                self.no_more_attempts = true;
                self.internal_error = Some(format!("cannot restart: {e}"));
                self.main_status = Some(Status::Exited(EXIT_INTERNAL));
            }
        }
    }
}
