//! Hand-built, deterministic runs for the screen tests: a `bash train.sh`
//! job with a trainer and DataLoader workers under a cgroup limit, sampled
//! every 2 s through the real `History` (so ETA and the fastest process are
//! what the loop would show). No clock, no randomness.

use crate::sinks::tui::app::App;
use crate::vocab::model::{
    CgroupSample, GpuSample, History, ProcSample, Psi, Role, Sample, SystemSample, TreeTotals,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The shape of a fixture run.
#[derive(Debug, Clone)]
pub struct Run {
    pub workers: usize,
    /// Seconds of samples, every 2 s from 0.
    pub seconds: u32,
    /// Growth of worker 2 in bytes per second (the leak).
    pub leak: u64,
    /// PSS of the trainer at t = 0.
    pub trainer_pss: u64,
    /// cgroup limit.
    pub limit: u64,
    pub gpus: usize,
    /// A worker that disappears at this time (OOM-killed).
    pub killed_at: Option<u32>,
    /// Memory stops changing from this time on (the tree was paused).
    pub frozen_at: Option<u32>,
    /// The machine's RAM.
    pub mem_total: u64,
    /// The trainer forks its workers at this time (otherwise they are
    /// there from the start): before, it counts the pages they will share
    /// in full; after, a share each (PSS moves, nothing is freed).
    pub forked_at: Option<u32>,
    /// The tree is torn down from this time on (a stop): its processes
    /// hold no pages (RSS 0), their PSS is the sweeper's stale estimate,
    /// and the cgroup still holds what the kernel has not uncharged.
    pub exiting_at: Option<u32>,
}

impl Default for Run {
    fn default() -> Self {
        Self {
            workers: 4,
            seconds: 300,
            leak: 0,
            trainer_pss: 5 * GIB,
            limit: 16 * GIB,
            gpus: 0,
            killed_at: None,
            frozen_at: None,
            mem_total: 64 * GIB,
            forked_at: None,
            exiting_at: None,
        }
    }
}

fn proc(pid: u32, ppid: u32, role: Role, comm: &str, pss: u64, shared: u64) -> ProcSample {
    ProcSample {
        pid,
        ppid,
        role,
        comm: comm.into(),
        rss_bytes: pss + shared,
        pss_bytes: pss,
        uss_bytes: pss.saturating_sub(shared / 8),
        swap_bytes: 0,
        rss_peak_bytes: None,
        gpu_bytes: None,
        read_age_seconds: None,
        torch: None,
        start_time: u64::from(pid) * 10,
        stopped: false,
    }
}

/// The trainer (`procs[1]`) and its workers of a run whose trainer forks
/// them at `fork`: 2 GiB of the trainer's pages are shared by all of them
/// after, and each worker allocates 40 MiB of its own and then 64 KiB/s.
fn forked(run: &Run, t: u32, fork: u32, procs: &mut Vec<ProcSample>) {
    let shared = 2 * GIB;
    if t < fork {
        procs[1].pss_bytes += shared;
        procs[1].rss_bytes += shared;
        return;
    }
    let share = shared / (run.workers as u64 + 1);
    procs[1].pss_bytes += share;
    procs[1].rss_bytes += shared;
    for i in 0..run.workers {
        let own = 40 * MIB + u64::from(t - fork) * 64 * 1024;
        let mut p = proc(
            4200 + i as u32,
            4101,
            Role::Worker,
            "pt_data_worker",
            own + share,
            shared - share,
        );
        p.uss_bytes = own;
        procs.push(p);
    }
}

/// A worker of `pss` bytes, for tests of one mechanism: RSS twice and
/// USS half its PSS, started at time `pid`.
pub fn bare_proc(pid: u32, ppid: u32, pss: u64) -> ProcSample {
    ProcSample {
        pid,
        ppid,
        role: Role::Worker,
        comm: format!("p{pid}"),
        rss_bytes: pss * 2,
        pss_bytes: pss,
        uss_bytes: pss / 2,
        swap_bytes: 0,
        rss_peak_bytes: None,
        gpu_bytes: None,
        read_age_seconds: None,
        torch: None,
        start_time: u64::from(pid),
        stopped: false,
    }
}

/// A sample of `procs` alone at `t`, its tree's PSS their sum.
pub fn bare_sample(t: f64, procs: Vec<ProcSample>) -> Sample {
    Sample {
        t,
        tree: TreeTotals {
            procs: procs.len() as u32,
            pss_bytes: procs.iter().map(|p| p.pss_bytes).sum(),
            ..Default::default()
        },
        procs,
        ..Default::default()
    }
}

/// The sample at `t` of `run`.
pub fn sample(run: &Run, t: u32) -> Sample {
    let tf = f64::from(t);
    let killed = run.killed_at.is_some_and(|k| t >= k);
    // Memory as of this time (it stands still while frozen).
    let t = run.frozen_at.map_or(t, |f| t.min(f));
    let mut procs = vec![
        proc(4100, 4000, Role::Launcher, "bash", 3 * MIB + 512 * 1024, 0),
        proc(
            4101,
            4100,
            Role::Trainer,
            "python",
            run.trainer_pss + u64::from(t) * 2 * MIB,
            0,
        ),
    ];
    if let Some(fork) = run.forked_at {
        forked(run, t, fork, &mut procs);
    }
    for i in 0..run.workers {
        let pid = 4200 + i as u32;
        if i == 2 && killed || run.forked_at.is_some() {
            continue;
        }
        // Workers share most of the trainer's pages copy-on-write; each
        // one's own share grows slowly, worker 2 leaks.
        let base = 600 * MIB + (i as u64 % 7) * 37 * MIB + u64::from(t) * 64 * 1024;
        let pss = if i == 2 {
            base + u64::from(t) * run.leak
        } else {
            base
        };
        procs.push(proc(
            pid,
            4101,
            Role::Worker,
            "pt_data_worker",
            pss,
            2 * GIB,
        ));
    }
    let gpu_total = 80 * GIB;
    let gpus: Vec<GpuSample> = (0..run.gpus)
        .map(|i| {
            let tree = 52 * GIB + u64::from(t) * 8 * MIB / (i as u64 + 1);
            let foreign = if i == 1 { 9 * GIB } else { 0 };
            GpuSample {
                index: i as u32,
                name: "NVIDIA A100-SXM4-80GB".into(),
                uuid: format!("GPU-{i}"),
                used_bytes: tree + foreign,
                total_bytes: gpu_total,
                free_bytes: gpu_total - tree - foreign,
                reserved_bytes: 0,
                util_percent: Some(93 - 6 * i as u32),
                tree_bytes: tree,
                foreign_bytes: foreign,
                age_seconds: None,
            }
        })
        .collect();
    if run.gpus > 0 {
        procs[1].gpu_bytes = Some(gpus.iter().map(|g| g.tree_bytes).sum());
    }
    // The cgroup also holds page cache the job cannot drop right away.
    let working_set = procs.iter().map(|p| p.pss_bytes).sum::<u64>() + 300 * MIB;
    if run.exiting_at.is_some_and(|e| t >= e) {
        for p in &mut procs {
            p.rss_bytes = 0;
            p.uss_bytes = 0;
            p.pss_bytes /= 100;
        }
    }
    let pss: u64 = procs.iter().map(|p| p.pss_bytes).sum();
    let rss: u64 = procs.iter().map(|p| p.rss_bytes).sum();
    let uss: u64 = procs.iter().map(|p| p.uss_bytes).sum();
    Sample {
        t: tf,
        tree: TreeTotals {
            procs: procs.len() as u32,
            rss_bytes: rss,
            pss_bytes: pss,
            uss_bytes: uss,
            swap_bytes: 0,
            footprint_bytes: working_set,
            pss_age_seconds: 1.0,
        },
        procs,
        system: SystemSample {
            mem_total_bytes: run.mem_total,
            mem_available_bytes: run.mem_total.saturating_sub(working_set + 9 * GIB),
            swap_total_bytes: 8 * GIB,
            swap_used_bytes: 0,
            swap_in_bytes_per_s: 0.0,
            swap_out_bytes_per_s: 0.0,
            oom_kill_total: Some(0),
        },
        cgroup: Some(CgroupSample {
            version: 2,
            path: "/user.slice/job-1234".into(),
            usage_bytes: working_set + 200 * MIB,
            limit_bytes: Some(run.limit),
            oom_kill_count: Some(u64::from(killed)),
            limit_path: Some("/user.slice/job-1234".into()),
            limit_working_set_bytes: Some(working_set),
            owned: false,
        }),
        psi: Some(Psi {
            some_avg10: 0.4,
            full_avg10: 0.0,
        }),
        gpus,
        shm: None,
        budget_bytes: None,
        others_bytes: 0,
    }
}

/// An app that has seen the whole run, with thresholds at 20 % / 10 %.
pub fn app(run: &Run) -> App {
    let mut app = App::new("bash train.sh --config configs/resnet50.yaml --epochs 90".into());
    app.set_thresholds(Some(20.0), Some(10.0));
    let mut history = History::new(30.0);
    for t in (0..=run.seconds).step_by(2) {
        let s = sample(run, t);
        let v = history.push(&s);
        app.on_sample(&s, &v);
    }
    if run.gpus > 0 {
        app.on_torch(
            4101,
            (0..run.gpus as u32)
                .map(|d| (d, 41 * GIB, 48 * GIB))
                .collect(),
        );
    }
    app
}

/// Some realistic job output: a log line, a warning, a tqdm bar that
/// rewrites itself.
pub fn output(app: &mut App) {
    app.on_output(b"\x1b[32mINFO\x1b[0m loading dataset from /data/imagenet (1281167 images)\r\n");
    app.on_output(b"\x1b[33mWARNING\x1b[0m num_workers=4 may be too many for this machine\r\n");
    for epoch in 1..=3 {
        for step in [0, 25, 50, 75, 100] {
            app.on_output(
                format!(
                    "\repoch {epoch}: {step:3}%|{:<20}| {}/5005 [02:1{epoch}<00:00, 38.2it/s]",
                    "█".repeat(step / 5),
                    step * 5005 / 100
                )
                .as_bytes(),
            );
        }
        app.on_output(
            format!(
                "\r\nepoch {epoch}: loss 2.{}31 top1 {}.4%\r\n",
                9 - epoch,
                40 + 10 * epoch
            )
            .as_bytes(),
        );
    }
    app.on_output(b"\repoch 4:  37%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88           | 1852/5005 [00:48<01:22, 38.3it/s]");
}
