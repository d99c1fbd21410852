//! `oomguard doctor`: the report names every check and its state, answers
//! within 2 s, decides its exit code by the required checks alone, and
//! tells the truth in each environment — as root on the host, as an
//! unprivileged user in a root-made memory cgroup, with /proc and the
//! cgroup tree hidden (the required checks fail), with the fake NVML, and
//! in the cgroup v2 VM as root and as a normal user. `doctor -- CMD` says
//! whether a stop would lose the work of a trainer that catches SIGTERM,
//! one that does not, and one with the companion, and leaves nothing
//! running.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::fake_nvml;
use crate::support::vm;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

const NAMES: [&str; 10] = [
    "ceiling",
    "act_in_time",
    "own_cgroup",
    "psi",
    "swap",
    "nvml",
    "shm",
    "python",
    "kernel_log",
    "notifications",
];

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The parsed JSON report, with the output for failure messages.
struct Doctor {
    out: Output,
    json: Value,
    wall: Duration,
    /// The pid of the command run (oomguard itself, or what exec'd it).
    pid: u32,
}

impl Doctor {
    fn run(mut c: std::process::Command) -> Doctor {
        let t = Instant::now();
        let child = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let wall = t.elapsed();
        let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        Doctor {
            out,
            json,
            wall,
            pid,
        }
    }

    fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }

    fn check(&self, name: &str) -> &Value {
        self.json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {}", self.json))
    }

    fn state(&self, name: &str) -> &str {
        self.check(name)["state"].as_str().unwrap()
    }

    /// Every check is there once, with a state, and every gap has a why
    /// and a remedy.
    fn assert_complete(&self) {
        assert_eq!(self.json["schema"], "oomguard-doctor/1");
        let names: Vec<&str> = self.json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .filter(|n| *n != "stop_saves")
            .collect();
        assert_eq!(names, NAMES, "{}", self.json);
        for c in self.json["checks"].as_array().unwrap() {
            let state = c["state"].as_str().unwrap();
            assert!(["ok", "warn", "fail"].contains(&state), "{c}");
            let required = ["ceiling", "act_in_time"].contains(&c["name"].as_str().unwrap());
            assert_eq!(c["required"], required, "{c}");
            assert!(!c["summary"].as_str().unwrap().is_empty(), "{c}");
            if state != "ok" {
                assert!(c["why"].as_str().is_some_and(|w| !w.is_empty()), "{c}");
                assert!(c["remedy"].as_str().is_some_and(|r| r.len() > 10), "{c}");
            }
        }
        let ok = self.json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["required"] == false || c["state"] != "fail");
        assert_eq!(self.json["ok"], ok);
        assert_eq!(self.code(), if ok { 0 } else { 1 }, "{}", self.json);
    }
}

fn doctor_json(args: &[&str]) -> std::process::Command {
    let mut c = common::oomguard();
    c.args(["doctor", "--format", "json"]).args(args);
    c
}

/// As root on the host: every check, the required ones pass, the job's
/// cgroup could be created and is gone again, and the answer comes within
/// 2 s.
#[test]
fn serial_root_on_the_host_answers_every_check_within_2_s() {
    if !common::require(is_root(), "needs root") {
        return;
    }
    let _serial = common::serial();
    let d = Doctor::run(doctor_json(&[]));
    d.assert_complete();
    assert_eq!(d.code(), 0);
    assert_eq!(d.state("ceiling"), "ok");
    assert_eq!(d.state("act_in_time"), "ok");
    assert!(d.wall < Duration::from_secs(2), "took {:?}", d.wall);
    assert!(d.json["elapsed_seconds"].as_f64().unwrap() < 2.0);
    if let Some(own) = common::own_memory_cgroup() {
        assert_eq!(d.state("own_cgroup"), "ok", "{}", d.check("own_cgroup"));
        // Created as a run would, and removed (other tests' runs may
        // have theirs there now).
        let mine = own.join(format!("oomguard-{}", d.pid));
        assert!(!mine.exists(), "left behind: {}", mine.display());
    }
    // The text report says the same.
    let mut c = common::oomguard();
    let out = c.arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Required for prevention"), "{text}");
    for name in NAMES {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    assert_eq!(out.status.code(), Some(0), "{text}");
}

/// A normal user in a memory cgroup root made (limit 1 GiB): the limit is
/// the ceiling, the cheap loop is the way to act in time, no cgroup of its
/// own (with the reason and a remedy) — and the exit code is still 0.
#[test]
fn unprivileged_in_a_root_made_cgroup_gets_the_cheap_loop_and_exit_0() {
    let _machine = common::machine::beside();
    if !common::require(Path::new("/usr/bin/setpriv").exists(), "needs setpriv") {
        return;
    }
    let Some(cg) = common::MemCgroup::or_skip("doctor-user", 1 << 30) else {
        return;
    };
    let mut c = cg.command(
        Path::new("setpriv"),
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            env!("CARGO_BIN_EXE_oomguard"),
            "doctor",
            "--format",
            "json",
        ],
    );
    c.current_dir("/");
    let d = Doctor::run(c);
    d.assert_complete();
    assert_eq!(d.code(), 0, "advisories must not fail the command");
    let ceiling = d.check("ceiling");
    assert_eq!(ceiling["state"], "ok");
    assert_eq!(
        ceiling["details"]["cgroup"]["limit_bytes"],
        1u64 << 30,
        "{ceiling}"
    );
    let act = d.check("act_in_time");
    assert_eq!(act["state"], "ok");
    let means = act["details"]["means"].to_string();
    assert!(means.contains("cheap loop"), "{act}");
    assert!(
        !means.contains("thresholds"),
        "a normal user has none: {act}"
    );
    assert!(!means.contains("its own"), "{act}");
    let own = d.check("own_cgroup");
    assert_eq!(own["state"], "warn", "{own}");
    assert!(own["why"].as_str().unwrap().contains("ermission"), "{own}");
    assert!(own["remedy"].as_str().unwrap().contains("root"), "{own}");
}

/// `oomguard doctor --format json` in a mount namespace of its own, after
/// `mounts` (shell commands) changed what it sees; None without root.
fn in_mount_namespace(mounts: &str) -> Option<Doctor> {
    if !common::require(is_root(), "needs root (a mount namespace)") {
        return None;
    }
    let mut c = std::process::Command::new("unshare");
    common::deadline::arm();
    c.args(["-m", "sh", "-c"])
        .arg(format!("{mounts} && exec \"$0\" doctor --format json"))
        .arg(env!("CARGO_BIN_EXE_oomguard"))
        .stdin(std::process::Stdio::null());
    common::clean_env(&mut c);
    Some(Doctor::run(c))
}

/// With /proc/meminfo, /proc/pressure and the cgroup tree hidden (a mount
/// namespace), no ceiling can be read and nothing can act in time: both
/// required checks fail and the exit code is 1.
#[test]
fn hidden_proc_and_cgroups_fail_the_required_checks() {
    let _machine = common::machine::beside();
    let Some(d) = in_mount_namespace(
        "mount --bind /dev/null /proc/meminfo && mount -t tmpfs none /sys/fs/cgroup && \
         mount -t tmpfs none /proc/pressure",
    ) else {
        return;
    };
    d.assert_complete();
    assert_eq!(d.code(), 1);
    assert_eq!(d.json["ok"], false);
    for name in ["ceiling", "act_in_time"] {
        assert_eq!(d.state(name), "fail", "{}", d.check(name));
        assert!(
            d.check(name)["remedy"].as_str().unwrap().contains("/proc"),
            "{}",
            d.check(name)
        );
    }
}

/// The fake NVML: the library, the driver version and both GPUs; a
/// missing library is a warning with a remedy, never a failure.
#[test]
fn nvml_names_the_driver_and_the_gpus() {
    let _machine = common::machine::beside();
    let fake = fake_nvml::FakeNvml::new(
        "driver_version=535.104.05\n\
         gpu=0 total=85899345920 reserved=536870912 used=1073741824 util=3 uuid=GPU-a name=NVIDIA A100-SXM4-80GB\n\
         gpu=1 total=42949672960 reserved=536870912 used=0 util=0 uuid=GPU-b name=NVIDIA A100-SXM4-40GB\n",
    );
    let lib = fake.lib_path().to_str().unwrap();
    let d = Doctor::run(doctor_json(&["--nvml-lib", lib]));
    d.assert_complete();
    let nvml = d.check("nvml");
    assert_eq!(nvml["state"], "ok", "{nvml}");
    assert_eq!(nvml["details"]["driver_version"], "535.104.05");
    assert_eq!(nvml["details"]["device_count"], 2);
    let summary = nvml["summary"].as_str().unwrap();
    assert!(summary.contains("A100-SXM4-80GB"), "{summary}");
    assert!(summary.contains("535.104.05"), "{summary}");

    let d = Doctor::run(doctor_json(&[
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
    ]));
    d.assert_complete();
    let nvml = d.check("nvml");
    assert_eq!(nvml["state"], "warn", "{nvml}");
    assert!(
        nvml["why"].as_str().unwrap().contains("not found"),
        "{nvml}"
    );
}

/// `/dev/shm` of Docker's 64 MiB is named as such (a private tmpfs in a
/// mount namespace).
#[test]
fn a_64_mib_dev_shm_is_named_as_dockers_default() {
    let _machine = common::machine::beside();
    let Some(d) = in_mount_namespace("mount -t tmpfs -o size=64m none /dev/shm") else {
        return;
    };
    d.assert_complete();
    let shm = d.check("shm");
    assert_eq!(shm["state"], "warn", "{shm}");
    assert!(shm["summary"].as_str().unwrap().contains("Docker"), "{shm}");
    assert!(
        shm["remedy"].as_str().unwrap().contains("--shm-size"),
        "{shm}"
    );
}

/// `python3` on PATH: the torch environment's has torch and loads the
/// companion.
#[test]
fn python_with_torch_is_found() {
    let _machine = common::machine::beside();
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let path = format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = doctor_json(&[]);
    c.env("PATH", path);
    let d = Doctor::run(c);
    d.assert_complete();
    let py = d.check("python");
    assert_eq!(py["state"], "ok", "{py}");
    assert!(py["details"]["info"]["torch"].is_string(), "{py}");
    assert_eq!(py["details"]["info"]["companion"], true, "{py}");
}

/// A trainer that prints steps and writes its pid; `on_term` is its
/// SIGTERM handler's body (None: no handler).
fn trainer(dir: &Path, on_term: Option<&str>) -> std::path::PathBuf {
    let handler = on_term
        .map(|b| format!("signal.signal(signal.SIGTERM, lambda *a: ({b}))\n"))
        .unwrap_or_default();
    common::script(
        dir,
        "trainer.py",
        &format!(
            "import os, signal, sys, time\n{handler}\
             open(sys.argv[1], 'w').write(str(os.getpid()))\n\
             i = 0\n\
             while True:\n    print(f'step {{i}}/1000', flush=True)\n    i += 1\n    time.sleep(0.05)\n"
        ),
    )
}

/// `doctor -- CMD` on `argv`: the report, and the pid the job wrote.
fn probe(dir: &Path, argv: &[&str], env: &[(&str, &str)]) -> (Doctor, Option<u32>) {
    probe_waiting(dir, argv, env, "20s")
}

/// [`probe`] with `--wait`: a job that imports torch and Lightning on a
/// busy machine takes longer than 20 s to print its first step; the wait
/// ends at that step, so a longer one costs a fast job nothing.
fn probe_waiting(
    dir: &Path,
    argv: &[&str],
    env: &[(&str, &str)],
    wait: &str,
) -> (Doctor, Option<u32>) {
    let mut c = doctor_json(&["--wait", wait, "--"]);
    c.args(argv).current_dir(dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let d = Doctor::run(c);
    let pid = std::fs::read_to_string(dir.join("pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok());
    (d, pid)
}

/// The job is gone (not even a zombie left unreaped by oomguard matters:
/// oomguard has exited, so nothing of it may remain).
fn assert_gone(pid: Option<u32>) {
    let pid = pid.expect("the job wrote its pid");
    assert!(
        common::wait_for(Duration::from_secs(5), || !Path::new(&format!(
            "/proc/{pid}"
        ))
        .exists()),
        "the job (pid {pid}) is still running"
    );
}

#[test]
fn a_trainer_that_catches_sigterm_would_save() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let t = trainer(dir.path(), Some("sys.exit(0)"));
    let (d, pid) = probe(dir.path(), &["python3", t.to_str().unwrap(), "pid"], &[]);
    let c = d.check("stop_saves");
    assert_eq!(c["state"], "ok", "{c}");
    assert_eq!(
        c["details"]["finding"]["verdict"]["deaf"],
        serde_json::json!([])
    );
    assert!(
        c["details"]["finding"]["step"].is_u64(),
        "judged on progress: {c}"
    );
    assert_eq!(d.code(), 0);
    assert_gone(pid);
}

#[test]
fn a_trainer_that_does_not_catch_sigterm_would_lose_work() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let t = trainer(dir.path(), None);
    let (d, pid) = probe(dir.path(), &["python3", t.to_str().unwrap(), "pid"], &[]);
    let c = d.check("stop_saves");
    assert_eq!(c["state"], "warn", "{c}");
    assert_eq!(
        c["details"]["finding"]["verdict"]["deaf"],
        serde_json::json!([pid.unwrap()])
    );
    assert!(c["why"].as_str().unwrap().contains("no SIGTERM"), "{c}");
    assert!(c["details"]["finding"]["step"].is_u64(), "{c}");
    // An advisory: the exit code is the required checks'.
    assert_eq!(d.code(), 0);
    assert_gone(pid);
}

/// Lightning's banner with no companion speaking: the trainer catches
/// SIGTERM, but Lightning takes it as "stop" and saves nothing — the stop
/// path's framework warning, also said by the doctor.
#[test]
fn lightning_without_its_companion_would_lose_work() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let t = common::script(
        dir.path(),
        "fake_lightning.py",
        r#"import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
open("pid", "w").write(str(os.getpid()))
print("GPU available: False, used: False", flush=True)
i = 0
while True:
    print(f"step {i}/1000", flush=True)
    i += 1
    time.sleep(0.05)
"#,
    );
    let (d, pid) = probe(dir.path(), &["python3", t.to_str().unwrap()], &[]);
    let c = d.check("stop_saves");
    let err = String::from_utf8_lossy(&d.out.stderr);
    assert_eq!(c["state"], "warn", "{c}\n{err}");
    assert!(c["why"].as_str().unwrap().contains("Lightning"), "{c}");
    assert_eq!(
        c["details"]["finding"]["verdict"]["deaf"],
        serde_json::json!([])
    );
    assert_gone(pid);
}

/// Every file under `dir` (but the job's `pid`), with its length and a
/// checksum of its bytes (FNV-1a).
fn files(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, (usize, u64)> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n != "pid") {
                let bytes = std::fs::read(&p).unwrap_or_default();
                let sum = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                out.insert(p.clone(), (bytes.len(), sum));
            }
        }
    }
    out
}

/// `doctor -- <venv python> job` in `dir`: a stop would save (the companion
/// answered), the job is gone, and not a file under `dir` was added,
/// removed or changed by the check.
fn judged_with_a_companion_and_nothing_saved(dir: &Path, venv: &Path, job: &Path) {
    let before = files(dir);
    let py = venv.join("bin/python");
    let (d, pid) = probe_waiting(
        dir,
        &[py.to_str().unwrap(), job.to_str().unwrap()],
        &[],
        "90s",
    );
    let c = d.check("stop_saves");
    assert_eq!(c["state"], "ok", "{c}");
    assert_eq!(c["details"]["finding"]["verdict"]["companion"], true, "{c}");
    assert_gone(pid);
    assert_eq!(files(dir), before, "the check changed the job's directory");
}

/// The companion (a plain loop with `oomguard.guard()`, in the torch
/// environment's Python, saving when asked) answers: a stop asks it for a
/// checkpoint. The check itself saves nothing: no file under the job's
/// directory is added, removed or changed, and no resume record is left.
#[test]
fn a_trainer_with_the_companion_would_save() {
    let _machine = common::machine::beside();
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = common::script(
        dir.path(),
        "guarded.py",
        "import os, sys, time\nimport oomguard\n\
         open('pid', 'w').write(str(os.getpid()))\n\
         g = oomguard.guard()\n\
         for step in range(1, 100000):\n    time.sleep(0.05)\n    print(f'step {step}/100000', flush=True)\n\
         \x20   if g.step(step):\n        p = os.path.abspath(f'ckpt/step-{step}.pt')\n\
         \x20       open(p, 'w').write('saved')\n        g.checkpointed([p])\n\
         \x20       if g.should_exit():\n            sys.exit(0)\n",
    );
    std::fs::create_dir(dir.path().join("ckpt")).unwrap();
    std::fs::write(dir.path().join("ckpt/step-5.pt"), "the job's own").unwrap();
    judged_with_a_companion_and_nothing_saved(dir.path(), &venv, &job);
}

/// An unmodified Lightning job with `ModelCheckpoint(save_last=True)`: the
/// companion joins its Trainer (a stop would save), and the check leaves
/// its checkpoints as they were (no `last.ckpt` replaced, no step saved).
#[test]
fn a_lightning_job_is_judged_without_a_save() {
    let _machine = common::machine::beside_with(&[common::machine::Need::Torch]);
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job = common::script(
        dir.path(),
        "lit.py",
        "import os, time, torch\nimport lightning as L\n\
         from lightning.pytorch.callbacks import ModelCheckpoint\n\
         from torch.utils.data import DataLoader, TensorDataset\n\
         open('pid', 'w').write(str(os.getpid()))\n\
         class M(L.LightningModule):\n\
         \x20   def __init__(self):\n        super().__init__()\n        self.l = torch.nn.Linear(4, 1)\n\
         \x20   def training_step(self, b, i):\n        time.sleep(0.05)\n        print(f'step {self.global_step + 1}/100000', flush=True)\n\
         \x20       return self.l(b[0]).sum()\n\
         \x20   def configure_optimizers(self):\n        return torch.optim.SGD(self.parameters(), lr=0.01)\n\
         d = TensorDataset(torch.randn(100000, 4))\n\
         t = L.Trainer(max_steps=100000, default_root_dir='.', logger=False, enable_progress_bar=False,\n\
         \x20   accelerator='cpu', callbacks=[ModelCheckpoint(dirpath='ckpt', save_last=True)])\n\
         t.fit(M(), DataLoader(d, batch_size=1))\n",
    );
    std::fs::create_dir(dir.path().join("ckpt")).unwrap();
    std::fs::write(dir.path().join("ckpt/last.ckpt"), "the job's own").unwrap();
    judged_with_a_companion_and_nothing_saved(dir.path(), &venv, &job);
}

/// `doctor -- <venv>/bin/python x.py` asks the command's own Python, not
/// `python3` on PATH (a venv without pip, made in a second).
#[test]
fn the_command_s_own_python_is_checked() {
    let _machine = common::machine::beside();
    common::deadline::arm();
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status();
    if !common::require(made.is_ok_and(|s| s.success()), "`python3 -m venv` works") {
        return;
    }
    let py = venv.join("bin/python");
    let py = py.to_str().unwrap();
    let job = common::script(dir.path(), "x.py", "print('done')\n");
    let (d, _) = probe(dir.path(), &[py, job.to_str().unwrap()], &[]);
    let c = d.check("python");
    assert_eq!(c["details"]["interpreter"], py, "{c}");
    assert_eq!(c["details"]["source"], "command", "{c}");
    // The interpreter that answered is the venv's.
    assert_eq!(c["details"]["info"]["executable"], py, "{c}");
    assert!(c["summary"].as_str().unwrap().contains(py), "{c}");
}

/// A command that ends before it shows progress cannot be judged: said
/// so, as an advisory.
#[test]
fn a_command_that_ends_at_once_is_not_judged() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let (d, _) = probe(dir.path(), &["true"], &[]);
    let c = d.check("stop_saves");
    assert_eq!(c["state"], "warn", "{c}");
    assert!(c["details"]["finding"].is_null(), "{c}");
    assert_eq!(d.code(), 0);
}

/// cgroup v2 in the VM, one boot: as root in a delegated cgroup with
/// `memory.max` 300M (the job's cgroup can be created, and is gone
/// afterwards with the parent's controllers as they were), and as uid 1000
/// in a root-owned cgroup (not) and in one delegated to it (yes). The
/// limit is the ceiling and the exit code 0 each time.
#[test]
fn serial_vm_cgroup_v2_as_root_and_as_a_user() {
    let _serial = common::serial();
    let Some(m) = vm::machine_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut img = vm::Initramfs::new(&m);
    img.add_binary("bin/oomguard", Path::new(env!("CARGO_BIN_EXE_oomguard")));
    let Some(asuser) = vm::static_job(dir.path(), "asuser") else {
        return;
    };
    img.add_file("bin/asuser", &asuser, 0o755);
    let scenario = r#"
echo "+memory +pids" > /sys/fs/cgroup/cgroup.subtree_control
chmod 1777 /tmp
doc() {
  name=$1; cg=/sys/fs/cgroup/$2; shift 2
  mkdir -p $cg; echo 300M > $cg/memory.max
  sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' $cg "$@" oomguard doctor --format json </dev/null >/tmp/$name.json 2>/tmp/$name.err
  echo "@@ $name.exit=$?"
  echo "@@ $name.left=$(ls $cg | grep oomguard- | tr '\n' ' ')"
  echo "@@ $name.subtree=$(cat $cg/cgroup.subtree_control)"
  echo "@@begin $name.json"; cat /tmp/$name.json; echo "@@end $name.json"
  echo "@@begin $name.err"; cat /tmp/$name.err; echo "@@end $name.err"
}
doc root root env
doc user user asuser 1000
mkdir -p /sys/fs/cgroup/deleg
chown 1000:1000 /sys/fs/cgroup/deleg /sys/fs/cgroup/deleg/cgroup.procs /sys/fs/cgroup/deleg/cgroup.subtree_control /sys/fs/cgroup/deleg/cgroup.threads
doc deleg deleg asuser 1000
"#;
    let out = vm::run_scenario(&m, img, scenario, &vm::Boot::default());
    for (name, owned) in [("root", true), ("user", false), ("deleg", true)] {
        let json = out.section(&format!("{name}.json")).join("\n");
        let err = out.section(&format!("{name}.err")).join("\n");
        let v: Value = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("{name}: not JSON ({e}):\n{json}\n{err}"));
        let check = |n: &str| {
            v["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == n)
                .cloned()
                .unwrap_or_else(|| panic!("{name}: no {n}"))
        };
        assert_eq!(
            out.value(&format!("{name}.exit")).as_deref(),
            Some("0"),
            "{name}: {v}\n{err}"
        );
        let ceiling = check("ceiling");
        assert_eq!(
            ceiling["details"]["cgroup"]["version"], 2,
            "{name}: {ceiling}"
        );
        assert_eq!(
            ceiling["details"]["cgroup"]["limit_bytes"],
            300u64 << 20,
            "{name}: {ceiling}"
        );
        let act = check("act_in_time");
        assert_eq!(act["state"], "ok", "{name}: {act}");
        assert!(
            act["summary"].as_str().unwrap().contains("memory.events"),
            "{name}: {act}"
        );
        let own = check("own_cgroup");
        assert_eq!(own["state"] == "ok", owned, "{name}: {own}");
        if !owned {
            assert!(
                own["why"].as_str().unwrap().contains("ermission"),
                "{name}: {own}"
            );
            assert_eq!(
                own["details"]["user_scope_possible"], false,
                "{name}: {own}"
            );
        }
        let psi = check("psi");
        assert!(
            psi["details"]["cgroup"]["readable"] == true,
            "{name}: {psi}"
        );
        assert_eq!(
            out.value(&format!("{name}.left")).as_deref(),
            Some(""),
            "{name}: left behind"
        );
        if name != "user" {
            assert_eq!(
                out.value(&format!("{name}.subtree")).as_deref(),
                Some(""),
                "{name}: controllers left enabled"
            );
        }
        eprintln!("{name}: elapsed {} s", v["elapsed_seconds"]);
    }
}
