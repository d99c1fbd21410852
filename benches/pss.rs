//! What PSS accounting costs: one `smaps_rollup` sweep of a parent and 6
//! workers sharing 1, 4 and 8 GiB (inside a memory cgroup), the PSS age the
//! default 1 % budget implies, and oomguard's own CPU on a churning tree
//! (6 workers re-forked every epoch) and on a static 64-process tree,
//! beside a psrecord-like poller on the same tree.
//!
//! `cargo bench --bench pss` (root and cgroup v1 for the cgroup; about four
//! minutes). `-- quick` skips the 8 GiB tree and the 3 s epochs.

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oomguard::engine::probe::proc::parse_smaps_rollup;

const GIB: u64 = 1 << 30;

/// A child memory cgroup (v1) of this process's, removed on drop.
struct Cg(PathBuf);

impl Cg {
    fn new(name: &str, limit: u64) -> Option<Cg> {
        let own = fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = own.lines().find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, ctrl, path) = (p.next()?, p.next()?, p.next()?);
            ctrl.split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })?;
        let dir = Path::new("/sys/fs/cgroup/memory")
            .join(path.trim_start_matches('/'))
            .join(format!("bench-{name}-{}", std::process::id()));
        let _ = fs::create_dir(&dir);
        fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        Some(Cg(dir))
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
            .arg(&self.0)
            .arg(program);
        c
    }
}

impl Drop for Cg {
    fn drop(&mut self) {
        for _ in 0..100 {
            let procs = fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() {
                break;
            }
            for pid in procs.lines() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = fs::remove_dir(&self.0);
    }
}

fn bench_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches")
        .join(name)
}

fn thread_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn mem_available() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn descendants(root: u32) -> Vec<u32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        for task in fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let kids = fs::read_to_string(task.path().join("children")).unwrap_or_default();
            out.extend(
                kids.split_whitespace()
                    .filter_map(|s| s.parse::<u32>().ok()),
            );
        }
        i += 1;
    }
    out
}

/// CPU of one sweep (every process's smaps_rollup, back to back) of a
/// parent holding `gib` GiB and 6 forked workers that map it.
fn sweep_cost(gib: u64) {
    if mem_available() < gib * GIB + 4 * GIB {
        println!("sweep, {gib} GiB: skipped (not enough free memory)");
        return;
    }
    let Some(cg) = Cg::new(&format!("sweep{gib}"), gib * GIB + GIB) else {
        println!("sweep, {gib} GiB: skipped (needs root and a cgroup v1 memory hierarchy)");
        return;
    };
    let mut child: Child = cg
        .command("python3")
        .arg(bench_file("forker.py"))
        .args(["7", &(gib * 1024).to_string(), "120"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready");
    // The shell execs python3: the child's pid is the parent's.
    let pids = descendants(child.id());
    let mut costs = Vec::new();
    let mut pss = 0;
    for _ in 0..5 {
        let c0 = thread_cpu();
        pss = 0;
        for p in &pids {
            let text = fs::read_to_string(format!("/proc/{p}/smaps_rollup")).unwrap_or_default();
            pss += parse_smaps_rollup(&text).map_or(0, |r| r.pss);
        }
        costs.push(thread_cpu() - c0);
    }
    costs.sort_by(f64::total_cmp);
    let cost = costs[costs.len() / 2];
    println!(
        "sweep, {gib} GiB shared by {} processes (PSS sum {:.2} GiB): {:.1} ms CPU; \
         at the default 1% budget one such sweep every {:.0} s",
        pids.len(),
        pss as f64 / GIB as f64,
        cost * 1e3,
        cost / 0.01
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// oomguard's own CPU (utime + stime of its process) while it watches
/// `args`, and the largest PSS age it logged.
fn oomguard_cpu(what: &str, extra: &[&str], job: &[String], psrecord: bool) {
    let Some(cg) = Cg::new("cpu", 3 * GIB) else {
        println!("{what}: skipped (needs root and a cgroup v1 memory hierarchy)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let mut og = cg
        .command(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "-q", "--cgroup", "off", "--interval", "1s", "--log"])
        .arg(&log)
        .args(extra)
        .arg("--")
        .args(job)
        .stdout(Stdio::null())
        .spawn()
        .expect("oomguard");
    let pid = og.id();
    let rec = psrecord.then(|| {
        Command::new("python3")
            .arg(bench_file("psrecord_like.py"))
            .args([&pid.to_string(), "1"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3")
    });
    let t0 = Instant::now();
    let mut ticks = 0u64;
    while og.try_wait().ok().flatten().is_none() {
        if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat"))
            && let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..])
        {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if let (Some(u), Some(s)) = (f.get(11), f.get(12)) {
                ticks = u.parse::<u64>().unwrap_or(0) + s.parse::<u64>().unwrap_or(0);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = ticks as f64 / 100.0;
    let max_age = fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(r#""event":"sample""#))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["tree"]["pss_age_seconds"].as_f64())
        .fold(0.0f64, f64::max);
    let mut line = format!(
        "{what}: oomguard CPU {cpu:.2} s over {wall:.0} s = {:.2}% of one core, \
         PSS age at most {max_age:.1} s",
        cpu / wall * 100.0
    );
    if let Some(rec) = rec {
        let out = rec.wait_with_output().expect("psrecord-like");
        let rec_cpu: f64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(f64::NAN);
        line += &format!(
            "; psrecord-like poller (1 s) {rec_cpu:.2} s = {:.2}%",
            rec_cpu / wall * 100.0
        );
    }
    println!("{line}");
}

fn churn(epochs: u32, epoch_s: f64) -> Vec<String> {
    vec![
        "python3".into(),
        bench_file("churn.py").display().to_string(),
        "800".into(),
        "40".into(),
        "6".into(),
        epochs.to_string(),
        epoch_s.to_string(),
        "1".into(),
        "2".into(),
        "2".into(),
    ]
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let sizes: &[u64] = if quick { &[1, 4] } else { &[1, 4, 8] };
    for &gib in sizes {
        sweep_cost(gib);
    }
    oomguard_cpu(
        "churn, 800 MiB + 6 workers re-forked in 20 s epochs",
        &[],
        &churn(2, 20.0),
        false,
    );
    if !quick {
        oomguard_cpu(
            "churn, 800 MiB + 6 workers re-forked in 3 s epochs",
            &[],
            &churn(8, 3.0),
            false,
        );
    }
    let forker = vec![
        "python3".to_string(),
        bench_file("forker.py").display().to_string(),
        "64".into(),
        "30".into(),
        "40".into(),
    ];
    oomguard_cpu("static 64-process tree (30 MiB)", &[], &forker, true);
}
