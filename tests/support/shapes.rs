//! Runs one memory shape of `benches/shapes.py` under oomguard, inside a
//! memory cgroup of its own with a limit, with a deadline: shared by the
//! shape tests (`tests/shapes.rs`, default policy) and the policy benchmark
//! (`benches/policy.rs`, which records traces with `--policy none
//! --log-every-tick` and scores them with `replay --score`).
//!
//! Kernel kills are counted in the whole cgroup subtree (oomguard's own
//! `oomguard-<pid>` child included, `common::OomWatch`) and, as a backstop,
//! in the machine's `/proc/vmstat` `oom_kill` counter: these runs go one at
//! a time. Includers declare `mod common` (tests/common) beside it.
#![allow(dead_code, clippy::unwrap_used, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{MemCgroup, OomWatch, walk};

/// Shapes that end on their own and peak below the critical level.
pub const HEALTHY: [&str; 6] = [
    "load_plateau",
    "stairs",
    "spikes",
    "sawtooth",
    "reforking_workers",
    "checkpoint_save",
];

/// Shapes that grow until something stops them.
pub const LEAKING: [&str; 5] = ["linear", "creep", "burst", "step", "fast"];

/// How one run ended.
#[derive(Debug)]
pub struct ShapeRun {
    /// oomguard's exit code (`None`: killed by a signal or the deadline).
    pub exit: Option<i32>,
    /// Kernel OOM kills during the run (subtree, or the machine's counter
    /// when that is larger).
    pub kills: u64,
    /// Of which counted in the run's own cgroup subtree.
    pub subtree_kills: u64,
    /// Every cgroup seen below the run's own while it ran (oomguard's
    /// `oomguard-<pid>` when it made one).
    pub cgroups_made: Vec<String>,
    pub timed_out: bool,
    pub seconds: f64,
    pub stderr: String,
}

/// Whether this machine can run the shapes (root and a cgroup v1 memory
/// hierarchy to make children in).
pub fn available() -> bool {
    crate::common::own_memory_cgroup().is_some()
}

fn vmstat_oom_kills() -> u64 {
    fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// What to run.
pub struct Spec<'a> {
    pub shape: &'a str,
    pub seed: u64,
    pub limit: u64,
    /// `--cgroup auto` or `off`.
    pub cgroup: &'a str,
    /// Extra oomguard flags (`--policy none --log-every-tick` to record).
    pub flags: &'a [&'a str],
    pub log: &'a Path,
    pub deadline: Duration,
    /// Run oomguard as the unprivileged uid/gid 65534 (`setpriv`), in the
    /// cgroup root made: the path most users have. The log's directory
    /// must be writable by it.
    pub unprivileged: bool,
}

impl<'a> Spec<'a> {
    /// `shape` with `seed` under `limit`, logged to `log`: `--cgroup auto`,
    /// default settings, as root, a 90 s deadline.
    pub fn new(shape: &'a str, seed: u64, limit: u64, log: &'a Path) -> Self {
        Self {
            shape,
            seed,
            limit,
            cgroup: "auto",
            flags: &[],
            log,
            deadline: Duration::from_secs(90),
            unprivileged: false,
        }
    }
}

/// Runs `spec` in a fresh memory cgroup of its own (removed after, with
/// anything left in it killed). `None` where no memory cgroup can be made.
pub fn run(spec: &Spec<'_>) -> Option<ShapeRun> {
    let cg = MemCgroup::new(&format!("shape-{}-{}", spec.shape, spec.seed), spec.limit)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/shapes.py");
    let usage = cg.dir.join("memory.usage_in_bytes").display().to_string();
    let (limit, seed) = (spec.limit.to_string(), spec.seed.to_string());
    let og = env!("CARGO_BIN_EXE_oomguard");
    let mut argv: Vec<&str> = Vec::new();
    if spec.unprivileged {
        argv.extend(["--reuid=65534", "--regid=65534", "--clear-groups", og]);
    }
    let log = spec.log.to_str()?;
    argv.extend(["run", "--no-tui", "--cgroup", spec.cgroup, "--log", log]);
    argv.extend(spec.flags.iter().copied());
    argv.extend(["--", "python3", script.to_str()?, spec.shape]);
    argv.extend(["--usage-file", &usage, "--limit", &limit, "--seed", &seed]);
    let program = if spec.unprivileged { "setpriv" } else { og };
    let mut cmd = cg.command(Path::new(program), &argv);
    cmd.env_remove("GITHUB_ACTIONS")
        .env_remove("GITHUB_STEP_SUMMARY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let vm_before = vmstat_oom_kills();
    let watch = OomWatch::start(&cg);
    let started = Instant::now();
    let mut child = cmd.spawn().ok()?;
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    });
    // oomguard removes its own child cgroup when it exits: the names are
    // gathered while the run goes on.
    let mut made: BTreeSet<String> = BTreeSet::new();
    let (status, timed_out) = loop {
        for d in walk(&cg.dir).iter().skip(1) {
            if let Some(name) = d.file_name() {
                made.insert(name.to_string_lossy().into_owned());
            }
        }
        if let Some(st) = child.try_wait().ok()? {
            break (Some(st), false);
        }
        if started.elapsed() > spec.deadline {
            let _ = child.kill();
            break (child.wait().ok(), true);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let seconds = started.elapsed().as_secs_f64();
    cg.kill_all();
    let subtree_kills = watch.kills();
    let machine_kills = vmstat_oom_kills().saturating_sub(vm_before);
    Some(ShapeRun {
        exit: status.and_then(|s| s.code()),
        kills: subtree_kills.max(machine_kills),
        subtree_kills,
        cgroups_made: made.into_iter().collect(),
        timed_out,
        seconds,
        stderr: reader.join().unwrap_or_default(),
    })
}
