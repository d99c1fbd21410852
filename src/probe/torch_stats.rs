//! PyTorch caching-allocator statistics reported from inside the job
//! (`--torch-stats`). This module owns both ends:
//!
//! - [`TorchStatsInjector`] writes the Python reporter (`torch_reporter.py`,
//!   embedded in the binary) as `sitecustomize.py` into a private temporary
//!   directory and says which environment variables put it into the job:
//!   that directory first on `PYTHONPATH`, [`ENV_STATS_PATH`] and
//!   [`ENV_INTERVAL`]. The same directory and hook carry the checkpoint
//!   companion (`crate::companion`): one injected start-up hook for both,
//!   and the injector exists without `--torch-stats` when only the
//!   companion is wanted.
//! - [`TorchStatsReader`] follows the file the reporters append to, one JSON
//!   line per report, and keeps the latest report of each pid.
//!
//! NVML sees what the CUDA driver handed out; these figures say what PyTorch
//! does with it, and reserved − allocated is the fragmentation that makes a
//! CUDA OOM strike while memory looks free.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

/// Environment variable naming the file (or FIFO) reporters append to.
pub const ENV_STATS_PATH: &str = "OOMGUARD_TORCH_STATS";

/// Environment variable with the report interval in seconds (a decimal; the
/// reporter clamps it to 0.05–3600 and falls back to 1 when unreadable).
pub const ENV_INTERVAL: &str = "OOMGUARD_TORCH_STATS_INTERVAL";

/// The reporter's source, written into the job as `sitecustomize.py`.
pub const REPORTER_SOURCE: &str = include_str!("torch_reporter.py");

/// Name of the reporter file in the injector's directory.
const SITECUSTOMIZE: &str = "sitecustomize.py";

/// Name of the default stats file in the injector's directory.
const STATS_FILE: &str = "torch-stats.ndjson";

/// Bytes read from the stats file per [`TorchStatsReader::poll`], so one call
/// stays short even after a long pause.
const READ_BUDGET: usize = 4 << 20;

/// A line without a newline longer than this is garbage: it is dropped up
/// to its next newline. Real reports are below PIPE_BUF (4096 bytes).
const MAX_LINE: usize = 64 << 10;

/// Once this much has been read and consumed, the reader empties the stats
/// file so a long run does not fill the temporary directory. Writers append
/// with `O_APPEND` and continue at the new end.
const TRUNCATE_AT: u64 = 4 << 20;

/// Errors of the `--torch-stats` plumbing, each naming the path that failed.
#[derive(Debug, thiserror::Error)]
pub enum TorchStatsError {
    /// The private directory for `sitecustomize.py` could not be created.
    #[error("cannot create the torch-stats directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A file of the injector could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The path cannot be put on `PYTHONPATH`, whose separator is `:`.
    #[error("{path} contains ':' and cannot be put on PYTHONPATH")]
    ColonInPath {
        /// The offending directory.
        path: PathBuf,
    },
    /// The stats file could not be opened.
    #[error("cannot open the torch-stats file {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The stats file could not be read.
    #[error("cannot read the torch-stats file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

pub use crate::model::TorchDeviceStats;

/// Sum of [`TorchDeviceStats::fragmentation_bytes`] over devices.
pub fn total_fragmentation_bytes(devices: &[TorchDeviceStats]) -> u64 {
    devices
        .iter()
        .map(TorchDeviceStats::fragmentation_bytes)
        .fold(0, u64::saturating_add)
}

/// Puts the reporter into a job: owns a private temporary directory holding
/// `sitecustomize.py` (and, by default, the stats file), removed on drop.
///
/// The directory is made `0700`: the job must run as the same user as
/// oomguard. Python run with `-S` or `-I` ignores `sitecustomize` or
/// `PYTHONPATH` and is simply not observed.
#[derive(Debug)]
pub struct TorchStatsInjector {
    dir: PathBuf,
    stats_path: PathBuf,
    interval: Duration,
    /// `--torch-stats`: the reporter's variables go into the job. Without
    /// it the directory only carries the start-up hook and the companion.
    stats: bool,
}

impl TorchStatsInjector {
    /// Creates the directory under the system temporary directory, with the
    /// stats file inside it.
    pub fn new(interval: Duration) -> Result<Self, TorchStatsError> {
        Self::new_in(&std::env::temp_dir(), interval, None)
    }

    /// Creates the directory under `parent`. `stats_path` names the file or
    /// FIFO reporters append to; `None` puts a fresh file in the directory.
    /// A named path that does not exist is created as a regular file.
    pub fn new_in(
        parent: &Path,
        interval: Duration,
        stats_path: Option<PathBuf>,
    ) -> Result<Self, TorchStatsError> {
        // The job may change directory: everything it is told must be absolute.
        let parent = std::path::absolute(parent).map_err(|source| TorchStatsError::CreateDir {
            path: parent.to_path_buf(),
            source,
        })?;
        let dir = create_private_dir(&parent)?;
        // From here on, dropping `injector` removes the directory on error.
        let mut injector = Self {
            stats_path: dir.join(STATS_FILE),
            dir,
            interval,
            stats: true,
        };
        if injector.dir.as_os_str().as_bytes().contains(&b':') {
            return Err(TorchStatsError::ColonInPath {
                path: injector.dir.clone(),
            });
        }
        let script = injector.dir.join(SITECUSTOMIZE);
        write_new(&script, REPORTER_SOURCE.as_bytes(), 0o644)?;
        crate::companion::write_package(&injector.dir).map_err(|source| {
            TorchStatsError::Write {
                path: injector.dir.join("companion"),
                source,
            }
        })?;
        match stats_path {
            None => write_new(&injector.stats_path, b"", 0o600)?,
            Some(path) => {
                let path = std::path::absolute(&path)
                    .map_err(|source| TorchStatsError::Write { path, source })?;
                if !path.exists() {
                    write_new(&path, b"", 0o600)?;
                }
                injector.stats_path = path;
            }
        }
        Ok(injector)
    }

    /// Only the start-up hook and the companion: no allocator reports.
    pub fn without_stats(mut self) -> Self {
        self.stats = false;
        self
    }

    /// Whether the allocator reporter is on (`--torch-stats`).
    pub fn stats(&self) -> bool {
        self.stats
    }

    /// The private directory (first on the job's `PYTHONPATH`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where reporters append their lines.
    pub fn stats_path(&self) -> &Path {
        &self.stats_path
    }

    /// The report interval given to the job.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The variables to set in the job's environment. `existing_pythonpath`
    /// is the `PYTHONPATH` the job would otherwise get: the directory is put
    /// in front of it. An empty one is not kept, since a trailing empty entry
    /// would add the current directory to `sys.path`.
    pub fn env(&self, existing_pythonpath: Option<&OsStr>) -> Vec<(OsString, OsString)> {
        let mut pythonpath = OsString::from(self.dir.as_os_str());
        if let Some(existing) = existing_pythonpath
            && !existing.is_empty()
        {
            pythonpath.push(":");
            pythonpath.push(existing);
        }
        let mut env = vec![(OsString::from("PYTHONPATH"), pythonpath)];
        if self.stats {
            env.push((
                OsString::from(ENV_STATS_PATH),
                OsString::from(self.stats_path.as_os_str()),
            ));
            env.push((
                OsString::from(ENV_INTERVAL),
                OsString::from(format!("{:.3}", self.interval.as_secs_f64())),
            ));
        }
        env
    }

    /// A reader following this injector's stats path.
    pub fn reader(&self) -> Result<TorchStatsReader, TorchStatsError> {
        TorchStatsReader::open(&self.stats_path)
    }
}

impl Drop for TorchStatsInjector {
    fn drop(&mut self) {
        // Best effort: a leftover directory in /tmp is harmless, and a
        // destructor has no one to report to.
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Creates `parent/oomguard-torch-<pid>-<n>` with mode 0700, exclusively.
fn create_private_dir(parent: &Path) -> Result<PathBuf, TorchStatsError> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let pid = std::process::id();
    let mut last_error = None;
    for attempt in 0..64u32 {
        let dir = parent.join(format!("oomguard-torch-{pid}-{nanos:08x}{attempt:02x}"));
        match DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => last_error = Some(e),
            Err(source) => return Err(TorchStatsError::CreateDir { path: dir, source }),
        }
    }
    Err(TorchStatsError::CreateDir {
        path: parent.to_path_buf(),
        source: last_error.unwrap_or_else(|| io::Error::from(ErrorKind::AlreadyExists)),
    })
}

fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), TorchStatsError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(contents))
        .map_err(|source| TorchStatsError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// One line as the reporter writes it. Unknown fields are ignored so the
/// reporter can grow.
#[derive(Debug, Deserialize)]
struct ReportLine {
    pid: u32,
    #[serde(default)]
    seq: u64,
    #[serde(default)]
    part: u32,
    #[serde(default)]
    t: Option<f64>,
    devices: Vec<TorchDeviceStats>,
}

#[derive(Debug, Clone, Copy)]
struct ReportMeta {
    seq: u64,
    t: Option<f64>,
}

/// Follows the stats file incrementally and keeps the latest report of each
/// pid. Never blocks: a regular file is read to its current end, a FIFO is
/// opened non-blocking. A partial last line waits for its end; lines that
/// are not reports are counted and skipped.
#[derive(Debug)]
pub struct TorchStatsReader {
    path: PathBuf,
    file: File,
    /// Regular file opened read-write: the reader may empty it.
    can_truncate: bool,
    is_fifo: bool,
    offset: u64,
    partial: Vec<u8>,
    /// Inside an over-long line: drop bytes up to the next newline.
    discarding: bool,
    latest: HashMap<u32, Vec<TorchDeviceStats>>,
    meta: HashMap<u32, ReportMeta>,
    skipped: u64,
}

impl TorchStatsReader {
    /// Opens `path` (a regular file or a FIFO) for incremental reading.
    pub fn open(path: &Path) -> Result<Self, TorchStatsError> {
        let open_error = |source| TorchStatsError::Open {
            path: path.to_path_buf(),
            source,
        };
        let is_fifo = fs::metadata(path)
            .map_err(open_error)?
            .file_type()
            .is_fifo();
        let read_only = || {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
        };
        let (file, can_truncate) = if is_fifo {
            (read_only().map_err(open_error)?, false)
        } else {
            match OpenOptions::new().read(true).write(true).open(path) {
                Ok(file) => (file, true),
                Err(_) => (read_only().map_err(open_error)?, false),
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            file,
            can_truncate,
            is_fifo,
            offset: 0,
            partial: Vec::new(),
            discarding: false,
            latest: HashMap::new(),
            meta: HashMap::new(),
            skipped: 0,
        })
    }

    /// Reads whatever was appended since the last call and applies complete
    /// lines. Returns how many report lines were applied.
    pub fn poll(&mut self) -> Result<usize, TorchStatsError> {
        if !self.is_fifo {
            self.follow_truncation()?;
        }
        let mut applied = 0;
        let mut budget = READ_BUDGET;
        let mut buf = vec![0u8; 64 << 10];
        while budget > 0 {
            let want = buf.len().min(budget);
            let n = match self.file.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(source) => {
                    return Err(TorchStatsError::Read {
                        path: self.path.clone(),
                        source,
                    });
                }
            };
            budget -= n;
            self.offset += n as u64;
            applied += self.consume(&buf[..n]);
        }
        if self.can_truncate && self.partial.is_empty() && self.offset >= TRUNCATE_AT {
            // A line a reporter appends between our last read and this
            // truncation is lost; the next one comes an interval later.
            if self.file.set_len(0).is_ok() {
                self.rewind()?;
            }
        }
        Ok(applied)
    }

    /// The latest report of every pid: its devices, sorted by index. A
    /// process with CUDA initialised but nothing allocated has an empty list.
    pub fn latest(&self) -> &HashMap<u32, Vec<TorchDeviceStats>> {
        &self.latest
    }

    /// When `pid` last reported (the reporter's clock, seconds since the
    /// Unix epoch), if it did.
    pub fn reported_at(&self, pid: u32) -> Option<f64> {
        self.meta.get(&pid).and_then(|m| m.t)
    }

    /// Forgets every pid for which `keep` is false (processes that left the
    /// tree; pids get reused).
    pub fn retain_pids(&mut self, mut keep: impl FnMut(u32) -> bool) {
        self.latest.retain(|pid, _| keep(*pid));
        let latest = &self.latest;
        self.meta.retain(|pid, _| latest.contains_key(pid));
    }

    /// Lines seen that were not reports (garbage, or cut by a truncation).
    pub fn skipped_lines(&self) -> u64 {
        self.skipped
    }

    /// The file this reader follows.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Someone emptied the file (or replaced its content): start over.
    fn follow_truncation(&mut self) -> Result<(), TorchStatsError> {
        let len = self
            .file
            .metadata()
            .map_err(|source| TorchStatsError::Read {
                path: self.path.clone(),
                source,
            })?
            .len();
        if len < self.offset {
            self.rewind()?;
        }
        Ok(())
    }

    fn rewind(&mut self) -> Result<(), TorchStatsError> {
        use std::io::Seek;
        self.file
            .seek(io::SeekFrom::Start(0))
            .map_err(|source| TorchStatsError::Read {
                path: self.path.clone(),
                source,
            })?;
        self.offset = 0;
        if !self.partial.is_empty() {
            self.skipped += 1;
        }
        self.partial.clear();
        self.discarding = false;
        Ok(())
    }

    /// Splits `bytes` into lines, carrying a partial last line over.
    fn consume(&mut self, mut bytes: &[u8]) -> usize {
        let mut applied = 0;
        while let Some(newline) = bytes.iter().position(|&b| b == b'\n') {
            let (head, rest) = bytes.split_at(newline);
            bytes = &rest[1..];
            if self.discarding {
                self.discarding = false;
                continue;
            }
            let applied_line = if self.partial.is_empty() {
                self.apply_line(head)
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(head);
                self.apply_line(&line)
            };
            applied += usize::from(applied_line);
        }
        if !self.discarding {
            self.partial.extend_from_slice(bytes);
            if self.partial.len() > MAX_LINE {
                self.partial.clear();
                self.discarding = true;
                self.skipped += 1;
            }
        }
        applied
    }

    /// Applies one line; false when it is not a report.
    fn apply_line(&mut self, line: &[u8]) -> bool {
        if line.iter().all(u8::is_ascii_whitespace) {
            return false;
        }
        let Ok(report) = serde_json::from_slice::<ReportLine>(line) else {
            self.skipped += 1;
            return false;
        };
        let same_report = report.part > 0
            && self
                .meta
                .get(&report.pid)
                .is_some_and(|m| m.seq == report.seq);
        let devices = self.latest.entry(report.pid).or_default();
        if !same_report {
            devices.clear();
        }
        for stats in report.devices {
            match devices.iter_mut().find(|d| d.device == stats.device) {
                Some(existing) => *existing = stats,
                None => devices.push(stats),
            }
        }
        devices.sort_by_key(|d| d.device);
        self.meta.insert(
            report.pid,
            ReportMeta {
                seq: report.seq,
                t: report.t,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(device: u32, allocated: u64, reserved: u64) -> TorchDeviceStats {
        TorchDeviceStats {
            device,
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            max_allocated_bytes: allocated,
            alloc_retries: 0,
        }
    }

    fn append(path: &Path, text: &str) {
        let mut f = OpenOptions::new()
            .append(true)
            .open(path)
            .expect("open for append");
        f.write_all(text.as_bytes()).expect("append");
    }

    fn line(pid: u32, seq: u64, part: u32, devices: &[TorchDeviceStats]) -> String {
        let devices = serde_json::to_string(devices).expect("serialise");
        format!(
            "{{\"v\":1,\"pid\":{pid},\"seq\":{seq},\"part\":{part},\"parts\":1,\"t\":1.5,\"devices\":{devices}}}\n"
        )
    }

    #[test]
    fn env_prepends_to_an_existing_pythonpath() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let inj = TorchStatsInjector::new_in(tmp.path(), Duration::from_millis(250), None)
            .expect("injector");
        let dir = inj.dir().to_str().expect("utf-8").to_string();
        let get = |env: &[(OsString, OsString)], key: &str| {
            env.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };

        let env = inj.env(Some(OsStr::new("/a:/b")));
        assert_eq!(get(&env, "PYTHONPATH"), Some(format!("{dir}:/a:/b")));
        assert_eq!(get(&env, ENV_INTERVAL).as_deref(), Some("0.250"));
        assert_eq!(
            get(&env, ENV_STATS_PATH),
            Some(inj.stats_path().to_string_lossy().into_owned())
        );
        assert_eq!(get(&inj.env(None), "PYTHONPATH"), Some(dir.clone()));
        assert_eq!(get(&inj.env(Some(OsStr::new(""))), "PYTHONPATH"), Some(dir));
    }

    #[test]
    fn injector_writes_the_reporter_and_cleans_up() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let inj =
            TorchStatsInjector::new_in(tmp.path(), Duration::from_secs(1), None).expect("injector");
        let dir = inj.dir().to_path_buf();
        assert!(dir.starts_with(tmp.path()));
        let script = fs::read_to_string(dir.join(SITECUSTOMIZE)).expect("script");
        assert_eq!(script, REPORTER_SOURCE);
        assert_eq!(fs::metadata(inj.stats_path()).expect("stats").len(), 0);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&dir).expect("dir").permissions().mode() & 0o777,
            0o700
        );
        let second = TorchStatsInjector::new_in(tmp.path(), Duration::from_secs(1), None)
            .expect("a second injector");
        assert_ne!(second.dir(), dir);
        drop(inj);
        assert!(!dir.exists());
    }

    #[test]
    fn injector_errors_name_the_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("no/such/parent");
        let err = TorchStatsInjector::new_in(&missing, Duration::from_secs(1), None)
            .expect_err("missing parent");
        assert!(err.to_string().contains("no/such/parent"), "{err}");

        let colon = tmp.path().join("a:b");
        fs::create_dir(&colon).expect("dir");
        let err =
            TorchStatsInjector::new_in(&colon, Duration::from_secs(1), None).expect_err("colon");
        assert!(matches!(err, TorchStatsError::ColonInPath { .. }), "{err}");
        // The half-made directory was removed again.
        assert_eq!(fs::read_dir(&colon).expect("read").count(), 0);

        let err = TorchStatsReader::open(&tmp.path().join("absent.ndjson")).expect_err("absent");
        assert!(err.to_string().contains("absent.ndjson"), "{err}");
    }

    #[test]
    fn a_named_stats_path_is_created_and_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("stats.ndjson");
        let inj =
            TorchStatsInjector::new_in(tmp.path(), Duration::from_secs(1), Some(path.clone()))
                .expect("injector");
        assert_eq!(inj.stats_path(), path);
        drop(inj);
        assert!(
            path.exists(),
            "a stats path the caller named is not ours to remove"
        );
    }

    #[test]
    fn reader_keeps_the_latest_report_per_pid() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("s");
        fs::write(&path, "").expect("create");
        let mut reader = TorchStatsReader::open(&path).expect("reader");
        assert_eq!(reader.poll().expect("poll"), 0);

        append(&path, &line(10, 1, 0, &[stats(1, 5, 9), stats(0, 1, 2)]));
        append(&path, &line(11, 1, 0, &[stats(0, 7, 7)]));
        assert_eq!(reader.poll().expect("poll"), 2);
        assert_eq!(reader.latest()[&10], vec![stats(0, 1, 2), stats(1, 5, 9)]);
        assert_eq!(reader.reported_at(10), Some(1.5));

        // A new report replaces the old one entirely (device 1 freed all).
        append(&path, &line(10, 2, 0, &[stats(0, 3, 4)]));
        assert_eq!(reader.poll().expect("poll"), 1);
        assert_eq!(reader.latest()[&10], vec![stats(0, 3, 4)]);
        assert_eq!(total_fragmentation_bytes(&reader.latest()[&10]), 1);

        // Parts of one report add up.
        append(&path, &line(10, 3, 0, &[stats(0, 1, 1)]));
        append(&path, &line(10, 3, 1, &[stats(17, 2, 8)]));
        reader.poll().expect("poll");
        assert_eq!(reader.latest()[&10], vec![stats(0, 1, 1), stats(17, 2, 8)]);

        reader.retain_pids(|pid| pid == 11);
        assert_eq!(
            reader.latest().keys().copied().collect::<Vec<_>>(),
            vec![11]
        );
        assert_eq!(reader.reported_at(10), None);
    }

    #[test]
    fn reader_tolerates_partial_lines_and_garbage() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("s");
        fs::write(&path, "").expect("create");
        let mut reader = TorchStatsReader::open(&path).expect("reader");
        let full = line(5, 1, 0, &[stats(0, 100, 150)]);
        let (head, tail) = full.split_at(20);
        append(&path, "not json\n{\"pid\":-1,\"devices\":[]}\n\n");
        append(&path, head);
        assert_eq!(reader.poll().expect("poll"), 0);
        assert!(reader.latest().is_empty());
        append(&path, tail);
        assert_eq!(reader.poll().expect("poll"), 1);
        assert_eq!(reader.latest()[&5][0].fragmentation_bytes(), 50);
        assert_eq!(reader.skipped_lines(), 2);

        // An endless line is dropped without holding it in memory, and the
        // next real line still counts.
        append(&path, &"x".repeat(MAX_LINE + 10));
        reader.poll().expect("poll");
        append(&path, &"y".repeat(100));
        append(&path, "\n");
        append(&path, &line(6, 1, 0, &[]));
        assert_eq!(reader.poll().expect("poll"), 1);
        assert_eq!(reader.latest()[&6], Vec::new());
        // Invalid UTF-8 is garbage, not an error.
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(b"\xff\xfe\n").expect("write");
        assert_eq!(reader.poll().expect("poll"), 0);
    }

    #[test]
    fn reader_follows_truncation_and_truncates_big_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("s");
        fs::write(&path, line(1, 1, 0, &[stats(0, 1, 1)])).expect("create");
        let mut reader = TorchStatsReader::open(&path).expect("reader");
        assert_eq!(reader.poll().expect("poll"), 1);
        // Someone else empties the file and writes again (less than before:
        // a shrunken file is how a truncation shows).
        fs::write(&path, line(2, 1, 0, &[])).expect("rewrite");
        assert_eq!(reader.poll().expect("poll"), 1);
        assert!(reader.latest().contains_key(&2));

        // Past TRUNCATE_AT the reader empties the file itself.
        let one = line(3, 1, 0, &[stats(0, 3, 3)]);
        let many = one.repeat((TRUNCATE_AT as usize / one.len()) + 1);
        append(&path, &many);
        let mut total = 0;
        loop {
            let n = reader.poll().expect("poll");
            if n == 0 {
                break;
            }
            total += n;
        }
        assert!(total > 1000);
        assert_eq!(fs::metadata(&path).expect("meta").len(), 0);
        append(&path, &line(4, 1, 0, &[]));
        assert_eq!(reader.poll().expect("poll"), 1);
        assert!(reader.latest().contains_key(&4));
    }

    #[test]
    fn reader_reads_a_fifo_without_blocking() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        let mut reader = TorchStatsReader::open(&path).expect("reader");
        // No writer yet: nothing, at once.
        assert_eq!(reader.poll().expect("poll"), 0);
        let mut writer = OpenOptions::new().write(true).open(&path).expect("writer");
        assert_eq!(reader.poll().expect("poll"), 0, "writer, but no data");
        writer
            .write_all(line(9, 1, 0, &[stats(0, 4, 6)]).as_bytes())
            .expect("write");
        assert_eq!(reader.poll().expect("poll"), 1);
        drop(writer);
        assert_eq!(reader.poll().expect("poll"), 0, "writer gone");
        assert_eq!(reader.latest()[&9], vec![stats(0, 4, 6)]);
    }

    #[test]
    fn device_stats_serialise_with_the_sample_field_names() {
        let json = serde_json::to_value(stats(2, 10, 30)).expect("serialise");
        assert_eq!(
            json,
            serde_json::json!({
                "device": 2,
                "allocated_bytes": 10,
                "reserved_bytes": 30,
                "max_allocated_bytes": 10,
                "alloc_retries": 0
            })
        );
        assert_eq!(stats(0, 30, 10).fragmentation_bytes(), 0);
    }
}
