//! The end of the run: when it is over, the last log lines and reports,
//! the exit code, and the summary on stderr.

use std::os::fd::AsFd;
use std::time::Duration;

use super::{
    EXIT_FAIL_ABOVE, EXIT_INTERNAL, EXIT_OUTPUT_LOST, Supervisor, resume, resume_place, words,
};
use crate::job::supervise::{self, Status};
use crate::sinks::log::{Outcome, RunEnd};
use crate::vocab::model::{CeilingSource, Sample};
use crate::vocab::units::{HumanBytes, human_duration};

impl Supervisor {
    pub(super) fn finished(&mut self) -> bool {
        if !self.target.is_parent() {
            // The watched tree is not ours to wait for: its orphans go to
            // init. Done when the watched process is (or, for a job that is
            // its cgroup's members, the last of them), or when the watch
            // ends (INT/TERM, dashboard detach, --watch-for).
            return self.child.status().is_some()
                || self.child.shutdown_signal().is_some()
                || self.watch_ended();
        }
        if self.child.status().is_none() {
            return false;
        }
        self.reap();
        self.refresh_tree();
        self.sampler.tree_gone()
    }

    /// `--output-log-max`: what it left out, from the relay's copy and the
    /// dashboard's; `None` without the cap.
    fn output_log_left_out(&self, relay: Option<&crate::job::relay::RelayStats>) -> Option<u64> {
        self.cfg
            .run
            .output_log_max
            .map(|_| relay.map_or(0, |st| st.output_log_left_out) + self.output.pty_log_left_out())
    }

    pub(super) fn finish(mut self) -> i32 {
        // Give the terminal back before anything is printed to it.
        self.leave_dashboard();
        self.screen.drop_keeper();
        self.tell_the_jobs_end();
        let relay_stats = self.drain_output();
        let status = self.child.status().unwrap_or(Status::Exited(0));
        let sample = self.sample(false);
        let view = self.core.view_of(&sample);
        self.record(&sample, &view, true, false, None);
        let kernel_killed = self.oom.kernel_killed(&sample);
        // The kernel killed a tree process and the job failed: whichever
        // process the kernel picked, that is why (unless oomguard's own
        // SIGKILL is what the job died of).
        let oom_killed = kernel_killed
            && status.code() != 0
            && !(self.core.act().killed() && status == Status::Signaled(libc::SIGKILL));
        // `attach`: a watch that ended before the job did is not an exit.
        let detached = self.target.detached(self.child.status().is_some());
        let (outcome, mut exit_code) = match status {
            _ if self.internal_error.is_some() => (Outcome::InternalError, EXIT_INTERNAL),
            _ if detached => (Outcome::Detached, 0),
            _ if self.attempts.gave_up() => (Outcome::RestartLimit, self.cfg.stop_code),
            _ if oom_killed => (Outcome::OomKilled, status.code()),
            // Ctrl-C's save ends as an interrupt does: a person who pressed
            // it wants to stop, not to be requeued.
            _ if self.core.act().signal_end() == Some(libc::SIGINT) => {
                (Outcome::StoppedBySignal, 128 + libc::SIGINT)
            }
            _ if self.core.act().signal_end().is_some() => {
                (Outcome::StoppedBySignal, self.cfg.stop_code)
            }
            _ if self.core.act().policy_end().is_some() => {
                (Outcome::StoppedByPolicy, self.cfg.stop_code)
            }
            Status::Exited(c) => (Outcome::Exited, c),
            Status::Signaled(s) => (Outcome::Signaled, 128 + s),
        };
        let duration = self.run_time();
        exit_code = self.keep_records(outcome, status, exit_code);
        if self.target.is_parent() {
            // Every process of the job is reaped by now (a non-parent's
            // high-water mark is not the kernel's to give).
            self.sinks.stats_mut().peak.largest_process_rss_bytes =
                supervise::largest_child_rss_bytes();
        }
        let fail_above = self.cfg.fail_above.map(|limit| {
            let peak = &self.sinks.stats().peak;
            let exceeded = peak.tree_pss_bytes > limit || peak.largest_process_rss_bytes > limit;
            (limit, exceeded)
        });
        // The gate only turns a success into a failure: a job that failed
        // keeps its own code.
        if fail_above.is_some_and(|(_, exceeded)| exceeded) && exit_code == 0 {
            exit_code = EXIT_FAIL_ABOVE;
        }
        // As `cat` in the same place would: bytes the job wrote that never
        // reached the file or device make the run fail, though the job
        // itself (its writes went to oomguard's pipe) succeeded.
        let lost_output = relay_stats.as_ref().map_or(0, |st| {
            [st.stdout, st.stderr]
                .iter()
                .filter(|s| s.broken)
                .map(|s| s.lost_bytes())
                .sum::<u64>()
        });
        if lost_output > 0 && exit_code == 0 {
            exit_code = EXIT_OUTPUT_LOST;
            if !self.cfg.quiet {
                eprintln!(
                    "oomguard: the job succeeded but {} of its output could not be written; exit {exit_code}",
                    HumanBytes(lost_output)
                );
            }
        }
        self.write_run_end(
            outcome,
            &RunEnd {
                outcome,
                exit_code,
                peak: self.sinks.stats().peak.clone(),
                restarts: self.attempts.restarts(),
                actions: self.sinks.stats().actions.clone(),
                duration_seconds: (duration.as_secs_f64() * 1000.0).round() / 1000.0,
                error: self.internal_error.clone(),
                fail_above: fail_above.map(|(limit_bytes, exceeded)| {
                    crate::sinks::log::FailAbove {
                        limit_bytes,
                        exceeded,
                    }
                }),
                output_dropped_bytes: relay_stats
                    .as_ref()
                    .map(|st| st.stdout.lost_bytes() + st.stderr.lost_bytes()),
                exit_code_known: None,
                detached_reason: None,
                still_running_pids: None,
                cheap_loop: self.wakeups.cheap_loop_stats(),
                reused_pids_refused: Some(supervise::reused_pids_refused()).filter(|&n| n > 0),
                wakeups: Some(self.wakeups.armed()),
                not_saved: self.core.act().not_saved().map(str::to_string),
                output_log_left_out_bytes: self.output_log_left_out(relay_stats.as_ref()),
                shm_segments_removed: self.remove_left_shm_segments(),
            },
        );
        self.tell_ci(&sample, outcome, exit_code, duration, fail_above);
        if let Some(t) = self.sinks.take_textfile()
            && let Err(e) = t.remove()
        {
            eprintln!("oomguard: {e}");
        }
        if self.child.foreground() {
            supervise::reclaim_foreground(std::io::stdin().as_fd());
        }
        if !self.cfg.quiet {
            self.summary(status, outcome, exit_code, duration);
        }
        self.child.drop_cgroup();
        exit_code
    }

    /// Removes the `torch_<pid>_…` files the job's processes left in
    /// `/dev/shm`, and says so. Only the job's parent knows it has ended
    /// for good.
    fn remove_left_shm_segments(&self) -> Option<crate::sinks::log::ShmSegments> {
        let left = (self.target.is_parent())
            .then(|| self.sampler.remove_left_shm_segments())
            .flatten()?;
        if !self.cfg.quiet {
            eprintln!(
                "oomguard: removed {} torch_* segment(s) ({}) the job's processes left in /dev/shm",
                left.files,
                HumanBytes(left.bytes)
            );
        }
        Some(left)
    }

    /// What the next run of this job resumes from (`resume.rs`): the save
    /// every rank agreed on before a stop, kept; nothing after a normal
    /// end. Any other end leaves an earlier record as it was.
    pub(super) fn keep_resume_record(&mut self, outcome: Outcome) {
        if !self.target.is_parent() || self.cfg.doctor.is_some() {
            return;
        }
        let Some((path, run)) = resume_place(&self.cfg) else {
            return;
        };
        let stopped = matches!(
            outcome,
            Outcome::StoppedBySignal | Outcome::StoppedByPolicy | Outcome::RestartLimit
        );
        let saved = self.core.act().companion().done.clone().filter(|d| d.ok);
        match (outcome, saved) {
            (Outcome::Exited, _) if self.child.status() == Some(Status::Exited(0)) => {
                resume::remove_if_ours(&path, &run);
            }
            (_, Some(done)) if stopped && !resume::beside(&path, &done.paths) => {
                self.not_resumable(&path, &done.paths);
            }
            (_, Some(done)) if stopped => {
                let rec = resume::Record {
                    v: 1,
                    run,
                    step: done.step,
                    paths: done.paths,
                    reason: self
                        .core
                        .act()
                        .policy_reason()
                        .map(str::to_string)
                        .unwrap_or_else(|| "a stop".into()),
                    saved_at: crate::vocab::clock::unix_seconds(),
                };
                if let Err(e) = resume::write(&path, &rec) {
                    self.say(format!(
                        "cannot write {} (the next run could not resume): {e}",
                        path.display()
                    ));
                }
            }
            _ => {}
        }
    }

    /// Says that the save is not where the record would be kept, so the
    /// next run will not resume from it.
    fn not_resumable(&mut self, record: &std::path::Path, paths: &[std::path::PathBuf]) {
        if self.cfg.quiet {
            return;
        }
        let save = paths
            .first()
            .map_or_else(|| "no file".to_string(), |p| p.display().to_string());
        let dir = record.parent().unwrap_or(record);
        self.say(format!(
            "the save ({save}) is not under {}: the next run will not resume from it \
             (--checkpoint-dir names where the checkpoints go)",
            dir.display()
        ));
    }

    /// The job's last output, passed on before oomguard's own lines (unless
    /// oomguard was told to stop waiting for it), scanned, and what could
    /// not be passed on said. Returns the relay's final figures.
    fn drain_output(&mut self) -> Option<crate::job::relay::RelayStats> {
        // The job's last bytes come before oomguard's own lines (unless
        // oomguard was told to stop waiting for them).
        self.output.finish(true);
        self.log_output_events();
        // Final now: the relay has finished and nothing more is written.
        let relay_stats = self.output.relay_stats();
        if let Some(stats) = &relay_stats
            && !self.cfg.quiet
        {
            for (name, st) in [("stdout", stats.stdout), ("stderr", stats.stderr)] {
                if st.lost_bytes() > 0 {
                    eprintln!(
                        "oomguard: {} of the job's {name} could not be passed on (dropped under --output-drop, the reader closed its end or stopped taking it, or the destination failed)",
                        HumanBytes(st.lost_bytes())
                    );
                }
            }
        }
        relay_stats
    }

    /// The `--fail-above` verdict on stderr, and the run for CI: GitHub
    /// annotations and the step summary.
    fn tell_ci(
        &mut self,
        sample: &Sample,
        outcome: Outcome,
        exit_code: i32,
        duration: Duration,
        fail_above: Option<(u64, bool)>,
    ) {
        // The annotations came from the run_end line (`Sinks::emit`).
        if let Some((limit, true)) = fail_above
            && !self.cfg.quiet
        {
            let what = super::sinks::fail_above_verdict(&self.sinks.stats().peak, limit);
            eprintln!("oomguard: {what}; exit {exit_code}");
        }
        if self.sinks.in_github_actions()
            && let Some(path) = crate::sinks::github::step_summary_path(std::env::vars())
        {
            let data = crate::sinks::github::RunSummaryData {
                command: self
                    .cfg
                    .argv
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                outcome,
                exit_code,
                duration_seconds: duration.as_secs_f64(),
                attempts: self.attempts.number(),
                peak: self.sinks.stats().peak.clone(),
                ceilings: sample.ceilings().iter().map(|c| c.ceiling).collect(),
                least_headroom_bytes: self.sinks.stats().least_headroom.map(|l| l.headroom_bytes),
                actions: self.sinks.stats().actions.clone(),
                fail_above_bytes: self.cfg.fail_above,
            };
            if let Err(e) = crate::sinks::github::append_step_summary(
                &path,
                &crate::sinks::github::step_summary(&data),
            ) {
                eprintln!("oomguard: {e}");
            }
        }
    }

    pub(super) fn summary(
        &self,
        status: Status,
        outcome: Outcome,
        exit_code: i32,
        duration: Duration,
    ) {
        let cmd = self
            .cfg
            .argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let (how, saved_said) = self.how_it_ended(status, outcome, exit_code);
        let s = self.sinks.stats();
        match self.attach_headline(outcome, duration) {
            Some(line) => eprintln!("oomguard: {line}"),
            None => eprintln!("oomguard: '{cmd}' {how} after {}", human_duration(duration)),
        }
        if let Some(line) = self.progress_line(outcome, exit_code) {
            eprintln!("oomguard: {line}");
        }
        self.memory_lines();
        for note in self.output.rank_notes() {
            eprintln!("oomguard: {note}");
        }
        if !saved_said && let Some(line) = self.checkpoint_line(self.attempt_lost_work()) {
            eprintln!("oomguard: {line}");
        }
        if let Some(line) = words::actions_line(
            &s.actions,
            self.core.act().parts(),
            self.attempts.restarts(),
        ) {
            eprintln!("oomguard: {line}");
        }
        if self.attempts.lines().len() > 1 {
            for a in self.attempts.lines() {
                eprintln!("oomguard: {a}");
            }
        }
    }

    /// The headline's verb: "exited with 0", "was stopped by oomguard
    /// (critical-headroom) before the kernel OOM killer; exit 75", …; and
    /// whether it already said the checkpoint (Ctrl-C's save says it
    /// there, as what the interrupt got).
    fn how_it_ended(&self, status: Status, outcome: Outcome, exit_code: i32) -> (String, bool) {
        // A Ctrl-C typed into the job from the dashboard, or an INT passed
        // on to a job with no companion: the job ended as it handles an
        // interrupt, and that is what the user did.
        let interrupted =
            self.screen.typed_interrupt() || self.child.shutdown_signal() == Some(libc::SIGINT);
        let how = match (outcome, status) {
            (Outcome::RestartLimit, _) => format!(
                "ran out of restarts ({} of --max-restarts {}); exit {exit_code}",
                self.attempts.restarts(),
                self.cfg.max_restarts
            ),
            (Outcome::OomKilled, Status::Signaled(_)) => {
                format!("was killed by the kernel OOM killer; exit {exit_code}")
            }
            // A worker was the victim, and the trainer failed after it.
            (Outcome::OomKilled, _) => format!(
                "failed after the kernel OOM killer killed one of its processes; exit {exit_code}"
            ),
            (Outcome::InternalError, _) => format!(
                "could not be supervised to the end: {}; exit {exit_code}",
                self.internal_error.as_deref().unwrap_or("oomguard failed")
            ),
            (Outcome::StoppedBySignal, _) => {
                let sig = self.core.act().signal_end().unwrap_or(libc::SIGTERM);
                if sig == libc::SIGINT {
                    return match self.checkpoint_line(true) {
                        Some(saved) => (
                            format!("was interrupted (Ctrl-C): {saved}; exit {exit_code}"),
                            true,
                        ),
                        None => (format!("was interrupted (Ctrl-C); exit {exit_code}"), false),
                    };
                }
                if let Some(why) = self.core.act().not_saved() {
                    return (
                        format!(
                            "was warned ({}) and ended with no save ({why}); exit {exit_code}: \
                             safe to requeue",
                            supervise::signal_name(sig)
                        ),
                        false,
                    );
                }
                let name = supervise::signal_name(sig);
                match self.core.act().companion().done.as_ref().map(|d| d.ok) {
                    Some(true) => {
                        format!("was preempted ({name}) and saved first; exit {exit_code}")
                    }
                    Some(false) => {
                        format!("was preempted ({name}); its save did not count; exit {exit_code}")
                    }
                    None => format!("was preempted ({name}); no save finished; exit {exit_code}"),
                }
            }
            (Outcome::StoppedByPolicy, _) => {
                // The rule, also when the stop is over (an attached
                // trainer that checkpointed and left ends it early).
                let reason = self.core.act().policy_reason().unwrap_or("kill");
                if reason == words::MANUAL_STOP {
                    format!("was stopped from the dashboard; exit {exit_code}")
                } else {
                    // A full /dev/shm fails a write, not an allocation.
                    let shm = (self.sinks.stats().least_headroom)
                        .is_some_and(|l| l.ceiling.source == CeilingSource::Shm);
                    let before = if shm {
                        "/dev/shm filled"
                    } else {
                        "the kernel OOM killer"
                    };
                    format!("was stopped by oomguard ({reason}) before {before}; exit {exit_code}")
                }
            }
            (_, Status::Exited(c)) if interrupted => {
                format!("was interrupted (Ctrl-C) and exited with {c}")
            }
            (_, Status::Signaled(s)) if interrupted => format!(
                "was interrupted (Ctrl-C) and killed by {} (exit {})",
                supervise::signal_name(s),
                128 + s
            ),
            (_, Status::Exited(c)) => format!("exited with {c}"),
            (_, Status::Signaled(s)) => {
                format!(
                    "was killed by {} (exit {})",
                    supervise::signal_name(s),
                    128 + s
                )
            }
        };
        (how, false)
    }

    /// Where training got to and, when memory grew with the steps, where
    /// the ceiling would have been reached (estimated before the job began
    /// to exit: a teardown's memory is not training's).
    fn progress_line(&self, outcome: Outcome, exit_code: i32) -> Option<String> {
        let p = self.output.progress().current()?;
        let at = p.describe();
        if at.is_empty() {
            return None;
        }
        let verb = match outcome {
            Outcome::Exited if exit_code == 0 => "finished",
            Outcome::Exited => "ended",
            _ => "stopped",
        };
        let growth = match (p.bytes_per_step, p.ceiling_step) {
            (Some(per), Some(at)) if per > 0 => format!(
                "; memory grew {}/step, the ceiling would be reached near step {at}",
                HumanBytes(per.unsigned_abs())
            ),
            _ => String::new(),
        };
        Some(format!("{verb} at {at}{growth}"))
    }

    /// The peak and the nearest ceiling.
    fn memory_lines(&self) {
        for line in self.sinks.stats().memory_lines() {
            eprintln!("oomguard: {line}");
        }
    }
}
