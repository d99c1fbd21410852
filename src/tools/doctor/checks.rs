//! The doctor's checks, one function each. They call the probes a run
//! uses; a check that tries something the kernel must allow (a cgroup, a
//! v1 threshold, a PSI trigger) tries it for real and undoes it at once,
//! because permission bits do not tell what the kernel will accept.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Check, Env, Interpreter, SLOW_CHECK_DEADLINE, State};
use crate::engine::probe::cgroup::{self, CgroupReader, Location, OwnedCgroup, Threshold, Version};
use crate::engine::probe::system::{PriWake, parse_meminfo, parse_psi};
use crate::vocab::units::HumanBytes;

/// Below this `/dev/shm` is too small for DataLoader workers' batches.
const SHM_MIN: u64 = 1 << 30;
/// Docker's default `/dev/shm`.
const DOCKER_SHM: u64 = 64 << 20;

/// What several checks need, read once.
pub struct Facts {
    pub loc: Option<Location>,
    pub cg: Option<crate::vocab::model::CgroupSample>,
    /// (total, available, swap total, swap free), bytes.
    pub meminfo: Option<(u64, u64, u64, u64)>,
    pub proc_root: std::path::PathBuf,
}

impl Facts {
    pub fn gather(env: &Env) -> Self {
        let loc = cgroup::locate(&env.proc_root, "self");
        let cg = loc
            .as_ref()
            .and_then(|l| CgroupReader::new(l.clone(), false).read());
        let meminfo = std::fs::read_to_string(env.proc_root.join("meminfo"))
            .ok()
            .and_then(|t| parse_meminfo(&t));
        Self {
            loc,
            cg,
            meminfo,
            proc_root: env.proc_root.clone(),
        }
    }

    /// The limit's usage counter, when a cgroup limit applies.
    fn limit_usage_file(&self) -> Option<std::path::PathBuf> {
        let (loc, cg) = (self.loc.as_ref()?, self.cg.as_ref()?);
        cg.limit_bytes?;
        let path = cg.limit_path.as_deref()?;
        Some(CgroupReader::new(loc.clone(), false).usage_file(path))
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Required: the ceiling that would apply is readable.
pub fn ceiling(f: &Facts) -> Check {
    let machine = f
        .meminfo
        .map(|(total, avail, _, _)| json!({"total_bytes": total, "available_bytes": avail}));
    let cgroup = f.loc.as_ref().map(|l| {
        json!({
            "version": l.version.number(),
            "path": l.path,
            "limit_bytes": f.cg.as_ref().and_then(|c| c.limit_bytes),
            "limit_path": f.cg.as_ref().and_then(|c| c.limit_path.clone()),
            "usage_bytes": f.cg.as_ref().map(|c| c.usage_bytes),
        })
    });
    let details = json!({"cgroup": cgroup, "machine": machine});
    if let (Some(loc), Some(cg)) = (&f.loc, &f.cg)
        && let (Some(limit), Some(path)) = (cg.limit_bytes, cg.limit_path.as_deref())
    {
        return Check::new(
            "ceiling",
            State::Ok,
            format!(
                "cgroup v{} limit {} on {path} ({} in use)",
                loc.version.number(),
                HumanBytes(limit),
                HumanBytes(cg.limit_working_set_bytes.unwrap_or(cg.usage_bytes))
            ),
        )
        .required()
        .details(details);
    }
    let no_limit = match (&f.loc, &f.cg) {
        (Some(l), Some(_)) => format!(
            "no memory limit on cgroup v{} {}",
            l.version.number(),
            l.path
        ),
        (Some(l), None) => format!("cgroup {} has no readable memory files", l.dir().display()),
        (None, _) => "no memory cgroup found".to_string(),
    };
    match f.meminfo {
        Some((total, avail, _, _)) => Check::new(
            "ceiling",
            State::Ok,
            format!(
                "the machine: {} in all, {} available ({no_limit}; --budget sets a tighter one)",
                HumanBytes(total),
                HumanBytes(avail)
            ),
        )
        .required()
        .details(details),
        None => Check::new("ceiling", State::Fail, "no ceiling can be read")
            .required()
            .why(format!(
                "{no_limit}, and {} is unreadable",
                f.proc_root.join("meminfo").display()
            ))
            .remedy(
                "mount procfs at /proc (in a container, do not mask /proc/meminfo) and the \
                 cgroup hierarchy at /sys/fs/cgroup, read-only is enough",
            )
            .details(details),
    }
}

/// The kernel wake-ups a run would register, tried for real and dropped.
fn kernel_wakeups(f: &Facts) -> Vec<String> {
    let mut found = Vec::new();
    if let (Some(loc), Some(cg)) = (&f.loc, &f.cg)
        && let (Some(limit), Some(path)) = (cg.limit_bytes, cg.limit_path.as_deref())
    {
        let reader = CgroupReader::new(loc.clone(), false);
        if let Some(dir) = reader.limit_dir(path)
            && Threshold::register(&dir, limit / 10 * 8).is_ok()
        {
            found.push("kernel usage thresholds (cgroup v1 cgroup.event_control)".to_string());
        }
        if loc.version == Version::V2 {
            let dir = reader.usage_file(path).with_file_name("memory.events");
            if PriWake::events(&dir).is_ok() {
                found.push(format!("{} wake-ups", dir.display()));
            }
        }
    }
    let psi = f
        .loc
        .as_ref()
        .filter(|l| l.version == Version::V2)
        .map(|l| l.dir().join("memory.pressure"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| f.proc_root.join("pressure/memory"));
    if PriWake::psi_trigger(&psi, 200_000, 2_000_000).is_ok() {
        found.push(format!("a PSI trigger on {} (2 s window)", psi.display()));
    }
    found
}

/// Required: a way to act before the kernel does.
pub fn act_in_time(f: &Facts, owned: bool) -> Check {
    let mut means = kernel_wakeups(f);
    if owned {
        means.push("a cgroup of its own (the job's exact footprint)".to_string());
    }
    if let Some(file) = f.limit_usage_file() {
        let t = Instant::now();
        if std::fs::read_to_string(&file).is_ok() {
            means.push(format!(
                "the cheap loop over {} ({} µs a read)",
                file.display(),
                t.elapsed().as_micros()
            ));
        }
    }
    let stat = f.proc_root.join("self/stat");
    if (f.meminfo.is_some() || f.cg.is_some()) && std::fs::read_to_string(&stat).is_ok() {
        means.push("fast polling near the ceiling (250 → 100 → 20 ms ticks)".to_string());
    }
    let details = json!({"means": means});
    if means.is_empty() {
        return Check::new(
            "act_in_time",
            State::Fail,
            "no way to notice memory running out",
        )
        .required()
        .why(format!(
            "no kernel wake-up, no cgroup of its own, and neither {} nor a cgroup usage \
                 counter can be read for polling",
            f.proc_root.join("meminfo").display()
        ))
        .remedy(
            "mount procfs at /proc and the cgroup hierarchy at /sys/fs/cgroup (read-only \
                 is enough) where oomguard runs",
        )
        .details(details);
    }
    Check::new("act_in_time", State::Ok, means.join("; "))
        .required()
        .details(details)
}

/// Whether `oomguard run` here would ask the user's systemd manager for a
/// transient scope of its own (`crate::job::systemd`, the run's own test: not
/// root, cgroup v2, a cgroup it may leave, a user bus), or why not.
pub fn user_scope(loc: &cgroup::Location) -> Result<String, String> {
    if is_root() {
        return Err("root creates the job's cgroup directly".to_string());
    }
    let uid = rustix::process::getuid().as_raw();
    crate::job::systemd::may_leave(loc, uid)?;
    crate::job::systemd::user_scope_support()
        .map(|bus| format!("{} ({})", bus.address, bus.found_in))
}

/// Advisory: whether oomguard can create a cgroup for the job, found out
/// by creating the one a run would (`oomguard-<pid>`) and removing it.
pub fn own_cgroup(f: &Facts) -> Check {
    let Some(loc) = &f.loc else {
        return Check::new(
            "own_cgroup",
            State::Warn,
            "no memory cgroup to create one in",
        )
        .why("no memory controller is mounted (or /proc/self/cgroup names none)")
        .remedy("mount the cgroup hierarchy at /sys/fs/cgroup with the memory controller");
    };
    let name = format!("oomguard-{}", std::process::id());
    let created = OwnedCgroup::create(loc, &name).map(|c| {
        let dir = c.location().dir();
        drop(c);
        dir
    });
    let details = json!({"parent": loc.dir(), "version": loc.version.number()});
    match created {
        Ok(dir) if !dir.exists() => Check::new(
            "own_cgroup",
            State::Ok,
            format!(
                "can create the job's cgroup in {} (exact footprint, kernel wake-ups{})",
                loc.dir().display(),
                if loc.version == Version::V2 {
                    ", memory.high"
                } else {
                    ""
                }
            ),
        )
        .details(details),
        Ok(dir) => Check::new(
            "own_cgroup",
            State::Warn,
            "created a cgroup but could not remove it",
        )
        .why(format!("{} is still there", dir.display()))
        .remedy(format!("remove it: rmdir {}", dir.display()))
        .details(details),
        Err(e) => {
            let scope = user_scope(loc);
            let mut details = details;
            details["user_scope_possible"] = json!(scope.is_ok());
            match scope {
                Ok(bus) => {
                    details["user_bus"] = json!(bus);
                    Check::new(
                        "own_cgroup",
                        State::Ok,
                        "no cgroup can be made here, but `oomguard run` asks the user's systemd \
                         manager for a scope of its own (exact footprint, memory.high)",
                    )
                    .why(e.to_string())
                    .details(details)
                }
                Err(why_not) => {
                    details["user_scope"] = json!(why_not);
                    Check::new(
                        "own_cgroup",
                        State::Warn,
                        "no cgroup of its own: the footprint is the PSS sum, the limit chain is \
                         still read",
                    )
                    .why(format!("{e}; no user scope: {why_not}"))
                    .remedy(own_cgroup_remedy(&e, loc.version))
                    .details(details)
                }
            }
        }
    }
}

/// What to do when the job's cgroup cannot be created.
fn own_cgroup_remedy(e: &cgroup::OwnError, version: Version) -> String {
    use cgroup::OwnError;
    let first = "start oomguard as the first and only process of a delegated cgroup: \
                 `systemd-run --scope -p Delegate=yes oomguard run -- …`, or `srun oomguard run -- …`";
    match (e, version) {
        (OwnError::NoMemoryController(_), _) => {
            "mount the cgroup hierarchy with the memory controller at /sys/fs/cgroup".to_string()
        }
        (OwnError::OtherProcesses { .. }, _) => first.to_string(),
        _ if is_root() => "the cgroup tree is not writable here even for root (a container's \
                           read-only /sys/fs/cgroup): give the container a writable cgroup \
                           namespace, or accept the PSS sum"
            .to_string(),
        (_, Version::V1) => "run oomguard as root, or have an admin create a memory cgroup you \
                             may write (chown its directory, cgroup.procs and \
                             cgroup.event_control) and start oomguard in it"
            .to_string(),
        (_, Version::V2) => format!(
            "run oomguard as root, or {first} (a container needs a writable cgroup namespace)"
        ),
    }
}

/// Advisory: PSI for the system and the cgroup, and what window an
/// unprivileged trigger gets.
pub fn psi(f: &Facts) -> Check {
    let system = f.proc_root.join("pressure/memory");
    let reading = std::fs::read_to_string(&system)
        .ok()
        .and_then(|t| parse_psi(&t));
    let Some(reading) = reading else {
        return Check::new("psi", State::Warn, "no pressure stall information")
            .why(format!("{} is missing or unreadable", system.display()))
            .remedy(
                "boot a kernel with CONFIG_PSI (4.20 or newer) and `psi=1` on its command line \
                 where it is off by default; the cheap loop and fast polling act without it",
            );
    };
    let slow = PriWake::psi_trigger(&system, 200_000, 2_000_000);
    let fast = PriWake::psi_trigger(&system, 50_000, 500_000);
    let cgroup_file = f
        .loc
        .as_ref()
        .filter(|l| l.version == Version::V2)
        .map(|l| l.dir().join("memory.pressure"));
    let cgroup_psi = cgroup_file
        .as_ref()
        .filter(|p| std::fs::read_to_string(p).is_ok());
    let cgroup_trigger = cgroup_psi.map(|p| PriWake::psi_trigger(p, 200_000, 2_000_000).is_ok());
    let details = json!({
        "system": {"file": system, "some_avg10": reading.some_avg10, "full_avg10": reading.full_avg10},
        "trigger_2s": slow.is_ok(),
        "trigger_500ms": fast.is_ok(),
        "cgroup": cgroup_file.as_ref().map(|p| json!({
            "file": p, "readable": cgroup_psi.is_some(), "trigger_2s": cgroup_trigger,
        })),
    });
    let scope = match (&cgroup_psi, f.loc.as_ref().map(|l| l.version)) {
        (Some(_), _) => "system and cgroup",
        (None, Some(Version::V1)) => "system (cgroup v1 has no per-cgroup PSI)",
        (None, _) => "system only",
    };
    match (&slow, &fast) {
        (Err(e), _) => Check::new(
            "psi",
            State::Warn,
            format!(
                "PSI readable ({scope}, some avg10 {:.2} %), but no trigger",
                reading.some_avg10
            ),
        )
        .why(format!(
            "a trigger on {} was refused: {e}",
            system.display()
        ))
        .remedy(
            "a kernel of 6.5 or newer accepts unprivileged triggers with a 2 s window; until \
             then the cheap loop and fast polling act without them",
        )
        .details(details),
        (Ok(_), Err(_)) => Check::new(
            "psi",
            State::Ok,
            format!("PSI readable ({scope}); triggers with a 2 s window only"),
        )
        .why(
            "without CAP_SYS_RESOURCE a trigger must use a 2 s window, too slow for a cgroup \
             that fills in half a second: the cheap loop covers that",
        )
        .details(details),
        (Ok(_), Ok(_)) => Check::new(
            "psi",
            State::Ok,
            format!("PSI readable ({scope}); triggers with windows below 2 s accepted"),
        )
        .details(details),
    }
}

/// Advisory: swap, and what it changes.
pub fn swap(f: &Facts) -> Check {
    let swappiness = std::fs::read_to_string(f.proc_root.join("sys/vm/swappiness"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let Some((_, _, total, free)) = f.meminfo else {
        return Check::new("swap", State::Warn, "swap unknown")
            .why(format!(
                "{} is unreadable",
                f.proc_root.join("meminfo").display()
            ))
            .remedy("mount procfs at /proc");
    };
    let details = json!({"total_bytes": total, "used_bytes": total.saturating_sub(free), "swappiness": swappiness});
    if total == 0 {
        return Check::new(
            "swap",
            State::Ok,
            "no swap: memory ends at the ceiling, with no swap storm first",
        )
        .details(details);
    }
    Check::new(
        "swap",
        State::Ok,
        format!(
            "{} of swap, {} used: counted in the footprint, swap-in storms watched (swap_in_rate)",
            HumanBytes(total),
            HumanBytes(total.saturating_sub(free))
        ),
    )
    .details(details)
}

/// Advisory: `/dev/shm`, where DataLoader workers pass batches.
pub fn shm(path: &Path) -> Check {
    let st = match rustix::fs::statvfs(path) {
        Ok(st) => st,
        Err(e) => {
            return Check::new("shm", State::Warn, format!("{} is missing", path.display()))
                .why(format!("statvfs {}: {e}", path.display()))
                .remedy(
                    "mount a tmpfs at /dev/shm (DataLoader workers with num_workers > 0 pass \
                     batches through it)",
                );
        }
    };
    let size = st.f_blocks.saturating_mul(st.f_frsize);
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let details = json!({"path": path, "size_bytes": size, "free_bytes": free});
    if size >= SHM_MIN {
        return Check::new(
            "shm",
            State::Ok,
            format!(
                "{} of {} ({} free)",
                path.display(),
                HumanBytes(size),
                HumanBytes(free)
            ),
        )
        .details(details);
    }
    let docker = if size == DOCKER_SHM {
        " (Docker's default of 64 MiB)"
    } else {
        ""
    };
    Check::new(
        "shm",
        State::Warn,
        format!("{} is only {}{docker}", path.display(), HumanBytes(size)),
    )
    .why(
        "DataLoader workers pass batches through /dev/shm; a small one fails with \"bus error\" \
         or \"No space left on device\", not an OOM kill",
    )
    .remedy(
        "docker run --shm-size=8g (or --ipc=host); on Kubernetes mount an emptyDir with \
         medium: Memory at /dev/shm",
    )
    .details(details)
}

/// Advisory: desktop notifications, as `run` sends them.
pub fn notifications() -> Check {
    let ci = crate::settings::in_ci();
    let bus = crate::job::systemd::session_bus();
    let details = json!({"session_bus": bus, "ci": ci});
    if bus && !ci {
        return Check::new(
            "notifications",
            State::Ok,
            "desktop notifications on warnings and stops (session bus found)",
        )
        .details(details);
    }
    Check::new("notifications", State::Warn, "no desktop notifications")
        .why(if ci {
            "CI=true turns them off".to_string()
        } else {
            "no session bus (DBUS_SESSION_BUS_ADDRESS, $XDG_RUNTIME_DIR/bus): a headless or SSH \
             session"
                .to_string()
        })
        .remedy(
            "to be told elsewhere, give `--on-warn 'CMD'` (it runs on every warning with \
             OOMGUARD_* variables, e.g. curl to a chat webhook)",
        )
        .details(details)
}

/// A slow check running on a thread of its own.
pub struct Slow {
    name: &'static str,
    rx: mpsc::Receiver<Check>,
}

pub fn spawn_slow(name: &'static str, f: impl FnOnce() -> Check + Send + 'static) -> Slow {
    let (tx, rx) = mpsc::channel();
    let on_error = tx.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("doctor-{name}"))
        .spawn(move || {
            let _ = tx.send(f());
        });
    if let Err(e) = spawned {
        let _ = on_error.send(
            Check::new(name, State::Warn, "could not be checked")
                .why(format!("cannot start a thread: {e}"))
                .remedy("run `oomguard doctor` again with fewer processes running"),
        );
    }
    Slow { name, rx }
}

impl Slow {
    /// The check's result, or a warning that it did not answer by
    /// `deadline` (the thread is left behind; the process ends soon).
    pub fn join(self, deadline: Instant) -> Check {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(c) => c,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Check::new(self.name, State::Warn, "could not be checked")
                    .why("the check failed inside oomguard (a bug)")
                    .remedy("please report it, with `oomguard doctor --format json`'s output")
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Check::new(self.name, State::Warn, "did not answer in time")
                    .why(format!(
                        "no answer within {:.1} s",
                        SLOW_CHECK_DEADLINE.as_secs_f64()
                    ))
                    .remedy(format!(
                        "run `oomguard doctor` again; if it persists, check {} by hand",
                        self.name
                    ))
            }
        }
    }
}

/// Advisory: NVML, the driver and the GPUs.
pub fn nvml(lib: Option<&Path>) -> Check {
    use crate::engine::probe::gpu::{GpuProbe, GpuProbeOptions, GpuUnavailable};
    let options = GpuProbeOptions {
        init_timeout: SLOW_CHECK_DEADLINE - Duration::from_millis(300),
        sample_wait: Duration::from_millis(200),
        ..GpuProbeOptions::default()
    };
    match GpuProbe::open_with(lib, options) {
        Ok(mut p) => {
            let gpus: Vec<serde_json::Value> = p
                .sample()
                .map(|r| {
                    r.devices
                        .iter()
                        .map(|d| json!({"index": d.index, "name": d.name, "total_bytes": d.total_bytes, "used_bytes": d.used_bytes}))
                        .collect()
                })
                .unwrap_or_default();
            let names: Vec<String> = gpus
                .iter()
                .filter_map(|g| g["name"].as_str().map(str::to_string))
                .collect();
            Check::new(
                "nvml",
                State::Ok,
                format!(
                    "NVML {} (driver {}): {} GPU{}{}",
                    p.lib(),
                    p.driver_version().unwrap_or("unknown"),
                    p.device_count(),
                    if p.device_count() == 1 { "" } else { "s" },
                    if names.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", names.join(", "))
                    }
                ),
            )
            .details(json!({
                "lib": p.lib(), "driver_version": p.driver_version(),
                "device_count": p.device_count(), "gpus": gpus,
            }))
        }
        Err(e) => {
            let remedy = match e {
                GpuUnavailable::LibraryNotFound { .. } => {
                    "on a machine with NVIDIA GPUs, install the driver (it brings \
                     libnvidia-ml.so.1) or point --nvml-lib at the library; without GPUs \
                     nothing is lost"
                }
                GpuUnavailable::NoPermission => {
                    "give this user access to /dev/nvidia* (the video group, or the \
                     container's --gpus flag)"
                }
                GpuUnavailable::DriverNotLoaded => {
                    "load the NVIDIA kernel module (nvidia-smi says why)"
                }
                _ => "check the driver with nvidia-smi; --no-gpu turns GPU watching off",
            };
            Check::new("nvml", State::Warn, "GPU memory is not watched")
                .why(e.to_string())
                .remedy(remedy)
        }
    }
}

/// Asks `python3` for its version, torch and the frameworks the companion
/// hooks, and imports the companion the way a run provides it.
const PYTHON_SCRIPT: &str = r#"
import json, sys
import importlib.util as u
r = {"version": sys.version.split()[0], "executable": sys.executable}
try:
    import importlib.metadata as m
except Exception:
    m = None
def ver(mod, dist):
    try:
        if u.find_spec(mod) is None:
            return None
    except Exception:
        return None
    try:
        return m.version(dist) if m else "?"
    except Exception:
        return "?"
for mod, dist in (("torch", "torch"), ("lightning", "lightning"),
                  ("pytorch_lightning", "pytorch-lightning"),
                  ("transformers", "transformers"), ("accelerate", "accelerate")):
    r[mod] = ver(mod, dist)
try:
    import oomguard
    r["companion"] = True
except Exception as e:
    r["companion"] = False
    r["companion_error"] = repr(e)
print(json.dumps(r))
"#;

/// The first `name` on `PATH`.
pub fn which(name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Advisory: whether the job's Python has torch and can load the
/// companion: the command's interpreter with `doctor -- CMD` when the
/// command names one, else `python3` on `PATH`.
pub fn python(interpreter: &Interpreter) -> Check {
    let found = match interpreter {
        Interpreter::OfCommand(p) => Some(p.clone()),
        Interpreter::OnPath | Interpreter::Unknown => which("python3"),
    };
    let Some(py) = found else {
        return Check::new("python", State::Warn, "no python3 on PATH")
            .why(
                "PATH has no python3: the companion (checkpoint on request) needs the job's Python",
            )
            .remedy("activate the training environment (venv, conda) before running oomguard");
    };
    let mut check = match ask_python(&py) {
        Ok(info) => python_verdict(&py, interpreter, info),
        Err(e) => Check::new(
            "python",
            State::Warn,
            format!("{} did not answer", py.display()),
        )
        .why(e)
        .remedy(format!(
            "check that `{} -c 'import sys'` works in this environment",
            py.display()
        )),
    };
    if *interpreter == Interpreter::Unknown {
        check
            .summary
            .push_str(" (python3 on PATH: the command does not name its Python)");
    }
    check
}

/// Runs [`PYTHON_SCRIPT`] with the companion package on `PYTHONPATH`,
/// killed at the deadline.
fn ask_python(py: &Path) -> Result<serde_json::Value, String> {
    use std::io::Read;
    // The companion package as a run provides it (the start-up hook puts
    // `companion/` on sys.path under a run; here it is put there directly).
    let inj = crate::job::inject::TorchStatsInjector::new(Duration::from_secs(1))
        .map_err(|e| format!("cannot provide the companion: {e}"))?
        .without_stats();
    let mut pythonpath = std::ffi::OsString::from(inj.dir().join("companion"));
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        pythonpath.push(":");
        pythonpath.push(old);
    }
    let mut child = std::process::Command::new(py)
        .args(["-c", PYTHON_SCRIPT])
        .env("PYTHONPATH", pythonpath)
        .env_remove("OOMGUARD_CONTROL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", py.display()))?;
    let deadline = Instant::now() + SLOW_CHECK_DEADLINE - Duration::from_millis(100);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer within {:.1} s",
                    py.display(),
                    SLOW_CHECK_DEADLINE.as_secs_f64()
                ));
            }
        }
    }
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    serde_json::from_str(out.trim()).map_err(|e| format!("unexpected answer {out:?}: {e}"))
}

fn python_verdict(py: &Path, interpreter: &Interpreter, info: serde_json::Value) -> Check {
    let version = info["version"].as_str().unwrap_or("?").to_string();
    let torch = info["torch"].as_str().map(str::to_string);
    let companion = info["companion"].as_bool().unwrap_or(false);
    let frameworks: Vec<String> = [
        "lightning",
        "pytorch_lightning",
        "transformers",
        "accelerate",
    ]
    .iter()
    .filter_map(|k| info[*k].as_str().map(|v| format!("{k} {v}")))
    .collect();
    let of_command = matches!(interpreter, Interpreter::OfCommand(_));
    // The command's interpreter by its path; `python3` on PATH by name.
    let name = if of_command {
        py.display().to_string()
    } else {
        "python3".to_string()
    };
    let details = json!({
        "python3": py,
        "interpreter": py,
        "source": if of_command { "command" } else { "path" },
        "info": info,
    });
    if !companion {
        return Check::new(
            "python",
            State::Warn,
            format!("{name} {version} cannot load the companion"),
        )
        .why(
            info["companion_error"]
                .as_str()
                .unwrap_or("import failed")
                .to_string(),
        )
        .remedy("use Python 3.8 or newer for the job; stops then send the checkpoint signal only")
        .details(details);
    }
    let Some(torch) = torch else {
        if of_command {
            return Check::new(
                "python",
                State::Warn,
                format!(
                    "{name} {version} (the command's Python) has no torch; the companion loads"
                ),
            )
            .why(format!("torch is not importable from {name}"))
            .remedy(format!(
                "`{name} -m pip install torch`, if the job needs it"
            ))
            .details(details);
        }
        return Check::new(
            "python",
            State::Warn,
            format!(
                "python3 {version} ({}) has no torch; the companion loads",
                py.display()
            ),
        )
        .why("torch is not importable from python3 on PATH")
        .remedy(
            "if training uses another Python (a venv, conda), activate it before running \
             oomguard, or name it: `oomguard doctor -- <venv>/bin/python train.py`; \
             otherwise `pip install torch`",
        )
        .details(details);
    };
    let extra = if frameworks.is_empty() {
        String::new()
    } else {
        format!(", {}", frameworks.join(", "))
    };
    Check::new(
        "python",
        State::Ok,
        format!(
            "{name} {version}: torch {torch}{extra}; the companion loads (checkpoint on request)"
        ),
    )
    .details(details)
}

/// Advisory: the kernel log, for naming and explaining OOM kills.
pub fn kernel_log() -> Check {
    use crate::vocab::forensics::kmsg;
    let restrict = std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let details = json!({"dmesg_restrict": restrict});
    match kmsg::read_kernel_log(Some(Duration::from_secs(1))) {
        Ok(log) => Check::new(
            "kernel_log",
            State::Ok,
            format!(
                "readable ({}): OOM kills come with the kernel's own report",
                log.source
            ),
        )
        .details(details),
        Err(e) => Check::new(
            "kernel_log",
            State::Warn,
            "kernel log unreadable: an OOM kill is still named (the cgroup's oom_kill counter), \
             without the kernel's choice of victim and constraint",
        )
        .why(match restrict {
            Some(1) => "kernel.dmesg_restrict=1".to_string(),
            _ => "no source of the kernel log could be read".to_string(),
        })
        .remedy(e.to_string())
        .details(details),
    }
}

/// Advisory, `doctor -- CMD` only: whether a stop would lose the
/// command's work.
pub fn stop_saves(p: &super::probe::Probed) -> Check {
    use crate::job::supervise::signal_name;
    let details = json!({"command": p.command, "finding": p.finding, "run_exit": p.run_exit});
    let Some(found) = &p.finding else {
        return Check::new(
            "stop_saves",
            State::Warn,
            format!(
                "the command ended before it could be judged (exit {})",
                p.run_exit
            ),
        )
        .why("it exited (or failed to start) before showing progress")
        .remedy("run it as you would train, e.g. `oomguard doctor -- python train.py`")
        .details(details);
    };
    let v = &found.verdict;
    let when = match found.step {
        Some(s) => format!("at step {s}, {:.1} s in", found.waited_seconds),
        None => format!("after {:.1} s without progress", found.waited_seconds),
    };
    let signal = signal_name(v.signal);
    if v.companion {
        return Check::new(
            "stop_saves",
            State::Ok,
            format!("a stop saves: the companion answered ({when}); it checkpoints on request"),
        )
        .details(details);
    }
    if let (false, Some(why)) = (v.companion, &v.framework) {
        return Check::new(
            "stop_saves",
            State::Warn,
            format!("a stop would lose the work since the last checkpoint ({when})"),
        )
        .why(why.clone())
        .remedy(
            "let the companion load (do not pass --no-companion; python3 must import it: see \
             the python check), or configure the checkpoint signal the trainer saves on",
        )
        .details(details);
    }
    if v.loses_work() {
        let pids: Vec<String> = v.deaf.iter().map(u32::to_string).collect();
        return Check::new(
            "stop_saves",
            State::Warn,
            format!("a stop would lose the work since the last checkpoint ({when})"),
        )
        .why(format!(
            "the trainer (pid {}) catches {}, and no companion answered",
            pids.join(", "),
            if v.signal == libc::SIGTERM {
                "no SIGTERM".to_string()
            } else {
                format!("neither {signal} nor SIGTERM")
            }
        ))
        .remedy(
            "use a Lightning or Hugging Face Trainer (they save on request under oomguard), \
             call oomguard.guard() in a plain loop (python/oomguard), or save on SIGTERM \
             (or --checkpoint-signal)",
        )
        .details(details);
    }
    if v.unknown.len() == v.trainers.len() {
        return Check::new(
            "stop_saves",
            State::Warn,
            format!("cannot tell whether a stop saves ({when})"),
        )
        .why("the trainer's signal handlers could not be read (it was gone)")
        .remedy("run the doctor with the command you train with")
        .details(details);
    }
    Check::new(
        "stop_saves",
        State::Ok,
        format!(
            "a stop can save: the trainer catches {} ({when})",
            if v.signal == libc::SIGTERM {
                "SIGTERM".to_string()
            } else {
                format!("{signal} or SIGTERM")
            }
        ),
    )
    .details(details)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::probe::system::TEST_MEMINFO as MEMINFO;

    /// A proc root with `meminfo` (or not) and no cgroup.
    fn root(meminfo: Option<&str>) -> (tempfile::TempDir, Facts) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("self")).unwrap();
        std::fs::write(dir.path().join("self/stat"), "1 (x) S").unwrap();
        if let Some(m) = meminfo {
            std::fs::write(dir.path().join("meminfo"), m).unwrap();
        }
        let env = Env {
            proc_root: dir.path().to_path_buf(),
            ..Env::default()
        };
        let facts = Facts::gather(&env);
        (dir, facts)
    }

    #[test]
    fn without_a_cgroup_the_machine_is_the_ceiling_and_polling_acts() {
        let (_d, f) = root(Some(MEMINFO));
        assert!(f.loc.is_none());
        let c = ceiling(&f);
        assert_eq!(c.state, State::Ok, "{c:?}");
        assert!(c.summary.contains("the machine"), "{c:?}");
        assert_eq!(c.details["machine"]["total_bytes"], 24000000u64 * 1024);
        let a = act_in_time(&f, false);
        assert_eq!(a.state, State::Ok, "{a:?}");
        assert!(a.summary.contains("fast polling"), "{a:?}");
        let s = swap(&f);
        assert_eq!(s.details["used_bytes"], 500000u64 * 1024);
    }

    #[test]
    fn without_meminfo_or_a_cgroup_both_required_checks_fail_with_a_remedy() {
        let (_d, f) = root(None);
        for c in [ceiling(&f), act_in_time(&f, false)] {
            assert_eq!((c.state, c.required), (State::Fail, true), "{c:?}");
            assert!(c.why.is_some() && c.remedy.is_some(), "{c:?}");
        }
        // Garbage in meminfo is no ceiling either, and no panic.
        let (_d, f) = root(Some("MemTotal: lots\n\0\u{fffd}"));
        assert_eq!(ceiling(&f).state, State::Fail);
    }

    #[test]
    fn the_report_fails_only_on_required_checks() {
        let mk = |name, required, state| Check {
            required,
            ..Check::new(name, state, "x")
        };
        let mut r = super::super::Report {
            schema: super::super::SCHEMA,
            ok: true,
            elapsed_seconds: 0.0,
            checks: vec![
                mk("ceiling", true, State::Ok),
                mk("psi", false, State::Warn),
            ],
            probe: None,
        };
        assert_eq!(r.exit_code(), 0);
        r.ok = false;
        assert_eq!(r.exit_code(), super::super::EXIT_REQUIRED);
        let v: serde_json::Value = serde_json::from_str(&r.render_json()).unwrap();
        assert_eq!(v["checks"][1]["state"], "warn");
        assert!(r.render_text().contains("Advisory:"));
    }

    #[test]
    fn a_missing_dev_shm_is_a_warning_with_a_remedy() {
        // statvfs of a path that does not exist is a warning, not a panic.
        let c = shm(Path::new("/nonexistent/shm"));
        assert_eq!(c.state, State::Warn);
        assert!(c.remedy.is_some());
    }

    #[test]
    fn a_user_scope_needs_cgroup_v2() {
        let v1 = cgroup::Location {
            version: Version::V1,
            mount_point: "/sys/fs/cgroup/memory".into(),
            path: "/".into(),
        };
        assert!(user_scope(&v1).is_err());
    }
}
