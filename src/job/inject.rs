//! The job's start-up hook: [`TorchStatsInjector`] writes the Python
//! reporter (`torch_reporter.py`, embedded in the binary) as
//! `sitecustomize.py` into a private temporary directory and says which
//! environment variables put it into the job: that directory first on
//! `PYTHONPATH`, [`ENV_STATS_PATH`] and [`ENV_INTERVAL`]. The same
//! directory and hook carry the checkpoint companion (`crate::vocab::companion`):
//! one injected start-up hook for both, and the injector exists without
//! `--torch-stats` when only the companion is wanted. Setting up the job,
//! not reading it: the reports are read by `probe::torch_stats`.

use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::probe::torch_stats::{TorchStatsError, TorchStatsReader};

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
        crate::vocab::companion::write_package(&injector.dir).map_err(|source| {
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
    let nanos = crate::vocab::clock::nonce();
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
