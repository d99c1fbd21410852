//! `attach`: finding the job a user names — a pid, a memory cgroup, a SLURM
//! job, or a command line — and deciding whether the job's cgroup counts
//! the job exactly.
//!
//! A job oomguard did not launch has no cgroup of oomguard's own. When it
//! sits alone in a cgroup (a SLURM job or step, a container, a systemd
//! scope), that cgroup's working set is its exact footprint, read at O(1)
//! per tick, and its members are the tree, orphans included. When anything
//! else shares the cgroup, the tree's PSS sum is the footprint and the
//! reason is logged. Everything here reads through a proc root and the
//! cgroup mounts named in its mount table, so tests can use fixture trees.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use procfs::FromBufRead;

use crate::engine::probe::cgroup::{Location, Version};

/// How the user named the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pid(u32),
    /// A cgroup directory, or a path inside a hierarchy.
    Cgroup(String),
    /// A SLURM job id.
    SlurmJob(String),
    /// A regular expression over command lines.
    Match(String),
}

/// Why `attach` cannot start (exit 2, before anything is watched).
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("cannot read the mount table '{path}': {source}")]
    Mounts {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no cgroup hierarchy is mounted (looked in '{0}')")]
    NoHierarchy(PathBuf),
    #[error("--cgroup '{arg}': no such cgroup under {searched}")]
    NoCgroup { arg: String, searched: String },
    #[error("cgroup '{0}' holds no processes to watch (it and the cgroups below it are empty)")]
    EmptyCgroup(PathBuf),
    #[error("--slurm-job '{0}': a SLURM job id is a number, such as 4242")]
    BadSlurmId(String),
    #[error(
        "no cgroup of SLURM job {id} under {searched} (expected slurm*/uid_*/job_{id} on cgroup v1, or …/slurmstepd.scope/job_{id} on v2; is the job running on this node?)"
    )]
    NoSlurmJob { id: String, searched: String },
    #[error("SLURM job {id} has several cgroups: {}; use --cgroup with one of them", list(.found))]
    ManySlurmJobs { id: String, found: Vec<PathBuf> },
    #[error("--match '{pattern}' is not a valid regular expression: {reason}")]
    BadRegex { pattern: String, reason: String },
    #[error("--match '{0}': no running process's command line matches")]
    NoMatch(String),
    #[error(
        "--match '{pattern}' matches {} unrelated processes; narrow the pattern or attach by pid:\n{}",
        .candidates.len(),
        candidates.iter().map(|(p, c)| format!("  {p}  {c}")).collect::<Vec<_>>().join("\n")
    )]
    ManyMatches {
        pattern: String,
        candidates: Vec<(u32, String)>,
    },
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| format!("'{}'", p.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The job found for a target.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachSpec {
    /// The job's main process: the named pid, or the oldest top process of
    /// the named cgroup.
    pub pid: u32,
    /// How the job is shown in messages and in `run_start.argv`.
    pub label: String,
    /// The cgroup the user named: its processes are the job.
    pub cgroup: Option<Location>,
    /// `--watch-for`: stop watching after this long.
    pub watch_for: Option<Duration>,
}

/// Finds the job `target` names, looking through `proc_root`.
pub fn resolve(target: &Target, proc_root: &Path) -> Result<AttachSpec, AttachError> {
    let me = std::process::id();
    match target {
        Target::Pid(pid) => Ok(AttachSpec {
            pid: *pid,
            label: format!("pid {pid}"),
            cgroup: None,
            watch_for: None,
        }),
        Target::Match(pattern) => {
            let pid = match_cmdline(proc_root, pattern, &ancestors(proc_root, me))?;
            Ok(AttachSpec {
                pid,
                label: format!("pid {pid}"),
                cgroup: None,
                watch_for: None,
            })
        }
        Target::Cgroup(arg) => {
            let mounts = mounts_of(proc_root)?;
            let loc = cgroup_from_arg(arg, &mounts)?;
            by_cgroup(proc_root, loc, format!("cgroup {arg}"), me)
        }
        Target::SlurmJob(id) => {
            let mounts = mounts_of(proc_root)?;
            let loc = find_slurm_job(id, &mounts)?;
            by_cgroup(proc_root, loc, format!("SLURM job {id}"), me)
        }
    }
}

fn by_cgroup(
    proc_root: &Path,
    loc: Location,
    label: String,
    me: u32,
) -> Result<AttachSpec, AttachError> {
    let members: Vec<u32> = subtree_procs(&loc.dir())
        .into_iter()
        .filter(|&p| p != me)
        .collect();
    let pid =
        main_process(proc_root, &members).ok_or_else(|| AttachError::EmptyCgroup(loc.dir()))?;
    Ok(AttachSpec {
        pid,
        label: format!("{label} (pid {pid})"),
        cgroup: Some(loc),
        watch_for: None,
    })
}

/// The mounted cgroup hierarchies that can hold memory figures: v1 with the
/// memory controller first (hybrid layouts keep memory there), then v2.
pub fn memory_mounts(mountinfo: &str) -> Vec<(Version, PathBuf)> {
    let Ok(mounts) = procfs::process::MountInfos::from_buf_read(mountinfo.as_bytes()) else {
        return Vec::new();
    };
    let v1 = mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup" && m.super_options.contains_key("memory"))
        .map(|m| (Version::V1, m.mount_point.clone()));
    let v2 = mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup2")
        .map(|m| (Version::V2, m.mount_point.clone()));
    v1.chain(v2).collect()
}

fn mounts_of(proc_root: &Path) -> Result<Vec<(Version, PathBuf)>, AttachError> {
    let path = proc_root.join("self/mountinfo");
    let text = fs::read_to_string(&path).map_err(|source| AttachError::Mounts {
        path: path.clone(),
        source,
    })?;
    let mounts = memory_mounts(&text);
    if mounts.is_empty() {
        return Err(AttachError::NoHierarchy(path));
    }
    Ok(mounts)
}

fn has_memory_files(version: Version, dir: &Path) -> bool {
    match version {
        Version::V1 => dir.join("memory.usage_in_bytes").exists(),
        Version::V2 => dir.join("memory.current").exists(),
    }
}

fn location(version: Version, mount: &Path, dir: &Path) -> Option<Location> {
    let rel = dir.strip_prefix(mount).ok()?;
    Some(Location {
        version,
        mount_point: mount.to_path_buf(),
        path: format!("/{}", rel.display()),
    })
}

/// `--cgroup PATH`: a directory under one of the mounts, or a path inside
/// a hierarchy (`/slurm/uid_0/job_7`). A cgroup with memory files wins over
/// one without (a hybrid layout has the same path in both hierarchies).
pub fn cgroup_from_arg(arg: &str, mounts: &[(Version, PathBuf)]) -> Result<Location, AttachError> {
    let given = Path::new(arg);
    let mut found: Vec<(bool, Location)> = Vec::new();
    for (version, mount) in mounts {
        let dir = if given.is_absolute() && given.starts_with(mount) {
            given.to_path_buf()
        } else {
            mount.join(arg.trim_start_matches('/'))
        };
        if dir.is_dir()
            && let Some(loc) = location(*version, mount, &dir)
        {
            found.push((has_memory_files(*version, &dir), loc));
        }
    }
    // Stable: v1 memory mounts come first, so the first with memory files
    // is the one to read.
    found.sort_by_key(|(mem, _)| !*mem);
    found
        .into_iter()
        .next()
        .map(|(_, loc)| loc)
        .ok_or_else(|| AttachError::NoCgroup {
            arg: arg.to_string(),
            searched: searched(mounts),
        })
}

fn searched(mounts: &[(Version, PathBuf)]) -> String {
    mounts
        .iter()
        .map(|(_, m)| format!("'{}'", m.display()))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// How deep below a mount a SLURM job cgroup may sit: `slurm/uid_U/job_J`
/// on v1, `system.slice/slurmstepd.scope/job_J` on v2, with room for a
/// container's or a multi-slurmd node's extra level.
const SLURM_DEPTH: usize = 8;

/// `--slurm-job ID`: the job's cgroup wherever this node's SLURM put it.
/// The layouts differ by version and configuration, so the hierarchies are
/// searched (a few levels deep) for a directory named `job_ID`.
pub fn find_slurm_job(id: &str, mounts: &[(Version, PathBuf)]) -> Result<Location, AttachError> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AttachError::BadSlurmId(id.to_string()));
    }
    let name = format!("job_{id}");
    let mut found: Vec<(bool, Location)> = Vec::new();
    for (version, mount) in mounts {
        let mut level = vec![mount.clone()];
        for _ in 0..SLURM_DEPTH {
            let mut next = Vec::new();
            for dir in level {
                let Ok(rd) = fs::read_dir(&dir) else { continue };
                for e in rd.flatten() {
                    if !e.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let fname = e.file_name();
                    let fname = fname.to_string_lossy();
                    if fname == name {
                        if let Some(loc) = location(*version, mount, &e.path()) {
                            found.push((has_memory_files(*version, &e.path()), loc));
                        }
                    } else if !fname.starts_with("job_") {
                        // Another job's steps cannot hold this job.
                        next.push(e.path());
                    }
                }
            }
            level = next;
        }
    }
    // The same job in both hierarchies of a hybrid layout: the one with
    // memory files is the job's memory cgroup, and v1 memory wins (as for
    // `/proc/PID/cgroup`: hybrid layouts keep memory in v1).
    let rank = |(mem, loc): &(bool, Location)| (*mem, loc.version == Version::V1);
    if let Some(best) = found.iter().map(rank).max() {
        found.retain(|f| rank(f) == best);
    }
    match found.len() {
        0 => Err(AttachError::NoSlurmJob {
            id: id.to_string(),
            searched: searched(mounts),
        }),
        1 => Ok(found.remove(0).1),
        _ => Err(AttachError::ManySlurmJobs {
            id: id.to_string(),
            found: found.into_iter().map(|(_, l)| l.dir()).collect(),
        }),
    }
}

/// Every pid in a cgroup and the cgroups below it (the parent's usage
/// counts them all; SLURM and systemd put processes in leaves).
pub fn subtree_procs(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = fs::read_to_string(d.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(rd) = fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// (ppid, start time, comm) of every live (non-zombie) process.
fn process_table(proc_root: &Path) -> HashMap<u32, (u32, u64, String)> {
    let mut table = HashMap::new();
    let Ok(rd) = fs::read_dir(proc_root) else {
        return table;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(st) = fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|t| crate::engine::probe::proc::parse_stat(&t))
            .filter(|st| st.state != 'Z')
        {
            table.insert(pid, (st.ppid, st.start_time, st.comm));
        }
    }
    table
}

/// `pid` and all its descendants now.
pub fn descendants(proc_root: &Path, pid: u32) -> HashSet<u32> {
    let table = process_table(proc_root);
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&p, (ppid, _, _)) in &table {
        children.entry(*ppid).or_default().push(p);
    }
    let mut out = HashSet::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        if out.insert(p) {
            stack.extend(children.get(&p).into_iter().flatten().copied());
        }
    }
    out
}

/// `pid` and the processes above it up to init.
fn ancestors(proc_root: &Path, pid: u32) -> HashSet<u32> {
    let table = process_table(proc_root);
    let mut out = HashSet::new();
    let mut p = pid;
    while p > 0 && out.insert(p) {
        p = table.get(&p).map_or(0, |(ppid, _, _)| *ppid);
    }
    out
}

/// The job's main process among a cgroup's members: the oldest one whose
/// parent is not a member (ties by pid).
pub fn main_process(proc_root: &Path, members: &[u32]) -> Option<u32> {
    let table = process_table(proc_root);
    let set: HashSet<u32> = members.iter().copied().collect();
    members
        .iter()
        .filter_map(|&p| table.get(&p).map(|(ppid, start, _)| (p, *ppid, *start)))
        .filter(|(_, ppid, _)| !set.contains(ppid))
        .min_by_key(|&(p, _, start)| (start, p))
        .map(|(p, _, _)| p)
}

/// `--match REGEX`: the one process whose command line (arguments joined
/// by spaces) matches. A match below another match is the same job (a
/// `bash train.sh` and its `python train.py`): the top one is taken. oomguard
/// and the processes above it (the shell that typed the pattern) never
/// count.
pub fn match_cmdline(
    proc_root: &Path,
    pattern: &str,
    skip: &HashSet<u32>,
) -> Result<u32, AttachError> {
    let re = regex::Regex::new(pattern).map_err(|e| AttachError::BadRegex {
        pattern: pattern.to_string(),
        reason: e.to_string(),
    })?;
    let table = process_table(proc_root);
    let mut hits: HashMap<u32, String> = HashMap::new();
    for &pid in table.keys() {
        if skip.contains(&pid) {
            continue;
        }
        let Ok(raw) = fs::read(proc_root.join(pid.to_string()).join("cmdline")) else {
            continue;
        };
        // Kernel threads have no command line.
        if raw.is_empty() {
            continue;
        }
        let line =
            String::from_utf8_lossy(raw.strip_suffix(b"\0").unwrap_or(&raw)).replace('\0', " ");
        if re.is_match(&line) {
            hits.insert(pid, line);
        }
    }
    let under_another = |pid: u32| {
        let mut seen = HashSet::new();
        let mut p = table.get(&pid).map_or(0, |t| t.0);
        while p > 0 && seen.insert(p) {
            if hits.contains_key(&p) {
                return true;
            }
            p = table.get(&p).map_or(0, |t| t.0);
        }
        false
    };
    let mut tops: Vec<(u32, String)> = hits
        .iter()
        .filter(|(p, _)| !under_another(**p))
        .map(|(p, c)| (*p, c.clone()))
        .collect();
    tops.sort();
    match tops.len() {
        0 => Err(AttachError::NoMatch(pattern.to_string())),
        1 => Ok(tops[0].0),
        _ => Err(AttachError::ManyMatches {
            pattern: pattern.to_string(),
            candidates: tops,
        }),
    }
}

/// Whether `loc` counts exactly the processes in `job` (oomguard itself,
/// `me`, may sit in it too: its few MiB are the price of watching from
/// inside a SLURM job). `Err` says why not, for the log.
pub fn exclusive(
    loc: &Location,
    proc_root: &Path,
    job: &HashSet<u32>,
    me: u32,
) -> Result<(), String> {
    if loc.path.trim_end_matches('/').is_empty() {
        return Err("the job is in the root cgroup, which counts the whole machine".into());
    }
    let dir = loc.dir();
    if !has_memory_files(loc.version, &dir) {
        return Err(format!(
            "'{}' has no memory controller files",
            dir.display()
        ));
    }
    let members = subtree_procs(&dir);
    let table = process_table(proc_root);
    let outsiders: Vec<u32> = members
        .into_iter()
        .filter(|p| *p != me && !job.contains(p) && table.contains_key(p))
        .collect();
    match outsiders.first() {
        None => Ok(()),
        Some(first) => {
            let comm = table.get(first).map_or("?", |t| t.2.as_str());
            Err(format!(
                "cgroup '{}' also holds {} process(es) outside the job (e.g. pid {first} {comm})",
                loc.path,
                outsiders.len()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkdirs(root: &Path, rel: &[&str]) {
        for r in rel {
            fs::create_dir_all(root.join(r)).unwrap();
        }
    }

    fn touch(path: &Path, text: &str) {
        fs::write(path, text).unwrap();
    }

    /// A fake /proc with processes (pid, ppid, comm, cmdline).
    fn fake_proc(root: &Path, procs: &[(u32, u32, &str, &str)]) {
        for &(pid, ppid, comm, cmd) in procs {
            let d = root.join(pid.to_string());
            fs::create_dir_all(&d).unwrap();
            touch(
                &d.join("stat"),
                &format!(
                    "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {} 1000 10\n",
                    1000 + pid
                ),
            );
            let mut raw = cmd.replace(' ', "\0").into_bytes();
            if !raw.is_empty() {
                raw.push(0);
            }
            fs::write(d.join("cmdline"), raw).unwrap();
        }
    }

    const MOUNTS: &str = "\
35 31 0:32 / {v1} rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / {v2} rw,relatime - cgroup2 cgroup2 rw
";

    fn mounts(root: &Path) -> Vec<(Version, PathBuf)> {
        let text = MOUNTS
            .replace("{v1}", &root.join("memory").display().to_string())
            .replace("{v2}", &root.join("unified").display().to_string());
        memory_mounts(&text)
    }

    #[test]
    fn mounts_put_v1_memory_first() {
        let m = mounts(Path::new("/x"));
        assert_eq!(
            m,
            vec![
                (Version::V1, PathBuf::from("/x/memory")),
                (Version::V2, PathBuf::from("/x/unified"))
            ]
        );
        assert!(memory_mounts("garbage").is_empty());
    }

    #[test]
    fn slurm_v1_layout() {
        let d = tempfile::tempdir().unwrap();
        let m = mounts(d.path());
        mkdirs(
            d.path(),
            &[
                "memory/slurm/uid_1000/job_42/step_0/task_0",
                "memory/slurm/uid_1000/job_420/step_0",
                "unified/system.slice",
            ],
        );
        touch(
            &d.path()
                .join("memory/slurm/uid_1000/job_42/memory.usage_in_bytes"),
            "1\n",
        );
        let loc = find_slurm_job("42", &m).unwrap();
        assert_eq!(loc.version, Version::V1);
        assert_eq!(loc.path, "/slurm/uid_1000/job_42");
        assert!(matches!(
            find_slurm_job("7", &m),
            Err(AttachError::NoSlurmJob { .. })
        ));
        assert!(matches!(
            find_slurm_job("4x", &m),
            Err(AttachError::BadSlurmId(_))
        ));
    }

    #[test]
    fn slurm_v2_layout_and_hybrid_preference() {
        let d = tempfile::tempdir().unwrap();
        let m = mounts(d.path());
        let job = "unified/system.slice/slurmstepd.scope/job_9";
        mkdirs(d.path(), &[&format!("{job}/step_0/user/task_0")]);
        touch(&d.path().join(job).join("memory.current"), "1\n");
        let loc = find_slurm_job("9", &m).unwrap();
        assert_eq!(loc.version, Version::V2);
        assert_eq!(loc.path, "/system.slice/slurmstepd.scope/job_9");
        // Also in the v1 memory hierarchy, with memory files: that one.
        mkdirs(d.path(), &["memory/slurm/uid_0/job_9"]);
        touch(
            &d.path()
                .join("memory/slurm/uid_0/job_9/memory.usage_in_bytes"),
            "1\n",
        );
        assert_eq!(find_slurm_job("9", &m).unwrap().version, Version::V1);
        // Two with memory files in one hierarchy: ambiguous, both named.
        mkdirs(d.path(), &["memory/slurm_n2/uid_0/job_9"]);
        touch(
            &d.path()
                .join("memory/slurm_n2/uid_0/job_9/memory.usage_in_bytes"),
            "1\n",
        );
        let e = find_slurm_job("9", &m).unwrap_err().to_string();
        assert!(e.contains("slurm_n2") && e.contains("--cgroup"), "{e}");
    }

    #[test]
    fn cgroup_argument_forms() {
        let d = tempfile::tempdir().unwrap();
        let m = mounts(d.path());
        mkdirs(d.path(), &["memory/a/b", "unified/a/b", "unified/only2"]);
        touch(&d.path().join("memory/a/b/memory.usage_in_bytes"), "1\n");
        let loc = cgroup_from_arg("/a/b", &m).unwrap();
        assert_eq!((loc.version, loc.path.as_str()), (Version::V1, "/a/b"));
        let full = d.path().join("unified/only2");
        let loc = cgroup_from_arg(full.to_str().unwrap(), &m).unwrap();
        assert_eq!((loc.version, loc.path.as_str()), (Version::V2, "/only2"));
        let e = cgroup_from_arg("/nope", &m).unwrap_err().to_string();
        assert!(e.contains("'/nope'") && e.contains("memory"), "{e}");
    }

    #[test]
    fn subtree_members_and_main_process() {
        let d = tempfile::tempdir().unwrap();
        let cg = d.path().join("job_1");
        mkdirs(&cg, &["step_0/task_0", "step_batch"]);
        touch(&cg.join("cgroup.procs"), "");
        touch(&cg.join("step_0/task_0/cgroup.procs"), "12\n11\n");
        touch(&cg.join("step_batch/cgroup.procs"), "10\n");
        assert_eq!(subtree_procs(&cg), vec![10, 11, 12]);
        let proc_root = d.path().join("proc");
        // 10 is the batch script; 11 its python; 12 a worker.
        fake_proc(
            &proc_root,
            &[
                (10, 1, "bash", "bash b.sh"),
                (11, 10, "python3", "python3 t.py"),
                (12, 11, "python3", "python3 t.py"),
            ],
        );
        assert_eq!(main_process(&proc_root, &[10, 11, 12]), Some(10));
        assert_eq!(main_process(&proc_root, &[11, 12]), Some(11));
        assert_eq!(main_process(&proc_root, &[99]), None);
        assert_eq!(descendants(&proc_root, 11), HashSet::from([11, 12]));
    }

    #[test]
    fn exclusivity_reasons() {
        let d = tempfile::tempdir().unwrap();
        let proc_root = d.path().join("proc");
        fake_proc(
            &proc_root,
            &[
                (20, 1, "python3", "python3 t.py"),
                (21, 20, "python3", ""),
                (30, 1, "sshd", "sshd"),
            ],
        );
        let mount = d.path().join("memory");
        mkdirs(&mount, &["job"]);
        touch(&mount.join("job/memory.usage_in_bytes"), "1\n");
        touch(&mount.join("job/cgroup.procs"), "20\n21\n");
        let loc = Location {
            version: Version::V1,
            mount_point: mount.clone(),
            path: "/job".into(),
        };
        let job = HashSet::from([20, 21]);
        assert_eq!(exclusive(&loc, &proc_root, &job, 999), Ok(()));
        // oomguard inside the job's cgroup does not spoil it.
        touch(&mount.join("job/cgroup.procs"), "20\n21\n999\n");
        assert_eq!(exclusive(&loc, &proc_root, &job, 999), Ok(()));
        touch(&mount.join("job/cgroup.procs"), "20\n21\n30\n");
        let e = exclusive(&loc, &proc_root, &job, 999).unwrap_err();
        assert!(
            e.contains("1 process(es) outside the job") && e.contains("30 sshd"),
            "{e}"
        );
        let root = Location {
            path: "/".into(),
            ..loc.clone()
        };
        assert!(
            exclusive(&root, &proc_root, &job, 999)
                .unwrap_err()
                .contains("root cgroup")
        );
        let bare = Location {
            version: Version::V2,
            ..loc
        };
        assert!(
            exclusive(&bare, &proc_root, &job, 999)
                .unwrap_err()
                .contains("no memory controller")
        );
    }

    #[test]
    fn match_takes_the_top_of_one_job_and_lists_rivals() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fake_proc(
            p,
            &[
                (1, 0, "init", "/sbin/init"),
                (2, 0, "kthreadd", ""),
                (50, 1, "bash", "bash train.sh --lr 1"),
                (51, 50, "python3", "python3 train.py --lr 1"),
                (52, 51, "python3", "python3 train.py --lr 1"),
                (60, 1, "python3", "python3 eval.py"),
                (70, 1, "bash", "bash -c oomguard attach --match train"),
            ],
        );
        let skip = HashSet::from([70]);
        assert_eq!(match_cmdline(p, "train", &skip).unwrap(), 50);
        assert_eq!(match_cmdline(p, r"train\.py", &skip).unwrap(), 51);
        let e = match_cmdline(p, "python3", &skip).unwrap_err().to_string();
        assert!(
            e.contains("2 unrelated")
                && e.contains("51  python3 train.py")
                && e.contains("60  python3 eval.py"),
            "{e}"
        );
        assert!(matches!(
            match_cmdline(p, "nothing-like-this", &skip),
            Err(AttachError::NoMatch(_))
        ));
        assert!(matches!(
            match_cmdline(p, "(", &skip),
            Err(AttachError::BadRegex { .. })
        ));
    }
}
