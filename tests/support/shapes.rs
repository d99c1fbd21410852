//! Runs one memory shape of `benches/shapes.py` under oomguard, inside a
//! memory cgroup of its own with a limit, with a deadline: shared by the
//! shape tests (`tests/shapes.rs`, default policy) and the policy benchmark
//! (`benches/policy.rs`, which records traces with `--policy none
//! --log-every-tick` and scores them with `replay --score`).
//!
//! Kernel kills are counted in the whole cgroup subtree (oomguard's own
//! `oomguard-<pid>` child included) and, as a backstop, in the machine's
//! `/proc/vmstat` `oom_kill` counter: these runs go one at a time.
#![allow(dead_code, clippy::unwrap_used, clippy::print_stderr)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    pub timed_out: bool,
    pub seconds: f64,
    pub stderr: String,
}

/// The v1 memory cgroup this process runs in, when it can make children.
pub fn own_memcg() -> Option<PathBuf> {
    let cg = fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, ctrl, path) = (p.next()?, p.next()?, p.next()?);
        ctrl.split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
    let probe = dir.join(format!("shapes-probe-{}", std::process::id()));
    fs::create_dir(&probe).ok()?;
    let _ = fs::remove_dir(&probe);
    Some(dir)
}

fn vmstat_oom_kills() -> u64 {
    fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .unwrap_or(0)
}

fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(subtree(&e.path()));
            }
        }
    }
    out
}

fn kill_and_remove(dir: &Path) {
    for _ in 0..200 {
        let mut any = false;
        for d in subtree(dir) {
            for pid in fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
            {
                any = true;
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        if !any {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut dirs = subtree(dir);
    dirs.reverse();
    for d in dirs {
        for _ in 0..50 {
            if fs::remove_dir(&d).is_ok() || !d.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
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

/// Runs `spec` in a fresh memory cgroup under `parent` (removed after,
/// with anything left in it killed).
pub fn run(parent: &Path, spec: &Spec<'_>) -> ShapeRun {
    let dir = parent.join(format!(
        "shape-{}-{}-{}",
        spec.shape,
        std::process::id(),
        spec.seed
    ));
    let _ = fs::create_dir(&dir);
    fs::write(dir.join("memory.limit_in_bytes"), spec.limit.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/shapes.py");
    let usage = dir.join("memory.usage_in_bytes");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(&dir);
    if spec.unprivileged {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
    }
    cmd.arg(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "--no-tui", "--cgroup", spec.cgroup, "--log"])
        .arg(spec.log)
        .args(spec.flags)
        .args(["--", "python3"])
        .arg(&script)
        .arg(spec.shape)
        .arg("--usage-file")
        .arg(&usage)
        .args(["--limit", &spec.limit.to_string()])
        .args(["--seed", &spec.seed.to_string()])
        .env_remove("GITHUB_ACTIONS")
        .env_remove("GITHUB_STEP_SUMMARY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let vm_before = vmstat_oom_kills();
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    });
    // Kill counters per cgroup of the subtree: oomguard removes its own
    // child cgroup when it exits, so it is read while the run goes on.
    let mut seen: std::collections::HashMap<PathBuf, u64> = Default::default();
    let (status, timed_out) = loop {
        for d in subtree(&dir) {
            if let Some(n) = fs::read_to_string(d.join("memory.oom_control"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
                })
            {
                let e = seen.entry(d).or_insert(0);
                *e = (*e).max(n);
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            break (Some(st), false);
        }
        if started.elapsed() > spec.deadline {
            let _ = child.kill();
            break (child.wait().ok(), true);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let seconds = started.elapsed().as_secs_f64();
    kill_and_remove(&dir);
    let subtree_kills: u64 = seen.values().sum();
    let machine_kills = vmstat_oom_kills().saturating_sub(vm_before);
    ShapeRun {
        exit: status.and_then(|s| s.code()),
        kills: subtree_kills.max(machine_kills),
        subtree_kills,
        timed_out,
        seconds,
        stderr: reader.join().unwrap_or_default(),
    }
}
