//! The real loop (`run_loop`, the supervisor and every part it owns) run
//! with no process: a fake host starts "attempts" and reports their exits,
//! a fake signaller records every signal (and lets the job die of the ones
//! the test says), `/proc` is a directory the test writes, and the clock
//! is tokio's paused one, so minutes of supervision take milliseconds.

#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use tokio::sync::mpsc::UnboundedSender;

use super::act::{Ident, Signaller};
use super::host::{Host, Launch};
use super::outside::Outside;
use super::*;
use crate::job::supervise::SignalError;
use crate::job::supervise::{Reaped, SpawnError};
use crate::settings::{CommandLine, Layer, Preset, Settings};
use std::ffi::OsString;

const JOB: u32 = 4_000_001;
const MIB: u64 = 1 << 20;

/// What the fake operating system saw and holds.
#[derive(Default)]
struct World {
    /// `(seconds since the start, pgid, signal)` of every group signal.
    groups: Vec<(f64, u32, i32)>,
    /// `(seconds since the start, pid, signal)` of every process signal.
    signals: Vec<(f64, u32, i32)>,
    /// The current attempt's leader.
    job: u32,
    /// Group signals the job dies of.
    dies_of: Vec<i32>,
    /// Exits not yet reaped.
    exited: Vec<Reaped>,
    /// `(argv, env)` of every relaunch.
    launched: Vec<(Vec<OsString>, Env)>,
    /// Pids of the hooks started.
    hooks: Vec<u32>,
    next_pid: u32,
    children: Option<UnboundedSender<()>>,
    t0: Option<Instant>,
    /// The fake `/proc`.
    root: PathBuf,
    /// The trainer saves a checkpoint here when told to stop.
    saves_to: Option<PathBuf>,
    /// `(seconds since the start, pid)` of every worker forked.
    forked: Vec<(f64, u32)>,
}

impl World {
    /// The job's leader appears in `/proc`, as oomguard's only child, a
    /// 200 MiB python.
    fn appear(&mut self, pid: u32) {
        self.process(pid, std::process::id(), pid, 200 * MIB);
        self.children_are(&pid.to_string());
    }

    /// The job's leader forks a worker of `rss` bytes, which is then the
    /// newest pid on the machine (so a walk of the children lists is
    /// taken again); logged in `forked`.
    fn fork(&mut self, rss: u64) {
        let pid = self.pid();
        let job = self.job;
        self.process(pid, job, job, rss);
        let list = self.root.join(format!("{job}/task/{job}/children"));
        let mut kids = std::fs::read_to_string(&list).unwrap();
        kids.push_str(&format!("{pid} "));
        std::fs::write(list, kids).unwrap();
        let t = self.now();
        self.forked.push((t, pid));
    }

    /// `pid` leaves `/proc`. Its `stat` is emptied first: the scanner
    /// keeps it open, and a real one reads nothing once its process is
    /// gone.
    fn vanish(&self, pid: u32) {
        let d = self.root.join(pid.to_string());
        if d.exists() {
            std::fs::write(d.join("stat"), "").unwrap();
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    /// Worker `pid` exits (and is reaped by the leader).
    fn exit_worker(&self, pid: u32) {
        self.vanish(pid);
        let job = self.job;
        let list = self.root.join(format!("{job}/task/{job}/children"));
        let kids = std::fs::read_to_string(&list).unwrap();
        let rest = kids.replace(&format!("{pid} "), "");
        std::fs::write(list, rest).unwrap();
    }

    /// `pid` in `/proc`: a python of `rss` bytes, child of `ppid` in the
    /// group `pgid`, with no children yet; the newest pid on the machine.
    fn process(&self, pid: u32, ppid: u32, pgid: u32, rss: u64) {
        let d = self.root.join(pid.to_string());
        std::fs::create_dir_all(d.join(format!("task/{pid}"))).unwrap();
        let rss_pages = rss / 4096;
        let stat = format!(
            "{pid} (python) S {ppid} {pgid} {pgid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {} 1000 {rss_pages} 0\n",
            start_time(pid)
        );
        std::fs::write(d.join("stat"), stat).unwrap();
        std::fs::write(d.join("cmdline"), "python\0train.py\0").unwrap();
        std::fs::write(d.join(format!("task/{pid}/children")), "").unwrap();
        let loadavg = format!("0.00 0.00 0.00 1/99 {pid}\n");
        std::fs::write(self.root.join("loadavg"), loadavg).unwrap();
    }

    /// What oomguard's `children` list in `/proc` says.
    fn children_are(&self, list: &str) {
        let me = std::process::id();
        let task = self.root.join(format!("{me}/task/{me}"));
        std::fs::create_dir_all(&task).unwrap();
        std::fs::write(task.join("children"), list).unwrap();
    }

    fn exit(&mut self, pid: u32, status: Status) {
        self.vanish(pid);
        self.children_are("");
        self.exited.push(Reaped { pid, status });
        if let Some(tx) = &self.children {
            let _ = tx.send(());
        }
    }

    /// Seconds since the start.
    fn now(&self) -> f64 {
        self.t0
            .map_or(0.0, |t0| crate::vocab::clock::since(t0).as_secs_f64())
    }

    fn pid(&mut self) -> u32 {
        self.next_pid += 1;
        JOB + self.next_pid
    }
}

type Shared = Rc<RefCell<World>>;

type Env = Vec<(OsString, OsString)>;

struct FakeSignaller(Shared);

impl Signaller for FakeSignaller {
    fn signal(&mut self, (pid, _): Ident, sig: i32) -> Result<(), SignalError> {
        // As the real one: a process no longer in /proc gets nothing.
        if !self.is_alive((pid, 0)) {
            return Err(SignalError::Gone(pid));
        }
        let mut w = self.0.borrow_mut();
        let t = w.now();
        w.signals.push((t, pid, sig));
        if let Some(dir) = w
            .saves_to
            .as_ref()
            .filter(|_| pid == w.job && sig == libc::SIGTERM)
        {
            std::fs::write(dir.join(format!("step-{t}.ckpt")), b"weights").unwrap();
        }
        if pid == w.job && w.dies_of.contains(&sig) {
            w.exit(pid, Status::Signaled(sig));
        }
        Ok(())
    }

    fn is_alive(&self, (pid, _): Ident) -> bool {
        self.0.borrow().root.join(pid.to_string()).exists()
    }

    fn signal_group(&mut self, pgid: u32, sig: i32) -> Result<(), SignalError> {
        let mut w = self.0.borrow_mut();
        let t = w.now();
        w.groups.push((t, pgid, sig));
        if pgid == w.job && w.dies_of.contains(&sig) {
            w.exit(pgid, Status::Signaled(sig));
        }
        Ok(())
    }
}

struct FakeHost(Shared);

impl Host for FakeHost {
    fn launch(&mut self, _proc_root: &Path, l: Launch<'_>) -> Result<Job, SpawnError> {
        let mut w = self.0.borrow_mut();
        let pid = w.pid();
        w.job = pid;
        w.appear(pid);
        w.launched.push((l.argv.to_vec(), l.env));
        Ok(fake_job(pid))
    }

    fn reap(&mut self) -> Vec<Reaped> {
        std::mem::take(&mut self.0.borrow_mut().exited)
    }

    fn run_hook(&mut self, _cmd: std::process::Command) -> std::io::Result<u32> {
        let mut w = self.0.borrow_mut();
        let pid = w.pid();
        w.hooks.push(pid);
        Ok(pid)
    }
}

fn start_time(pid: u32) -> u64 {
    u64::from(pid) + 1000
}

fn fake_job(pid: u32) -> Job {
    Job {
        pid,
        start_time: start_time(pid),
        pidfd: None,
    }
}

/// A machine of 1 GiB with `used` of it in use: this machine's
/// `/proc/meminfo` (the parser wants every field) with those three lines
/// changed.
fn meminfo(root: &Path, used: u64) {
    let total = 1024 * MIB;
    let real = std::fs::read_to_string("/proc/meminfo").unwrap();
    let text: Vec<String> = real
        .lines()
        .map(|l| match l.split(':').next() {
            Some("MemTotal") => format!("MemTotal: {} kB", total / 1024),
            Some("MemFree" | "MemAvailable") => {
                format!(
                    "{}: {} kB",
                    &l[..l.find(':').unwrap()],
                    (total - used) / 1024
                )
            }
            _ => l.to_string(),
        })
        .collect();
    std::fs::write(root.join("meminfo"), text.join("\n") + "\n").unwrap();
}

/// One run on fakes: the supervisor, the kernel's side of its wake-ups,
/// the world, and where the log and `/proc` are.
struct Fake {
    sup: Supervisor,
    outside: Outside,
    kernel: outside::Kernel,
    world: Shared,
    dir: tempfile::TempDir,
}

impl Fake {
    /// `flags`: `oomguard run`'s flags, as a user would type them.
    fn new(flags: &[&str]) -> Self {
        let mut argv = vec!["oomguard", "run", "--quiet", "--no-gpu", "--no-companion"];
        argv.extend_from_slice(flags);
        argv.extend_from_slice(&["--", "python", "train.py"]);
        let cli = <crate::settings::cli::Cli as clap::Parser>::try_parse_from(argv).unwrap();
        let crate::settings::cli::Command::Run(a) = cli.command else {
            panic!("not run")
        };
        let mut layer = Layer::default();
        a.sampling.fill(&mut layer);
        a.launch.fill(&mut layer);
        a.policy.values.fill(&mut layer);
        a.restart.values.fill(&mut layer);
        let cmd = CommandLine {
            argv: a.command.clone(),
            quiet: true,
            no_notify: true,
            run: a.only.clone(),
            resume_cmd: a.restart.resume_cmd.clone(),
            ..CommandLine::default()
        };
        Self::on(Settings::merge(cmd, &layer, None, Preset::Run).unwrap())
    }

    /// `oomguard attach JOB --watch-for WATCH`.
    fn attached(watch: Duration) -> Self {
        let cmd = CommandLine {
            argv: vec![OsString::from("pid 4000001")],
            quiet: true,
            no_notify: true,
            ..CommandLine::default()
        };
        let preset = Preset::Attach {
            pid: JOB,
            allow_kill: false,
        };
        let mut cfg = Settings::merge(cmd, &Layer::default(), None, preset).unwrap();
        cfg.attach_spec = Some(crate::job::attach::AttachSpec {
            pid: JOB,
            label: "pid 4000001".into(),
            cgroup: None,
            watch_for: Some(watch),
        });
        Self::on(cfg)
    }

    fn on(mut cfg: Settings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proc");
        std::fs::create_dir(&root).unwrap();
        meminfo(&root, 100 * MIB);
        cfg.proc_root = root;
        // The run's records go where the test can see them, not in the
        // directory the tests run in.
        cfg.run_dir = Some(dir.path().to_path_buf());
        cfg.values.cgroup = crate::settings::cli::CgroupMode::Off;
        let world: Shared = Rc::default();
        {
            let mut w = world.borrow_mut();
            w.job = JOB;
            w.root = cfg.proc_root.clone();
            w.appear(JOB);
        }
        let sup = setup::assemble_started(
            cfg,
            fake_job(JOB),
            &dir.path().join("run.ndjson"),
            Box::new(FakeSignaller(world.clone())),
            Box::new(FakeHost(world.clone())),
        );
        let (outside, kernel) = Outside::by_hand();
        {
            let mut w = world.borrow_mut();
            w.children = Some(kernel.children.clone());
            w.t0 = Some(crate::vocab::clock::now());
        }
        Self {
            sup,
            outside,
            kernel,
            world,
            dir,
        }
    }

    /// Runs the loop to its end while `script` plays the kernel and the
    /// job; oomguard's exit code and the log's events.
    async fn run(
        self,
        script: impl std::future::Future<Output = ()>,
    ) -> (i32, Vec<serde_json::Value>, Shared) {
        let Fake {
            sup,
            outside,
            kernel,
            world,
            dir,
        } = self;
        // The script's end is not the run's: the loop goes on until the
        // job is gone, and a script that returns early must not close the
        // channels the loop waits on.
        let script = async move {
            script.await;
            std::future::pending::<()>().await;
        };
        // Deadlines: 90 s of the loop's own time, or 20 s of ours. The
        // second is checked whenever the task is polled: a loop that spins
        // (a wake-up always due) stops the paused clock, but tokio's
        // cooperative budget still makes it yield to this select.
        let real = std::time::Instant::now();
        let spun = std::future::poll_fn(|_| {
            if real.elapsed() > Duration::from_secs(20) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        });
        let code = tokio::select! {
            code = setup::run_loop(sup, outside) => Some(code),
            () = script => unreachable!(),
            () = tokio::time::sleep(Duration::from_secs(90)) => None,
            () = spun => None,
        };
        drop(kernel);
        let log = std::fs::read_to_string(dir.path().join("run.ndjson")).unwrap();
        let events: Vec<serde_json::Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let Some(code) = code else {
            let said: Vec<String> = events
                .iter()
                .filter(|e| e["event"] != "sample")
                .map(|e| e.to_string())
                .collect();
            panic!("the run never ended:\n{}", said.join("\n"));
        };
        (code, events, world)
    }
}

/// After `seconds`, the current attempt's job exits with 0.
async fn ends_well_after(world: Shared, seconds: f64) {
    sleep(seconds).await;
    let job = world.borrow().job;
    world.borrow_mut().exit(job, Status::Exited(0));
}

fn sleep(seconds: f64) -> tokio::time::Sleep {
    tokio::time::sleep(Duration::from_secs_f64(seconds))
}

fn of<'a>(events: &'a [serde_json::Value], name: &str) -> Vec<&'a serde_json::Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

fn run_end(events: &[serde_json::Value]) -> &serde_json::Value {
    of(events, "run_end").pop().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_second_ctrl_c_kills_the_job() {
    let f = Fake::new(&[]);
    f.world.borrow_mut().dies_of = vec![SIG_KILL];
    let signals = f.kernel.signals.clone();
    let (code, events, world) = f
        .run(async move {
            sleep(2.0).await;
            signals.send(libc::SIGINT).unwrap();
            sleep(1.0).await;
            signals.send(libc::SIGINT).unwrap();
        })
        .await;
    let w = world.borrow();
    let sent: Vec<(u32, i32)> = w.groups.iter().map(|g| (g.1, g.2)).collect();
    assert_eq!(sent, [(JOB, libc::SIGINT), (JOB, SIG_KILL)], "{events:?}");
    assert!(
        (w.groups[1].0 - 3.0).abs() < 0.1,
        "killed at {}",
        w.groups[1].0
    );
    let end = run_end(&events);
    assert_eq!(end["outcome"], "signaled", "{end}");
    assert_eq!(
        (
            end["actions"]["stop"].as_u64(),
            end["actions"]["kill"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let took = end["duration_seconds"].as_f64().unwrap();
    assert!((3.0..3.5).contains(&took), "{took}");
    assert_eq!(code, 128 + SIG_KILL);
}

#[tokio::test(start_paused = true)]
async fn kill_after_expires_when_the_job_ignores_the_terminate() {
    let f = Fake::new(&["--kill-after", "7s"]);
    f.world.borrow_mut().dies_of = vec![SIG_KILL];
    let signals = f.kernel.signals.clone();
    let (_, events, world) = f
        .run(async move {
            sleep(1.0).await;
            signals.send(libc::SIGTERM).unwrap();
        })
        .await;
    let w = world.borrow();
    let sent: Vec<(u32, i32)> = w.groups.iter().map(|g| (g.1, g.2)).collect();
    assert_eq!(sent[0], (JOB, libc::SIGTERM));
    assert_eq!(sent.last(), Some(&(JOB, SIG_KILL)), "{sent:?}");
    let killed = w.groups.last().unwrap().0;
    assert!(
        (8.0..8.3).contains(&killed),
        "--kill-after 7s killed at {killed}"
    );
    let kill = of(&events, "action");
    assert!(kill.iter().any(|a| a["action"] == "kill"), "{kill:?}");
}

/// Near a ceiling the loop ticks several times a second; the log still
/// gets one sample line per `--interval` (and one when the job's exit is
/// seen), besides the lines of ticks where a rule or action happened.
/// `--log-every-tick` shows how many ticks there were.
#[tokio::test(start_paused = true)]
async fn sample_lines_come_once_per_interval_through_fast_ticks() {
    let lines = |flags: &'static [&'static str]| async move {
        let f = Fake::new(flags);
        // 88 % used: past the warning, close to critical (92 %).
        meminfo(&f.dir.path().join("proc"), 900 * MIB);
        let world = f.world.clone();
        let (code, events, _) = f.run(ends_well_after(world, 21.0)).await;
        assert_eq!(code, 0);
        let t: Vec<f64> = of(&events, "sample")
            .iter()
            .map(|s| s["t"].as_f64().unwrap())
            .collect();
        t
    };
    let t = lines(&["--interval", "2s"]).await;
    let every = lines(&["--interval", "2s", "--log-every-tick"]).await;
    assert!(
        every.len() > 3 * t.len(),
        "{} ticks, {} lines",
        every.len(),
        t.len()
    );
    // The first tick's rules and action are logged with their sample.
    let later: Vec<f64> = t.iter().copied().filter(|&x| x > 0.5).collect();
    assert!((10..=12).contains(&later.len()), "{t:?}");
    for pair in later[..later.len() - 1].windows(2) {
        let gap = pair[1] - pair[0];
        assert!((1.9..2.2).contains(&gap), "{t:?}");
    }
    assert!((21.0..21.5).contains(&t[t.len() - 1]), "{t:?}");
}

/// The machine is 94 % full from the start: each attempt is stopped with
/// a restart, until `--max-restarts` is spent.
#[tokio::test(start_paused = true)]
async fn giving_up_once_the_restarts_are_spent() {
    let f = Fake::new(&[
        "--on-critical",
        "restart",
        "--max-restarts",
        "1",
        "--restart-delay",
        "3s",
    ]);
    meminfo(&f.dir.path().join("proc"), 960 * MIB);
    f.world.borrow_mut().dies_of = vec![libc::SIGTERM, SIG_KILL];
    let (code, events, world) = f.run(async {}).await;
    let w = world.borrow();
    assert_eq!(w.launched.len(), 1, "one restart, then no more");
    // Each attempt's trainer was asked to stop, and stopped.
    let stops: Vec<(u32, i32)> = w.signals.iter().map(|s| (s.1, s.2)).collect();
    assert_eq!(stops, [(JOB, libc::SIGTERM), (JOB + 1, libc::SIGTERM)]);
    // The second attempt started once --restart-delay had passed.
    let restart = of(&events, "restart")[0]["t"].as_f64().unwrap();
    let second = events
        .iter()
        .find(|e| e["attempt"] == 2 && e["event"] == "action");
    let second = second.unwrap()["t"].as_f64().unwrap();
    assert!(
        (3.0..3.3).contains(&(second - restart)),
        "{restart} -> {second}"
    );
    let end = run_end(&events);
    assert_eq!(end["outcome"], "restart_limit", "{end}");
    assert_eq!(end["restarts"], 1);
    assert_eq!(code, EXIT_POLICY);
}

/// A hangup between attempts: the restart that was waiting is called off.
#[tokio::test(start_paused = true)]
async fn a_hangup_between_attempts_cancels_the_restart() {
    let f = Fake::new(&["--on-critical", "restart", "--restart-delay", "5s"]);
    meminfo(&f.dir.path().join("proc"), 960 * MIB);
    f.world.borrow_mut().dies_of = vec![libc::SIGTERM];
    let signals = f.kernel.signals.clone();
    let (_, events, world) = f
        .run(async move {
            sleep(2.0).await;
            signals.send(libc::SIGHUP).unwrap();
        })
        .await;
    assert!(world.borrow().launched.is_empty(), "the restart went ahead");
    assert_eq!(of(&events, "restart").len(), 1, "a restart was waiting");
    let took = run_end(&events)["duration_seconds"].as_f64().unwrap();
    assert!((2.0..2.5).contains(&took), "{took}");
}

/// A stop with a restart: the trainer saves when told to stop, and the
/// next attempt resumes from that checkpoint.
#[tokio::test(start_paused = true)]
async fn the_next_attempt_resumes_from_the_checkpoint_the_stop_saved() {
    let ckpt = tempfile::tempdir().unwrap();
    let dir = ckpt.path().to_str().unwrap().to_string();
    let f = Fake::new(&[
        "--on-critical",
        "restart",
        "--checkpoint-dir",
        &dir,
        "--resume-cmd",
        "python train.py --resume {checkpoint}",
        "--restart-delay",
        "2s",
    ]);
    let root = f.dir.path().join("proc");
    meminfo(&root, 960 * MIB);
    {
        let mut w = f.world.borrow_mut();
        w.dies_of = vec![libc::SIGTERM];
        w.saves_to = Some(ckpt.path().to_path_buf());
    }
    let job_world = f.world.clone();
    let (code, events, world) = f
        .run(async move {
            // The pressure goes with the first attempt; the second ends well.
            sleep(1.0).await;
            meminfo(&root, 100 * MIB);
            ends_well_after(job_world, 9.0).await;
        })
        .await;
    assert_eq!(code, 0);
    // The checkpoint, not the resume record beside it (`.oomguard-resume.json`).
    let saved = std::fs::read_dir(ckpt.path())
        .unwrap()
        .flatten()
        .find(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .unwrap()
        .path();
    let checkpoints = of(&events, "checkpoint");
    assert_eq!(
        checkpoints[0]["path"],
        saved.to_str().unwrap(),
        "{checkpoints:?}"
    );
    assert_eq!(checkpoints[0]["confirmed"], true);
    assert_eq!(
        of(&events, "restart")[0]["checkpoint"],
        saved.to_str().unwrap()
    );
    let w = world.borrow();
    let (argv, env) = &w.launched[0];
    let quoted = format!("python train.py --resume '{}'", saved.display());
    assert_eq!(
        argv,
        &[OsString::from("/bin/sh"), "-c".into(), quoted.into()]
    );
    let var = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(var("OOMGUARD_CHECKPOINT"), Some(saved.into_os_string()));
    assert_eq!(var("OOMGUARD_ATTEMPT"), Some("2".into()));
}

/// A warning's hook that hangs is killed once `HOOK_TIMEOUT` has passed,
/// and the job is never touched.
#[tokio::test(start_paused = true)]
async fn a_hook_that_hangs_is_killed_at_its_timeout() {
    let f = Fake::new(&["--on-warn", "sleep 1000"]);
    // 85 % used: past the warning (80 %), short of critical (92 %).
    meminfo(&f.dir.path().join("proc"), 870 * MIB);
    let job_world = f.world.clone();
    let (code, events, world) = f.run(ends_well_after(job_world, 40.0)).await;
    assert_eq!(code, 0);
    let w = world.borrow();
    assert_eq!(w.hooks.len(), 1, "one warning, one hook");
    let hook = w.hooks[0];
    let killed: Vec<&(f64, u32, i32)> = w.groups.iter().filter(|g| g.1 == hook).collect();
    assert_eq!(killed.len(), 1, "{:?}", w.groups);
    assert_eq!(killed[0].2, SIG_KILL);
    let at = killed[0].0;
    let timeout = hooks::HOOK_TIMEOUT.as_secs_f64();
    assert!((timeout..timeout + 0.5).contains(&at), "killed at {at}");
    let to_job = w.groups.iter().any(|g| g.1 == JOB);
    assert!(
        w.signals.is_empty() && !to_job,
        "{:?} {:?}",
        w.signals,
        w.groups
    );
    assert!(of(&events, "action").iter().any(|a| a["action"] == "warn"));
}

/// `attach --watch-for`: the watch ends at its time, the job runs on, and
/// nothing is sent to it.
#[tokio::test(start_paused = true)]
async fn watch_for_ends_the_watch_and_leaves_the_job_running() {
    let f = Fake::attached(Duration::from_secs(6));
    let (code, events, world) = f.run(async {}).await;
    assert_eq!(code, 0);
    let w = world.borrow();
    assert!(w.signals.is_empty() && w.groups.is_empty());
    let end = run_end(&events);
    let took = end["duration_seconds"].as_f64().unwrap();
    assert!((6.0..6.5).contains(&took), "{end}");
    assert_eq!(end["outcome"], "detached", "{end}");
}

/// The fake job's companion: its control channel, which the test writes
/// the ranks' records into.
fn with_companion(f: &mut Fake) -> PathBuf {
    let ch = crate::vocab::companion::Channel::create(f.dir.path(), 1).unwrap();
    let dir = ch.dir().to_path_buf();
    f.sup.core.act_mut().set_channel(Some(ch));
    dir
}

/// A record from the job's ranks.
fn companion_says(dir: &Path, record: serde_json::Value) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("events"))
        .unwrap();
    writeln!(f, "{record}").unwrap();
}

/// The request oomguard wrote, once there is one: (id, kind).
async fn request(dir: &Path) -> (u64, String) {
    loop {
        if let Some(r) = std::fs::read(dir.join("request"))
            .ok()
            .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
        {
            return (
                r["id"].as_u64().unwrap(),
                r["kind"].as_str().unwrap().into(),
            );
        }
        sleep(0.05).await;
    }
}

fn hello() -> serde_json::Value {
    serde_json::json!({"type": "hello", "pid": JOB, "rank": 0, "world": 1, "local_world": 1})
}

#[tokio::test(start_paused = true)]
async fn a_sigterm_with_a_companion_saves_and_a_second_changes_nothing() {
    let mut f = Fake::new(&["--checkpoint-dir", "/nonexistent-oomguard-test"]);
    let dir = with_companion(&mut f);
    f.world.borrow_mut().dies_of = vec![SIG_KILL];
    let signals = f.kernel.signals.clone();
    let world = f.world.clone();
    let (code, events, world) = f
        .run(async move {
            companion_says(&dir, hello());
            sleep(2.0).await;
            signals.send(libc::SIGTERM).unwrap();
            let (id, kind) = request(&dir).await;
            assert_eq!(kind, "checkpoint_and_exit");
            companion_says(
                &dir,
                serde_json::json!({"type": "ack", "id": id, "step": 42}),
            );
            sleep(1.0).await;
            // The scheduler's second TERM, while the ranks save.
            signals.send(libc::SIGTERM).unwrap();
            sleep(1.0).await;
            companion_says(
                &dir,
                serde_json::json!({"type": "done", "id": id, "step": 42,
                    "paths": ["/ckpt/step-42"], "ok": true, "seconds": 1.5}),
            );
            sleep(0.5).await;
            let job = world.borrow().job;
            world.borrow_mut().exit(job, Status::Exited(0));
        })
        .await;
    let w = world.borrow();
    assert!(w.groups.is_empty(), "forwarded: {:?}", w.groups);
    assert!(w.signals.is_empty(), "signalled: {:?}", w.signals);
    let end = run_end(&events);
    assert_eq!(end["outcome"], "stopped_by_signal", "{end}");
    assert_eq!(code, EXIT_POLICY);
    let stop = of(&events, "action");
    assert_eq!(stop.len(), 1, "{stop:?}");
    assert_eq!(stop[0]["reason"], "SIGTERM received");
}

#[tokio::test(start_paused = true)]
async fn a_signals_save_ends_within_the_budget_when_the_companion_never_answers() {
    let mut f = Fake::new(&["--stop-code", "143"]);
    let dir = with_companion(&mut f);
    f.world.borrow_mut().dies_of = vec![SIG_KILL];
    let signals = f.kernel.signals.clone();
    let (code, events, world) = f
        .run(async move {
            companion_says(&dir, hello());
            sleep(2.0).await;
            signals.send(libc::SIGUSR1).unwrap();
        })
        .await;
    let w = world.borrow();
    let term: Vec<f64> = w
        .signals
        .iter()
        .filter(|s| s.2 == SIG_TERM)
        .map(|s| s.0)
        .collect();
    let kill = w
        .signals
        .iter()
        .chain(w.groups.iter())
        .find(|s| s.2 == SIG_KILL)
        .map(|s| s.0)
        .unwrap_or_else(|| panic!("never killed: {events:?}"));
    // The companion had half the save window (20 s less --kill-after's
    // 10 s... of the 30 s budget) to acknowledge: the trainer then gets the
    // checkpoint signal, the rest SIGTERM at the window's end, and SIGKILL
    // --kill-after later: all within 30 s of the signal.
    assert!(
        (term[0] - 12.0).abs() < 0.3,
        "the fallback signal at {}",
        term[0]
    );
    assert!(
        kill - 2.0 <= 30.3,
        "killed {} s after the signal",
        kill - 2.0
    );
    assert!(
        kill - 2.0 >= 29.0,
        "killed {} s after the signal",
        kill - 2.0
    );
    let said = events.iter().any(|e| {
        e["event"] == "action"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("the companion did not answer"))
    });
    assert!(said, "{events:?}");
    assert_eq!(run_end(&events)["outcome"], "stopped_by_signal");
    assert_eq!(code, 143);
}

/// The trainer forks a 300 MiB worker at each of `at` (seconds since the
/// start), then the workers exit, then the job.
async fn forks_workers_at(world: Shared, at: &[f64]) {
    for &t in at {
        let now = world.borrow().now();
        sleep(t - now).await;
        world.borrow_mut().fork(300 * MIB);
    }
    sleep(0.5).await;
    let forked = world.borrow().forked.clone();
    for (_, pid) in forked {
        world.borrow().exit_worker(pid);
    }
    // Once a tick has seen them go (none is left behind by the leader).
    sleep(0.5).await;
    let job = world.borrow().job;
    world.borrow_mut().exit(job, Status::Exited(0));
}

/// Forks a tenth of a second apart, between fast ticks: whatever the
/// phase of the regular full scans (a quarter second apart at the fast
/// pace), at most one of them can fall just before one; the others are
/// seen at once only if every tick is a full scan.
const FORKS: [f64; 3] = [2.01, 2.11, 2.21];

/// The first tick after each fork (`--log-every-tick`: every tick has its
/// sample line) counts the new worker: it came within one fast tick of
/// the fork, not at the next regular full scan.
fn each_fork_seen_by_the_next_tick(events: &[serde_json::Value], forked: &[(f64, u32)]) {
    let samples = of(events, "sample");
    assert_eq!(forked.len(), FORKS.len(), "{forked:?}");
    let mut missed = Vec::new();
    for (i, &(at, pid)) in forked.iter().enumerate() {
        let next = samples
            .iter()
            .find(|s| s["t"].as_f64().unwrap() > at)
            .unwrap_or_else(|| panic!("no tick after the fork at {at}"));
        let t = next["t"].as_f64().unwrap();
        assert!(
            t - at <= tick::FAST.as_secs_f64() + 1e-3,
            "the tick after the fork at {at} came at {t}: not a fast tick"
        );
        // The leader and the workers forked so far.
        if next["tree"]["procs"].as_u64() != Some(2 + i as u64) {
            missed.push(format!(
                "worker {pid}, forked at {at}, not in the tick at {t}: {}",
                next["tree"]
            ));
        }
    }
    assert!(missed.is_empty(), "{}", missed.join("\n"));
}

/// Below the critical level every tick scans the whole tree
/// (`Core::needs_full_scan`): a worker forked a moment ago is in the very
/// next tick's sample, which the last-resort freeze acts on, not a quarter
/// second later at the next regular full scan. Observe-only (`--policy
/// none`), so no stop is under way: only the headroom asks for the scans.
#[tokio::test(start_paused = true)]
async fn below_critical_the_next_tick_sees_a_worker_forked_a_moment_ago() {
    let f = Fake::new(&["--policy", "none", "--log-every-tick"]);
    // 94 % used: below critical (8 % headroom), above the last resort (4 %).
    meminfo(&f.dir.path().join("proc"), 960 * MIB);
    let world = f.world.clone();
    let (code, events, world) = f.run(forks_workers_at(world, &FORKS)).await;
    assert_eq!(code, 0);
    let actions = of(&events, "action");
    assert!(actions.is_empty(), "observe only: {actions:?}");
    each_fork_seen_by_the_next_tick(&events, &world.borrow().forked);
}

/// While a stop is under way every tick scans the whole tree, though the
/// pressure that started it is gone: a worker forked during the stop is in
/// the very next tick's sample, so the ladder's next step reaches it.
#[tokio::test(start_paused = true)]
async fn during_a_stop_the_next_tick_sees_a_worker_forked_a_moment_ago() {
    let f = Fake::new(&["--on-critical", "stop", "--log-every-tick"]);
    let root = f.dir.path().join("proc");
    // 94 % used: the first tick starts the stop; the trainer saves for
    // --grace's minute (it ignores the checkpoint signal).
    meminfo(&root, 960 * MIB);
    let world = f.world.clone();
    let (_, events, world) = f
        .run(async move {
            sleep(1.0).await;
            // The pressure is gone: only the stop asks for full scans.
            meminfo(&root, 100 * MIB);
            forks_workers_at(world, &FORKS).await;
        })
        .await;
    let w = world.borrow();
    assert_eq!(w.signals[0].1, JOB, "the stop began: {:?}", w.signals);
    // Still saving when the workers came: no step of the ladder but the
    // throttle (which holds the new workers) came after the stop began.
    let actions = of(&events, "action");
    let steps: Vec<&str> = actions
        .iter()
        .filter(|a| a["t"].as_f64().unwrap() < FORKS[2] + 0.1)
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(steps.first(), Some(&"stop"), "{actions:?}");
    assert!(steps[1..].iter().all(|&s| s == "pause"), "{actions:?}");
    let head = of(&events, "sample")
        .iter()
        .find(|s| s["t"].as_f64().unwrap() > FORKS[0])
        .map(|s| s["headroom_percent"].as_f64().unwrap());
    assert!(head.is_some_and(|h| h > 50.0), "{head:?}");
    each_fork_seen_by_the_next_tick(&events, &w.forked);
}
