//! The control channel to the in-process companion (`python/oomguard`):
//! oomguard's end of "checkpoint on request".
//!
//! Every attempt gets a private directory (0700) named in the job's
//! environment as `OOMGUARD_CONTROL`. oomguard writes the `request` file
//! there (atomically: a temporary file renamed over it); the companions of
//! the job's processes append one JSON line per record to `events`
//! (`O_APPEND`, each line one `write` below `PIPE_BUF`). The contract is in
//! docs/design.md ("The control channel"); this module owns the files, the
//! request ids and the parsing, and nothing of what a stop does with them.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The variable naming the control directory in the job's environment.
pub const ENV_CONTROL: &str = "OOMGUARD_CONTROL";
/// Who carries this node's faults to the job's store (see [`Channel::env`]).
pub const ENV_FAULTS: &str = "OOMGUARD_FAULTS";
/// The protocol version both ends write as `v`.
pub const PROTOCOL: u32 = 1;
const REQUEST: &str = "request";
const EVENTS: &str = "events";
const FAULT: &str = "fault";
/// Bytes read from `events` per poll: one poll stays short.
const READ_BUDGET: usize = 1 << 20;
/// A line longer than this is not the companion's: dropped.
const MAX_LINE: usize = 8 << 10;

/// The companion package, embedded so that `oomguard run` puts it on a
/// Python job's path with nothing installed. Every `.py` file of
/// `python/oomguard/` is here but [`WHEEL_ONLY`]'s (a test says so).
pub const PACKAGE: &[(&str, &str)] = &[
    (
        "__init__.py",
        include_str!("../../python/oomguard/__init__.py"),
    ),
    ("_auto.py", include_str!("../../python/oomguard/_auto.py")),
    (
        "lightning.py",
        include_str!("../../python/oomguard/lightning.py"),
    ),
    ("hf.py", include_str!("../../python/oomguard/hf.py")),
    (
        "accelerate.py",
        include_str!("../../python/oomguard/accelerate.py"),
    ),
];

/// Files of `python/oomguard/` that only the wheel carries: `python -m
/// oomguard` and the helper that finds the installed binary. A job's
/// embedded copy has no use for them.
pub const WHEEL_ONLY: &[&str] = &["__main__.py", "_find_bin.py"];

/// Written beside the embedded copy: its version, which is this binary's
/// (Cargo.toml's), read by `oomguard.__version__`.
const EMBEDDED_VERSION: (&str, &str) = (
    "_embedded.py",
    concat!(
        "# Written by the oomguard binary that put this copy on the job's path.\n",
        "VERSION = \"",
        env!("CARGO_PKG_VERSION"),
        "\"\n"
    ),
);

/// Errors of the channel, each naming the path that failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("cannot create the control directory {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot use the job's control directory {path}: {source}")]
    Join {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A request written by another user could not be read by the job's
    /// companion (and writing into another user's directory is not ours
    /// to do).
    #[error(
        "the job's control directory {path} belongs to uid {owner}, not to oomguard's uid {ours}: \
         run oomguard attach as that user"
    )]
    NotOurs {
        path: PathBuf,
        owner: u32,
        ours: u32,
    },
    /// Others may write in it: whatever they put there (a request, a
    /// symlink where oomguard writes) would be taken as ours.
    #[error(
        "the job's control directory {path} has mode {mode:o}: others can write in it, so \
         oomguard does not use it (oomguard run creates it 0700)"
    )]
    Open { path: PathBuf, mode: u32 },
}

/// What oomguard asks of the trainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Save, and go on training.
    Checkpoint,
    /// Save, then leave the training loop.
    CheckpointAndExit,
    /// Free caches (garbage, the C heap, PyTorch's CUDA cache); no save.
    Relieve,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Checkpoint => "checkpoint",
            Kind::CheckpointAndExit => "checkpoint_and_exit",
            Kind::Relieve => "relieve",
        }
    }
}

/// The `request` file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub v: u32,
    /// Unix milliseconds at the request, made strictly increasing: ranks on
    /// several nodes (one oomguard each) compare ids in their vote.
    pub id: u64,
    pub kind: Kind,
    pub reason: String,
    /// What the rule saw ("headroom 26 MiB (6.5%) under the budget ceiling
    /// of 400 MiB"), passed on to the other nodes' oomguards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Unix seconds by which oomguard stops waiting.
    pub deadline: f64,
    /// `restart`: the stop ends in a restart of the whole job, so every
    /// node's oomguard restarts with it (the ranks' rendezvous needs them
    /// all). Absent for a stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then: Option<String>,
    /// The rank behind this node's fastest-growing process, when known:
    /// the other nodes name it as the cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause_rank: Option<u32>,
}

/// A fault of this node for the other nodes: a rank that cannot take part
/// in the job's collectives any more.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fault {
    pub cause_rank: Option<u32>,
    /// Machine-readable: `rank-stopped`, `oom-kill`.
    pub reason: String,
    pub detail: String,
    /// `restart` when this node restarts the job after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub then: Option<String>,
}

/// A fault's reason that is no fault: rank 0, whose process serves the
/// job's store when each rank is a task of its own, ends normally.
pub const STORE_CLOSING: &str = "store-closing";

/// Another node's cause as this node's log and messages say it:
/// `node 1 (rank 3): REASON: DETAIL`.
pub fn remote_cause(node: u32, rank: Option<u32>, reason: &str, detail: Option<&str>) -> String {
    let who = rank.map_or(String::new(), |r| format!(" (rank {r})"));
    let what = detail.map_or(String::new(), |d| format!(": {d}"));
    format!("node {node}{who}: {reason}{what}")
}

/// One line of `events`, as a companion wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// A companion started speaking (once per process).
    Hello {
        pid: u32,
        #[serde(default)]
        rank: u32,
        #[serde(default)]
        framework: String,
        #[serde(default)]
        world: Option<u32>,
        /// Ranks on this node (`LOCAL_WORLD_SIZE`).
        #[serde(default)]
        local_world: Option<u32>,
        /// This rank's index on its node (`LOCAL_RANK`, `SLURM_LOCALID`).
        #[serde(default)]
        local_rank: Option<u32>,
        /// The protocol version the companion speaks (every record's `v`).
        #[serde(default)]
        v: Option<u32>,
        /// Which copy of the companion runs: its package version and the
        /// directory it was imported from (the embedded copy, or one
        /// installed in the job's environment). Absent from older ones.
        #[serde(default)]
        version: Option<String>,
        #[serde(default)]
        path: Option<String>,
        /// The node's index in a job across nodes (torchrun's
        /// `GROUP_RANK`), and its rendezvous store (`host:port`, from
        /// `MASTER_ADDR`/`MASTER_PORT`) that oomguard tells the other
        /// nodes' oomguards through.
        #[serde(default)]
        node: Option<u32>,
        /// `SLURM_PROCID`, when SLURM started this rank as a task of its
        /// own (one oomguard per rank, several on a node); absent under a
        /// launcher.
        #[serde(default)]
        task: Option<u32>,
        #[serde(default)]
        store: Option<String>,
    },
    /// The rank's main thread raised an exception nothing caught (the
    /// rank ends): its type and message.
    Crash {
        pid: u32,
        #[serde(default)]
        rank: u32,
        #[serde(default)]
        error: Option<String>,
    },
    /// The rank's Python is shutting down (a return from the script or
    /// `sys.exit`, after a crash too): a rank that ends without it was
    /// killed by a signal.
    Bye {
        pid: u32,
        #[serde(default)]
        rank: u32,
    },
    /// Where training is (rate-limited by the companion).
    Progress {
        pid: u32,
        #[serde(default)]
        rank: u32,
        step: Option<u64>,
        #[serde(default)]
        epoch: Option<f64>,
        #[serde(default)]
        phase: Option<String>,
        /// When the companion wrote it (Unix seconds, this node's clock):
        /// the record is read at the next tick, up to a second later.
        #[serde(default)]
        t: Option<f64>,
    },
    /// The ranks agreed to serve request `id` at `step`.
    Ack {
        id: u64,
        #[serde(default)]
        rank: u32,
        step: Option<u64>,
    },
    /// Every rank's save finished (written by each node's local rank 0).
    Done {
        id: u64,
        #[serde(default)]
        rank: u32,
        step: Option<u64>,
        #[serde(default)]
        paths: Vec<PathBuf>,
        ok: bool,
        #[serde(default)]
        seconds: f64,
        /// Set by oomguard, not the companion: why a save the companion
        /// called done does not count (`ok` is then false): a path it
        /// named is missing, an empty file, or a directory with no file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        not_counted: Option<String>,
    },
    /// The ranks agreed on another node's request (written by this node's
    /// local rank 0): who asked and why, from the job's rendezvous store.
    Remote {
        id: u64,
        kind: Kind,
        node: u32,
        #[serde(default)]
        step: Option<u64>,
        #[serde(default)]
        cause_rank: Option<u32>,
        #[serde(default)]
        reason: Option<String>,
        #[serde(default)]
        detail: Option<String>,
        /// `restart` when the node that asked restarts the job after.
        #[serde(default)]
        then: Option<String>,
        /// The SLURM task that asked, when each rank is a task of its own
        /// (then `node` is the node it runs on).
        #[serde(default)]
        task: Option<u32>,
    },
    /// Another node's fault (a rank there stopped or killed, so the vote
    /// cannot run), brought from the job's rendezvous store by this node's
    /// local rank 0.
    Fault {
        id: u64,
        node: u32,
        #[serde(default)]
        cause_rank: Option<u32>,
        #[serde(default)]
        reason: Option<String>,
        #[serde(default)]
        detail: Option<String>,
        /// `restart` when that node restarts the job.
        #[serde(default)]
        then: Option<String>,
    },
    /// This node's fault `id` is in the rendezvous store: the other nodes
    /// can learn it.
    FaultPublished { id: u64 },
    /// The job's store (at `addr`, hosted by node 0's launcher under
    /// torchrun) stopped answering while this rank still ran.
    StoreLost {
        #[serde(default)]
        addr: Option<String>,
    },
    /// oomguard's own link to the job's store failed and is trying again
    /// (said once an outage; a store that comes back within the lost
    /// window is no fault).
    StoreUnsteady {
        #[serde(default)]
        addr: Option<String>,
        #[serde(default)]
        reason: String,
    },
    /// A `relieve` request was served: bytes freed by each step.
    Relieved {
        id: u64,
        #[serde(default)]
        rank: u32,
        #[serde(default)]
        freed: std::collections::BTreeMap<String, u64>,
    },
}

/// One attempt's control directory. Removed on drop.
#[derive(Debug)]
pub struct Channel {
    dir: PathBuf,
    events: Option<File>,
    offset: u64,
    partial: Vec<u8>,
    last_id: u64,
    /// Made by this oomguard (removed on drop), or joined.
    owned: bool,
    /// The pid of the companion that last said hello: its view of the
    /// file system is the one the paths it names are in.
    speaker: Option<u32>,
}

impl Channel {
    /// Creates `parent/control-<attempt>` (0700) with an empty `events`.
    pub fn create(parent: &Path, attempt: u32) -> Result<Channel, ChannelError> {
        let dir = parent.join(format!("control-{attempt}"));
        let _ = fs::remove_dir_all(&dir);
        DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| ChannelError::Create {
                path: dir.clone(),
                source,
            })?;
        let events = dir.join(EVENTS);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&events)
            .map_err(|source| ChannelError::Write {
                path: events,
                source,
            })?;
        Ok(Channel {
            dir,
            events: Some(file),
            offset: 0,
            partial: Vec::new(),
            last_id: 0,
            owned: true,
            speaker: None,
        })
    }

    /// Joins the control directory a job was started with (`attach`): its
    /// events are read from the start (the companion's hello included),
    /// `events` is made if the job's starter did not, and the directory is
    /// left in place afterwards. It must be oomguard's user's.
    pub fn join(dir: &Path) -> Result<Channel, ChannelError> {
        use std::os::unix::fs::MetadataExt;
        let join = |source| ChannelError::Join {
            path: dir.to_path_buf(),
            source,
        };
        // Not followed: a symlink in its place is not the directory
        // `oomguard run` made.
        let meta = fs::symlink_metadata(dir).map_err(join)?;
        if !meta.is_dir() {
            return Err(join(io::Error::other("not a directory")));
        }
        let ours = rustix::process::geteuid().as_raw();
        if meta.uid() != ours {
            return Err(ChannelError::NotOurs {
                path: dir.to_path_buf(),
                owner: meta.uid(),
                ours,
            });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(ChannelError::Open {
                path: dir.to_path_buf(),
                mode,
            });
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(EVENTS))
            .map_err(join)?;
        Ok(Channel {
            dir: dir.to_path_buf(),
            events: Some(file),
            offset: 0,
            partial: Vec::new(),
            last_id: 0,
            owned: false,
            speaker: None,
        })
    }

    /// The control directory named in a process's environment
    /// (`/proc/PID/environ`), if it has one.
    pub fn of_process(proc_root: &Path, pid: u32) -> Option<PathBuf> {
        environ_var(proc_root, pid, ENV_CONTROL)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `OOMGUARD_CONTROL=<dir>`, and `OOMGUARD_FAULTS=oomguard`: this
    /// oomguard puts its node's faults in the job's store itself, so the
    /// companion need not (one older than the store link still does).
    pub fn env(&self) -> [(std::ffi::OsString, std::ffi::OsString); 2] {
        [
            (ENV_CONTROL.into(), self.dir.as_os_str().to_owned()),
            (ENV_FAULTS.into(), "oomguard".into()),
        ]
    }

    /// Writes a request (replacing any earlier one) and returns its id.
    pub fn request(
        &mut self,
        kind: Kind,
        reason: &str,
        detail: Option<&str>,
        wait: Duration,
    ) -> Result<u64, ChannelError> {
        self.request_then(kind, reason, detail, wait, false, None)
    }

    /// [`Channel::request`] for a stop that ends in a restart of the whole
    /// job when `restart` (every node's oomguard restarts with it), naming
    /// the rank that grew fastest (`cause_rank`) for the other nodes.
    pub fn request_then(
        &mut self,
        kind: Kind,
        reason: &str,
        detail: Option<&str>,
        wait: Duration,
        restart: bool,
        cause_rank: Option<u32>,
    ) -> Result<u64, ChannelError> {
        let _lock = self.lock()?;
        self.write_request(kind, reason, detail, wait, restart, cause_rank)
    }

    /// A request of `kind` unless `pending` (asked under the lock that
    /// every writer of requests takes, so nothing is written between the
    /// question and the write) names a request still being served: then
    /// that one's `Err((id, seconds left))`. `oomguard checkpoint` asks
    /// this way, so it never replaces a stop the supervisor wrote.
    pub fn request_unless_pending(
        &mut self,
        kind: Kind,
        reason: &str,
        wait: Duration,
        pending: impl FnOnce(&Path) -> Option<(u64, f64)>,
    ) -> Result<Result<u64, (u64, f64)>, ChannelError> {
        let _lock = self.lock()?;
        if let Some(busy) = pending(&self.dir) {
            return Ok(Err(busy));
        }
        self.write_request(kind, reason, None, wait, false, None)
            .map(Ok)
    }

    /// The lock every writer of `request` holds while it decides and
    /// writes: `.lock` in the directory, released when dropped.
    fn lock(&self) -> Result<File, ChannelError> {
        let path = self.dir.join(".lock");
        let err = |source| ChannelError::Write {
            path: path.clone(),
            source,
        };
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(err)?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| err(e.into()))?;
        Ok(f)
    }

    fn write_request(
        &mut self,
        kind: Kind,
        reason: &str,
        detail: Option<&str>,
        wait: Duration,
        restart: bool,
        cause_rank: Option<u32>,
    ) -> Result<u64, ChannelError> {
        let id = self.next_id();
        let req = Request {
            v: PROTOCOL,
            id,
            kind,
            reason: reason.to_string(),
            detail: detail.map(str::to_string),
            deadline: super::clock::unix_seconds() + wait.as_secs_f64(),
            then: restart.then(|| "restart".to_string()),
            cause_rank,
        };
        self.replace(REQUEST, &serde_json::to_vec(&req).unwrap_or_default())?;
        Ok(id)
    }

    /// Writes this node's fault for the companion to put in the job's
    /// rendezvous store (replacing any earlier one); returns its id. The
    /// companion answers [`Record::FaultPublished`] once it is there.
    pub fn fault(&mut self, fault: &Fault) -> Result<u64, ChannelError> {
        let id = self.next_id();
        let mut body = serde_json::to_value(fault).unwrap_or_default();
        body["id"] = id.into();
        body["v"] = PROTOCOL.into();
        self.replace(FAULT, &serde_json::to_vec(&body).unwrap_or_default())?;
        Ok(id)
    }

    /// A new id for a fault that goes to the other nodes another way.
    pub fn fault_id(&mut self) -> u64 {
        self.next_id()
    }

    /// Ids grow with the clock (a restarted oomguard's requests stay newer
    /// than its last run's) and never repeat.
    fn next_id(&mut self) -> u64 {
        let millis = (super::clock::unix_seconds() * 1000.0) as u64;
        let id = millis.max(self.last_id + 1);
        self.last_id = id;
        id
    }

    /// Replaces `name` atomically: a temporary file renamed over it, so the
    /// companion never reads half a file. The temporary file is new, never
    /// one that was there (a leftover is unlinked, a symlink not followed).
    fn replace(&self, name: &str, text: &[u8]) -> Result<(), ChannelError> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let _ = fs::remove_file(&tmp);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| f.write_all(text))
            .and_then(|()| fs::rename(&tmp, self.dir.join(name)));
        written.map_err(|source| ChannelError::Write { path: tmp, source })
    }

    /// The records appended since the last poll (complete lines only; a
    /// line that is not a record is skipped).
    pub fn poll(&mut self) -> Vec<Record> {
        let Some(f) = self.events.as_mut() else {
            return Vec::new();
        };
        let Ok(len) = f.metadata().map(|m| m.len()) else {
            return Vec::new();
        };
        if len <= self.offset {
            return Vec::new();
        }
        let want = ((len - self.offset) as usize).min(READ_BUDGET);
        let mut buf = vec![0; want];
        let read = f
            .seek(SeekFrom::Start(self.offset))
            .and_then(|_| f.read(&mut buf));
        let Ok(n) = read else {
            return Vec::new();
        };
        self.offset += n as u64;
        self.partial.extend_from_slice(&buf[..n]);
        let mut out = Vec::new();
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            if let Ok(mut r) = serde_json::from_slice::<Record>(&line) {
                match &mut r {
                    Record::Hello { pid, .. } => self.speaker = Some(*pid),
                    Record::Done {
                        ok: ok @ true,
                        paths,
                        not_counted,
                        ..
                    } => {
                        if let Some(why) = paths.iter().find_map(|p| unusable(p, self.speaker)) {
                            *ok = false;
                            *not_counted = Some(why);
                        }
                    }
                    _ => {}
                }
                out.push(r);
            }
        }
        if self.partial.len() > MAX_LINE {
            self.partial.clear();
        }
        out
    }
}

/// `name`'s value in process `pid`'s environment (`/proc/PID/environ`).
pub fn environ_var(proc_root: &Path, pid: u32, name: &str) -> Option<std::ffi::OsString> {
    let environ = fs::read(proc_root.join(pid.to_string()).join("environ")).ok()?;
    let key = format!("{name}=");
    environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(key.as_bytes()))
        .map(|v| std::ffi::OsStr::from_bytes(v).to_owned())
}

/// Why a path a companion named as saved cannot be a save: missing, an
/// empty file, or a directory with no file in it (a write cut short, a
/// volume detached: the next run would load it). The job may see another
/// file system (a container's), so a path missing here is looked for
/// through the companion's own root too.
fn unusable(path: &Path, speaker: Option<u32>) -> Option<String> {
    let theirs = speaker.map(|pid| {
        Path::new("/proc")
            .join(pid.to_string())
            .join("root")
            .join(path.strip_prefix("/").unwrap_or(path))
    });
    let seen = match (path.exists(), theirs) {
        (true, _) => path.to_path_buf(),
        (false, Some(t)) if t.exists() => t,
        _ => return Some(format!("{} is missing", path.display())),
    };
    let meta = fs::metadata(&seen).ok()?;
    if meta.is_file() && meta.len() == 0 {
        return Some(format!("{} is empty", path.display()));
    }
    if meta.is_dir() && !holds_a_file(&seen, 4) {
        return Some(format!("{} holds no file", path.display()));
    }
    None
}

/// Whether `dir`, or a directory under it down to `depth` levels, holds a
/// file that is not empty.
fn holds_a_file(dir: &Path, depth: u32) -> bool {
    let Ok(rd) = fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| match e.metadata() {
        Ok(m) if m.is_file() => m.len() > 0,
        Ok(m) if m.is_dir() && depth > 0 => holds_a_file(&e.path(), depth - 1),
        _ => false,
    })
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.events = None;
        if self.owned {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Writes the companion package into `dir/companion/oomguard/`.
pub fn write_package(dir: &Path) -> io::Result<()> {
    let pkg = dir.join("companion").join("oomguard");
    fs::create_dir_all(&pkg)?;
    for (name, text) in PACKAGE.iter().chain([&EMBEDDED_VERSION]) {
        fs::write(pkg.join(name), text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joined_channel_is_found_in_the_environ_read_from_the_start_and_left_in_place() {
        let t = tempfile::tempdir().unwrap();
        let proc_root = t.path().join("proc");
        fs::create_dir_all(proc_root.join("42")).unwrap();
        let control = t.path().join("ctl");
        DirBuilder::new().mode(0o700).create(&control).unwrap();
        let environ = format!("A=1\0OOMGUARD_CONTROL={}\0B=2\0", control.display());
        fs::write(proc_root.join("42/environ"), environ).unwrap();
        fs::write(proc_root.join("43"), "").unwrap();
        assert_eq!(Channel::of_process(&proc_root, 42), Some(control.clone()));
        assert_eq!(Channel::of_process(&proc_root, 43), None);
        assert_eq!(Channel::of_process(&proc_root, 44), None);
        // A hello written before oomguard joined is read.
        fs::write(
            control.join(EVENTS),
            "{\"type\":\"hello\",\"v\":1,\"pid\":7}\n",
        )
        .unwrap();
        let mut ch = Channel::join(&control).unwrap();
        assert!(matches!(ch.poll().as_slice(), [Record::Hello { .. }]));
        ch.request(Kind::CheckpointAndExit, "r", None, Duration::from_secs(1))
            .unwrap();
        drop(ch);
        assert!(
            control.join(REQUEST).exists(),
            "a joined directory is not ours to remove"
        );
        // `events` is made when the starter did not.
        let bare = t.path().join("bare");
        DirBuilder::new().mode(0o755).create(&bare).unwrap();
        drop(Channel::join(&bare).unwrap());
        assert!(bare.join(EVENTS).exists());
        assert!(matches!(
            Channel::join(&t.path().join("missing")),
            Err(ChannelError::Join { .. })
        ));
    }

    #[test]
    fn a_directory_others_can_write_in_or_a_symlink_is_not_joined() {
        use std::os::unix::fs::PermissionsExt as _;
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = Channel::join(&open).err().unwrap();
        assert!(matches!(e, ChannelError::Open { mode: 0o777, .. }), "{e}");
        assert!(e.to_string().contains("has mode 777"), "{e}");
        assert!(!open.join(EVENTS).exists(), "nothing is written there");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o770)).unwrap();
        assert!(matches!(
            Channel::join(&open),
            Err(ChannelError::Open { .. })
        ));
        let link = t.path().join("link");
        let mine = t.path().join("mine");
        DirBuilder::new().mode(0o700).create(&mine).unwrap();
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        assert!(matches!(
            Channel::join(&link),
            Err(ChannelError::Join { .. })
        ));
        assert!(!mine.join(EVENTS).exists());
    }

    #[test]
    fn a_planted_temporary_file_or_symlink_is_never_written_through() {
        let t = tempfile::tempdir().unwrap();
        let mut c = Channel::create(t.path(), 1).unwrap();
        let victim = t.path().join("victim");
        fs::write(&victim, "untouched").unwrap();
        let tmp = c.dir().join(format!(".{REQUEST}.tmp"));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        c.request(Kind::Checkpoint, "r", None, Duration::from_secs(5))
            .unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "untouched");
        let req: Request =
            serde_json::from_slice(&fs::read(c.dir().join(REQUEST)).unwrap()).unwrap();
        assert_eq!(req.reason, "r");
        // A leftover regular file (a write cut short) is replaced too.
        fs::write(&tmp, "half").unwrap();
        c.request(Kind::Checkpoint, "again", None, Duration::from_secs(5))
            .unwrap();
        assert!(!tmp.exists());
    }

    /// `oomguard checkpoint` against the supervisor's own stop: the stop
    /// written while checkpoint is between its question and its write
    /// waits for the write, and comes after it: the stop wins.
    #[test]
    fn a_stop_written_while_checkpoint_decides_comes_after_it() {
        let t = tempfile::tempdir().unwrap();
        let mut sup = Channel::create(t.path(), 1).unwrap();
        let dir = sup.dir().to_path_buf();
        let mut asker = Channel::join(&dir).unwrap();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let stop = std::thread::spawn(move || {
            wait.recv().unwrap();
            sup.request(
                Kind::CheckpointAndExit,
                "critical",
                None,
                Duration::from_secs(60),
            )
            .unwrap();
            // Owned: the directory goes with it.
            sup
        });
        let asked = asker
            .request_unless_pending(
                Kind::Checkpoint,
                "oomguard checkpoint",
                Duration::from_secs(60),
                |_| {
                    go.send(()).unwrap();
                    // The supervisor's write, if nothing held it back, would
                    // land now, and be replaced by the checkpoint below.
                    std::thread::sleep(Duration::from_millis(300));
                    None
                },
            )
            .unwrap();
        assert!(asked.is_ok());
        let _sup = stop.join().unwrap();
        let req: Request = serde_json::from_slice(&fs::read(dir.join(REQUEST)).unwrap()).unwrap();
        assert_eq!(
            req.kind,
            Kind::CheckpointAndExit,
            "the stop was lost: {req:?}"
        );
        // Asked again while the stop is pending: refused, nothing written.
        let again = asker
            .request_unless_pending(
                Kind::Checkpoint,
                "oomguard checkpoint",
                Duration::from_secs(60),
                |_| Some((req.id, 59.0)),
            )
            .unwrap();
        assert_eq!(again, Err((req.id, 59.0)));
        let still: Request = serde_json::from_slice(&fs::read(dir.join(REQUEST)).unwrap()).unwrap();
        assert_eq!(still.id, req.id);
    }

    #[test]
    fn a_save_whose_path_is_missing_empty_or_a_directory_without_files_does_not_count() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::write(d.join("empty.pt"), "").unwrap();
        fs::write(d.join("good.pt"), "weights").unwrap();
        fs::create_dir_all(d.join("checkpoint-12/sub")).unwrap();
        fs::create_dir_all(d.join("checkpoint-13/sub")).unwrap();
        fs::write(d.join("checkpoint-13/sub/model.safetensors"), "w").unwrap();
        let mut c = Channel::create(d, 1).unwrap();
        let mut events = OpenOptions::new()
            .append(true)
            .open(c.dir().join(EVENTS))
            .unwrap();
        let said = |path: &str| {
            format!(
                "{{\"type\":\"done\",\"id\":1,\"step\":12,\"paths\":[\"{}\"],\"ok\":true}}\n",
                d.join(path).display()
            )
        };
        for (path, counts) in [
            ("missing.pt", false),
            ("empty.pt", false),
            ("checkpoint-12", false),
            ("good.pt", true),
            ("checkpoint-13", true),
        ] {
            events.write_all(said(path).as_bytes()).unwrap();
            let got = c.poll();
            let [
                Record::Done {
                    ok, not_counted, ..
                },
            ] = got.as_slice()
            else {
                panic!("{got:?}")
            };
            assert_eq!(*ok, counts, "{path}: {not_counted:?}");
            assert_eq!(not_counted.is_none(), counts, "{path}");
        }
        // A companion that said `ok: false` is left as it said.
        events
            .write_all(br#"{"type":"done","id":2,"step":3,"paths":[],"ok":false}"#)
            .unwrap();
        events.write_all(b"\n").unwrap();
        assert!(matches!(
            c.poll().as_slice(),
            [Record::Done {
                ok: false,
                not_counted: None,
                ..
            }]
        ));
    }

    #[test]
    fn a_request_is_replaced_whole_and_ids_increase() {
        let t = tempfile::tempdir().unwrap();
        let mut c = Channel::create(t.path(), 1).unwrap();
        let a = c
            .request(Kind::Checkpoint, "r1", None, Duration::from_secs(5))
            .unwrap();
        let b = c
            .request(
                Kind::CheckpointAndExit,
                "r2",
                Some("d"),
                Duration::from_secs(5),
            )
            .unwrap();
        assert!(b > a);
        let req: Request =
            serde_json::from_slice(&fs::read(c.dir().join(REQUEST)).unwrap()).unwrap();
        assert_eq!(req.id, b);
        assert_eq!(req.kind, Kind::CheckpointAndExit);
        assert_eq!(req.reason, "r2");
        assert_eq!(req.detail.as_deref(), Some("d"));
        let mode = fs::metadata(c.dir()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn records_are_read_line_by_line_across_partial_writes() {
        let t = tempfile::tempdir().unwrap();
        let mut c = Channel::create(t.path(), 2).unwrap();
        let path = c.dir().join(EVENTS);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"type":"hello","pid":7,"rank":0,"framework":"plain"}"#)
            .unwrap();
        f.write_all(b"\nnot json\n{\"type\":\"done\",\"id\":3,\"step\":12,")
            .unwrap();
        let first = c.poll();
        assert_eq!(first.len(), 1);
        assert!(matches!(first[0], Record::Hello { pid: 7, .. }));
        f.write_all(br#""paths":["/x/ckpt"],"ok":true,"seconds":0.5}"#)
            .unwrap();
        f.write_all(b"\n").unwrap();
        let second = c.poll();
        assert_eq!(
            second,
            vec![Record::Done {
                id: 3,
                rank: 0,
                step: Some(12),
                paths: vec![PathBuf::from("/x/ckpt")],
                // No such file: the save does not count.
                ok: false,
                seconds: 0.5,
                not_counted: Some("/x/ckpt is missing".into()),
            }]
        );
        assert!(c.poll().is_empty());
    }

    #[test]
    fn the_directory_goes_with_the_channel() {
        let t = tempfile::tempdir().unwrap();
        let c = Channel::create(t.path(), 1).unwrap();
        let dir = c.dir().to_path_buf();
        assert!(dir.is_dir());
        drop(c);
        assert!(!dir.exists());
    }

    /// `python/oomguard/` at test time, so a file added there and not to
    /// [`PACKAGE`] (or [`WHEEL_ONLY`]) fails this.
    fn package_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("python/oomguard")
    }

    #[test]
    fn the_embedded_copy_is_every_py_file_of_the_package_but_the_wheels_own() {
        let mut on_disk: Vec<String> = fs::read_dir(package_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".py"))
            .collect();
        on_disk.sort();
        for name in &on_disk {
            let embedded = PACKAGE.iter().find(|(n, _)| n == name);
            if WHEEL_ONLY.contains(&name.as_str()) {
                assert!(embedded.is_none(), "{name} is wheel-only and embedded");
                continue;
            }
            let (_, text) = embedded.unwrap_or_else(|| {
                panic!(
                    "python/oomguard/{name} is not in companion::PACKAGE: embed it \
                     (include_str!) or list it in WHEEL_ONLY"
                )
            });
            let file = fs::read_to_string(package_dir().join(name)).unwrap();
            assert!(*text == file, "the embedded {name} differs from the file");
        }
        for (name, _) in PACKAGE {
            assert!(on_disk.iter().any(|n| n == name), "{name} left the package");
        }
        for name in WHEEL_ONLY {
            assert!(on_disk.iter().any(|n| n == name), "{name} left the package");
        }
        assert!(
            !on_disk.iter().any(|n| *n == EMBEDDED_VERSION.0),
            "{} is written by write_package, not kept in the package",
            EMBEDDED_VERSION.0
        );
    }

    /// `NAME = "text"` and `NAME = 123` lines at the top level of a module.
    fn python_constants(text: &str) -> std::collections::BTreeMap<String, String> {
        let re = regex::Regex::new(r#"(?m)^([A-Z_][A-Z0-9_]*) = (?:"([^"]*)"|(\d+))\s*(?:#.*)?$"#)
            .unwrap();
        re.captures_iter(text)
            .map(|c| {
                let value = c.get(2).or_else(|| c.get(3)).unwrap().as_str();
                (c[1].to_string(), value.to_string())
            })
            .collect()
    }

    fn embedded(name: &str) -> &'static str {
        PACKAGE.iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn the_companions_protocol_constants_are_these() {
        let init = embedded("__init__.py");
        let py = python_constants(init);
        let rust = [
            ("ENV_CONTROL", ENV_CONTROL.to_string()),
            ("PROTOCOL", PROTOCOL.to_string()),
            ("REQUEST", REQUEST.to_string()),
            ("EVENTS", EVENTS.to_string()),
            ("FAULT", FAULT.to_string()),
        ];
        for (name, value) in rust {
            assert_eq!(
                py.get(name),
                Some(&value),
                "python/oomguard/__init__.py's {name} disagrees with src/vocab/companion.rs"
            );
        }
        // The caps differ on purpose: the companion writes each record in
        // one write below PIPE_BUF (4096), so lines of ranks never mix;
        // oomguard reads lines up to MAX_LINE, with room to spare.
        let py_max: usize = py["_MAX_LINE"].parse().unwrap();
        assert!(py_max < 4096, "_MAX_LINE {py_max} is not below PIPE_BUF");
        const { assert!(MAX_LINE > 4096) };

        // Record types: what the companion writes is what oomguard reads.
        let written: std::collections::BTreeSet<String> =
            regex::Regex::new(r#""type": "([a-z_]+)""#)
                .unwrap()
                .captures_iter(init)
                .map(|c| c[1].to_string())
                .collect();
        let err = serde_json::from_str::<Record>(r#"{"type":"no such record"}"#)
            .unwrap_err()
            .to_string();
        let read: std::collections::BTreeSet<String> = regex::Regex::new(r"`([a-z_]+)`")
            .unwrap()
            .captures_iter(err.split("expected").nth(1).unwrap())
            .map(|c| c[1].to_string())
            .collect();
        // `store_unsteady` is oomguard's own (its store link's), never
        // the companion's.
        let read: std::collections::BTreeSet<String> =
            read.into_iter().filter(|t| t != "store_unsteady").collect();
        assert_eq!(written, read, "record types: Python's vs Record's");

        // Request kinds, and the request's and the fault's fields the
        // companion reads.
        for kind in [Kind::Checkpoint, Kind::CheckpointAndExit, Kind::Relieve] {
            assert!(init.contains(&format!("\"{}\"", kind.name())), "{kind:?}");
        }
        let request = serde_json::to_value(Request {
            v: PROTOCOL,
            id: 1,
            kind: Kind::Checkpoint,
            reason: "r".into(),
            detail: Some("d".into()),
            deadline: 1.0,
            then: Some("restart".into()),
            cause_rank: Some(0),
        })
        .unwrap();
        let read_fields = regex::Regex::new(r#"\breq(?:\.get\(|\[)"([a-z_]+)""#).unwrap();
        let mut n = 0;
        for c in read_fields.captures_iter(init) {
            n += 1;
            assert!(request.get(&c[1]).is_some(), "request field {}", &c[1]);
        }
        assert!(n >= 6, "the request reader moved: {n} fields found");
        let mut fault = serde_json::to_value(Fault {
            cause_rank: Some(0),
            reason: "r".into(),
            detail: "d".into(),
            then: Some("restart".into()),
        })
        .unwrap();
        fault["id"] = 1.into();
        let fault_fields = regex::Regex::new(r#"for k in \(([^)]*)\)"#).unwrap();
        let carried = fault_fields.captures(init).unwrap();
        for field in regex::Regex::new(r#""([a-z_]+)""#)
            .unwrap()
            .captures_iter(&carried[1])
        {
            assert!(fault.get(&field[1]).is_some(), "fault field {}", &field[1]);
        }
    }

    /// Runs `python3 -c CODE` with `PYTHONPATH`; None when there is no
    /// python3 (outside CI).
    fn python(pythonpath: &Path, code: &str) -> Option<String> {
        let out = match std::process::Command::new("python3")
            .arg("-c")
            .arg(code)
            .env("PYTHONPATH", pythonpath)
            .env_remove(ENV_CONTROL)
            .output()
        {
            Ok(out) => out,
            Err(e) if !crate::settings::in_ci() => {
                eprintln!("skipped: no python3 ({e})");
                return None;
            }
            Err(e) => panic!("python3: {e}"),
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    #[test]
    fn every_copy_of_the_companion_says_cargo_tomls_version() {
        let t = tempfile::tempdir().unwrap();
        write_package(t.path()).unwrap();
        let code = "import oomguard; print(oomguard.__version__)";
        let Some(embedded) = python(&t.path().join("companion"), code) else {
            return;
        };
        assert_eq!(embedded, env!("CARGO_PKG_VERSION"), "the embedded copy");
        let checkout = python(&package_dir().join(".."), code).unwrap();
        assert_eq!(checkout, env!("CARGO_PKG_VERSION"), "python/ of a checkout");
        // The wheel's comes from its metadata, which maturin takes from
        // Cargo.toml (`dynamic = ["version"]`); .ci/run compares it with
        // `oomguard --version` of the installed wheel.
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let pyproject = fs::read_to_string(root.join("pyproject.toml")).unwrap();
        assert!(pyproject.contains("dynamic = [\"version\"]"));
        assert!(!pyproject.lines().any(|l| l.starts_with("version")));
    }

    #[test]
    fn one_python_floor_for_the_wheel_and_the_start_up_hook() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let pyproject = fs::read_to_string(root.join("pyproject.toml")).unwrap();
        let floor = regex::Regex::new(r#"(?m)^requires-python = ">=3\.(\d+)"$"#)
            .unwrap()
            .captures(&pyproject)
            .unwrap()[1]
            .to_string();
        let hook = include_str!("../job/torch_reporter.py");
        assert!(
            hook.contains(&format!("\n_OOMGUARD_MIN_PYTHON = (3, {floor})\n")),
            "src/job/torch_reporter.py's floor is not pyproject.toml's 3.{floor}"
        );
    }
}
