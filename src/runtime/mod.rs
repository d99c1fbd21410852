//! `oomguard run` and `attach`: the supervision loop, and the
//! `Supervisor` that wires its parts together.
//!
//! The parts: the sampler (`sampler.rs`) reads one sample; the core
//! (`tick.rs`) derives the view, runs the pure policy engine and drives the
//! actuator (`act.rs`, signals behind the `Signaller` trait); what was done
//! goes out through the sinks (`sinks.rs`). `setup.rs` opens everything
//! before the job starts and runs the `select!` loop. What stays here is
//! what needs the child process itself: reaping, forwarding signals, the
//! job's output events, restarts and the ending.
//!
//! One task on a current-thread runtime owns everything that changes state.
//! The other threads only measure (the PSS sweeper, NVML). Keeping every
//! `waitpid` and every signal in this one place is what makes the reaper
//! safe (nothing else waits for our children) and the log ordered.
//!
//! Near a ceiling the loop speeds up: the cheap counters are polled every
//! 20–250 ms instead of every `--interval`, and on cgroup v1 the kernel
//! wakes the loop the moment usage crosses the warn and critical levels.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use crate::log::{CgroupInfo, ChildExit, GpuInfo, LogWriter, Outcome, Peak, RunEnd, RunStart};
use crate::model::{ProcSample, Sample, View};
use crate::policy::{Action, Readings};
use crate::probe::cgroup::{self, OwnedCgroup, Threshold};
use crate::probe::output::{JobStdio, OutputRelay, OutputScanner, Pumped};
use crate::restart::Budget;
use crate::supervise::{self, Job, SpawnSpec, Status};
use crate::units::{HumanBytes, human_duration};

mod act;
mod attach;
mod channel;
mod cheap;
mod oom;
mod sampler;
mod setup;
mod sinks;
mod tick;

use act::{
    ActConfig, Acted, Ident, ProcSignaller, SIG_CONT, SIG_KILL, SIG_TERM, idents, signal_all,
};
use sampler::Sampler;
use sinks::Sinks;
use tick::{Core, FAST, TickInputs};

/// Exit code when oomguard's policy ended the job (EX_TEMPFAIL: requeue).
pub const EXIT_POLICY: i32 = 75;
/// Exit code when the job succeeded but its peak footprint exceeded
/// `--fail-above` (a memory regression).
pub const EXIT_FAIL_ABOVE: i32 = 76;
/// Exit code for oomguard's own failure after the job started.
pub const EXIT_INTERNAL: i32 = 70;
/// Exit code when the job succeeded but its output could not all be
/// written where oomguard's went (EX_IOERR: a full disk, an I/O error; a
/// reader that went away is not one).
pub const EXIT_OUTPUT_LOST: i32 = 74;

/// The settings of one supervised job (`settings::Settings`), under the
/// name the loop has always used.
pub use crate::settings::Settings as RunConfig;

/// Runs the job under supervision and returns oomguard's exit code.
pub fn run(cfg: RunConfig) -> i32 {
    let log = cfg.log.clone();
    let started = Instant::now();
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match build_runtime() {
            Ok(rt) => rt.block_on(setup::supervise_job(cfg)),
            Err(e) => {
                eprintln!("oomguard: cannot start the runtime: {e}");
                EXIT_INTERNAL
            }
        }));
    match outcome {
        Ok(code) => code,
        Err(payload) => {
            let what = panic_text(payload.as_ref());
            eprintln!("oomguard: internal error: {what}");
            if let Some(path) = log {
                crate::log::end_after_failure(
                    &path,
                    started,
                    &format!("oomguard panicked: {what}"),
                );
            }
            EXIT_INTERNAL
        }
    }
}

/// The loop's runtime. With almost no file descriptors left, tokio's
/// signal driver panics instead of failing: that panic becomes the error
/// it stands for, and the report meant for bugs (location, backtrace) is
/// not printed. oomguard has no other thread yet, so swapping the panic
/// hook for this moment silences nothing else.
fn build_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let built = std::panic::catch_unwind(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    });
    std::panic::set_hook(hook);
    built.unwrap_or_else(|payload| Err(std::io::Error::other(panic_text(payload.as_ref()))))
}

/// What a panic said.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// The forwarded signals: (signal, whether it starts oomguard's shutdown:
/// the `--kill-after` clock). HUP and QUIT are only passed on; a job may
/// handle them and go on.
const FORWARDED: [(i32, bool); 6] = [
    (libc::SIGINT, true),
    (libc::SIGTERM, true),
    (libc::SIGHUP, false),
    (libc::SIGQUIT, false),
    (libc::SIGUSR1, false),
    (libc::SIGUSR2, false),
];

/// Hooks are killed after this long.
const HOOK_TIMEOUT: Duration = Duration::from_secs(30);

struct Supervisor {
    cfg: RunConfig,
    /// Where everything the run reports goes (log, metrics, GitHub,
    /// dashboard state, stderr, notifications) and the run's totals.
    sinks: Sinks,
    /// The readers and the tree of the last scan.
    sampler: Sampler,
    started: Instant,
    owned: Option<OwnedCgroup>,
    job: Job,
    /// The engine, the history and what oomguard holds (pause, the stop
    /// ladder, the kill).
    core: Core,
    sig: ProcSignaller,
    foreground: bool,
    main_status: Option<Status>,
    /// The INT or TERM that started the shutdown, if one did.
    shutdown_signal: Option<i32>,
    /// oomguard stopped waiting for a reader to take the job's last
    /// output (see `drain_output`).
    output_abandoned: bool,
    helpers: supervise::Helpers,
    hook_deadlines: HashMap<u32, Instant>,
    next_tick: Instant,
    next_full: Instant,
    thresholds: Vec<AsyncFd<Threshold>>,
    /// The cheap loop over the limit's usage counter, where no kernel
    /// threshold watches it (`cheap.rs`).
    cheap: Option<cheap::CheapLoop>,
    /// PSI trigger and cgroup v2 `memory.events` (POLLPRI wake-ups).
    pri_wakes: Vec<AsyncFd<crate::probe::system::PriWake>>,
    /// 1-based attempt number.
    attempt: u32,
    attempt_started: Instant,
    budget: Budget,
    /// Environment changes for the next attempts (degradation).
    env: BTreeMap<String, String>,
    /// The newest known checkpoint.
    checkpoint: Option<PathBuf>,
    /// When the next attempt starts (between attempts).
    relaunch_at: Option<Instant>,
    restart_limit: bool,
    /// One line per finished attempt, for the summary.
    attempts: Vec<String>,
    /// Restarts so far (never reset, unlike the budget).
    restarts: u32,
    /// A relaunch failed: no more attempts.
    no_more_attempts: bool,
    /// The kernel's OOM kills: counters and the memory history that
    /// explains them.
    oom: oom::OomWatch,
    gpu_info: GpuInfo,
    /// `attach`: the job's cgroup, and how the watch ends.
    attached: Option<attach::Attached>,
    /// The live dashboard, its state, and the job's pty (the dashboard owns
    /// the real terminal; the job gets a terminal of its own).
    tui: Option<crate::tui::Tui>,
    pty: Option<crate::tui::PtyMaster>,
    /// Holds the dashboard's pty in case oomguard dies (see `keeper`).
    pty_keeper: Option<crate::keeper::Keeper>,
    /// A warning rule is firing (for the dashboard's state).
    warning: bool,
    /// The dashboard's terminal hung up (handled once).
    hung_up: bool,
    /// oomguard itself failed after the job started (exit 70).
    internal_error: Option<String>,
    /// The job's stdout and stderr, passed on to where they would have gone
    /// and scanned for PyTorch's messages (not with the dashboard, whose
    /// pty output is scanned by `pty_scanner`, nor under `attach`).
    relay: Option<OutputRelay>,
    pty_scanner: OutputScanner,
    /// This attempt printed a CUDA OOM; `true` when the allocator was
    /// fragmented (reserved-but-unallocated ≥ the failed request).
    cuda_oom: Option<bool>,
    /// Training progress read from the job's output, this attempt.
    progress: crate::forensics::progress::ProgressTracker,
    /// This attempt's job printed a `worker_died` or `rank_failed` by
    /// SIGKILL while memory was at or past the warn level.
    memory_death: bool,
    /// What torchrun said about failed ranks, for the summary.
    rank_notes: Vec<String>,
    pty_log: Option<std::fs::File>,
    /// `--torch-stats`: the injected reporter (removed on drop); its
    /// reader is the sampler's.
    torch: Option<crate::probe::torch_stats::TorchStatsInjector>,
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
    streams: &mut [(i32, tokio::signal::unix::Signal)],
    shutting_down: bool,
) -> bool {
    let Some(r) = relay else { return true };
    r.finish();
    let mut progress = (r.written_bytes(), Instant::now());
    while !r.flushed() {
        if shutting_down {
            let written = r.written_bytes();
            if written != progress.0 {
                progress = (written, Instant::now());
            } else if progress.1.elapsed() >= SHUTDOWN_STALL {
                return false;
            }
        }
        tokio::select! {
            sig = recv_any(streams) => {
                if FORWARDED.iter().any(|&(s, ends)| s == sig && ends) {
                    return false;
                }
            }
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    true
}

async fn recv_any(streams: &mut [(i32, tokio::signal::unix::Signal)]) -> i32 {
    let mut futs: Vec<_> = streams
        .iter_mut()
        .map(|(sig, s)| {
            let sig = *sig;
            Box::pin(async move {
                s.recv().await;
                sig
            })
        })
        .collect();
    // A tiny select-all over a handful of futures, to avoid a dependency
    // for one call.
    std::future::poll_fn(move |cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(cx) {
                return std::task::Poll::Ready(v);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Resolves when any threshold eventfd fires (and drains it).
async fn threshold_crossed(fds: &[AsyncFd<Threshold>]) {
    if fds.is_empty() {
        return std::future::pending().await;
    }
    let mut futs: Vec<_> = fds.iter().map(|fd| Box::pin(fd.readable())).collect();
    std::future::poll_fn(move |cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(Ok(mut guard)) = f.as_mut().poll(cx) {
                let mut buf = [0u8; 8];
                let fd = guard.get_inner().eventfd.as_fd();
                match rustix::io::read(fd, &mut buf) {
                    Ok(_) => {}
                    Err(_) => guard.clear_ready(),
                }
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// What the actuator needs of the settings.
fn act_config(cfg: &RunConfig) -> ActConfig {
    ActConfig {
        checkpoint_signal: cfg.policy.checkpoint_signal,
        grace: cfg.policy.grace,
        kill_after: cfg.kill_after,
        may_kill: cfg.attach.is_none() || cfg.allow_kill,
        quiet: cfg.quiet,
        checkpoint_dir: cfg.restart.checkpoint_dir.clone(),
        checkpoint_glob: cfg.restart.checkpoint_glob.clone(),
    }
}
/// The environment every attempt gets: its number, the newest checkpoint
/// and the degraded variables.
fn attempt_env(
    attempt: u32,
    checkpoint: Option<&std::path::Path>,
    degraded: &BTreeMap<String, String>,
) -> Vec<(OsString, OsString)> {
    let mut env = vec![(
        OsString::from("OOMGUARD_ATTEMPT"),
        OsString::from(attempt.to_string()),
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

fn launch(
    cfg: &RunConfig,
    argv: &[OsString],
    env: Vec<(OsString, OsString)>,
    owned: Option<&OwnedCgroup>,
    foreground: bool,
    pty_slave: Option<&std::os::fd::OwnedFd>,
    relayed: Option<JobStdio>,
) -> Result<Job, supervise::SpawnError> {
    let stdin = std::io::stdin();
    let stdio = |fd: &std::os::fd::OwnedFd| fd.try_clone().ok().map(std::process::Stdio::from);
    let (out, err) = match relayed {
        Some(j) => (Some(j.stdout), Some(j.stderr)),
        None => (pty_slave.and_then(stdio), pty_slave.and_then(stdio)),
    };
    supervise::spawn(
        SpawnSpec {
            argv: argv.to_vec(),
            env,
            cgroup_procs: owned.map(|o| o.procs_file()),
            foreground_tty: foreground.then(|| stdin.as_fd()),
            controlling_tty: pty_slave.map(|s| s.as_fd()),
            stdin: pty_slave.and_then(stdio),
            stdout: out,
            stderr: err,
        },
        &cfg.proc_root,
    )
}

/// Identifies a running process to watch (`attach`).
fn attach_to(cfg: &RunConfig, pid: u32) -> Result<Job, String> {
    let text = std::fs::read_to_string(cfg.proc_root.join(pid.to_string()).join("stat"))
        .map_err(|e| format!("cannot attach to pid {pid}: {e}"))?;
    let st = crate::probe::proc::parse_stat(&text)
        .ok_or_else(|| format!("cannot attach to pid {pid}: unreadable /proc/{pid}/stat"))?;
    let pidfd = rustix::process::Pid::from_raw(pid as i32)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    Ok(Job {
        pid,
        start_time: st.start_time,
        pidfd,
    })
}

/// `OOMGUARD_KERNEL_WAKEUPS=off`: no v1 thresholds, PSI triggers or
/// `memory.events` wake-ups, polling only. For tests that prove the
/// wake-ups matter, and for ruling them out when debugging.
fn kernel_wakeups_disabled() -> bool {
    std::env::var("OOMGUARD_KERNEL_WAKEUPS").is_ok_and(|v| v == "off")
}

/// A victim's last minute of memory, as the `oom_kill` event carries it.
fn memory_points(points: &[(f64, u64, u64)]) -> Vec<crate::log::MemoryPoint> {
    points
        .iter()
        .map(|&(pt, rss_bytes, pss_bytes)| crate::log::MemoryPoint {
            t: (pt * 1000.0).round() / 1000.0,
            rss_bytes,
            pss_bytes,
        })
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
    tui: &crate::tui::Tui,
    app: &crate::tui::App,
) -> Result<(crate::tui::PtyMaster, std::os::fd::OwnedFd), String> {
    let (cols, rows) = tui.size().map_err(|e| e.to_string())?;
    let (c, r) = crate::tui::output_pane_size(app, cols, rows);
    let (master, slave) = crate::tui::open_pty(c, r).map_err(|e| e.to_string())?;
    let master = crate::tui::PtyMaster::new(master).map_err(|e| e.to_string())?;
    Ok((master, slave))
}

async fn pty_read(pty: Option<&crate::tui::PtyMaster>, buf: &mut [u8]) -> std::io::Result<usize> {
    match pty {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn relay_pump(relay: Option<&mut OutputRelay>) -> Pumped {
    match relay {
        Some(r) => r.pump().await,
        None => std::future::pending().await,
    }
}

async fn term_event(
    tui: Option<&mut crate::tui::Tui>,
) -> Result<crate::tui::TermEvent, crate::tui::TermError> {
    match tui {
        Some(t) => t.next_event().await,
        None => std::future::pending().await,
    }
}

/// Resolves with the index of the first POLLPRI wake source that fired.
async fn pri_woken(fds: &[AsyncFd<crate::probe::system::PriWake>]) -> usize {
    if fds.is_empty() {
        return std::future::pending().await;
    }
    let mut futs: Vec<_> = fds
        .iter()
        .map(|fd| Box::pin(fd.ready(tokio::io::Interest::PRIORITY)))
        .collect();
    std::future::poll_fn(move |cx| {
        for (i, f) in futs.iter_mut().enumerate() {
            if let std::task::Poll::Ready(Ok(mut guard)) = f.as_mut().poll(cx) {
                guard.clear_ready();
                return std::task::Poll::Ready(i);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

#[allow(unsafe_code)]
fn watch_pri(w: crate::probe::system::PriWake) -> Option<AsyncFd<crate::probe::system::PriWake>> {
    // SAFETY: `PriWake` owns its file and never replaces it, so the fd stays
    // open and the same for the whole life of the AsyncFd.
    unsafe { AsyncFd::register_with_interest(w, tokio::io::Interest::PRIORITY) }.ok()
}

#[allow(unsafe_code)]
fn watch_threshold(t: Threshold) -> Result<AsyncFd<Threshold>, ()> {
    // SAFETY: `Threshold` owns its eventfd and never replaces it, so the fd
    // stays open and the same for the whole life of the AsyncFd.
    unsafe { AsyncFd::register(t) }.map_err(|_| ())
}

/// oomguard failed after the log was opened but before the job ran: the
/// log still ends with `run_end` (`internal_error`), and the exit code is 70.
fn internal_failure(log: &mut LogWriter, cfg: &RunConfig, error: String) -> i32 {
    eprintln!("oomguard: {error}");
    start_without_a_job(log, cfg);
    log.write(
        "run_end",
        &RunEnd {
            outcome: Outcome::InternalError,
            exit_code: EXIT_INTERNAL,
            peak: Peak::default(),
            restarts: 0,
            actions: BTreeMap::new(),
            duration_seconds: 0.0,
            error: Some(error),
            fail_above: None,
            output_dropped_bytes: None,
            exit_code_known: None,
            detached_reason: None,
            still_running_pids: None,
            cheap_loop: None,
        },
    );
    EXIT_INTERNAL
}

/// The `run_start` of a run whose job never started (it could not be
/// executed, or oomguard failed before it): the log still opens with what
/// was asked for, so `report` and `replay` can say which command failed.
/// `pid` is 0: there was no job.
fn start_without_a_job(log: &mut LogWriter, cfg: &RunConfig) {
    let start = RunStart {
        argv: cfg
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid: 0,
        ceilings: Vec::new(),
        cgroup: None,
        policy: Some(crate::log::PolicyInfo::of(&cfg.policy.policy)),
        gpu: GpuInfo {
            available: false,
            reason: Some("the job did not start".into()),
        },
        version: env!("CARGO_PKG_VERSION").to_string(),
        interval_seconds: cfg.interval.as_secs_f64(),
        pss_interval_seconds: cfg.pss_interval.as_secs_f64(),
        every_tick: cfg.log_every_tick,
    };
    log.write("run_start", &start);
}

fn spawn_failed(log: &mut LogWriter, cfg: &RunConfig, e: &supervise::SpawnError) -> i32 {
    let Some(code) = e.exit_code() else {
        return internal_failure(log, cfg, e.to_string());
    };
    eprintln!("oomguard: {e}");
    start_without_a_job(log, cfg);
    log.write(
        "run_end",
        &RunEnd {
            outcome: Outcome::Exited,
            exit_code: code,
            peak: Peak::default(),
            restarts: 0,
            actions: BTreeMap::new(),
            duration_seconds: 0.0,
            error: Some(e.to_string()),
            fail_above: None,
            output_dropped_bytes: None,
            exit_code_known: None,
            detached_reason: None,
            still_running_pids: None,
            cheap_loop: None,
        },
    );
    code
}

impl Supervisor {
    /// `attach`: the watched process is not our child, so its end is seen
    /// here (gone, or its pid reused; for a job that is its cgroup's
    /// members, the cgroup empty), not by the reaper.
    fn check_attached_target(&mut self) {
        if self.cfg.attach.is_none() || self.main_status.is_some() {
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
            .join(self.job.pid.to_string())
            .join("stat");
        let same = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| crate::probe::proc::parse_stat(&t))
            .is_some_and(|st| st.start_time == self.job.start_time && st.state != 'Z');
        if !same {
            self.attached_job_ended(format!("pid {} has ended", self.job.pid));
        }
    }

    /// The attached job is over; its exit code is unknown (not our child).
    fn attached_job_ended(&mut self, why: String) {
        self.main_status = Some(Status::Exited(0));
        let exit = ChildExit {
            pid: self.job.pid,
            code: None,
            signal: None,
        };
        self.sinks.log.write("child_exit", &exit);
        self.say(why);
    }

    /// The job wrote to its terminal (the dashboard's pty).
    fn on_output(&mut self, n: std::io::Result<usize>, buf: &[u8]) {
        match n {
            Ok(n) if n > 0 => {
                if let Some(app) = self.sinks.app.as_mut() {
                    app.on_output(&buf[..n]);
                }
                if let Some(f) = self.pty_log.as_mut() {
                    use std::io::Write;
                    let _ = f.write_all(&buf[..n]);
                }
                self.pty_scanner.feed(&buf[..n]);
                self.log_output_events();
            }
            // EOF or EIO: nobody has the job's side open any more.
            _ => {
                self.pty = None;
                self.pty_keeper = None;
            }
        }
    }

    /// The job wrote to stdout/stderr (relayed), or the terminal resized.
    fn on_relay(&mut self, pumped: Pumped) {
        if pumped == Pumped::Resized && self.relaunch_at.is_none() && self.main_status.is_none() {
            // The job's pty took the terminal's new size; a pty that is
            // not a controlling terminal tells nobody, so do as a terminal
            // would.
            self.forward(libc::SIGWINCH);
        }
        self.log_output_events();
    }

    /// Logs what the job's output said (CUDA OOM, dead workers).
    fn log_output_events(&mut self) {
        let mut events = self.pty_scanner.take_events();
        if let Some(r) = self.relay.as_mut() {
            events.extend(r.take_events());
        }
        // A process reported dead: the kernel's OOM-kill counters now, not
        // at the last tick (the trainer can report a worker's death first),
        // so its kill is logged before the death and the advice knows.
        let death = events.iter().any(|e| {
            matches!(
                e,
                crate::forensics::torch::TorchEvent::WorkerDied(_)
                    | crate::forensics::torch::TorchEvent::RankFailed(_)
            )
        });
        if death {
            let sample = self.sample(true);
            self.check_oom_kills(&sample);
        }
        let critical = self.host_memory_critical();
        for event in events {
            if let crate::forensics::torch::TorchEvent::Progress(u) = event {
                if self.exact_progress() {
                    continue;
                }
                let t = self.started.elapsed().as_secs_f64();
                self.progress.update(u, t);
                self.publish_progress();
                continue;
            }
            if self.killed_by_memory(&event) {
                self.memory_death = true;
            }
            if let crate::forensics::torch::TorchEvent::CudaOom(e) = &event {
                let frag = crate::forensics::torch::is_fragmentation(e);
                self.cuda_oom = Some(self.cuda_oom.unwrap_or(false) || frag);
            }
            if let Some(mut record) = crate::log::OutputEvent::from_torch(&event, critical) {
                if let crate::log::OutputEvent::RankFailed(r) = &mut record {
                    self.note_rank_failed(r);
                }
                self.sinks.log.write(record.name(), &record);
                let t = self.started.elapsed().as_secs_f64();
                let ui = match &record {
                    crate::log::OutputEvent::CudaOom(e) => Some(crate::tui::UiEvent::CudaOom {
                        t,
                        pid: e.pid,
                        device: e.device,
                        tried_bytes: e.tried_bytes,
                    }),
                    crate::log::OutputEvent::WorkerDied(e) => {
                        Some(crate::tui::UiEvent::WorkerDied {
                            t,
                            pid: e.pid.unwrap_or(0),
                            comm: String::new(),
                            how: match (&e.signal, e.exit_code) {
                                (Some(s), _) => format!("killed by {s}"),
                                (None, Some(code)) => format!("exit code {code}"),
                                (None, None) => "exit code unknown".to_string(),
                            },
                        })
                    }
                    crate::log::OutputEvent::RankFailed(_) => None,
                };
                if let Some(ev) = ui {
                    self.sinks.ui(ev);
                }
            }
        }
        let errors = self
            .relay
            .as_mut()
            .map(|r| r.take_errors())
            .unwrap_or_default();
        for e in errors {
            let broken_pipe = matches!(
                &e,
                crate::probe::output::OutputError::Write { source, .. }
                    if source.kind() == std::io::ErrorKind::BrokenPipe
            );
            if !self.cfg.quiet && !broken_pipe {
                self.say(e.to_string());
            }
        }
    }

    /// Ties a failed rank to the kernel's `oom_kill` of the same pid, and
    /// keeps a line for the summary.
    fn note_rank_failed(&mut self, r: &mut crate::log::RankFailedEvent) {
        if r.pid.is_some_and(|p| self.oom.reported(p)) {
            r.tie_to_oom_kill();
        }
        if self.rank_notes.len() < 16 {
            self.rank_notes.push(r.describe());
        }
    }

    /// Hands the current progress to the log (and the next sample, when it
    /// moved), the metrics and the dashboard.
    fn publish_progress(&mut self) {
        let changed = self.progress.take_changed();
        let current = self.progress.current();
        self.sinks.log.set_progress(current, changed);
        self.sinks
            .metrics
            .set_progress(current.and_then(|p| p.step), current.and_then(|p| p.total));
        if let Some(app) = self.sinks.app.as_mut() {
            app.set_progress(current.cloned());
        }
    }

    /// A worker or rank killed by SIGKILL while memory was at or past the
    /// warn level: a memory-motivated death, as an OOM-kill counter rise is.
    fn killed_by_memory(&self, event: &crate::forensics::torch::TorchEvent) -> bool {
        use crate::forensics::torch::TorchEvent;
        let sigkill = match event {
            TorchEvent::WorkerDied(w) => w.signal.as_deref() == Some("SIGKILL"),
            TorchEvent::RankFailed(r) => r
                .failures
                .iter()
                .any(|f| f.signal.as_deref() == Some("SIGKILL")),
            _ => false,
        };
        let (warn, _) = self.core.engine.policy().thresholds();
        let warn = warn.unwrap_or(20.0);
        sigkill
            && self
                .core
                .last_view
                .as_ref()
                .and_then(|v| v.headroom_percent())
                .is_some_and(|h| h <= warn)
    }

    /// Whether host (or cgroup) memory is, or was at the last tick, at the
    /// critical level, or the kernel's OOM-kill count rose this attempt.
    fn host_memory_critical(&self) -> bool {
        let (_, crit) = self.core.engine.policy().thresholds();
        let crit = crit.unwrap_or(8.0);
        self.oom.struck_this_attempt()
            || self
                .core
                .last_view
                .as_ref()
                .and_then(|v| v.headroom_percent())
                .is_some_and(|h| h <= crit)
    }

    /// A key or a resize on the dashboard.
    fn on_term(&mut self, ev: Result<crate::tui::TermEvent, crate::tui::TermError>) {
        use crate::tui::{TermEvent, UiCommand};
        let ev = match ev {
            Ok(ev) => ev,
            Err(crate::tui::TermError::HangUp) => {
                self.on_hangup();
                return;
            }
            Err(e) => {
                if self.tui.as_ref().is_some_and(|t| t.hung_up()) {
                    self.on_hangup();
                    return;
                }
                // The terminal cannot be read: carry on without the dashboard.
                self.close_dashboard();
                self.say(format!("dashboard closed: {e}"));
                return;
            }
        };
        match ev {
            TermEvent::Resize { cols, rows } => {
                if let (Some(app), Some(pty)) = (&self.sinks.app, &self.pty) {
                    let (c, r) = crate::tui::output_pane_size(app, cols, rows);
                    let _ = pty.resize(c, r);
                }
            }
            TermEvent::Key(key) => {
                let Some(cmd) = self.sinks.app.as_mut().and_then(|a| a.on_key(key)) else {
                    return;
                };
                let t = self.started.elapsed().as_secs_f64();
                let alive = self.main_status.is_none() && self.core.act.stop.is_none();
                match cmd {
                    UiCommand::Interrupt => {
                        if let Some(p) = &self.pty {
                            let _ = p.interrupt();
                        }
                    }
                    UiCommand::TogglePause if alive => {
                        if self.core.act.paused.is_empty() {
                            self.pause("manual (dashboard)");
                            self.core.engine.paused_externally(t);
                        } else {
                            self.resume("manual (dashboard)");
                            self.core.engine.resumed_externally();
                        }
                    }
                    UiCommand::Stop | UiCommand::Quit { stop_job: true } if alive => {
                        self.begin_stop(Action::Stop, "manual stop (dashboard)");
                    }
                    UiCommand::Restart if alive => {
                        self.begin_stop(Action::Restart, "manual restart (dashboard)");
                    }
                    UiCommand::Quit { stop_job: false } if self.cfg.attach.is_some() => {
                        self.end_watch("detached from the dashboard".to_string());
                    }
                    UiCommand::Quit { stop_job: false } => {
                        self.close_dashboard();
                        eprintln!(
                            "oomguard: dashboard closed; the job keeps running under oomguard (pid {}); its output is discarded",
                            std::process::id()
                        );
                    }
                    _ => {}
                }
            }
        }
    }

    /// Leaves the dashboard and gives the terminal back. The pty stays
    /// open (and drained) so the job is not hung up.
    fn close_dashboard(&mut self) {
        if let Some(mut t) = self.tui.take() {
            let _ = t.restore();
        }
        self.sinks.app = None;
    }

    /// Redraws the dashboard (after every event; nothing runs while idle).
    fn draw(&mut self) {
        use crate::tui::PolicyState;
        let (Some(tui), Some(app)) = (self.tui.as_mut(), self.sinks.app.as_mut()) else {
            return;
        };
        app.set_elapsed(self.started.elapsed().as_secs_f64());
        let state = match &self.core.act.stop {
            Some(st) if st.action == Action::Restart => PolicyState::Restarting,
            Some(_) => PolicyState::Stopping,
            None if self.relaunch_at.is_some() => PolicyState::Restarting,
            None if !self.core.act.paused.is_empty() => PolicyState::Paused,
            None if self.warning => PolicyState::Warning,
            None => PolicyState::Normal,
        };
        app.set_policy_state(state);
        if tui.draw(app).is_err() {
            if tui.hung_up() {
                self.on_hangup();
            } else {
                self.close_dashboard();
            }
        }
    }

    /// The dashboard's terminal hung up (an SSH connection dropped, a window
    /// or tmux session closed). By default as for a job run from a shell:
    /// the job gets SIGHUP and the run ends (SIGKILL after `--kill-after`
    /// for a tree that outlives it). With `--on-hangup detach` oomguard goes
    /// on supervising headless. Either way the dead terminal is never read
    /// or written again.
    fn on_hangup(&mut self) {
        if self.hung_up {
            return;
        }
        self.hung_up = true;
        // First: ratatui reports a failed cleanup with `eprintln!`, which
        // panics on a dead terminal.
        crate::tui::detach_dead_terminal();
        self.close_dashboard();
        if self.cfg.tui.on_hangup == crate::cli::OnHangup::Detach {
            return;
        }
        if self.cfg.attach.is_some() {
            // Not ours to signal: end the watch as on SIGTERM.
            self.on_signal(SIG_TERM);
            return;
        }
        if self.relaunch_at.is_some() {
            self.relaunch_at = None;
            self.shutdown_signal = Some(libc::SIGHUP);
            return;
        }
        self.forward(libc::SIGHUP);
        self.sinks.action(
            "stop",
            "terminal hangup",
            vec![self.job.pid],
            Some(libc::SIGHUP),
            "ok".into(),
        );
        self.core.act.unpause(&mut self.sig);
        self.shutdown_signal = Some(libc::SIGHUP);
        if self.core.act.kill_at.is_none() {
            self.core.act.kill_at = Some(Instant::now() + self.cfg.kill_after);
        }
    }

    /// oomguard's own message: on stderr, or in the dashboard's events pane
    /// while the dashboard owns the terminal.
    fn say(&mut self, text: String) {
        self.sinks.say(text);
    }

    fn write_run_start(&mut self, not_owned_reason: Option<String>) {
        let sample = self.sample(false);
        let cgroup = self.sampler.cgroup.as_ref().map(|c| CgroupInfo {
            version: c.location().version.number(),
            path: c.location().path.clone(),
            owned: c.owned(),
            not_owned_reason: not_owned_reason.clone(),
            exclusive: c.owned() || self.attached_exclusive(),
            not_exclusive_reason: self
                .attached
                .as_ref()
                .and_then(|a| a.not_exclusive_reason.clone()),
        });
        let start = RunStart {
            argv: self
                .cfg
                .argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            pid: self.job.pid,
            ceilings: sample.ceilings().iter().map(|c| c.ceiling).collect(),
            cgroup,
            policy: Some(crate::log::PolicyInfo::of(self.core.engine.policy())),
            gpu: self.gpu_info.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            interval_seconds: self.cfg.interval.as_secs_f64(),
            pss_interval_seconds: self.cfg.pss_interval.as_secs_f64(),
            every_tick: self.cfg.log_every_tick,
        };
        self.sinks.log.write_at("run_start", sample.t, &start);
        self.core.last_sample = Some(sample);
    }

    /// Hands the cheap loop this tick's limit, levels and working set (and
    /// starts it on the first tick that has a cgroup limit). Not where a
    /// v1 threshold already watches the limit, nor with kernel wake-ups
    /// off: that switch leaves `--interval` polling alone, for the tests
    /// that prove a wake-up acted.
    fn pace_cheap_loop(&mut self, now: Instant) {
        // The switches are read once, not on every tick.
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let off = *OFF.get_or_init(|| {
            kernel_wakeups_disabled()
                || std::env::var("OOMGUARD_CHEAP_LOOP").is_ok_and(|v| v == "off")
        });
        if off || !self.thresholds.is_empty() {
            return;
        }
        let (Some(reader), Some(sample)) = (&self.sampler.cgroup, &self.core.last_sample) else {
            return;
        };
        let Some(cg) = sample.cgroup.as_ref() else {
            return;
        };
        let (Some(limit), Some(path), Some(ws)) = (
            cg.limit_bytes,
            cg.limit_path.as_deref(),
            cg.limit_working_set_bytes,
        ) else {
            return;
        };
        let levels = cheap::levels(limit, &self.core.wake_levels());
        cheap::CheapLoop::follow(
            &mut self.cheap,
            reader.usage_file(path),
            self.cfg.interval,
            (levels, ws),
            now,
        );
    }

    /// On cgroup v1, asks the kernel to wake us when usage crosses the
    /// warn, critical and last-resort levels of the cgroup ceiling.
    ///
    /// A `--budget` gets the same treatment through the cgroup oomguard
    /// owns (its usage is the job's footprint), so a fast leak cannot race
    /// past the budget between two ticks either.
    fn register_thresholds(&mut self, cg: Option<&crate::model::CgroupSample>) {
        if kernel_wakeups_disabled() {
            return;
        }
        let (Some(reader), Some(cg)) = (&self.sampler.cgroup, cg) else {
            return;
        };
        let mut targets = Vec::new();
        if let (Some(limit), Some(path)) = (cg.limit_bytes, cg.limit_path.as_deref())
            && let Some(dir) = reader.limit_dir(path)
        {
            targets.push((dir, limit));
        }
        if let Some(budget) = self.sampler.budget_bytes
            && (reader.owned() || self.attached_exclusive())
            && let Some(dir) = reader.limit_dir(&cg.path)
        {
            targets.push((dir, budget));
        }
        let mut levels = self.core.wake_levels().to_vec();
        levels.dedup();
        for (dir, ceiling) in targets {
            for &h in &levels {
                let bytes = (ceiling as f64 * (1.0 - h / 100.0)) as u64;
                let Ok(t) = Threshold::register(&dir, bytes) else {
                    return; // not permitted: polling still covers it
                };
                if let Ok(fd) = watch_threshold(t) {
                    self.thresholds.push(fd);
                }
            }
        }
    }

    /// Kernel wake-ups beyond v1 thresholds: a PSI trigger (200 ms of memory
    /// stall within 2 s) on the job cgroup's `memory.pressure` on v2, or the
    /// machine's `/proc/pressure/memory`; and `memory.events` changes of the
    /// cgroup holding the limit on v2. Best effort: polling covers the rest.
    fn register_pri_wakes(&mut self) {
        use crate::probe::cgroup::Version;
        use crate::probe::system::PriWake;
        if kernel_wakeups_disabled() {
            return;
        }
        let v2 = self
            .sampler
            .cgroup
            .as_ref()
            .filter(|c| c.location().version == Version::V2);
        let psi_path = v2
            .map(|c| c.location().dir().join("memory.pressure"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| self.cfg.proc_root.join("pressure/memory"));
        // A 2 s window: what every kernel accepts, also from non-root.
        let trigger = PriWake::psi_trigger(&psi_path, 200_000, 2_000_000);
        if let Ok(w) = trigger
            && let Some(fd) = watch_pri(w)
        {
            self.pri_wakes.push(fd);
        }
        if let Some(c) = v2 {
            let sample = c.read();
            let limit_dir = sample
                .and_then(|s| s.limit_path)
                .map(|p| c.location().mount_point.join(p.trim_start_matches('/')))
                .unwrap_or_else(|| c.location().dir());
            // The job's own cgroup too: its `high` events (memory.high, set
            // by `set_memory_high`) come the moment it passes that level.
            let mut dirs = vec![limit_dir];
            if c.owned() && !dirs.contains(&c.location().dir()) {
                dirs.push(c.location().dir());
            }
            for dir in dirs {
                if let Ok(w) = PriWake::events(&dir.join("memory.events"))
                    && let Some(fd) = watch_pri(w)
                {
                    self.pri_wakes.push(fd);
                }
            }
        }
    }

    /// On cgroup v2, sets `memory.high` of the job's owned cgroup a little
    /// above the critical level (between it and the last-resort level): a
    /// leak that races past the critical level between two ticks is slowed
    /// by the kernel (reclaim and allocation throttling, no kill) while the
    /// graceful stop runs, and the crossing raises a `high` event that
    /// wakes the loop. `OOMGUARD_MEMORY_HIGH=off`
    /// leaves it alone (for measuring; see docs/design.md).
    fn set_memory_high(&self, cg: Option<&crate::model::CgroupSample>) {
        use crate::probe::cgroup::Version;
        if std::env::var("OOMGUARD_MEMORY_HIGH").is_ok_and(|v| v == "off") {
            return;
        }
        let (Some(reader), Some(cg)) = (&self.sampler.cgroup, cg) else {
            return;
        };
        if !reader.owned() || reader.location().version != Version::V2 {
            return;
        }
        let (_, Some(crit)) = self.core.engine.policy().thresholds() else {
            return;
        };
        // Three quarters of the way from the ceiling down to the critical
        // headroom: 94 % of the ceiling with the default 8 %.
        let share = 1.0 - crit * 0.75 / 100.0;
        let mut high: Option<u64> = None;
        if let (Some(limit), Some(ws)) = (cg.limit_bytes, cg.limit_working_set_bytes) {
            // The ceiling's cgroup also holds oomguard and any siblings.
            let others = ws.saturating_sub(cg.usage_bytes.min(ws));
            let at = (limit as f64 * share) as u64;
            high = Some(at.saturating_sub(others));
        }
        if let Some(budget) = self.sampler.budget_bytes {
            let at = (budget as f64 * share) as u64;
            high = Some(high.map_or(at, |h| h.min(at)));
        }
        let Some(high) = high.filter(|h| *h > 0) else {
            return;
        };
        // Best effort: without it the wake-ups and polling still act.
        let _ = std::fs::write(
            reader.location().dir().join("memory.high"),
            high.to_string(),
        );
    }

    fn next_wake(&self) -> Instant {
        let mut wake = self.next_tick;
        if let Some(k) = self.core.act.kill_at {
            wake = wake.min(k);
        }
        if self.main_status.is_some() {
            wake = wake.min(Instant::now() + Duration::from_millis(50));
        }
        if let Some(d) = self.hook_deadlines.values().min() {
            wake = wake.min(*d);
        }
        if let Some(r) = self.relaunch_at {
            wake = r;
        }
        if let Some(w) = self.watch_deadline() {
            wake = wake.min(w);
        }
        if let Some(c) = self.cheap.as_ref().and_then(cheap::CheapLoop::due) {
            wake = wake.min(c);
        }
        wake
    }

    fn on_timer(&mut self) {
        let now = Instant::now();
        if self.cheap.as_mut().is_some_and(|c| c.check(now)) {
            self.next_tick = now;
        }
        self.reap();
        if self.core.act.kill_at.is_some_and(|k| now >= k) {
            self.kill_tree("--kill-after expired");
        }
        self.expire_hooks(now);
        self.check_watch_time(now);
        if now >= self.next_tick && self.relaunch_at.is_none() {
            let full = now >= self.next_full;
            self.tick(!full);
        }
    }

    /// One tick: sample, derive, decide, act, record.
    fn tick(&mut self, quick: bool) {
        // Progress read since the last tick (the relay hands over only
        // what cannot wait), so the sample and any stop name the newest.
        self.log_output_events();
        self.reap();
        self.check_attached_target();
        let now = Instant::now();
        let quick = quick && !self.core.needs_full_scan();
        if !quick {
            self.next_full = now + self.cfg.interval.min(Duration::from_millis(250)).max(FAST);
        }
        let sample = self.sample(quick);
        self.core.act.prune(&self.sampler.tree, &self.sig);
        if !quick {
            self.oom.remember(&sample);
        }
        self.check_oom_kills(&sample);
        let inputs = TickInputs {
            now,
            ending: self.main_status.is_some() || self.shutdown_signal.is_some(),
            job_pid: self.job.pid,
            gpu_eta: self.fresh_gpu_eta(&sample),
            torch_fragmentation: self.torch_fragmentation(&sample),
            last_attempt: !self.budget.allows(self.attempt_started.elapsed()),
        };
        let out = self
            .core
            .tick(sample, inputs, &mut self.sig, &mut *self.sinks.notifier);
        // A step of a stop in progress (a throttle, the last-resort freeze,
        // a kill) is an action too, though no rule decided it this tick.
        let acting = self.core.act.acting();
        // The sample first: the rule and action lines it led to follow it,
        // so the log's `t` never runs backwards. The core keeps the sample
        // as the previous one; the sinks borrow it.
        if let Some(sample) = self.core.last_sample.take() {
            self.record(
                &sample,
                &out.view,
                out.decided || acting,
                out.waits_changed,
                Some(&out.readings),
            );
            self.core.last_sample = Some(sample);
        }
        self.acted(Some(&out.view));
        self.pace_cheap_loop(now);
        let every = self.core.cadence(&out.view, self.cfg.interval);
        self.next_tick = now + every;
        if every >= self.cfg.interval {
            self.next_full = self.next_tick;
        }
        self.core.last_view = Some(out.view);
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
        self.torch.as_ref().map(|_| {
            sample
                .procs
                .iter()
                .filter_map(|p| p.torch.as_deref())
                .map(crate::probe::torch_stats::total_fragmentation_bytes)
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
        if let Some(n) = view.nearest
            && self.progress.current().is_some()
        {
            if let Some(flag) = self
                .progress
                // The job's own footprint: under the system ceiling the
                // ceiling's usage is the whole machine's.
                .observe_memory(sample.tree.footprint_bytes, Some(n.headroom_bytes))
            {
                let event = crate::log::PhaseMemoryEvent::new(&flag);
                self.sinks.log.write_at("phase_memory", sample.t, &event);
                let advice = event.advice;
                if !self.cfg.quiet {
                    self.say(advice);
                }
            }
            self.publish_progress();
        }
        let inputs = readings.map(|r| (self.core.engine.policy(), r));
        let paused = !self.core.act.paused.is_empty();
        self.sinks
            .sample(sample, view, force || waits_changed, force, inputs, paused);
    }

    /// Signals processes by identity; returns the pids reached and the
    /// first error, if any.
    fn signal_all(&mut self, targets: &[Ident], sig: i32) -> (Vec<u32>, String) {
        signal_all(&mut self.sig, targets, sig)
    }

    fn idents(&self, pred: impl Fn(&ProcSample) -> bool) -> Vec<Ident> {
        idents(&self.sampler.tree, pred)
    }

    /// Hands what the actuator did to the sinks (`view`: this tick's, for
    /// the hooks' environment). True when a signal was sent or a rule
    /// moved: the tick's sample line then carries the process list.
    fn acted(&mut self, view: Option<&View>) -> bool {
        let mut any = false;
        for a in self.core.act.drain() {
            any |= matches!(a, Acted::Action { .. } | Acted::Rule(_));
            match a {
                Acted::Action {
                    action,
                    reason,
                    pids,
                    signal,
                    result,
                } => self.sinks.action(action, &reason, pids, signal, result),
                Acted::Say(text) => self.say(text),
                Acted::Checkpoint {
                    path,
                    waited_seconds,
                } => {
                    self.sinks.log.write(
                        "checkpoint",
                        &crate::log::CheckpointEvent {
                            confirmed: path.is_some(),
                            path: path.clone(),
                            waited_seconds,
                        },
                    );
                    if path.is_some() {
                        self.checkpoint = path;
                    }
                }
                Acted::GaveUp => self.core.engine.reset(),
                Acted::Requested { id, kind, reason } => self.log_request(id, kind, &reason),
                Acted::Companion(r) => self.companion_said(r),
                Acted::Rule(r) => self.sinks.log.write("rule", &r),
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
            .act
            .pause(reason, &self.sampler.tree, &mut self.sig);
        self.acted(None);
    }

    fn resume(&mut self, reason: &str) {
        self.core.act.resume(reason, &mut self.sig);
        self.acted(None);
    }

    fn begin_stop(&mut self, action: Action, reason: &str) {
        let at = act::Scene {
            tree: &self.sampler.tree,
            prev: self.core.last_sample.as_ref(),
            job_pid: self.job.pid,
            now: Instant::now(),
        };
        self.core.act.begin_stop(action, reason, at, &mut self.sig);
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
            .env("OOMGUARD_JOB_PID", self.job.pid.to_string());
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
        match c.spawn() {
            Ok(child) => {
                let pid = child.id();
                drop(child); // reaped by our reaper
                self.sampler.scanner.exclude(pid);
                self.helpers.add(pid, cmd.to_string());
                self.hook_deadlines
                    .insert(pid, Instant::now() + HOOK_TIMEOUT);
            }
            Err(e) => self.say(format!("cannot run hook '{cmd}': {e}")),
        }
    }

    fn expire_hooks(&mut self, now: Instant) {
        let late: Vec<u32> = self
            .hook_deadlines
            .iter()
            .filter(|&(_, d)| now >= *d)
            .map(|(p, _)| *p)
            .collect();
        for pid in late {
            self.hook_deadlines.remove(&pid);
            let _ = supervise::signal_group(pid, SIG_KILL);
            self.say(format!(
                "hook (pid {pid}) took longer than {}s; killed",
                HOOK_TIMEOUT.as_secs()
            ));
        }
    }

    fn reap(&mut self) {
        for r in supervise::reap_all() {
            // A reaped pid is free for anyone: no longer left out of the
            // tree (a hook's, an old output keeper's).
            self.sampler.scanner.include(r.pid);
            if self.helpers.finished(r.pid).is_some() {
                self.hook_deadlines.remove(&r.pid);
                continue;
            }
            if r.pid == self.job.pid && self.main_status.is_none() {
                self.main_status = Some(r.status);
                let (code, signal) = match r.status {
                    Status::Exited(c) => (Some(c), None),
                    Status::Signaled(s) => (None, Some(supervise::signal_name(s))),
                };
                let how = match (&code, &signal) {
                    (Some(c), _) => format!("exited with {c}"),
                    (_, Some(s)) => format!("killed by {s}"),
                    _ => String::new(),
                };
                self.sinks.ui(crate::tui::UiEvent::ChildExit {
                    t: self.started.elapsed().as_secs_f64(),
                    pid: r.pid,
                    how,
                });
                self.sinks.log.write(
                    "child_exit",
                    &ChildExit {
                        pid: r.pid,
                        code,
                        signal,
                    },
                );
                self.on_main_exit();
            }
        }
    }

    /// The main process is gone: whatever it left behind is stopped (its
    /// memory and GPU would otherwise outlive the job), then oomguard exits.
    fn on_main_exit(&mut self) {
        if self.cfg.attach.is_some() {
            return;
        }
        self.refresh_tree();
        // A stop or a kill already under way deals with the rest.
        if self.sampler.tree.is_empty() || self.core.act.stop.is_some() || self.core.act.killed {
            return;
        }
        if !self.cfg.quiet {
            self.say(format!(
                "the job's main process exited; stopping {} process(es) it left behind",
                self.sampler.tree.len()
            ));
        }
        let rest = self.idents(|_| true);
        let (pids, result) = self.signal_all(&rest, SIG_TERM);
        self.signal_all(&rest, SIG_CONT);
        self.sinks.action(
            "stop",
            "left behind by the job's main process",
            pids,
            Some(SIG_TERM),
            result,
        );
        if self.core.act.kill_at.is_none() {
            self.core.act.kill_at = Some(Instant::now() + self.cfg.kill_after);
        }
    }

    /// Starts an output keeper for the dashboard's pty: if oomguard dies,
    /// the job's output goes to the terminal rather than failing.
    pub(super) fn keep_pty(&mut self) {
        let Some(pty) = &self.pty else {
            return;
        };
        let stdout = std::io::stdout();
        match crate::keeper::Keeper::spawn(&[(pty.as_fd(), stdout.as_fd())]) {
            Ok(k) => {
                self.sampler.scanner.exclude(k.pid());
                self.pty_keeper = Some(k);
            }
            Err(e) => {
                self.pty_keeper = None;
                let e = crate::probe::output::OutputError::Keeper(e);
                self.say(e.to_string());
            }
        }
    }

    fn refresh_tree(&mut self) {
        self.sampler.refresh(self.attached.as_ref());
    }

    fn sample(&mut self, quick: bool) -> Sample {
        self.sampler.sample(quick, self.attached.as_ref())
    }

    fn on_signal(&mut self, sig: i32) {
        if sig == libc::SIGHUP {
            // A hangup brings more than one SIGHUP (the kernel's, then the
            // shell's to its jobs): once it is handled, the rest are its
            // echo, not something for the job.
            if self.hung_up {
                return;
            }
            // The dashboard's terminal went away (not a HUP sent by hand);
            // with --on-hangup detach a dashboard's SIGHUP is that hangup
            // even before the terminal reports it.
            let detach = self.cfg.tui.on_hangup == crate::cli::OnHangup::Detach;
            if let Some(t) = &self.tui
                && (t.hung_up() || detach)
            {
                self.on_hangup();
                return;
            }
        }
        let ends = FORWARDED.iter().any(|&(s, ends)| s == sig && ends);
        if self.cfg.attach.is_some() {
            // Never forward to a process we did not launch: INT/TERM end
            // the watch (after giving back anything we paused).
            if ends {
                self.end_watch(format!("{} received", supervise::signal_name(sig)));
                self.shutdown_signal = Some(sig);
            }
            return;
        }
        if self.relaunch_at.is_some() {
            // Between attempts there is no job to forward to: INT/TERM
            // cancel the restart.
            if ends {
                self.relaunch_at = None;
                self.shutdown_signal = Some(sig);
                if !self.cfg.quiet {
                    self.say(format!(
                        "{} received; not restarting",
                        supervise::signal_name(sig)
                    ));
                }
            }
            return;
        }
        if ends && self.shutdown_signal == Some(sig) {
            // The same Ctrl-C / TERM again while waiting: the user means now.
            self.kill_tree("second interrupt");
            return;
        }
        let (pids, result) = self.forward(sig);
        if ends {
            let why = format!("{} received", supervise::signal_name(sig));
            self.sinks.action("stop", &why, pids, Some(sig), result);
            if self.foreground {
                supervise::reclaim_foreground(std::io::stdin().as_fd());
                self.foreground = false;
            }
            // A paused job cannot handle the signal: let it run.
            self.core.act.unpause(&mut self.sig);
            self.shutdown_signal = Some(sig);
            self.core.act.kill_at = Some(Instant::now() + self.cfg.kill_after);
        }
    }

    /// Forwards a signal to the job as a terminal would: to its process
    /// group, or to every tree process once the group is gone. Returns the
    /// pids reached (the group's leader for the group) and the result.
    fn forward(&mut self, sig: i32) -> (Vec<u32>, String) {
        if self.main_status.is_none() && supervise::signal_group(self.job.pid, sig).is_ok() {
            return (vec![self.job.pid], "ok".into());
        }
        self.refresh_tree();
        let all = self.idents(|_| true);
        self.signal_all(&all, sig)
    }

    fn kill_tree(&mut self, why: &str) {
        if self.core.act.cfg.may_kill {
            self.refresh_tree();
        }
        let group = self.main_status.is_none().then_some(self.job.pid);
        self.core.act.kill(
            why,
            &self.sampler.tree,
            group,
            Instant::now(),
            &mut self.sig,
        );
        self.acted(None);
    }

    /// When an OOM-kill counter rises, finds the kernel's report of the kill
    /// (by pid, among the processes oomguard has seen in the tree) and
    /// writes an `oom_kill` event.
    fn check_oom_kills(&mut self, sample: &Sample) {
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
    fn write_attributed_kill(&mut self, t: f64, v: &oom::Victim, why: String) {
        self.sinks.ui(crate::tui::UiEvent::OomKill {
            t,
            pid: v.pid,
            comm: v.comm.clone(),
            role: Some(v.role),
        });
        let rss = v.rss_bytes.map_or(String::new(), |b| {
            format!(", RSS {} at its last reading", HumanBytes(b))
        });
        let reason = format!(
            "{why}: attributed from the OOM-kill counter and the tree (pid {} vanished as the counter rose, the largest that did{rss}); the kernel's own report (its choice of victim, oom_score_adj, constraint) is not known",
            v.pid
        );
        let event = crate::log::OomKillEvent {
            pid: Some(v.pid),
            comm: Some(v.comm.clone()),
            role: Some(v.role.as_str().to_string()),
            place: Some(v.place.clone()),
            anon_rss_bytes: None,
            memory: memory_points(&v.memory),
            reason: Some(reason),
            ..crate::log::OomKillEvent::default()
        };
        self.sinks.log.write_at("oom_kill", t, &event);
        if !self.cfg.quiet {
            self.say(format!(
                "the kernel OOM killer killed {} (pid {}, {}), by the OOM-kill counter and the process list ({why})",
                v.comm, v.pid, v.place
            ));
        }
    }

    fn write_oom_kill(&mut self, t: f64, finding: oom::Finding) {
        let e = match finding {
            oom::Finding::Kill(e) => e,
            oom::Finding::Unexplained(why) => {
                let event = crate::log::OomKillEvent {
                    reason: Some(why),
                    ..crate::log::OomKillEvent::default()
                };
                self.sinks.log.write_at("oom_kill", t, &event);
                return;
            }
            oom::Finding::Attributed { victim, why } => {
                self.write_attributed_kill(t, &victim, why);
                return;
            }
        };
        self.sinks.ui(crate::tui::UiEvent::OomKill {
            t,
            pid: e.kill.pid,
            comm: e.comm.clone(),
            role: Some(e.role),
        });
        let event = crate::log::OomKillEvent {
            pid: Some(e.kill.pid),
            comm: Some(e.comm.clone()),
            role: Some(e.role.as_str().to_string()),
            place: Some(e.place.clone()),
            anon_rss_bytes: e.kill.anon_rss_bytes,
            constraint: e.kill.constraint.clone(),
            cgroup: e.kill.cgroup.clone(),
            kill: Some(e.kill.clone()),
            memory: memory_points(&e.memory),
            reason: None,
        };
        self.sinks.log.write_at("oom_kill", t, &event);
        if !self.cfg.quiet {
            self.say(format!(
                "the kernel OOM killer killed {} (pid {}, {}){}",
                e.comm,
                e.kill.pid,
                e.place,
                e.kill.anon_rss_bytes.map_or(String::new(), |b| format!(
                    " holding {} anonymous memory",
                    HumanBytes(b)
                ))
            ));
        }
    }

    /// Whether a kernel OOM kill leads to a restart: with
    /// `--on-critical restart` (the policy meant to restart anyway) or
    /// `--restart-on oom-kill`.
    fn restart_enabled(&self) -> bool {
        let p = self.core.engine.policy();
        self.cfg.restart.restart_on.iter().any(|k| k == "oom-kill")
            || p.after_pause == Action::Restart
            || p.rules.iter().any(|r| r.action == Action::Restart)
    }

    /// The attempt is over (the tree is empty). Decides whether to start
    /// another: after a `restart` action, or when the kernel OOM killer took
    /// part of the job and restarts are configured. Returns false when the
    /// run is over.
    fn plan_restart(&mut self) -> bool {
        // The attempt's processes are gone: the rest of its output is in the
        // channels. Read it and log what it said, in this attempt.
        if let Some(r) = self.relay.as_mut() {
            r.finish();
        }
        self.pty_scanner.finish();
        self.log_output_events();
        self.core.act.conclude_checkpoint(Instant::now());
        self.acted(None);
        let sample = self.sample(true);
        // A kill the kernel made in this attempt is logged in it, not
        // found by the next attempt's first tick.
        self.check_oom_kills(&sample);
        let end = crate::restart::AttemptEnd {
            policy_end: self.core.act.policy_end,
            stop_reason: self.core.act.stop.as_ref().map(|st| st.reason.clone()),
            kernel_killed: self.oom.kernel_killed(&sample),
            memory_death: self.memory_death,
            cuda_oom: self.cuda_oom,
            succeeded: self.main_status.unwrap_or(Status::Exited(0)) == Status::Exited(0),
        };
        self.note_attempt(&end);
        let on = |k: &str| self.cfg.restart.restart_on.iter().any(|x| x == k);
        let rules = crate::restart::RestartRules {
            on_memory: self.restart_enabled(),
            on_cuda_oom: on("cuda-oom"),
        };
        let reason =
            crate::restart::restart_reason(&end, &rules).filter(|_| self.cfg.attach.is_none());
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
                    self.cfg.restart.max_restarts
                ));
            }
            return false;
        };
        let r = self.cfg.restart.clone();
        if let Some(dir) = &r.checkpoint_dir
            && let Some((path, _, _)) = crate::restart::newest(dir, &r.checkpoint_glob, None)
        {
            self.checkpoint = Some(path);
        }
        let fragmented = reason == "CUDA out of memory" && self.cuda_oom == Some(true);
        let env = self.env.clone();
        let (changes, problems) = crate::restart::degrade_env(
            &r.degrade,
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
    fn note_attempt(&mut self, end: &crate::restart::AttemptEnd) {
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
    fn announce_restart(
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
        self.sinks.log.write(
            "restart",
            &crate::log::RestartEvent {
                reason: Some(reason.to_string()),
                checkpoint: self.checkpoint.clone(),
                degraded: changes
                    .iter()
                    .map(|(k, old, new)| (k.clone(), serde_json::json!([old, new])))
                    .collect(),
                delay_seconds: Some(delay.as_secs_f64()),
            },
        );
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
            self.cfg.restart.max_restarts + 1,
            self.checkpoint
                .as_ref()
                .map_or(String::new(), |c| format!(" from {}", c.display()))
        ));
    }

    /// Starts the next attempt.
    fn relaunch(&mut self) {
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

    fn finished(&mut self) -> bool {
        if self.cfg.attach.is_some() {
            // The watched tree is not ours to wait for: its orphans go to
            // init. Done when the watched process is (or, for a job that is
            // its cgroup's members, the last of them), or when the watch
            // ends (INT/TERM, dashboard detach, --watch-for).
            return self.main_status.is_some()
                || self.shutdown_signal.is_some()
                || self.watch_ended();
        }
        if self.main_status.is_none() {
            return false;
        }
        self.reap();
        self.refresh_tree();
        self.sampler.tree.is_empty() && self.sampler.zombie_children == 0
    }

    fn finish(mut self) -> i32 {
        // Give the terminal back before anything is printed to it.
        self.close_dashboard();
        self.pty_keeper = None;
        // The job's last bytes come before oomguard's own lines (unless
        // oomguard was told to stop waiting for them).
        if let Some(r) = self.relay.as_mut() {
            r.finish();
            if !self.output_abandoned {
                r.flush(Duration::from_secs(2));
            }
        }
        self.pty_scanner.finish();
        self.log_output_events();
        // Final now: the relay has finished and nothing more is written.
        let relay_stats = self.relay.as_ref().map(OutputRelay::stats);
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
        let status = self.main_status.unwrap_or(Status::Exited(0));
        let sample = self.sample(false);
        let view = self.core.history.push(&sample);
        self.record(&sample, &view, true, false, None);
        let kernel_killed = self.oom.kernel_killed(&sample);
        // The kernel killed a tree process and the job failed: whichever
        // process the kernel picked, that is why (unless oomguard's own
        // SIGKILL is what the job died of).
        let oom_killed = kernel_killed
            && status.code() != 0
            && !(self.core.act.killed && status == Status::Signaled(libc::SIGKILL));
        // `attach`: a watch that ended before the job did is not an exit.
        let detached = self.cfg.attach.is_some() && self.main_status.is_none();
        let (outcome, mut exit_code) = match status {
            _ if self.internal_error.is_some() => (Outcome::InternalError, EXIT_INTERNAL),
            _ if detached => (Outcome::Detached, 0),
            _ if self.restart_limit => (Outcome::RestartLimit, EXIT_POLICY),
            _ if oom_killed => (Outcome::OomKilled, status.code()),
            _ if self.core.act.policy_end.is_some() => (Outcome::StoppedByPolicy, EXIT_POLICY),
            Status::Exited(c) => (Outcome::Exited, c),
            Status::Signaled(s) => (Outcome::Signaled, 128 + s),
        };
        let duration = self.started.elapsed();
        if self.cfg.attach.is_none() {
            // Every process of the job is reaped by now (a non-parent's
            // high-water mark is not the kernel's to give).
            self.sinks.stats.peak.largest_process_rss_bytes = supervise::largest_child_rss_bytes();
        }
        let fail_above = self.cfg.fail_above.map(|limit| {
            let peak = &self.sinks.stats.peak;
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
                peak: self.sinks.stats.peak.clone(),
                restarts: self.restarts,
                actions: self.sinks.stats.actions.clone(),
                duration_seconds: (duration.as_secs_f64() * 1000.0).round() / 1000.0,
                error: self.internal_error.clone(),
                fail_above: fail_above.map(|(limit_bytes, exceeded)| crate::log::FailAbove {
                    limit_bytes,
                    exceeded,
                }),
                output_dropped_bytes: relay_stats
                    .as_ref()
                    .map(|st| st.stdout.lost_bytes() + st.stderr.lost_bytes()),
                exit_code_known: None,
                detached_reason: None,
                still_running_pids: None,
                cheap_loop: self.cheap.as_ref().map(|c| crate::log::CheapLoopStats {
                    reads: c.reads,
                    seconds: (c.read_time.as_secs_f64() * 1e6).round() / 1e6,
                }),
            },
        );
        if let Some((limit, true)) = fail_above {
            let peak = &self.sinks.stats.peak;
            let what = if peak.tree_pss_bytes > limit {
                format!(
                    "peak footprint {} exceeded --fail-above {}",
                    HumanBytes(peak.tree_pss_bytes),
                    HumanBytes(limit),
                )
            } else {
                format!(
                    "one process reached {} RSS (the kernel's high-water mark; the samples saw at most {}) and exceeded --fail-above {}",
                    HumanBytes(peak.largest_process_rss_bytes),
                    HumanBytes(peak.tree_pss_bytes),
                    HumanBytes(limit),
                )
            };
            if !self.cfg.quiet {
                eprintln!("oomguard: {what}; exit {exit_code}");
            }
            self.sinks.annotate(
                "fail_above",
                crate::github::Level::Error,
                "oomguard: memory regression",
                &what,
            );
        }
        if outcome == Outcome::OomKilled {
            self.sinks.annotate(
                "oom_kill",
                crate::github::Level::Error,
                "oomguard: OOM kill",
                "the kernel OOM killer killed the job",
            );
        }
        if self.sinks.annotator.is_some()
            && let Some(path) = crate::github::step_summary_path(std::env::vars())
        {
            let data = crate::github::RunSummaryData {
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
                attempts: self.attempt,
                peak: self.sinks.stats.peak.clone(),
                ceilings: sample.ceilings().iter().map(|c| c.ceiling).collect(),
                least_headroom_bytes: self.sinks.stats.least_headroom.map(|l| l.headroom_bytes),
                actions: self.sinks.stats.actions.clone(),
                fail_above_bytes: self.cfg.fail_above,
            };
            if let Err(e) =
                crate::github::append_step_summary(&path, &crate::github::step_summary(&data))
            {
                eprintln!("oomguard: {e}");
            }
        }
        if let Some(t) = self.sinks.textfile.take()
            && let Err(e) = t.remove()
        {
            eprintln!("oomguard: {e}");
        }
        if self.foreground {
            supervise::reclaim_foreground(std::io::stdin().as_fd());
        }
        if !self.cfg.quiet {
            self.summary(status, outcome, exit_code, duration);
        }
        drop(self.owned.take());
        exit_code
    }

    fn summary(&self, status: Status, outcome: Outcome, exit_code: i32, duration: Duration) {
        let cmd = self
            .cfg
            .argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let how = match (outcome, status) {
            (Outcome::RestartLimit, _) => format!(
                "ran out of restarts ({} of --max-restarts {}); exit {exit_code}",
                self.restarts, self.cfg.restart.max_restarts
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
            (Outcome::StoppedByPolicy, _) => format!(
                "was stopped by oomguard ({}) before the kernel OOM killer; exit {exit_code}",
                // The rule, also when the stop is over (an attached
                // trainer that checkpointed and left ends it early).
                self.core.act.policy_reason.as_deref().unwrap_or("kill")
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
        let s = &self.sinks.stats;
        match self.attach_headline(outcome, duration) {
            Some(line) => eprintln!("oomguard: {line}"),
            None => eprintln!("oomguard: '{cmd}' {how} after {}", human_duration(duration)),
        }
        if let Some(p) = self.progress.current() {
            let at = p.describe();
            if !at.is_empty() {
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
                eprintln!("oomguard: {verb} at {at}{growth}");
            }
        }
        let holder = s
            .peak_holder
            .as_ref()
            .map_or(String::new(), |(pid, comm, role, pss)| {
                format!(
                    "; largest: {comm} (pid {pid}, {}) {}",
                    role.as_str(),
                    HumanBytes(*pss)
                )
            });
        // A process that peaked between samples (a short job, a spike):
        // what the kernel recorded says more than the samples.
        let spike = if s.peak.largest_process_rss_bytes > s.peak.tree_rss_bytes {
            format!(
                "; one process reached {} RSS between samples (kernel high-water mark)",
                HumanBytes(s.peak.largest_process_rss_bytes)
            )
        } else {
            String::new()
        };
        eprintln!(
            "oomguard: peak footprint {} PSS at {:.0}s{holder}; peak RSS sum {}{spike}",
            HumanBytes(s.peak.tree_pss_bytes),
            s.peak.t,
            HumanBytes(s.peak.tree_rss_bytes),
        );
        if let Some(l) = s.least_headroom {
            eprintln!(
                "oomguard: nearest ceiling: {} {} (least headroom {}, {:.1}%); peak swap used {}",
                l.ceiling.source.as_str(),
                HumanBytes(l.ceiling.bytes),
                HumanBytes(l.headroom_bytes),
                l.headroom_percent(),
                HumanBytes(s.peak.swap_used_bytes),
            );
        }
        for note in &self.rank_notes {
            eprintln!("oomguard: {note}");
        }
        if let Some(line) = self.checkpoint_line(self.attempt_lost_work()) {
            eprintln!("oomguard: {line}");
        }
        if !s.actions.is_empty() {
            let list: Vec<String> = s.actions.iter().map(|(a, n)| format!("{a} ×{n}")).collect();
            eprintln!("oomguard: actions: {}", list.join(", "));
        }
        if self.attempts.len() > 1 {
            for a in &self.attempts {
                eprintln!("oomguard: {a}");
            }
        }
    }
}
