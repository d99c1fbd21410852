//! Starting a run: everything opened before the job exists (log,
//! metrics, signal handlers, the owned cgroup, the dashboard and its pty,
//! the output relay), the launch, the readers the loop samples with, and
//! the loop itself. A usage problem found here exits 2 before the job
//! starts; a failure after `run_start` ends the log with `run_end`.

use super::child::Child;
use super::screen::Brought;
use super::wakeups::Kernel;
use std::io::IsTerminal;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use super::act::{Actuator, DesktopNotifier, ProcSignaller};
use super::host::{Launch, launch};
use super::oom::OomWatch;
use super::outside::Outside;
use super::sampler::{Readers as SamplerReaders, Sampler};
use super::sinks::{Outlets, Sinks};
use super::tick::{Core, Voice};
use super::{
    EXIT_INTERNAL, Settings, Supervisor, attach, attach_to, drain_output, internal_failure,
    open_job_pty, report_stale, spawn_failed,
};
use crate::engine::policy::Engine;
use crate::engine::probe::cgroup::{self, CgroupReader, OwnedCgroup};
use crate::engine::probe::proc::{TreeRoot, TreeScanner};
use crate::engine::probe::pss::SweepConfig;
use crate::engine::probe::system::SystemReader;
use crate::engine::probe::torch_stats::TorchStatsReader;
use crate::job::inject::TorchStatsInjector;
use crate::job::relay::{JobStdio, OutputError, OutputRelay, RelayOptions};
use crate::job::restart::Budget;
use crate::job::supervise::{self, Job};
use crate::settings::cli::CgroupMode;
use crate::sinks::log::{GpuInfo, LogWriter};
use crate::vocab::model::SystemSample;

/// Where the run's own records go, opened before the job starts: a port in
/// use or an unwritable file is a usage error (exit 2), not something to
/// find out later.
struct Outputs {
    log: LogWriter,
    metrics: crate::sinks::metrics::Metrics,
    /// Stops the metrics endpoint when dropped.
    metrics_stop: Option<tokio::sync::oneshot::Sender<()>>,
    textfile: Option<crate::sinks::metrics::Textfile>,
}

/// The dashboard, its state, and the job's pty (the dashboard owns the real
/// terminal; the job gets a terminal of its own).
#[derive(Default)]
struct OpenedDashboard {
    tui: Option<crate::sinks::tui::Tui>,
    app: Option<crate::sinks::tui::App>,
    pty: Option<crate::sinks::tui::PtyMaster>,
    /// The job's side of the pty, until the job has it.
    slave: Option<OwnedFd>,
}

/// How the job's output reaches its destination.
#[derive(Default)]
struct Output {
    relay: Option<OutputRelay>,
    /// The job's ends of the relay, for the first attempt.
    stdio: Option<JobStdio>,
    /// `--output-log` with the dashboard: the pty's output, copied.
    pty_log: Option<crate::job::relay::output_log::OutputLogFile>,
}

/// The start-up hook's directory, with the allocator reader under
/// `--torch-stats`.
type Torch = (TorchStatsInjector, Option<TorchStatsReader>);

/// The readers the loop samples with.
struct Readers {
    scanner: TreeScanner,
    system: SystemReader,
    first_system: SystemSample,
    cgroup: Option<CgroupReader>,
    attached: Option<attach::Attached>,
    budget_bytes: Option<u64>,
}

pub(super) async fn supervise_job(
    cfg: Settings,
    doctor: Option<crate::vocab::verdict::Watch>,
) -> i32 {
    let started = crate::vocab::clock::now();
    // Read before oomguard forks anything: these are not the job's.
    let strangers = if cfg.attach.is_none() {
        crate::engine::probe::proc::inherited_children(&cfg.proc_root)
    } else {
        Vec::new()
    };
    let Outputs {
        mut log,
        metrics,
        metrics_stop,
        textfile,
    } = match open_outputs(&cfg, started).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    // Every handler is registered before the job exists, so no signal (and
    // no SIGCHLD) can arrive unhandled.
    let Ok(outside) = Outside::from_kernel() else {
        return internal_failure(&mut log, &cfg, "cannot handle SIGCHLD".into());
    };
    if cfg.attach.is_none()
        && let Err(e) = supervise::become_subreaper()
    {
        eprintln!("oomguard: cannot become a child subreaper ({e}); orphaned workers may escape");
    }
    let (owned, not_owned_reason) = own_cgroup(&cfg).await;
    let stdin = std::io::stdin();
    let foreground = stdin.is_terminal() && supervise::owns_foreground(stdin.as_fd());
    let torch = match open_torch(&cfg) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let mut screen = open_dashboard(&cfg);
    // With the dashboard the job's terminal is its pty, not ours.
    let foreground = foreground && screen.slave.is_none();
    let mut output = match open_output(&cfg, screen.slave.is_some()) {
        Ok(o) => o,
        Err(OutputSetupError::Usage(msg)) => {
            eprintln!("oomguard: {msg}");
            return 2;
        }
        // Pipes or threads for the relay: oomguard's own failure (e.g. out
        // of file descriptors), not the user's.
        Err(OutputSetupError::Internal(msg)) => return internal_failure(&mut log, &cfg, msg),
    };
    let channel = open_channel(&cfg, torch.as_ref());
    let (first_env, resume_note) = first_env(&cfg, torch.as_ref(), channel.as_ref());
    let start = Start {
        env: first_env,
        owned,
        not_owned_reason,
        foreground,
        slave: screen.slave.as_ref(),
    };
    let (job, owned, not_owned_reason) = match start_job(&cfg, start, &mut output) {
        Ok(j) => j,
        Err(StartError::Usage) => return 2,
        Err(StartError::Internal(e)) => return internal_failure(&mut log, &cfg, e),
        Err(StartError::Spawn(e)) => return spawn_failed(&mut log, &cfg, &e),
    };
    let channel = match cfg.attach {
        Some(_) => attached_channel(&cfg, &job),
        None => channel,
    };
    // Our copy of the pty's job side must go, or the master never sees EOF;
    // the same for the relay's copies of the job's ends.
    screen.slave = None;
    if let Some(r) = output.relay.as_mut() {
        r.after_spawn();
    }
    let mut readers = open_readers(&cfg, owned.as_ref(), &job, started);
    readers.scanner.set_strangers(&strangers);
    // The output keeper is oomguard's child, not the job's.
    if let Some(pid) = output.relay.as_ref().and_then(|r| r.keeper_pid()) {
        readers.scanner.exclude(pid);
    }
    let cg_first = readers.cgroup.as_ref().and_then(|c| c.read());
    let parts = Parts {
        outputs: Outputs {
            log,
            metrics,
            metrics_stop,
            textfile,
        },
        readers,
        owned,
        job,
        foreground,
        torch,
        channel,
        screen,
        output,
        cg_oom_kills: cg_first.as_ref().and_then(|c| c.oom_kill_count),
        started,
        sig: Box::new(ProcSignaller::new(&cfg.proc_root)),
        host: Box::new(super::host::Os),
        doctor,
    };
    let mut sup = Supervisor::assemble(cfg, parts);
    if let Some(note) = resume_note {
        sup.say(note);
    }
    sup.keep_pty();
    let restartable = sup.restart_enabled();
    if let Some(app) = sup.sinks.app_mut() {
        app.set_restart_available(restartable);
    }
    let memory_high = sup.set_memory_high(cg_first.as_ref());
    sup.write_run_start(not_owned_reason, memory_high);
    sup.warn_budget_above_memory();
    sup.arm_wakeups(cg_first.as_ref());
    run_loop(sup, outside).await
}

impl Supervisor {
    /// `memory.high` on the job's own v2 cgroup, three quarters of the way
    /// from the critical level to the ceiling (see `wakeups.rs`).
    fn set_memory_high(&self, cg: Option<&crate::vocab::model::CgroupSample>) -> Option<u64> {
        let (reader, cg) = (self.sampler.cgroup()?, cg?);
        let crit = self.core.policy().thresholds().1?;
        let budget = self.sampler.budget_bytes();
        super::wakeups::set_memory_high(&self.cfg.without, reader, cg, crit, budget)
    }

    /// `--budget` above the machine's memory is taken (one `oomguard.toml`
    /// serves nodes of several sizes, and the machine stays a ceiling of
    /// its own), but said: on this node the budget never decides.
    fn warn_budget_above_memory(&mut self) {
        let Some(budget) = self.sampler.budget_bytes() else {
            return;
        };
        let meminfo =
            std::fs::read_to_string(self.cfg.proc_root.join("meminfo")).unwrap_or_default();
        let Some((total, ..)) = crate::engine::probe::system::parse_meminfo(&meminfo) else {
            return;
        };
        if budget > total && !self.cfg.quiet {
            use crate::vocab::units::HumanBytes;
            self.say(format!(
                "--budget {} is more than this machine's memory (MemTotal {}): here the \
                 machine's own ceiling comes first, and the budget never decides",
                HumanBytes(budget),
                HumanBytes(total)
            ));
        }
    }

    /// Arms the kernel's wake-ups (v1 thresholds on the limit and on the
    /// budget where the cgroup is the job's alone; PSI; `memory.events`),
    /// saying once which the kernel refused.
    fn arm_wakeups(&mut self, cg: Option<&crate::vocab::model::CgroupSample>) {
        if let (Some(reader), Some(cg)) = (self.sampler.cgroup(), cg) {
            let budget_here = reader.owned() || self.attached_exclusive();
            let refused = self.wakeups.register_thresholds(
                reader,
                cg,
                self.sampler.budget_bytes(),
                budget_here,
                &self.core.wake_levels(),
            );
            self.not_armed(refused);
        }
        let refused = (self.wakeups).register_pri(self.sampler.cgroup(), &self.cfg.proc_root);
        self.not_armed(refused);
    }
}

/// The loop: a `select!` over the few things that can happen, each handed
/// to the supervisor; then the job's last output, and the ending.
pub(super) async fn run_loop(mut sup: Supervisor, mut outside: Outside) -> i32 {
    let mut pty_buf = vec![0u8; 64 * 1024];
    loop {
        let forwarded = outside.signals.next();
        let wake = sup.next_wake();
        if sup.core.act().companion().spans_nodes() {
            sup.wakeups
                .follow_ranks(&sup.core.act().peers().rank_pids());
        }
        let kernel = sup.wakeups.kernel();
        let brought = sup.screen.next(&mut pty_buf);
        tokio::select! {
            () = outside.children.exited() => sup.reap(),
            sig = forwarded => sup.on_signal(sig),
            _ = tokio::time::sleep_until(wake.into()) => sup.on_timer(),
            k = kernel => {
                sup.wakeups.woke(&k);
                match k {
                    Kernel::RankEnded(pid) => sup.on_rank_end(pid),
                    _ => sup.tick(true),
                }
            }
            b = brought => match b {
                Brought::Output(n) => sup.on_output(n, &pty_buf),
                Brought::Term(ev) => sup.on_term(ev),
            },
            pumped = sup.output.pump() => sup.on_relay(pumped),
        }
        sup.draw();
        if sup.attempts.due(crate::vocab::clock::now()) {
            sup.relaunch();
        }
        if !sup.attempts.between() && sup.finished() && !sup.plan_restart() {
            break;
        }
    }
    let shutting_down = sup.child.shutdown_signal().is_some();
    if !drain_output(sup.output.relay_mut(), &mut outside.signals, shutting_down).await {
        sup.output.abandon();
    }
    sup.finish()
}

async fn open_outputs(cfg: &Settings, started: Instant) -> Result<Outputs, i32> {
    let mut log = match &cfg.log {
        Some(path) => LogWriter::create(path, started).map_err(|e| {
            eprintln!("oomguard: {e}");
            usage_or_internal(&e.source)
        })?,
        None => LogWriter::disabled(started),
    };
    // A destination the user named that cannot be used is a usage error
    // (exit 2); oomguard running short of descriptors or memory while
    // opening it is its own (70, and the log, if open, ends with run_end).
    let mut refused = |e: &dyn std::fmt::Display, source: &std::io::Error| {
        if supervise::out_of_resources(source) {
            internal_failure(&mut log, cfg, e.to_string())
        } else {
            eprintln!("oomguard: {e}");
            2
        }
    };
    let metrics = crate::sinks::metrics::Metrics::new(
        crate::sinks::metrics::constant_labels(),
        env!("CARGO_PKG_VERSION"),
    );
    let mut metrics_stop = None;
    if let Some(addr) = cfg.run.metrics_addr {
        if let Some(w) = crate::sinks::metrics::http::exposure_warning(addr) {
            eprintln!("oomguard: warning: {w}");
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        if let Err(e) = crate::sinks::metrics::serve(addr, metrics.clone(), async {
            let _ = rx.await;
        })
        .await
        {
            let crate::sinks::metrics::MetricsError::Bind { source, .. } = &e;
            return Err(refused(&e, source));
        }
        metrics_stop = Some(tx);
    }
    let textfile = cfg
        .run
        .metrics_textfile
        .as_ref()
        .map(crate::sinks::metrics::Textfile::new);
    if let Some(t) = &textfile
        && let Err(e) = t.write(&metrics.render())
    {
        return Err(refused(&e, &e.source));
    }
    Ok(Outputs {
        log,
        metrics,
        metrics_stop,
        textfile,
    })
}

fn usage_or_internal(e: &std::io::Error) -> i32 {
    if supervise::out_of_resources(e) {
        EXIT_INTERNAL
    } else {
        2
    }
}

/// A cgroup of the job's own (after cleaning up what a killed oomguard
/// left behind), or why there is none.
async fn own_cgroup(cfg: &Settings) -> (Option<OwnedCgroup>, Option<String>) {
    let own_loc = cgroup::locate(&cfg.proc_root, "self");
    match (cfg.cgroup, &own_loc) {
        _ if cfg.attach.is_some() => (None, Some("attached to a running process".to_string())),
        (CgroupMode::Off, _) => (None, Some("disabled with --cgroup off".to_string())),
        (CgroupMode::Auto, None) => (None, Some("no memory cgroup hierarchy found".to_string())),
        (CgroupMode::Auto, Some(loc)) => {
            report_stale(&cgroup::clean_stale(loc, &cfg.proc_root), cfg.quiet);
            match OwnedCgroup::create(loc, &job_cgroup_name()) {
                Ok(o) => (Some(o), None),
                // Root may write anywhere: a refusal is not for want of
                // delegation, and root's jobs stay where they were started.
                Err(e)
                    if OwnedCgroup::not_delegated(&e)
                        && loc.version == cgroup::Version::V2
                        && !rustix::process::geteuid().is_root() =>
                {
                    match own_user_scope(cfg, loc).await {
                        Ok(o) => (Some(o), None),
                        Err(why) => (None, Some(format!("{e}; no user scope: {why}"))),
                    }
                }
                Err(e) => (None, Some(e.to_string())),
            }
        }
    }
}

fn job_cgroup_name() -> String {
    format!("oomguard-{}", std::process::id())
}

/// The cgroup v2 case without delegation: a transient scope from the
/// user's systemd manager, and the job's cgroup inside it. Root never gets
/// here (it can create anywhere); a user's cgroup that SLURM or a memory
/// limit holds is never left (`systemd::may_leave`).
async fn own_user_scope(cfg: &Settings, here: &cgroup::Location) -> Result<OwnedCgroup, String> {
    // The cgroup's owner first: SLURM's or a limited cgroup is the answer
    // whether or not a bus is there.
    crate::job::systemd::may_leave(here, rustix::process::getuid().as_raw())?;
    let bus = crate::job::systemd::user_scope_support()?;
    let (unit, scope) = crate::job::systemd::start_user_scope(&bus, &cfg.proc_root)
        .await
        .map_err(|e| e.to_string())?;
    // oomguard is the scope's only process: OwnedCgroup moves it into a
    // leaf and enables memory, as in any delegated cgroup.
    OwnedCgroup::create(&scope, &job_cgroup_name())
        .map(|o| o.in_user_scope(unit.clone()))
        .map_err(|e| format!("in the user scope '{unit}': {e}"))
}

/// The start-up hook for Python jobs: with `--torch-stats` (a failure is
/// the user's to fix: exit 2), or for the companion alone (a failure costs
/// the companion, not the run).
fn open_torch(cfg: &Settings) -> Result<Option<Torch>, i32> {
    if cfg.run.torch_stats {
        return TorchStatsInjector::new(cfg.interval)
            .and_then(|inj| inj.reader().map(|r| (inj, Some(r))))
            .map(Some)
            .map_err(|e| {
                eprintln!("oomguard: --torch-stats: {e}");
                2
            });
    }
    if !cfg.companion() {
        return Ok(None);
    }
    match TorchStatsInjector::new(cfg.interval) {
        Ok(inj) => Ok(Some((inj.without_stats(), None))),
        Err(e) => {
            if !cfg.quiet {
                eprintln!("oomguard: no checkpoint companion for this run: {e}");
            }
            Ok(None)
        }
    }
}

/// The first attempt's environment: the attempt's own variables, the
/// start-up hook's and the channel's, and a previous run's save to resume
/// from (with what to tell the user about it).
fn first_env(
    cfg: &Settings,
    torch: Option<&Torch>,
    channel: Option<&crate::vocab::companion::Channel>,
) -> (
    Vec<(std::ffi::OsString, std::ffi::OsString)>,
    Option<String>,
) {
    let mut env = super::attempts::Attempts::first_env();
    if let Some((inj, _)) = torch {
        env.extend(inj.env(std::env::var_os("PYTHONPATH").as_deref()));
    }
    env.extend(
        channel
            .into_iter()
            .flat_map(crate::vocab::companion::Channel::env),
    );
    let note = resume_from_a_previous_run(cfg, &mut env);
    (env, note)
}

/// A save a previous run of this job left (`resume.rs`): the first
/// attempt resumes from it. Returns what to tell the user.
fn resume_from_a_previous_run(
    cfg: &Settings,
    env: &mut Vec<(std::ffi::OsString, std::ffi::OsString)>,
) -> Option<String> {
    if cfg.attach.is_some() || cfg.doctor.is_some() {
        return None;
    }
    let (path, run) = super::resume_place(cfg)?;
    if cfg.run.fresh {
        return std::fs::remove_file(&path).is_ok().then(|| {
            format!(
                "--fresh: the previous run's save ({}) is not resumed",
                path.display()
            )
        });
    }
    match super::resume::find(&path, &run) {
        super::resume::Found::Nothing => None,
        super::resume::Found::NotOurs(why) => Some(format!(
            "not resuming from {}: {why}; starting afresh",
            path.display()
        )),
        super::resume::Found::Resume(rec) => {
            env.extend(super::resume::env(&rec));
            let step = rec.step.map_or(String::new(), |s| format!(" of step {s}"));
            let ckpt = rec
                .paths
                .first()
                .map_or(String::new(), |p| format!(" ({})", p.display()));
            Some(format!(
                "resuming from the save{step}{ckpt} the previous run made ({}); --fresh starts afresh",
                rec.reason
            ))
        }
    }
}

/// The first attempt's control channel, in the hook's directory.
fn open_channel(cfg: &Settings, torch: Option<&Torch>) -> Option<crate::vocab::companion::Channel> {
    let (inj, _) = torch.filter(|_| cfg.companion())?;
    match crate::vocab::companion::Channel::create(inj.dir(), 1) {
        Ok(c) => Some(c),
        Err(e) => {
            if !cfg.quiet {
                eprintln!("oomguard: no checkpoint companion for this run: {e}");
            }
            None
        }
    }
}

/// `attach` to a job that was itself started with a control channel
/// (`OOMGUARD_CONTROL` in its environment): its companion is asked, as
/// under `run`; otherwise a stop signals, as it always did.
fn attached_channel(cfg: &Settings, job: &Job) -> Option<crate::vocab::companion::Channel> {
    let dir = crate::vocab::companion::Channel::of_process(&cfg.proc_root, job.pid)?;
    match crate::vocab::companion::Channel::join(&dir) {
        Ok(c) => {
            if !cfg.quiet {
                eprintln!(
                    "oomguard: the job has a control channel ({}): a stop asks its companion \
                     for a checkpoint",
                    dir.display()
                );
            }
            Some(c)
        }
        Err(e) => {
            if !cfg.quiet {
                eprintln!("oomguard: {e}; a stop signals the job instead");
            }
            None
        }
    }
}

/// The dashboard: when stdin and stdout are terminals and CI is unset, or
/// forced with --tui; never with --no-tui. Without a pty for the job there
/// is no dashboard (the job matters more).
fn open_dashboard(cfg: &Settings) -> OpenedDashboard {
    let in_ci = cfg.in_ci;
    let terminal = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let want = !cfg.tui.no_tui && (cfg.tui.tui || (terminal && !in_ci));
    if !want {
        return OpenedDashboard::default();
    }
    let tui = match crate::sinks::tui::Tui::new() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("oomguard: no dashboard ({e}); running without it");
            return OpenedDashboard::default();
        }
    };
    let cmd = cfg
        .argv
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let mut app = crate::sinks::tui::App::new(cmd);
    let (w, c) = cfg.policy.policy.thresholds();
    app.set_thresholds(w, c);
    if cfg.attach.is_some() {
        return OpenedDashboard {
            tui: Some(tui),
            app: Some(app),
            ..OpenedDashboard::default()
        };
    }
    match open_job_pty(&tui, &app) {
        Ok((m, s)) => OpenedDashboard {
            tui: Some(tui),
            app: Some(app),
            pty: Some(m),
            slave: Some(s),
        },
        // No /dev/pts (a minimal container or initramfs).
        Err(e) => {
            eprintln!("oomguard: {e}; running the job with pipes and no dashboard");
            OpenedDashboard::default()
        }
    }
}

/// Why the job's output cannot be set up: a path the user gave (exit 2),
/// or oomguard's own resources (exit 70).
enum OutputSetupError {
    Usage(String),
    Internal(String),
}

/// The relay of the job's stdout and stderr (not with the dashboard, whose
/// pty is read by the loop, nor under `attach`).
fn open_output(cfg: &Settings, has_pty: bool) -> Result<Output, OutputSetupError> {
    if cfg.attach.is_none() && !has_pty {
        let (relay, stdio) = OutputRelay::new(RelayOptions {
            output_log: cfg.run.output_log.clone(),
            output_log_max: cfg.run.output_log_max,
            drop_when_full: cfg.run.output_drop,
            ..Default::default()
        })
        .map_err(|e| match &e {
            OutputError::OpenLog { source, .. } if !supervise::out_of_resources(source) => {
                OutputSetupError::Usage(e.to_string())
            }
            _ => OutputSetupError::Internal(e.to_string()),
        })?;
        return Ok(Output {
            relay: Some(relay),
            stdio: Some(stdio),
            pty_log: None,
        });
    }
    let (Some(path), true) = (&cfg.run.output_log, has_pty) else {
        return Ok(Output::default());
    };
    let file = crate::job::relay::output_log::OutputLogFile::open(path, cfg.run.output_log_max)
        .map_err(|e| {
            let msg = format!("cannot write '{}': {e}", path.display());
            match supervise::out_of_resources(&e) {
                true => OutputSetupError::Internal(msg),
                false => OutputSetupError::Usage(msg),
            }
        })?;
    Ok(Output {
        pty_log: Some(file),
        ..Output::default()
    })
}

/// What the first launch needs.
struct Start<'a> {
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    owned: Option<OwnedCgroup>,
    not_owned_reason: Option<String>,
    foreground: bool,
    slave: Option<&'a OwnedFd>,
}

enum StartError {
    /// Reported already; exit 2.
    Usage,
    Internal(String),
    Spawn(supervise::SpawnError),
}

/// Launches the job (or finds the one to attach to). Joining the owned
/// cgroup can fail (a hierarchy that refuses the move): the job matters
/// more than the cgroup, so it is launched again without one.
fn start_job(
    cfg: &Settings,
    start: Start<'_>,
    output: &mut Output,
) -> Result<(Job, Option<OwnedCgroup>, Option<String>), StartError> {
    if let Some(pid) = cfg.attach {
        return match attach_to(cfg, pid) {
            Ok(job) => Ok((job, None, start.not_owned_reason)),
            Err(e) => {
                eprintln!("oomguard: {e}");
                Err(StartError::Usage)
            }
        };
    }
    let Start {
        env,
        owned,
        not_owned_reason,
        foreground,
        slave,
    } = start;
    let first = launch(
        &cfg.proc_root,
        Launch {
            argv: &cfg.argv,
            env: env.clone(),
            owned: owned.as_ref(),
            foreground,
            pty_slave: slave,
            relayed: output.stdio.take(),
        },
    );
    match first {
        Ok(job) => Ok((job, owned, not_owned_reason)),
        Err(supervise::SpawnError::Other { source, .. }) if owned.is_some() => {
            let retry = output.relay.as_ref().map(|r| r.job_stdio()).transpose();
            let retry = retry.map_err(|e| StartError::Internal(e.to_string()))?;
            let again = Launch {
                argv: &cfg.argv,
                env,
                owned: None,
                foreground,
                pty_slave: slave,
                relayed: retry,
            };
            let job = launch(&cfg.proc_root, again).map_err(StartError::Spawn)?;
            let why = format!("cannot move the job into its cgroup: {source}");
            Ok((job, None, Some(why)))
        }
        Err(e) => Err(StartError::Spawn(e)),
    }
}

fn open_readers(
    cfg: &Settings,
    owned: Option<&OwnedCgroup>,
    job: &Job,
    started: Instant,
) -> Readers {
    let cgroup_reader = match owned {
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
    let first_system = system.read(crate::vocab::clock::now());
    let budget_bytes = cfg.budget_bytes;
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

    Readers {
        scanner,
        system,
        first_system,
        cgroup: cgroup_reader,
        attached,
        budget_bytes,
    }
}

/// NVML is loaded at run time: the same binary works without a driver.
fn open_gpu(cfg: &Settings) -> (Option<crate::engine::probe::gpu::GpuProbe>, GpuInfo) {
    let off = |reason: String| GpuInfo {
        available: false,
        reason: Some(reason),
    };
    match &cfg.nvml() {
        None => (None, off("disabled with --no-gpu".into())),
        Some(lib) => match crate::engine::probe::gpu::GpuProbe::open(lib.as_deref()) {
            Ok(p) => (
                Some(p),
                GpuInfo {
                    available: true,
                    reason: None,
                },
            ),
            Err(e) => (None, off(e.to_string())),
        },
    }
}

/// Everything the supervisor is built from.
struct Parts {
    outputs: Outputs,
    readers: Readers,
    owned: Option<OwnedCgroup>,
    job: Job,
    foreground: bool,
    torch: Option<Torch>,
    channel: Option<crate::vocab::companion::Channel>,
    screen: OpenedDashboard,
    output: Output,
    /// The job cgroup's OOM-kill counter at the start.
    cg_oom_kills: Option<u64>,
    started: Instant,
    /// What sends the loop's signals, and starts and reaps its processes
    /// (the loop's tests pass fakes).
    sig: Box<dyn super::act::Signaller>,
    /// `oomguard doctor`'s hold on the run: where the finding goes.
    doctor: Option<crate::vocab::verdict::Watch>,
    host: Box<dyn super::host::Host>,
}

impl Supervisor {
    fn assemble(cfg: Settings, parts: Parts) -> Self {
        let Parts {
            outputs,
            readers,
            owned,
            job,
            foreground,
            torch,
            channel,
            screen,
            output,
            cg_oom_kills,
            started,
            sig,
            host,
            doctor,
        } = parts;
        let (gpu, gpu_info) = open_gpu(&cfg);
        let (torch, torch_reader) = match torch {
            Some((inj, reader)) => (Some(inj), reader),
            None => (None, None),
        };
        let now = crate::vocab::clock::now();
        let wakeups = super::wakeups::Wakeups::new(cfg.without, now);
        let (max_restarts, restart_delay, restart_reset) =
            (cfg.max_restarts, cfg.restart_delay, cfg.restart_reset);
        Supervisor {
            sinks: Sinks::new(
                started,
                Outlets {
                    log: outputs.log,
                    metrics: outputs.metrics,
                    textfile: outputs.textfile,
                    metrics_stop: outputs.metrics_stop,
                    app: screen.app,
                    notifier: Box::new(DesktopNotifier),
                },
                cfg.interval,
                cfg.procs_interval,
                cfg.run.log_every_tick,
            ),
            sampler: Sampler::new(
                cfg.proc_root.clone(),
                started,
                SweepConfig {
                    interval: cfg.pss_interval,
                    budget: cfg.pss_budget,
                },
                SamplerReaders {
                    scanner: readers.scanner,
                    system: readers.system,
                    cgroup: readers.cgroup,
                    budget_bytes: readers.budget_bytes,
                    gpu,
                    gpu_info,
                    torch: torch_reader,
                    torch_injector: torch,
                },
            ),
            core: Core::new(
                Engine::new(cfg.policy.policy.clone()),
                Actuator::new(act_config(&cfg)).with_channel(channel),
                Voice {
                    quiet: cfg.quiet,
                    notify: cfg.notify,
                    on_warn: cfg.on_warn.clone(),
                },
            ),
            child: Child::new(job, owned, foreground, sig, host),
            oom: {
                let mut oom = OomWatch::default();
                oom.start_attempt(cg_oom_kills, readers.first_system.oom_kill_total);
                oom
            },
            cfg,
            wakeups,
            attempts: super::attempts::Attempts::new(
                Budget::new(
                    max_restarts,
                    restart_delay,
                    Duration::from_secs(300),
                    restart_reset,
                ),
                now,
            ),
            node: (readers.attached.is_none() && doctor.is_none())
                .then(|| super::node_group::Place::from_env(|k| std::env::var(k).ok()))
                .flatten()
                .map(super::node_group::NodeGroup::new),
            target: super::target::Target::new(readers.attached, doctor),
            screen: super::screen::Screen::new(screen.tui, screen.pty),
            internal_error: None,
            output: super::job_output::JobOutput::new(output.relay, output.pty_log),
        }
    }
}

/// What the actuator needs of the settings (a watcher may kill only with
/// `--allow-kill`).
fn act_config(cfg: &Settings) -> super::act::ActConfig {
    super::act::ActConfig {
        checkpoint_signal: cfg.checkpoint_signal,
        grace: cfg.grace,
        kill_after: cfg.kill_after,
        may_kill: cfg.attach.is_none() || cfg.allow_kill,
        quiet: cfg.quiet,
        checkpoint_dir: cfg.checkpoint_dir.clone(),
        checkpoint_glob: cfg.checkpoint_glob.clone(),
    }
}

/// The supervisor of a job that is already running (`job`), with its log
/// at `log` and readers over `cfg.proc_root`, as `supervise_job` builds it
/// after the launch; for the loop's tests, which then give it a host and a
/// signaller of their own.
#[cfg(test)]
pub(super) fn assemble_started(
    cfg: Settings,
    job: Job,
    log: &std::path::Path,
    sig: Box<dyn super::act::Signaller>,
    host: Box<dyn super::host::Host>,
) -> Supervisor {
    let started = crate::vocab::clock::now();
    let readers = open_readers(&cfg, None, &job, started);
    let parts = Parts {
        outputs: Outputs {
            log: LogWriter::create(log, started).expect("the test's log"),
            metrics: crate::sinks::metrics::Metrics::new(Default::default(), "test"),
            metrics_stop: None,
            textfile: None,
        },
        readers,
        owned: None,
        job,
        foreground: false,
        torch: None,
        channel: None,
        screen: OpenedDashboard {
            tui: None,
            app: None,
            pty: None,
            slave: None,
        },
        output: Output::default(),
        cg_oom_kills: None,
        started,
        sig,
        host,
        doctor: None,
    };
    let mut sup = Supervisor::assemble(cfg, parts);
    sup.write_run_start(None, None);
    sup
}
