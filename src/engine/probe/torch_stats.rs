//! PyTorch caching-allocator statistics reported from inside the job
//! (`--torch-stats`): [`TorchStatsReader`] follows the file the reporters
//! append to, one JSON line per report, and keeps the latest report of each
//! pid. The reporter is put into the job by `crate::job::inject`.
//!
//! NVML sees what the CUDA driver handed out; these figures say what PyTorch
//! does with it, and reserved − allocated is the fragmentation that makes a
//! CUDA OOM strike while memory looks free.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

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

pub use crate::vocab::model::TorchDeviceStats;

/// Sum of [`TorchDeviceStats::fragmentation_bytes`] over devices.
pub fn total_fragmentation_bytes(devices: &[TorchDeviceStats]) -> u64 {
    devices
        .iter()
        .map(TorchDeviceStats::fragmentation_bytes)
        .fold(0, u64::saturating_add)
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
    use std::io::Write;

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
