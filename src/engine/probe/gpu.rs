//! GPU memory through NVML (nvml-wrapper), loaded at run time.
//!
//! This module owns three things:
//!
//! - [`GpuProbe`]: opens `libnvidia-ml.so.1` (or the `--nvml-lib` path) when
//!   oomguard starts, so the same binary runs on machines without an NVIDIA
//!   driver ([`GpuUnavailable`] then says why, in one line), and reads every
//!   device on a dedicated worker thread. The tick never waits on NVML: a
//!   call that stalls leaves the tick with the previous reading, flagged
//!   stale once the stall is long; a call that fails leaves that device out
//!   of one reading and is retried on the next.
//! - [`attribute`]: a pure function that splits each device's process list
//!   between the job's tree and everyone else, discarding entries that make
//!   no sense (the R535 drivers returned scrambled pids).
//! - [`read_ns_pids`] / [`parse_ns_pids`]: the `NSpid` line of
//!   `/proc/PID/status`, so pids can be matched across pid namespaces.

use std::collections::{BTreeMap, HashMap};
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize, Serializer};

/// The library `open(None)` loads: the soname the NVIDIA driver installs.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// `nvmlInit` return code for "driver not loaded".
const NVML_DRIVER_NOT_LOADED: u32 = 9;
/// `nvmlInit` return code for "no permission".
const NVML_NO_PERMISSION: u32 = 4;

// ---------------------------------------------------------------------------
// Readings
// ---------------------------------------------------------------------------

/// One GPU as NVML reported it in one reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// NVML device index.
    pub index: u32,
    /// Product name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub name: String,
    /// `GPU-…` identifier; empty when the driver cannot tell
    /// (symbol missing or not supported).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// Memory handed out to processes (memory info v2: excludes the driver reserve).
    pub used_bytes: u64,
    /// Total memory of the device.
    pub total_bytes: u64,
    /// Memory neither used nor reserved.
    pub free_bytes: u64,
    /// Memory NVML keeps for the driver and firmware (not PyTorch's "reserved").
    pub reserved_bytes: u64,
    /// GPU utilisation over the driver's last sample period; `None` when not
    /// supported or the call failed.
    pub util_percent: Option<u32>,
    /// Compute processes as NVML reports them (host pids, unfiltered).
    pub processes: Vec<GpuProcess>,
}

/// One compute process on one device, raw from NVML.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Pid in the driver's (root) pid namespace; may be garbage on buggy drivers.
    pub pid: u32,
    /// Device memory used by the process; `None` when NVML says "not available".
    pub used_bytes: Option<u64>,
}

/// A device call that failed (or panicked inside nvml-wrapper) during one reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuCallError {
    /// The device, or `None` for a call that is not about one device.
    pub index: Option<u32>,
    /// The NVML function, e.g. `nvmlDeviceGetMemoryInfo_v2`.
    pub call: &'static str,
    /// What went wrong, in words.
    pub reason: String,
}

/// Everything one pass of the worker over all devices produced.
#[derive(Debug, Clone, Serialize)]
pub struct GpuReading {
    /// When the worker started this reading.
    #[serde(skip)]
    pub taken_at: Instant,
    /// How old the reading was when [`GpuProbe::sample`] handed it out.
    #[serde(rename = "age_seconds", serialize_with = "serialize_seconds")]
    pub age: Duration,
    /// True when the worker has been stuck in NVML for longer than
    /// [`GpuProbeOptions::stall_after`]: this is an old reading, not a fresh one.
    pub stale: bool,
    /// Devices whose memory could be read. A device whose memory call failed
    /// this time is absent (and named in `errors`); it is retried next time.
    pub devices: Vec<GpuDevice>,
    /// Calls that failed during this reading.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<GpuCallError>,
}

impl GpuReading {
    /// The device with NVML index `index`, if it was read this time.
    pub fn device(&self, index: u32) -> Option<&GpuDevice> {
        self.devices.iter().find(|d| d.index == index)
    }
}

fn serialize_seconds<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

// ---------------------------------------------------------------------------
// Opening
// ---------------------------------------------------------------------------

/// Why GPU monitoring is off for this run. `Display` is the one-line reason
/// that goes into `run_start.gpu.reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuUnavailable {
    /// dlopen found no such file.
    #[error("NVML library {path} not found (no NVIDIA driver installed?)")]
    LibraryNotFound {
        /// The path or soname that was tried.
        path: String,
        /// The loader's message.
        detail: String,
    },
    /// dlopen found the file but could not load it.
    #[error("cannot load NVML library {path}: {detail}")]
    LoadFailed {
        /// The path or soname that was tried.
        path: String,
        /// The loader's message.
        detail: String,
    },
    /// The library loaded but lacks a function initialisation needs.
    #[error("NVML library {path} has no symbol {symbol}")]
    SymbolMissing {
        /// The library.
        path: String,
        /// The missing function.
        symbol: String,
    },
    /// `nvmlInit` returned 9.
    #[error("NVIDIA driver not loaded (nvmlInit returned 9)")]
    DriverNotLoaded,
    /// `nvmlInit` returned 4.
    #[error("no permission to talk to the NVIDIA driver (nvmlInit returned 4)")]
    NoPermission,
    /// `nvmlInit` returned another error.
    #[error("nvmlInit failed with code {code}: {detail}")]
    InitFailed {
        /// NVML return code.
        code: u32,
        /// nvml-wrapper's description of it.
        detail: String,
    },
    /// `nvmlInit` (or the first device count) did not return in time.
    #[error("NVML did not answer within {} s at initialisation", .0.as_secs_f64())]
    InitTimeout(Duration),
    /// Counting devices failed right after init.
    #[error("NVML cannot count GPUs: {0}")]
    DeviceCount(String),
    /// NVML works but reports no device.
    #[error("NVML reports no GPU")]
    NoDevices,
    /// nvml-wrapper panicked during initialisation.
    #[error("nvml-wrapper panicked during initialisation: {0}")]
    Panicked(String),
    /// The worker thread could not be started.
    #[error("cannot start the GPU probe thread: {0}")]
    Thread(String),
}

impl GpuUnavailable {
    fn from_init(path: &str, err: NvmlError) -> Self {
        match err {
            NvmlError::LibloadingError(e) => {
                let detail = e.to_string();
                // glibc's dlerror text is the only portable signal that the
                // file itself is missing (a bare soname is searched, so there
                // is no single path to stat).
                let missing = detail.contains("No such file or directory")
                    || (path.contains('/') && !Path::new(path).exists());
                if missing {
                    Self::LibraryNotFound {
                        path: path.to_owned(),
                        detail,
                    }
                } else {
                    Self::LoadFailed {
                        path: path.to_owned(),
                        detail,
                    }
                }
            }
            NvmlError::FailedToLoadSymbol(msg) => Self::SymbolMissing {
                path: path.to_owned(),
                symbol: missing_symbol(&msg),
            },
            other => {
                let detail = other.to_string();
                match u32::from(other) {
                    NVML_DRIVER_NOT_LOADED => Self::DriverNotLoaded,
                    NVML_NO_PERMISSION => Self::NoPermission,
                    code => Self::InitFailed { code, detail },
                }
            }
        }
    }
}

/// The symbol name out of a loader message like `…: undefined symbol: nvmlInit_v2`.
fn missing_symbol(msg: &str) -> String {
    match msg.rsplit_once("undefined symbol:") {
        Some((_, sym)) => sym.trim().to_owned(),
        None => msg.to_owned(),
    }
}

/// Timing knobs of the probe. The defaults suit a tick of about a second.
#[derive(Debug, Clone)]
pub struct GpuProbeOptions {
    /// How long [`GpuProbe::open`] waits for `nvmlInit` and the device count.
    pub init_timeout: Duration,
    /// How long [`GpuProbe::sample`] waits for the reading it has just asked
    /// for before handing out the previous one. Keeps readings fresh when NVML
    /// is quick, and bounds the tick's wait when it is not.
    pub sample_wait: Duration,
    /// After this long inside one reading the worker counts as stalled and
    /// the readings handed out are flagged `stale`.
    pub stall_after: Duration,
}

impl Default for GpuProbeOptions {
    fn default() -> Self {
        Self {
            init_timeout: Duration::from_secs(10),
            sample_wait: Duration::from_millis(5),
            stall_after: Duration::from_secs(1),
        }
    }
}

/// What initialisation learned, sent from the worker to `open`.
struct InitInfo {
    driver_version: Option<String>,
    device_count: u32,
}

/// State shared by the probe (the tick's side) and the worker. The worker
/// holds the lock only to take a request or store a result, never across an
/// NVML call, so the tick's side never waits on NVML.
#[derive(Default)]
struct State {
    /// Readings asked for so far (a generation counter).
    requested: u64,
    /// Generation of `latest`.
    completed: u64,
    /// When the request in progress was made; `None` when the worker is idle.
    busy_since: Option<Instant>,
    latest: Option<GpuReading>,
    shutdown: bool,
    exited: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// The worker waits here for requests and shutdown.
    wake: Condvar,
    /// The tick's side waits here (briefly) for results and exit.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic never happens while the lock is held, but if one did, the
        // state is still consistent enough to go on.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads NVML devices on a worker thread that owns the `Nvml` handle.
pub struct GpuProbe {
    shared: Arc<Shared>,
    options: GpuProbeOptions,
    lib: String,
    driver_version: Option<String>,
    device_count: u32,
}

impl std::fmt::Debug for GpuProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuProbe")
            .field("lib", &self.lib)
            .field("driver_version", &self.driver_version)
            .field("device_count", &self.device_count)
            .finish_non_exhaustive()
    }
}

impl GpuProbe {
    /// Load NVML from `lib_path` (`--nvml-lib`) or [`DEFAULT_NVML_LIB`], and
    /// initialise it, with the default [`GpuProbeOptions`].
    pub fn open(lib_path: Option<&Path>) -> Result<GpuProbe, GpuUnavailable> {
        Self::open_with(lib_path, GpuProbeOptions::default())
    }

    /// [`GpuProbe::open`] with explicit timing options.
    pub fn open_with(
        lib_path: Option<&Path>,
        options: GpuProbeOptions,
    ) -> Result<GpuProbe, GpuUnavailable> {
        let lib: PathBuf = lib_path.map_or_else(|| PathBuf::from(DEFAULT_NVML_LIB), Path::to_owned);
        let lib_display = lib.display().to_string();
        let shared = Arc::new(Shared::default());
        let (init_tx, init_rx) = mpsc::channel();

        // Even nvmlInit runs on the worker: a driver that hangs at init must
        // not hang oomguard's start.
        let worker_shared = Arc::clone(&shared);
        let worker_lib = lib.clone();
        let worker_display = lib_display.clone();
        thread::Builder::new()
            .name("oomguard-gpu".to_owned())
            .spawn(move || worker_main(&worker_lib, &worker_display, &worker_shared, &init_tx))
            .map_err(|e| GpuUnavailable::Thread(e.to_string()))?;

        let info = match init_rx.recv_timeout(options.init_timeout) {
            Ok(result) => result?,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // The worker sees the closed channel when (if) init returns,
                // and shuts NVML down on its own.
                return Err(GpuUnavailable::InitTimeout(options.init_timeout));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(GpuUnavailable::Panicked(
                    "the GPU worker exited during initialisation".to_owned(),
                ));
            }
        };
        Ok(GpuProbe {
            shared,
            options,
            lib: lib_display,
            driver_version: info.driver_version,
            device_count: info.device_count,
        })
    }

    /// The library that was loaded, as given.
    pub fn lib(&self) -> &str {
        &self.lib
    }

    /// Driver version string, when NVML gave one at initialisation.
    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }

    /// Number of devices NVML reported at initialisation.
    pub fn device_count(&self) -> u32 {
        self.device_count
    }

    /// How long the worker has been working on its current reading, or `None`
    /// when it is idle.
    pub fn busy_for(&self) -> Option<Duration> {
        self.shared.lock().busy_since.map(|t| t.elapsed())
    }

    /// Hand out the latest completed reading and ask the worker for the next.
    ///
    /// Never waits on NVML for more than [`GpuProbeOptions::sample_wait`]: when
    /// the worker is idle, the new reading is requested and awaited that long
    /// (so a quick NVML gives fresh readings); when it is still
    /// busy with an earlier request, nothing is awaited and the previous
    /// reading comes back, `stale` once the worker has been busy for
    /// [`GpuProbeOptions::stall_after`]. `None` until a first reading exists.
    pub fn sample(&mut self) -> Option<GpuReading> {
        let mut state = self.shared.lock();
        if state.busy_since.is_none() && !state.exited {
            let now = Instant::now();
            state.requested += 1;
            state.busy_since = Some(now);
            let target = state.requested;
            self.shared.wake.notify_one();
            let deadline = now + self.options.sample_wait;
            while state.completed < target {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                state = self
                    .shared
                    .done
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        // A worker that died (it should not: every NVML call is guarded) is
        // as good as a stalled one.
        let stalled = state.exited
            || state
                .busy_since
                .is_some_and(|t| t.elapsed() >= self.options.stall_after);
        let mut reading = state.latest.clone()?;
        drop(state);
        reading.age = reading.taken_at.elapsed();
        reading.stale = stalled;
        Some(reading)
    }
}

impl Drop for GpuProbe {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.shutdown = true;
        self.shared.wake.notify_all();
        // Give an idle worker a moment to run nvmlShutdown; a stalled one is
        // left behind (it exits when its call returns) rather than blocking.
        let deadline = Instant::now() + Duration::from_millis(200);
        while !state.exited {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .shared
                .done
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

// ---------------------------------------------------------------------------
// Worker
// ---------------------------------------------------------------------------

/// Marks the worker as gone however it leaves (return or unwind).
struct ExitGuard<'a>(&'a Shared);

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.exited = true;
        state.busy_since = None;
        self.0.done.notify_all();
    }
}

fn worker_main(
    lib: &Path,
    lib_display: &str,
    shared: &Shared,
    init_tx: &mpsc::Sender<Result<InitInfo, GpuUnavailable>>,
) {
    let _exit = ExitGuard(shared);
    let nvml = match guarded(|| init(lib, lib_display)) {
        Ok(Ok((nvml, info))) => {
            if init_tx.send(Ok(info)).is_err() {
                // `open` timed out and returned; nobody will ask for readings.
                shutdown_nvml(nvml);
                return;
            }
            nvml
        }
        Ok(Err(unavailable)) => {
            let _ = init_tx.send(Err(unavailable));
            return;
        }
        Err(panic) => {
            let _ = init_tx.send(Err(GpuUnavailable::Panicked(panic)));
            return;
        }
    };

    let mut idents = HashMap::new();
    let mut served = 0;
    loop {
        let target = {
            let mut state = shared.lock();
            while !state.shutdown && state.requested == served {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if state.shutdown {
                break;
            }
            state.requested
        };
        let reading = read_all(&nvml, &mut idents);
        served = target;
        let mut state = shared.lock();
        state.latest = Some(reading);
        state.completed = target;
        state.busy_since = None;
        shared.done.notify_all();
    }
    shutdown_nvml(nvml);
}

/// Load and initialise NVML, count devices. The `Nvml` is wrapped in
/// `ManuallyDrop` from the start: its `Drop` calls `nvmlShutdown` through an
/// accessor that panics when the symbol is missing, and a panic in a drop
/// during unwinding would abort oomguard. It is released only by
/// [`shutdown_nvml`].
fn init(lib: &Path, lib_display: &str) -> Result<(ManuallyDrop<Nvml>, InitInfo), GpuUnavailable> {
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .map_err(|e| GpuUnavailable::from_init(lib_display, e))?;
    let nvml = ManuallyDrop::new(nvml);
    let device_count = match nvml.device_count() {
        Ok(0) => Err(GpuUnavailable::NoDevices),
        Ok(n) => Ok(n),
        Err(e) => Err(GpuUnavailable::DeviceCount(e.to_string())),
    };
    let device_count = match device_count {
        Ok(n) => n,
        Err(e) => {
            shutdown_nvml(nvml);
            return Err(e);
        }
    };
    let driver_version = nvml.sys_driver_version().ok();
    Ok((
        nvml,
        InitInfo {
            driver_version,
            device_count,
        },
    ))
}

/// Shut NVML down without ever panicking out: `Nvml::shutdown` reports
/// errors, but on its error path it drops `self`, whose `Drop` calls the
/// panicking `nvmlShutdown` accessor again; so a library without the symbol
/// is simply leaked (oomguard is exiting or giving GPU monitoring up anyway).
fn shutdown_nvml(nvml: ManuallyDrop<Nvml>) {
    if nvml.lib().nvmlShutdown.is_err() {
        return;
    }
    let nvml = ManuallyDrop::into_inner(nvml);
    let _ = guarded(move || nvml.shutdown());
}

/// Run `f`, turning a panic into its message.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned())
    })
}

/// Name and UUID per device index: they do not change while NVML is up.
type Idents = HashMap<u32, (String, String)>;

fn read_all(nvml: &Nvml, idents: &mut Idents) -> GpuReading {
    let mut reading = GpuReading {
        taken_at: Instant::now(),
        age: Duration::ZERO,
        stale: false,
        devices: Vec::new(),
        errors: Vec::new(),
    };
    let count = match guarded(|| nvml.device_count()) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            reading
                .errors
                .push(call_error(None, "nvmlDeviceGetCount_v2", &e));
            return reading;
        }
        Err(panic) => {
            reading.errors.push(panicked(None, panic));
            return reading;
        }
    };
    for index in 0..count {
        let errors = &mut reading.errors;
        match guarded(|| read_device(nvml, index, idents, errors)) {
            Ok(Some(device)) => reading.devices.push(device),
            Ok(None) => {}
            Err(panic) => reading.errors.push(panicked(Some(index), panic)),
        }
    }
    reading
}

fn call_error(index: Option<u32>, call: &'static str, err: &NvmlError) -> GpuCallError {
    GpuCallError {
        index,
        call,
        reason: err.to_string(),
    }
}

fn panicked(index: Option<u32>, message: String) -> GpuCallError {
    GpuCallError {
        index,
        call: "nvml-wrapper",
        reason: format!("panicked: {message}"),
    }
}

/// Read one device. `None` when its handle or memory could not be read: a
/// device without memory figures is of no use to the tick.
fn read_device(
    nvml: &Nvml,
    index: u32,
    idents: &mut Idents,
    errors: &mut Vec<GpuCallError>,
) -> Option<GpuDevice> {
    let device = match nvml.device_by_index(index) {
        Ok(d) => d,
        Err(e) => {
            errors.push(call_error(Some(index), "nvmlDeviceGetHandleByIndex_v2", &e));
            return None;
        }
    };
    let memory = match device.memory_info() {
        Ok(m) => m,
        Err(e) => {
            errors.push(call_error(Some(index), "nvmlDeviceGetMemoryInfo_v2", &e));
            return None;
        }
    };

    let (name, uuid) = match idents.get(&index) {
        Some(ident) => ident.clone(),
        None => {
            let name = device.name();
            // A missing or unsupported UUID is a permanent fact of the
            // driver; anything else may pass, so it is asked again.
            let (uuid, uuid_final) = match device.uuid() {
                Ok(u) => (u, true),
                Err(NvmlError::FailedToLoadSymbol(_) | NvmlError::NotSupported) => {
                    (String::new(), true)
                }
                Err(e) => {
                    errors.push(call_error(Some(index), "nvmlDeviceGetUUID", &e));
                    (String::new(), false)
                }
            };
            match name {
                Ok(name) => {
                    if uuid_final {
                        idents.insert(index, (name.clone(), uuid.clone()));
                    }
                    (name, uuid)
                }
                Err(e) => {
                    errors.push(call_error(Some(index), "nvmlDeviceGetName", &e));
                    (String::new(), uuid)
                }
            }
        }
    };

    let util_percent = match device.utilization_rates() {
        Ok(u) => Some(u.gpu),
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => None,
        Err(e) => {
            errors.push(call_error(Some(index), "nvmlDeviceGetUtilizationRates", &e));
            None
        }
    };

    // The device stays in the reading when only its process list fails:
    // its memory figures are what the GPU rules need.
    let processes = match device.running_compute_processes() {
        Ok(list) => list
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect(),
        Err(e) => {
            errors.push(call_error(
                Some(index),
                "nvmlDeviceGetComputeRunningProcesses_v3",
                &e,
            ));
            Vec::new()
        }
    };

    Some(GpuDevice {
        index,
        name,
        uuid,
        used_bytes: memory.used,
        total_bytes: memory.total,
        free_bytes: memory.free,
        reserved_bytes: memory.reserved,
        util_percent,
        processes,
    })
}

// ---------------------------------------------------------------------------
// Attribution
// ---------------------------------------------------------------------------

/// A process of the job's tree, for matching against NVML's pids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeProc {
    /// The pid as oomguard sees it (in its own `/proc`).
    pub pid: u32,
    /// The `NSpid` line of `/proc/PID/status` ([`read_ns_pids`]): the pid in
    /// each pid namespace the process belongs to, outermost first. The first
    /// entry is relative to the namespace of the `/proc` being read, so it
    /// normally equals `pid`; more entries follow when the job runs in a
    /// nested namespace. Empty when unknown.
    pub ns_pids: Vec<u32>,
}

/// GPU memory of one tree process on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceBytes {
    /// NVML device index.
    pub index: u32,
    /// Bytes NVML reports for the process on that device.
    pub used_bytes: u64,
}

/// GPU memory of one tree process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcGpu {
    /// Sum over all devices (`procs[].gpu_bytes`).
    pub gpu_bytes: u64,
    /// Per device, in device order.
    pub devices: Vec<DeviceBytes>,
}

/// How one device's process list splits between the tree and the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceAttribution {
    /// NVML device index.
    pub index: u32,
    /// Bytes used by the tree's processes.
    pub tree_bytes: u64,
    /// Bytes used by processes outside the tree.
    pub foreign_bytes: u64,
    /// Number of process entries outside the tree.
    pub foreign_procs: u32,
    /// Entries thrown away as nonsense (pid 0 or `u32::MAX`, memory not
    /// available, or more memory than the device has).
    pub discarded: u32,
}

/// Result of [`attribute`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Attribution {
    /// Per tree pid (as in [`TreeProc::pid`]) that uses GPU memory.
    pub procs: BTreeMap<u32, ProcGpu>,
    /// Per device, in the order given.
    pub devices: Vec<DeviceAttribution>,
}

impl Attribution {
    /// GPU bytes of tree pid `pid` over all devices, if it uses any.
    pub fn gpu_bytes(&self, pid: u32) -> Option<u64> {
        self.procs.get(&pid).map(|p| p.gpu_bytes)
    }
}

/// Split every device's process list between the tree and the rest.
///
/// NVML reports pids as the driver sees them, in the root pid namespace. An
/// NVML pid belongs to a tree process when it equals its pid or any entry of
/// its `NSpid` line; that covers jobs running in a nested pid namespace below
/// oomguard. It cannot help when oomguard itself runs in a container with
/// its own `/proc`: root-namespace pids appear in no `NSpid` line there, and
/// the tree's GPU memory shows up as foreign. When one NVML pid matches two
/// tree processes (one's own pid is another's pid in an inner namespace),
/// the match through the outer view wins, then the lower tree pid, so the
/// result does not depend on input order.
///
/// Entries that make no sense are counted in `discarded` and attributed to
/// nobody: pid 0 and `u32::MAX` (what R535.43–86 drivers produced by writing a
/// larger struct than asked), memory "not available", and more memory than
/// the device has.
pub fn attribute(devices: &[GpuDevice], tree: &[TreeProc]) -> Attribution {
    // NVML pid -> (rank of the namespace view, tree pid); lower rank wins.
    let mut owner: HashMap<u32, (usize, u32)> = HashMap::new();
    for proc in tree {
        let views = std::iter::once(proc.pid).chain(proc.ns_pids.iter().copied());
        for (rank, nvml_pid) in views.enumerate() {
            let candidate = (rank, proc.pid);
            owner
                .entry(nvml_pid)
                .and_modify(|best| *best = (*best).min(candidate))
                .or_insert(candidate);
        }
    }

    let mut result = Attribution::default();
    for device in devices {
        let mut summary = DeviceAttribution {
            index: device.index,
            ..DeviceAttribution::default()
        };
        for entry in &device.processes {
            let bytes = match entry.used_bytes {
                Some(b) if b <= device.total_bytes && entry.pid != 0 && entry.pid != u32::MAX => b,
                _ => {
                    summary.discarded += 1;
                    continue;
                }
            };
            match owner.get(&entry.pid) {
                Some(&(_, tree_pid)) => {
                    summary.tree_bytes = summary.tree_bytes.saturating_add(bytes);
                    let proc = result.procs.entry(tree_pid).or_default();
                    proc.gpu_bytes = proc.gpu_bytes.saturating_add(bytes);
                    // Several entries for one pid on one device (MIG
                    // instances) add up.
                    match proc.devices.iter_mut().find(|d| d.index == device.index) {
                        Some(d) => d.used_bytes = d.used_bytes.saturating_add(bytes),
                        None => proc.devices.push(DeviceBytes {
                            index: device.index,
                            used_bytes: bytes,
                        }),
                    }
                }
                None => {
                    summary.foreign_bytes = summary.foreign_bytes.saturating_add(bytes);
                    summary.foreign_procs += 1;
                }
            }
        }
        result.devices.push(summary);
    }
    result
}

// ---------------------------------------------------------------------------
// NSpid
// ---------------------------------------------------------------------------

/// The pids of the `NSpid:` line of a `/proc/PID/status` text, outermost
/// namespace first. `None` when the line is absent (kernels before 4.1) or
/// malformed.
pub fn parse_ns_pids(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids = line
        .split_whitespace()
        .map(|w| w.parse().ok())
        .collect::<Option<Vec<u32>>>()?;
    (!pids.is_empty()).then_some(pids)
}

/// [`parse_ns_pids`] of `<proc_root>/<pid>/status`; `None` when the process is
/// gone or the file unreadable.
pub fn read_ns_pids(proc_root: &Path, pid: u32) -> Option<Vec<u32>> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    parse_ns_pids(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(index: u32, total: u64, procs: &[(u32, Option<u64>)]) -> GpuDevice {
        GpuDevice {
            index,
            name: format!("GPU {index}"),
            uuid: String::new(),
            used_bytes: 0,
            total_bytes: total,
            free_bytes: total,
            reserved_bytes: 0,
            util_percent: None,
            processes: procs
                .iter()
                .map(|&(pid, used_bytes)| GpuProcess { pid, used_bytes })
                .collect(),
        }
    }

    fn tp(pid: u32, ns: &[u32]) -> TreeProc {
        TreeProc {
            pid,
            ns_pids: ns.to_vec(),
        }
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn splits_tree_and_foreign_across_devices() {
        let devices = [
            dev(0, 80 * GIB, &[(100, Some(10 * GIB)), (900, Some(3 * GIB))]),
            dev(1, 80 * GIB, &[(100, Some(2 * GIB)), (101, Some(GIB))]),
        ];
        let a = attribute(&devices, &[tp(100, &[100]), tp(101, &[101]), tp(102, &[])]);
        assert_eq!(a.gpu_bytes(100), Some(12 * GIB));
        assert_eq!(a.gpu_bytes(101), Some(GIB));
        assert_eq!(a.gpu_bytes(102), None);
        assert_eq!(
            a.procs[&100].devices,
            vec![
                DeviceBytes {
                    index: 0,
                    used_bytes: 10 * GIB
                },
                DeviceBytes {
                    index: 1,
                    used_bytes: 2 * GIB
                }
            ]
        );
        assert_eq!(
            a.devices,
            vec![
                DeviceAttribution {
                    index: 0,
                    tree_bytes: 10 * GIB,
                    foreign_bytes: 3 * GIB,
                    foreign_procs: 1,
                    discarded: 0
                },
                DeviceAttribution {
                    index: 1,
                    tree_bytes: 3 * GIB,
                    foreign_bytes: 0,
                    foreign_procs: 0,
                    discarded: 0
                },
            ]
        );
    }

    #[test]
    fn discards_garbage_entries() {
        let devices = [dev(
            0,
            16 * GIB,
            &[
                (0, Some(GIB)),
                (u32::MAX, Some(GIB)),
                (100, Some(17 * GIB)),
                (100, None),
                (100, Some(GIB)),
                (555, Some(u64::MAX - 1)),
            ],
        )];
        let a = attribute(&devices, &[tp(100, &[100])]);
        assert_eq!(a.gpu_bytes(100), Some(GIB));
        assert_eq!(a.devices[0].discarded, 5);
        assert_eq!(a.devices[0].foreign_bytes, 0);
        assert_eq!(a.devices[0].tree_bytes, GIB);
    }

    #[test]
    fn matches_any_namespace_view() {
        // oomguard sees 4321; inside the job's namespace the process is 7.
        let devices = [dev(0, 80 * GIB, &[(7, Some(GIB)), (4321, Some(2 * GIB))])];
        let a = attribute(&devices, &[tp(4321, &[4321, 7])]);
        assert_eq!(a.gpu_bytes(4321), Some(3 * GIB));
        assert_eq!(a.devices[0].tree_bytes, 3 * GIB);
    }

    #[test]
    fn outer_view_wins_a_pid_collision() {
        // 50 is process A's own pid and also process B's pid in an inner
        // namespace: the entry belongs to A.
        let devices = [dev(0, 80 * GIB, &[(50, Some(GIB))])];
        let tree = [tp(60, &[60, 50]), tp(50, &[50])];
        let a = attribute(&devices, &tree);
        assert_eq!(a.gpu_bytes(50), Some(GIB));
        assert_eq!(a.gpu_bytes(60), None);
        let reversed: Vec<_> = tree.iter().rev().cloned().collect();
        assert_eq!(attribute(&devices, &reversed), a);
    }

    #[test]
    fn same_pid_twice_on_a_device_adds_up() {
        let devices = [dev(0, 80 * GIB, &[(100, Some(GIB)), (100, Some(GIB))])];
        let a = attribute(&devices, &[tp(100, &[])]);
        assert_eq!(
            a.procs[&100].devices,
            vec![DeviceBytes {
                index: 0,
                used_bytes: 2 * GIB
            }]
        );
    }

    #[test]
    fn empty_inputs() {
        assert_eq!(attribute(&[], &[]), Attribution::default());
        let a = attribute(&[dev(3, GIB, &[(9, Some(1))])], &[]);
        assert_eq!(a.devices[0].index, 3);
        assert_eq!(a.devices[0].foreign_bytes, 1);
    }

    #[test]
    fn parses_nspid() {
        let status = "Name:\tpython3\nTgid:\t4321\nPid:\t4321\nNSpid:\t4321\t7\t1\nNSsid:\t1\n";
        assert_eq!(parse_ns_pids(status), Some(vec![4321, 7, 1]));
        assert_eq!(parse_ns_pids("NSpid:\t88\n"), Some(vec![88]));
    }

    #[test]
    fn nspid_absent_or_malformed() {
        assert_eq!(parse_ns_pids("Name:\tx\nPid:\t1\n"), None);
        assert_eq!(parse_ns_pids("NSpid:\t\n"), None);
        assert_eq!(parse_ns_pids("NSpid:\t12 x\n"), None);
        assert_eq!(parse_ns_pids(""), None);
    }

    #[test]
    fn reads_nspid_from_a_proc_root() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("42")).unwrap();
        std::fs::write(root.path().join("42/status"), "Pid:\t42\nNSpid:\t42\t3\n").unwrap();
        assert_eq!(read_ns_pids(root.path(), 42), Some(vec![42, 3]));
        assert_eq!(read_ns_pids(root.path(), 43), None);
    }

    #[test]
    fn reads_own_nspid() {
        let pid = std::process::id();
        let ns = read_ns_pids(Path::new("/proc"), pid).unwrap();
        assert_eq!(ns.first(), Some(&pid));
    }

    #[test]
    fn unavailable_reasons_are_one_line() {
        let e = GpuUnavailable::from_init(
            "/x/libnvidia-ml.so.1",
            NvmlError::FailedToLoadSymbol(
                "/x/libnvidia-ml.so.1: undefined symbol: nvmlInit_v2".to_owned(),
            ),
        );
        assert_eq!(
            e,
            GpuUnavailable::SymbolMissing {
                path: "/x/libnvidia-ml.so.1".to_owned(),
                symbol: "nvmlInit_v2".to_owned()
            }
        );
        assert_eq!(
            GpuUnavailable::from_init("l", NvmlError::DriverNotLoaded),
            GpuUnavailable::DriverNotLoaded
        );
        let odd = GpuUnavailable::from_init("l", NvmlError::UnexpectedVariant(25));
        assert!(matches!(odd, GpuUnavailable::InitFailed { code: 25, .. }));
        assert!(
            odd.to_string()
                .starts_with("nvmlInit failed with code 25: ")
        );
        assert_eq!(
            GpuUnavailable::InitTimeout(Duration::from_millis(1500)).to_string(),
            "NVML did not answer within 1.5 s at initialisation"
        );
        for e in [
            GpuUnavailable::DriverNotLoaded,
            GpuUnavailable::NoDevices,
            GpuUnavailable::NoPermission,
        ] {
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn device_serialises_with_the_log_field_names() {
        let mut d = dev(1, 100, &[(5, Some(7)), (6, None)]);
        d.util_percent = Some(40);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "index": 1, "name": "GPU 1", "used_bytes": 0, "total_bytes": 100,
                "free_bytes": 100, "reserved_bytes": 0, "util_percent": 40,
                "processes": [{"pid": 5, "used_bytes": 7}, {"pid": 6, "used_bytes": null}]
            })
        );
        let back: GpuDevice = serde_json::from_value(v).unwrap();
        assert_eq!(back, d);
    }
}
