//! The NVML GPU probe against a fake `libnvidia-ml.so.1`: the real
//! nvml-wrapper code path (dlopen, symbol lookup, struct layouts, the
//! two-call process protocol), with scenarios for what real drivers do wrong.

use crate::common;
use crate::support::fake_nvml;

use std::path::Path;
use std::time::{Duration, Instant};

use fake_nvml::FakeNvml;
use oomguard::engine::probe::gpu::{
    GpuProbe, GpuProbeOptions, GpuReading, GpuUnavailable, TreeProc, attribute, read_ns_pids,
};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Poll `sample()` until a reading started after `after` comes back.
fn reading_after(probe: &mut GpuProbe, after: Instant) -> GpuReading {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(r) = probe.sample()
            && r.taken_at > after
        {
            return r;
        }
        assert!(Instant::now() < give_up, "no fresh GPU reading in 20 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn fresh(probe: &mut GpuProbe) -> GpuReading {
    reading_after(probe, Instant::now())
}

/// A probe whose `sample()` waits for the reading it asks for: one NVML
/// call per [`fresh`] reading however busy the machine, so scenarios that
/// count calls (`fail=… after=N`) mean what they say. The default 5 ms wait
/// hands back the previous reading when the worker thread is slow to run,
/// and the next poll asks again: a second call for one reading.
fn open(fake: &FakeNvml) -> GpuProbe {
    let options = GpuProbeOptions {
        sample_wait: Duration::from_secs(10),
        ..GpuProbeOptions::default()
    };
    GpuProbe::open_with(Some(fake.lib_path()), options).expect("open the fake NVML")
}

fn two_gpus(extra: &str) -> String {
    format!(
        "driver_version=535.104.05\n\
         gpu=0 total={t0} reserved={r} used={u0} util=37 uuid=GPU-aaaa-0000 name=NVIDIA A100-SXM4-80GB\n\
         gpu=1 total={t1} reserved={r} used={u1} util=5 uuid=GPU-bbbb-1111 name=NVIDIA A100-SXM4-40GB\n\
         {extra}",
        t0 = 80 * GIB,
        t1 = 40 * GIB,
        r = 512 * MIB,
        u0 = 20 * GIB,
        u1 = 6 * GIB,
    )
}

#[test]
fn two_gpus_tree_foreign_and_garbage() {
    let _machine = common::machine::beside();
    common::deadline::arm();
    // A real child, so its pid and NSpid come from the real /proc.
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let trainer = child.id();
    let me = std::process::id();
    let scenario = two_gpus(&format!(
        "proc=0 pid={trainer} used={a}\n\
         proc=0 pid=777777 used={foreign}\n\
         proc=0 pid=0 used={g}\n\
         proc=1 pid={trainer} used={b}\n\
         proc=1 pid={me} used={c}\n\
         proc=1 pid=4294967295 used={g}\n\
         proc=1 pid=31337 used=18446744073709551614\n\
         proc=1 pid=4242 used=na\n",
        a = 12 * GIB,
        foreign = 3 * GIB,
        g = GIB,
        b = 2 * GIB,
        c = 512 * MIB,
    ));
    let fake = FakeNvml::new(&scenario);
    let mut probe = open(&fake);
    assert_eq!(probe.device_count(), 2);
    assert_eq!(probe.driver_version(), Some("535.104.05"));

    let reading = fresh(&mut probe);
    assert!(reading.errors.is_empty(), "{:?}", reading.errors);
    assert!(!reading.stale);
    assert_eq!(reading.devices.len(), 2);
    let d0 = reading.device(0).unwrap();
    assert_eq!(d0.name, "NVIDIA A100-SXM4-80GB");
    assert_eq!(d0.uuid, "GPU-aaaa-0000");
    assert_eq!(d0.total_bytes, 80 * GIB);
    assert_eq!(d0.reserved_bytes, 512 * MIB);
    assert_eq!(d0.used_bytes, 20 * GIB);
    assert_eq!(d0.free_bytes, 80 * GIB - 512 * MIB - 20 * GIB);
    assert_eq!(d0.util_percent, Some(37));
    assert_eq!(d0.processes.len(), 3);
    let d1 = reading.device(1).unwrap();
    assert_eq!(d1.name, "NVIDIA A100-SXM4-40GB");
    assert_eq!(d1.util_percent, Some(5));
    // Raw: garbage is still there before attribution.
    assert_eq!(d1.processes.len(), 5);
    assert_eq!(d1.processes[4].used_bytes, None);

    let tree: Vec<TreeProc> = [me, trainer]
        .into_iter()
        .map(|pid| TreeProc {
            pid,
            ns_pids: read_ns_pids(Path::new("/proc"), pid).unwrap(),
        })
        .collect();
    let a = attribute(&reading.devices, &tree);
    assert_eq!(a.gpu_bytes(trainer), Some(14 * GIB));
    assert_eq!(a.gpu_bytes(me), Some(512 * MIB));
    assert_eq!(a.procs[&trainer].devices.len(), 2);
    assert_eq!(a.devices[0].tree_bytes, 12 * GIB);
    assert_eq!(a.devices[0].foreign_bytes, 3 * GIB);
    assert_eq!(a.devices[0].foreign_procs, 1);
    assert_eq!(a.devices[0].discarded, 1);
    assert_eq!(a.devices[1].tree_bytes, 2 * GIB + 512 * MIB);
    assert_eq!(a.devices[1].foreign_bytes, 0);
    assert_eq!(a.devices[1].discarded, 3);

    // The sample's `gpus` list entry has the documented field names.
    let json = serde_json::to_value(d0).unwrap();
    for key in [
        "index",
        "name",
        "uuid",
        "used_bytes",
        "total_bytes",
        "free_bytes",
        "reserved_bytes",
        "util_percent",
        "processes",
    ] {
        assert!(json.get(key).is_some(), "missing {key} in {json}");
    }

    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn library_missing_names_the_path() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libnvidia-ml.so.1");
    let err = GpuProbe::open(Some(&lib)).unwrap_err();
    assert!(
        matches!(err, GpuUnavailable::LibraryNotFound { .. }),
        "{err:?}"
    );
    let reason = err.to_string();
    assert!(reason.contains(&lib.display().to_string()), "{reason}");
    assert!(reason.contains("not found"), "{reason}");
}

#[test]
fn default_library_opens_or_explains() {
    let _machine = common::machine::beside();
    // No driver here, so this is normally "not found"; on a machine with a
    // real driver it may open. Either way, no panic and a one-line reason.
    match GpuProbe::open(None) {
        Ok(probe) => assert!(probe.device_count() > 0),
        Err(e) => assert!(!e.to_string().is_empty() && !e.to_string().contains('\n')),
    }
}

#[test]
fn init_failing_with_9_is_driver_not_loaded() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new("init_error=9\n");
    let err = GpuProbe::open(Some(fake.lib_path())).unwrap_err();
    assert_eq!(err, GpuUnavailable::DriverNotLoaded);
    assert!(err.to_string().contains("driver not loaded"), "{err}");
}

#[test]
fn init_failing_with_another_code_says_which() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new("init_error=999\n");
    let err = GpuProbe::open(Some(fake.lib_path())).unwrap_err();
    assert!(
        matches!(err, GpuUnavailable::InitFailed { code: 999, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("code 999"), "{err}");
}

#[test]
fn init_symbol_missing() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::variant(&["FAKE_NVML_NO_INIT"], "");
    let err = GpuProbe::open(Some(fake.lib_path())).unwrap_err();
    assert!(
        matches!(&err, GpuUnavailable::SymbolMissing { symbol, .. } if symbol == "nvmlInit_v2"),
        "{err:?}"
    );
}

#[test]
fn no_devices_is_unavailable() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new("driver_version=550.54.15\n");
    let err = GpuProbe::open(Some(fake.lib_path())).unwrap_err();
    assert_eq!(err, GpuUnavailable::NoDevices);
}

#[test]
fn init_that_hangs_times_out() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new(&two_gpus("sleep=nvmlInit_v2 ms=3000\n"));
    let options = GpuProbeOptions {
        init_timeout: Duration::from_millis(200),
        ..GpuProbeOptions::default()
    };
    let err = GpuProbe::open_with(Some(fake.lib_path()), options).unwrap_err();
    assert!(matches!(err, GpuUnavailable::InitTimeout(_)), "{err:?}");
}

#[test]
fn memory_call_failing_mid_run_drops_the_device_then_recovers() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new(&two_gpus(""));
    let mut probe = open(&fake);
    assert_eq!(fresh(&mut probe).devices.len(), 2);

    fake.set_scenario(&two_gpus("fail=nvmlDeviceGetMemoryInfo_v2 code=15 gpu=1\n"));
    let failing = fresh(&mut probe);
    assert_eq!(failing.devices.len(), 1, "{failing:?}");
    assert!(failing.device(0).is_some());
    assert_eq!(failing.errors.len(), 1);
    assert_eq!(failing.errors[0].index, Some(1));
    assert_eq!(failing.errors[0].call, "nvmlDeviceGetMemoryInfo_v2");
    // Failing again on the next tick: still handled, still retried.
    assert!(fresh(&mut probe).device(1).is_none());

    fake.set_scenario(&two_gpus(""));
    let recovered = fresh(&mut probe);
    assert_eq!(recovered.devices.len(), 2);
    assert!(recovered.errors.is_empty());
}

#[test]
fn failing_after_n_calls() {
    let _machine = common::machine::beside();
    // One GPU; memory info works for 3 calls, then fails.
    let fake = FakeNvml::new(&format!(
        "gpu=0 total={t} reserved=0 used={u} name=Fake\nfail=nvmlDeviceGetMemoryInfo_v2 after=3\n",
        t = 16 * GIB,
        u = GIB
    ));
    let mut probe = open(&fake);
    for _ in 0..3 {
        assert_eq!(fresh(&mut probe).devices.len(), 1);
    }
    let r = fresh(&mut probe);
    assert!(r.devices.is_empty());
    assert_eq!(r.errors[0].call, "nvmlDeviceGetMemoryInfo_v2");
}

#[test]
fn process_list_failing_keeps_the_device() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new(&two_gpus(
        "proc=0 pid=100 used=1024\nfail=nvmlDeviceGetComputeRunningProcesses_v3 gpu=0\n",
    ));
    let mut probe = open(&fake);
    let r = fresh(&mut probe);
    let d0 = r.device(0).unwrap();
    assert!(d0.processes.is_empty());
    assert_eq!(d0.used_bytes, 20 * GIB);
    assert_eq!(r.errors.len(), 1);
    assert_eq!(r.errors[0].call, "nvmlDeviceGetComputeRunningProcesses_v3");
}

#[test]
fn a_panic_inside_nvml_wrapper_is_contained() {
    let _machine = common::machine::beside();
    // A process count of 0xFFFFFFFF makes nvml-wrapper's `count + 5`
    // overflow: a panic where overflow checks are on (debug builds), an
    // error otherwise. Either way the other device is read and the probe
    // recovers.
    let fake = FakeNvml::new(&two_gpus("proc=0 pid=100 used=1024\nbogus_count=0\n"));
    let mut probe = open(&fake);
    let r = fresh(&mut probe);
    assert!(r.device(1).is_some());
    assert!(
        r.errors.iter().any(|e| e.index == Some(0)),
        "{:?}",
        r.errors
    );

    fake.set_scenario(&two_gpus("proc=0 pid=100 used=1024\n"));
    let r = fresh(&mut probe);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.device(0).unwrap().processes.len(), 1);
}

#[test]
fn a_stalled_call_does_not_block_the_tick() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new(&two_gpus(""));
    let options = GpuProbeOptions {
        stall_after: Duration::from_millis(300),
        ..GpuProbeOptions::default()
    };
    let mut probe = GpuProbe::open_with(Some(fake.lib_path()), options).unwrap();
    let before = fresh(&mut probe);

    fake.set_scenario(&two_gpus(
        "sleep=nvmlDeviceGetMemoryInfo_v2 ms=2000 gpu=0\n",
    ));
    let stall_started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut saw_stale = false;
    while !saw_stale {
        let t = Instant::now();
        let r = probe
            .sample()
            .expect("the previous reading is still handed out");
        slowest = slowest.max(t.elapsed());
        // Any reading begun after the switch sits in the 2 s sleep, so
        // what the tick gets meanwhile is an older one.
        assert!(r.taken_at < stall_started);
        saw_stale = r.stale;
        assert!(
            stall_started.elapsed() < Duration::from_millis(1900),
            "never flagged stale"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(probe.busy_for().is_some());
    // A blocking probe would have taken the whole 2 s in one call.
    assert!(
        slowest < Duration::from_secs(1),
        "sample() blocked for {slowest:?}"
    );

    fake.set_scenario(&two_gpus(""));
    let after = reading_after(&mut probe, before.taken_at);
    assert!(after.age < Duration::from_secs(3));
    // The reading that was stuck completes; the next one is fresh and quick.
    let next = fresh(&mut probe);
    assert!(!next.stale);
    assert_eq!(next.devices.len(), 2);
}

#[test]
fn memory_growing_every_call() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new(&format!(
        "gpu=0 total={t} reserved=0 used={u} grow={g} name=Fake\n",
        t = 16 * GIB,
        u = GIB,
        g = 64 * MIB
    ));
    let mut probe = open(&fake);
    let a = fresh(&mut probe).devices[0].clone();
    let b = fresh(&mut probe).devices[0].clone();
    assert!(b.used_bytes > a.used_bytes);
    assert_eq!(b.used_bytes - a.used_bytes, a.free_bytes - b.free_bytes);
}

/// Set in the child process that `old_driver_without_uuid_or_shutdown` runs.
const CHILD_ENV: &str = "OOMGUARD_GPU_TEST_CHILD";

#[test]
fn old_driver_without_uuid_or_shutdown() {
    common::deadline::arm();
    // A panic on the worker thread would not fail a test (it only ends that
    // thread), so the scenario runs in a child test process whose whole
    // output is checked for one.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "gpu::old_driver_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env(common::machine::CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "child did not run:\n{stdout}");
    assert!(!stderr.contains("panicked"), "a panic escaped:\n{stderr}");
}

/// The child side of `old_driver_without_uuid_or_shutdown`: ignored, so a
/// plain run reports it as what it is, not as a test that passed.
#[test]
#[ignore = "run by old_driver_without_uuid_or_shutdown in a child process"]
fn old_driver_child() {
    assert!(
        std::env::var_os(CHILD_ENV).is_some(),
        "run by old_driver_without_uuid_or_shutdown only"
    );
    // Utilisation and UUID not supported, and neither nvmlShutdown nor
    // nvmlDeviceGetUUID exported. nvml-wrapper's Drop for Nvml calls
    // nvmlShutdown through an accessor that panics when it is missing.
    let fake = FakeNvml::variant(
        &["FAKE_NVML_NO_SHUTDOWN", "FAKE_NVML_NO_UUID"],
        &format!(
            "gpu=0 total={t} reserved=0 used={u} name=Old GPU\n",
            t = 8 * GIB,
            u = GIB
        ),
    );
    let mut probe = open(&fake);
    let r = fresh(&mut probe);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let d = &r.devices[0];
    assert_eq!(d.name, "Old GPU");
    assert_eq!(d.uuid, "");
    assert_eq!(d.util_percent, None);
    assert!(serde_json::to_value(d).unwrap().get("uuid").is_none());
    drop(probe);
    // Also the path where init succeeds but the probe gives up (no device).
    let empty = FakeNvml::variant(&["FAKE_NVML_NO_SHUTDOWN", "FAKE_NVML_NO_UUID"], "");
    assert_eq!(
        GpuProbe::open(Some(empty.lib_path())).unwrap_err(),
        GpuUnavailable::NoDevices
    );
}

#[test]
fn probe_drop_shuts_nvml_down() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new(&two_gpus(""));
    let mut probe = open(&fake);
    fresh(&mut probe);
    drop(probe);
    // After nvmlShutdown and dlclose the same file can be opened again.
    let mut again = open(&fake);
    assert_eq!(fresh(&mut again).devices.len(), 2);
}

/// End to end: `oomguard run --nvml-lib <fake>` puts the devices in every
/// sample and attributes GPU memory to the job's process by pid.
#[test]
fn run_reports_gpus_and_attributes_the_job() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new(
        "gpu=0 total=17179869184 reserved=0 used=1073741824 util=50 uuid=GPU-0 name=Fake A\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let pidfile = dir.path().join("pid");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oomguard"))
        .args([
            "run",
            "-q",
            "--interval",
            "200ms",
            "--procs-interval",
            "200ms",
            "--nvml-lib",
        ])
        .arg(fake.lib_path())
        .arg("--log")
        .arg(&log)
        .args(["--", "sh", "-c", "echo $$ > \"$0\"; exec sleep 3"])
        .arg(&pidfile)
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !pidfile.exists() || std::fs::read_to_string(&pidfile).unwrap().trim().is_empty() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    fake.set_scenario(&format!(
        "gpu=0 total=17179869184 reserved=0 used=3221225472 util=50 uuid=GPU-0 name=Fake A\n\
         proc=0 pid={pid} used=2147483648\nproc=0 pid=999999 used=1073741824\n"
    ));
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["gpu"]["available"], true, "{}", lines[0]);
    let attributed = lines.iter().filter(|l| l["event"] == "sample").any(|s| {
        s["gpus"][0]["tree_bytes"] == 2147483648u64
            && s["gpus"][0]["foreign_bytes"] == 1073741824u64
            && s["gpus"][0]["uuid"] == "GPU-0"
            && s["procs"].as_array().is_some_and(|ps| {
                ps.iter()
                    .any(|p| p["pid"] == pid && p["gpu_bytes"] == 2147483648u64)
            })
    });
    assert!(attributed, "no sample attributed the GPU memory:\n{text}");

    // A library that cannot be loaded: the run goes on, and says why there
    // is no GPU. (A path that does not exist at all is a usage error, exit
    // 2: see tests/policy.rs `bad_flags_exit_2`.)
    let broken = dir.path().join("libnvidia-ml.so.1");
    std::fs::write(&broken, "not a shared object").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oomguard"))
        .args(["run", "-q", "--nvml-lib"])
        .arg(&broken)
        .arg("--log")
        .arg(&log)
        .args(["--", "true"])
        .status()
        .unwrap();
    assert!(out.success());
    // The same log again: this run is added after the first one, and its
    // run_start is the last.
    let first: serde_json::Value = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .rfind(|l| l["event"] == "run_start")
        .unwrap();
    assert_eq!(first["gpu"]["available"], false);
    assert!(
        first["gpu"]["reason"]
            .as_str()
            .unwrap()
            .contains(broken.to_str().unwrap()),
        "{first}"
    );
}

/// Near a ceiling oomguard ticks fast without waiting for NVML: those
/// ticks carry the last reading with its age, so the GPU series do not
/// vanish from the log (and /metrics, the dashboard) when memory is tight.
#[test]
fn fast_ticks_near_a_ceiling_carry_the_last_gpu_reading() {
    let _machine = common::machine::beside();
    let fake = FakeNvml::new(
        "gpu=0 total=17179869184 reserved=0 used=1073741824 util=50 uuid=GPU-0 name=Fake A\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let job = "b = bytearray(48 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n\
               import time; time.sleep(3)\n";
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_oomguard"))
        .args([
            "run",
            "-q",
            "--budget",
            "64MiB",
            "--warn-at",
            "30%",
            "--critical-at",
            "99%",
            "--procs-interval",
            "100ms",
            "--nvml-lib",
        ])
        .arg(fake.lib_path())
        .arg("--log")
        .arg(&log)
        .args(["--", "python3", "-c", job])
        .stdin(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let samples: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["event"] == "sample")
        .collect();
    let carried = samples
        .iter()
        .filter(|s| s["gpus"][0]["age_seconds"].is_number())
        .count();
    assert!(carried > 0, "no fast tick carried the GPU reading:\n{text}");
    // Lines with per-GPU detail never have an empty list.
    assert!(
        samples
            .iter()
            .filter(|s| s.get("gpus").is_some())
            .all(|s| s["gpus"][0]["uuid"] == "GPU-0"),
        "{text}"
    );
}
