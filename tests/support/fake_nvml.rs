//! Test helper: builds the fake `libnvidia-ml.so.1` (tests/fake-nvml) with the
//! machine's gcc and gives each test its own copy next to its own scenario
//! file. The suite's files use it as `crate::support::fake_nvml`.
//!
//! Why a copy per test: dlopen hands out one instance per file (it matches
//! already loaded objects by path and by inode), so tests running in parallel
//! in one process would otherwise share the library's state and scenario.
//! The fake finds its scenario as `scenario` beside itself, so no environment
//! variable has to be set.

#![allow(dead_code)]

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The C source; included so that editing it rebuilds the test binary, and
/// hashed so that the compiled library is rebuilt too.
const SOURCE: &str = include_str!("../fake-nvml/fake_nvml.c");
const SOURCE_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake-nvml/fake_nvml.c");

/// Compile the fake with these `-D` defines (e.g. `FAKE_NVML_NO_SHUTDOWN`),
/// once per content hash, into `$CARGO_TARGET_TMPDIR/fake-nvml/<hash>/`.
pub fn build(defines: &[&str]) -> PathBuf {
    // Serialises builds within this process; the rename below makes
    // concurrent test processes safe too.
    static BUILDING: Mutex<()> = Mutex::new(());
    let _guard = BUILDING.lock().unwrap_or_else(|e| e.into_inner());

    let mut hasher = DefaultHasher::new();
    SOURCE.hash(&mut hasher);
    defines.hash(&mut hasher);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("fake-nvml")
        .join(format!("{:016x}", hasher.finish()));
    let lib = dir.join("libnvidia-ml.so.1");
    if lib.exists() {
        return lib;
    }
    std::fs::create_dir_all(&dir).expect("create the fake NVML build directory");
    let tmp = dir.join(format!("build-{}.so", std::process::id()));
    let mut gcc = Command::new("gcc");
    gcc.args([
        "-shared",
        "-fPIC",
        "-O1",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        "-Werror",
    ]);
    for d in defines {
        gcc.arg(format!("-D{d}"));
    }
    gcc.arg("-o").arg(&tmp).arg(SOURCE_PATH).arg("-ldl");
    let out = gcc
        .output()
        .expect("run gcc (needed to build the fake NVML)");
    assert!(
        out.status.success(),
        "gcc failed on the fake NVML:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &lib).expect("move the fake NVML into place");
    lib
}

/// One test's fake NVML: a private copy of the library and its scenario file.
pub struct FakeNvml {
    dir: tempfile::TempDir,
    lib: PathBuf,
}

impl FakeNvml {
    /// The standard fake with `scenario` as its scenario file.
    pub fn new(scenario: &str) -> Self {
        Self::variant(&[], scenario)
    }

    /// A fake compiled with `defines`, with `scenario` as its scenario file.
    pub fn variant(defines: &[&str], scenario: &str) -> Self {
        let built = build(defines);
        let dir = tempfile::Builder::new()
            .prefix("fake-nvml-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("create a fake NVML directory");
        let lib = dir.path().join("libnvidia-ml.so.1");
        // A copy, not a link: a distinct inode is a distinct dlopen instance.
        std::fs::copy(&built, &lib).expect("copy the fake NVML");
        let fake = FakeNvml { dir, lib };
        fake.set_scenario(scenario);
        fake
    }

    /// Where the library is, for `GpuProbe::open(Some(..))`.
    pub fn lib_path(&self) -> &Path {
        &self.lib
    }

    /// The directory holding the library and its scenario.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Replace the scenario. Atomic (write then rename), because the library
    /// re-reads it on every call, possibly at this very moment.
    pub fn set_scenario(&self, text: &str) {
        let tmp = self.dir.path().join("scenario.tmp");
        std::fs::write(&tmp, text).expect("write the scenario");
        std::fs::rename(&tmp, self.dir.path().join("scenario")).expect("install the scenario");
    }
}
