//! `--metrics-textfile PATH`: the exposition written to a file for
//! node_exporter's textfile collector.
//!
//! The collector reads every `*.prom` file in its directory at each scrape,
//! so a half-written file would be served as broken metrics. Each write
//! therefore goes to `PATH.tmp.<pid>` beside the target (same directory,
//! hence same file system, so `rename` is atomic; the collector ignores the
//! name because it does not end in `.prom`) and is renamed over it. No
//! fsync: after a crash the file is stale anyway, and a tick must not wait
//! on the disk.
//!
//! The collector serves a file for as long as it exists, so oomguard
//! removes it when it exits ([`Textfile::remove`], or on drop); otherwise a
//! finished job would look alive, frozen at its last values, forever.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// What failed on the metrics textfile.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} metrics textfile '{path}': {source}")]
pub struct TextfileError {
    /// The file the operation was about (the temporary file for `write`).
    pub path: PathBuf,
    /// `write`, `rename` or `remove`.
    pub op: &'static str,
    #[source]
    pub source: io::Error,
}

/// The textfile oomguard keeps up to date; removed on drop once written.
#[derive(Debug)]
pub struct Textfile {
    path: PathBuf,
    tmp: PathBuf,
    /// Whether the file is ours to remove (written and not removed yet).
    written: AtomicBool,
}

impl Textfile {
    /// A textfile at `path`; nothing is written yet.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let mut tmp = path.clone().into_os_string();
        tmp.push(format!(".tmp.{}", std::process::id()));
        Self {
            path,
            tmp: PathBuf::from(tmp),
            written: AtomicBool::new(false),
        }
    }

    /// The target path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file's content with `text`, atomically.
    pub fn write(&self, text: &str) -> Result<(), TextfileError> {
        if let Err(source) = fs::write(&self.tmp, text) {
            let _ = fs::remove_file(&self.tmp);
            return Err(TextfileError {
                path: self.tmp.clone(),
                op: "write",
                source,
            });
        }
        if let Err(source) = fs::rename(&self.tmp, &self.path) {
            let _ = fs::remove_file(&self.tmp);
            return Err(TextfileError {
                path: self.path.clone(),
                op: "rename",
                source,
            });
        }
        self.written.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Removes the file (at exit). A file that is already gone is fine;
    /// after this, drop does nothing.
    pub fn remove(&self) -> Result<(), TextfileError> {
        if !self.written.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(TextfileError {
                path: self.path.clone(),
                op: "remove",
                source,
            }),
        }
    }
}

impl Drop for Textfile {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_atomically_and_removes_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("oomguard.prom");
        let t = Textfile::new(&path);
        assert!(!path.exists(), "nothing before the first write");
        t.write("a 1\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a 1\n");
        t.write("a 2\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a 2\n");
        // Only the target is left: no temporary file behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["oomguard.prom"]);
        drop(t);
        assert!(!path.exists());
    }

    #[test]
    fn temp_name_is_beside_the_target_and_not_prom() {
        let t = Textfile::new("/var/lib/node_exporter/textfile/job.prom");
        assert_eq!(t.tmp.parent(), t.path().parent());
        let name = t.tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(name, format!("job.prom.tmp.{}", std::process::id()));
        assert!(!name.ends_with(".prom"));
        std::mem::forget(t);
    }

    #[test]
    fn remove_is_idempotent_and_tolerates_a_vanished_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.prom");
        let t = Textfile::new(&path);
        t.remove().unwrap();
        t.write("a 1\n").unwrap();
        fs::remove_file(&path).unwrap();
        t.remove().unwrap();
        t.remove().unwrap();
    }

    #[test]
    fn never_written_file_is_not_removed() {
        // Someone else's file at the path stays until oomguard writes it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.prom");
        fs::write(&path, "theirs").unwrap();
        drop(Textfile::new(&path));
        assert!(path.exists());
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("x.prom");
        let t = Textfile::new(&path);
        let err = t.write("a 1\n").unwrap_err();
        assert_eq!(err.op, "write");
        let msg = err.to_string();
        assert!(
            msg.contains("missing-dir") && msg.contains("x.prom.tmp."),
            "{msg}"
        );
        // A directory in the way of the rename.
        let dir_target = dir.path().join("d.prom");
        fs::create_dir(&dir_target).unwrap();
        fs::write(dir_target.join("inside"), "").unwrap();
        let t = Textfile::new(&dir_target);
        let err = t.write("a 1\n").unwrap_err();
        assert_eq!(err.op, "rename");
        assert!(err.to_string().contains("d.prom'"), "{err}");
        assert!(
            !dir.path()
                .join(format!("d.prom.tmp.{}", std::process::id()))
                .exists()
        );
    }
}
