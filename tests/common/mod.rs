//! Shared test harness: the oomguard binary, strict NDJSON types, memory
//! cgroups for tests that grow memory, and small process helpers.
#![allow(dead_code, clippy::unwrap_used)]

pub mod deadline;
pub mod machine;
pub mod schema;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn oomguard() -> Command {
    deadline::arm();
    let mut c = Command::new(env!("CARGO_BIN_EXE_oomguard"));
    // Tests must not depend on the developer's environment.
    c.env_remove("GITHUB_ACTIONS")
        .env_remove("GITHUB_STEP_SUMMARY");
    clean_env(&mut c);
    c.stdin(Stdio::null());
    c
}

/// The virtual environment with torch, Lightning, transformers and
/// accelerate that `.ci/run` builds (`OOMGUARD_TEST_VENV`, default
/// `~/.cache/oomguard/test-venv`), or None: skipped outside CI.
#[allow(dead_code)]
pub fn torch_venv() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("OOMGUARD_TEST_VENV")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".cache/oomguard/test-venv"))
        })?;
    let ok = dir.join("bin/python").exists() && dir.join("bin/torchrun").exists();
    require(ok, &format!("no torch environment at {}", dir.display())).then_some(dir)
}

/// Removes oomguard's own variables a test may have inherited (a test run
/// under `oomguard run`, a debugging switch left exported): each test sets
/// the ones it means. The torch environment's path stays.
pub fn clean_env(c: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("OOMGUARD_") && k != "OOMGUARD_TEST_VENV" {
            c.env_remove(&*k);
        }
    }
}

/// True when the tests run in CI, where skipping is failing.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skips (returns false) when a requirement is missing, unless in CI where
/// it panics: CI must run every test.
pub fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if in_ci() {
        panic!("CI=true but this test cannot run here: {what}");
    }
    eprintln!("SKIPPED: {what}");
    false
}

/// Held by a test that must run alone (`machine::alone`): the name the
/// suite's `serial_*` tests have always used for it.
pub fn serial() -> machine::Held {
    machine::alone()
}

/// A trainer that prints a step every 50 ms and, on SIGTERM, prints that
/// it saves (to stdout and stderr), writes `ckpt` beside its pid file
/// (`argv[1]`), prints "saved" and exits 0: what a killed oomguard's death
/// signal asks of a trainer.
pub const SAVES_ON_TERM: &str = r#"
import os, signal, sys, time
d = os.path.dirname(sys.argv[1])
def on_term(*_):
    print("saving the checkpoint", flush=True)
    print("saving the checkpoint (stderr)", file=sys.stderr, flush=True)
    time.sleep(0.2)
    with open(os.path.join(d, "ckpt"), "w") as f:
        f.write("ok")
    print("saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
i = 0
while True:
    print(f"step {i}", flush=True)
    i += 1
    time.sleep(0.05)
"#;

/// A python3 script written to a temp dir.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

/// A job that writes 200 MiB to `/dev/shm` and holds it `secs`: charged to
/// its cgroup but mapped by no process, so its working set stands that far
/// above its PSS sum by construction. The file goes when the job exits, and
/// when this is dropped (a job killed before its trap ran).
pub struct ShmJob {
    pub script: PathBuf,
    file: PathBuf,
}

impl ShmJob {
    pub fn new(dir: &Path, tag: &str, secs: u32) -> Self {
        let file = PathBuf::from(format!("/dev/shm/oomguard-{tag}-{}", std::process::id()));
        let f = file.display();
        let body = format!(
            "trap 'rm -f {f}' EXIT\n\
             dd if=/dev/zero of={f} bs=1M count=200 status=none\n\
             sleep {secs}\n"
        );
        Self {
            script: script(dir, "job.sh", &body),
            file,
        }
    }
}

impl Drop for ShmJob {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.file);
    }
}

/// An `oom_kill` event written from the kernel's own report, not from the
/// OOM-kill counter's fallback: only the report gives the constraint and
/// the `kill` record, and only the fallback says a `reason`.
pub fn assert_from_the_kernels_report(kill: &serde_json::Value) {
    assert!(
        kill["constraint"].as_str().is_some_and(|c| !c.is_empty()),
        "no constraint: not from the kernel's report: {kill}"
    );
    assert!(
        kill["kill"]["pid"].is_u64(),
        "no kill record: not from the kernel's report: {kill}"
    );
    assert!(
        kill["reason"].is_null(),
        "a reason: attributed from the counter: {kill}"
    );
}

/// What decided the end: the rule of the first `stop`, `kill` or
/// `restart` action (its reason), and the ceiling (`source`, bytes) of the
/// last sample before it, the one the rule read.
pub fn stop_decision(lines: &[schema::Line]) -> Option<(String, String, u64)> {
    let (at, rule) = lines.iter().find_map(|l| match &l.event {
        schema::Event::Action(a) if matches!(a.action.as_str(), "stop" | "kill" | "restart") => {
            Some((l.t, a.reason.clone()))
        }
        _ => None,
    })?;
    let ceiling = lines
        .iter()
        .filter(|l| l.t <= at)
        .filter_map(|l| l.sample()?.ceiling.as_ref())
        .next_back()?;
    eprintln!(
        "stop decided by {rule} against the {} ceiling of {} bytes",
        ceiling.source, ceiling.bytes
    );
    Some((rule, ceiling.source.clone(), ceiling.bytes))
}

/// The first `oom_kill` event of a log.
pub fn first_oom_kill(lines: &[schema::Line]) -> Option<serde_json::Value> {
    lines.iter().find_map(|l| match &l.event {
        schema::Event::OomKill(v) => Some(v.clone()),
        _ => None,
    })
}

/// Reads the last run of the NDJSON log (the run a test just made), every
/// line of the file checked against the strict schema.
pub fn read_log(path: &Path) -> Vec<schema::Line> {
    last_run(read_log_runs(path))
}

/// Every run the log holds, in order (each `oomguard run --log` to the
/// same file appends one, from its `run_start`).
pub fn read_log_runs(path: &Path) -> Vec<Vec<schema::Line>> {
    let text = fs::read_to_string(path).unwrap();
    let lines: Vec<schema::Line> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            schema::parse_line(l).unwrap_or_else(|e| {
                panic!("log line {} does not match the schema: {e}\n{l}", i + 1)
            })
        })
        .collect();
    runs(lines)
}

/// The lines, cut at each `run_start`.
fn runs(lines: Vec<schema::Line>) -> Vec<Vec<schema::Line>> {
    let mut out: Vec<Vec<schema::Line>> = Vec::new();
    for l in lines {
        if matches!(l.event, schema::Event::RunStart(_)) || out.is_empty() {
            out.push(Vec::new());
        }
        if let Some(run) = out.last_mut() {
            run.push(l);
        }
    }
    out
}

fn last_run(mut runs: Vec<Vec<schema::Line>>) -> Vec<schema::Line> {
    runs.pop().unwrap_or_default()
}

/// Reads whatever lines of the last run are complete so far (the log is
/// being written).
pub fn read_log_lossy(path: &Path) -> Vec<schema::Line> {
    last_run(runs(
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| schema::parse_line(l).ok())
            .collect(),
    ))
}

/// The memory cgroup v1 hierarchy this process runs in, if it can make
/// child cgroups there.
pub fn own_memory_cgroup() -> Option<PathBuf> {
    if !rustix_is_root() {
        return None;
    }
    let cg = fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, ctrl, path) = (p.next()?, p.next()?, p.next()?);
        ctrl.split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
    dir.join("memory.limit_in_bytes").exists().then_some(dir)
}

fn rustix_is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// A child memory cgroup with a limit, removed (with everything in it
/// killed) on drop. Everything that grows memory on purpose runs in one.
pub struct MemCgroup {
    pub dir: PathBuf,
    /// Path inside the hierarchy, as /proc/PID/cgroup shows it.
    pub path: String,
}

impl MemCgroup {
    /// None when this machine cannot make one (then the test skips, or
    /// fails under CI).
    pub fn new(name: &str, limit: u64) -> Option<Self> {
        let parent = own_memory_cgroup()?;
        // Tests of one binary run side by side: the pid alone does not
        // keep two of them (or one test's two runs) apart.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("test-{name}-{}-{n}", std::process::id()));
        let _ = fs::create_dir(&dir);
        fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        let root = Path::new("/sys/fs/cgroup/memory");
        let path = format!("/{}", dir.strip_prefix(root).ok()?.display());
        Some(Self { dir, path })
    }

    /// `new`, or skip the calling test (returning `None`) where this
    /// machine cannot make one — a failure under `CI=true`.
    pub fn or_skip(name: &str, limit: u64) -> Option<Self> {
        let cg = Self::new(name, limit);
        require(cg.is_some(), "needs root and a cgroup v1 memory hierarchy").then_some(())?;
        cg
    }

    /// A command that runs `argv` inside this cgroup.
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
        deadline::arm();
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(&self.dir)
            .arg(program)
            .args(args);
        clean_env(&mut c);
        c.stdin(Stdio::null());
        c
    }

    pub fn read(&self, file: &str) -> String {
        fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// The OOM kills in this cgroup and every cgroup below it (v1 counts a
    /// kill only in the victim's own cgroup, which may be oomguard's child);
    /// a counter that cannot be read fails the test (a silent 0 would let
    /// "the kernel never killed" pass). A child removed before this is read
    /// takes its count with it: tests back this with `/proc/vmstat`.
    pub fn oom_kills(&self) -> u64 {
        walk(&self.dir)
            .iter()
            .map(|dir| {
                let file = dir.join("memory.oom_control");
                let text = match fs::read_to_string(&file) {
                    Ok(t) => t,
                    // Removed between the walk and the read (oomguard's own
                    // cgroup at its exit).
                    Err(_) if !dir.exists() => return 0,
                    Err(_) => String::new(),
                };
                text.lines()
                    .find_map(|l| {
                        l.strip_prefix("oom_kill ")
                            .and_then(|v| v.trim().parse::<u64>().ok())
                    })
                    .unwrap_or_else(|| {
                        panic!("no oom_kill counter in {}: {text:?}", file.display())
                    })
            })
            .sum()
    }

    /// Kills everything left in the cgroup and its children.
    pub fn kill_all(&self) {
        for _ in 0..100 {
            let mut any = false;
            for d in walk(&self.dir) {
                for pid in fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                {
                    any = true;
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            if !any {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Counts the kernel's OOM kills in a cgroup *and every cgroup below it*
/// while a test runs. On cgroup v1 a kill is counted only in the victim's
/// own cgroup — oomguard's `oomguard-<pid>` child, removed when oomguard
/// exits — so the test cgroup's own counter proves nothing about the job.
pub struct OomWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<u64>>,
}

impl OomWatch {
    pub fn start(cg: &MemCgroup) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let dir = cg.dir.clone();
        let handle = std::thread::spawn(move || {
            // Per cgroup path: the last value seen and the kills of earlier
            // cgroups of the same name (a counter starts again at 0).
            let mut seen: std::collections::HashMap<PathBuf, (u64, u64)> = Default::default();
            loop {
                let last_round = flag.load(Ordering::SeqCst);
                for d in walk(&dir) {
                    let Some(n) = read_oom_kill(&d) else { continue };
                    let e = seen.entry(d).or_insert((0, 0));
                    if n < e.0 {
                        e.1 += e.0;
                    }
                    e.0 = n;
                }
                if last_round {
                    return seen.values().map(|(n, before)| n + before).sum();
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops watching and returns the kills seen anywhere in the subtree.
    pub fn kills(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.handle.take().map_or(0, |h| h.join().unwrap())
    }
}

fn read_oom_kill(dir: &Path) -> Option<u64> {
    fs::read_to_string(dir.join("memory.oom_control"))
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix("oom_kill ")
                .and_then(|v| v.trim().parse().ok())
        })
}

/// A cgroup directory and every one below it.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(walk(&e.path()));
            }
        }
    }
    out
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        self.kill_all();
        let mut dirs = walk(&self.dir);
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
}

/// Waits until `f` is true or the timeout passes.
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// `/proc/PID/stat` state letter, None when gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..].trim().chars().next()
}

/// Pids whose parent is `ppid`, with their state.
pub fn children_of(ppid: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(s) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = s.rfind(')') else { continue };
        let mut it = s[close + 1..].split_whitespace();
        let state = it.next().and_then(|x| x.chars().next()).unwrap_or('?');
        if it.next().and_then(|x| x.parse::<u32>().ok()) == Some(ppid) {
            out.push((pid, state));
        }
    }
    out
}

/// Whether `pid` is an oomguard output keeper (`src/job/keeper.rs`).
pub fn is_keeper(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "oomguard-keep")
}

/// The output keeper among oomguard's children: not part of the job.
pub fn keeper_of(og: u32) -> Option<u32> {
    children_of(og)
        .into_iter()
        .map(|c| c.0)
        .find(|&p| is_keeper(p))
}

/// Sends a signal with kill(1).
pub fn send(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill -{sig} {pid}");
}

/// `oomguard forensics` (and `report`) under an address-space limit,
/// `input` written to its stdin: memory must not follow the input.
pub fn run_capped(
    args: &[&str],
    input: impl Fn(&mut dyn std::io::Write) + Send + 'static,
) -> std::process::Output {
    use std::io::Write as _;
    // 256 MiB of address space: far above what either needs, far below
    // the input they are fed.
    deadline::arm();
    let mut child = std::process::Command::new("sh")
        .args(["-c", "ulimit -v 262144 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_oomguard"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        input(&mut stdin);
        let _ = stdin.flush();
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}
