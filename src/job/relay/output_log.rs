//! `--output-log FILE`: the job's output appended to FILE, raw, and with
//! `--output-log-max SIZE` kept to SIZE on disk. The job's output is the
//! user's, so there is no cap unless asked for; with one, the newest output
//! is what stays (a traceback is at the end): FILE holds at most half of
//! SIZE, and when the next bytes would pass that, FILE becomes `FILE.1`
//! (the previous `FILE.1` goes, its bytes counted as left out) and a new
//! FILE begins.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The output log being written.
#[derive(Debug)]
pub struct OutputLogFile {
    path: PathBuf,
    file: File,
    /// `--output-log-max`, when given.
    cap: Option<u64>,
    /// Bytes in FILE now (its size when opened, then what was added).
    in_file: u64,
    /// Bytes this run removed from disk to keep the cap.
    left_out: u64,
}

impl OutputLogFile {
    /// Opens `path` to append to it.
    pub fn open(path: &Path, cap: Option<u64>) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let in_file = file.metadata()?.len();
        Ok(Self {
            path: path.to_path_buf(),
            file,
            cap,
            in_file,
            left_out: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes this run left out to keep the cap (0 without one).
    pub fn left_out(&self) -> u64 {
        self.left_out
    }

    /// Appends `bytes`, rotating first when the cap asks for it.
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(cap) = self.cap else {
            return self.file.write_all(bytes);
        };
        let half = (cap / 2).max(1);
        let mut bytes = bytes;
        // More than a file's share at once: its newest bytes only.
        if bytes.len() as u64 > half {
            let skip = bytes.len() - half as usize;
            self.left_out += skip as u64;
            bytes = &bytes[skip..];
        }
        if self.in_file + bytes.len() as u64 > half && self.in_file > 0 {
            self.rotate()?;
        }
        self.file.write_all(bytes)?;
        self.in_file += bytes.len() as u64;
        Ok(())
    }

    /// FILE becomes FILE.1 (whatever FILE.1 held is left out), and a new
    /// FILE begins.
    fn rotate(&mut self) -> io::Result<()> {
        let older = rotated(&self.path);
        if let Ok(m) = std::fs::symlink_metadata(&older) {
            self.left_out += m.len();
        }
        std::fs::rename(&self.path, &older)?;
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.in_file = 0;
        Ok(())
    }
}

/// `FILE.1`, where the older half of a capped output log is.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_cap_everything_is_appended() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("out.log");
        std::fs::write(&p, "before\n").unwrap();
        let mut f = OutputLogFile::open(&p, None).unwrap();
        for _ in 0..1000 {
            f.write_all(b"0123456789").unwrap();
        }
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 7 + 10_000);
        assert_eq!(f.left_out(), 0);
        assert!(!rotated(&p).exists());
    }

    #[test]
    fn a_cap_keeps_the_newest_output_within_it_and_counts_the_rest() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("out.log");
        let mut f = OutputLogFile::open(&p, Some(100)).unwrap();
        let mut all = Vec::new();
        for i in 0..50u32 {
            let line = format!("line {i:02}\n");
            all.extend_from_slice(line.as_bytes());
            f.write_all(line.as_bytes()).unwrap();
        }
        let older = std::fs::read(rotated(&p)).unwrap();
        let newer = std::fs::read(&p).unwrap();
        let kept = older.len() + newer.len();
        assert!(kept <= 100, "{kept} bytes on disk");
        assert!(newer.len() <= 50 && older.len() <= 50);
        // What is on disk is the newest output, in order, whole lines
        // (writes are not split across the two files).
        let mut on_disk = older.clone();
        on_disk.extend_from_slice(&newer);
        assert!(all.ends_with(&on_disk));
        assert!(String::from_utf8_lossy(&newer).ends_with("line 49\n"));
        assert_eq!(f.left_out() as usize, all.len() - kept);
        // One write larger than a file's share: its newest bytes.
        f.write_all(&[b'x'; 300]).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), vec![b'x'; 50]);
        assert_eq!(
            f.left_out() as usize,
            all.len() + 300 - 50 - std::fs::read(rotated(&p)).unwrap().len()
        );
    }
}
