//! Test helper: boots the machine's Debian kernel (`linux-image-amd64`) in
//! `qemu-system-x86_64` with a busybox initramfs built here, runs a scenario
//! shell script as PID 1's payload and hands back what it printed on the
//! serial console. The suite's files use it as `crate::support::vm`.
//!
//! Why a VM: this host runs cgroup v1; cgroup v2 ownership, `memory.events`,
//! PSI triggers, swap and the global OOM killer can only be proven on a real
//! kernel of their own. A boot takes 10-40 s under TCG here (KVM with
//! `OOMGUARD_VM_ACCEL=kvm`), so put several scenarios in one script.
//!
//! The image holds busybox (with its applets as links), the files added by
//! the test (binaries with the shared libraries `ldd` lists), kernel modules
//! on request, `/init` (mounts, module loading, then `/scenario.sh`, then
//! power-off) and the scenario. The scenario's lines come back with `\r`
//! removed; `Output::values` collects `@@ key=value` lines. `run_scenario`
//! does it all: image, boot, checks that the scenario finished.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a VM test needs from the machine.
#[derive(Debug, Clone)]
pub struct Machine {
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    /// `/lib/modules/<release>` of that kernel.
    pub modules: PathBuf,
    pub busybox: PathBuf,
    pub kvm: bool,
}

impl Machine {
    /// The tools, or why they are missing (the caller skips or, in CI,
    /// fails with it).
    pub fn find() -> Result<Machine, String> {
        let qemu = which("qemu-system-x86_64").ok_or("qemu-system-x86_64 is not installed")?;
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or("busybox (busybox-static) is not installed")?;
        let static_ok = Command::new("ldd")
            .arg(&busybox)
            .output()
            .map(|o| {
                !o.status.success() || String::from_utf8_lossy(&o.stdout).contains("not a dynamic")
            })
            .unwrap_or(true);
        if !static_ok {
            return Err(format!(
                "{} is not static (install busybox-static)",
                busybox.display()
            ));
        }
        let mut kernels: Vec<PathBuf> = fs::read_dir("/boot")
            .map_err(|e| format!("/boot: {e}"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
            .collect();
        kernels.sort();
        let kernel = kernels
            .pop()
            .ok_or("no kernel in /boot (install linux-image-amd64)")?;
        let release = kernel.file_name().unwrap().to_string_lossy()["vmlinuz-".len()..].to_string();
        let modules = Path::new("/lib/modules").join(&release);
        if !modules.join("modules.dep").exists() {
            return Err(format!("{} has no modules.dep", modules.display()));
        }
        fs::File::open(&kernel).map_err(|e| format!("{}: {e}", kernel.display()))?;
        // KVM is opt-in: on this project's CI machine (nested) KVM guests
        // die on an MSR or hang silently, while TCG always works.
        let kvm = std::env::var("OOMGUARD_VM_ACCEL").is_ok_and(|v| v == "kvm")
            && fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .is_ok();
        Ok(Machine {
            qemu,
            kernel,
            modules,
            busybox,
            kvm,
        })
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

enum Entry {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Link(String),
}

/// An initramfs under construction (cpio `newc`, uncompressed).
pub struct Initramfs {
    entries: BTreeMap<String, Entry>,
    modules: Vec<String>,
    machine: Machine,
}

impl Initramfs {
    /// busybox and its applets, the usual directories and the harness's
    /// `/init`.
    pub fn new(machine: &Machine) -> Initramfs {
        let mut me = Initramfs {
            entries: BTreeMap::new(),
            modules: Vec::new(),
            machine: machine.clone(),
        };
        for d in [
            "bin", "sbin", "dev", "proc", "sys", "tmp", "run", "etc", "root", "lib", "lib64",
            "usr", "usr/bin", "usr/sbin", "mnt",
        ] {
            me.dir(d);
        }
        me.add_file("bin/busybox", &machine.busybox, 0o755);
        let list = Command::new(&machine.busybox)
            .arg("--list-full")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for applet in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let dest = applet.trim_start_matches('/');
            if dest != "bin/busybox" && !dest.ends_with("/init") && dest != "init" {
                me.entries
                    .insert(dest.to_string(), Entry::Link("/bin/busybox".into()));
            }
        }
        me
    }

    pub fn dir(&mut self, path: &str) {
        let mut acc = String::new();
        for part in path.trim_matches('/').split('/') {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            self.entries.entry(acc.clone()).or_insert(Entry::Dir);
        }
    }

    fn parent_dirs(&mut self, dest: &str) {
        if let Some((parent, _)) = dest.trim_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
    }

    pub fn add_bytes(&mut self, dest: &str, data: impl Into<Vec<u8>>, mode: u32) {
        let dest = dest.trim_start_matches('/').to_string();
        self.parent_dirs(&dest);
        self.entries.insert(
            dest,
            Entry::File {
                data: data.into(),
                mode,
            },
        );
    }

    pub fn add_file(&mut self, dest: &str, src: &Path, mode: u32) {
        let data = fs::read(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        self.add_bytes(dest, data, mode);
    }

    /// A dynamically linked program with its shared libraries (at the
    /// paths `ldd` gives, so the loader finds them). Debug info is
    /// stripped from the copy: a debug build of oomguard is ~150 MB, a
    /// large part of a small VM's memory.
    pub fn add_binary(&mut self, dest: &str, src: &Path) {
        // Two VM tests of the suite's one process may strip at once.
        static STRIPPED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STRIPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stripped = std::env::temp_dir().join(format!(
            "vm-strip-{}-{n}-{}",
            std::process::id(),
            src.file_name().unwrap().to_string_lossy()
        ));
        let ok = Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(&stripped)
            .arg(src)
            .status()
            .is_ok_and(|s| s.success());
        self.add_file(dest, if ok { &stripped } else { src }, 0o755);
        let _ = fs::remove_file(&stripped);
        let out = Command::new("ldd").arg(src).output().unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)".
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(p) = path.filter(|p| p.starts_with('/')) {
                let real = fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
                self.add_file(p, &real, 0o755);
            }
        }
    }

    /// Kernel modules (by name, e.g. `virtio_blk`) with their dependencies,
    /// loaded by `/init` in order before the scenario runs.
    pub fn add_modules(&mut self, names: &[&str]) {
        let dep = fs::read_to_string(self.machine.modules.join("modules.dep")).unwrap();
        let deps: BTreeMap<String, Vec<String>> = dep
            .lines()
            .filter_map(|l| {
                let (m, d) = l.split_once(':')?;
                Some((
                    m.to_string(),
                    d.split_whitespace().map(String::from).collect(),
                ))
            })
            .collect();
        let find = |name: &str| {
            deps.keys()
                .find(|k| {
                    let base = k.rsplit('/').next().unwrap_or(k);
                    let stem = base.split(".ko").next().unwrap_or(base);
                    stem.replace('-', "_") == name.replace('-', "_")
                })
                .cloned()
        };
        for name in names {
            let m = find(name).unwrap_or_else(|| panic!("no module {name} in modules.dep"));
            let mut order: Vec<String> = deps[&m].iter().rev().cloned().collect();
            order.push(m);
            for rel in order {
                if self.modules.contains(&rel) {
                    continue;
                }
                let src = self.machine.modules.join(&rel);
                let dest = format!("lib/modules/{}", rel.rsplit('/').next().unwrap());
                self.add_file(&dest, &src, 0o644);
                self.modules.push(rel);
            }
        }
    }

    fn init_script(&self, scenario_timeout: Duration) -> String {
        let mut s = String::from(
            "#!/bin/sh\n\
             mount -t proc proc /proc\n\
             mount -t sysfs sysfs /sys\n\
             mount -t devtmpfs devtmpfs /dev 2>/dev/null\n\
             mount -t tmpfs tmpfs /tmp\n\
             mount -t cgroup2 cgroup2 /sys/fs/cgroup\n",
        );
        for m in &self.modules {
            let base = m.rsplit('/').next().unwrap();
            s.push_str(&format!("insmod /lib/modules/{base}\n"));
        }
        s.push_str(&format!(
            "echo @@booted\n\
             (sleep {}; echo @@scenario-timeout; poweroff -f) &\n\
             sh /scenario.sh\n\
             echo \"@@scenario-exit=$?\"\n\
             sync\n\
             poweroff -f\n",
            scenario_timeout.as_secs()
        ));
        s
    }

    /// Writes the image with `scenario` (a busybox `sh` script) as the
    /// payload of `/init`.
    pub fn write(&mut self, path: &Path, scenario: &str, scenario_timeout: Duration) {
        let init = self.init_script(scenario_timeout);
        self.add_bytes("init", init, 0o755);
        self.add_bytes("scenario.sh", scenario, 0o755);
        let mut out = std::io::BufWriter::new(fs::File::create(path).unwrap());
        let mut ino = 1u32;
        for (name, e) in &self.entries {
            let (mode, data): (u32, &[u8]) = match e {
                Entry::Dir => (0o040755, &[]),
                Entry::File { data, mode } => (0o100000 | mode, data),
                Entry::Link(target) => (0o120777, target.as_bytes()),
            };
            cpio_entry(&mut out, ino, name, mode, data);
            ino += 1;
        }
        cpio_entry(&mut out, ino, "TRAILER!!!", 0, &[]);
        out.flush().unwrap();
    }
}

/// One `newc` record: a 110-byte ASCII header, the name with its NUL, the
/// data, each padded to 4 bytes.
pub fn cpio_entry(out: &mut impl Write, ino: u32, name: &str, mode: u32, data: &[u8]) {
    let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
    let header = format!(
        "070701{ino:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
        0,
        0,
        0,
        data.len(),
        0,
        0,
        0,
        0,
        name.len() + 1,
        0
    );
    out.write_all(header.as_bytes()).unwrap();
    out.write_all(name.as_bytes()).unwrap();
    out.write_all(&[0]).unwrap();
    let pad = |n: usize| (4 - n % 4) % 4;
    out.write_all(&vec![0; pad(110 + name.len() + 1)]).unwrap();
    out.write_all(data).unwrap();
    out.write_all(&vec![0; pad(data.len())]).unwrap();
}

/// How to boot.
#[derive(Debug, Clone)]
pub struct Boot {
    pub memory_mib: u32,
    pub cpus: u32,
    /// Raw disk images, attached as virtio disks (`/dev/vda`, `/dev/vdb`;
    /// add the `virtio_pci` and `virtio_blk` modules).
    pub disks: Vec<PathBuf>,
    /// Extra kernel command line.
    pub append: String,
    /// The whole boot, scenario included, is killed after this long.
    pub timeout: Duration,
}

impl Default for Boot {
    fn default() -> Self {
        Boot {
            memory_mib: 1024,
            cpus: 2,
            disks: Vec::new(),
            append: String::new(),
            timeout: Duration::from_secs(420),
        }
    }
}

/// What the VM printed.
#[derive(Debug)]
pub struct Output {
    /// The serial console, `\r` removed.
    pub console: String,
    pub elapsed: Duration,
    pub timed_out: bool,
}

impl Output {
    /// `@@ key=value` lines, in order (later ones win in the map).
    pub fn values(&self) -> BTreeMap<String, String> {
        self.console
            .lines()
            .filter_map(|l| l.trim().strip_prefix("@@ "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    }

    pub fn value(&self, key: &str) -> Option<String> {
        self.values().get(key).cloned()
    }

    /// The lines between `@@begin NAME` and `@@end NAME` (e.g. a log file
    /// the scenario `cat`s).
    pub fn section(&self, name: &str) -> Vec<String> {
        let begin = format!("@@begin {name}");
        let end = format!("@@end {name}");
        self.console
            .lines()
            .skip_while(|l| l.trim() != begin)
            .skip(1)
            .take_while(|l| l.trim() != end)
            .map(String::from)
            .collect()
    }

    /// The scenario ran to its end.
    pub fn completed(&self) -> bool {
        self.console
            .lines()
            .any(|l| l.starts_with("@@scenario-exit="))
    }
}

/// Boots `initramfs` and waits for the VM to power off.
pub fn run(machine: &Machine, initramfs: &Path, boot: &Boot) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let serial = dir.path().join("serial.txt");
    let mut cmd = Command::new(&machine.qemu);
    cmd.args(["-nodefaults", "-no-reboot", "-display", "none"])
        .args([
            "-machine",
            if machine.kvm {
                "q35,accel=kvm"
            } else {
                "q35,accel=tcg"
            },
        ])
        .args(["-cpu", if machine.kvm { "host" } else { "max" }])
        .args(["-m", &boot.memory_mib.to_string()])
        .args(["-smp", &boot.cpus.to_string()])
        .arg("-kernel")
        .arg(&machine.kernel)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-serial", &format!("file:{}", serial.display())])
        .arg("-append")
        // no_timer_check: under TCG on a busy host the guest's check that
        // the IO-APIC timer ticks can miss, and the kernel panics at boot
        // ("IO-APIC + timer doesn't work!"; seen with two VMs and a build
        // beside them). The check proves nothing about the host.
        .arg(format!(
            "console=ttyS0 panic=-1 loglevel=1 rdinit=/init cgroup_no_v1=all \
             systemd.unified_cgroup_hierarchy=1 psi=1 no_timer_check {}",
            boot.append
        ));
    for d in &boot.disks {
        cmd.arg("-drive")
            .arg(format!("file={},format=raw,if=virtio", d.display()));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let mut timed_out = false;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > boot.timeout {
            let _ = child.kill();
            let _ = child.wait();
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let raw = fs::read(&serial).unwrap_or_default();
    let mut console = String::from_utf8_lossy(&raw).replace('\r', "");
    if !timed_out && let Some(mut e) = child.stderr.take() {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
        if !s.trim().is_empty() {
            console.push_str("\n@@qemu-stderr\n");
            console.push_str(&s);
        }
    }
    Output {
        console,
        elapsed: started.elapsed(),
        timed_out,
    }
}

/// The usual whole: writes `img` with `scenario` into a temporary file,
/// boots it, prints the console to stderr (the test's output on failure)
/// and checks that the scenario ran to its end before power-off.
pub fn run_scenario(machine: &Machine, mut img: Initramfs, scenario: &str, boot: &Boot) -> Output {
    // A TCG boot and its scenario are slow on purpose, never this slow.
    crate::common::deadline::arm_for(std::time::Duration::from_secs(1200));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("initramfs.cpio");
    // The scenario's own watchdog fires before the boot's, so a hung step
    // still leaves a console to read.
    img.write(
        &path,
        scenario,
        boot.timeout.saturating_sub(Duration::from_secs(30)),
    );
    let out = run(machine, &path, boot);
    eprintln!(
        "--- console ({:.1} s) ---\n{}",
        out.elapsed.as_secs_f64(),
        out.console
    );
    assert!(!out.timed_out, "the VM did not power off in time");
    assert!(out.completed(), "the scenario did not finish");
    out
}

/// The machine, or skip (fail under CI). The test crate must declare
/// `mod common;`.
pub fn machine_or_skip() -> Option<Machine> {
    match Machine::find() {
        Ok(m) => Some(m),
        Err(why) => {
            crate::common::require(false, &why);
            None
        }
    }
}

/// A static job from tests/fixtures/jobs/NAME.c, built with gcc -static
/// (the initramfs has no libc): `leak` allocates at a rate and prints
/// "checkpoint" and exits 0 on SIGTERM, oomguard's default checkpoint
/// signal; `cow` grows by copy-on-write alone.
pub fn static_job(dir: &Path, name: &str) -> Option<PathBuf> {
    let out = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/jobs/{name}.c"));
    let ok = Command::new("gcc")
        .args(["-O2", "-static", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    crate::common::require(
        ok,
        "gcc -static cannot build the VM's jobs (install gcc and libc6-dev)",
    )
    .then_some(out)
}
