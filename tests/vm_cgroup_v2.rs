//! cgroup v2 on a real kernel: Debian's kernel booted in qemu with a busybox
//! initramfs (tests/support/vm.rs). Each test boots once and runs several
//! scenarios; their results come back as `@@ key=value` lines.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "support/vm.rs"]
mod vm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The machine, or skip (fail under CI).
fn machine() -> Option<vm::Machine> {
    match vm::Machine::find() {
        Ok(m) => Some(m),
        Err(why) => {
            common::require(false, &why);
            None
        }
    }
}

/// The static leaker (tests/fixtures/jobs/leak.c), built with gcc -static.
fn leaker(dir: &Path) -> Option<PathBuf> {
    let out = dir.join("leak");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/leak.c");
    let ok = Command::new("gcc")
        .args(["-O2", "-static", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    common::require(
        ok,
        "gcc -static cannot build the leaker (install gcc and libc6-dev)",
    )
    .then_some(out)
}

/// An image with oomguard and the leaker in /bin.
fn image(m: &vm::Machine, dir: &Path) -> Option<vm::Initramfs> {
    let leak = leaker(dir)?;
    let mut img = vm::Initramfs::new(m);
    img.add_binary("bin/oomguard", Path::new(env!("CARGO_BIN_EXE_oomguard")));
    img.add_file("bin/leak", &leak, 0o755);
    Some(img)
}

fn boot(
    m: &vm::Machine,
    mut img: vm::Initramfs,
    dir: &Path,
    scenario: &str,
    b: vm::Boot,
) -> vm::Output {
    let path = dir.join("initramfs.cpio");
    img.write(
        &path,
        scenario,
        b.timeout.saturating_sub(Duration::from_secs(20)),
    );
    let out = vm::run(m, &path, &b);
    eprintln!(
        "--- console ({:.1} s) ---\n{}",
        out.elapsed.as_secs_f64(),
        out.console
    );
    assert!(!out.timed_out, "the VM did not power off in time");
    assert!(out.completed(), "the scenario did not finish");
    out
}

#[test]
fn serial_vm_smoke() {
    let Some(m) = machine() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(&m, dir.path()) else {
        return;
    };
    let out = boot(
        &m,
        img,
        dir.path(),
        "echo \"@@ controllers=$(cat /sys/fs/cgroup/cgroup.controllers)\"\n\
         echo \"@@ version=$(oomguard --version)\"\n",
        vm::Boot::default(),
    );
    assert!(out.value("controllers").unwrap().contains("memory"));
}
