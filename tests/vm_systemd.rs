//! cgroup v2 with systemd, as a normal user: Debian's kernel booted in qemu
//! with a Debian root file system (systemd, logind, a user `user` with
//! lingering, so `user@1000.service` and its session bus come up at boot),
//! built by `tests/support/systemd-rootfs.sh` with mmdebstrap once and
//! cached under `~/.cache/oomguard/`. The per-run files (oomguard, the
//! static leaker, the scenario and its unit) go in a second cpio archive
//! appended to the cached one. The scenario runs as a oneshot service once
//! the user's bus is up, prints `@@ key=value` lines on the serial console
//! and powers off.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::vm;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const RECIPE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/support/systemd-rootfs.sh"
);

/// The cached root file system, built when missing (`None`: skipped).
fn rootfs() -> Option<PathBuf> {
    let out = Command::new("sha256sum").arg(RECIPE).output().unwrap();
    let hash: String = String::from_utf8_lossy(&out.stdout)
        .chars()
        .take(16)
        .collect();
    let cache = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join(".cache/oomguard");
    let path = cache.join(format!("systemd-rootfs-{hash}.cpio"));
    if path.exists() {
        return Some(path);
    }
    let have = Command::new("mmdebstrap").arg("--version").output().is_ok();
    let root = is_root();
    if !common::require(
        have && root,
        "building the systemd root file system needs root and mmdebstrap (apt-get install mmdebstrap)",
    ) {
        return None;
    }
    fs::create_dir_all(&cache).unwrap();
    // Over the network (Debian's mirror): a hung download must fail by
    // name, not hang CI. About a minute when it works.
    common::deadline::arm_for(Duration::from_secs(900));
    let started = Instant::now();
    let ok = Command::new("sh")
        .arg(RECIPE)
        .arg(&path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "{RECIPE} failed");
    eprintln!(
        "built {} in {:.1} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Some(path)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A cpio archive of the per-run files, appended to the root file system.
struct Overlay(Vec<u8>, u32);

impl Overlay {
    fn dir(&mut self, name: &str) {
        self.1 += 1;
        vm::cpio_entry(&mut self.0, 900_000 + self.1, name, 0o040755, &[]);
    }
    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.1 += 1;
        vm::cpio_entry(&mut self.0, 900_000 + self.1, name, 0o100000 | mode, data);
    }
    fn link(&mut self, name: &str, target: &str) {
        self.1 += 1;
        vm::cpio_entry(
            &mut self.0,
            900_000 + self.1,
            name,
            0o120777,
            target.as_bytes(),
        );
    }
    fn finish(mut self) -> Vec<u8> {
        vm::cpio_entry(&mut self.0, 0, "TRAILER!!!", 0, &[]);
        self.0
    }
}

fn stripped(src: &Path, dir: &Path) -> Vec<u8> {
    let out = dir.join("oomguard.stripped");
    let ok = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&out)
        .arg(src)
        .status()
        .is_ok_and(|s| s.success());
    fs::read(if ok { &out } else { src }).unwrap()
}

const UNIT: &str = "[Unit]
Description=oomguard test scenario
After=systemd-logind.service user@1000.service
Wants=user@1000.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/oomguard-scenario
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
";

/// The scenario (root, in `system.slice/oomguard-scenario.service`). A:
/// oomguard as `user` with the environment a login gives (the user bus),
/// leaking into a 300M ceiling set on `user@1000.service`. B: the same
/// user with the environment cleared (as after `su`): no user bus. C: the
/// user bus, but from a service with its own `MemoryMax`: not left.
const SCENARIO: &str = r#"#!/bin/sh
up() { cut -d' ' -f1 /proc/uptime; }
echo "@@ scenario_start_s=$(up)"
(sleep 300; echo "@@scenario-timeout"; poweroff -f) &
U=/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service
i=0; while [ ! -S /run/user/1000/bus ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
echo "@@ user_bus_s=$(up)"
echo "@@ user_manager=$(systemctl is-active user@1000.service)"
echo "@@ memory_max=$(cat $U/memory.max)"
echo "@@ controllers=$(cat $U/cgroup.controllers | tr ' ' ,)"
echo "@@ my_cgroup=$(cut -d: -f3 /proc/self/cgroup)"
echo "@@ oom_before=$(grep '^oom_kill ' $U/memory.events | cut -d' ' -f2)"
echo "@@ vm_oom_before=$(grep '^oom_kill ' /proc/vmstat | cut -d' ' -f2)"
# memory.high of the job's cgroup, read while it runs.
( while :; do
    for f in $U/app.slice/oomguard-*.scope/oomguard-*/memory.high; do
      # Kept only when read whole: the cgroup goes away at the run's end,
      # and a failed read must not wipe what an earlier one saw.
      case $f in *-supervisor/*) ;; *) v=$(cat "$f" 2>/dev/null) && [ -n "$v" ] && echo "$v" > /tmp/high.txt ;; esac
    done
    sleep 0.1
  done ) &
poller=$!
LOGIN="PATH=/usr/local/bin:/usr/bin:/bin HOME=/home/user USER=user LOGNAME=user"
cd /tmp
runuser -u user -- env -i $LOGIN XDG_RUNTIME_DIR=/run/user/1000 \
  DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus \
  timeout 120 oomguard run --no-tui --quiet --cgroup auto --log /tmp/a.ndjson -- leak 200 4096 \
  </dev/null >/tmp/a.out 2>/tmp/a.err
echo "@@ a.exit=$?"
kill $poller
echo "@@ a.high=$(cat /tmp/high.txt 2>/dev/null)"
echo "@@ a.oom_after=$(grep '^oom_kill ' $U/memory.events | cut -d' ' -f2)"
echo "@@ a.vm_oom_after=$(grep '^oom_kill ' /proc/vmstat | cut -d' ' -f2)"
echo "@@ a.peak=$(cat $U/memory.peak 2>/dev/null)"
sleep 1
echo "@@ a.left=$(ls $U/app.slice | grep oomguard- | tr '\n' ' ')"
echo "@@begin a.log"; cat /tmp/a.ndjson; echo "@@end a.log"
echo "@@begin a.err"; cat /tmp/a.err; echo "@@end a.err"
echo "@@begin a.out"; tail -5 /tmp/a.out; echo "@@end a.out"
runuser -u user -- env -i $LOGIN \
  timeout 60 oomguard run --no-tui --quiet --cgroup auto --log /tmp/b.ndjson -- sh -c 'echo job-ran' \
  </dev/null >/tmp/b.out 2>/tmp/b.err
echo "@@ b.exit=$?"
echo "@@begin b.log"; cat /tmp/b.ndjson; echo "@@end b.log"
echo "@@begin b.err"; cat /tmp/b.err; echo "@@end b.err"
echo "@@begin b.out"; cat /tmp/b.out; echo "@@end b.out"
# C: the user bus is there, but oomguard runs in a service with its own
# memory limit, which a user scope would escape: it stays.
systemd-run --quiet --wait --pipe --uid=1000 -p MemoryMax=400M -p WorkingDirectory=/tmp \
  -E PATH=/usr/local/bin:/usr/bin:/bin -E XDG_RUNTIME_DIR=/run/user/1000 \
  -E DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus \
  timeout 60 oomguard run --no-tui --quiet --cgroup auto --log /tmp/c.ndjson -- sh -c 'echo job-ran' \
  </dev/null >/tmp/c.out 2>/tmp/c.err
echo "@@ c.exit=$?"
echo "@@begin c.log"; cat /tmp/c.ndjson; echo "@@end c.log"
echo "@@begin c.err"; cat /tmp/c.err; echo "@@end c.err"
echo "@@begin c.out"; cat /tmp/c.out; echo "@@end c.out"
# D: the doctor, as the user in the same session, says a scope is possible.
runuser -u user -- env -i $LOGIN XDG_RUNTIME_DIR=/run/user/1000 \
  DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus \
  timeout 30 oomguard doctor --format json </dev/null >/tmp/d.json 2>/tmp/d.err
echo "@@ d.exit=$?"
echo "@@begin d.json"; cat /tmp/d.json; echo "@@end d.json"
echo "@@ scenario_end_s=$(up)"
echo "@@scenario-exit=0"
sync
poweroff -f
"#;

fn run_start(out: &vm::Output, dir: &Path, name: &str) -> common::schema::RunStart {
    let path = dir.join(format!("{name}.ndjson"));
    fs::write(&path, out.section(&format!("{name}.log")).join("\n")).unwrap();
    common::read_log(&path)
        .into_iter()
        .find_map(|l| match l.event {
            common::schema::Event::RunStart(r) => Some(r),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{name}: no run_start"))
}

#[test]
fn serial_vm_systemd_user_scope() {
    let _serial = common::serial();
    let Some(m) = vm::machine_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(leak) = vm::static_job(dir.path(), "leak") else {
        return;
    };
    let Some(base) = rootfs() else {
        return;
    };
    common::deadline::arm_for(Duration::from_secs(900));
    let mut ov = Overlay(Vec::new(), 0);
    for d in [
        "usr/local/bin",
        "usr/local/sbin",
        "etc/systemd/system/multi-user.target.wants",
        "etc/systemd/system/user@1000.service.d",
    ] {
        ov.dir(d);
    }
    let og = stripped(Path::new(env!("CARGO_BIN_EXE_oomguard")), dir.path());
    ov.file("usr/local/bin/oomguard", 0o755, &og);
    ov.file("usr/local/bin/leak", 0o755, &fs::read(&leak).unwrap());
    ov.file(
        "usr/local/sbin/oomguard-scenario",
        0o755,
        SCENARIO.as_bytes(),
    );
    ov.file(
        "etc/systemd/system/oomguard-scenario.service",
        0o644,
        UNIT.as_bytes(),
    );
    ov.link(
        "etc/systemd/system/multi-user.target.wants/oomguard-scenario.service",
        "/etc/systemd/system/oomguard-scenario.service",
    );
    // The leak's ceiling, below the VM's memory.
    ov.file(
        "etc/systemd/system/user@1000.service.d/memory.conf",
        0o644,
        b"[Service]\nMemoryMax=300M\n",
    );
    let image = dir.path().join("initramfs.cpio");
    let mut f = fs::File::create(&image).unwrap();
    std::io::copy(&mut fs::File::open(&base).unwrap(), &mut f).unwrap();
    f.write_all(&ov.finish()).unwrap();
    drop(f);
    let boot = vm::Boot {
        memory_mib: 1536,
        timeout: Duration::from_secs(420),
        ..vm::Boot::default()
    };
    let out = vm::run(&m, &image, &boot);
    eprintln!(
        "--- console ({:.1} s) ---\n{}",
        out.elapsed.as_secs_f64(),
        out.console
    );
    assert!(!out.timed_out, "the VM did not power off in time");
    assert!(out.completed(), "the scenario did not finish");
    let v = out.values();
    let get = |k: &str| {
        v.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("no {k} on the console"))
    };
    // A counter nobody could read must not pass as "no OOM kill".
    let num = |k: &str| -> u64 {
        get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k} is {:?}", get(k)))
    };
    eprintln!(
        "boot: scenario started at {} s, user bus at {} s (uptime); VM ran {:.1} s",
        get("scenario_start_s"),
        get("user_bus_s"),
        out.elapsed.as_secs_f64()
    );
    assert_eq!(get("user_manager"), "active");
    assert_eq!(get("memory_max"), "314572800", "the ceiling was not set");

    // A: a user scope of its own.
    // D: the doctor's own_cgroup check as the same user: no cgroup can be
    // made where it stands, but a run asks the user manager for a scope.
    let doctor: serde_json::Value =
        serde_json::from_str(&out.section("d.json").join("\n")).expect("doctor's JSON");
    let own = doctor["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "own_cgroup"))
        .unwrap_or_else(|| panic!("no own_cgroup check: {doctor}"));
    assert_eq!(own["details"]["user_scope_possible"], true, "{own}");
    assert_eq!(own["state"], "ok", "{own}");
    let a = run_start(&out, dir.path(), "a");
    let a_err = out.section("a.err").join("\n");
    let cg = a.cgroup.as_ref().expect("A: no cgroup in run_start");
    assert!(cg.owned, "A not owned: {:?}\n{a_err}", cg.not_owned_reason);
    assert_eq!(cg.via.as_deref(), Some("systemd-user-scope"), "A: {cg:?}");
    let scope = cg.scope.clone().expect("A: no scope named");
    assert!(
        cg.path.starts_with(&format!(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/{scope}/oomguard-"
        )),
        "A: job's cgroup {}",
        cg.path
    );
    let high = num("a.high");
    assert!(
        high > 200 << 20 && high < 300 << 20,
        "A: memory.high {high}"
    );
    // What the kernel held is what oomguard says it wrote.
    assert_eq!(
        a.cgroup.as_ref().and_then(|c| c.memory_high_bytes),
        Some(high),
        "A: run_start's memory_high_bytes"
    );
    assert_eq!(get("a.exit"), "75", "A: not stopped: {a_err}");
    assert_eq!(
        num("a.oom_after"),
        num("oom_before"),
        "A: the kernel OOM-killed in user@1000.service"
    );
    assert_eq!(
        num("a.vm_oom_after"),
        num("vm_oom_before"),
        "A: an OOM kill"
    );
    assert!(
        out.section("a.out").join("\n").contains("checkpoint"),
        "A: the trainer did not checkpoint"
    );
    assert_eq!(get("a.left").trim(), "", "A: the scope was not collected");

    // B: no user bus: the stated reason, and the job still runs.
    let b = run_start(&out, dir.path(), "b");
    let cg = b.cgroup.as_ref().expect("B: no cgroup in run_start");
    assert!(!cg.owned, "B owned: {cg:?}");
    let why = cg.not_owned_reason.clone().unwrap_or_default();
    assert!(why.contains("no user bus"), "B: reason {why:?}");
    assert!(
        why.contains("systemd-run --user --scope"),
        "B: reason {why:?}"
    );
    assert_eq!(get("b.exit"), "0");
    assert!(out.section("b.out").join("\n").contains("job-ran"));

    // C: a limited cgroup is never left for a user scope.
    let c = run_start(&out, dir.path(), "c");
    let cg = c.cgroup.as_ref().expect("C: no cgroup in run_start");
    assert!(!cg.owned, "C owned: {cg:?}");
    let why = cg.not_owned_reason.clone().unwrap_or_default();
    assert!(why.contains("memory.max 419430400"), "C: reason {why:?}");
    assert!(why.contains("escape"), "C: reason {why:?}");
    assert_eq!(get("c.exit"), "0", "C: {}", out.section("c.err").join("\n"));
    assert!(out.section("c.out").join("\n").contains("job-ran"));
}
