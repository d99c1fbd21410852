//! `oomguard run`: the supervision loop.
//!
//! One task on a current-thread runtime owns everything that changes state:
//! it reaps children on SIGCHLD, forwards signals sent to oomguard, samples
//! the tree, runs the policy engine and carries out its decisions, and walks
//! the shutdown ladder. The other threads only measure (the PSS sweeper).
//! Keeping every `waitpid` and every signal in this one place is what makes
//! the reaper safe (nothing else waits for our children) and the log
//! ordered.
//!
//! Near a ceiling the loop speeds up: the cheap counters are polled every
//! 20–250 ms instead of every `--interval`, and on cgroup v1 the kernel
//! wakes the loop the moment usage crosses the warn and critical levels.
//!
//! Stopping while memory is still growing: the trainer gets the checkpoint
//! signal and must reach a step boundary, which a data-bound trainer only
//! does with its next batch. So instead of freezing the growers outright
//! (which can deadlock the very checkpoint we wait for), the growing
//! non-trainer processes are *throttled*: held with SIGSTOP and let run for
//! a short slice every cycle, so growth slows ~10× while the pipeline still
//! delivers. Below a last-resort level everything is frozen: the kernel must
//! never be the one that ends the job.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::CgroupMode;
use crate::log::{
    CgroupInfo, ChildExit, GpuInfo, LogWriter, Outcome, Peak, RunEnd, RunStart, SampleEvent,
};
use crate::model::{CeilingState, History, ProcSample, Role, Sample, View};
use crate::policy::{Action, Decision, Engine, Readings};
use crate::probe::cgroup::{self, CgroupReader, OwnedCgroup, Threshold};
use crate::probe::output::{JobStdio, OutputRelay, OutputScanner, Pumped, RelayOptions};
use crate::probe::proc::{TreeRoot, TreeScanner, totals};
use crate::probe::pss::{Member, PssSweeper, SweepConfig};
use crate::probe::system::SystemReader;
use crate::restart::{Budget, CheckpointWatch};
use crate::supervise::{self, Job, SpawnSpec, Status};
use crate::units::{HumanBytes, SizeOrPercent, human_duration};

mod attach;

/// Exit code when oomguard's policy ended the job (EX_TEMPFAIL: requeue).
pub const EXIT_POLICY: i32 = 75;
/// Exit code when the job succeeded but its peak footprint exceeded
/// `--fail-above` (a memory regression).
pub const EXIT_FAIL_ABOVE: i32 = 76;
/// Exit code for oomguard's own failure after the job started.
pub const EXIT_INTERNAL: i32 = 70;

/// The settings of one supervised job (`settings::Settings`), under the
/// name the loop has always used.
pub use crate::settings::Settings as RunConfig;

/// Runs the job under supervision and returns oomguard's exit code.
pub fn run(cfg: RunConfig) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oomguard: cannot start the runtime: {e}");
            return EXIT_INTERNAL;
        }
    };
    let log = cfg.log.clone();
    let started = Instant::now();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(supervise_job(cfg))
    })) {
        Ok(code) => code,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
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

const SIG_TERM: i32 = libc::SIGTERM;
const SIG_KILL: i32 = libc::SIGKILL;
const SIG_CONT: i32 = libc::SIGCONT;
const SIG_STOP: i32 = libc::SIGSTOP;

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

/// Fastest polling cadence (near the ceiling and while stopping).
const FAST: Duration = Duration::from_millis(20);
/// Throttle cycle for growers during a stop: run `THROTTLE_RUN` of every
/// `THROTTLE_CYCLE`.
const THROTTLE_CYCLE: Duration = Duration::from_millis(500);
const THROTTLE_RUN: Duration = Duration::from_millis(50);
/// Warn notifications are abandoned after this long (a hung notification
/// daemon must not matter).
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);
/// A tree frozen at the last-resort level that has not found room again
/// after this long cannot reach a checkpoint: it is ended.
const LAST_RESORT_HOLD: Duration = Duration::from_secs(5);
/// Hooks are killed after this long.
const HOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// Identity of a process: pid and start time.
type Ident = (u32, u64);

/// The graceful stop in progress.
#[derive(Debug)]
struct Stop {
    reason: String,
    action: Action,
    grace_end: Instant,
    step: StopStep,
    /// Growers held by the throttle (stopped except for short slices).
    throttled: HashSet<Ident>,
    throttle_running: bool,
    throttle_switch: Instant,
    /// Everything frozen at the last-resort level, since when.
    frozen_all: bool,
    frozen_since: Option<Instant>,
    /// The processes that got the checkpoint signal.
    signalled: Vec<Ident>,
    /// Confirms the checkpoint (with `--checkpoint-dir`).
    watch: Option<CheckpointWatch>,
    began: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum StopStep {
    /// Waiting for the trainers to checkpoint and exit.
    Checkpoint,
    /// SIGTERM sent to the rest; SIGKILL at the deadline.
    Terminate { until: Instant },
    /// SIGKILL sent; waiting for the tree to be gone.
    Killed,
}

struct Supervisor {
    cfg: RunConfig,
    started: Instant,
    log: LogWriter,
    scanner: TreeScanner,
    sweeper: PssSweeper,
    system: SystemReader,
    cgroup: Option<CgroupReader>,
    owned: Option<OwnedCgroup>,
    budget_bytes: Option<u64>,
    history: History,
    engine: Engine,
    job: Job,
    foreground: bool,
    main_status: Option<Status>,
    /// The tree at the last scan: what signals may be sent to.
    tree: Vec<ProcSample>,
    /// Zombies whose parent is oomguard, seen at the last scan: not gone
    /// until reaped.
    zombie_children: usize,
    /// When SIGKILL follows if the tree has not exited by then.
    kill_at: Option<Instant>,
    killed: bool,
    /// The INT or TERM that started the shutdown, if one did.
    shutdown_signal: Option<i32>,
    /// Processes oomguard paused (policy `pause`).
    paused: HashSet<Ident>,
    stop: Option<Stop>,
    /// The critical action that ended the attempt, if the policy did.
    policy_end: Option<Action>,
    helpers: supervise::Helpers,
    hook_deadlines: HashMap<u32, Instant>,
    next_tick: Instant,
    next_full: Instant,
    last_logged: Option<f64>,
    last_procs_log: Option<f64>,
    /// Unforced lines with the process list written so far.
    procs_lists: u32,
    last_view: Option<View>,
    last_sample: Option<Sample>,
    oom_kills_at_start: Option<u64>,
    vm_oom_kills_at_start: Option<u64>,
    thresholds: Vec<AsyncFd<Threshold>>,
    /// PSI trigger and cgroup v2 `memory.events` (POLLPRI wake-ups).
    pri_wakes: Vec<AsyncFd<crate::probe::system::PriWake>>,
    /// The owned cgroup's members at the last full scan.
    owned_members: HashSet<u32>,
    stats: RunStats,
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
    metrics: crate::metrics::Metrics,
    textfile: Option<crate::metrics::Textfile>,
    /// Set when running as a GitHub Actions step.
    annotator: Option<crate::github::Annotator>,
    /// Stops the metrics endpoint when dropped (the runtime ending does too).
    _metrics_stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The last minute of every tree process's memory, for `oom_kill`.
    recent: HashMap<Ident, Recent>,
    /// The OOM-kill counters last seen (job cgroup, machine).
    oom_seen: (Option<u64>, Option<u64>),
    /// Kills already written as `oom_kill` events.
    oom_reported: HashSet<u32>,
    gpu: Option<crate::probe::gpu::GpuProbe>,
    gpu_info: GpuInfo,
    /// NSpid chains of tree processes (they never change for a process).
    ns_pids: HashMap<Ident, Vec<u32>>,
    /// The last GPU reading: when NVML took it, the devices, and each tree
    /// process's share (fast ticks carry it on, with its age).
    gpu_last: Option<(Instant, Vec<crate::model::GpuSample>, HashMap<Ident, u64>)>,
    /// Recent (t, used bytes) of the fullest GPU, for its ETA.
    gpu_history: std::collections::VecDeque<(f64, f64)>,
    /// `attach`: the job's cgroup, and how the watch ends.
    attached: Option<attach::Attached>,
    /// The live dashboard, its state, and the job's pty (the dashboard owns
    /// the real terminal; the job gets a terminal of its own).
    tui: Option<crate::tui::Tui>,
    app: Option<crate::tui::App>,
    pty: Option<crate::tui::PtyMaster>,
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
    /// `--torch-stats`: the injected reporter (removed on drop) and its
    /// reader.
    torch: Option<(
        crate::probe::torch_stats::TorchStatsInjector,
        crate::probe::torch_stats::TorchStatsReader,
    )>,
}

/// What oomguard remembers of a process for explaining its death.
#[derive(Debug, Clone)]
struct Recent {
    comm: String,
    role: Role,
    /// e.g. "worker 3 of trainer 1234".
    place: String,
    last_seen: f64,
    points: std::collections::VecDeque<(f64, u64, u64)>,
}

/// How much of a process's memory history an `oom_kill` event carries.
const RECENT_WINDOW: f64 = 60.0;

/// Running totals for `run_end` and the summary.
#[derive(Debug, Default)]
struct RunStats {
    peak: Peak,
    /// The process holding the most PSS at the peak.
    peak_holder: Option<(u32, String, Role, u64)>,
    least_headroom: Option<CeilingState>,
    actions: BTreeMap<String, u32>,
    samples: u64,
}

async fn supervise_job(cfg: RunConfig) -> i32 {
    let started = Instant::now();
    let mut log = match &cfg.log {
        Some(path) => match LogWriter::create(path, started) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("oomguard: {e}");
                return 2;
            }
        },
        None => LogWriter::disabled(started),
    };

    // Metrics before the job starts: a port in use or an unwritable
    // textfile is a usage error (exit 2), not something to find out later.
    let metrics =
        crate::metrics::Metrics::new(crate::metrics::constant_labels(), env!("CARGO_PKG_VERSION"));
    let mut metrics_stop = None;
    if let Some(addr) = cfg.metrics_addr {
        if let Some(w) = crate::metrics::http::exposure_warning(addr) {
            eprintln!("oomguard: warning: {w}");
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        if let Err(e) = crate::metrics::serve(addr, metrics.clone(), async {
            let _ = rx.await;
        })
        .await
        {
            eprintln!("oomguard: {e}");
            return 2;
        }
        metrics_stop = Some(tx);
    }
    let textfile = cfg
        .metrics_textfile
        .as_ref()
        .map(crate::metrics::Textfile::new);
    if let Some(t) = &textfile
        && let Err(e) = t.write(&metrics.render())
    {
        eprintln!("oomguard: {e}");
        return 2;
    }

    // Register every handler before the job exists, so no signal (and no
    // SIGCHLD) can arrive unhandled.
    let mut streams = Vec::new();
    for (sig, _) in FORWARDED {
        match signal(SignalKind::from_raw(sig)) {
            Ok(s) => streams.push((sig, s)),
            Err(e) => eprintln!("oomguard: cannot handle signal {sig}: {e}"),
        }
    }
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        return internal_failure(&mut log, "cannot handle SIGCHLD".into());
    };

    if cfg.attach.is_none()
        && let Err(e) = supervise::become_subreaper()
    {
        eprintln!("oomguard: cannot become a child subreaper ({e}); orphaned workers may escape");
    }

    let own_loc = cgroup::locate(&cfg.proc_root, "self");
    let (owned, not_owned_reason) = match (cfg.cgroup, &own_loc) {
        _ if cfg.attach.is_some() => (None, Some("attached to a running process".to_string())),
        (CgroupMode::Off, _) => (None, Some("disabled with --cgroup off".to_string())),
        (CgroupMode::Auto, None) => (None, Some("no memory cgroup hierarchy found".to_string())),
        (CgroupMode::Auto, Some(loc)) => {
            report_stale(&cgroup::clean_stale(loc, &cfg.proc_root), cfg.quiet);
            match OwnedCgroup::create(loc, &format!("oomguard-{}", std::process::id())) {
                Ok(o) => (Some(o), None),
                Err(e) => (None, Some(e.to_string())),
            }
        }
    };

    let stdin = std::io::stdin();
    let foreground = stdin.is_terminal() && supervise::owns_foreground(stdin.as_fd());
    let torch = if cfg.torch_stats {
        match crate::probe::torch_stats::TorchStatsInjector::new(cfg.interval)
            .and_then(|inj| inj.reader().map(|r| (inj, r)))
        {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("oomguard: --torch-stats: {e}");
                return 2;
            }
        }
    } else {
        None
    };
    // The dashboard: when stdin and stdout are terminals and CI is unset,
    // or forced with --tui; never with --no-tui.
    let in_ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    let want_tui = !cfg.tui.no_tui
        && (cfg.tui.tui || (stdin.is_terminal() && std::io::stdout().is_terminal() && !in_ci));
    let (mut tui, mut app) = if want_tui {
        match crate::tui::Tui::new() {
            Ok(t) => {
                let cmd = cfg
                    .argv
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ");
                let mut app = crate::tui::App::new(cmd);
                let (w, c) = cfg.policy.policy.thresholds();
                app.set_thresholds(w, c);
                (Some(t), Some(app))
            }
            Err(e) => {
                eprintln!("oomguard: no dashboard ({e}); running without it");
                (None, None)
            }
        }
    } else {
        (None, None)
    };
    let (mut pty, mut slave) = (None, None);
    if let (Some(t), Some(a), None) = (&tui, &mut app, cfg.attach) {
        match open_job_pty(t, a) {
            Ok((m, s)) => {
                pty = Some(m);
                slave = Some(s);
            }
            // No /dev/pts (a minimal container or initramfs): the job
            // matters more than the dashboard.
            Err(e) => {
                eprintln!("oomguard: {e}; running the job with pipes and no dashboard");
                tui = None;
                app = None;
            }
        }
    }
    // With the dashboard the job's terminal is its pty, not ours.
    let foreground = foreground && slave.is_none();
    let (mut relay, mut stdio) = (None, None);
    let mut pty_log = None;
    if cfg.attach.is_none() && slave.is_none() {
        match OutputRelay::new(RelayOptions {
            output_log: cfg.output_log.clone(),
            drop_when_full: cfg.output_drop,
            ..Default::default()
        }) {
            Ok((r, s)) => {
                relay = Some(r);
                stdio = Some(s);
            }
            Err(e) => {
                eprintln!("oomguard: {e}");
                return 2;
            }
        }
    } else if let (Some(path), true) = (&cfg.output_log, slave.is_some()) {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => pty_log = Some(f),
            Err(e) => {
                eprintln!("oomguard: cannot write '{}': {e}", path.display());
                return 2;
            }
        }
    }
    let mut first_env = attempt_env(1, None, &BTreeMap::new());
    if let Some((inj, _)) = &torch {
        first_env.extend(inj.env(std::env::var_os("PYTHONPATH").as_deref()));
    }
    let launched = match cfg.attach {
        Some(pid) => attach_to(&cfg, pid).map_err(|e| {
            eprintln!("oomguard: {e}");
            2
        }),
        None => Err(0),
    };
    let (job, owned, not_owned_reason) = match launched {
        Ok(job) => (job, None, not_owned_reason),
        Err(2) => return 2,
        Err(_) => match launch(
            &cfg,
            &cfg.argv,
            first_env.clone(),
            owned.as_ref(),
            foreground,
            slave.as_ref(),
            stdio.take(),
        ) {
            Ok(job) => (job, owned, not_owned_reason),
            // Joining the cgroup can fail (a hierarchy that refuses the
            // move); the job matters more than the cgroup.
            Err(supervise::SpawnError::Other { source, .. }) if owned.is_some() => {
                let retry = relay.as_ref().map(|r| r.job_stdio()).transpose();
                let retry = match retry {
                    Ok(s) => s,
                    Err(e) => return internal_failure(&mut log, e.to_string()),
                };
                match launch(
                    &cfg,
                    &cfg.argv,
                    first_env,
                    None,
                    foreground,
                    slave.as_ref(),
                    retry,
                ) {
                    Ok(job) => (
                        job,
                        None,
                        Some(format!("cannot move the job into its cgroup: {source}")),
                    ),
                    Err(e) => return spawn_failed(&mut log, &e),
                }
            }
            Err(e) => return spawn_failed(&mut log, &e),
        },
    };

    // Our copy of the pty's job side must go, or the master never sees EOF;
    // the same for the relay's copies of the job's ends.
    drop(slave);
    if let Some(r) = relay.as_mut() {
        r.after_spawn();
    }
    let cgroup_reader = match &owned {
        Some(o) => Some(CgroupReader::new(o.location().clone(), true)),
        None => cfg
            .attach_spec
            .as_ref()
            .and_then(|s| s.cgroup.clone())
            .or_else(|| cgroup::locate(&cfg.proc_root, &job.pid.to_string()))
            .map(|loc| CgroupReader::new(loc, false)),
    };
    let attached = cfg.attach.map(|pid| {
        attach::Attached::new(
            cfg.attach_spec.as_ref(),
            cgroup_reader.as_ref(),
            &cfg.proc_root,
            pid,
            started,
        )
    });
    let mut system = SystemReader::new(&cfg.proc_root);
    let first_system = system.read(Instant::now());
    let budget_bytes = cfg.budget.map(|b| match b {
        SizeOrPercent::Bytes(n) => n,
        SizeOrPercent::Percent(p) => (first_system.mem_total_bytes as f64 * p / 100.0) as u64,
    });
    let root = match cfg.attach {
        _ if attached.as_ref().is_some_and(|a| a.members_of.is_some()) => TreeRoot::Members,
        Some(pid) => TreeRoot::Process(pid),
        None => TreeRoot::ChildrenOf(std::process::id()),
    };
    let mut scanner = TreeScanner::new(&cfg.proc_root, root);
    scanner.set_job(Some(job.pid));
    if cfg.attach.is_some() {
        // oomguard may watch from inside the job's cgroup (a SLURM job).
        scanner.exclude(std::process::id());
    }

    // NVML is loaded at run time: the same binary works without a driver.
    let (gpu, gpu_info) = match &cfg.nvml {
        None => (
            None,
            GpuInfo {
                available: false,
                reason: Some("disabled with --no-gpu".into()),
            },
        ),
        Some(lib) => match crate::probe::gpu::GpuProbe::open(lib.as_deref()) {
            Ok(p) => (
                Some(p),
                GpuInfo {
                    available: true,
                    reason: None,
                },
            ),
            Err(e) => (
                None,
                GpuInfo {
                    available: false,
                    reason: Some(e.to_string()),
                },
            ),
        },
    };
    let now = Instant::now();
    let cfg_restart = cfg.restart.clone();
    let cg_first = cgroup_reader.as_ref().and_then(|c| c.read());
    let mut sup = Supervisor {
        sweeper: PssSweeper::start(
            cfg.proc_root.clone(),
            SweepConfig {
                interval: cfg.pss_interval,
                budget: cfg.pss_budget,
            },
        ),
        history: History::new(10.0),
        engine: Engine::new(cfg.policy.policy.clone()),
        oom_kills_at_start: cg_first.as_ref().and_then(|c| c.oom_kill_count),
        vm_oom_kills_at_start: first_system.oom_kill_total,
        cfg,
        started,
        log,
        scanner,
        system,
        cgroup: cgroup_reader,
        owned,
        budget_bytes,
        job,
        foreground,
        main_status: None,
        tree: Vec::new(),
        zombie_children: 0,
        kill_at: None,
        killed: false,
        shutdown_signal: None,
        paused: HashSet::new(),
        stop: None,
        policy_end: None,
        helpers: supervise::Helpers::default(),
        hook_deadlines: HashMap::new(),
        next_tick: now,
        next_full: now,
        last_logged: None,
        last_procs_log: None,
        procs_lists: 0,
        last_view: None,
        last_sample: None,
        thresholds: Vec::new(),
        pri_wakes: Vec::new(),
        owned_members: HashSet::new(),
        stats: RunStats::default(),
        attempt: 1,
        attempt_started: now,
        budget: Budget::new(
            cfg_restart.max_restarts,
            cfg_restart.restart_delay,
            Duration::from_secs(300),
            cfg_restart.restart_reset,
        ),
        env: BTreeMap::new(),
        checkpoint: None,
        relaunch_at: None,
        restart_limit: false,
        attempts: Vec::new(),
        restarts: 0,
        no_more_attempts: false,
        metrics,
        textfile,
        annotator: crate::github::in_github_actions(std::env::vars())
            .then(crate::github::Annotator::default),
        _metrics_stop: metrics_stop,
        recent: HashMap::new(),
        oom_seen: (None, None),
        oom_reported: HashSet::new(),
        gpu,
        gpu_info,
        ns_pids: HashMap::new(),
        gpu_history: Default::default(),
        gpu_last: None,
        torch,
        attached,
        tui,
        app,
        pty,
        warning: false,
        hung_up: false,
        internal_error: None,
        relay,
        pty_scanner: OutputScanner::new(),
        pty_log,
        cuda_oom: None,
        progress: crate::forensics::progress::ProgressTracker::new(),
        memory_death: false,
        rank_notes: Vec::new(),
    };
    let restartable = sup.restart_enabled();
    if let Some(app) = sup.app.as_mut() {
        app.set_restart_available(restartable);
    }
    sup.write_run_start(not_owned_reason);
    sup.register_thresholds(cg_first.as_ref());
    sup.register_pri_wakes();
    sup.set_memory_high(cg_first.as_ref());

    let mut pty_buf = vec![0u8; 64 * 1024];
    loop {
        let forwarded = recv_any(&mut streams);
        let wake = sup.next_wake();
        let threshold = threshold_crossed(&sup.thresholds);
        let pri = pri_woken(&sup.pri_wakes);
        let output = pty_read(sup.pty.as_ref(), &mut pty_buf);
        let term = term_event(sup.tui.as_mut());
        tokio::select! {
            _ = sigchld.recv() => sup.reap(),
            sig = forwarded => sup.on_signal(sig),
            _ = tokio::time::sleep_until(wake.into()) => sup.on_timer(),
            () = threshold => sup.tick(true),
            i = pri => {
                if let Some(w) = sup.pri_wakes.get_mut(i) {
                    w.get_mut().rearm();
                }
                sup.tick(true);
            }
            n = output => sup.on_output(n, &pty_buf),
            pumped = relay_pump(sup.relay.as_mut()) => sup.on_relay(pumped),
            ev = term => sup.on_term(ev),
        }
        sup.draw();
        if sup.relaunch_at.is_some_and(|at| Instant::now() >= at) {
            sup.relaunch();
        }
        if sup.relaunch_at.is_none() && sup.finished() && !sup.plan_restart() {
            break;
        }
    }
    drain_output(sup.relay.as_mut(), &mut streams).await;
    sup.finish()
}

/// The job is gone, but its last output may still wait for a slow reader:
/// wait for it as a pipe would hold it, however long the reader takes,
/// while a signal that ends the run (INT, TERM) still ends it.
async fn drain_output(
    relay: Option<&mut OutputRelay>,
    streams: &mut [(i32, tokio::signal::unix::Signal)],
) {
    let Some(r) = relay else { return };
    r.finish();
    while !r.flushed() {
        tokio::select! {
            sig = recv_any(streams) => {
                if FORWARDED.iter().any(|&(s, ends)| s == sig && ends) {
                    return;
                }
            }
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
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
fn internal_failure(log: &mut LogWriter, error: String) -> i32 {
    eprintln!("oomguard: {error}");
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
        },
    );
    EXIT_INTERNAL
}

fn spawn_failed(log: &mut LogWriter, e: &supervise::SpawnError) -> i32 {
    eprintln!("oomguard: {e}");
    let code = e.exit_code();
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
                self.main_status = Some(Status::Exited(0));
                self.log
                    .write("child_exit", &serde_json::json!({ "pid": self.job.pid }));
                self.say("the job's cgroup has no processes left".to_string());
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
            self.main_status = Some(Status::Exited(0));
            self.log
                .write("child_exit", &serde_json::json!({ "pid": self.job.pid }));
            self.say(format!("pid {} has ended", self.job.pid));
        }
    }

    /// Whether oomguard may kill processes: always those it launched; under
    /// `attach` only with `--allow-kill`.
    fn may_kill(&self) -> bool {
        self.cfg.attach.is_none() || self.cfg.allow_kill
    }

    /// The job wrote to its terminal (the dashboard's pty).
    fn on_output(&mut self, n: std::io::Result<usize>, buf: &[u8]) {
        match n {
            Ok(n) if n > 0 => {
                if let Some(app) = self.app.as_mut() {
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
            _ => self.pty = None,
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
        let critical = self.host_memory_critical();
        let mut events = self.pty_scanner.take_events();
        if let Some(r) = self.relay.as_mut() {
            events.extend(r.take_events());
        }
        for event in events {
            if let crate::forensics::torch::TorchEvent::Progress(u) = event {
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
                self.log.write(record.name(), &record);
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
                                (None, None) => "exit code null".to_string(),
                            },
                        })
                    }
                    crate::log::OutputEvent::RankFailed(_) => None,
                };
                if let Some(ev) = ui {
                    self.ui_event(ev);
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
        if r.pid.is_some_and(|p| self.oom_reported.contains(&p)) {
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
        self.log.set_progress(current, changed);
        self.metrics
            .set_progress(current.and_then(|p| p.step), current.and_then(|p| p.total));
        if let Some(app) = self.app.as_mut() {
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
        let (warn, _) = self.engine.policy().thresholds();
        let warn = warn.unwrap_or(20.0);
        sigkill
            && self
                .last_view
                .as_ref()
                .and_then(|v| v.headroom_percent())
                .is_some_and(|h| h <= warn)
    }

    /// Whether host (or cgroup) memory is, or was at the last tick, at the
    /// critical level.
    fn host_memory_critical(&self) -> bool {
        let (_, crit) = self.engine.policy().thresholds();
        let crit = crit.unwrap_or(8.0);
        self.last_view
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
                if let (Some(app), Some(pty)) = (&self.app, &self.pty) {
                    let (c, r) = crate::tui::output_pane_size(app, cols, rows);
                    let _ = pty.resize(c, r);
                }
            }
            TermEvent::Key(key) => {
                let Some(cmd) = self.app.as_mut().and_then(|a| a.on_key(key)) else {
                    return;
                };
                let t = self.started.elapsed().as_secs_f64();
                let alive = self.main_status.is_none() && self.stop.is_none();
                match cmd {
                    UiCommand::Interrupt => {
                        if let Some(p) = &self.pty {
                            let _ = p.interrupt();
                        }
                    }
                    UiCommand::TogglePause if alive => {
                        if self.paused.is_empty() {
                            self.pause("manual (dashboard)");
                            self.engine.paused_externally(t);
                        } else {
                            self.resume("manual (dashboard)");
                            self.engine.resumed_externally();
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
        self.app = None;
    }

    /// Redraws the dashboard (after every event; nothing runs while idle).
    fn draw(&mut self) {
        use crate::tui::PolicyState;
        let (Some(tui), Some(app)) = (self.tui.as_mut(), self.app.as_mut()) else {
            return;
        };
        app.set_elapsed(self.started.elapsed().as_secs_f64());
        let state = match &self.stop {
            Some(st) if st.action == Action::Restart => PolicyState::Restarting,
            Some(_) => PolicyState::Stopping,
            None if self.relaunch_at.is_some() => PolicyState::Restarting,
            None if !self.paused.is_empty() => PolicyState::Paused,
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
        self.log_action(
            "stop",
            "terminal hangup",
            vec![self.job.pid],
            Some(libc::SIGHUP),
            "ok".into(),
        );
        let paused: Vec<Ident> = self.paused.drain().collect();
        self.signal_all(&paused, SIG_CONT);
        self.shutdown_signal = Some(libc::SIGHUP);
        if self.kill_at.is_none() {
            self.kill_at = Some(Instant::now() + self.cfg.kill_after);
        }
    }

    fn ui_event(&mut self, ev: crate::tui::UiEvent) {
        if let Some(app) = self.app.as_mut() {
            app.on_event(ev);
        }
    }

    /// oomguard's own message: on stderr, or in the dashboard's events pane
    /// while the dashboard owns the terminal.
    fn say(&mut self, text: String) {
        match self.app.as_mut() {
            Some(app) => app.on_event(crate::tui::UiEvent::Note {
                t: self.started.elapsed().as_secs_f64(),
                severity: crate::tui::Severity::Info,
                text,
            }),
            None => eprintln!("oomguard: {text}"),
        }
    }

    fn write_run_start(&mut self, not_owned_reason: Option<String>) {
        let sample = self.sample(false);
        let cgroup = self.cgroup.as_ref().map(|c| CgroupInfo {
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
            policy: self.engine.policy().to_json(),
            gpu: self.gpu_info.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            interval_seconds: self.cfg.interval.as_secs_f64(),
            pss_interval_seconds: self.cfg.pss_interval.as_secs_f64(),
        };
        self.log.write_at("run_start", sample.t, &start);
        self.last_sample = Some(sample);
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
        let (Some(reader), Some(cg)) = (&self.cgroup, cg) else {
            return;
        };
        let mut targets = Vec::new();
        if let (Some(limit), Some(path)) = (cg.limit_bytes, cg.limit_path.as_deref())
            && let Some(dir) = reader.limit_dir(path)
        {
            targets.push((dir, limit));
        }
        if let Some(budget) = self.budget_bytes
            && (reader.owned() || self.attached_exclusive())
            && let Some(dir) = reader.limit_dir(&cg.path)
        {
            targets.push((dir, budget));
        }
        let (warn, crit) = self.engine.policy().thresholds();
        let mut levels: Vec<f64> = [warn, crit, crit.map(|c| c / 2.0)]
            .into_iter()
            .flatten()
            .collect();
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
        let (Some(reader), Some(cg)) = (&self.cgroup, cg) else {
            return;
        };
        if !reader.owned() || reader.location().version != Version::V2 {
            return;
        }
        let (_, Some(crit)) = self.engine.policy().thresholds() else {
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
        if let Some(budget) = self.budget_bytes {
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

    /// Reads one tick's sample. A quick sample re-reads only the processes
    /// already known (no /proc walk): cheap enough for 20 ms polling.
    fn sample(&mut self, quick: bool) -> Sample {
        let now = Instant::now();
        let mut procs = self.scan_tree(quick);
        // One pass over the cgroup files; the owned cgroup's working set is
        // the job's exact footprint.
        let (cgroup, owned_ws) = match self.cgroup.as_ref() {
            Some(c) if c.owned() || self.attached_exclusive() => match c.read_with_working_set() {
                Some((s, ws)) => (Some(s), Some(ws)),
                None => (None, None),
            },
            Some(c) => (c.read(), None),
            None => (None, None),
        };
        let system = self.system.read(now);
        if !quick {
            let charged = owned_ws.or(cgroup.as_ref().map(|c| c.usage_bytes));
            self.sweeper.set_targets(
                procs.iter().map(Member::from).collect(),
                charged,
                owned_ws.is_some(),
            );
        }
        let pss_age = self.sweeper.apply(&mut procs, now);
        let mut tree = totals(&procs);
        tree.pss_age_seconds = pss_age;
        if let Some(ws) = owned_ws {
            // A process that moved itself out of the owned cgroup is not in
            // its working set: its PSS counts on top.
            let outside: u64 = procs
                .iter()
                .filter(|p| !self.owned_members.contains(&p.pid))
                .map(|p| p.pss_bytes)
                .sum();
            tree.footprint_bytes = ws + outside;
        }
        let psi = self.system.psi();
        let fresh = if quick {
            None
        } else {
            self.sample_gpus(&mut procs)
        };
        let gpus = fresh.unwrap_or_else(|| self.last_gpus(&mut procs, now));
        if let Some((_, reader)) = self.torch.as_mut() {
            if !quick {
                let _ = reader.poll();
                let live: HashSet<u32> = procs.iter().map(|p| p.pid).collect();
                reader.retain_pids(|pid| live.contains(&pid));
            }
            for p in procs.iter_mut() {
                p.torch = reader.latest().get(&p.pid).cloned();
            }
        }
        self.tree = procs.clone();
        Sample {
            t: now.duration_since(self.started).as_secs_f64(),
            tree,
            procs,
            system,
            cgroup,
            psi,
            gpus,
            budget_bytes: self.budget_bytes,
        }
    }

    fn next_wake(&self) -> Instant {
        let mut wake = self.next_tick;
        if let Some(k) = self.kill_at {
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
        wake
    }

    fn on_timer(&mut self) {
        let now = Instant::now();
        self.reap();
        if self.kill_at.is_some_and(|k| now >= k) {
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
        self.reap();
        self.check_attached_target();
        let now = Instant::now();
        if !quick {
            self.next_full = now + self.cfg.interval.min(Duration::from_millis(250)).max(FAST);
        }
        let sample = self.sample(quick);
        self.prune_held();
        if !quick {
            self.remember(&sample);
        }
        self.check_oom_kills(&sample);
        let view = self.history.push(&sample);
        // Only a fresh reading moves the GPU's trend (a carried one would
        // flatten it).
        let gpu_eta =
            if sample.gpus.is_empty() || sample.gpus.iter().any(|g| g.age_seconds.is_some()) {
                None
            } else {
                self.gpu_eta(&sample)
            };
        let frag = self.torch.as_ref().map(|_| {
            sample
                .procs
                .iter()
                .filter_map(|p| p.torch.as_deref())
                .map(crate::probe::torch_stats::total_fragmentation_bytes)
                .max()
                .unwrap_or(0) as f64
        });
        let readings = Readings::from_sample(&sample, &view, gpu_eta, frag);
        // Once the job is ending (it exited, a stop is under way, or oomguard
        // was told to stop) the policy has nothing more to decide.
        let waits_before = self.engine.pending_changes();
        let decisions = if self.main_status.is_some()
            || self.shutdown_signal.is_some()
            || self.stop.is_some()
        {
            Vec::new()
        } else {
            self.engine.step(&readings)
        };
        // A rule that starts or ends its `for` wait is logged too, so that
        // `oomguard replay` waits from the same sample.
        let acted = !decisions.is_empty();
        let waits_changed = self.engine.pending_changes() != waits_before;
        for d in decisions {
            self.apply(d, &sample, &view);
        }
        if !self.paused.is_empty() {
            // Processes born just before the pause are paused too.
            self.pause_new();
        }
        if self.stop.is_some() {
            self.guard(&sample, now);
        }
        self.record(&sample, &view, acted, waits_changed, Some(&readings));
        let every = self.cadence(&view);
        self.next_tick = now + every;
        if every >= self.cfg.interval {
            self.next_full = self.next_tick;
        }
        self.last_view = Some(view);
        self.last_sample = Some(sample);
    }

    /// Forgets held processes (paused, throttled, signalled for a
    /// checkpoint) that are no longer the process that was held: gone, or
    /// their pid taken by another. Only a live identity is ever signalled
    /// again.
    fn prune_held(&mut self) {
        let in_tree: HashSet<Ident> = self.tree.iter().map(|p| (p.pid, p.start_time)).collect();
        let root = self.cfg.proc_root.clone();
        let alive = |id: &Ident| in_tree.contains(id) || supervise::is_alive(&root, id.0, id.1);
        self.paused.retain(|id| alive(id));
        if let Some(st) = self.stop.as_mut() {
            st.throttled.retain(|id| alive(id));
        }
    }

    /// How soon the next tick comes: faster as headroom shrinks.
    fn cadence(&self, view: &View) -> Duration {
        let base = self.cfg.interval;
        if self.stop.is_some() || !self.paused.is_empty() {
            return FAST.max(Duration::from_millis(20));
        }
        let (warn, crit) = self.engine.policy().thresholds();
        let (warn, crit) = (warn.unwrap_or(20.0), crit.unwrap_or(8.0));
        let fast = match view.headroom_percent() {
            Some(h) if h < crit * 2.0 => FAST,
            Some(h) if h < warn => Duration::from_millis(100),
            Some(h) if h < warn + 10.0 => Duration::from_millis(250),
            _ => base,
        };
        let fast = match view.eta_seconds {
            Some(eta) if eta < 30.0 => fast.min(Duration::from_millis(100)),
            _ => fast,
        };
        // A steep drop since the last tick (before there is history for an
        // ETA): look again soon.
        let dropped = self
            .last_view
            .as_ref()
            .and_then(|prev| Some(prev.headroom_percent()? - view.headroom_percent()?))
            .is_some_and(|d| d > 2.0);
        let fast = if dropped {
            fast.min(Duration::from_millis(100))
        } else {
            fast
        };
        fast.min(base)
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
                .observe_memory(n.used_bytes, Some(n.headroom_bytes))
            {
                let advice = flag.advice();
                self.log.write_at(
                    "phase_memory",
                    sample.t,
                    &serde_json::json!({
                        "phase": flag.phase,
                        "epoch": flag.epoch,
                        "before_bytes": flag.before_bytes,
                        "added_bytes": flag.added_bytes,
                        "advice": advice,
                    }),
                );
                if !self.cfg.quiet {
                    self.say(advice);
                }
            }
            self.publish_progress();
        }
        // Every tick: a scrape sees the newest numbers (cheap: a copy).
        self.metrics.update(sample, view);
        if let Some(app) = self.app.as_mut() {
            app.on_sample(sample, view);
        }
        self.metrics.set_paused(!self.paused.is_empty());
        self.stats.samples += 1;
        let s = &mut self.stats;
        if sample.tree.pss_bytes > s.peak.tree_pss_bytes || s.samples == 1 {
            s.peak.tree_pss_bytes = sample.tree.pss_bytes;
            s.peak.t = sample.t;
            s.peak_holder = sample
                .procs
                .iter()
                .max_by_key(|p| p.pss_bytes)
                .map(|p| (p.pid, p.comm.clone(), p.role, p.pss_bytes));
        }
        s.peak.tree_rss_bytes = s.peak.tree_rss_bytes.max(sample.tree.rss_bytes);
        s.peak.swap_used_bytes = s.peak.swap_used_bytes.max(sample.system.swap_used_bytes);
        let gpu: u64 = sample.gpus.iter().map(|g| g.used_bytes).sum();
        s.peak.gpu_used_bytes = s.peak.gpu_used_bytes.max(gpu);
        if let Some(n) = view.nearest
            && s.least_headroom
                .is_none_or(|l| n.headroom_bytes < l.headroom_bytes)
        {
            s.least_headroom = Some(n);
        }
        // Fast ticks are not all logged: one line per --interval, plus
        // every tick where a rule or action happened.
        let due = self
            .last_logged
            .is_none_or(|last| sample.t - last >= self.cfg.interval.as_secs_f64() * 0.95);
        if !(due || force || waits_changed) {
            return;
        }
        self.last_logged = Some(sample.t);
        // The textfile at the log's cadence, not at every fast tick.
        if let Some(t) = &self.textfile
            && let Err(e) = t.write(&self.metrics.render())
        {
            self.say(format!("{e}; no more metrics textfile"));
            self.textfile = None;
        }
        let with_procs = force
            || self
                .last_procs_log
                .is_none_or(|last| sample.t - last >= self.cfg.procs_interval.as_secs_f64());
        if with_procs {
            self.last_procs_log = Some(sample.t);
        }
        let mut event = SampleEvent::new(sample, view, with_procs);
        if let Some(r) = readings {
            event = event.with_policy_inputs(self.engine.policy(), r);
        }
        if with_procs && !force {
            // Per-GPU detail on one process list in GPU_DETAIL_EVERY.
            self.procs_lists = self.procs_lists.wrapping_add(1);
            if self.procs_lists % crate::log::GPU_DETAIL_EVERY != 1 {
                event = event.without_gpus();
            }
        }
        self.log.write_at("sample", sample.t, &event);
    }

    fn count(&mut self, action: &str) {
        *self.stats.actions.entry(action.to_string()).or_insert(0) += 1;
        self.metrics.action(action);
    }

    /// A few GitHub Actions annotations (rate-limited), never one per tick.
    fn annotate(&mut self, key: &str, level: crate::github::Level, title: &str, message: &str) {
        let t = self.log.t();
        if let Some(a) = self.annotator.as_mut()
            && let Some(line) = a.offer(t, key, level, title, message)
        {
            eprintln!("{line}");
        }
    }

    fn log_action(
        &mut self,
        action: &str,
        reason: &str,
        pids: Vec<u32>,
        signal: Option<i32>,
        result: String,
    ) {
        self.count(action);
        let kind = match action {
            "warn" => Some(crate::tui::ActionKind::Warn),
            "pause" => Some(crate::tui::ActionKind::Pause),
            "resume" => Some(crate::tui::ActionKind::Resume),
            "stop" => Some(crate::tui::ActionKind::Stop),
            "kill" => Some(crate::tui::ActionKind::Kill),
            "restart" => Some(crate::tui::ActionKind::Restart),
            _ => None,
        };
        if let Some(action) = kind {
            let t = self.started.elapsed().as_secs_f64();
            let error = (result != "ok").then(|| result.clone());
            let (reason, pids) = (reason.to_string(), pids.clone());
            self.ui_event(crate::tui::UiEvent::Action {
                t,
                action,
                reason,
                pids,
                error,
            });
        }
        let level = match action {
            "warn" => Some(crate::github::Level::Warning),
            "pause" | "stop" | "kill" | "restart" => Some(crate::github::Level::Error),
            _ => None,
        };
        if let Some(level) = level {
            let msg = format!("{action} ({reason})");
            self.annotate(
                &format!("{action}:{reason}"),
                level,
                &format!("oomguard: {action}"),
                &msg,
            );
        }
        self.log.write(
            "action",
            &crate::log::ActionEvent {
                action: action.to_string(),
                reason: reason.to_string(),
                pids,
                signal: signal.map(supervise::signal_name),
                result,
            },
        );
    }

    /// Signals processes by identity; returns the pids reached and the
    /// first error, if any.
    fn signal_all(&self, targets: &[Ident], sig: i32) -> (Vec<u32>, String) {
        let mut reached = Vec::new();
        let mut err = None;
        for &(pid, start) in targets {
            match supervise::signal_process(&self.cfg.proc_root, pid, start, sig) {
                Ok(()) => reached.push(pid),
                Err(supervise::SignalError::Gone(_)) => {}
                Err(e) => {
                    err.get_or_insert(e.to_string());
                }
            }
        }
        (reached, err.unwrap_or_else(|| "ok".into()))
    }

    fn idents(&self, pred: impl Fn(&ProcSample) -> bool) -> Vec<Ident> {
        self.tree
            .iter()
            .filter(|p| pred(p))
            .map(|p| (p.pid, p.start_time))
            .collect()
    }

    fn apply(&mut self, d: Decision, sample: &Sample, view: &View) {
        match d {
            Decision::Rule {
                rule,
                metric,
                value,
                threshold,
                firing,
            } => {
                let value = if value.is_finite() { value } else { f64::MAX };
                self.log.write(
                    "rule",
                    &serde_json::json!({
                        "rule": rule,
                        "metric": metric.name(),
                        "value": (value * 1000.0).round() / 1000.0,
                        "threshold": threshold,
                        "state": if firing { "firing" } else { "cleared" },
                    }),
                );
            }
            Decision::Act {
                action,
                reason,
                hook,
            } => {
                if action == Action::Warn {
                    self.warn(&reason, sample, view);
                } else {
                    self.describe(action, &reason, view);
                }
                match action {
                    Action::Warn => {
                        self.log_action("warn", &reason, Vec::new(), None, "ok".into());
                    }
                    Action::Pause => self.pause(&reason),
                    Action::Stop | Action::Restart => self.begin_stop(action, &reason),
                    Action::Kill if !self.may_kill() => {
                        self.say(format!(
                            "{reason}: not killing processes oomguard did not launch (use --allow-kill)"
                        ));
                        self.log_action(
                            "warn",
                            &reason,
                            Vec::new(),
                            None,
                            "kill refused: attached".into(),
                        );
                    }
                    Action::Kill => {
                        self.policy_end = Some(Action::Kill);
                        self.kill_tree(&reason);
                    }
                }
                let hook = hook.or_else(|| {
                    (action == Action::Warn)
                        .then(|| self.cfg.policy.on_warn.clone())
                        .flatten()
                });
                if let Some(cmd) = hook {
                    self.run_hook(&cmd, action, &reason, view);
                }
            }
            Decision::Resume { reason } => self.resume(&reason),
        }
    }

    fn describe(&mut self, action: Action, reason: &str, view: &View) {
        if self.cfg.quiet {
            return;
        }
        let head = view.nearest.map_or_else(String::new, |n| {
            format!(
                ": headroom {} ({:.1}%) under the {} ceiling of {}",
                HumanBytes(n.headroom_bytes),
                n.headroom_percent(),
                n.ceiling.source.as_str(),
                HumanBytes(n.ceiling.bytes)
            )
        });
        let what = match action {
            Action::Pause => "pausing the job".to_string(),
            Action::Stop => format!(
                "stopping the job gracefully ({} to the trainer, {} grace)",
                supervise::signal_name(self.cfg.policy.checkpoint_signal),
                human_duration(self.cfg.policy.grace)
            ),
            Action::Restart => "stopping the job to restart it".to_string(),
            Action::Kill => "killing the job".to_string(),
            Action::Warn => "warning".to_string(),
        };
        self.say(format!("{reason}{head}; {what}"));
    }

    fn warn(&mut self, reason: &str, sample: &Sample, view: &View) {
        let head = view.nearest.map_or_else(String::new, |n| {
            format!(
                "headroom {} ({:.1}%) under the {} ceiling of {}",
                HumanBytes(n.headroom_bytes),
                n.headroom_percent(),
                n.ceiling.source.as_str(),
                HumanBytes(n.ceiling.bytes)
            )
        });
        let eta = view
            .eta_seconds
            .map_or_else(String::new, |e| format!("; full in ~{e:.0}s"));
        let top = sample
            .procs
            .iter()
            .max_by_key(|p| p.pss_bytes)
            .map_or_else(String::new, |p| {
                format!(
                    "; largest {} (pid {}, {}) {}",
                    p.comm,
                    p.pid,
                    p.role.as_str(),
                    HumanBytes(p.pss_bytes)
                )
            });
        let msg = format!("{head}{eta}{top}");
        if !self.cfg.quiet {
            self.say(format!("warning ({reason}): {msg}"));
        }
        if self.cfg.notify {
            notify(format!("oomguard: memory warning ({reason})"), msg);
        }
    }

    fn pause(&mut self, reason: &str) {
        let targets = self.idents(|_| true);
        let (pids, result) = self.signal_all(&targets, SIG_STOP);
        self.paused.extend(targets);
        self.log_action("pause", reason, pids, Some(SIG_STOP), result);
    }

    fn pause_new(&mut self) {
        let new: Vec<Ident> = self.idents(|p| !self.paused.contains(&(p.pid, p.start_time)));
        if !new.is_empty() {
            self.signal_all(&new, SIG_STOP);
            self.paused.extend(new);
        }
    }

    fn resume(&mut self, reason: &str) {
        let targets: Vec<Ident> = self.paused.drain().collect();
        let (pids, result) = self.signal_all(&targets, SIG_CONT);
        self.log_action("resume", reason, pids, Some(SIG_CONT), result);
        if !self.cfg.quiet {
            self.say(format!("{reason} cleared; resuming the job"));
        }
    }

    /// Starts the graceful ladder: checkpoint signal to the trainers only.
    fn begin_stop(&mut self, action: Action, reason: &str) {
        self.policy_end = Some(action);
        let now = Instant::now();
        // A paused trainer cannot checkpoint: let it run (growers stay held
        // by the throttle below).
        let mut trainers = self.idents(|p| p.role == Role::Trainer);
        if trainers.is_empty() {
            trainers = self.idents(|p| p.pid == self.job.pid);
        }
        let growers = self.growers();
        if !self.paused.is_empty() {
            let resume: Vec<Ident> = self
                .paused
                .drain()
                .filter(|id| !growers.contains(id))
                .collect();
            self.signal_all(&resume, SIG_CONT);
        }
        let sig = self.cfg.policy.checkpoint_signal;
        let (pids, result) = self.signal_all(&trainers, sig);
        self.log_action(action.name(), reason, pids, Some(sig), result);
        self.stop = Some(Stop {
            reason: reason.to_string(),
            action,
            grace_end: now + self.cfg.policy.grace,
            step: StopStep::Checkpoint,
            throttled: growers,
            throttle_running: false,
            throttle_switch: now,
            frozen_all: false,
            frozen_since: None,
            signalled: trainers,
            watch: self.cfg.restart.checkpoint_dir.clone().map(|dir| {
                CheckpointWatch::new(
                    dir,
                    self.cfg.restart.checkpoint_glob.clone(),
                    SystemTime::now(),
                )
            }),
            began: now,
        });
    }

    /// Non-trainer processes whose memory grew over the recent window
    /// (usually DataLoader workers with a leaking cache).
    fn growers(&self) -> HashSet<Ident> {
        let Some(prev) = &self.last_sample else {
            return HashSet::new();
        };
        let before: HashMap<Ident, u64> = prev
            .procs
            .iter()
            .map(|p| ((p.pid, p.start_time), p.rss_bytes))
            .collect();
        self.tree
            .iter()
            .filter(|p| matches!(p.role, Role::Worker | Role::Other))
            .filter(|p| {
                before
                    .get(&(p.pid, p.start_time))
                    .is_none_or(|&b| p.rss_bytes > b)
            })
            .map(|p| (p.pid, p.start_time))
            .collect()
    }

    /// Keeps the kernel out while the stop is in progress, and walks the
    /// ladder: trainers exit (or grace ends) → SIGTERM + SIGCONT to the
    /// rest → `--kill-after` → SIGKILL.
    fn guard(&mut self, sample: &Sample, now: Instant) {
        let (_, crit) = self.engine.policy().thresholds();
        let crit = crit.unwrap_or(8.0);
        let last_resort = crit / 2.0;
        // Freezing everything is only for ceilings the kernel enforces: a
        // budget overrun is not an OOM kill, so the trainer keeps its
        // chance to checkpoint there.
        let hard = sample
            .ceilings()
            .into_iter()
            .filter(|c| c.ceiling.source != crate::model::CeilingSource::Budget)
            .map(|c| c.headroom_percent())
            .min_by(f64::total_cmp);
        let new_growers = self.growers();
        let Some(mut st) = self.stop.take() else {
            return;
        };
        let trainers_alive = st
            .signalled
            .iter()
            .any(|id| sample.procs.iter().any(|p| (p.pid, p.start_time) == *id));
        match st.step {
            StopStep::Checkpoint => {
                let low = hard.is_some_and(|h| h < last_resort);
                if low && !st.frozen_all {
                    let all = self.idents(|_| true);
                    let (pids, result) = self.signal_all(&all, SIG_STOP);
                    st.frozen_all = true;
                    st.frozen_since = Some(now);
                    st.throttle_running = false;
                    let why = format!("last resort during {}", st.reason);
                    self.log_action("pause", &why, pids, Some(SIG_STOP), result);
                } else if st.frozen_all && hard.is_some_and(|h| h >= last_resort * 1.5) {
                    // Room again: the trainers may go on to their checkpoint.
                    self.signal_all(&st.signalled, SIG_CONT);
                    st.frozen_all = false;
                    st.frozen_since = None;
                }
                // Throttle: growers held, with a short run slice per cycle
                // so a data-bound trainer still gets its batches.
                st.throttled.extend(new_growers);
                st.throttled.retain(|id| !st.signalled.contains(id));
                if !st.frozen_all && !st.throttled.is_empty() {
                    let targets: Vec<Ident> = st.throttled.iter().copied().collect();
                    if now >= st.throttle_switch {
                        if st.throttle_running {
                            self.signal_all(&targets, SIG_STOP);
                            st.throttle_running = false;
                            st.throttle_switch = now + THROTTLE_CYCLE - THROTTLE_RUN;
                        } else {
                            self.signal_all(&targets, SIG_CONT);
                            st.throttle_running = true;
                            st.throttle_switch = now + THROTTLE_RUN;
                        }
                    }
                }
                let stuck = st.frozen_since.is_some_and(|f| now - f >= LAST_RESORT_HOLD);
                if stuck && !self.may_kill() {
                    // attach: oomguard may not end a frozen tree, so the
                    // trainer alone runs (the growers stay frozen) and gets
                    // the rest of the grace to checkpoint.
                    self.signal_all(&st.signalled, SIG_CONT);
                }
                let grace_over = now >= st.grace_end || (stuck && self.may_kill());
                // With --checkpoint-dir, a new complete checkpoint is the
                // signal to go on; the trainer is never cut off while it
                // is still writing one within the grace period.
                let confirmed = st.watch.as_mut().and_then(|w| w.poll(now));
                if grace_over && trainers_alive && !self.may_kill() {
                    // attach: as far as a non-parent can go. Give back what
                    // was held and keep watching.
                    let held: Vec<Ident> = st.throttled.iter().copied().collect();
                    self.signal_all(&held, SIG_CONT);
                    if st.frozen_all {
                        let all = self.idents(|_| true);
                        self.signal_all(&all, SIG_CONT);
                    }
                    self.say(
                        "the trainer did not exit within the grace period; leaving it running \
                         (oomguard did not launch it; --allow-kill to let it stop the tree)"
                            .to_string(),
                    );
                    self.policy_end = None;
                    self.engine.reset();
                    return;
                }
                if !self.may_kill() && !trainers_alive {
                    // attach: the trainer checkpointed and left; the rest
                    // is not ours to end (nor to leave stopped).
                    self.release_stop(&st);
                    self.stop = None;
                    return;
                }
                if !trainers_alive || grace_over || confirmed.is_some() {
                    if let Some(w) = &st.watch {
                        let path =
                            confirmed.or_else(|| (!trainers_alive).then(|| w.written()).flatten());
                        self.log.write(
                            "checkpoint",
                            &serde_json::json!({
                                "path": path,
                                "confirmed": path.is_some(),
                                "waited_seconds": ((now - st.began).as_secs_f64() * 1000.0).round() / 1000.0,
                            }),
                        );
                        if path.is_some() {
                            self.checkpoint = path;
                        } else if !self.cfg.quiet {
                            self.say(
                                "no new checkpoint was confirmed in the checkpoint directory"
                                    .to_string(),
                            );
                        }
                    }
                    let rest = self.idents(|_| true);
                    if st.frozen_all && grace_over {
                        // Resuming a tree at the edge would hand the kernel
                        // the kill; end it here instead.
                        let (pids, result) = self.signal_all(&rest, SIG_KILL);
                        let why = format!("last resort during {}", st.reason);
                        self.log_action("kill", &why, pids, Some(SIG_KILL), result);
                        self.killed = true;
                        st.step = StopStep::Killed;
                    } else {
                        let (pids, result) = self.signal_all(&rest, SIG_TERM);
                        self.signal_all(&rest, SIG_CONT);
                        if !pids.is_empty() {
                            let why = format!("{}: terminating the rest of the tree", st.reason);
                            self.log_action("stop", &why, pids, Some(SIG_TERM), result);
                        }
                        st.step = StopStep::Terminate {
                            until: now + self.cfg.kill_after,
                        };
                    }
                    if grace_over && trainers_alive && !self.cfg.quiet {
                        self.say(format!(
                            "the trainer did not exit within the {} grace; terminating the job",
                            human_duration(self.cfg.policy.grace)
                        ));
                    }
                }
            }
            StopStep::Terminate { until } => {
                if now >= until {
                    let rest = self.idents(|_| true);
                    let (pids, result) = self.signal_all(&rest, SIG_KILL);
                    if !pids.is_empty() {
                        let why = format!("{}: --kill-after expired", st.reason);
                        self.log_action("kill", &why, pids, Some(SIG_KILL), result);
                    }
                    self.killed = true;
                    st.step = StopStep::Killed;
                }
            }
            StopStep::Killed if self.may_kill() => {
                let rest = self.idents(|_| true);
                self.signal_all(&rest, SIG_KILL);
            }
            StopStep::Killed => {}
        }
        let _ = st.action;
        self.stop = Some(st);
    }

    fn run_hook(&mut self, cmd: &str, action: Action, reason: &str, view: &View) {
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
        if let Some(n) = view.nearest {
            c.env("OOMGUARD_HEADROOM_BYTES", n.headroom_bytes.to_string())
                .env(
                    "OOMGUARD_HEADROOM_PERCENT",
                    format!("{:.2}", n.headroom_percent()),
                )
                .env("OOMGUARD_CEILING_BYTES", n.ceiling.bytes.to_string())
                .env("OOMGUARD_CEILING_SOURCE", n.ceiling.source.as_str());
        }
        if let Some(eta) = view.eta_seconds {
            c.env("OOMGUARD_ETA_SECONDS", format!("{eta:.1}"));
        }
        if let Some(p) = &self.cfg.log {
            c.env("OOMGUARD_LOG", p);
        }
        match c.spawn() {
            Ok(child) => {
                let pid = child.id();
                drop(child); // reaped by our reaper
                self.scanner.exclude(pid);
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
            if self.helpers.finished(r.pid).is_some() {
                self.hook_deadlines.remove(&r.pid);
                self.scanner.include(r.pid);
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
                self.ui_event(crate::tui::UiEvent::ChildExit {
                    t: self.started.elapsed().as_secs_f64(),
                    pid: r.pid,
                    how,
                });
                self.log.write(
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
        if self.tree.is_empty() || self.stop.is_some() || self.killed {
            return;
        }
        if !self.cfg.quiet {
            self.say(format!(
                "the job's main process exited; stopping {} process(es) it left behind",
                self.tree.len()
            ));
        }
        let rest = self.idents(|_| true);
        let (pids, result) = self.signal_all(&rest, SIG_TERM);
        self.signal_all(&rest, SIG_CONT);
        self.log_action(
            "stop",
            "left behind by the job's main process",
            pids,
            Some(SIG_TERM),
            result,
        );
        if self.kill_at.is_none() {
            self.kill_at = Some(Instant::now() + self.cfg.kill_after);
        }
    }

    fn refresh_tree(&mut self) {
        self.tree = self.scan_tree(false);
    }

    /// The tree's live processes (zombies are counted apart: ours are not
    /// gone until reaped). A quick scan re-reads only the processes already
    /// known; otherwise the owned cgroup's members, or a /proc walk.
    fn scan_tree(&mut self, quick: bool) -> Vec<ProcSample> {
        let found = if quick && !self.tree.is_empty() {
            // By identity: a recycled pid must not join the tree.
            let known = self.idents(|_| true);
            self.scanner.rescan(&known)
        } else if self.cfg.attach.is_some()
            && let Some(m) = self.attached_members()
        {
            // The attached job's own cgroup: every member is in it.
            self.owned_members = m.iter().copied().collect();
            self.scanner.scan(Some(&m))
        } else {
            match self
                .cgroup
                .as_ref()
                .filter(|c| c.owned())
                .and_then(|c| c.procs())
            {
                // A full scan of an owned cgroup also walks /proc: a process
                // that moved itself out of the cgroup is still the job's.
                Some(m) => {
                    self.owned_members = m.iter().copied().collect();
                    self.scanner.scan_descendants_and(&m)
                }
                None => self.scanner.scan(None),
            }
        };
        let me = std::process::id();
        self.zombie_children = found
            .iter()
            .filter(|f| f.stat.state == 'Z' && f.stat.ppid == me)
            .count();
        found
            .into_iter()
            .filter(|f| f.stat.state != 'Z')
            .map(ProcSample::from)
            .collect()
    }

    fn on_signal(&mut self, sig: i32) {
        if sig == libc::SIGHUP && self.tui.as_ref().is_some_and(|t| t.hung_up()) {
            // The dashboard's terminal went away (not a HUP sent by hand).
            self.on_hangup();
            return;
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
        self.forward(sig);
        if ends {
            let why = format!("{} received", supervise::signal_name(sig));
            self.log_action("stop", &why, vec![self.job.pid], Some(sig), "ok".into());
            if self.foreground {
                supervise::reclaim_foreground(std::io::stdin().as_fd());
                self.foreground = false;
            }
            // A paused job cannot handle the signal: let it run.
            let paused: Vec<Ident> = self.paused.drain().collect();
            self.signal_all(&paused, SIG_CONT);
            self.shutdown_signal = Some(sig);
            self.kill_at = Some(Instant::now() + self.cfg.kill_after);
        }
    }

    /// Forwards a signal to the job as a terminal would: to its process
    /// group, or to every tree process once the group is gone.
    fn forward(&mut self, sig: i32) {
        if self.main_status.is_none() && supervise::signal_group(self.job.pid, sig).is_ok() {
            return;
        }
        self.refresh_tree();
        let all = self.idents(|_| true);
        self.signal_all(&all, sig);
    }

    fn kill_tree(&mut self, why: &str) {
        if !self.may_kill() {
            self.kill_at = None;
            self.say(format!(
                "{why}: not killing processes oomguard did not launch (use --allow-kill)"
            ));
            return;
        }
        self.refresh_tree();
        if !self.killed && !self.tree.is_empty() && !self.cfg.quiet {
            self.say(format!("{why}: killing {} process(es)", self.tree.len()));
        }
        let first = !self.killed;
        self.killed = true;
        let all = self.idents(|_| true);
        let (pids, result) = self.signal_all(&all, SIG_KILL);
        if self.main_status.is_none() {
            let _ = supervise::signal_group(self.job.pid, SIG_KILL);
        }
        // Logged once: the later rounds only catch late-born processes.
        if first {
            self.log_action("kill", why, pids, Some(SIG_KILL), result);
        }
        // Processes born between the scan and the signals are caught by
        // the next round.
        self.kill_at = Some(Instant::now() + Duration::from_millis(100));
    }

    /// The latest GPU reading (never blocks: NVML runs on its own thread),
    /// attributed to the tree's processes by pid, namespaced pids included.
    fn sample_gpus(&mut self, procs: &mut [ProcSample]) -> Option<Vec<crate::model::GpuSample>> {
        use crate::probe::gpu::{TreeProc, attribute, read_ns_pids};
        let reading = self.gpu.as_mut().and_then(|g| g.sample())?;
        let root = self.cfg.proc_root.clone();
        let tree: Vec<TreeProc> = procs
            .iter()
            .map(|p| TreeProc {
                pid: p.pid,
                ns_pids: self
                    .ns_pids
                    .entry((p.pid, p.start_time))
                    .or_insert_with(|| read_ns_pids(&root, p.pid).unwrap_or_default())
                    .clone(),
            })
            .collect();
        let live: HashSet<Ident> = procs.iter().map(|p| (p.pid, p.start_time)).collect();
        self.ns_pids.retain(|id, _| live.contains(id));
        let att = attribute(&reading.devices, &tree);
        let mut shares = HashMap::new();
        for p in procs.iter_mut() {
            p.gpu_bytes = att.gpu_bytes(p.pid);
            if let Some(b) = p.gpu_bytes {
                shares.insert((p.pid, p.start_time), b);
            }
        }
        let gpus: Vec<crate::model::GpuSample> = reading
            .devices
            .iter()
            .map(|d| {
                let a = att.devices.iter().find(|a| a.index == d.index);
                crate::model::GpuSample {
                    index: d.index,
                    name: d.name.clone(),
                    uuid: d.uuid.clone(),
                    used_bytes: d.used_bytes,
                    total_bytes: d.total_bytes,
                    free_bytes: d.free_bytes,
                    reserved_bytes: d.reserved_bytes,
                    util_percent: d.util_percent,
                    tree_bytes: a.map_or(0, |a| a.tree_bytes),
                    foreign_bytes: a.map_or(0, |a| a.foreign_bytes),
                    age_seconds: None,
                }
            })
            .collect();
        self.gpu_last = Some((reading.taken_at, gpus.clone(), shares));
        Some(gpus)
    }

    /// The last GPU reading, marked with its age, for a tick that does not
    /// wait for NVML: the GPU series never blink out near a ceiling.
    fn last_gpus(&self, procs: &mut [ProcSample], now: Instant) -> Vec<crate::model::GpuSample> {
        let Some((taken, gpus, shares)) = &self.gpu_last else {
            return Vec::new();
        };
        for p in procs.iter_mut() {
            p.gpu_bytes = shares.get(&(p.pid, p.start_time)).copied();
        }
        let age = (now.saturating_duration_since(*taken).as_secs_f64() * 1000.0).round() / 1000.0;
        gpus.iter()
            .cloned()
            .map(|mut g| {
                g.age_seconds = Some(age);
                g
            })
            .collect()
    }

    /// Seconds until the fullest GPU is full at its recent growth.
    fn gpu_eta(&mut self, sample: &Sample) -> Option<f64> {
        let g = sample
            .gpus
            .iter()
            .filter(|g| g.total_bytes > 0)
            .max_by(|a, b| {
                (a.used_bytes * 1000 / a.total_bytes).cmp(&(b.used_bytes * 1000 / b.total_bytes))
            })?;
        self.gpu_history.push_back((sample.t, g.used_bytes as f64));
        while self
            .gpu_history
            .front()
            .is_some_and(|&(t, _)| sample.t - t > 10.0)
        {
            self.gpu_history.pop_front();
        }
        if self.gpu_history.len() < 3 {
            return None;
        }
        let slope = crate::model::least_squares_slope(self.gpu_history.iter().copied())?;
        (slope > 0.0).then(|| g.total_bytes.saturating_sub(g.used_bytes) as f64 / slope)
    }

    /// Keeps the last minute of each process's memory and where it sits in
    /// the tree.
    fn remember(&mut self, sample: &Sample) {
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

    /// When an OOM-kill counter rises, finds the kernel's report of the kill
    /// (by pid, among the processes oomguard has seen in the tree) and
    /// writes an `oom_kill` event.
    fn check_oom_kills(&mut self, sample: &Sample) {
        let cg = sample.cgroup.as_ref().and_then(|c| c.oom_kill_count);
        let vm = sample.system.oom_kill_total;
        let (seen_cg, seen_vm) = self.oom_seen;
        self.oom_seen = (cg, vm);
        let rose = match (cg, seen_cg) {
            (Some(now), Some(before)) => now > before,
            // Without a cgroup, the machine's counter says "someone".
            (None, _) => vm.zip(seen_vm).is_some_and(|(n, b)| n > b),
            _ => false,
        };
        if rose {
            self.explain_oom_kills(sample.t);
        }
    }

    fn explain_oom_kills(&mut self, t: f64) {
        let log = crate::forensics::kmsg::read_kernel_log(Some(Duration::from_secs(300)));
        let kills = match &log {
            Ok(l) => crate::forensics::kernel::parse(&l.text),
            Err(_) => Vec::new(),
        };
        let mut found = false;
        for kill in kills.iter().rev() {
            if self.oom_reported.contains(&kill.pid) {
                continue;
            }
            let Some((_, who)) = self.recent.iter().find(|((pid, _), _)| *pid == kill.pid) else {
                continue;
            };
            let memory: Vec<serde_json::Value> = who
                .points
                .iter()
                .map(|&(pt, rss, pss)| serde_json::json!({"t": (pt * 1000.0).round() / 1000.0, "rss_bytes": rss, "pss_bytes": pss}))
                .collect();
            let (role, place, comm) = (who.role, who.place.clone(), who.comm.clone());
            self.oom_reported.insert(kill.pid);
            found = true;
            self.ui_event(crate::tui::UiEvent::OomKill {
                t,
                pid: kill.pid,
                comm: comm.clone(),
                role: Some(role),
            });
            self.log.write_at(
                "oom_kill",
                t,
                &serde_json::json!({
                    "pid": kill.pid,
                    "comm": comm,
                    "role": role,
                    "place": place,
                    "anon_rss_bytes": kill.anon_rss_bytes,
                    "constraint": kill.constraint,
                    "cgroup": kill.cgroup,
                    "kill": kill,
                    "memory": memory,
                }),
            );
            if !self.cfg.quiet {
                self.say(format!(
                    "the kernel OOM killer killed {comm} (pid {}, {place}){}",
                    kill.pid,
                    kill.anon_rss_bytes.map_or(String::new(), |b| format!(
                        " holding {} anonymous memory",
                        HumanBytes(b)
                    ))
                ));
            }
        }
        if !found {
            // The counter rose but the report is not readable (or names no
            // process of ours): say what is known.
            let why = match &log {
                Ok(_) => "no matching report in the kernel log".to_string(),
                Err(e) => e.to_string(),
            };
            self.log.write_at(
                "oom_kill",
                t,
                &serde_json::json!({ "pid": null, "role": null, "reason": why }),
            );
        }
    }

    /// Whether the kernel OOM killer took a process of the job during this
    /// attempt (the job cgroup's counter, else the machine's).
    fn kernel_killed(&self, sample: &Sample) -> bool {
        let cg_kills = sample.cgroup.as_ref().and_then(|c| c.oom_kill_count);
        match (cg_kills, self.oom_kills_at_start) {
            (Some(now), Some(before)) => now > before,
            _ => sample
                .system
                .oom_kill_total
                .zip(self.vm_oom_kills_at_start)
                .is_some_and(|(n, b)| n > b),
        }
    }

    /// Whether a kernel OOM kill leads to a restart: with
    /// `--on-critical restart` (the policy meant to restart anyway) or
    /// `--restart-on oom-kill`.
    fn restart_enabled(&self) -> bool {
        let p = self.engine.policy();
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
        let status = self.main_status.unwrap_or(Status::Exited(0));
        let ran = self.attempt_started.elapsed();
        let sample = self.sample(true);
        let kernel = self.kernel_killed(&sample);
        let how = match status {
            _ if self.policy_end.is_some() => format!(
                "stopped by oomguard ({})",
                self.policy_end.map_or("", |a| a.name())
            ),
            _ if kernel => "hit by the kernel OOM killer".to_string(),
            Status::Exited(c) => format!("exited with {c}"),
            Status::Signaled(s) => format!("killed by {}", supervise::signal_name(s)),
        };
        if self.attempts.len() < self.attempt as usize {
            let at = self
                .progress
                .current()
                .map(|p| p.describe())
                .filter(|d| !d.is_empty())
                .map_or(String::new(), |d| format!(" at {d}"));
            self.attempts.push(format!(
                "attempt {}: {how} after {}{at}",
                self.attempt,
                human_duration(ran)
            ));
        }
        let on = |k: &str| self.cfg.restart.restart_on.iter().any(|x| x == k);
        let cuda = self.cuda_oom.is_some() && on("cuda-oom") && status != Status::Exited(0);
        let memory_death = self.memory_death && self.restart_enabled();
        let wanted = self.cfg.attach.is_none()
            && (self.policy_end == Some(Action::Restart)
                || (kernel && self.restart_enabled())
                || memory_death
                || cuda);
        if !wanted || self.shutdown_signal.is_some() || self.no_more_attempts {
            return false;
        }
        let Some(delay) = self.budget.next(ran) else {
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
        let mut degraded = serde_json::Map::new();
        for d in &r.degrade {
            let current = self
                .env
                .get(&d.name)
                .cloned()
                .or_else(|| std::env::var(&d.name).ok());
            match d.next(current.as_deref()) {
                Some(new) => {
                    degraded.insert(d.name.clone(), serde_json::json!([current, new]));
                    self.env.insert(d.name.clone(), new);
                }
                None => self.say(format!(
                    "cannot degrade {}: it is {} (half and dec need a number)",
                    d.name,
                    current.map_or("not set".to_string(), |c| format!("'{c}'"))
                )),
            }
        }
        if cuda && self.cuda_oom == Some(true) {
            // Fragmentation: the cure PyTorch itself suggests.
            let name = "PYTORCH_CUDA_ALLOC_CONF";
            let current = self
                .env
                .get(name)
                .cloned()
                .or_else(|| std::env::var(name).ok());
            let has = current
                .as_deref()
                .is_some_and(|c| c.contains("expandable_segments"));
            if !has {
                let new = match current.as_deref() {
                    Some(c) if !c.is_empty() => format!("{c},expandable_segments:True"),
                    _ => "expandable_segments:True".to_string(),
                };
                degraded.insert(name.to_string(), serde_json::json!([current, new]));
                self.env.insert(name.to_string(), new);
            }
        }
        let reason = match (&self.stop, self.policy_end) {
            (Some(st), Some(Action::Restart)) => st.reason.clone(),
            _ if kernel => "kernel OOM kill".to_string(),
            _ if memory_death => {
                "a worker or rank was SIGKILLed with memory at the warn level".to_string()
            }
            _ if cuda => "CUDA out of memory".to_string(),
            _ => "restart".to_string(),
        };
        self.restarts += 1;
        // The restart line belongs to the attempt it starts: its envelope
        // `attempt` is the new number.
        self.log.set_attempt(self.attempt + 1);
        let changes: Vec<(String, String)> = degraded
            .iter()
            .map(|(k, v)| (k.clone(), v[1].as_str().unwrap_or("").to_string()))
            .collect();
        self.ui_event(crate::tui::UiEvent::Restart {
            t: self.started.elapsed().as_secs_f64(),
            attempt: self.attempt + 1,
            degraded: changes,
        });
        self.log.write(
            "restart",
            &serde_json::json!({
                "reason": reason,
                "checkpoint": self.checkpoint,
                "degraded": degraded,
                "delay_seconds": delay.as_secs_f64(),
            }),
        );
        if !self.cfg.quiet {
            let changes: Vec<String> = degraded
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{k} {} -> {}",
                        v[0].as_str().unwrap_or("unset"),
                        v[1].as_str().unwrap_or("")
                    )
                })
                .collect();
            let changes = if changes.is_empty() {
                String::new()
            } else {
                format!(" with {}", changes.join(", "))
            };
            self.say(format!(
                "restarting in {} (attempt {} of at most {}){changes}{}",
                human_duration(delay),
                self.attempt + 1,
                self.cfg.restart.max_restarts + 1,
                self.checkpoint
                    .as_ref()
                    .map_or(String::new(), |c| format!(" from {}", c.display()))
            ));
        }
        if self.foreground {
            // Between attempts Ctrl-C must reach oomguard.
            supervise::reclaim_foreground(std::io::stdin().as_fd());
        }
        self.relaunch_at = Some(Instant::now() + delay);
        true
    }

    /// Starts the next attempt.
    fn relaunch(&mut self) {
        self.relaunch_at = None;
        self.attempt += 1;
        self.log.set_attempt(self.attempt);
        let argv = match &self.cfg.restart.resume_cmd {
            Some(cmd) if self.checkpoint.is_some() => vec![
                OsString::from("/bin/sh"),
                OsString::from("-c"),
                OsString::from(crate::restart::substitute(cmd, self.checkpoint.as_deref())),
            ],
            _ => self.cfg.argv.clone(),
        };
        let mut env = attempt_env(self.attempt, self.checkpoint.as_deref(), &self.env);
        if let Some((inj, _)) = &self.torch {
            let base = self
                .env
                .get("PYTHONPATH")
                .map(OsString::from)
                .or_else(|| std::env::var_os("PYTHONPATH"));
            env.extend(inj.env(base.as_deref()));
        }
        let slave = match (&self.tui, &self.app) {
            (Some(t), Some(a)) => match open_job_pty(t, a) {
                Ok((m, s)) => {
                    self.pty = Some(m);
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
        if let Some(app) = self.app.as_mut() {
            app.set_attempt(self.attempt);
        }
        match launched {
            Ok(job) => {
                let now = Instant::now();
                self.scanner.set_job(Some(job.pid));
                self.job = job;
                self.main_status = None;
                self.tree.clear();
                self.zombie_children = 0;
                self.kill_at = None;
                self.killed = false;
                self.paused.clear();
                self.stop = None;
                self.policy_end = None;
                self.cuda_oom = None;
                self.memory_death = false;
                self.progress = crate::forensics::progress::ProgressTracker::new();
                self.log.set_progress(None, false);
                self.metrics.set_progress(None, None);
                self.engine.reset();
                self.history.clear();
                self.next_tick = now;
                self.next_full = now;
                self.last_view = None;
                self.last_sample = None;
                self.last_logged = None;
                self.attempt_started = now;
                let cg = self.cgroup.as_ref().and_then(|c| c.read());
                self.oom_kills_at_start = cg.and_then(|c| c.oom_kill_count);
                self.vm_oom_kills_at_start = self.system.read(now).oom_kill_total;
            }
            Err(e) => {
                self.say(format!("cannot restart: {e}"));
                self.no_more_attempts = true;
                self.main_status = Some(Status::Exited(e.exit_code()));
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
        self.tree.is_empty() && self.zombie_children == 0
    }

    fn finish(mut self) -> i32 {
        // Give the terminal back before anything is printed to it.
        self.close_dashboard();
        // The job's last bytes come before oomguard's own lines.
        if let Some(r) = self.relay.as_mut() {
            r.finish();
            r.flush(Duration::from_secs(2));
        }
        self.pty_scanner.finish();
        self.log_output_events();
        if let Some(r) = &self.relay
            && !self.cfg.quiet
        {
            let stats = r.stats();
            for (name, st) in [("stdout", stats.stdout), ("stderr", stats.stderr)] {
                if st.dropped_bytes > 0 {
                    eprintln!(
                        "oomguard: {} of the job's {name} could not be passed on (dropped under --output-drop, or the reader closed its end)",
                        HumanBytes(st.dropped_bytes)
                    );
                }
            }
        }
        let status = self.main_status.unwrap_or(Status::Exited(0));
        let sample = self.sample(false);
        let view = self.history.push(&sample);
        self.record(&sample, &view, true, false, None);
        let cg_kills = sample.cgroup.as_ref().and_then(|c| c.oom_kill_count);
        let kernel_killed = match (cg_kills, self.oom_kills_at_start) {
            (Some(now), Some(before)) => now > before,
            // No cgroup to ask: the machine-wide counter is the best hint.
            _ => sample
                .system
                .oom_kill_total
                .zip(self.vm_oom_kills_at_start)
                .is_some_and(|(n, b)| n > b),
        };
        // The kernel killed a tree process and the job failed: whichever
        // process the kernel picked, that is why (unless oomguard's own
        // SIGKILL is what the job died of).
        let oom_killed = kernel_killed
            && status.code() != 0
            && !(self.killed && status == Status::Signaled(libc::SIGKILL));
        // `attach`: a watch that ended before the job did is not an exit.
        let detached = self.cfg.attach.is_some() && self.main_status.is_none();
        let (outcome, mut exit_code) = match status {
            _ if self.internal_error.is_some() => (Outcome::InternalError, EXIT_INTERNAL),
            _ if detached => (Outcome::Detached, 0),
            _ if self.restart_limit => (Outcome::RestartLimit, EXIT_POLICY),
            _ if oom_killed => (Outcome::OomKilled, status.code()),
            _ if self.policy_end.is_some() => (Outcome::StoppedByPolicy, EXIT_POLICY),
            Status::Exited(c) => (Outcome::Exited, c),
            Status::Signaled(s) => (Outcome::Signaled, 128 + s),
        };
        let duration = self.started.elapsed();
        let fail_above = self.cfg.fail_above.map(|limit| {
            let exceeded = self.stats.peak.tree_pss_bytes > limit;
            (limit, exceeded)
        });
        // The gate only turns a success into a failure: a job that failed
        // keeps its own code.
        if fail_above.is_some_and(|(_, exceeded)| exceeded) && exit_code == 0 {
            exit_code = EXIT_FAIL_ABOVE;
        }
        self.write_run_end(
            outcome,
            &RunEnd {
                outcome,
                exit_code,
                peak: self.stats.peak.clone(),
                restarts: self.restarts,
                actions: self.stats.actions.clone(),
                duration_seconds: (duration.as_secs_f64() * 1000.0).round() / 1000.0,
                error: self.internal_error.clone(),
                fail_above: fail_above.map(|(limit_bytes, exceeded)| crate::log::FailAbove {
                    limit_bytes,
                    exceeded,
                }),
                output_dropped_bytes: self.relay.as_ref().map(|r| {
                    let st = r.stats();
                    st.stdout.dropped_bytes + st.stderr.dropped_bytes
                }),
            },
        );
        if let Some((limit, true)) = fail_above
            && !self.cfg.quiet
        {
            eprintln!(
                "oomguard: peak footprint {} exceeded --fail-above {}; exit {}",
                HumanBytes(self.stats.peak.tree_pss_bytes),
                HumanBytes(limit),
                exit_code
            );
        }
        if outcome == Outcome::OomKilled {
            self.annotate(
                "oom_kill",
                crate::github::Level::Error,
                "oomguard: OOM kill",
                "the kernel OOM killer killed the job",
            );
        }
        if self.annotator.is_some()
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
                peak: self.stats.peak.clone(),
                ceilings: sample.ceilings().iter().map(|c| c.ceiling).collect(),
                least_headroom_bytes: self.stats.least_headroom.map(|l| l.headroom_bytes),
                actions: self.stats.actions.clone(),
                fail_above_bytes: self.cfg.fail_above,
            };
            if let Err(e) =
                crate::github::append_step_summary(&path, &crate::github::step_summary(&data))
            {
                eprintln!("oomguard: {e}");
            }
        }
        if let Some(t) = self.textfile.take()
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
            (Outcome::OomKilled, _) => "was killed by the kernel OOM killer (exit 137)".to_string(),
            (Outcome::StoppedByPolicy, _) => format!(
                "was stopped by oomguard ({}) before the kernel OOM killer; exit {exit_code}",
                // An attached trainer that checkpointed and left ends the
                // stop early: the action, not "kill", is what happened.
                self.stop.as_ref().map_or_else(
                    || self.policy_end.map_or("kill", |a| a.name()),
                    |s| s.reason.as_str()
                )
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
        let s = &self.stats;
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
        eprintln!(
            "oomguard: peak footprint {} PSS at {:.0}s{holder}; peak RSS sum {}",
            HumanBytes(s.peak.tree_pss_bytes),
            s.peak.t,
            HumanBytes(s.peak.tree_rss_bytes),
        );
        if let Some(l) = s.least_headroom {
            eprintln!(
                "oomguard: nearest ceiling: {} {} (least headroom {}, {:.0}%); peak swap used {}",
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

/// Shows a desktop notification off the supervision path: fire and forget,
/// abandoned after `NOTIFY_TIMEOUT`, and only when a session bus exists.
fn notify(summary: String, body: String) {
    let bus = std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some()
        || std::env::var_os("XDG_RUNTIME_DIR")
            .is_some_and(|d| std::path::Path::new(&d).join("bus").exists());
    if !bus {
        return;
    }
    tokio::spawn(async move {
        let mut n = notify_rust::Notification::new();
        n.summary(&summary).body(&body).appname("oomguard");
        let _ = tokio::time::timeout(NOTIFY_TIMEOUT, n.show_async()).await;
    });
}
