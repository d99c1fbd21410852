//! The sampler: owns the readers (the tree scanner, the PSS sweep, the
//! machine, the job's cgroup, NVML, PyTorch's allocator reports) and turns
//! them into one [`Sample`] per tick. It keeps the tree of the last scan,
//! which is what signals may be sent to.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::act::{Ident, idents};
use super::attach::Attached;
use crate::engine::probe::cgroup::CgroupReader;
use crate::engine::probe::gpu::GpuProbe;
use crate::engine::probe::proc::{TreeScanner, totals};
use crate::engine::probe::pss::{Member, PssSweeper, SweepConfig};
use crate::engine::probe::shm;
use crate::engine::probe::system::SystemReader;
use crate::engine::probe::torch_stats::TorchStatsReader;
use crate::sinks::log::ShmSegments;
use crate::vocab::model::{GpuSample, ProcSample, Role, Sample, ShmSample};

pub struct Sampler {
    proc_root: PathBuf,
    /// Whether NVML could be opened, and why not (for `run_start`).
    gpu_info: crate::sinks::log::GpuInfo,
    /// `--torch-stats`: the injected reporter (removed on drop); its
    /// reader is `torch`.
    torch_injector: Option<crate::job::inject::TorchStatsInjector>,
    started: Instant,
    scanner: TreeScanner,
    sweeper: PssSweeper,
    system: SystemReader,
    cgroup: Option<CgroupReader>,
    /// The user's `--budget`, resolved to bytes.
    budget_bytes: Option<u64>,
    gpu: Option<GpuProbe>,
    /// `--torch-stats`: the reports of the injected reporter.
    torch: Option<TorchStatsReader>,
    /// The tree at the last scan: what signals may be sent to.
    tree: Vec<ProcSample>,
    /// Zombies whose parent is oomguard, seen at the last scan: not gone
    /// until reaped.
    zombie_children: usize,
    /// The owned cgroup's members at the last full scan.
    owned_members: HashSet<u32>,
    /// NSpid chains of tree processes (they never change for a process).
    ns_pids: HashMap<Ident, Vec<u32>>,
    /// The last GPU reading: when NVML took it, the devices, and each tree
    /// process's share (fast ticks carry it on, with its age).
    gpu_last: Option<(Instant, Vec<GpuSample>, HashMap<Ident, u64>)>,
    /// Recent (t, used bytes) of the fullest GPU, for its ETA.
    gpu_history: VecDeque<(f64, f64)>,
    /// Every trainer's and worker's pid seen: whose `torch_<pid>_…`
    /// segments in `/dev/shm` are the job's to remove when it ends.
    /// (Launchers and helpers never make one; a job's shells churn.)
    python_pids: HashSet<u32>,
    /// Where the last tick read `/dev/shm` (the trainer's view), for the
    /// cheap loop between ticks.
    shm_path: Option<PathBuf>,
}

/// The readers a sampler is built from (plain data: `setup.rs` opens them).
pub struct Readers {
    pub scanner: TreeScanner,
    pub system: SystemReader,
    pub cgroup: Option<CgroupReader>,
    pub budget_bytes: Option<u64>,
    pub gpu: Option<GpuProbe>,
    pub gpu_info: crate::sinks::log::GpuInfo,
    pub torch: Option<TorchStatsReader>,
    pub torch_injector: Option<crate::job::inject::TorchStatsInjector>,
}

impl Sampler {
    /// Starts the PSS sweep over `proc_root` and takes the readers.
    pub fn new(proc_root: PathBuf, started: Instant, sweep: SweepConfig, r: Readers) -> Self {
        Self {
            sweeper: PssSweeper::start(proc_root.clone(), sweep),
            proc_root,
            gpu_info: r.gpu_info,
            torch_injector: r.torch_injector,
            started,
            scanner: r.scanner,
            system: r.system,
            cgroup: r.cgroup,
            budget_bytes: r.budget_bytes,
            gpu: r.gpu,
            torch: r.torch,
            tree: Vec::new(),
            zombie_children: 0,
            owned_members: HashSet::new(),
            ns_pids: HashMap::new(),
            gpu_last: None,
            gpu_history: VecDeque::new(),
            python_pids: HashSet::new(),
            shm_path: None,
        }
    }

    /// The tree at the last scan: what signals may be sent to.
    pub fn tree(&self) -> &[ProcSample] {
        &self.tree
    }

    /// Nothing of the job is left: no process in the tree, and no zombie
    /// of oomguard's still to reap.
    pub fn tree_gone(&self) -> bool {
        self.tree.is_empty() && self.zombie_children == 0
    }

    /// The next attempt's leader is `pid`; the last attempt's tree is
    /// forgotten.
    pub fn new_attempt(&mut self, pid: u32) {
        self.scanner.set_job(Some(pid));
        self.tree.clear();
        self.zombie_children = 0;
    }

    /// Leaves `pid` (a hook, a keeper) out of the job's tree.
    pub fn exclude(&mut self, pid: u32) {
        self.scanner.exclude(pid);
    }

    /// A pid left out before may be the job's again (it was reaped).
    pub fn include(&mut self, pid: u32) {
        self.scanner.include(pid);
    }

    pub fn cgroup(&self) -> Option<&CgroupReader> {
        self.cgroup.as_ref()
    }

    /// The user's `--budget`, in bytes.
    pub fn budget_bytes(&self) -> Option<u64> {
        self.budget_bytes
    }

    pub fn gpu_info(&self) -> &crate::sinks::log::GpuInfo {
        &self.gpu_info
    }

    pub fn torch_injector(&self) -> Option<&crate::job::inject::TorchStatsInjector> {
        self.torch_injector.as_ref()
    }

    /// The machine's OOM-kill counter now.
    pub fn machine_oom_kills(&mut self, now: Instant) -> Option<u64> {
        self.system.read(now).oom_kill_total
    }

    /// A full scan of the tree, kept as the tree signals go to.
    pub fn refresh(&mut self, attached: Option<&Attached>) {
        self.tree = self.scan(false, attached);
    }

    /// Reads one tick's sample. A quick sample re-reads only the processes
    /// already known (no /proc walk): cheap enough for 20 ms polling.
    /// One sample of the job: its tree (a quick scan re-reads only the
    /// known processes), the cgroup, the machine, the PSS sweep's latest
    /// readings, the GPUs and PyTorch's allocator.
    pub fn sample(&mut self, quick: bool, attached: Option<&Attached>) -> Sample {
        let now = crate::vocab::clock::now();
        let mut procs = self.scan(quick, attached);
        // One pass over the cgroup files; the owned cgroup's working set is
        // the job's exact footprint.
        let (cgroup, owned_ws) = match self.cgroup.as_ref() {
            Some(c) if c.owned() || attached.is_some_and(|a| a.exclusive.is_some()) => {
                match c.read_with_working_set() {
                    Some((s, ws)) => (Some(s), Some(ws)),
                    None => (None, None),
                }
            }
            Some(c) => (c.read(), None),
            None => (None, None),
        };
        let system = self.system.read(now);
        if !quick {
            // Without a cgroup to read, the machine's used memory still grows
            // when a worker copies a page it shared, which no RSS shows.
            let charged = owned_ws.or(cgroup.as_ref().map(|c| c.usage_bytes)).or(Some(
                system
                    .mem_total_bytes
                    .saturating_sub(system.mem_available_bytes),
            ));
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
        if let Some(reader) = self.torch.as_mut() {
            if !quick {
                let _ = reader.poll();
                let live: HashSet<u32> = procs.iter().map(|p| p.pid).collect();
                reader.retain_pids(|pid| live.contains(&pid));
            }
            for p in procs.iter_mut() {
                p.torch = reader.latest().get(&p.pid).cloned();
            }
        }
        let shm = self.shm(&procs);
        self.python_pids.extend(
            (procs.iter())
                .filter(|p| matches!(p.role, Role::Trainer | Role::Worker))
                .map(|p| p.pid),
        );
        self.tree = procs.clone();
        Sample {
            t: now.duration_since(self.started).as_secs_f64(),
            tree,
            procs,
            system,
            cgroup,
            psi,
            gpus,
            shm,
            budget_bytes: self.budget_bytes,
            others_bytes: 0,
        }
    }

    /// Removes the `torch_<pid>_…` segments in `/dev/shm` (oomguard's
    /// view: a namespace of the job's own went with it) that the job's
    /// processes left; call once the job has ended.
    pub fn remove_left_shm_segments(&self) -> Option<ShmSegments> {
        let (files, bytes) = shm::remove_left_segments(
            &self.proc_root.join("self/root/dev/shm"),
            &self.python_pids,
            &self.proc_root,
        );
        (files > 0).then_some(ShmSegments { files, bytes })
    }

    /// `/dev/shm` as the trainer sees it (the first process below the
    /// launchers; the leader before one is known): a `docker run` or an
    /// `unshare -m` wrapping only the job has its own. Every tick: one
    /// `statfs`, and a 64 MiB tmpfs fills in seconds.
    fn shm(&mut self, procs: &[ProcSample]) -> Option<ShmSample> {
        let pid = procs
            .iter()
            .find(|p| p.role == Role::Trainer)
            .or(procs.first())?
            .pid;
        let path = shm::path_of(&self.proc_root, pid);
        let read = shm::read(&path);
        self.shm_path = read.is_some().then_some(path);
        read
    }

    /// Where the last tick read `/dev/shm` from, when it read one.
    pub fn shm_path(&self) -> Option<&Path> {
        self.shm_path.as_deref()
    }

    /// The tree's live processes (zombies are counted apart: ours are not
    /// gone until reaped). A quick scan re-reads only the processes already
    /// known; otherwise the owned cgroup's members, or a /proc walk.
    pub fn scan(&mut self, quick: bool, attached: Option<&Attached>) -> Vec<ProcSample> {
        let found = if quick && !self.tree.is_empty() {
            // By identity: a recycled pid must not join the tree. The
            // owned cgroup's member list is one read: new members join.
            let known = idents(&self.tree, |_| true);
            let members = self
                .cgroup
                .as_ref()
                .filter(|c| c.owned())
                .and_then(|c| c.procs())
                .unwrap_or_default();
            self.scanner.rescan_and(&known, &members)
        } else if let Some(m) = attached.and_then(Attached::members) {
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

    /// The latest GPU reading (never blocks: NVML runs on its own thread),
    /// attributed to the tree's processes by pid, namespaced pids included.
    fn sample_gpus(&mut self, procs: &mut [ProcSample]) -> Option<Vec<GpuSample>> {
        use crate::engine::probe::gpu::{TreeProc, attribute, read_ns_pids};
        let reading = self.gpu.as_mut().and_then(|g| g.sample())?;
        let root = self.proc_root.clone();
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
        let gpus: Vec<GpuSample> = reading
            .devices
            .iter()
            .map(|d| {
                let a = att.devices.iter().find(|a| a.index == d.index);
                GpuSample {
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
    fn last_gpus(&self, procs: &mut [ProcSample], now: Instant) -> Vec<GpuSample> {
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
    pub fn gpu_eta(&mut self, sample: &Sample) -> Option<f64> {
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
        crate::vocab::growth::eta(
            self.gpu_history.make_contiguous(),
            g.total_bytes.saturating_sub(g.used_bytes) as f64,
        )
    }
}
