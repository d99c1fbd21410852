//! The job's memory cgroup: finding it (v1, v2 and hybrid layouts), reading
//! its usage, the effective limit (the tightest of the cgroup and its
//! ancestors) and its OOM-kill counter, and creating a child cgroup of
//! oomguard's own for the job where that is permitted.
//!
//! Paths come from `/proc/PID/cgroup` and the mount table, so the readers
//! work under any root; parsers take text. Files that are missing (the root
//! cgroup has no `memory.current`, v2 without the memory controller has no
//! memory files at all) give `None`, never an error.
//! See Documentation/admin-guide/cgroup-v1/memory.rst and cgroup-v2.rst.

use std::ffi::CString;
use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use procfs::FromBufRead;

use crate::vocab::model::CgroupSample;

/// v1 prints "unlimited" as PAGE_COUNTER_MAX in bytes (9223372036854771712
/// with 4 KiB pages); anything this large is no limit.
const UNLIMITED: u64 = 1 << 62;

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn number(self) -> u8 {
        match self {
            Version::V1 => 1,
            Version::V2 => 2,
        }
    }
}

/// A memory cgroup on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub version: Version,
    /// Where the hierarchy is mounted.
    pub mount_point: PathBuf,
    /// The cgroup's path inside the hierarchy, as `/proc/PID/cgroup` has it.
    pub path: String,
}

impl Location {
    /// The cgroup's directory.
    pub fn dir(&self) -> PathBuf {
        join_cgroup(&self.mount_point, &self.path)
    }

    /// The directories from this cgroup up to the hierarchy root.
    fn chain(&self) -> Vec<(String, PathBuf)> {
        let mut out = Vec::new();
        let mut path = self.path.trim_end_matches('/').to_string();
        loop {
            let shown = if path.is_empty() {
                "/".to_string()
            } else {
                path.clone()
            };
            out.push((shown, join_cgroup(&self.mount_point, &path)));
            match path.rfind('/') {
                Some(i) if !path.is_empty() => path.truncate(i),
                _ => break,
            }
        }
        out
    }

    pub fn child(&self, name: &str) -> Location {
        let base = self.path.trim_end_matches('/');
        Location {
            path: format!("{base}/{name}"),
            ..self.clone()
        }
    }
}

fn join_cgroup(mount: &Path, path: &str) -> PathBuf {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    }
}

/// Finds the memory cgroup of a process from its `/proc/PID/cgroup` and the
/// mount table (`/proc/self/mountinfo`). A v1 memory hierarchy wins over v2
/// (hybrid layouts mount v2 without the memory controller).
pub fn resolve(mountinfo: &str, proc_cgroup: &str) -> Option<Location> {
    let mounts = procfs::process::MountInfos::from_buf_read(mountinfo.as_bytes()).ok()?;
    let mut v2_path = None;
    let mut v1_path = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            v2_path = Some(path.to_string());
        } else if ctrls.split(',').any(|c| c == "memory") {
            v1_path = Some(path.to_string());
        }
    }
    if let Some(path) = v1_path {
        let m = mounts
            .iter()
            .find(|m| m.fs_type == "cgroup" && m.super_options.contains_key("memory"))?;
        return Some(Location {
            version: Version::V1,
            mount_point: m.mount_point.clone(),
            path: strip_mount_root(&path, &m.root),
        });
    }
    let path = v2_path?;
    let m = mounts.iter().find(|m| m.fs_type == "cgroup2")?;
    Some(Location {
        version: Version::V2,
        mount_point: m.mount_point.clone(),
        path: strip_mount_root(&path, &m.root),
    })
}

/// Inside a container the hierarchy may be mounted from a subdirectory
/// (mountinfo root `/docker/abc`) while `/proc/PID/cgroup` shows the full
/// path; the part below the mount root is what exists on disk.
fn strip_mount_root(path: &str, root: &str) -> String {
    if root == "/" || root.is_empty() {
        return path.to_string();
    }
    match path.strip_prefix(root) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            if rest.is_empty() {
                "/".into()
            } else {
                rest.into()
            }
        }
        _ => path.to_string(),
    }
}

/// Parses a limit file: a byte count, `max` (v2) or the v1 huge value.
pub fn parse_limit(text: &str) -> Option<Option<u64>> {
    let t = text.trim();
    if t == "max" {
        return Some(None);
    }
    let v: u64 = t.parse().ok()?;
    Some((v < UNLIMITED).then_some(v))
}

/// Looks up `key value` in flat keyed files (`memory.stat`,
/// `memory.events`, `memory.oom_control`).
pub fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_ascii_whitespace();
        (it.next()? == key).then(|| it.next()?.parse().ok())?
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn names(v: Version) -> (&'static str, &'static str, &'static str) {
    match v {
        Version::V1 => (
            "memory.usage_in_bytes",
            "memory.limit_in_bytes",
            "total_inactive_file",
        ),
        Version::V2 => ("memory.current", "memory.max", "inactive_file"),
    }
}

/// Reads the job's cgroup each tick.
#[derive(Debug, Clone)]
pub struct CgroupReader {
    loc: Location,
    owned: bool,
}

impl CgroupReader {
    pub fn new(loc: Location, owned: bool) -> Self {
        Self { loc, owned }
    }

    pub fn location(&self) -> &Location {
        &self.loc
    }

    pub fn owned(&self) -> bool {
        self.owned
    }

    fn level_usage(&self, dir: &Path) -> Option<u64> {
        read_u64(&dir.join(names(self.loc.version).0))
    }

    fn level_limit(&self, dir: &Path) -> Option<u64> {
        let text = fs::read_to_string(dir.join(names(self.loc.version).1)).ok()?;
        parse_limit(&text).flatten()
    }

    /// Usage minus inactive file pages: page cache the kernel would drop
    /// before it kills anything is not pressure.
    fn working_set(&self, dir: &Path, usage: u64) -> u64 {
        let inactive = fs::read_to_string(dir.join("memory.stat"))
            .ok()
            .and_then(|t| parse_keyed(&t, names(self.loc.version).2))
            .unwrap_or(0);
        usage.saturating_sub(inactive)
    }

    /// One tick's reading. `None` when this cgroup has no memory files.
    pub fn read(&self) -> Option<CgroupSample> {
        self.read_with(false).map(|(s, _)| s)
    }

    /// One tick's reading plus the job cgroup's own working set (the exact
    /// footprint of a cgroup oomguard owns), with each file read once.
    pub fn read_with_working_set(&self) -> Option<(CgroupSample, u64)> {
        self.read_with(true).map(|(s, ws)| {
            let ws = ws.unwrap_or(s.usage_bytes);
            (s, ws)
        })
    }

    fn read_with(&self, job_ws: bool) -> Option<(CgroupSample, Option<u64>)> {
        let dir = self.loc.dir();
        let usage = self.level_usage(&dir)?;
        let own_ws = job_ws.then(|| self.working_set(&dir, usage));
        // The effective ceiling is whichever level runs out first, which is
        // not always the smallest limit: an ancestor's limit is shared with
        // everything else below it.
        let mut best: Option<(u64, String, u64, u64)> = None; // headroom, path, limit, ws
        for (path, d) in self.loc.chain() {
            let Some(limit) = self.level_limit(&d) else {
                continue;
            };
            let Some(u) = (if d == dir {
                Some(usage)
            } else {
                self.level_usage(&d)
            }) else {
                continue;
            };
            let ws = match own_ws {
                Some(ws) if d == dir => ws,
                _ => self.working_set(&d, u),
            };
            let headroom = limit.saturating_sub(ws);
            if best.as_ref().is_none_or(|b| headroom < b.0) {
                best = Some((headroom, path, limit, ws));
            }
        }
        let oom_kill_count = match self.loc.version {
            Version::V1 => fs::read_to_string(dir.join("memory.oom_control")).ok(),
            Version::V2 => fs::read_to_string(dir.join("memory.events")).ok(),
        }
        .and_then(|t| parse_keyed(&t, "oom_kill"));
        let sample = CgroupSample {
            version: self.loc.version.number(),
            path: self.loc.path.clone(),
            usage_bytes: usage,
            limit_bytes: best.as_ref().map(|b| b.2),
            oom_kill_count,
            limit_path: best.as_ref().map(|b| b.1.clone()),
            limit_working_set_bytes: best.as_ref().map(|b| b.3),
            owned: self.owned,
        };
        Some((sample, own_ws))
    }

    /// The pids in the cgroup (v1 `cgroup.procs` lists thread-group ids).
    pub fn procs(&self) -> Option<Vec<u32>> {
        let f = fs::File::open(self.loc.dir().join("cgroup.procs")).ok()?;
        Some(
            std::io::BufReader::new(f)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| l.trim().parse().ok())
                .collect(),
        )
    }
}

/// Why oomguard could not create a cgroup for the job (the run goes on
/// with the /proc tree; the reason is logged).
#[derive(Debug, thiserror::Error)]
pub enum OwnError {
    #[error("cannot create '{path}': {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the cgroup v2 memory controller is not delegated to '{0}' (its parent's cgroup.subtree_control lacks 'memory')"
    )]
    NotDelegated(PathBuf),
    #[error("'{0}' has no memory controller files")]
    NoMemoryController(PathBuf),
    #[error("'{path}' is a {kind} cgroup; the memory controller needs a domain cgroup")]
    Threaded { path: PathBuf, kind: String },
    #[error(
        "'{path}' holds other processes ({pids}); cgroup v2 allows no controllers below a cgroup with processes, so oomguard must be its only process (e.g. `systemd-run --scope -p Delegate=yes`, or `srun`)"
    )]
    OtherProcesses { path: PathBuf, pids: String },
    #[error("cannot move oomguard into '{path}': {source}")]
    Move {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot enable the memory controller in '{path}': {source}")]
    Enable {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What oomguard changed in a delegated v2 cgroup to own a child there, so
/// it can be undone: oomguard moved into `leaf`, controllers enabled in the
/// parent's `cgroup.subtree_control`.
#[derive(Debug)]
struct V2Setup {
    parent: PathBuf,
    leaf: PathBuf,
    enabled: Vec<&'static str>,
}

/// A cgroup oomguard created for the job; removed again on drop (with
/// everything oomguard changed to create it).
#[derive(Debug)]
pub struct OwnedCgroup {
    loc: Location,
    procs_file: CString,
    v2: Option<V2Setup>,
    /// The user manager's transient scope the cgroup was created in, when
    /// oomguard asked for one (src/job/systemd.rs).
    scope: Option<String>,
}

/// The name of the leaf oomguard moves itself into on cgroup v2, beside
/// the job's `oomguard-<pid>`.
pub fn supervisor_leaf_name(job_name: &str) -> String {
    format!("{job_name}-supervisor")
}

impl OwnedCgroup {
    /// Creates `<parent>/<name>`.
    ///
    /// On v2 a cgroup with processes cannot hand controllers to children
    /// (the no-internal-process rule), and oomguard itself is in `parent`.
    /// Where `parent` is a delegated domain cgroup that oomguard may write,
    /// it does what systemd and container runtimes do: moves itself into a
    /// leaf `<name>-supervisor`, enables `memory` (and `pids`) in the
    /// parent's `cgroup.subtree_control` and creates the job's cgroup
    /// beside the leaf. Drop undoes all of it.
    pub fn create(parent: &Location, name: &str) -> Result<Self, OwnError> {
        let pdir = parent.dir();
        let mut v2 = None;
        match parent.version {
            Version::V1 => {
                if !pdir.join("memory.usage_in_bytes").exists() {
                    return Err(OwnError::NoMemoryController(pdir));
                }
            }
            Version::V2 => {
                let ctl =
                    fs::read_to_string(pdir.join("cgroup.subtree_control")).unwrap_or_default();
                if !has_word(&ctl, "memory") {
                    v2 = Some(Self::delegate(&pdir, name)?);
                }
            }
        }
        let loc = parent.child(name);
        let dir = loc.dir();
        let undo = |v2: Option<V2Setup>| {
            if let Some(v) = v2 {
                v.undo();
            }
        };
        if let Err(source) = fs::create_dir(&dir) {
            undo(v2);
            return Err(OwnError::Create { path: dir, source });
        }
        let procs = dir.join("cgroup.procs");
        let Ok(procs_file) = CString::new(procs.as_os_str().as_encoded_bytes()) else {
            let _ = fs::remove_dir(&dir);
            undo(v2);
            return Err(OwnError::Create {
                path: dir,
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"),
            });
        };
        Ok(Self {
            loc,
            procs_file,
            v2,
            scope: None,
        })
    }

    /// The v2 steps before the job's cgroup can be created; on an error
    /// everything done so far is undone.
    fn delegate(pdir: &Path, name: &str) -> Result<V2Setup, OwnError> {
        // The root cgroup has no cgroup.type and is exempt from the
        // no-internal-process rule, but it is the machine's: oomguard does
        // not change the root's controllers.
        let kind = fs::read_to_string(pdir.join("cgroup.type"))
            .map_err(|_| OwnError::NotDelegated(pdir.to_path_buf()))?;
        let kind = kind.trim();
        if kind != "domain" {
            return Err(OwnError::Threaded {
                path: pdir.to_path_buf(),
                kind: kind.to_string(),
            });
        }
        let available = fs::read_to_string(pdir.join("cgroup.controllers")).unwrap_or_default();
        if !has_word(&available, "memory") {
            return Err(OwnError::NotDelegated(pdir.to_path_buf()));
        }
        let leaf = pdir.join(supervisor_leaf_name(name));
        fs::create_dir(&leaf).map_err(|source| OwnError::Create {
            path: leaf.clone(),
            source,
        })?;
        let mut setup = V2Setup {
            parent: pdir.to_path_buf(),
            leaf,
            enabled: Vec::new(),
        };
        let me = std::process::id();
        if let Err(source) = fs::write(setup.leaf.join("cgroup.procs"), me.to_string()) {
            let path = setup.leaf.clone();
            setup.undo();
            return Err(OwnError::Move { path, source });
        }
        let others: Vec<String> = fs::read_to_string(pdir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.trim().parse::<u32>().is_ok_and(|p| p != me))
            .map(|l| l.trim().to_string())
            .collect();
        if !others.is_empty() {
            setup.undo();
            let mut pids = others[..others.len().min(5)].join(", ");
            if others.len() > 5 {
                pids.push_str(", ...");
            }
            return Err(OwnError::OtherProcesses {
                path: pdir.to_path_buf(),
                pids,
            });
        }
        for ctrl in ["memory", "pids"] {
            if !has_word(&available, ctrl) {
                continue;
            }
            match fs::write(pdir.join("cgroup.subtree_control"), format!("+{ctrl}")) {
                Ok(()) => setup.enabled.push(ctrl),
                // pids is a bonus (fork bombs); memory is the point.
                Err(_) if ctrl == "pids" => {}
                Err(source) => {
                    setup.undo();
                    return Err(OwnError::Enable {
                        path: pdir.to_path_buf(),
                        source,
                    });
                }
            }
        }
        Ok(setup)
    }

    pub fn location(&self) -> &Location {
        &self.loc
    }

    /// `cgroup.procs` of the cgroup, for the child to join itself before
    /// exec (so nothing it starts can be born outside).
    pub fn procs_file(&self) -> &CString {
        &self.procs_file
    }

    /// Writes a pid into the cgroup.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        fs::write(self.loc.dir().join("cgroup.procs"), pid.to_string())
    }

    /// Records that the parent is the user manager's scope `unit`.
    pub fn in_user_scope(mut self, unit: String) -> Self {
        self.scope = Some(unit);
        self
    }

    /// How the cgroup was obtained, as `run_start` says it: `created`
    /// under oomguard's own cgroup, or in a `systemd-user-scope`.
    pub fn via(&self) -> &'static str {
        if self.scope.is_some() {
            "systemd-user-scope"
        } else {
            "created"
        }
    }

    /// The user manager's scope the cgroup is in, if any.
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    /// Whether creating it failed because the cgroup is not delegated to
    /// this user (permission denied, or no memory controller handed down),
    /// as opposed to a delegated cgroup used wrongly (other processes in
    /// it, threaded).
    pub fn not_delegated(e: &OwnError) -> bool {
        match e {
            OwnError::NotDelegated(_) => true,
            OwnError::Create { source, .. }
            | OwnError::Move { source, .. }
            | OwnError::Enable { source, .. } => {
                source.kind() == std::io::ErrorKind::PermissionDenied
            }
            _ => false,
        }
    }

    /// Whether oomguard moved itself into a leaf to own this cgroup (v2).
    pub fn moved_supervisor(&self) -> bool {
        self.v2.is_some()
    }
}

impl V2Setup {
    /// Disables what was enabled, moves oomguard back to the parent and
    /// removes the leaf. Best effort: every step is tried.
    fn undo(&self) {
        for ctrl in self.enabled.iter().rev() {
            let _ = fs::write(
                self.parent.join("cgroup.subtree_control"),
                format!("-{ctrl}"),
            );
        }
        let _ = fs::write(
            self.parent.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        remove_dir_retrying(&self.leaf);
    }
}

fn has_word(text: &str, word: &str) -> bool {
    text.split_ascii_whitespace().any(|c| c == word)
}

/// The last tasks may still be exiting; rmdir fails with EBUSY until they
/// are gone. A few short retries cover that without hanging.
fn remove_dir_retrying(dir: &Path) {
    for _ in 0..50 {
        match fs::remove_dir(dir) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            _ => return,
        }
    }
}

impl Drop for OwnedCgroup {
    fn drop(&mut self) {
        remove_dir_retrying(&self.loc.dir());
        if let Some(v) = self.v2.take() {
            v.undo();
        }
    }
}

/// A cgroup a previous run left behind (oomguard was killed before it
/// could remove it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// Empty, and removed now.
    Removed(PathBuf),
    /// Its run is gone but processes are still in it: left alone (they are
    /// not this run's to signal).
    Occupied { path: PathBuf, procs: usize },
}

/// Removes the `oomguard-<pid>` (and v2 `oomguard-<pid>-supervisor`)
/// children of `parent` whose oomguard is no longer running: a run killed
/// with SIGKILL cannot clean up, so the next run in the same cgroup does.
/// A pid is "still running oomguard" when `/proc/<pid>/comm` starts with
/// `oomguard` (a renamed copy such as `oomguard-1.2` counts); a
/// pid reused by another program does not keep a stale cgroup.
pub fn clean_stale(parent: &Location, proc_root: &Path) -> Vec<Stale> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir(parent.dir()) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, u32)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix("oomguard-")?;
            let pid: u32 = rest
                .strip_suffix("-supervisor")
                .unwrap_or(rest)
                .parse()
                .ok()?;
            Some((e.path(), pid))
        })
        .filter(|(_, pid)| *pid != me)
        .filter(|(_, pid)| {
            fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
                .ok()
                .is_none_or(|c| !c.trim().starts_with("oomguard"))
        })
        .collect();
    // The job's cgroup before the supervisor leaf: both are needed to free
    // the parent's controllers.
    found.sort_by_key(|(p, _)| p.to_string_lossy().ends_with("-supervisor"));
    let mut out = Vec::new();
    for (path, _) in found {
        let procs = fs::read_to_string(path.join("cgroup.procs"))
            .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count())
            .unwrap_or(0);
        if procs > 0 {
            out.push(Stale::Occupied { path, procs });
        } else if fs::remove_dir(&path).is_ok() {
            out.push(Stale::Removed(path));
        }
    }
    out
}

/// Resolves the memory cgroup of `pid` under `proc_root`.
pub fn locate(proc_root: &Path, pid: &str) -> Option<Location> {
    let mountinfo = fs::read_to_string(proc_root.join(pid).join("mountinfo"))
        .or_else(|_| fs::read_to_string(proc_root.join("self/mountinfo")))
        .ok()?;
    let cg = fs::read_to_string(proc_root.join(pid).join("cgroup")).ok()?;
    let loc = resolve(&mountinfo, &cg)?;
    // The path as seen from the process may be outside our view of the
    // hierarchy (another cgroup namespace): fall back to the mount root.
    if loc.dir().is_dir() {
        Some(loc)
    } else {
        Some(Location {
            path: "/".into(),
            ..loc
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CG: &str = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";

    #[test]
    fn resolves_hybrid_to_v1_memory() {
        let loc = resolve(HYBRID_MOUNTS, HYBRID_CG).unwrap();
        assert_eq!(loc.version, Version::V1);
        assert_eq!(loc.mount_point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(loc.path, "/process_api/abc");
        assert_eq!(
            loc.dir(),
            PathBuf::from("/sys/fs/cgroup/memory/process_api/abc")
        );
    }

    #[test]
    fn resolves_pure_v2() {
        let mounts = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let loc = resolve(mounts, "0::/user.slice/user-1000.slice/session-2.scope\n").unwrap();
        assert_eq!(loc.version, Version::V2);
        assert_eq!(loc.path, "/user.slice/user-1000.slice/session-2.scope");
        let chain: Vec<String> = loc.chain().into_iter().map(|c| c.0).collect();
        assert_eq!(
            chain,
            vec![
                "/user.slice/user-1000.slice/session-2.scope",
                "/user.slice/user-1000.slice",
                "/user.slice",
                "/"
            ]
        );
    }

    #[test]
    fn container_mount_root_is_stripped() {
        let mounts = "25 1 0:22 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        let loc = resolve(mounts, "0::/kubepods/pod1/ctr\n").unwrap();
        assert_eq!(loc.path, "/ctr");
        let loc = resolve(mounts, "0::/\n").unwrap();
        assert_eq!(loc.path, "/");
    }

    #[test]
    fn no_memory_hierarchy() {
        let mounts = "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(resolve(mounts, "1:cpu:/\n"), None);
        assert_eq!(resolve("", ""), None);
    }

    #[test]
    fn limits() {
        assert_eq!(parse_limit("max\n"), Some(None));
        assert_eq!(parse_limit("9223372036854771712\n"), Some(None));
        assert_eq!(parse_limit("314572800\n"), Some(Some(314572800)));
        assert_eq!(parse_limit("lots"), None);
    }

    /// A v2 cgroup directory as files on a plain filesystem: enough to
    /// check which reason is given and what is written where (the kernel's
    /// behaviour is proven in tests/vm_cgroup_v2.rs).
    fn fake_v2(kind: &str, controllers: &str, procs: &str) -> (tempfile::TempDir, Location) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("job");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("cgroup.type"), kind).unwrap();
        fs::write(dir.join("cgroup.controllers"), controllers).unwrap();
        fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
        fs::write(dir.join("cgroup.procs"), procs).unwrap();
        let loc = Location {
            version: Version::V2,
            mount_point: root.path().to_path_buf(),
            path: "/job".into(),
        };
        (root, loc)
    }

    #[test]
    fn v2_reasons_for_not_owning() {
        let me = std::process::id();
        let (_r, loc) = fake_v2("threaded\n", "memory pids\n", "");
        let e = OwnedCgroup::create(&loc, "oomguard-1").unwrap_err();
        assert!(matches!(e, OwnError::Threaded { .. }), "{e}");
        assert!(e.to_string().contains("threaded"));

        let (_r, loc) = fake_v2("domain\n", "cpu io\n", "");
        let e = OwnedCgroup::create(&loc, "oomguard-1").unwrap_err();
        assert!(matches!(e, OwnError::NotDelegated(_)), "{e}");

        let (_r, loc) = fake_v2("domain\n", "memory pids\n", &format!("1\n{me}\n"));
        let e = OwnedCgroup::create(&loc, "oomguard-1").unwrap_err();
        assert!(e.to_string().contains("holds other processes (1)"), "{e}");
        // Undone: oomguard moved back, nothing enabled.
        let dir = loc.dir();
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.procs")).unwrap(),
            me.to_string()
        );
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(),
            ""
        );
    }

    #[test]
    fn v2_delegation_moves_oomguard_into_a_leaf_and_enables_memory() {
        let me = std::process::id();
        let (_r, loc) = fake_v2("domain\n", "memory pids\n", &format!("{me}\n"));
        let dir = loc.dir();
        // The kernel would drop us from the parent's list on the move.
        let owned = OwnedCgroup::create(&loc, "oomguard-7").unwrap();
        fs::write(dir.join("cgroup.procs"), "").unwrap();
        assert!(owned.moved_supervisor());
        assert_eq!(owned.location().path, "/job/oomguard-7");
        assert!(dir.join("oomguard-7").is_dir());
        let leaf = dir.join("oomguard-7-supervisor");
        assert_eq!(
            fs::read_to_string(leaf.join("cgroup.procs")).unwrap(),
            me.to_string()
        );
        // Files here keep only the last write: +memory, then +pids.
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(),
            "+pids"
        );
        drop(owned);
        assert!(!dir.join("oomguard-7").exists());
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(),
            "-memory"
        );
        assert_eq!(
            fs::read_to_string(dir.join("cgroup.procs")).unwrap(),
            me.to_string()
        );
    }

    #[test]
    fn stale_cgroups_of_dead_runs_are_removed() {
        let (_r, loc) = fake_v2("domain\n", "memory\n", "");
        let dir = loc.dir();
        let proc_root = tempfile::tempdir().unwrap();
        // pid 100 is a live oomguard, 200 is gone, 300 is another program.
        for (pid, comm) in [(100, "oomguard\n"), (300, "python3\n")] {
            fs::create_dir(proc_root.path().join(pid.to_string())).unwrap();
            fs::write(proc_root.path().join(format!("{pid}/comm")), comm).unwrap();
        }
        for name in [
            "oomguard-100",
            "oomguard-200",
            "oomguard-200-supervisor",
            "oomguard-300",
            "oomguard-x",
            "other",
        ] {
            fs::create_dir(dir.join(name)).unwrap();
        }
        fs::create_dir(dir.join("oomguard-400")).unwrap();
        fs::write(dir.join("oomguard-400/cgroup.procs"), "55\n").unwrap();
        let mut got = clean_stale(&loc, proc_root.path());
        got.sort_by_key(|s| format!("{s:?}"));
        let removed: Vec<String> = got
            .iter()
            .filter_map(|s| match s {
                Stale::Removed(p) => Some(p.file_name()?.to_string_lossy().into_owned()),
                Stale::Occupied { .. } => None,
            })
            .collect();
        assert_eq!(
            removed,
            vec!["oomguard-200", "oomguard-200-supervisor", "oomguard-300"]
        );
        assert!(got.contains(&Stale::Occupied {
            path: dir.join("oomguard-400"),
            procs: 1
        }));
        for kept in ["oomguard-100", "oomguard-x", "other", "oomguard-400"] {
            assert!(dir.join(kept).exists(), "{kept}");
        }
    }

    #[test]
    fn keyed() {
        let oc = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_keyed(oc, "oom_kill"), Some(3));
        assert_eq!(parse_keyed(oc, "oom"), None);
        assert_eq!(
            parse_keyed("low 0\nhigh 2\nmax 9\noom 1\noom_kill 1\n", "oom_kill"),
            Some(1)
        );
    }
}

/// A cgroup v1 memory threshold: the kernel signals the eventfd the moment
/// `memory.usage_in_bytes` crosses `bytes` (either way). Polling every
/// 100 ms would let a 2 GB/s leak overshoot by ~200 MiB; this wakes
/// oomguard within microseconds of the crossing.
#[derive(Debug)]
pub struct Threshold {
    pub bytes: u64,
    pub eventfd: std::os::fd::OwnedFd,
    // Kept open for as long as the threshold is registered.
    _usage: fs::File,
}

impl Threshold {
    /// Registers a threshold on a v1 memory cgroup directory.
    pub fn register(dir: &Path, bytes: u64) -> std::io::Result<Threshold> {
        use rustix::event::{EventfdFlags, eventfd};
        use std::os::fd::AsRawFd;
        let usage = fs::File::open(dir.join("memory.usage_in_bytes"))?;
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let line = format!("{} {} {}", efd.as_raw_fd(), usage.as_raw_fd(), bytes);
        fs::write(dir.join("cgroup.event_control"), line)?;
        Ok(Threshold {
            bytes,
            eventfd: efd,
            _usage: usage,
        })
    }
}

impl CgroupReader {
    /// The directory of the cgroup holding the effective limit, when this
    /// is a v1 hierarchy (thresholds are a v1 feature; on v2 oomguard
    /// relies on fast polling near the ceiling).
    pub fn limit_dir(&self, limit_path: &str) -> Option<PathBuf> {
        (self.loc.version == Version::V1).then(|| join_cgroup(&self.loc.mount_point, limit_path))
    }

    /// The usage counter of the cgroup at `limit_path` (v1 or v2).
    pub fn usage_file(&self, limit_path: &str) -> PathBuf {
        join_cgroup(&self.loc.mount_point, limit_path).join(names(self.loc.version).0)
    }
}

impl std::os::fd::AsRawFd for Threshold {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.eventfd.as_raw_fd()
    }
}
