//! The job's output as oomguard reads it: the bytes relayed or shown, the
//! PyTorch and torchrun messages found in them (logged, shown, and turned
//! into the memory-death and progress facts the ending reads).
//!
//! `JobOutput` owns the readers (the relay of stdout and stderr, the
//! dashboard pty's scanner and its `--output-log` copy) and what this
//! attempt's output said; the `Supervisor` chapter below hands what they
//! found to the log, the dashboard, the actuator and the other nodes.

use std::time::Duration;

use super::Supervisor;
use crate::job::relay::{OutputError, OutputRelay, OutputScanner, Pumped, RelayStats};
use crate::vocab::forensics::progress::ProgressTracker;
use crate::vocab::forensics::torch::TorchEvent;

/// The job's output and what it said this attempt.
pub(super) struct JobOutput {
    /// The job's stdout and stderr, passed on to where they would have
    /// gone and scanned for PyTorch's messages (not with the dashboard,
    /// whose pty output is scanned by `pty_scanner`, nor under `attach`).
    relay: Option<OutputRelay>,
    pty_scanner: OutputScanner,
    /// `--output-log`: a copy of what the job wrote to the dashboard's pty.
    pty_log: Option<crate::job::relay::output_log::OutputLogFile>,
    /// oomguard stopped waiting for a reader to take the job's last
    /// output (see `drain_output`).
    abandoned: bool,
    /// This attempt printed a CUDA OOM; `true` when the allocator was
    /// fragmented (reserved-but-unallocated ≥ the failed request).
    cuda_oom: Option<bool>,
    /// This attempt's job printed a `worker_died` or `rank_failed` by
    /// SIGKILL while memory was at or past the warn level.
    memory_death: bool,
    /// Training progress read from the job's output, this attempt.
    progress: ProgressTracker,
    /// What torchrun said about failed ranks, for the summary.
    rank_notes: Vec<String>,
}

impl JobOutput {
    pub fn new(
        relay: Option<OutputRelay>,
        pty_log: Option<crate::job::relay::output_log::OutputLogFile>,
    ) -> Self {
        Self {
            relay,
            pty_scanner: OutputScanner::new(),
            pty_log,
            abandoned: false,
            cuda_oom: None,
            memory_death: false,
            progress: ProgressTracker::new(),
            rank_notes: Vec::new(),
        }
    }

    /// A new attempt: nothing said yet.
    pub fn new_attempt(&mut self) {
        self.cuda_oom = None;
        self.memory_death = false;
        self.progress = ProgressTracker::new();
    }

    /// Bytes the job wrote to the dashboard's pty: to the `--output-log`
    /// copy and the scanner.
    pub fn take_pty_bytes(&mut self, bytes: &[u8]) {
        if let Some(f) = self.pty_log.as_mut() {
            let _ = f.write_all(bytes);
        }
        self.pty_scanner.feed(bytes);
    }

    /// Bytes `--output-log-max` left out of the dashboard's copy.
    pub fn pty_log_left_out(&self) -> u64 {
        self.pty_log.as_ref().map_or(0, |f| f.left_out())
    }

    /// What the output said since the last call.
    pub fn take_events(&mut self) -> Vec<TorchEvent> {
        let mut events = self.pty_scanner.take_events();
        if let Some(r) = self.relay.as_mut() {
            events.extend(r.take_events());
        }
        events
    }

    /// What could not be passed on since the last call.
    pub fn take_errors(&mut self) -> Vec<OutputError> {
        self.relay
            .as_mut()
            .map(|r| r.take_errors())
            .unwrap_or_default()
    }

    /// Resolves when the relay moved bytes (never without one).
    pub async fn pump(&mut self) -> Pumped {
        match self.relay.as_mut() {
            Some(r) => r.pump().await,
            None => std::future::pending().await,
        }
    }

    /// What the relay can read without waiting (see [`OutputRelay::pump_now`]).
    pub fn pump_now(&mut self) -> Option<Pumped> {
        self.relay.as_mut().and_then(OutputRelay::pump_now)
    }

    pub fn relay_mut(&mut self) -> Option<&mut OutputRelay> {
        self.relay.as_mut()
    }

    /// The attempt's processes are gone: the rest of its output is in the
    /// channels, read to the end (and passed on, within 2 s, unless
    /// oomguard stopped waiting for a reader: `flush`).
    pub fn finish(&mut self, flush: bool) {
        if let Some(r) = self.relay.as_mut() {
            r.finish();
            if flush && !self.abandoned {
                r.flush(Duration::from_secs(2));
            }
        }
        self.pty_scanner.finish();
    }

    /// oomguard stopped waiting for a reader to take the last output.
    pub fn abandon(&mut self) {
        self.abandoned = true;
    }

    pub fn relay_stats(&self) -> Option<RelayStats> {
        self.relay.as_ref().map(OutputRelay::stats)
    }

    pub fn note_cuda_oom(&mut self, fragmented: bool) {
        self.cuda_oom = Some(self.cuda_oom.unwrap_or(false) || fragmented);
    }

    pub fn cuda_oom(&self) -> Option<bool> {
        self.cuda_oom
    }

    pub fn note_memory_death(&mut self) {
        self.memory_death = true;
    }

    pub fn memory_death(&self) -> bool {
        self.memory_death
    }

    pub fn progress(&self) -> &ProgressTracker {
        &self.progress
    }

    pub fn progress_mut(&mut self) -> &mut ProgressTracker {
        &mut self.progress
    }

    /// A line for the summary about a failed rank (the first 16).
    pub fn note_rank(&mut self, line: String) {
        if self.rank_notes.len() < 16 {
            self.rank_notes.push(line);
        }
    }

    pub fn rank_notes(&self) -> &[String] {
        &self.rank_notes
    }
}

impl Supervisor {
    /// Bytes the job wrote to its terminal: to the dashboard, the
    /// `--output-log` copy and the scanner.
    pub(super) fn take_pty_output(&mut self, bytes: &[u8]) {
        if let Some(app) = self.sinks.app_mut() {
            app.on_output(bytes);
        }
        self.output.take_pty_bytes(bytes);
    }

    /// The job wrote to its terminal (the dashboard's pty).
    pub(super) fn on_output(&mut self, n: std::io::Result<usize>, buf: &[u8]) {
        match n {
            Ok(n) if n > 0 => {
                self.take_pty_output(&buf[..n]);
                self.log_output_events();
            }
            // EOF or EIO: nobody has the job's side open any more.
            _ => {
                self.screen.lost_pty();
            }
        }
    }

    /// The job wrote to stdout/stderr (relayed), or the terminal resized.
    /// Output already written, read before a tick decides anything.
    pub(super) fn take_ready_output(&mut self) {
        match self.output.pump_now() {
            Some(pumped) => self.on_relay(pumped),
            None => self.log_output_events(),
        }
    }

    pub(super) fn on_relay(&mut self, pumped: Pumped) {
        if pumped == Pumped::Resized && !self.attempts.between() && self.child.status().is_none() {
            // The job's pty took the terminal's new size; a pty that is
            // not a controlling terminal tells nobody, so do as a terminal
            // would.
            self.forward(libc::SIGWINCH);
        }
        self.log_output_events();
    }

    /// Logs what the job's output said (CUDA OOM, dead workers).
    pub(super) fn log_output_events(&mut self) {
        let events = self.output.take_events();
        // A process reported dead: the kernel's OOM-kill counters now, not
        // at the last tick (the trainer can report a worker's death first),
        // so its kill is logged before the death and the advice knows.
        let death = events
            .iter()
            .any(|e| matches!(e, TorchEvent::WorkerDied(_) | TorchEvent::RankFailed(_)));
        if death {
            let sample = self.sample(true);
            self.check_oom_kills(&sample);
        }
        let critical = self.host_memory_critical();
        for event in events {
            if let TorchEvent::Framework(f) = event {
                self.core
                    .act_mut()
                    .note_framework(f, crate::vocab::clock::now());
                continue;
            }
            if let TorchEvent::Progress(u) = event {
                if self.exact_progress() {
                    continue;
                }
                let t = self.run_t();
                self.output.progress_mut().update(u, t);
                self.publish_progress();
                continue;
            }
            if self.killed_by_memory(&event) {
                self.output.note_memory_death();
            }
            if let TorchEvent::CudaOom(e) = &event {
                let frag = crate::vocab::forensics::torch::is_fragmentation(e);
                self.output.note_cuda_oom(frag);
            }
            if let Some(mut record) = crate::sinks::log::output_event(&event, critical) {
                if let crate::sinks::log::Event::RankFailed(r) = &mut record {
                    self.note_rank_failed(r);
                }
                self.sinks.emit(&record);
                self.tell_peers_of_death(&record);
            }
        }
        for e in self.output.take_errors() {
            let broken_pipe = matches!(
                &e,
                crate::job::relay::OutputError::Write { source, .. }
                    if source.kind() == std::io::ErrorKind::BrokenPipe
            );
            if !self.cfg.quiet && !broken_pipe {
                self.say(e.to_string());
            }
        }
    }

    /// A job across nodes: a CUDA OOM or a dead worker on this node is
    /// news for the other nodes, whose ranks fail next (peers.rs).
    fn tell_peers_of_death(&mut self, record: &crate::sinks::log::Event) {
        let (reason, detail, pid, restart) = match record {
            crate::sinks::log::Event::CudaOom(e) => {
                let tried = e.tried_bytes.map_or(String::new(), |b| {
                    format!(" trying to allocate {}", crate::vocab::units::HumanBytes(b))
                });
                (
                    "cuda-oom",
                    format!("CUDA out of memory{tried}"),
                    e.pid,
                    self.cfg
                        .restart
                        .restart_on
                        .contains(&crate::job::restart::RestartOn::CudaOom),
                )
            }
            crate::sinks::log::Event::WorkerDied(e) => {
                let how = e.signal.clone().unwrap_or_else(|| {
                    e.exit_code
                        .map_or("an unknown cause".into(), |c| format!("exit code {c}"))
                });
                let restart = self.output.memory_death() && self.restart_enabled();
                (
                    "worker-died",
                    format!("a DataLoader worker died ({how})"),
                    e.pid,
                    restart,
                )
            }
            _ => return,
        };
        let rank = pid.and_then(|p| self.core.act().peers().rank_of(p));
        let detail = match (rank, pid) {
            (Some(r), _) => format!("rank {r}: {detail}"),
            (None, Some(p)) => format!("pid {p}: {detail}"),
            (None, None) => detail,
        };
        let restart = restart && self.target.restarts();
        self.core
            .act_mut()
            .raise_death(reason, detail, rank, restart, crate::vocab::clock::now());
        self.acted(None);
    }

    /// Ties a failed rank to the kernel's `oom_kill` of the same pid, and
    /// keeps a line for the summary.
    pub(super) fn note_rank_failed(&mut self, r: &mut crate::sinks::log::RankFailedEvent) {
        if r.pid.is_some_and(|p| self.oom.reported(p)) {
            r.tie_to_oom_kill();
        }
        self.output.note_rank(r.describe());
    }

    /// Hands the current progress to the log (and the next sample, when it
    /// moved), the metrics and the dashboard.
    pub(super) fn publish_progress(&mut self) {
        let progress = self.output.progress_mut();
        let changed = progress.take_changed();
        self.sinks.set_progress(progress.current(), changed);
    }

    /// A worker or rank killed by SIGKILL while memory was at or past the
    /// warn level: a memory-motivated death, as an OOM-kill counter rise is.
    pub(super) fn killed_by_memory(&self, event: &TorchEvent) -> bool {
        let sigkill = match event {
            TorchEvent::WorkerDied(w) => w.signal.as_deref() == Some("SIGKILL"),
            TorchEvent::RankFailed(r) => r
                .failures
                .iter()
                .any(|f| f.signal.as_deref() == Some("SIGKILL")),
            _ => false,
        };
        let (warn, _) = self.core.watched_levels();
        sigkill && self.core.last_headroom().is_some_and(|h| h <= warn)
    }

    /// Whether host (or cgroup) memory is, or was at the last tick, at the
    /// critical level, or the kernel's OOM-kill count rose this attempt.
    pub(super) fn host_memory_critical(&self) -> bool {
        let (_, crit) = self.core.watched_levels();
        self.oom.struck_this_attempt() || self.core.last_headroom().is_some_and(|h| h <= crit)
    }
}
