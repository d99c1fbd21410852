//! The job's process tree from `/proc`: who is in it, their roles, and what
//! each one costs.
//!
//! The per-tick path reads only `/proc/PID/stat` (ppid, start time, comm and
//! RSS in one cheap read). PSS, USS and swap need `smaps_rollup`, which walks
//! every mapping and costs milliseconds on a large process: the background
//! sweeper in [`crate::engine::probe::pss`] takes those readings within a CPU budget.
//!
//! A process that vanishes mid-scan or whose files cannot be read (hidepid,
//! another user) is skipped quietly: never an error, never a crash.
//! See proc_pid_stat(5) and Documentation/filesystems/proc.rst.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::vocab::model::{ProcSample, Role, TreeTotals};

/// The fields of `/proc/PID/stat` oomguard uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatLine {
    pub pid: u32,
    pub comm: String,
    pub state: char,
    pub ppid: u32,
    pub pgrp: i32,
    pub session: i32,
    /// Field 22, in clock ticks since boot: with the pid, the identity.
    pub start_time: u64,
    /// Field 24, resident pages.
    pub rss_pages: u64,
}

/// Parses `/proc/PID/stat`. `comm` may contain spaces and parentheses, so
/// the fields after it are found from the *last* `)`.
pub fn parse_stat(text: &str) -> Option<StatLine> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    if close < open {
        return None;
    }
    let pid = text[..open].trim().parse().ok()?;
    let comm = text[open + 1..close].to_string();
    let mut rest = text[close + 1..].split_ascii_whitespace();
    // Fields are numbered from 1; `rest` starts at field 3 (state).
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    let session = rest.next()?.parse().ok()?;
    // Skip fields 7..=21 (15 fields) to reach start time (22).
    let mut rest = rest.skip(15);
    let start_time = rest.next()?.parse().ok()?;
    let _vsize = rest.next()?;
    let rss_pages = rest.next()?.parse::<i64>().ok()?.max(0) as u64;
    Some(StatLine {
        pid,
        comm,
        state,
        ppid,
        pgrp,
        session,
        start_time,
        rss_pages,
    })
}

/// How a process that has ended but not been reaped yet (a zombie) ended,
/// from its `/proc/PID/stat` (field 52, `exit_code`, since Linux 3.5): the
/// wait status its parent will read. `None` for a live process, or once
/// reaped (the file is gone), or on a kernel without the field.
pub fn zombie_status(text: &str) -> Option<i32> {
    let close = text.rfind(')')?;
    let mut rest = text[close + 1..].split_ascii_whitespace();
    if rest.next()? != "Z" {
        return None;
    }
    // `rest` is at field 4 now; field 52 is 48 further.
    rest.nth(48)?.parse().ok()
}

/// A wait status in words: `exited with 1`, `killed by SIGKILL`.
pub enum Ended {
    Exited(i32),
    Signaled(i32),
}

impl Ended {
    pub fn from_wait_status(status: i32) -> Self {
        match status & 0x7f {
            0 => Ended::Exited((status >> 8) & 0xff),
            sig => Ended::Signaled(sig),
        }
    }
}

/// The totals of `/proc/PID/smaps_rollup`, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rollup {
    pub rss: u64,
    pub pss: u64,
    /// Private_Clean + Private_Dirty (+ Private_Hugetlb).
    pub uss: u64,
    /// SwapPss when the kernel has it (so tree sums do not double-count
    /// shared swapped pages), Swap otherwise.
    pub swap: u64,
}

/// Parses `/proc/PID/smaps_rollup` (or a whole `smaps`, whose lines it sums).
pub fn parse_smaps_rollup(text: &str) -> Option<Rollup> {
    let mut r = Rollup::default();
    let (mut swap, mut swap_pss, mut seen) = (0u64, None::<u64>, false);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let kb = || -> Option<u64> {
            let v = value.trim().strip_suffix("kB")?.trim();
            v.parse::<u64>().ok().map(|v| v * 1024)
        };
        match key {
            "Rss" => {
                r.rss += kb()?;
                seen = true;
            }
            "Pss" => r.pss += kb()?,
            "Private_Clean" | "Private_Dirty" | "Private_Hugetlb" => r.uss += kb()?,
            "Swap" => swap += kb()?,
            "SwapPss" => *swap_pss.get_or_insert(0) += kb()?,
            _ => {}
        }
    }
    r.swap = swap_pss.unwrap_or(swap);
    seen.then_some(r)
}

/// Commands that only start other commands. A process below a chain of these
/// is a trainer. Kept in one place so the README can list it.
pub const LAUNCHERS: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "fish",
    "env",
    "timeout",
    "nohup",
    "nice",
    "ionice",
    "taskset",
    "numactl",
    "stdbuf",
    "time",
    "setsid",
    "chrt",
    "flock",
    "srun",
    "mpirun",
    "mpiexec",
    "orterun",
    "prterun",
    "torchrun",
    "accelerate",
    "deepspeed",
    "uv",
    "conda",
    "poetry",
    "pipenv",
    "pyenv",
    "sudo",
    "su",
    "runuser",
    "xargs",
    "make",
    "just",
    "tini",
    "dumb-init",
    "hydra_pmi_proxy",
    "pmi_proxy",
];

/// Python command lines that are launchers although their comm is `python`.
const PYTHON_LAUNCHER_ARGS: &[&str] = &[
    "torch.distributed.run",
    "torch.distributed.launch",
    "torchrun",
    "accelerate",
    "deepspeed",
];

/// Whether a process is a launcher, from its comm and (for interpreters)
/// its command line (NUL-separated, as in `/proc/PID/cmdline`).
pub fn is_launcher(comm: &str, cmdline: Option<&[u8]>) -> bool {
    if LAUNCHERS.contains(&comm) {
        return true;
    }
    let interpreter = comm.starts_with("python") || comm == "uv";
    match cmdline {
        Some(cmd) if interpreter => cmd
            .split(|&b| b == 0)
            .skip(1)
            .take(4)
            .filter_map(|a| std::str::from_utf8(a).ok())
            .any(|a| {
                let base = a.rsplit('/').next().unwrap_or(a);
                PYTHON_LAUNCHER_ARGS.contains(&base)
            }),
        _ => false,
    }
}

/// Where the tree hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeRoot {
    /// Every descendant of this process (oomguard itself, a child
    /// subreaper): the job, its orphans and anything that left its session.
    ChildrenOf(u32),
    /// This process and its descendants (`attach`).
    Process(u32),
    /// Exactly the given members as a forest, with their descendants
    /// (`attach` to a job alone in its cgroup: the members are the job,
    /// orphans included). Without a member list the tree is empty, never
    /// the whole machine.
    Members,
}

/// One process found by a scan.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub stat: StatLine,
    pub role: Role,
    pub rss_bytes: u64,
}

impl From<Found> for ProcSample {
    /// A process as one tick reports it; PSS, USS and swap are filled in by
    /// [`crate::engine::probe::pss::PssSweeper::apply`], GPU memory by the GPU probe.
    fn from(f: Found) -> Self {
        ProcSample {
            pid: f.stat.pid,
            ppid: f.stat.ppid,
            role: f.role,
            comm: f.stat.comm,
            rss_bytes: f.rss_bytes,
            pss_bytes: 0,
            uss_bytes: 0,
            swap_bytes: 0,
            rss_peak_bytes: None,
            gpu_bytes: None,
            read_age_seconds: None,
            torch: None,
            start_time: f.stat.start_time,
            stopped: f.stat.state == 'T',
        }
    }
}

#[derive(Debug, Clone)]
struct Known {
    start_time: u64,
    comm: String,
    launcher: bool,
    role: Role,
    seen: bool,
}

/// Finds the tree each tick and remembers roles across ticks, so a worker
/// orphaned to oomguard is still known as a worker.
#[derive(Debug)]
pub struct TreeScanner {
    proc_root: PathBuf,
    root: TreeRoot,
    page_size: u64,
    /// The job's main process (its role is computed, not remembered).
    job_pid: Option<u32>,
    /// oomguard's own helpers (hooks): never part of the tree.
    excluded: HashSet<u32>,
    /// Processes that were oomguard's children before it started the job
    /// (a shell's `sidecar & exec oomguard ...`, the reader of
    /// `> >(tee log)`), and what they forked, by identity: they share
    /// oomguard's parentage, not the job's, and are never measured or
    /// signalled.
    strangers: HashSet<(u32, u64)>,
    known: HashMap<u32, Known>,
    buf: String,
    /// Top-level processes beyond the root's children for the next walk
    /// (members of the owned cgroup that are not descendants).
    extra_roots: Vec<u32>,
    /// The last walk of the children lists: the machine's newest pid then,
    /// where it started, and the pids it found (see [`Self::walk_children`]).
    last_walk: Option<LastWalk>,
    /// Each tree process's `stat`, kept open and read again from offset 0:
    /// the path lookup, open and close were half of each read. A file
    /// kept open follows its process, not its pid: once the process is
    /// gone it reads nothing and the pid's path is opened again.
    stat_files: HashMap<u32, fs::File>,
}

/// At most this many `stat` files are kept open (a larger tree opens the
/// rest each time).
const STAT_FILES_MAX: usize = 256;

#[derive(Debug)]
struct LastWalk {
    newest_pid: u32,
    starts: Vec<(u32, bool)>,
    found: Vec<u32>,
    reused: u32,
}

/// A walk the newest pid says is unneeded is still taken after this many
/// reuses: pids wrap around (`pid_max` can be as low as 301).
const WALK_REUSE_MAX: u32 = 15;

impl TreeScanner {
    pub fn new(proc_root: impl Into<PathBuf>, root: TreeRoot) -> Self {
        Self {
            proc_root: proc_root.into(),
            root,
            page_size: page_size(),
            job_pid: None,
            excluded: HashSet::new(),
            strangers: HashSet::new(),
            known: HashMap::new(),
            buf: String::with_capacity(512),
            extra_roots: Vec::new(),
            last_walk: None,
            stat_files: HashMap::new(),
        }
    }

    /// Sets the job's main process (a new attempt has a new one).
    pub fn set_job(&mut self, pid: Option<u32>) {
        self.job_pid = pid;
    }

    /// Marks a process of oomguard's own (a hook) as not part of the tree.
    pub fn exclude(&mut self, pid: u32) {
        self.excluded.insert(pid);
    }

    /// Leaves these processes (pid, start time) and their descendants out
    /// of the tree for good (see [`inherited_children`]).
    pub fn set_strangers(&mut self, strangers: &[(u32, u64)]) {
        self.strangers = strangers.iter().copied().collect();
    }

    /// Forgets an exclusion once the helper is reaped.
    pub fn include(&mut self, pid: u32) {
        self.excluded.remove(&pid);
    }

    /// A /proc walk that finds the root's descendants together with
    /// `members` (the owned cgroup's pids): a process that moved itself out
    /// of the cgroup is still a descendant, and one that was put into the
    /// cgroup from outside is still a member.
    pub fn scan_descendants_and(&mut self, members: &[u32]) -> Vec<Found> {
        self.extra_roots = members.to_vec();
        self.scan(None)
    }

    /// Scans the tree. `members`, when given (the cgroup oomguard owns), is
    /// the authoritative list of the job's pids and spares a full /proc walk;
    /// descendants of them are still found through ppid.
    pub fn scan(&mut self, members: Option<&[u32]>) -> Vec<Found> {
        let mut stats: HashMap<u32, StatLine> = HashMap::new();
        match members {
            Some(pids) => {
                for &pid in pids {
                    if let Some(st) = self.read_stat(pid) {
                        stats.insert(pid, st);
                    }
                }
            }
            None if self.walk_children(&mut stats) => {
                // Members of the owned cgroup that are not descendants
                // (put there from outside) are the job's too.
                for pid in self.extra_roots.clone() {
                    if !stats.contains_key(&pid)
                        && let Some(st) = self.read_stat(pid)
                    {
                        stats.insert(pid, st);
                    }
                }
            }
            None => {
                let Ok(dir) = fs::read_dir(&self.proc_root) else {
                    return Vec::new();
                };
                for entry in dir.flatten() {
                    let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                        continue;
                    };
                    if let Some(st) = self.read_stat(pid) {
                        stats.insert(pid, st);
                    }
                }
            }
        }
        self.build(stats, members.is_some())
    }

    /// Re-reads only processes already known to be in the tree, by identity:
    /// a pid whose start time changed is another process that reused it and
    /// is dropped, never adopted (it would otherwise join the tree as a
    /// top-level member, be throttled, paused or killed).
    pub fn rescan(&mut self, known: &[(u32, u64)]) -> Vec<Found> {
        self.rescan_and(known, &[])
    }

    /// `rescan`, plus `members` not known yet: the owned cgroup's pids are
    /// the job's by construction, so a worker forked since the last full
    /// scan is seen (and frozen by a last-resort pause) at once.
    pub fn rescan_and(&mut self, known: &[(u32, u64)], members: &[u32]) -> Vec<Found> {
        let mut stats: HashMap<u32, StatLine> = HashMap::new();
        for &(pid, start_time) in known {
            if let Some(st) = self.read_stat(pid)
                && st.start_time == start_time
            {
                stats.insert(pid, st);
            }
        }
        for &pid in members {
            if !stats.contains_key(&pid)
                && !known.iter().any(|k| k.0 == pid)
                && let Some(st) = self.read_stat(pid)
            {
                stats.insert(pid, st);
            }
        }
        self.build(stats, true)
    }

    /// Walks the tree over the stat lines read: from the root, or with
    /// `members` from every member whose parent is not one.
    fn build(&mut self, mut stats: HashMap<u32, StatLine>, members: bool) -> Vec<Found> {
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for st in stats.values() {
            children.entry(st.ppid).or_default().push(st.pid);
        }
        for list in children.values_mut() {
            list.sort_unstable();
        }

        // Top-level processes and the role their parent gives them.
        let mut stack: Vec<(u32, Option<Role>)> = Vec::new();
        match (self.root, members) {
            (TreeRoot::Process(pid), _) => stack.push((pid, None)),
            (TreeRoot::ChildrenOf(parent), true) => {
                // Members whose parent is not a member are top-level.
                for st in stats.values() {
                    if st.ppid == parent || !stats.contains_key(&st.ppid) {
                        stack.push((st.pid, None));
                    }
                }
            }
            (TreeRoot::Members, true) => {
                for st in stats.values() {
                    if !stats.contains_key(&st.ppid) {
                        stack.push((st.pid, None));
                    }
                }
            }
            (TreeRoot::Members, false) => {
                // A full walk for a member list (`scan_descendants_and`):
                // members whose parent is not a member are top-level, the
                // rest are reached through their parent (with its role).
                // Without a member list the tree stays empty.
                let members: HashSet<u32> =
                    std::mem::take(&mut self.extra_roots).into_iter().collect();
                for &pid in &members {
                    if stats
                        .get(&pid)
                        .is_some_and(|st| !members.contains(&st.ppid))
                    {
                        stack.push((pid, None));
                    }
                }
            }
            (TreeRoot::ChildrenOf(parent), false) => {
                // Pushed first, so popped last: a member that is also a
                // descendant is reached through its parent (with its role).
                for pid in std::mem::take(&mut self.extra_roots) {
                    stack.push((pid, None));
                }
                for &pid in children.get(&parent).map(Vec::as_slice).unwrap_or(&[]) {
                    stack.push((pid, None));
                }
            }
        }

        self.drop_strangers(&mut stats, &children, !members);
        for k in self.known.values_mut() {
            k.seen = false;
        }
        let mut out = Vec::with_capacity(stats.len().min(4096));
        let mut visited = HashSet::new();
        while let Some((pid, parent_role)) = stack.pop() {
            if self.excluded.contains(&pid) || !visited.insert(pid) {
                continue;
            }
            let Some(st) = stats.remove(&pid) else {
                continue;
            };
            let launcher = self.launcher(&st);
            let remembered = self
                .known
                .get(&pid)
                .filter(|k| k.start_time == st.start_time)
                .map(|k| k.role);
            let role = match parent_role {
                Some(Role::Launcher) | None if launcher => Role::Launcher,
                Some(Role::Launcher) => Role::Trainer,
                Some(Role::Trainer | Role::Worker) => Role::Worker,
                Some(Role::Other) => Role::Other,
                None if Some(pid) == self.job_pid => Role::Trainer,
                // An orphan re-parented to oomguard keeps the role it had.
                None => match remembered {
                    Some(Role::Launcher) | None => Role::Other,
                    Some(r) => r,
                },
            };
            if let Some(k) = self.known.get_mut(&pid) {
                k.role = role;
                k.seen = true;
            }
            for &child in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
                stack.push((child, Some(role)));
            }
            out.push(Found {
                rss_bytes: st.rss_pages * self.page_size,
                stat: st,
                role,
            });
        }
        self.known.retain(|_, k| k.seen);
        let kept: HashSet<u32> = out.iter().map(|f| f.stat.pid).collect();
        self.stat_files.retain(|pid, _| kept.contains(pid));
        out.sort_by_key(|f| f.stat.pid);
        out
    }

    /// Takes the strangers still alive, and everything they forked, out of
    /// `stats`; what they forked becomes a stranger too, so it stays out
    /// when it is orphaned to oomguard (a subreaper) later. After a walk of
    /// the whole tree (`whole_walk`), a stranger not seen is gone and is
    /// forgotten (its pid is free for the job to reuse); a partial read
    /// (the fast rescan, a cgroup's member list) forgets nothing.
    fn drop_strangers(
        &mut self,
        stats: &mut HashMap<u32, StatLine>,
        children: &HashMap<u32, Vec<u32>>,
        whole_walk: bool,
    ) {
        if self.strangers.is_empty() {
            return;
        }
        let mut seen = HashSet::new();
        let mut stack: Vec<u32> = stats
            .values()
            .filter(|st| self.strangers.contains(&(st.pid, st.start_time)))
            .map(|st| st.pid)
            .collect();
        while let Some(pid) = stack.pop() {
            let Some(st) = stats.remove(&pid) else {
                continue;
            };
            seen.insert((pid, st.start_time));
            stack.extend(children.get(&pid).map(Vec::as_slice).unwrap_or(&[]));
        }
        if whole_walk {
            self.strangers = seen;
        } else {
            self.strangers.extend(seen);
        }
    }

    /// Finds the tree through the kernel's per-thread `children` lists,
    /// from the root down: the cost follows the tree, not every process on
    /// the machine. False (nothing read) where the kernel has no such lists
    /// (CONFIG_PROC_CHILDREN), and the caller walks all of /proc.
    ///
    /// Most of a walk's cost is the children lists (a directory and a file
    /// per process), and they can only name a process the tree has not
    /// seen if a pid was handed out since: while the newest pid on the
    /// machine (`/proc/loadavg`) stays the same, the last walk's processes
    /// are re-read instead (those that exited drop out; one reparented
    /// away leaves the tree through its ppid in [`Self::build`]).
    fn walk_children(&mut self, stats: &mut HashMap<u32, StatLine>) -> bool {
        // Where the walk starts, and whether the start is in the tree.
        let starts: Vec<(u32, bool)> = match self.root {
            TreeRoot::ChildrenOf(p) => vec![(p, false)],
            TreeRoot::Process(p) => vec![(p, true)],
            // A job known by its members: each member and what it forked.
            TreeRoot::Members => self.extra_roots.iter().map(|&p| (p, true)).collect(),
        };
        let newest = self.newest_pid();
        let reuse = self.last_walk.as_ref().is_some_and(|last| {
            newest == Some(last.newest_pid) && last.starts == starts && last.reused < WALK_REUSE_MAX
        });
        if reuse && let Some(mut last) = self.last_walk.take() {
            last.reused += 1;
            for &pid in &last.found {
                if let Some(st) = self.read_stat(pid) {
                    stats.insert(pid, st);
                }
            }
            self.last_walk = Some(last);
            return true;
        }
        let mut queue = Vec::new();
        for (i, &(start, include)) in starts.iter().enumerate() {
            if !self.children_of(start, &mut queue) && i == 0 {
                return false;
            }
            if include && let Some(st) = self.read_stat(start) {
                stats.insert(start, st);
            }
        }
        while let Some(pid) = queue.pop() {
            if stats.contains_key(&pid) || starts.iter().any(|&(s, inc)| s == pid && !inc) {
                continue;
            }
            if let Some(st) = self.read_stat(pid) {
                stats.insert(pid, st);
                self.children_of(pid, &mut queue);
            }
        }
        self.last_walk = newest.map(|newest_pid| LastWalk {
            newest_pid,
            starts,
            found: stats.keys().copied().collect(),
            reused: 0,
        });
        true
    }

    /// The pid handed out last in this pid namespace (the last field of
    /// `/proc/loadavg`); None where it cannot be read.
    fn newest_pid(&mut self) -> Option<u32> {
        read_small(&self.proc_root.join("loadavg"), &mut self.buf).ok()?;
        self.buf.split_ascii_whitespace().nth(4)?.parse().ok()
    }

    /// Appends the children of every thread of `pid`; false when the first
    /// thread's list cannot be read.
    fn children_of(&mut self, pid: u32, out: &mut Vec<u32>) -> bool {
        let Ok(tasks) = fs::read_dir(self.proc_root.join(pid.to_string()).join("task")) else {
            return false;
        };
        let mut any = false;
        for task in tasks.flatten() {
            if read_small(&task.path().join("children"), &mut self.buf).is_ok() {
                any = true;
                out.extend(
                    self.buf
                        .split_ascii_whitespace()
                        .filter_map(|s| s.parse::<u32>().ok()),
                );
            }
        }
        any
    }

    fn read_stat(&mut self, pid: u32) -> Option<StatLine> {
        if let Some(f) = self.stat_files.get(&pid) {
            if reread(f, &mut self.buf).is_ok()
                && let Some(st) = parse_stat(&self.buf)
            {
                return Some(st);
            }
            self.stat_files.remove(&pid);
        }
        let path = self.proc_root.join(pid.to_string()).join("stat");
        let f = fs::File::open(path).ok()?;
        reread(&f, &mut self.buf).ok()?;
        let st = parse_stat(&self.buf)?;
        if self.stat_files.len() < STAT_FILES_MAX {
            self.stat_files.insert(pid, f);
        }
        Some(st)
    }

    fn launcher(&mut self, st: &StatLine) -> bool {
        if let Some(k) = self.known.get(&st.pid)
            && k.start_time == st.start_time
            && k.comm == st.comm
        {
            return k.launcher;
        }
        let cmdline = if st.comm.starts_with("python") || st.comm == "uv" {
            fs::read(self.proc_root.join(st.pid.to_string()).join("cmdline")).ok()
        } else {
            None
        };
        let launcher = is_launcher(&st.comm, cmdline.as_deref());
        let role = self
            .known
            .get(&st.pid)
            .filter(|k| k.start_time == st.start_time)
            .map_or(Role::Other, |k| k.role);
        self.known.insert(
            st.pid,
            Known {
                start_time: st.start_time,
                comm: st.comm.clone(),
                launcher,
                role,
                seen: true,
            },
        );
        launcher
    }
}

/// Reads a small /proc file into `buf` with plain reads: `read_to_string`
/// first asks the file's size (a `statx` and an `lseek` per file, which
/// /proc answers with 0 anyway), and the tree scan reads a few files per
/// process every tick. Bytes that are not UTF-8 (a `comm` can hold any)
/// are replaced, not a reason to lose the process.
fn read_small(path: &Path, buf: &mut String) -> std::io::Result<()> {
    reread(&fs::File::open(path)?, buf)
}

/// Reads an open /proc file from its start into `buf` (see
/// [`read_small`]); a file whose process is gone reads as empty, an error.
fn reread(f: &fs::File, buf: &mut String) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    // The String's allocation is reused from one file to the next.
    let mut bytes = std::mem::take(buf).into_bytes();
    bytes.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = f.read_at(&mut chunk, bytes.len() as u64)?;
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    *buf = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    Ok(())
}

/// oomguard's own children and their descendants, by (pid, start time),
/// read before it starts anything: whatever is there was forked by the
/// process that became oomguard (`sleep 30 & exec oomguard run ...`, or
/// bash's process substitution), not by the job.
pub fn inherited_children(proc_root: &Path) -> Vec<(u32, u64)> {
    let mut scanner = TreeScanner::new(proc_root, TreeRoot::ChildrenOf(std::process::id()));
    let mut stats = HashMap::new();
    if !scanner.walk_children(&mut stats) {
        return Vec::new();
    }
    stats.values().map(|st| (st.pid, st.start_time)).collect()
}

/// The system page size (for `stat`'s RSS in pages).
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// Sums a tick's processes.
pub fn totals(procs: &[ProcSample]) -> TreeTotals {
    let mut t = TreeTotals {
        procs: procs.len() as u32,
        ..Default::default()
    };
    for p in procs {
        t.rss_bytes += p.rss_bytes;
        t.pss_bytes += p.pss_bytes;
        t.uss_bytes += p.uss_bytes;
        t.swap_bytes += p.swap_bytes;
    }
    t.footprint_bytes = t.pss_bytes;
    t
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_zombies_exit_status_is_read_from_field_52_and_a_live_process_has_none() {
        // 52 fields; a zombie killed by SIGKILL (status 9), then one that
        // exited with 3 (status 3 << 8), then the same line while alive.
        let line = |state: &str, status: i32| {
            let mut f: Vec<String> = vec!["4242".into(), "(python3 (x))".into(), state.into()];
            f.extend((4..52).map(|_| "0".to_string()));
            f.push(status.to_string());
            f.join(" ")
        };
        let killed = zombie_status(&line("Z", 9)).unwrap();
        assert!(matches!(
            Ended::from_wait_status(killed),
            Ended::Signaled(9)
        ));
        let exited = zombie_status(&line("Z", 3 << 8)).unwrap();
        assert!(matches!(Ended::from_wait_status(exited), Ended::Exited(3)));
        assert_eq!(zombie_status(&line("S", 0)), None);
        assert_eq!(zombie_status("4242 (x) Z 1 2"), None);
    }

    use super::*;
    use std::path::Path;

    const STAT: &str = "4242 (python3 (x) y) S 4200 4200 4100 34816 4242 4194304 3014 0 0 0 \
        12 3 0 0 20 0 5 0 987654 1234567890 25600 18446744073709551615 1 1 0 0 0 0 0 \
        16781312 2 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn stat_with_parens_and_spaces_in_comm() {
        let s = parse_stat(STAT).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.comm, "python3 (x) y");
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 4200);
        assert_eq!(s.pgrp, 4200);
        assert_eq!(s.session, 4100);
        assert_eq!(s.start_time, 987654);
        assert_eq!(s.rss_pages, 25600);
    }

    #[test]
    fn stat_garbage_is_none() {
        for bad in ["", "1 (x", "x) (", "12 (a) S", "12 (a) S 1 2 3"] {
            assert_eq!(parse_stat(bad), None, "{bad}");
        }
    }

    #[test]
    fn rollup() {
        let text = "55d5-7ffe ---p 00000000 00:00 0    [rollup]\n\
            Rss:              524800 kB\nPss:              105000 kB\nPss_Anon: 1 kB\n\
            Shared_Clean:       1000 kB\nShared_Dirty:     520000 kB\n\
            Private_Clean:       300 kB\nPrivate_Dirty:      3500 kB\n\
            Swap:                 64 kB\nSwapPss:              16 kB\nLocked: 0 kB\n";
        let r = parse_smaps_rollup(text).unwrap();
        assert_eq!(r.rss, 524800 * 1024);
        assert_eq!(r.pss, 105000 * 1024);
        assert_eq!(r.uss, 3800 * 1024);
        assert_eq!(r.swap, 16 * 1024);
        let no_swappss = "Rss: 10 kB\nPss: 5 kB\nSwap: 8 kB\n";
        assert_eq!(parse_smaps_rollup(no_swappss).unwrap().swap, 8 * 1024);
        assert_eq!(parse_smaps_rollup(""), None);
        assert_eq!(parse_smaps_rollup("Rss: lots\n"), None);
    }

    #[test]
    fn launchers() {
        assert!(is_launcher("bash", None));
        assert!(is_launcher("torchrun", None));
        assert!(!is_launcher("python3", Some(b"python3\0train.py\0")));
        assert!(is_launcher(
            "python3",
            Some(b"python3\0-m\0torch.distributed.run\0--nproc_per_node=2\0train.py\0")
        ));
        assert!(is_launcher(
            "python",
            Some(b"python\0/usr/bin/torchrun\0train.py\0")
        ));
        assert!(!is_launcher("pt_data_worker", None));
    }

    /// Builds a fake /proc with (pid, ppid, comm, rss_pages, cmdline).
    fn fake_proc(dir: &Path, procs: &[(u32, u32, &str, u64, &str)]) {
        for &(pid, ppid, comm, rss, cmd) in procs {
            let d = dir.join(pid.to_string());
            fs::create_dir_all(&d).unwrap();
            let stat = format!(
                "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {} 1000 {rss} 0\n",
                1000 + pid
            );
            fs::write(d.join("stat"), stat).unwrap();
            fs::write(d.join("cmdline"), cmd.replace(' ', "\0")).unwrap();
        }
    }

    /// `fake_proc` plus each process's `task/PID/children` (the kernel's
    /// lists the walk follows) and the newest pid in `loadavg`.
    fn fake_walkable(dir: &Path, procs: &[(u32, u32, &str, u64, &str)], newest: u32) {
        fake_proc(dir, procs);
        let mut all: Vec<u32> = procs.iter().map(|p| p.0).collect();
        all.push(100);
        for pid in all {
            let kids: Vec<String> = procs
                .iter()
                .filter(|p| p.1 == pid)
                .map(|p| p.0.to_string())
                .collect();
            let task = dir.join(format!("{pid}/task/{pid}"));
            fs::create_dir_all(&task).unwrap();
            fs::write(task.join("children"), kids.join(" ")).unwrap();
        }
        fs::write(
            dir.join("loadavg"),
            format!("0.00 0.00 0.00 1/99 {newest}\n"),
        )
        .unwrap();
    }

    #[test]
    fn the_children_lists_are_walked_again_only_after_a_new_pid() {
        let dir = tempfile::tempdir().unwrap();
        let pids = |found: &[Found]| found.iter().map(|f| f.stat.pid).collect::<Vec<_>>();
        let job = [
            (101, 100, "python3", 100, "python3 train.py"),
            (102, 101, "python3", 100, "python3 train.py"),
        ];
        fake_walkable(dir.path(), &job, 102);
        let mut sc = TreeScanner::new(dir.path(), TreeRoot::ChildrenOf(100));
        sc.set_job(Some(101));
        assert_eq!(pids(&sc.scan(None)), [101, 102]);
        // Lists that name a process no pid was handed out for (only a test
        // can make them) are not read: the last walk's processes are.
        let more = [
            job[0],
            job[1],
            (103, 101, "python3", 100, "python3 train.py"),
        ];
        fake_walkable(dir.path(), &more, 102);
        assert_eq!(pids(&sc.scan(None)), [101, 102]);
        // A process that exited drops out without a walk (its `stat`, kept
        // open, reads as nothing from then on, as /proc's does).
        fs::write(dir.path().join("102/stat"), "").unwrap();
        fs::remove_dir_all(dir.path().join("102")).unwrap();
        assert_eq!(pids(&sc.scan(None)), [101]);
        // A new pid: the lists are walked and the newcomer found.
        fake_walkable(dir.path(), &more, 103);
        assert_eq!(pids(&sc.scan(None)), [101, 102, 103]);
        // Without a newest pid (no loadavg) every scan walks.
        fs::remove_file(dir.path().join("loadavg")).unwrap();
        let more = [more[0], more[1], more[2], (104, 103, "sh", 1, "sh")];
        fake_walkable(dir.path(), &more, 103);
        fs::remove_file(dir.path().join("loadavg")).unwrap();
        assert_eq!(pids(&sc.scan(None)), [101, 102, 103, 104]);
    }

    #[test]
    fn an_unchanged_newest_pid_still_walks_every_sixteenth_scan() {
        // Pids wrap around: after a full cycle the newest pid can read the
        // same while new processes exist.
        let dir = tempfile::tempdir().unwrap();
        let job = [(101, 100, "python3", 100, "python3 train.py")];
        fake_walkable(dir.path(), &job, 101);
        let mut sc = TreeScanner::new(dir.path(), TreeRoot::ChildrenOf(100));
        sc.set_job(Some(101));
        assert_eq!(sc.scan(None).len(), 1);
        let more = [job[0], (102, 101, "python3", 100, "python3 train.py")];
        fake_walkable(dir.path(), &more, 101);
        let counts: Vec<usize> = (0..WALK_REUSE_MAX + 1)
            .map(|_| sc.scan(None).len())
            .collect();
        assert_eq!(
            counts[..WALK_REUSE_MAX as usize],
            [1; WALK_REUSE_MAX as usize]
        );
        assert_eq!(counts[WALK_REUSE_MAX as usize], 2);
    }

    #[test]
    fn a_stat_file_kept_open_reads_the_process_as_it_is_now() {
        let f = fs::File::open("/proc/self/stat").unwrap();
        let mut buf = String::new();
        reread(&f, &mut buf).unwrap();
        let before = parse_stat(&buf).unwrap().rss_pages;
        let grown = vec![1u8; 64 << 20];
        reread(&f, &mut buf).unwrap();
        let after = parse_stat(&buf).unwrap().rss_pages;
        assert!(
            (after - before) * page_size() >= 60 << 20,
            "{before} -> {after} pages"
        );
        drop(grown);
    }

    #[test]
    fn roles_through_launchers_and_orphans() {
        let dir = tempfile::tempdir().unwrap();
        // 100 = oomguard; 101 bash -> 102 env -> 103 python (trainer) -> 104,105
        // workers -> 106 (worker's child); 107 is an orphan re-parented to
        // oomguard; 108 is a hook; 1 is unrelated.
        fake_proc(
            dir.path(),
            &[
                (1, 0, "init", 10, "init"),
                (101, 100, "bash", 10, "bash train.sh"),
                (102, 101, "env", 10, "env X=1 python3 train.py"),
                (103, 102, "python3", 1000, "python3 train.py"),
                (104, 103, "python3", 900, "python3 train.py"),
                (105, 103, "pt_data_worker", 900, "python3 train.py"),
                (106, 104, "sh", 5, "sh -c x"),
                (107, 100, "python3", 50, "python3 orphan.py"),
                (108, 100, "sh", 5, "sh hook.sh"),
                (109, 108, "notify", 5, "notify"),
            ],
        );
        let mut sc = TreeScanner::new(dir.path(), TreeRoot::ChildrenOf(100));
        sc.set_job(Some(101));
        sc.exclude(108);
        let found = sc.scan(None);
        let roles: Vec<(u32, Role)> = found.iter().map(|f| (f.stat.pid, f.role)).collect();
        assert_eq!(
            roles,
            vec![
                (101, Role::Launcher),
                (102, Role::Launcher),
                (103, Role::Trainer),
                (104, Role::Worker),
                (105, Role::Worker),
                (106, Role::Worker),
                (107, Role::Other),
            ]
        );
        assert_eq!(found[2].rss_bytes, 1000 * page_size());

        // Worker 104 is orphaned to oomguard: it stays a worker.
        fake_proc(
            dir.path(),
            &[(104, 100, "python3", 900, "python3 train.py")],
        );
        let found = sc.scan(None);
        let w = found.iter().find(|f| f.stat.pid == 104).unwrap();
        assert_eq!(w.role, Role::Worker);

        // Vanished processes disappear without error.
        fs::remove_dir_all(dir.path().join("105")).unwrap();
        assert!(sc.scan(None).iter().all(|f| f.stat.pid != 105));
    }

    #[test]
    fn job_that_is_not_a_launcher_is_the_trainer() {
        let dir = tempfile::tempdir().unwrap();
        fake_proc(
            dir.path(),
            &[
                (201, 200, "python3", 10, "python3 train.py"),
                (202, 201, "python3", 10, "python3 train.py"),
            ],
        );
        let mut sc = TreeScanner::new(dir.path(), TreeRoot::ChildrenOf(200));
        sc.set_job(Some(201));
        let roles: Vec<Role> = sc.scan(None).iter().map(|f| f.role).collect();
        assert_eq!(roles, vec![Role::Trainer, Role::Worker]);
        // With a member list (owned cgroup) the same tree is found.
        let roles: Vec<Role> = sc.scan(Some(&[202, 201])).iter().map(|f| f.role).collect();
        assert_eq!(roles, vec![Role::Trainer, Role::Worker]);
    }

    #[test]
    fn rescan_never_adopts_a_recycled_pid() {
        let dir = tempfile::tempdir().unwrap();
        fake_proc(
            dir.path(),
            &[
                (401, 400, "python3", 10, "python3 train.py"),
                (402, 401, "python3", 10, "python3 train.py"),
                (403, 401, "python3", 10, "python3 train.py"),
            ],
        );
        let mut sc = TreeScanner::new(dir.path(), TreeRoot::ChildrenOf(400));
        sc.set_job(Some(401));
        let known: Vec<(u32, u64)> = sc
            .scan(None)
            .iter()
            .map(|f| (f.stat.pid, f.stat.start_time))
            .collect();
        assert_eq!(known.len(), 3);
        // Worker 403 died and an unrelated process (parent 1, a later start
        // time) took its pid before the next quick scan.
        fs::write(
            dir.path().join("403").join("stat"),
            "403 (sleep) S 1 403 403 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99999 1000 7 0\n",
        )
        .unwrap();
        let pids: Vec<u32> = sc.rescan(&known).iter().map(|f| f.stat.pid).collect();
        assert_eq!(pids, vec![401, 402]);
    }

    #[test]
    fn attach_root_is_included() {
        let dir = tempfile::tempdir().unwrap();
        fake_proc(
            dir.path(),
            &[
                (301, 1, "python3", 10, "python3 t.py"),
                (302, 301, "python3", 10, "python3 t.py"),
            ],
        );
        let mut sc = TreeScanner::new(dir.path(), TreeRoot::Process(301));
        sc.set_job(Some(301));
        let roles: Vec<(u32, Role)> = sc.scan(None).iter().map(|f| (f.stat.pid, f.role)).collect();
        assert_eq!(roles, vec![(301, Role::Trainer), (302, Role::Worker)]);
    }

    /// `attach` to a job alone in its cgroup: a full scan with the member
    /// list (`scan_descendants_and`) finds the members as a forest (an
    /// orphan member included, a member's child that left the cgroup too)
    /// and nothing else on the machine.
    #[test]
    fn attach_members_full_scan_finds_the_members() {
        let dir = tempfile::tempdir().unwrap();
        fake_proc(
            dir.path(),
            &[
                (1, 0, "init", 10, "init"),
                (400, 1, "sshd", 10, "sshd"),
                (401, 1, "python3", 10, "python3 t.py"),
                (402, 401, "python3", 10, "python3 t.py"),
                (403, 1, "python3", 10, "python3 orphan.py"),
                (404, 402, "sh", 10, "sh -c moved-out"),
            ],
        );
        let mut sc = TreeScanner::new(dir.path(), TreeRoot::Members);
        sc.set_job(Some(401));
        let roles: Vec<(u32, Role)> = sc
            .scan_descendants_and(&[401, 402, 403])
            .iter()
            .map(|f| (f.stat.pid, f.role))
            .collect();
        assert_eq!(
            roles,
            vec![
                (401, Role::Trainer),
                (402, Role::Worker),
                (403, Role::Other),
                (404, Role::Worker),
            ]
        );
        // No member list: an empty tree, never the whole machine.
        assert!(sc.scan_descendants_and(&[]).is_empty());
    }

    #[test]
    fn totals_sum() {
        let p = |pss| ProcSample {
            pid: 1,
            ppid: 0,
            role: Role::Worker,
            comm: "x".into(),
            rss_bytes: 100,
            pss_bytes: pss,
            uss_bytes: 5,
            swap_bytes: 1,
            rss_peak_bytes: None,
            gpu_bytes: None,
            read_age_seconds: None,
            torch: None,
            start_time: 0,
            stopped: false,
        };
        let t = totals(&[p(20), p(30)]);
        assert_eq!(
            (t.procs, t.rss_bytes, t.pss_bytes, t.uss_bytes, t.swap_bytes),
            (2, 200, 50, 10, 2)
        );
        assert_eq!(t.footprint_bytes, 50);
    }
}
