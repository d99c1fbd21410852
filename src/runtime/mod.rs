//! `oomguard run` and `attach`: the supervision loop, and the
//! `Supervisor` that owns its parts (docs/development.md has the map).
//!
//! Each part has private fields, a constructor and a few verbs: the
//! sampler (`sampler.rs`) reads one sample; the core (`tick.rs`) derives
//! the view, runs the pure policy engine and drives the actuator (`act.rs`
//! and `act/`); the sinks (`sinks.rs`) take what was done; the child
//! (`child.rs`) is the job's leader, with every signal and launch; the
//! wake-ups (`wakeups.rs`) say when the loop runs; the screen
//! (`screen.rs`) and the job's output (`job_output.rs`) are the terminal
//! and what the job wrote. `setup.rs` opens everything before the job
//! starts and runs the `select!` loop; what stays here is the tick and
//! what needs several parts at once: reaping, forwarding signals, hooks,
//! restarts (`attempts.rs`) and the ending (`ending.rs`).
//!
//! One task on a current-thread runtime owns everything that changes state.
//! The other threads only measure (the PSS sweeper, NVML). Keeping every
//! `waitpid` and every signal in this one place is what makes the reaper
//! safe (nothing else waits for our children) and the log ordered.
//!
//! Near a ceiling the loop speeds up: the cheap counters are polled every
//! 20–250 ms instead of every `--interval`, and on cgroup v1 the kernel
//! wakes the loop the moment usage crosses the warn and critical levels.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::engine::policy::{Action, Readings};
use crate::engine::probe::cgroup;
use crate::job::relay::OutputRelay;
use crate::job::supervise::{self, Job, Status};
use crate::sinks::log::{
    CgroupInfo, ChildExit, Event, GpuInfo, LogWriter, Outcome, RunEnd, RunStart,
};
use crate::vocab::model::{ProcSample, Role, Sample, View};

mod act;
mod attach;
mod attempts;
mod channel;
mod cheap;
mod child;
mod doctor;
mod end_record;
mod ending;
mod entry;
mod hooks;
mod host;
mod job_output;
#[cfg(test)]
mod loop_tests;
mod node_group;
mod oom;
mod outside;
mod rank_exits;
mod resume;
mod sampler;
mod screen;
mod setup;
mod signal_saves;
mod signaller;
mod signals;
mod sinks;
mod store_link;
mod target;
mod tick;
mod wakeups;
mod words;

pub use act::stop_saves::StopVerdict;
use act::{Acted, Ident, SIG_CONT, SIG_KILL, SIG_TERM, idents, signal_all};
pub use entry::{judge, run};
use sampler::Sampler;
use signals::{FORWARDED, SignalPlan};
use sinks::Sinks;
use tick::{Core, TickInputs};

pub use crate::vocab::exit::{
    FAIL_ABOVE as EXIT_FAIL_ABOVE, INTERNAL as EXIT_INTERNAL, OUTPUT_LOST as EXIT_OUTPUT_LOST,
    POLICY as EXIT_POLICY,
};

use crate::settings::Settings;

/// The loop: owns its parts (docs/development.md, "The map") and drives
/// them; each part keeps its own state behind its verbs.
struct Supervisor {
    cfg: Settings,
    /// Where everything the run reports goes (log, metrics, GitHub,
    /// dashboard state, stderr, notifications) and the run's totals.
    sinks: Sinks,
    /// The readers and the tree of the last scan.
    sampler: Sampler,
    /// The job as oomguard's child, its cgroup and oomguard's other
    /// children; every signal and every launch goes through it.
    child: child::Child,
    /// The engine, the history and what oomguard holds (pause, the stop
    /// ladder, the kill).
    core: Core,
    /// The tick's schedule and everything that wakes the loop between
    /// ticks, with their counts.
    wakeups: wakeups::Wakeups,
    /// The run's attempts: their number, the restart budget, the newest
    /// checkpoint, and when the next one starts.
    attempts: attempts::Attempts,
    /// The kernel's OOM kills: counters and the memory history that
    /// explains them.
    oom: oom::OomWatch,
    /// Launched or attached; for `attach`, the job's cgroup and how the
    /// watch ends.
    target: target::Target,
    /// The dashboard's terminal and the job's pty.
    screen: screen::Screen,
    /// oomguard itself failed after the job started (exit 70).
    internal_error: Option<String>,
    /// The job's output (relayed, or the dashboard pty's) and what it
    /// said this attempt.
    output: job_output::JobOutput,
    /// The other oomguards of this node, when SLURM started each rank as
    /// a task of its own: one view of the node's memory, one decision.
    node: Option<node_group::NodeGroup>,
}

/// How long a reader may take nothing before oomguard, told to stop,
/// stops waiting for it.
const SHUTDOWN_STALL: Duration = Duration::from_secs(2);

/// The job is gone, but its last output may still wait for a slow reader:
/// wait for it as a pipe would hold it, however long the reader takes,
/// while a signal that ends the run (INT, TERM) still ends it. When such
/// a signal is what ended the job (`shutting_down`), the one signal is
/// enough: the wait goes on only while the reader keeps taking bytes, and
/// ends after [`SHUTDOWN_STALL`] without progress. Returns false when it
/// gave up (what is left is counted as lost in `run_end`).
async fn drain_output(
    relay: Option<&mut OutputRelay>,
    signals: &mut outside::Signals,
    shutting_down: bool,
) -> bool {
    let Some(r) = relay else { return true };
    r.finish();
    let mut progress = (r.written_bytes(), crate::vocab::clock::now());
    while !r.flushed() {
        if shutting_down {
            let written = r.written_bytes();
            if written != progress.0 {
                progress = (written, crate::vocab::clock::now());
            } else if crate::vocab::clock::since(progress.1) >= SHUTDOWN_STALL {
                return false;
            }
        }
        tokio::select! {
            sig = signals.next() => {
                if FORWARDED.iter().any(|&(s, ends)| s == sig && ends) {
                    return false;
                }
            }
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    true
}

/// Identifies a running process to watch (`attach`).
fn attach_to(cfg: &Settings, pid: u32) -> Result<Job, String> {
    let text = std::fs::read_to_string(cfg.proc_root.join(pid.to_string()).join("stat"))
        .map_err(|e| format!("cannot attach to pid {pid}: {e}"))?;
    let st = crate::engine::probe::proc::parse_stat(&text)
        .ok_or_else(|| format!("cannot attach to pid {pid}: unreadable /proc/{pid}/stat"))?;
    let pidfd = rustix::process::Pid::from_raw(pid as i32)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    Ok(Job {
        pid,
        start_time: st.start_time,
        pidfd,
    })
}

/// Where this run's resume record lives, and which run it is; `None` when
/// the working directory cannot be read.
fn resume_place(cfg: &Settings) -> Option<(PathBuf, resume::Identity)> {
    let cwd = cfg.run_dir.clone()?;
    let path = resume::path(
        cfg.checkpoint_dir.as_deref(),
        &cwd,
        resume::Owner::from_env(|k| std::env::var(k).ok()),
    );
    let job = std::env::var("SLURM_JOB_ID").ok();
    Some((path, resume::Identity::of(&cfg.argv, &cwd, job)))
}

/// A victim's last minute of memory, as the `oom_kill` event carries it.
fn memory_points(points: &[(f64, u64, u64)]) -> Vec<crate::sinks::log::MemoryPoint> {
    points
        .iter()
        .map(
            |&(pt, rss_bytes, pss_bytes)| crate::sinks::log::MemoryPoint {
                t: (pt * 1000.0).round() / 1000.0,
                rss_bytes,
                pss_bytes,
            },
        )
        .collect()
}

/// Tells the user about cgroups a killed run left behind.
fn report_stale(stale: &[cgroup::Stale], quiet: bool) {
    if quiet {
        return;
    }
    for s in stale {
        match s {
            cgroup::Stale::Removed(p) => eprintln!(
                "oomguard: removed '{}', left behind by a run that was killed",
                p.display()
            ),
            cgroup::Stale::Occupied { path, procs } => eprintln!(
                "oomguard: '{}' was left behind by a run that was killed and still holds {procs} process(es); left alone",
                path.display()
            ),
        }
    }
}

/// A pty for the job, sized like the dashboard's output pane.
fn open_job_pty(
    tui: &crate::sinks::tui::Tui,
    app: &crate::sinks::tui::App,
) -> Result<(crate::sinks::tui::PtyMaster, std::os::fd::OwnedFd), String> {
    let (cols, rows) = tui.size().map_err(|e| e.to_string())?;
    let (c, r) = crate::sinks::tui::output_pane_size(app, cols, rows);
    let (master, slave) = crate::sinks::tui::open_pty(c, r).map_err(|e| e.to_string())?;
    let master = crate::sinks::tui::PtyMaster::new(master).map_err(|e| e.to_string())?;
    Ok((master, slave))
}

/// oomguard failed after the log was opened but before the job ran: the
/// log still ends with `run_end` (`internal_error`), and the exit code is 70.
fn internal_failure(log: &mut LogWriter, cfg: &Settings, error: String) -> i32 {
    eprintln!("oomguard: {error}");
    start_without_a_job(log, cfg);
    log.write(&Event::RunEnd(Box::new(RunEnd::without_a_run(
        Outcome::InternalError,
        EXIT_INTERNAL,
        0.0,
        &error,
    ))));
    EXIT_INTERNAL
}

/// The `run_start` of a run whose job never started (it could not be
/// executed, or oomguard failed before it): the log still opens with what
/// was asked for, so `report` and `replay` can say which command failed.
/// `pid` is 0: there was no job.
fn start_without_a_job(log: &mut LogWriter, cfg: &Settings) {
    let start = RunStart {
        argv: cfg
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid: 0,
        ceilings: Vec::new(),
        cgroup: None,
        policy: Some(crate::sinks::log::PolicyInfo::of(&cfg.policy.policy)),
        gpu: GpuInfo {
            available: false,
            reason: Some("the job did not start".into()),
        },
        version: env!("CARGO_PKG_VERSION").to_string(),
        interval_seconds: cfg.interval.as_secs_f64(),
        pss_interval_seconds: cfg.pss_interval.as_secs_f64(),
        every_tick: cfg.run.log_every_tick,
        ids: Some(crate::sinks::metrics::run_ids()).filter(|ids| !ids.is_empty()),
    };
    log.write(&Event::RunStart(Box::new(start)));
}

fn spawn_failed(log: &mut LogWriter, cfg: &Settings, e: &supervise::SpawnError) -> i32 {
    let Some(code) = e.exit_code() else {
        return internal_failure(log, cfg, e.to_string());
    };
    eprintln!("oomguard: {e}");
    start_without_a_job(log, cfg);
    log.write(&Event::RunEnd(Box::new(RunEnd::without_a_run(
        Outcome::Exited,
        code,
        0.0,
        &e.to_string(),
    ))));
    code
}

impl Supervisor {
    /// `attach`: the watched process is not our child, so its end is seen
    /// here (gone, or its pid reused; for a job that is its cgroup's
    /// members, the cgroup empty), not by the reaper.
    fn check_attached_target(&mut self) {
        if self.target.is_parent() || self.child.status().is_some() {
            return;
        }
        if let Some(empty) = self.attached_cgroup_empty() {
            if empty {
                self.attached_job_ended("the job's cgroup has no processes left".to_string());
            }
            return;
        }
        let path = self
            .cfg
            .proc_root
            .join(self.child.pid().to_string())
            .join("stat");
        let same = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| crate::engine::probe::proc::parse_stat(&t))
            .is_some_and(|st| st.start_time == self.child.job().start_time && st.state != 'Z');
        if !same {
            self.attached_job_ended(format!("pid {} has ended", self.child.pid()));
        }
    }

    /// The attached job is over; its exit code is unknown (not our child).
    fn attached_job_ended(&mut self, why: String) {
        self.child.ended(Status::Exited(0));
        let exit = ChildExit {
            pid: self.child.pid(),
            code: None,
            signal: None,
        };
        self.sinks.emit(&Event::ChildExit(exit));
        self.say(why);
    }

    /// Run time now, in seconds (the log's `t`).
    fn run_t(&self) -> f64 {
        self.run_time().as_secs_f64()
    }

    fn run_time(&self) -> Duration {
        crate::vocab::clock::since(self.sinks.started())
    }

    /// oomguard's own message: on stderr, or in the dashboard's events pane
    /// while the dashboard owns the terminal.
    fn say(&mut self, text: String) {
        self.sinks.say(text);
    }

    fn write_run_start(&mut self, not_owned_reason: Option<String>, memory_high: Option<u64>) {
        let sample = self.sample(false);
        let cgroup = self.sampler.cgroup().map(|c| CgroupInfo {
            version: c.location().version.number(),
            path: c.location().path.clone(),
            owned: c.owned(),
            not_owned_reason: not_owned_reason.clone(),
            via: self.child.owned().map(|o| o.via().to_string()),
            scope: self.child.owned().and_then(|o| o.scope()).map(String::from),
            exclusive: c.owned() || self.attached_exclusive(),
            not_exclusive_reason: self
                .target
                .attached()
                .and_then(|a| a.not_exclusive_reason.clone()),
            memory_high_bytes: memory_high,
        });
        self.sinks.stats_mut().footprint_is_working_set =
            cgroup.as_ref().is_some_and(|c| c.exclusive);
        let start = RunStart {
            argv: self
                .cfg
                .argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            pid: self.child.pid(),
            ceilings: sample.ceilings().iter().map(|c| c.ceiling).collect(),
            cgroup,
            policy: Some(crate::sinks::log::PolicyInfo::of(self.core.policy())),
            gpu: self.sampler.gpu_info().clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            interval_seconds: self.cfg.interval.as_secs_f64(),
            pss_interval_seconds: self.cfg.pss_interval.as_secs_f64(),
            every_tick: self.cfg.run.log_every_tick,
            ids: Some(crate::sinks::metrics::run_ids()).filter(|ids| !ids.is_empty()),
        };
        self.sinks
            .emit_at(sample.t, &Event::RunStart(Box::new(start)));
        self.core.keep_sample(sample);
    }

    /// The next moment the loop must wake without being woken: the tick,
    /// the cheap loop's read, the kill deadline, a hook's, a restart's or
    /// an `attach` watch's end.
    fn next_wake(&self) -> Instant {
        let mut wake = self.wakeups.next();
        if let Some(k) = self.core.act().kill_deadline() {
            wake = wake.min(k);
        }
        if self.child.status().is_some() {
            wake = wake.min(crate::vocab::clock::now() + Duration::from_millis(50));
        }
        if let Some(d) = self.child.hooks().next_deadline() {
            wake = wake.min(d);
        }
        if let Some(r) = self.attempts.relaunch_at() {
            wake = r;
        }
        if let Some(w) = self.watch_deadline() {
            wake = wake.min(w);
        }
        wake
    }

    /// The cheap loops follow this tick's limit and working set, and the
    /// job's `/dev/shm` while it is a ceiling.
    fn pace_cheap_loop(&mut self, now: Instant) {
        let levels = self.core.wake_levels();
        let last = self.core.last_sample();
        let cg = last.and_then(|s| s.cgroup.as_ref());
        if let (Some(reader), Some(cg)) = (self.sampler.cgroup(), cg) {
            self.wakeups
                .pace_cheap_loop(reader, cg, &levels, self.cfg.interval, now);
        }
        let shm = last.and_then(|s| {
            let shm = s.shm.filter(|m| m.is_ceiling(s.system.mem_total_bytes))?;
            Some((self.sampler.shm_path()?, shm))
        });
        self.wakeups
            .pace_shm_loop(shm, &levels, self.cfg.interval, now);
    }

    /// A wake-up the kernel would not arm, said once (unless `--quiet`).
    fn not_armed(&mut self, refused: Option<wakeups::Refused>) {
        if let Some(r) = refused
            && !self.cfg.quiet
        {
            self.say(format!(
                "{} could not be armed ({}); polling covers it",
                r.what, r.why
            ));
        }
    }

    fn on_timer(&mut self) {
        let now = crate::vocab::clock::now();
        let cheap = self.wakeups.cheap_loop_moved(now);
        self.reap();
        if self.core.act().kill_due(now) {
            self.kill_tree("--kill-after expired");
        }
        self.expire_hooks(now);
        self.check_watch_time(now);
        if self.wakeups.tick_due(now) && !self.attempts.between() {
            self.wakeups.count_timer(cheap);
            let full = self.wakeups.full_due(now);
            self.tick(!full);
        }
    }

    /// One tick: sample, derive, decide, act, record.
    fn tick(&mut self, quick: bool) {
        // Progress read since the last tick (the relay hands over only
        // what cannot wait) and what is in the pipes now, so the sample
        // and any stop name the newest.
        self.take_ready_output();
        self.reap();
        self.check_attached_target();
        let now = crate::vocab::clock::now();
        let quick = quick && !self.core.needs_full_scan();
        if !quick {
            self.wakeups.full_scan_ran(now, self.cfg.interval);
        }
        let mut sample = self.sample(quick);
        self.core
            .act_mut()
            .prune(self.sampler.tree(), self.child.sig());
        let node = self.node_exchange(&mut sample, now);
        let stopping = self.core.act().stop().is_some();
        if !quick {
            self.oom.remember(&sample);
        }
        self.check_oom_kills(&sample);
        let inputs = TickInputs {
            now,
            ending: self.child.status().is_some() || self.child.shutdown_signal().is_some(),
            job_pid: self.child.pid(),
            gpu_eta: self.fresh_gpu_eta(&sample),
            torch_fragmentation: self.torch_fragmentation(&sample),
            last_attempt: self.attempts.is_last(now),
            node,
        };
        let out = self.core.tick(
            sample,
            inputs,
            self.child.sig_mut(),
            self.sinks.notifier_mut(),
        );
        self.node_decided(stopping, node);
        // A step of a stop in progress (a throttle, the last-resort freeze,
        // a kill) is an action too, though no rule decided it this tick.
        let acting = self.core.act().acting();
        // The sample first: the rule and action lines it led to follow it,
        // so the log's `t` never runs backwards. The core keeps the sample
        // as the previous one; the sinks borrow it.
        if let Some(sample) = self.core.take_last_sample() {
            self.record(
                &sample,
                &out.view,
                out.decided || acting,
                out.waits_changed,
                Some(&out.readings),
            );
            self.core.keep_sample(sample);
        }
        // Whether a stop would save is worth saying only where one can come.
        let can_stop = self
            .core
            .policy()
            .rules
            .iter()
            .any(|r| r.action.is_critical());
        if can_stop {
            let (tree, pid) = (self.sampler.tree(), self.child.pid());
            if self
                .output
                .progress()
                .current()
                .is_some_and(|p| p.step.is_some())
            {
                self.core
                    .act_mut()
                    .check_stop_saves(tree, pid, self.child.sig());
            }
            self.core
                .act_mut()
                .check_framework(now, tree, pid, self.child.sig());
        }
        self.doctor_watch();
        self.acted(Some(&out.view));
        self.pace_cheap_loop(now);
        let every = self.core.cadence(&out.view, self.cfg.interval);
        self.wakeups.schedule(now, every, self.cfg.interval);
        self.core.keep_view(out.view);
    }

    /// The fullest GPU's ETA, from fresh readings only (a carried one
    /// would flatten the trend).
    fn fresh_gpu_eta(&mut self, sample: &Sample) -> Option<f64> {
        if sample.gpus.is_empty() || sample.gpus.iter().any(|g| g.age_seconds.is_some()) {
            return None;
        }
        self.sampler.gpu_eta(sample)
    }

    /// The largest reserved-but-unallocated CUDA memory of any tree
    /// process (with `--torch-stats`).
    fn torch_fragmentation(&self, sample: &Sample) -> Option<f64> {
        self.sampler.torch_injector().map(|_| {
            sample
                .procs
                .iter()
                .filter_map(|p| p.torch.as_deref())
                .map(crate::engine::probe::torch_stats::total_fragmentation_bytes)
                .max()
                .unwrap_or(0) as f64
        })
    }

    /// `force`: a rule or action happened (the line is logged, with the
    /// per-process detail); `waits_changed`: a rule began or ended its `for`
    /// wait (the line is logged). `readings`: what the policy saw (the
    /// inputs a replay cannot derive are logged).
    fn record(
        &mut self,
        sample: &Sample,
        view: &View,
        force: bool,
        waits_changed: bool,
        readings: Option<&Readings>,
    ) {
        if self.began_to_exit() {
            self.output.progress_mut().freeze();
        }
        if let Some(n) = view.nearest
            && self.output.progress().current().is_some()
        {
            let unread = (sample.procs.iter())
                .filter(|p| p.role != Role::Worker && p.read_age_seconds.is_none())
                .count();
            self.output.progress_mut().unread(unread);
            if let Some(flag) = self
                .output
                .progress_mut()
                // The job's own footprint: under the system ceiling the
                // ceiling's usage is the whole machine's. At the time it
                // was read, which a slow tick's sampling puts well before
                // this line.
                .observe_memory(
                    sample.tree.footprint_bytes,
                    Some(n.headroom_bytes),
                    sample.t,
                )
            {
                let event = crate::sinks::log::PhaseMemoryEvent::new(&flag);
                let advice = event.advice.clone();
                self.sinks.emit_at(sample.t, &Event::PhaseMemory(event));
                if !self.cfg.quiet {
                    self.say(advice);
                }
            }
            self.publish_progress();
        }
        let inputs = readings.map(|r| (self.core.policy(), r));
        let paused = !self.core.act().paused().is_empty();
        self.sinks.set_watching(self.core.watching());
        self.sinks
            .sample(sample, view, force || waits_changed, force, inputs, paused);
    }

    /// Signals processes by identity; returns the pids reached and the
    /// first error, if any.
    fn signal_all(&mut self, targets: &[Ident], sig: i32) -> (Vec<u32>, String) {
        signal_all(self.child.sig_mut(), targets, sig)
    }

    fn idents(&self, pred: impl Fn(&ProcSample) -> bool) -> Vec<Ident> {
        idents(self.sampler.tree(), pred)
    }

    /// Hands what the actuator did to the sinks (`view`: this tick's, for
    /// the hooks' environment). True when a signal was sent or a rule
    /// moved: the tick's sample line then carries the process list.
    fn acted(&mut self, view: Option<&View>) -> bool {
        let mut any = false;
        for a in self.core.act_mut().drain() {
            any |= matches!(a, Acted::Action { .. } | Acted::Rule(_));
            match a {
                Acted::Action {
                    action,
                    reason,
                    pids,
                    signal,
                    result,
                } => (self.sinks).emit(&sinks::action(action, &reason, pids, signal, result)),
                Acted::Say(text) => self.say(text),
                Acted::Checkpoint {
                    path,
                    waited_seconds,
                } => {
                    self.sinks
                        .emit(&Event::Checkpoint(crate::sinks::log::CheckpointEvent {
                            confirmed: path.is_some(),
                            path: path.clone(),
                            waited_seconds,
                        }));
                    if let Some(p) = path {
                        self.attempts.saved(p);
                    }
                }
                Acted::GaveUp => self.core.gave_up(),
                Acted::Requested { id, kind, reason } => self.log_request(id, kind, &reason),
                Acted::Companion(r) => self.companion_said(r),
                Acted::Fault { id, fault } => {
                    self.sinks
                        .emit(&Event::Fault(crate::sinks::log::FaultEvent {
                            id,
                            remote: false,
                            node: None,
                            cause_rank: fault.cause_rank,
                            reason: Some(fault.reason),
                            detail: Some(fault.detail),
                            then: fault.then,
                        }));
                }
                Acted::Rule(r) => self.sinks.emit(&Event::Rule(r)),
                Acted::Hook {
                    cmd,
                    action,
                    reason,
                } => self.run_hook(&cmd, action, &reason, view),
            }
        }
        any
    }

    fn pause(&mut self, reason: &str) {
        self.core
            .act_mut()
            .pause(reason, self.sampler.tree(), self.child.sig_mut());
        self.acted(None);
    }

    fn resume(&mut self, reason: &str) {
        self.core.act_mut().resume(reason, self.child.sig_mut());
        self.acted(None);
    }

    fn begin_stop(&mut self, action: Action, reason: &str) {
        let (tree, job_pid) = (self.sampler.tree(), self.child.pid());
        let now = crate::vocab::clock::now();
        (self.core).begin_stop((action, reason), tree, job_pid, now, self.child.sig_mut());
        self.acted(None);
    }

    fn run_hook(&mut self, cmd: &str, action: Action, reason: &str, view: Option<&View>) {
        use std::process::{Command, Stdio};
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(cmd).stdin(Stdio::null());
        {
            use std::os::unix::process::CommandExt;
            // Its own group: signals forwarded to the job's group never
            // reach the hook, nor the other way round.
            c.process_group(0);
        }
        c.env("OOMGUARD_EVENT", "action")
            .env("OOMGUARD_ACTION", action.name())
            .env("OOMGUARD_RULE", reason)
            .env("OOMGUARD_JOB_PID", self.child.pid().to_string());
        if let Some(n) = view.and_then(|v| v.nearest) {
            c.env("OOMGUARD_HEADROOM_BYTES", n.headroom_bytes.to_string())
                .env(
                    "OOMGUARD_HEADROOM_PERCENT",
                    format!("{:.2}", n.headroom_percent()),
                )
                .env("OOMGUARD_CEILING_BYTES", n.ceiling.bytes.to_string())
                .env("OOMGUARD_CEILING_SOURCE", n.ceiling.source.as_str());
        }
        if let Some(eta) = view.and_then(|v| v.eta_seconds) {
            c.env("OOMGUARD_ETA_SECONDS", format!("{eta:.1}"));
        }
        if let Some(p) = &self.cfg.log {
            c.env("OOMGUARD_LOG", p);
        }
        match self.child.host().run_hook(c) {
            Ok(pid) => {
                self.sampler.exclude(pid);
                self.child
                    .hooks_mut()
                    .started(pid, cmd.to_string(), crate::vocab::clock::now());
            }
            Err(e) => self.say(format!("cannot run hook '{cmd}': {e}")),
        }
    }

    fn expire_hooks(&mut self, now: Instant) {
        for pid in self.child.hooks_mut().overdue(now) {
            let _ = self.child.sig_mut().signal_group(pid, SIG_KILL);
            self.say(format!(
                "hook (pid {pid}) took longer than {}s; killed",
                hooks::HOOK_TIMEOUT.as_secs()
            ));
        }
    }

    fn reap(&mut self) {
        for r in self.child.host().reap() {
            // A reaped pid is free for anyone: no longer left out of the
            // tree (a hook's, an old output keeper's).
            self.sampler.include(r.pid);
            if self.child.hooks_mut().finished(r.pid).is_some() {
                continue;
            }
            if r.pid == self.child.pid() && self.child.status().is_none() {
                self.child.ended(r.status);
                let (code, signal) = match r.status {
                    Status::Exited(c) => (Some(c), None),
                    Status::Signaled(s) => (None, Some(supervise::signal_name(s))),
                };
                self.sinks.emit(&Event::ChildExit(ChildExit {
                    pid: r.pid,
                    code,
                    signal,
                }));
                self.on_main_exit();
            }
        }
    }

    /// The main process is gone: whatever it left behind is stopped (its
    /// memory and GPU would otherwise outlive the job), then oomguard exits.
    fn on_main_exit(&mut self) {
        if !self.target.is_parent() {
            return;
        }
        self.refresh_tree();
        // A stop or a kill already under way deals with the rest.
        if self.sampler.tree().is_empty()
            || self.core.act().stop().is_some()
            || self.core.act().killed()
        {
            return;
        }
        if !self.cfg.quiet {
            self.say(format!(
                "the job's main process exited; stopping {} process(es) it left behind",
                self.sampler.tree().len()
            ));
        }
        let rest = self.idents(|_| true);
        let (pids, result) = self.signal_all(&rest, SIG_TERM);
        self.signal_all(&rest, SIG_CONT);
        self.sinks.emit(&sinks::action(
            crate::sinks::log::ActionKind::Stop,
            "left behind by the job's main process",
            pids,
            Some(SIG_TERM),
            result,
        ));
        self.core
            .act_mut()
            .arm_kill_after(crate::vocab::clock::now());
    }

    /// Starts an output keeper for the dashboard's pty: if oomguard dies,
    /// the job's output goes to the terminal rather than failing.
    pub(super) fn keep_pty(&mut self) {
        match self.screen.keep_pty() {
            Some(Ok(pid)) => self.sampler.exclude(pid),
            Some(Err(e)) => {
                let e = crate::job::relay::OutputError::Keeper(e);
                self.say(e.to_string());
            }
            None => {}
        }
    }

    fn refresh_tree(&mut self) {
        self.sampler.refresh(self.target.attached());
    }

    fn sample(&mut self, quick: bool) -> Sample {
        self.sampler.sample(quick, self.target.attached())
    }

    fn on_signal(&mut self, sig: i32) {
        if sig == libc::SIGHUP {
            // A hangup brings more than one SIGHUP (the kernel's, then the
            // shell's to its jobs): once it is handled, the rest are its
            // echo, not something for the job.
            if self.screen.hung_up() {
                return;
            }
            // The dashboard's terminal went away (not a HUP sent by hand);
            // with --on-hangup detach a dashboard's SIGHUP is that hangup
            // even before the terminal reports it.
            let detach = self.cfg.tui.on_hangup == crate::settings::cli::OnHangup::Detach;
            if self.screen.is_open() && (self.screen.terminal_hung_up() || detach) {
                self.on_hangup();
                return;
            }
        }
        // What the companion said since the last tick: a job that signals
        // between two ticks still has its hello read.
        self.core.act_mut().poll_channel(crate::vocab::clock::now());
        self.acted(None);
        let starts_shutdown = match signals::plan(sig, self.standing(), &self.cfg.on_signal) {
            SignalPlan::Ignore => return,
            SignalPlan::EndWatch => {
                // Anything oomguard paused is given back first.
                self.end_watch(format!("{} received", supervise::signal_name(sig)));
                self.child.shutting_down(sig);
                return;
            }
            SignalPlan::CancelRestart => {
                self.attempts.cancel();
                self.child.shutting_down(sig);
                if !self.cfg.quiet {
                    self.say(format!(
                        "{} received; not restarting",
                        supervise::signal_name(sig)
                    ));
                }
                return;
            }
            SignalPlan::Kill => {
                self.kill_tree("second interrupt");
                return;
            }
            SignalPlan::Save { exit } => {
                self.save_for_signal(sig, exit);
                return;
            }
            SignalPlan::AlreadySaving => {
                self.already_saving(sig);
                return;
            }
            SignalPlan::Forward { starts_shutdown } => starts_shutdown,
        };
        if matches!(sig, libc::SIGUSR1 | libc::SIGUSR2) && self.child.status().is_none() {
            // A scheduler's warning that asks for a save no companion can
            // make (none has spoken: a job still loading, or one that does
            // not load it).
            let asks_save = self.cfg.on_signal.get(sig)
                == Some(crate::settings::values::SignalAction::CheckpointAndExit);
            self.forward_user_signal(sig, asks_save);
            return;
        }
        let (pids, result) = self.forward(sig);
        if starts_shutdown {
            if self.child.foreground() {
                supervise::reclaim_foreground(std::io::stdin().as_fd());
                self.child.left_foreground();
            }
            let why = format!("{} received", supervise::signal_name(sig));
            self.begin_shutdown(&why, pids, sig, result);
            // From this signal on, whatever the clock said before.
            self.core
                .act_mut()
                .rearm_kill_after(crate::vocab::clock::now());
        }
    }

    /// The job was told to end by `sig` (passed on from the user, or its
    /// terminal's hangup): logged as a stop, anything oomguard paused let
    /// run (a paused job cannot handle the signal), `sig` remembered (the
    /// same one again kills), and the `--kill-after` clock started.
    fn begin_shutdown(&mut self, why: &str, pids: Vec<u32>, sig: i32, result: String) {
        self.sinks.emit(&sinks::action(
            crate::sinks::log::ActionKind::Stop,
            why,
            pids,
            Some(sig),
            result,
        ));
        self.core.act_mut().unpause(self.child.sig_mut());
        self.child.shutting_down(sig);
        self.core
            .act_mut()
            .arm_kill_after(crate::vocab::clock::now());
    }

    /// Whether the job was told to end, or its main process did: from
    /// then on its memory is a teardown's, not training's.
    fn began_to_exit(&self) -> bool {
        self.child.status().is_some()
            || self.core.act().stop().is_some()
            || self.core.act().policy_end().is_some()
            || self.core.act().signal_end().is_some()
            || self.child.shutdown_signal().is_some()
            || self.screen.typed_interrupt()
    }

    /// Where the run stands for a signal's decision (`signals.rs`).
    fn standing(&self) -> signals::Standing {
        signals::Standing {
            forwards: self.target.forwards_signals(),
            between_attempts: self.attempts.between(),
            shutdown_signal: self.child.shutdown_signal(),
            companion: self.core.act().can_ask(),
            saving: self.core.act().saving(),
        }
    }

    /// Forwards a signal to the job as a terminal would: to its process
    /// group, or to every tree process once the group is gone. Returns the
    /// pids reached (the group's leader for the group) and the result.
    fn forward(&mut self, sig: i32) -> (Vec<u32>, String) {
        let pid = self.child.pid();
        if self.child.status().is_none() && self.child.sig_mut().signal_group(pid, sig).is_ok() {
            return (vec![self.child.pid()], "ok".into());
        }
        self.refresh_tree();
        let all = self.idents(|_| true);
        self.signal_all(&all, sig)
    }

    fn kill_tree(&mut self, why: &str) {
        if self.core.act().cfg().may_kill {
            self.refresh_tree();
        }
        let group = self.child.status().is_none().then_some(self.child.pid());
        self.core.act_mut().kill(
            why,
            self.sampler.tree(),
            group,
            crate::vocab::clock::now(),
            self.child.sig_mut(),
        );
        self.acted(None);
    }
}
