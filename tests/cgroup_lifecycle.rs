//! The owned cgroup's life beyond one clean run (cgroup v1 on this host;
//! v2 is proven in tests/vm_cgroup_v2.rs): a cgroup left by a killed run is
//! removed by the next run, and a job that moves itself out of the owned
//! cgroup is still supervised.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{MemCgroup, oomguard};

/// A pid that is not running (a child that has been reaped).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

fn oomguard_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_oomguard"))
}

#[test]
fn a_stale_owned_cgroup_is_removed_by_the_next_run() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("stale", 1 << 30) else {
        return;
    };
    let empty = cg.dir.join(format!("oomguard-{}", dead_pid()));
    fs::create_dir(&empty).unwrap();
    // A stale cgroup that still holds a process is left alone: that
    // process is not this run's to touch.
    let occupied = cg.dir.join(format!("oomguard-{}", dead_pid()));
    fs::create_dir(&occupied).unwrap();
    let mut sleeper = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec sleep 30"#)
        .arg(&occupied)
        .spawn()
        .unwrap();
    assert!(common::wait_for(Duration::from_secs(5), || {
        !cg.read(&format!(
            "{}/cgroup.procs",
            occupied.file_name().unwrap().to_string_lossy()
        ))
        .trim()
        .is_empty()
    }));
    // A directory of a live oomguard (this test's own pid stands in, its
    // comm is not oomguard, so it counts as stale too); one of another
    // program's naming is never touched.
    let foreign = cg.dir.join("oomguard-notapid");
    fs::create_dir(&foreign).unwrap();

    let out = cg
        .command(&oomguard_path(), &["run", "--no-tui", "--", "true"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!empty.exists(), "the empty stale cgroup is still there");
    assert!(
        stderr.contains("left behind by a run that was killed"),
        "{stderr}"
    );
    assert!(
        occupied.exists(),
        "a stale cgroup with a process was removed"
    );
    assert!(stderr.contains("still holds 1 process"), "{stderr}");
    assert!(foreign.exists());
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let _ = fs::remove_dir(&foreign);
}

#[test]
fn serial_the_cgroup_of_a_run_killed_with_sigkill_is_removed_by_the_next() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("killed", 1 << 30) else {
        return;
    };
    let mut first = cg
        .command(
            &oomguard_path(),
            &["run", "--no-tui", "--quiet", "--", "sleep", "1"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let left = cg.dir.join(format!("oomguard-{}", first.id()));
    // Killed once its job is in the cgroup: the job must end (death
    // signal) and leave an empty cgroup behind.
    assert!(common::wait_for(Duration::from_secs(5), || {
        fs::read_to_string(left.join("cgroup.procs")).is_ok_and(|t| !t.trim().is_empty())
    }));
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(left.exists(), "SIGKILL cannot clean up; nothing to test");
    // The job ends on its own (or by a death signal); its cgroup stays.
    assert!(common::wait_for(Duration::from_secs(5), || {
        fs::read_to_string(left.join("cgroup.procs")).is_ok_and(|t| t.trim().is_empty())
    }));
    let out = cg
        .command(
            &oomguard_path(),
            &["run", "--no-tui", "--quiet", "--", "true"],
        )
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!left.exists(), "the killed run's cgroup was not cleaned up");
}

/// The leaker of the VM tests, built for this host.
fn leaker(dir: &Path) -> Option<PathBuf> {
    let out = dir.join("leak");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/leak.c");
    let ok = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    common::require(ok, "gcc cannot build the leaker").then_some(out)
}

#[test]
fn serial_a_job_that_leaves_the_owned_cgroup_is_still_supervised() {
    let _serial = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("escape", 1 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(leak) = leaker(dir.path()) else {
        return;
    };
    let log = dir.path().join("log.ndjson");
    // The job moves itself back into the test's cgroup (out of the one
    // oomguard made for it), then leaks 600 MiB at 200 MiB/s; the 150 MiB
    // budget must still stop it.
    let job = format!(
        r#"echo $$ > "{}/cgroup.procs" && exec "{}" 200 600"#,
        cg.dir.display(),
        leak.display()
    );
    let mut child = cg
        .command(
            &oomguard_path(),
            &[
                "run",
                "--no-tui",
                "--quiet",
                "--budget",
                "150M",
                "--log",
                log.to_str().unwrap(),
                "--",
                "sh",
                "-c",
                &job,
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > Duration::from_secs(30) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let Some(status) = status else {
        cg.kill_all();
        let _ = child.wait();
        panic!("the job left its cgroup and was no longer supervised (no stop in 30 s)");
    };
    assert_eq!(status.code(), Some(75));
    let lines = common::read_log(&log);
    let owned = lines.iter().any(|l| {
        matches!(&l.event, common::schema::Event::RunStart(r) if r.cgroup.as_ref().is_some_and(|c| c.owned))
    });
    assert!(owned, "the run did not own a cgroup; nothing was tested");
    let _ = oomguard;
}
