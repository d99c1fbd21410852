//! `oomguard run`: the supervision loop.
//!
//! One task on a current-thread runtime owns everything that changes state:
//! it reaps children on SIGCHLD, forwards signals sent to oomguard, samples
//! the tree every tick, and walks the shutdown ladder. The only other thread
//! is the PSS sweeper, which never blocks a tick. Keeping every `waitpid`
//! and every signal in this one place is what makes the reaper safe (no
//! other component waits for our children) and the log ordered.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};

use crate::cli::CgroupMode;
use crate::log::{
    CgroupInfo, ChildExit, GpuInfo, LogWriter, Outcome, Peak, RunEnd, RunStart, SampleEvent,
};
use crate::model::{CeilingState, History, ProcSample, Role, Sample, View};
use crate::probe::cgroup::{self, CgroupReader, OwnedCgroup};
use crate::probe::proc::{PssSweeper, TreeRoot, TreeScanner, totals};
use crate::probe::system::SystemReader;
use crate::supervise::{self, Job, SpawnSpec, Status};
use crate::units::{HumanBytes, SizeOrPercent, human_duration};

/// Exit code when oomguard's policy ended the job (EX_TEMPFAIL: requeue).
pub const EXIT_POLICY: i32 = 75;
/// Exit code for oomguard's own failure after the job started.
pub const EXIT_INTERNAL: i32 = 70;

/// Validated settings of one `run`.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub argv: Vec<OsString>,
    pub log: Option<PathBuf>,
    pub interval: Duration,
    pub pss_interval: Duration,
    pub procs_interval: Duration,
    pub budget: Option<SizeOrPercent>,
    pub cgroup: CgroupMode,
    pub kill_after: Duration,
    pub quiet: bool,
    pub proc_root: PathBuf,
}

impl RunConfig {
    pub fn from_args(a: crate::cli::RunArgs) -> Self {
        Self {
            argv: a.command,
            log: a.log,
            interval: a.interval,
            pss_interval: a.pss_interval,
            procs_interval: a.procs_interval,
            budget: a.budget,
            cgroup: a.cgroup,
            kill_after: a.kill_after,
            quiet: a.quiet,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

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
    rt.block_on(supervise_job(cfg))
}

const SIG_TERM: i32 = libc::SIGTERM;
const SIG_KILL: i32 = libc::SIGKILL;
const SIG_CONT: i32 = libc::SIGCONT;

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
    last_procs_log: Option<f64>,
    oom_kills_at_start: Option<u64>,
    stats: RunStats,
}

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
        eprintln!("oomguard: cannot handle SIGCHLD");
        return EXIT_INTERNAL;
    };

    if let Err(e) = supervise::become_subreaper() {
        eprintln!("oomguard: cannot become a child subreaper ({e}); orphaned workers may escape");
    }

    let own_loc = cgroup::locate(&cfg.proc_root, "self");
    let (owned, not_owned_reason) = match (cfg.cgroup, &own_loc) {
        (CgroupMode::Off, _) => (None, Some("disabled with --cgroup off".to_string())),
        (CgroupMode::Auto, None) => (None, Some("no memory cgroup hierarchy found".to_string())),
        (CgroupMode::Auto, Some(loc)) => {
            match OwnedCgroup::create(loc, &format!("oomguard-{}", std::process::id())) {
                Ok(o) => (Some(o), None),
                Err(e) => (None, Some(e.to_string())),
            }
        }
    };

    let stdin = std::io::stdin();
    let foreground = stdin.is_terminal() && supervise::owns_foreground(stdin.as_fd());
    let spawn_with = |owned: Option<&OwnedCgroup>| {
        supervise::spawn(
            SpawnSpec {
                argv: cfg.argv.clone(),
                cgroup_procs: owned.map(|o| o.procs_file()),
                foreground_tty: foreground.then(|| stdin.as_fd()),
                ..Default::default()
            },
            &cfg.proc_root,
        )
    };
    let (job, owned, not_owned_reason) = match spawn_with(owned.as_ref()) {
        Ok(job) => (job, owned, not_owned_reason),
        // Joining the cgroup can fail (a v1 hierarchy that refuses the
        // move); the job matters more than the cgroup.
        Err(supervise::SpawnError::Other { source, .. }) if owned.is_some() => {
            match spawn_with(None) {
                Ok(job) => (
                    job,
                    None,
                    Some(format!("cannot move the job into its cgroup: {source}")),
                ),
                Err(e) => return spawn_failed(&mut log, &e),
            }
        }
        Err(e) => return spawn_failed(&mut log, &e),
    };

    let cgroup_reader = match &owned {
        Some(o) => Some(CgroupReader::new(o.location().clone(), true)),
        None => cgroup::locate(&cfg.proc_root, &job.pid.to_string())
            .map(|loc| CgroupReader::new(loc, false)),
    };
    let mut system = SystemReader::new(&cfg.proc_root);
    let first_system = system.read(Instant::now());
    let budget_bytes = cfg.budget.map(|b| match b {
        SizeOrPercent::Bytes(n) => n,
        SizeOrPercent::Percent(p) => (first_system.mem_total_bytes as f64 * p / 100.0) as u64,
    });
    let mut scanner = TreeScanner::new(&cfg.proc_root, TreeRoot::ChildrenOf(std::process::id()));
    scanner.set_job(Some(job.pid));

    let mut sup = Supervisor {
        sweeper: PssSweeper::start(cfg.proc_root.clone(), cfg.pss_interval),
        history: History::new(30.0),
        oom_kills_at_start: cgroup_reader
            .as_ref()
            .and_then(|c| c.read())
            .and_then(|c| c.oom_kill_count),
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
        last_procs_log: None,
        stats: RunStats::default(),
    };
    sup.write_run_start(not_owned_reason);

    let mut ticker = tokio::time::interval(sup.cfg.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // After the main process is gone, the tree is polled quickly so that
    // oomguard exits as soon as the last process does.
    let mut fast = tokio::time::interval(Duration::from_millis(50));
    loop {
        let forwarded = recv_any(&mut streams);
        let kill_at = sup.kill_at;
        tokio::select! {
            _ = sigchld.recv() => sup.reap(),
            sig = forwarded => sup.on_signal(sig),
            _ = ticker.tick() => sup.tick(),
            _ = fast.tick(), if sup.main_status.is_some() => sup.reap(),
            _ = sleep_until_opt(kill_at) => sup.kill_tree("--kill-after expired"),
        }
        if sup.finished() {
            break;
        }
    }
    sup.finish()
}

async fn recv_any(streams: &mut [(i32, tokio::signal::unix::Signal)]) -> i32 {
    let futs = streams.iter_mut().map(|(sig, s)| {
        let sig = *sig;
        Box::pin(async move {
            s.recv().await;
            sig
        })
    });
    futures_select_all(futs).await
}

/// Waits for the first of several futures (a tiny `select_all`, to avoid
/// a dependency for one call).
async fn futures_select_all<F>(futs: impl Iterator<Item = std::pin::Pin<Box<F>>>) -> i32
where
    F: std::future::Future<Output = i32>,
{
    let mut futs: Vec<_> = futs.collect();
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

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
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
        },
    );
    code
}

impl Supervisor {
    fn write_run_start(&mut self, not_owned_reason: Option<String>) {
        let sample = self.sample();
        let cgroup = self.cgroup.as_ref().map(|c| CgroupInfo {
            version: c.location().version.number(),
            path: c.location().path.clone(),
            owned: c.owned(),
            not_owned_reason: not_owned_reason.clone(),
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
            policy: serde_json::json!({ "rules": [] }),
            gpu: GpuInfo {
                available: false,
                reason: Some("GPU monitoring is not enabled".into()),
            },
            version: env!("CARGO_PKG_VERSION").to_string(),
            interval_seconds: self.cfg.interval.as_secs_f64(),
            pss_interval_seconds: self.cfg.pss_interval.as_secs_f64(),
        };
        self.log.write_at("run_start", sample.t, &start);
    }

    /// Reads one tick's sample.
    fn sample(&mut self) -> Sample {
        let now = Instant::now();
        let members = self
            .cgroup
            .as_ref()
            .filter(|c| c.owned())
            .and_then(|c| c.procs());
        let found = self.scanner.scan(members.as_deref());
        let mut procs: Vec<ProcSample> = found
            .into_iter()
            .filter(|f| f.stat.state != 'Z')
            .map(|f| ProcSample {
                pid: f.stat.pid,
                ppid: f.stat.ppid,
                role: f.role,
                comm: f.stat.comm,
                rss_bytes: f.rss_bytes,
                pss_bytes: 0,
                uss_bytes: 0,
                swap_bytes: 0,
                gpu_bytes: None,
                start_time: f.stat.start_time,
            })
            .collect();
        self.sweeper
            .set_targets(procs.iter().map(|p| (p.pid, p.start_time)).collect());
        let pss_age = self.sweeper.apply(&mut procs, now);
        let mut tree = totals(&procs);
        tree.pss_age_seconds = pss_age;
        let cgroup = self.cgroup.as_ref().and_then(|c| c.read());
        if let Some(level) = self
            .cgroup
            .as_ref()
            .filter(|c| c.owned())
            .and_then(|c| c.level())
        {
            tree.footprint_bytes = level.working_set;
        }
        let system = self.system.read(now);
        let psi = self.system.psi();
        self.tree = procs.clone();
        Sample {
            t: now.duration_since(self.started).as_secs_f64(),
            tree,
            procs,
            system,
            cgroup,
            psi,
            gpus: Vec::new(),
            budget_bytes: self.budget_bytes,
        }
    }

    fn tick(&mut self) {
        self.reap();
        let sample = self.sample();
        let view = self.history.push(&sample);
        self.record(&sample, &view);
    }

    fn record(&mut self, sample: &Sample, view: &View) {
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
        let with_procs = self
            .last_procs_log
            .is_none_or(|last| sample.t - last >= self.cfg.procs_interval.as_secs_f64());
        if with_procs {
            self.last_procs_log = Some(sample.t);
        }
        self.log.write_at(
            "sample",
            sample.t,
            &SampleEvent::new(sample, view, with_procs),
        );
    }

    fn reap(&mut self) {
        for r in supervise::reap_all() {
            if r.pid == self.job.pid && self.main_status.is_none() {
                self.main_status = Some(r.status);
                let (code, signal) = match r.status {
                    Status::Exited(c) => (Some(c), None),
                    Status::Signaled(s) => (None, Some(supervise::signal_name(s))),
                };
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
        self.refresh_tree();
        if self.tree.is_empty() {
            return;
        }
        if !self.cfg.quiet {
            eprintln!(
                "oomguard: the job's main process exited; stopping {} process(es) it left behind",
                self.tree.len()
            );
        }
        self.terminate_tree();
        if self.kill_at.is_none() {
            self.kill_at = Some(Instant::now() + self.cfg.kill_after);
        }
    }

    fn refresh_tree(&mut self) {
        let members = self
            .cgroup
            .as_ref()
            .filter(|c| c.owned())
            .and_then(|c| c.procs());
        let found = self.scanner.scan(members.as_deref());
        let me = std::process::id();
        self.zombie_children = found
            .iter()
            .filter(|f| f.stat.state == 'Z' && f.stat.ppid == me)
            .count();
        self.tree = found
            .into_iter()
            .filter(|f| f.stat.state != 'Z')
            .map(|f| ProcSample {
                pid: f.stat.pid,
                ppid: f.stat.ppid,
                role: f.role,
                comm: f.stat.comm,
                rss_bytes: f.rss_bytes,
                pss_bytes: 0,
                uss_bytes: 0,
                swap_bytes: 0,
                gpu_bytes: None,
                start_time: f.stat.start_time,
            })
            .collect();
    }

    fn on_signal(&mut self, sig: i32) {
        let ends = FORWARDED.iter().any(|&(s, ends)| s == sig && ends);
        if ends && self.shutdown_signal == Some(sig) {
            // The same Ctrl-C / TERM again while waiting: the user means now.
            self.kill_tree("second interrupt");
            return;
        }
        self.forward(sig);
        if ends {
            if self.foreground {
                supervise::reclaim_foreground(std::io::stdin().as_fd());
                self.foreground = false;
            }
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
        for p in &self.tree {
            let _ = supervise::signal_process(&self.cfg.proc_root, p.pid, p.start_time, sig);
        }
    }

    /// SIGTERM (and SIGCONT, so a paused process can die) to every process.
    fn terminate_tree(&mut self) {
        for p in &self.tree {
            let _ = supervise::signal_process(&self.cfg.proc_root, p.pid, p.start_time, SIG_TERM);
            let _ = supervise::signal_process(&self.cfg.proc_root, p.pid, p.start_time, SIG_CONT);
        }
    }

    fn kill_tree(&mut self, why: &str) {
        self.refresh_tree();
        if !self.killed && !self.tree.is_empty() && !self.cfg.quiet {
            eprintln!("oomguard: {why}: killing {} process(es)", self.tree.len());
        }
        self.killed = true;
        for p in &self.tree {
            let _ = supervise::signal_process(&self.cfg.proc_root, p.pid, p.start_time, SIG_KILL);
        }
        if self.main_status.is_none() {
            let _ = supervise::signal_group(self.job.pid, SIG_KILL);
        }
        // Processes born between the scan and the signals are caught by
        // the next round.
        self.kill_at = Some(Instant::now() + Duration::from_millis(100));
    }

    fn finished(&mut self) -> bool {
        if self.main_status.is_none() {
            return false;
        }
        self.reap();
        self.refresh_tree();
        self.tree.is_empty() && self.zombie_children == 0
    }

    fn finish(mut self) -> i32 {
        let status = self.main_status.unwrap_or(Status::Exited(0));
        let sample = self.sample();
        let view = self.history.push(&sample);
        self.record(&sample, &view);
        let oom_kills = sample.cgroup.as_ref().and_then(|c| c.oom_kill_count);
        let oom_killed = matches!(status, Status::Signaled(9))
            && !self.killed
            && oom_kills
                .zip(self.oom_kills_at_start)
                .is_some_and(|(now, before)| now > before);
        let outcome = match status {
            _ if oom_killed => Outcome::OomKilled,
            Status::Exited(_) => Outcome::Exited,
            Status::Signaled(_) => Outcome::Signaled,
        };
        let exit_code = status.code();
        let duration = self.started.elapsed();
        self.log.write(
            "run_end",
            &RunEnd {
                outcome,
                exit_code,
                peak: self.stats.peak.clone(),
                restarts: 0,
                actions: self.stats.actions.clone(),
                duration_seconds: (duration.as_secs_f64() * 1000.0).round() / 1000.0,
                error: None,
            },
        );
        if self.foreground {
            supervise::reclaim_foreground(std::io::stdin().as_fd());
        }
        if !self.cfg.quiet {
            self.summary(status, outcome, duration);
        }
        drop(self.owned.take());
        exit_code
    }

    fn summary(&self, status: Status, outcome: Outcome, duration: Duration) {
        let cmd = self
            .cfg
            .argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let how = match (outcome, status) {
            (Outcome::OomKilled, _) => "was killed by the kernel OOM killer (exit 137)".to_string(),
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
        eprintln!("oomguard: '{cmd}' {how} after {}", human_duration(duration));
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
    }
}
