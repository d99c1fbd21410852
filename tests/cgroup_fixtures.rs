//! The cgroup resolver and reader against fixture roots (a fake `/proc` and
//! `/sys/fs/cgroup` under `tests/fixtures/cgroup/<scenario>/`): v1 nested
//! limits, v2 nested limits with `max`, a container's v2 mount of a
//! subtree, and a hybrid layout with no memory controller at all.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use oomguard::engine::probe::cgroup::{CgroupReader, Version, locate};

/// Copies a scenario to a temp dir and points its mount table at it.
fn scenario(name: &str) -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cgroup")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    copy(&src, dir.path());
    let mi = dir.path().join("proc/self/mountinfo");
    let text = fs::read_to_string(&mi)
        .unwrap()
        .replace("@ROOT@", &dir.path().display().to_string());
    fs::write(&mi, text).unwrap();
    let proc_root = dir.path().join("proc");
    (dir, proc_root)
}

fn copy(from: &Path, to: &Path) {
    for e in fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            fs::create_dir_all(&target).unwrap();
            copy(&e.path(), &target);
        } else {
            fs::copy(e.path(), target).unwrap();
        }
    }
}

#[test]
fn v1_nested_limits_the_tightest_headroom_wins() {
    let _machine = crate::common::machine::beside();
    let (_dir, proc) = scenario("v1-nested");
    let loc = locate(&proc, "4242").unwrap();
    assert_eq!(loc.version, Version::V1);
    assert_eq!(loc.path, "/slurm/uid_1000/job_42/step_0");
    let s = CgroupReader::new(loc, false).read().unwrap();
    assert_eq!(s.version, 1);
    assert_eq!(s.usage_bytes, 11_000_000_000);
    // job_42: 16 GiB limit, working set 12e9 - 2e9 = 10e9 -> ~7.2 GB left;
    // uid_1000: 64 GiB, 12e9 used -> far more left. The job's limit wins.
    assert_eq!(s.limit_bytes, Some(17_179_869_184));
    assert_eq!(s.limit_path.as_deref(), Some("/slurm/uid_1000/job_42"));
    assert_eq!(s.limit_working_set_bytes, Some(10_000_000_000));
    assert_eq!(s.oom_kill_count, Some(2));
}

#[test]
fn v2_nested_max_means_unlimited_and_the_ancestor_limits() {
    let _machine = crate::common::machine::beside();
    let (_dir, proc) = scenario("v2-nested");
    let loc = locate(&proc, "777").unwrap();
    assert_eq!(loc.version, Version::V2);
    let s = CgroupReader::new(loc, false).read().unwrap();
    assert_eq!(s.usage_bytes, 4_000_000_000);
    assert_eq!(s.limit_bytes, Some(8_589_934_592));
    assert_eq!(s.limit_path.as_deref(), Some("/user.slice"));
    assert_eq!(s.limit_working_set_bytes, Some(4_500_000_000));
    assert_eq!(s.oom_kill_count, Some(1));
}

#[test]
fn v2_container_mount_of_a_subtree_with_missing_files() {
    let _machine = crate::common::machine::beside();
    let (_dir, proc) = scenario("v2-container");
    let loc = locate(&proc, "1").unwrap();
    assert_eq!(loc.path, "/");
    let s = CgroupReader::new(loc, false).read().unwrap();
    assert_eq!(s.usage_bytes, 1_000_000_000);
    assert_eq!(s.limit_bytes, None, "max everywhere: no cgroup ceiling");
    assert_eq!(
        s.oom_kill_count, None,
        "no memory.events: unknown, not an error"
    );
}

#[test]
fn hybrid_without_a_memory_controller_reads_nothing() {
    let _machine = crate::common::machine::beside();
    let (_dir, proc) = scenario("v2-no-memory");
    let loc = locate(&proc, "9").unwrap();
    assert_eq!(loc.version, Version::V2);
    assert_eq!(CgroupReader::new(loc, false).read(), None);
    // A process that vanished: no cgroup file, no location.
    assert_eq!(locate(&proc, "12345"), None);
}
