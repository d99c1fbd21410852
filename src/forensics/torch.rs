//! PyTorch's own error messages in the job's output: CUDA out-of-memory errors
//! raised by the caching allocator (every wording PyTorch has used since the
//! 0.x THC allocator), DataLoader worker deaths, and torchrun's
//! `ChildFailedError` summary. This module owns recognising them line by line
//! ([`TorchScanner`]), turning their figures into bytes, and the advice that
//! follows from those figures ([`cuda_oom_advice`], [`worker_died_advice`],
//! [`rank_failed_advice`]).
//!
//! Parsing is deliberately field by field: every figure is looked for on its
//! own, so an arrangement of the message that PyTorch has not printed yet still
//! yields whatever it shares with the known ones.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// Longest line the scanner looks at; the rest of a longer line is ignored.
/// A CUDA OOM message is well under 1 KiB; this only bounds hostile input.
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// Lines an unfinished CUDA OOM message may be continued over (a log
/// formatter or a wrapping terminal capture can split it).
const MAX_OOM_LINES: usize = 8;

/// Bytes kept of one multi-line message (OOM or torchrun report).
const MAX_MESSAGE_BYTES: usize = 32 * 1024;

/// Lines a torchrun `ChildFailedError` report may span before it is closed by
/// force (a report with long tracebacks in `error_file` is the large case).
const MAX_REPORT_LINES: usize = 400;

/// Lines after `ChildFailedError:` within which the report's fence must start.
const REPORT_START_LINES: usize = 3;

/// Events waiting to be handed out; a line yields at most a few, so this only
/// matters for a caller that never calls [`TorchScanner::poll`].
const MAX_QUEUED_EVENTS: usize = 16;

/// One recognised PyTorch message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TorchEvent {
    /// The CUDA caching allocator (or CUDA itself) ran out of device memory.
    CudaOom(CudaOom),
    /// A DataLoader worker process died (a signal, an exit code, or the
    /// timeout path that only lists pids).
    WorkerDied(WorkerDied),
    /// torchrun / torch.distributed.elastic reported that one or more ranks
    /// failed (`ChildFailedError`), with their exit codes or signals.
    RankFailed(RankFailed),
    /// Training progress (`crate::forensics::progress`): not a PyTorch
    /// message, but read from the same lines by the output scanner, so it
    /// keeps its order among them. Consecutive updates are merged.
    Progress(crate::forensics::progress::ProgressUpdate),
    /// The job's output names the framework that trains (once per
    /// scanner): what a stop without the companion does depends on it.
    Framework(Framework),
}

/// A training framework recognised by a line only it prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    /// PyTorch Lightning's `GPU available: …, used: …` banner, printed at
    /// every `Trainer`'s start. Lightning catches SIGTERM to stop at the
    /// next step, and saves nothing.
    Lightning,
}

/// The figures of a CUDA out-of-memory error. Every size is in bytes and is
/// `None` when the message does not carry it (older formats, a missing NVML
/// process line, or NVML's "value not available" marker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaOom {
    /// The device index (`GPU d`).
    pub device: Option<u32>,
    /// The allocation that failed (`Tried to allocate …`).
    pub tried_bytes: Option<u64>,
    /// The device's total capacity.
    pub total_bytes: Option<u64>,
    /// Free device memory as the driver reported it at the failure.
    pub free_bytes: Option<u64>,
    /// Memory in live tensors (`already allocated` / `is allocated by PyTorch`).
    pub allocated_bytes: Option<u64>,
    /// Memory the allocator holds but has not handed out: 2.x `reserved by
    /// PyTorch but unallocated`, and 1.0–1.3 `cached` (which, per PR #13751,
    /// meant exactly that, not the total reserve).
    pub reserved_unallocated_bytes: Option<u64>,
    /// Everything the allocator holds (1.4+ `reserved in total by PyTorch`).
    pub reserved_bytes: Option<u64>,
    /// NVML's figure for the failing process, including non-PyTorch memory:
    /// `this process has X memory in use`, or a lone `Process N has X memory
    /// in use` (inside a container the own process is printed that way).
    pub process_bytes: Option<u64>,
    /// The pid the message gives for the failing process, when it names one
    /// (a lone `Process N` line; a host pid when the job runs in a container).
    pub pid: Option<u32>,
    /// Every `Process N has X memory in use` entry, in message order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcessMemory>,
    /// The original text, trimmed (lines joined with `\n`).
    pub message: String,
}

/// One `Process N has X memory in use` entry of a CUDA OOM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcessMemory {
    /// The pid as NVML reports it (a host pid).
    pub pid: u32,
    /// Its device memory, `None` when NVML said "not available".
    pub bytes: Option<u64>,
}

/// A DataLoader worker death as reported by the main process (or by the
/// worker itself just before it died).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerDied {
    /// The worker's pid when the message names exactly one.
    pub pid: Option<u32>,
    /// Every pid the message names (one for `pid P`, several for `pid(s) …`).
    pub pids: Vec<u32>,
    /// The signal's name (`SIGKILL` for strsignal's `Killed`, …). A signal
    /// text this module does not know is kept as printed.
    pub signal: Option<String>,
    /// `exited unexpectedly with exit code N`.
    pub exit_code: Option<i32>,
    /// The message points at shared memory (a bus error, or PyTorch's
    /// "out of shared memory" / "insufficient shared memory" hint).
    pub shm_hint: bool,
    /// The original text, trimmed.
    pub message: String,
}

/// torchrun's `ChildFailedError` report: the failed ranks of one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFailed {
    /// The script named in the `<script> FAILED` line.
    pub script: Option<String>,
    /// Every failure of the report, root cause flagged.
    pub failures: Vec<RankFailure>,
    /// The report as printed, trimmed (lines joined with `\n`, bounded).
    pub message: String,
}

/// One `[i]:` entry of a torchrun failure report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFailure {
    /// Listed under `Root Cause`.
    pub root_cause: bool,
    /// Global rank.
    pub rank: Option<u32>,
    /// Local rank on its host.
    pub local_rank: Option<u32>,
    /// Host name.
    pub host: Option<String>,
    /// The rank's pid.
    pub pid: Option<u32>,
    /// torchrun's `exitcode` as printed: negative for "killed by signal".
    pub exitcode: Option<i32>,
    /// The signal's name, from a negative exitcode or `Signal 9 (SIGKILL)`.
    pub signal: Option<String>,
}

// ---------------------------------------------------------------------------
// Patterns. A size is `format_size()` output: "N bytes" or "X.XX KiB/MiB/GiB".

macro_rules! re {
    ($name:ident, $pat:expr) => {
        static $name: LazyLock<Regex> =
            LazyLock::new(|| Regex::new($pat).expect("static pattern compiles"));
    };
}

/// A size: number and unit (two capture groups).
macro_rules! size {
    () => {
        r"(\d+(?:\.\d+)?)\s*(bytes?|B|KiB|MiB|GiB|TiB|PiB)\b"
    };
}

// The anchors: what makes a line a GPU out-of-memory report at all. The kernel's
// "Memory cgroup out of memory" and DataLoader's "out of shared memory" must not
// match, hence no bare "out of memory".
re!(
    OOM_ANCHOR,
    r"(?i)\b(?:cuda|hip) out of memory\b|cuda runtime error \(2\)\s*:\s*out of memory|cuda error:\s*out of memory|torch\.(?:cuda\.)?OutOfMemoryError:|out of memory\.?\s+tried to allocate"
);
// Formats that are complete on their line and carry no figures.
re!(
    OOM_NO_FIGURES,
    r"(?i)cuda runtime error \(2\)\s*:\s*out of memory|cuda error:\s*out of memory"
);
re!(TRIED, concat!(r"(?i)tried to allocate\s+", size!()));
re!(DEVICE, r"(?i)\b(?:GPU|device)\s+(\d+)\b");
re!(TOTAL_OLD, concat!(r"(?i)", size!(), r"\s+total capacity"));
// 2.1 printed "total capacty"; accept any spelling of the word.
re!(TOTAL_NEW, concat!(r"(?i)total capac\w*\s+of\s+", size!()));
re!(FREE_OLD, concat!(r"(?i)", size!(), r"\s+free\b"));
re!(
    FREE_NEW,
    concat!(r"(?i)of which\s+", size!(), r"\s+is\s+free")
);
re!(
    ALLOC_OLD,
    concat!(r"(?i)", size!(), r"\s+already allocated")
);
re!(
    ALLOC_NEW,
    concat!(r"(?i)", size!(), r"\s+is allocated by PyTorch")
);
re!(
    UNALLOC_NEW,
    concat!(
        r"(?i)",
        size!(),
        r"\s+is reserved by PyTorch but unallocated"
    )
);
re!(CACHED, concat!(r"(?i)", size!(), r"\s+cached\b"));
re!(
    RESERVED_TOTAL,
    concat!(r"(?i)", size!(), r"\s+reserved in total by PyTorch")
);
re!(
    THIS_PROCESS,
    concat!(r"(?i)this process has\s+", size!(), r"\s+memory in use")
);
re!(
    OTHER_PROCESS,
    concat!(
        r"(?i)\bprocess\s+(\d+)\s+has\s+",
        size!(),
        r"\s+memory in use"
    )
);
// Completeness of a message, to know whether the next line may continue it.
re!(OLD_BODY_OPEN, r"(?i)\(\s*GPU\s+\d+\s*;");
re!(NEW_BODY, r"(?i)\bGPU\s+\d+\s+has a total capac");
re!(
    ENDS_UNFINISHED,
    concat!(
        r"(?i)(?:out of memory|tried to allocate(?:\s+",
        size!(),
        r")?)\.?\s*$"
    )
);
re!(
    OOM_CONTINUATION,
    r"(?i)tried to allocate|total capac|already allocated|\bfree\b|reserved|cached|allocated by pytorch|memory in use|^\s*\(?\s*(?:GPU|device)\s+\d+|max_split_size_mb|alloc_conf|memory management|allowed;|^\s*\)"
);

re!(
    WORKER_SIGNAL,
    r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]*?)\s*(?:\.|$)"
);
re!(
    WORKER_EXIT_CODE,
    r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)"
);
re!(
    WORKER_PIDS,
    r"DataLoader worker \(pids?(?:\(s\))? ([0-9][0-9,\s]*)\) exited unexpectedly"
);
re!(
    WORKER_SELF,
    r"(?i)unexpected (bus error|segmentation fault|floating-point exception|floating point exception) encountered in worker"
);
re!(
    SHM_HINT,
    r"(?i)(?:out of|insufficient) shared memory|\(shm\)"
);

re!(ANSI_CSI, r"\x1b\[[0-9;?]*[ -/]*[@-~]");

re!(REPORT_ENTRY, r"^\[\d+\]:\s*$");
// torchelastic's agent: `failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: /usr/bin/python3`.
re!(
    AGENT_FAILED,
    r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\) of binary"
);
// The agent tearing down the surviving ranks.
re!(
    AGENT_CLOSING,
    r"Sending process (\d+) closing signal (SIG[A-Z0-9]+)"
);
re!(
    REPORT_FIELD,
    r"^(time|host|rank|exitcode|error_file|traceback|msg)\s*:\s*(.*)$"
);
re!(REPORT_RANK, r"^(\d+)(?:\s*\(local_rank:\s*(\d+)\))?");
re!(REPORT_EXITCODE, r"^(-?\d+)(?:\s*\(pid:\s*(\d+)\))?");
re!(
    REPORT_SIGNAL,
    r"Signal\s+(\d+)\s+\((SIG[A-Z0-9]+)\)\s+received by PID\s+(\d+)"
);

// ---------------------------------------------------------------------------
// Sizes.

/// Converts a `format_size()` figure ("12.50", "MiB") to bytes exactly: the
/// decimal is scaled in integers (no float rounding) and rounded half up to a
/// whole byte. `None` when it does not fit in a u64, which is also how NVML's
/// "not available" marker (`17179869184.00 GiB`, i.e. 2^64 bytes) comes out.
pub fn size_to_bytes(number: &str, unit: &str) -> Option<u64> {
    let multiplier: u128 = match unit.to_ascii_lowercase().as_str() {
        "b" | "byte" | "bytes" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "pib" => 1 << 50,
        _ => return None,
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    // Beyond 18 fractional digits nothing changes at byte precision for these
    // units; the cap keeps 10^digits inside u128.
    let frac_part = &frac_part[..frac_part.len().min(18)];
    if int_part.is_empty() || int_part.len() > 30 {
        return None;
    }
    let int_value: u128 = int_part.parse().ok()?;
    let frac_value: u128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().ok()?
    };
    let scale = 10u128.checked_pow(u32::try_from(frac_part.len()).ok()?)?;
    let scaled = int_value
        .checked_mul(scale)?
        .checked_add(frac_value)?
        .checked_mul(multiplier)?;
    let bytes = scaled.checked_add(scale / 2)? / scale;
    u64::try_from(bytes).ok()
}

/// Formats bytes the way PyTorch's `format_size()` does, for advice text.
pub fn format_size(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    // Precision loss in the cast is irrelevant for a two-decimal display.
    let value = bytes as f64;
    if bytes < KIB {
        format!("{bytes} bytes")
    } else if bytes < MIB {
        format!("{:.2} KiB", value / KIB as f64)
    } else if bytes < GIB {
        format!("{:.2} MiB", value / MIB as f64)
    } else {
        format!("{:.2} GiB", value / GIB as f64)
    }
}

/// The first size captured by `re` (number in group `first`, unit after it).
fn find_size(re: &Regex, text: &str, first: usize) -> Option<u64> {
    let caps = re.captures(text)?;
    size_to_bytes(caps.get(first)?.as_str(), caps.get(first + 1)?.as_str())
}

// ---------------------------------------------------------------------------
// Signals.

/// Linux signal numbers, names, and glibc's `strsignal()` text (which is what
/// DataLoader prints).
const SIGNALS: &[(i32, &str, &str)] = &[
    (1, "SIGHUP", "Hangup"),
    (2, "SIGINT", "Interrupt"),
    (3, "SIGQUIT", "Quit"),
    (4, "SIGILL", "Illegal instruction"),
    (5, "SIGTRAP", "Trace/breakpoint trap"),
    (6, "SIGABRT", "Aborted"),
    (7, "SIGBUS", "Bus error"),
    (8, "SIGFPE", "Floating point exception"),
    (9, "SIGKILL", "Killed"),
    (10, "SIGUSR1", "User defined signal 1"),
    (11, "SIGSEGV", "Segmentation fault"),
    (12, "SIGUSR2", "User defined signal 2"),
    (13, "SIGPIPE", "Broken pipe"),
    (14, "SIGALRM", "Alarm clock"),
    (15, "SIGTERM", "Terminated"),
    (16, "SIGSTKFLT", "Stack fault"),
    (17, "SIGCHLD", "Child exited"),
    (18, "SIGCONT", "Continued"),
    (19, "SIGSTOP", "Stopped (signal)"),
    (20, "SIGTSTP", "Stopped"),
    (21, "SIGTTIN", "Stopped (tty input)"),
    (22, "SIGTTOU", "Stopped (tty output)"),
    (23, "SIGURG", "Urgent I/O condition"),
    (24, "SIGXCPU", "CPU time limit exceeded"),
    (25, "SIGXFSZ", "File size limit exceeded"),
    (26, "SIGVTALRM", "Virtual timer expired"),
    (27, "SIGPROF", "Profiling timer expired"),
    (28, "SIGWINCH", "Window changed"),
    (29, "SIGIO", "I/O possible"),
    (30, "SIGPWR", "Power failure"),
    (31, "SIGSYS", "Bad system call"),
];

/// The name of a Linux signal number (`9` → `SIGKILL`).
pub fn signal_name(number: i32) -> Option<&'static str> {
    SIGNALS
        .iter()
        .find(|(n, _, _)| *n == number)
        .map(|(_, name, _)| *name)
}

/// Maps a `strsignal()` text to a signal name. Also accepts a bare number,
/// a `SIGxxx` name, macOS's `Killed: 9` and glibc's `Real-time signal N`;
/// anything else is returned as printed.
fn signal_from_text(text: &str) -> String {
    let text = text.trim();
    if let Some((_, name, _)) = SIGNALS
        .iter()
        .find(|(_, _, description)| description.eq_ignore_ascii_case(text))
    {
        return (*name).to_string();
    }
    if text.starts_with("SIG") {
        return text.to_string();
    }
    // "9", or BSD's "Killed: 9".
    let number_text = text.rsplit(':').next().unwrap_or(text).trim();
    if let Ok(number) = number_text.parse::<i32>()
        && let Some(name) = signal_name(number)
    {
        return name.to_string();
    }
    if let Some(n) = text.strip_prefix("Real-time signal ")
        && let Ok(n) = n.trim().parse::<u32>()
    {
        return format!("SIGRTMIN+{n}");
    }
    text.to_string()
}

// ---------------------------------------------------------------------------
// Single-message parsers.

/// Parses one CUDA out-of-memory message (possibly several lines joined).
/// `None` when the text is not one.
pub fn parse_cuda_oom(message: &str) -> Option<CudaOom> {
    // A message split over lines lost the space at each break.
    let joined;
    let text = if message.contains('\n') {
        joined = message.replace('\n', " ");
        joined.as_str()
    } else {
        message
    };
    if !OOM_ANCHOR.is_match(text) {
        return None;
    }
    let processes: Vec<GpuProcessMemory> = OTHER_PROCESS
        .captures_iter(text)
        .take(64)
        .filter_map(|caps| {
            let pid = caps.get(1)?.as_str().parse().ok()?;
            let bytes = size_to_bytes(caps.get(2)?.as_str(), caps.get(3)?.as_str());
            Some(GpuProcessMemory { pid, bytes })
        })
        .collect();
    let this_process = find_size(&THIS_PROCESS, text, 1);
    // "this process" is PyTorch's own pid as NVML sees it. Without it, a lone
    // "Process N" is the container case (NVML prints the host pid). Several
    // of them cannot be told apart here; the caller can match `processes`
    // against the tree's namespaced pids.
    let (process_bytes, pid) = match (this_process, processes.as_slice()) {
        (Some(bytes), _) => (Some(bytes), None),
        (None, [only]) => (only.bytes, Some(only.pid)),
        (None, _) => (None, None),
    };
    Some(CudaOom {
        device: DEVICE
            .captures(text)
            .and_then(|c| c.get(1))
            .and_then(|m| m.as_str().parse().ok()),
        tried_bytes: find_size(&TRIED, text, 1),
        total_bytes: find_size(&TOTAL_OLD, text, 1).or_else(|| find_size(&TOTAL_NEW, text, 1)),
        free_bytes: find_size(&FREE_NEW, text, 1).or_else(|| find_size(&FREE_OLD, text, 1)),
        allocated_bytes: find_size(&ALLOC_NEW, text, 1).or_else(|| find_size(&ALLOC_OLD, text, 1)),
        reserved_unallocated_bytes: find_size(&UNALLOC_NEW, text, 1)
            .or_else(|| find_size(&CACHED, text, 1)),
        // 1.0–1.3 printed the reserve minus the allocated memory as
        // "cached"; the reserve itself is their sum.
        reserved_bytes: find_size(&RESERVED_TOTAL, text, 1).or_else(|| {
            let cached = find_size(&CACHED, text, 1)?;
            let allocated = find_size(&ALLOC_OLD, text, 1)?;
            cached.checked_add(allocated)
        }),
        process_bytes,
        pid,
        processes,
        message: message.trim().to_string(),
    })
}

/// Parses one DataLoader worker-death line. `None` when the line is not one.
pub fn parse_worker_died(line: &str) -> Option<WorkerDied> {
    let message = line.trim().to_string();
    let shm_text = SHM_HINT.is_match(line);
    if let Some(caps) = WORKER_SIGNAL.captures(line) {
        let pid = caps.get(1)?.as_str().parse().ok()?;
        let signal = signal_from_text(caps.get(2)?.as_str());
        let shm_hint = shm_text || signal == "SIGBUS";
        return Some(WorkerDied {
            pid: Some(pid),
            pids: vec![pid],
            signal: Some(signal),
            exit_code: None,
            shm_hint,
            message,
        });
    }
    if let Some(caps) = WORKER_EXIT_CODE.captures(line) {
        let pid = caps.get(1)?.as_str().parse().ok()?;
        return Some(WorkerDied {
            pid: Some(pid),
            pids: vec![pid],
            signal: None,
            exit_code: caps.get(2)?.as_str().parse().ok(),
            shm_hint: shm_text,
            message,
        });
    }
    if let Some(caps) = WORKER_PIDS.captures(line) {
        let pids: Vec<u32> = caps
            .get(1)?
            .as_str()
            .split(',')
            .filter_map(|p| p.trim().parse().ok())
            .take(1024)
            .collect();
        return Some(WorkerDied {
            pid: match pids.as_slice() {
                [only] => Some(*only),
                _ => None,
            },
            pids,
            signal: None,
            exit_code: None,
            shm_hint: shm_text,
            message,
        });
    }
    if let Some(caps) = WORKER_SELF.captures(line) {
        // Printed by the worker's own fatal-signal handler; it has no pid.
        let what = caps.get(1)?.as_str().to_ascii_lowercase();
        let signal = if what.starts_with("bus") {
            "SIGBUS"
        } else if what.starts_with("segmentation") {
            "SIGSEGV"
        } else {
            "SIGFPE"
        };
        return Some(WorkerDied {
            pid: None,
            pids: Vec::new(),
            signal: Some(signal.to_string()),
            exit_code: None,
            shm_hint: shm_text || signal == "SIGBUS",
            message,
        });
    }
    None
}

// ---------------------------------------------------------------------------
// The scanner.

/// Recognises PyTorch messages in a job's output, fed one line at a time.
///
/// Most messages are one line. Two are not: a CUDA OOM message that a log
/// formatter split (the scanner holds it until the next line shows whether it
/// continues), and torchrun's `ChildFailedError` report (held until its
/// closing fence). Memory is bounded: lines are cut at [`MAX_LINE_BYTES`],
/// held messages at a fixed size and line count.
///
/// A line can complete more than one event (it ends a held message and is a
/// message itself); [`TorchScanner::feed`] returns the first and
/// [`TorchScanner::poll`] the rest. At the end of the output call
/// [`TorchScanner::finish`] for anything still held.
#[derive(Debug, Default)]
pub struct TorchScanner {
    oom: Option<PendingOom>,
    report: Option<PendingReport>,
    ready: VecDeque<TorchEvent>,
    /// A worker's own death line (no pid), held for the trainer's line
    /// that names it, and the lines seen since.
    death: Option<(WorkerDied, usize)>,
    /// The pids and signal of the death last handed out, and the lines
    /// since: later lines about them are the same death.
    recent_death: Option<(Vec<u32>, Option<String>, usize)>,
    /// Ranks the agent reported failed, held for the `ChildFailedError`
    /// report that names their global rank, and the lines seen since.
    agent: Option<(Vec<RankFailure>, usize)>,
    /// Pids the agent sent a closing signal: siblings it tore down, not
    /// failures (bounded).
    closing: Vec<u32>,
}

/// Lines a worker death's cascade may span (a traceback sits between).
const DEATH_LINES: usize = 60;

/// Sibling pids remembered.
const MAX_CLOSING: usize = 256;

#[derive(Debug)]
struct PendingOom {
    text: String,
    lines: usize,
}

#[derive(Debug)]
struct PendingReport {
    message: String,
    lines: usize,
    /// The character of the report's outer fence (`=` now, `*` in 1.9–1.10).
    fence: Option<char>,
    in_root_cause: bool,
    script: Option<String>,
    failures: Vec<RankFailure>,
}

impl TorchScanner {
    /// A scanner with nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one line of output (with or without its newline) and returns an
    /// event completed by it, if any.
    pub fn feed(&mut self, line: &str) -> Option<TorchEvent> {
        let line = normalise(line);
        let line = line.as_ref();

        self.age_held();
        if line.contains("closing signal")
            && let Some(caps) = AGENT_CLOSING.captures(line)
            && let Some(pid) = caps.get(1).and_then(|m| m.as_str().parse().ok())
            && self.closing.len() < MAX_CLOSING
        {
            self.closing.push(pid);
        }
        if line.contains("of binary")
            && let Some(failure) = parse_agent_failure(line)
        {
            if !failure.pid.is_some_and(|p| self.closing.contains(&p)) {
                let held = self.agent.get_or_insert_with(|| (Vec::new(), 0));
                if held.0.len() < MAX_QUEUED_EVENTS {
                    held.0.push(failure);
                }
            }
            return self.poll();
        }
        if let Some(report) = &mut self.report {
            match report.feed(line) {
                ReportStep::Continue => {}
                ReportStep::Done => {
                    if let Some(report) = self.report.take() {
                        let report = self.settle_report(report.finish());
                        self.push(TorchEvent::RankFailed(report));
                    }
                }
            }
        } else if line.contains("ChildFailedError:") {
            self.report = Some(PendingReport::start(line));
            return self.poll();
        }

        if let Some(pending) = &mut self.oom {
            let continues = OOM_CONTINUATION.is_match(line)
                && !OOM_ANCHOR.is_match(line)
                && pending.lines < MAX_OOM_LINES
                && pending.text.len() + line.len() < MAX_MESSAGE_BYTES;
            if continues {
                pending.text.push('\n');
                pending.text.push_str(line.trim());
                pending.lines += 1;
                if oom_is_complete(&pending.text) {
                    self.flush_oom();
                }
                return self.poll();
            }
            self.flush_oom();
        }

        if OOM_ANCHOR.is_match(line) {
            self.oom = Some(PendingOom {
                text: line.trim().to_string(),
                lines: 1,
            });
            if oom_is_complete(line) {
                self.flush_oom();
            }
        } else if (line.contains("DataLoader worker") || line.contains("encountered in worker"))
            && let Some(died) = parse_worker_died(line)
        {
            self.worker_died(died);
        }
        self.poll()
    }

    /// One death is one event. The worker's own line (it has no pid) is
    /// held for the trainer's line that names the pid; a line with a pid
    /// goes out at once, and the lines after it about the same pid (`exited
    /// unexpectedly`) are part of it, not new deaths.
    fn worker_died(&mut self, mut died: WorkerDied) {
        let compatible =
            |a: &Option<String>, b: &Option<String>| a.is_none() || b.is_none() || a == b;
        if let Some((pids, signal, _)) = &self.recent_death
            && !died.pids.is_empty()
            && died.pids.iter().all(|p| pids.contains(p))
            && compatible(signal, &died.signal)
        {
            return;
        }
        if let Some((held, _)) = self.death.take() {
            if compatible(&held.signal, &died.signal) {
                died.signal = died.signal.or(held.signal);
                died.shm_hint |= held.shm_hint;
                if held.message.len() + died.message.len() < MAX_MESSAGE_BYTES {
                    died.message = format!("{}\n{}", held.message, died.message);
                }
            } else {
                self.push(TorchEvent::WorkerDied(held));
            }
        }
        if died.pids.is_empty() {
            self.death = Some((died, 0));
        } else {
            self.recent_death = Some((died.pids.clone(), died.signal.clone(), 0));
            self.push(TorchEvent::WorkerDied(died));
        }
    }

    fn flush_death(&mut self) {
        if let Some((died, _)) = self.death.take() {
            self.push(TorchEvent::WorkerDied(died));
        }
    }

    /// Held messages that waited long enough for their other lines go out.
    fn age_held(&mut self) {
        if let Some((_, lines)) = &mut self.death {
            *lines += 1;
            if *lines > DEATH_LINES {
                self.flush_death();
            }
        }
        if let Some((_, _, lines)) = &mut self.recent_death {
            *lines += 1;
            if *lines > DEATH_LINES {
                self.recent_death = None;
            }
        }
        if let Some((_, lines)) = &mut self.agent {
            *lines += 1;
            if *lines > MAX_REPORT_LINES && self.report.is_none() {
                self.flush_agent();
            }
        }
    }

    /// The agent's failures that no report named, as a report of their own.
    fn flush_agent(&mut self) {
        if let Some((failures, _)) = self.agent.take()
            && !failures.is_empty()
        {
            self.push(TorchEvent::RankFailed(RankFailed {
                script: None,
                failures,
                message: String::new(),
            }));
        }
    }

    /// Joins the agent's lines into the report (matched by pid) and drops
    /// the siblings torchrun tore down: only failed ranks stay.
    fn settle_report(&mut self, mut report: RankFailed) -> RankFailed {
        let closing = &self.closing;
        report
            .failures
            .retain(|f| f.root_cause || !f.pid.is_some_and(|p| closing.contains(&p)));
        if let Some((agent, _)) = self.agent.take() {
            for a in agent {
                match report
                    .failures
                    .iter_mut()
                    .find(|f| f.pid.is_some() && f.pid == a.pid)
                {
                    Some(f) => {
                        f.local_rank = f.local_rank.or(a.local_rank);
                        f.exitcode = f.exitcode.or(a.exitcode);
                        f.signal = f.signal.take().or(a.signal);
                    }
                    None => report.failures.push(a),
                }
            }
        }
        report
    }

    /// No message is held waiting for its continuation: a line that
    /// matches no trigger changes nothing.
    pub fn is_idle(&self) -> bool {
        self.oom.is_none() && self.report.is_none() && self.death.is_none() && self.agent.is_none()
    }

    /// The next event already completed but not yet returned.
    pub fn poll(&mut self) -> Option<TorchEvent> {
        self.ready.pop_front()
    }

    /// Ends the output: returns every event still queued or held, including
    /// an unfinished message (parsed for what it has).
    pub fn finish(&mut self) -> Vec<TorchEvent> {
        self.flush_oom();
        self.flush_death();
        if let Some(report) = self.report.take() {
            let report = self.settle_report(report.finish());
            self.push(TorchEvent::RankFailed(report));
        }
        self.flush_agent();
        self.ready.drain(..).collect()
    }

    fn flush_oom(&mut self) {
        if let Some(pending) = self.oom.take()
            && let Some(oom) = parse_cuda_oom(&pending.text)
        {
            self.push(TorchEvent::CudaOom(oom));
        }
    }

    fn push(&mut self, event: TorchEvent) {
        if self.ready.len() < MAX_QUEUED_EVENTS {
            self.ready.push_back(event);
        }
    }
}

/// Parses torchelastic's agent line for a failed local rank.
fn parse_agent_failure(line: &str) -> Option<RankFailure> {
    let caps = AGENT_FAILED.captures(line)?;
    let exitcode: i32 = caps.get(1)?.as_str().parse().ok()?;
    Some(RankFailure {
        root_cause: true,
        rank: None,
        local_rank: caps.get(2)?.as_str().parse().ok(),
        host: None,
        pid: caps.get(3)?.as_str().parse().ok(),
        exitcode: Some(exitcode),
        signal: (exitcode < 0)
            .then(|| exitcode.checked_neg().and_then(signal_name))
            .flatten()
            .map(str::to_string),
    })
}

/// Scans a whole text (e.g. a saved log) and returns every event in order.
pub fn scan_text(text: &str) -> Vec<TorchEvent> {
    let mut scanner = TorchScanner::new();
    let mut events = Vec::new();
    for line in text.lines() {
        if let Some(event) = scanner.feed(line) {
            events.push(event);
        }
        while let Some(event) = scanner.poll() {
            events.push(event);
        }
    }
    events.extend(scanner.finish());
    events
}

/// Cuts a line to [`MAX_LINE_BYTES`] on a character boundary, keeps what a
/// terminal would show after carriage returns (progress bars rewrite their
/// line with `\r`), and drops ANSI colour sequences.
fn normalise(line: &str) -> Cow<'_, str> {
    let mut end = line.len().min(MAX_LINE_BYTES);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let mut line = &line[..end];
    line = line.strip_suffix('\n').unwrap_or(line);
    if line.contains('\r') {
        line = line
            .rsplit('\r')
            .find(|segment| !segment.trim().is_empty())
            .unwrap_or("");
    }
    if line.contains('\x1b') {
        ANSI_CSI.replace_all(line, "")
    } else {
        Cow::Borrowed(line)
    }
}

/// Whether an OOM message can be handed out, or whether its next line may
/// still carry figures. Anything not known to be unfinished is complete, so
/// an unknown wording is never held back.
fn oom_is_complete(text: &str) -> bool {
    if OOM_NO_FIGURES.is_match(text) {
        return true;
    }
    if let Some(open) = OLD_BODY_OPEN.find(text) {
        return text[open.end()..].contains(')');
    }
    if NEW_BODY.is_match(text) {
        return text.to_ascii_lowercase().contains("unallocated");
    }
    !ENDS_UNFINISHED.is_match(text)
}

enum ReportStep {
    Continue,
    Done,
}

impl PendingReport {
    fn start(line: &str) -> Self {
        Self {
            message: line.trim().to_string(),
            lines: 1,
            fence: None,
            in_root_cause: false,
            script: None,
            failures: Vec::new(),
        }
    }

    fn feed(&mut self, line: &str) -> ReportStep {
        let trimmed = line.trim();
        let separator = fence_char(trimmed);
        if self.fence.is_none() {
            match separator {
                Some(c) => self.fence = Some(c),
                None if self.lines > REPORT_START_LINES => return ReportStep::Done,
                None => {}
            }
        } else if separator.is_some() && separator == self.fence {
            self.append(trimmed);
            return ReportStep::Done;
        }
        self.append(trimmed);
        if self.lines >= MAX_REPORT_LINES {
            return ReportStep::Done;
        }
        if separator.is_some() {
            return ReportStep::Continue;
        }

        if trimmed.starts_with("Root Cause") {
            self.in_root_cause = true;
        } else if trimmed.starts_with("Other Failures") || trimmed.starts_with("Failures:") {
            self.in_root_cause = false;
        } else if REPORT_ENTRY.is_match(trimmed) {
            self.failures.push(self.new_failure());
        } else if let Some(caps) = REPORT_FIELD.captures(trimmed) {
            let key = caps.get(1).map_or("", |m| m.as_str());
            let value = caps.get(2).map_or("", |m| m.as_str()).trim();
            self.field(key, value);
        } else if let Some(script) = trimmed.strip_suffix(" FAILED")
            && self.script.is_none()
        {
            self.script = Some(script.trim().to_string());
        }
        ReportStep::Continue
    }

    fn new_failure(&self) -> RankFailure {
        RankFailure {
            root_cause: self.in_root_cause,
            rank: None,
            local_rank: None,
            host: None,
            pid: None,
            exitcode: None,
            signal: None,
        }
    }

    fn field(&mut self, key: &str, value: &str) {
        if self.failures.is_empty() {
            self.failures.push(self.new_failure());
        }
        let Some(failure) = self.failures.last_mut() else {
            return;
        };
        match key {
            "host" => failure.host = Some(value.to_string()),
            "rank" => {
                if let Some(caps) = REPORT_RANK.captures(value) {
                    failure.rank = caps.get(1).and_then(|m| m.as_str().parse().ok());
                    failure.local_rank = caps.get(2).and_then(|m| m.as_str().parse().ok());
                }
            }
            "exitcode" => {
                if let Some(caps) = REPORT_EXITCODE.captures(value) {
                    failure.exitcode = caps.get(1).and_then(|m| m.as_str().parse().ok());
                    if let Some(pid) = caps.get(2).and_then(|m| m.as_str().parse().ok()) {
                        failure.pid = Some(pid);
                    }
                    // torchrun prints -N for "killed by signal N".
                    if let Some(code) = failure.exitcode
                        && code < 0
                        && failure.signal.is_none()
                    {
                        failure.signal =
                            code.checked_neg().and_then(signal_name).map(str::to_string);
                    }
                }
            }
            "traceback" | "msg" => {
                if let Some(caps) = REPORT_SIGNAL.captures(value) {
                    if let Some(name) = caps.get(2) {
                        failure.signal = Some(name.as_str().to_string());
                    }
                    if failure.pid.is_none() {
                        failure.pid = caps.get(3).and_then(|m| m.as_str().parse().ok());
                    }
                }
            }
            _ => {}
        }
    }

    fn append(&mut self, trimmed: &str) {
        self.lines += 1;
        if self.message.len() + trimmed.len() < MAX_MESSAGE_BYTES {
            self.message.push('\n');
            self.message.push_str(trimmed);
        }
    }

    fn finish(self) -> RankFailed {
        RankFailed {
            script: self.script,
            failures: self.failures,
            message: self.message,
        }
    }
}

/// The fence character of a separator line (`=====`, `-----`, `*****`).
fn fence_char(trimmed: &str) -> Option<char> {
    let first = trimmed.chars().next()?;
    (matches!(first, '=' | '-' | '*') && trimmed.len() >= 10 && trimmed.chars().all(|c| c == first))
        .then_some(first)
}

// ---------------------------------------------------------------------------
// Advice.

/// Memory a device may show in use outside PyTorch's allocator without it
/// being worth a word when the message cannot tell processes apart: a CUDA
/// context alone takes 0.3–1 GiB.
const CONTEXT_ALLOWANCE: u64 = 1 << 30;

/// Memory other processes may hold, when the message does tell them apart,
/// before it is named (figures are rounded to two decimals of GiB).
const FOREIGN_MINIMUM: u64 = 256 << 20;

/// The allocator's reserved-but-unallocated memory: printed by 2.x and 1.0–1.3,
/// derived as reserved − allocated from the 1.4–2.0 wording.
pub fn unallocated_bytes(e: &CudaOom) -> Option<u64> {
    e.reserved_unallocated_bytes.or_else(|| {
        let reserved = e.reserved_bytes?;
        let allocated = e.allocated_bytes?;
        reserved.checked_sub(allocated)
    })
}

/// True when the allocator held at least the failed request in reserved but
/// unallocated memory: the request failed for want of a block of the right
/// shape, not of memory, and `expandable_segments:True` is the remedy.
pub fn is_fragmentation(e: &CudaOom) -> bool {
    let (Some(tried), Some(unallocated)) = (e.tried_bytes, unallocated_bytes(e)) else {
        return false;
    };
    let impossible = e.total_bytes.is_some_and(|total| tried > total);
    tried > 0 && !impossible && unallocated >= tried
}

/// What to do about a CUDA OOM, from its figures. Each line cites the numbers
/// it rests on.
pub fn cuda_oom_advice(e: &CudaOom) -> Vec<String> {
    let mut advice = Vec::new();
    let gpu = e
        .device
        .map_or_else(|| "the GPU".to_string(), |d| format!("GPU {d}"));
    let Some(tried) = e.tried_bytes else {
        if OOM_NO_FIGURES.is_match(&e.message)
            && e.message.to_ascii_lowercase().contains("cuda error")
        {
            advice.push(
                "CUDA itself ran out of memory outside PyTorch's caching allocator (creating a \
                 context, cuBLAS/cuDNN workspaces, pinned host memory): check with nvidia-smi \
                 what else holds the GPU and that the job uses the device you expect"
                    .to_string(),
            );
        } else {
            advice.push(
                "the message carries no figures: reduce the batch size, use activation \
                 checkpointing or mixed precision, and check with nvidia-smi for other \
                 processes on the GPU"
                    .to_string(),
            );
        }
        return advice;
    };

    if let Some(total) = e.total_bytes
        && tried > total
    {
        advice.push(format!(
            "the request of {} is larger than {gpu}'s whole capacity of {}: a tensor-shape or \
             batch-size bug rather than memory pressure; restarting with the same input will \
             fail the same way",
            format_size(tried),
            format_size(total)
        ));
        return advice;
    }

    let unallocated = unallocated_bytes(e);
    if is_fragmentation(e) {
        let held = unallocated.map_or_else(String::new, format_size);
        advice.push(format!(
            "fragmentation: PyTorch held {held} reserved but unallocated, at least the {} \
             that failed; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch 2.1 \
             or later; older releases: max_split_size_mb)",
            format_size(tried)
        ));
    } else {
        let mut facts = Vec::new();
        if let Some(allocated) = e.allocated_bytes {
            facts.push(format!("{} allocated by PyTorch", format_size(allocated)));
        }
        if let Some(unallocated) = unallocated {
            facts.push(format!(
                "{} reserved but unallocated",
                format_size(unallocated)
            ));
        }
        if let Some(free) = e.free_bytes {
            let of_total = e
                .total_bytes
                .map_or_else(String::new, |t| format!(" of {}", format_size(t)));
            facts.push(format!("{} free{of_total} on {gpu}", format_size(free)));
        }
        let facts = if facts.is_empty() {
            String::new()
        } else {
            format!(" ({})", facts.join(", "))
        };
        advice.push(format!(
            "the request of {} did not fit{facts}: reduce the batch size, use activation \
             checkpointing, or mixed precision (bf16/fp16)",
            format_size(tried)
        ));
    }

    if let Some(free) = e.free_bytes
        && free >= tried
    {
        advice.push(format!(
            "the driver reported {} free, more than the {} requested: another process \
             probably took memory between the attempt and the report, or a per-process \
             memory fraction capped PyTorch",
            format_size(free),
            format_size(tried)
        ));
    }

    if let Some(line) = foreign_advice(e, &gpu) {
        advice.push(line);
    }
    advice
}

/// Names memory on the device that is not this process's, when the figures
/// show enough of it to matter.
fn foreign_advice(e: &CudaOom, gpu: &str) -> Option<String> {
    let total = e.total_bytes?;
    let free = e.free_bytes?;
    let in_use = total.saturating_sub(free);
    let others: Vec<String> = e
        .processes
        .iter()
        .filter(|p| e.process_bytes.is_none() || Some(p.pid) != e.pid)
        .map(|p| match p.bytes {
            Some(bytes) => format!("pid {} holds {}", p.pid, format_size(bytes)),
            None => format!("pid {}", p.pid),
        })
        .collect();
    let named = if others.is_empty() {
        String::new()
    } else {
        format!(" ({})", others.join(", "))
    };
    if let Some(own) = e.process_bytes {
        let foreign = in_use.saturating_sub(own);
        (foreign >= FOREIGN_MINIMUM).then(|| {
            format!(
                "other processes use about {} of {gpu}{named}, beside this process's {}: \
                 stop them or move the job to a free GPU",
                format_size(foreign),
                format_size(own)
            )
        })
    } else {
        let reserved = e.reserved_bytes.or_else(|| {
            e.allocated_bytes?
                .checked_add(e.reserved_unallocated_bytes?)
        })?;
        let outside = in_use.saturating_sub(reserved);
        (outside >= CONTEXT_ALLOWANCE).then(|| {
            format!(
                "{} of {gpu} was in use outside PyTorch's allocator{named}: another process \
                 on the GPU, or this process's CUDA context and non-PyTorch libraries; check \
                 nvidia-smi",
                format_size(outside)
            )
        })
    }
}

/// What to do about a dead DataLoader worker. `host_memory_critical` says
/// whether oomguard saw host (or cgroup) memory near its ceiling at the time
/// or the kernel's OOM-kill count rise, which is what tells the kernel OOM
/// killer apart from an external kill.
pub fn worker_died_advice(e: &WorkerDied, host_memory_critical: bool) -> Vec<String> {
    let mut advice = Vec::new();
    let who = match (e.pid, e.pids.as_slice()) {
        (Some(pid), _) => format!("DataLoader worker pid {pid}"),
        (None, []) => "a DataLoader worker".to_string(),
        (None, pids) => format!(
            "DataLoader workers (pids {})",
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let signal = e.signal.as_deref();

    if e.shm_hint || signal == Some("SIGBUS") {
        advice.push(format!(
            "{who} hit a bus error in shared memory: /dev/shm is too small for the batches \
             workers hand to the trainer; raise it (docker run --shm-size=8g, or a \
             memory-backed emptyDir at /dev/shm on Kubernetes) or call \
             torch.multiprocessing.set_sharing_strategy('file_system')"
        ));
        if host_memory_critical {
            advice.push(
                "memory was critical at the time: the memory limit, not /dev/shm, may be the \
                 real cause (shared memory counts against the cgroup); check its oom_kill count"
                    .to_string(),
            );
        }
        return advice;
    }

    match signal {
        Some("SIGKILL") if host_memory_critical => advice.push(format!(
            "the kernel OOM killer most likely took {who}: memory was at its ceiling, or the \
             kernel counted an OOM kill; use fewer \
             num_workers, a smaller prefetch_factor, and bounded caches in the Dataset (Python \
             lists and dicts read by workers are copied into each of them)"
        )),
        Some("SIGKILL") => advice.push(format!(
            "{who} was killed by SIGKILL while host memory was not critical: something outside \
             killed it (a scheduler, a memory limit oomguard does not watch, a user); check the \
             kernel log and the cgroup's memory.events"
        )),
        Some("SIGTERM") => advice.push(format!(
            "{who} received SIGTERM from a process other than its parent, which workers treat as \
             fatal: a scheduler or a group-wide signal; signal the trainer only and let it stop \
             its workers"
        )),
        Some(sig @ ("SIGSEGV" | "SIGFPE" | "SIGILL" | "SIGABRT")) => advice.push(format!(
            "{who} crashed with {sig} in native code (a decoder or transform library in the \
             Dataset); rerun with num_workers=0 to get the traceback"
        )),
        Some(sig) => advice.push(format!("{who} was killed by {sig}")),
        None => {
            if let Some(code) = e.exit_code {
                advice.push(format!(
                    "{who} exited with code {code}; rerun with num_workers=0 to see the error"
                ));
            } else if host_memory_critical {
                advice.push(format!(
                    "{who} exited unexpectedly while host memory was critical: most likely the \
                     kernel OOM killer; use fewer num_workers and a smaller prefetch_factor"
                ));
            } else {
                advice.push(format!(
                    "{who} exited unexpectedly; the cause is printed earlier in the output \
                     (a signal or a traceback)"
                ));
            }
        }
    }
    advice
}

/// What to do about a torchrun failure report, from its root cause (or its
/// first failure when none is marked).
pub fn rank_failed_advice(e: &RankFailed, host_memory_critical: bool) -> Vec<String> {
    let Some(failure) = e
        .failures
        .iter()
        .find(|f| f.root_cause)
        .or_else(|| e.failures.first())
    else {
        return vec!["torchrun reported a failed rank; its cause is printed above".to_string()];
    };
    let mut who = match failure.rank {
        Some(rank) => format!("rank {rank}"),
        None => "a rank".to_string(),
    };
    if let Some(pid) = failure.pid {
        who.push_str(&format!(" (pid {pid})"));
    }
    let advice = match (failure.signal.as_deref(), failure.exitcode) {
        (Some("SIGKILL"), _) if host_memory_critical => format!(
            "the kernel OOM killer most likely took {who}: memory was at its ceiling, or the \
             kernel counted an OOM kill; reduce \
             per-rank host memory (num_workers, prefetch_factor, dataset caches) or run fewer \
             ranks per node"
        ),
        (Some("SIGKILL"), _) => format!(
            "{who} was killed by SIGKILL while host memory was not critical: something outside \
             killed it (a scheduler, a memory limit oomguard does not watch); check the kernel \
             log and the cgroup's memory.events"
        ),
        (Some(sig), _) => format!("{who} was killed by {sig}"),
        (None, Some(code)) => format!(
            "{who} exited with code {code}: its own traceback (a CUDA OOM, for instance) is \
             printed above"
        ),
        (None, None) => format!("{who} failed; its cause is printed above"),
    };
    vec![advice]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A shared fixture without its `# source:` provenance lines.
    fn fixture(name: &str) -> String {
        let raw = match name {
            "01" => include_str!(
                "../../tests/fixtures/torch-errors/01-torch0x-thc-cuda-runtime-error.txt"
            ),
            "02" => {
                include_str!("../../tests/fixtures/torch-errors/02-torch1.0-1.3-cached-format.txt")
            }
            "04" => include_str!(
                "../../tests/fixtures/torch-errors/04-torch1.4-1.9-reserved-in-total.txt"
            ),
            "06" => include_str!(
                "../../tests/fixtures/torch-errors/06-torch1.13-2.0-cuda-OutOfMemoryError-max-split.txt"
            ),
            "08" => include_str!(
                "../../tests/fixtures/torch-errors/08-torch2.2-2.4-expandable-segments-this-process.txt"
            ),
            "09" => include_str!(
                "../../tests/fixtures/torch-errors/09-torch2.4plus-torch.OutOfMemoryError.txt"
            ),
            "10" => include_str!(
                "../../tests/fixtures/torch-errors/10-container-own-process-as-Process-N.txt"
            ),
            "13" => include_str!("../../tests/fixtures/torch-errors/13-no-process-info-line.txt"),
            "16" => include_str!(
                "../../tests/fixtures/torch-errors/16-dataloader-killed-by-signal-Killed.txt"
            ),
            "17" => include_str!(
                "../../tests/fixtures/torch-errors/17-dataloader-killed-by-signal-BusError-shm.txt"
            ),
            "19" => include_str!(
                "../../tests/fixtures/torch-errors/19-dataloader-exited-unexpectedly-pids.txt"
            ),
            "23" => {
                include_str!("../../tests/fixtures/torch-errors/23-kernel-memcg-oom-kill-line.txt")
            }
            "25" => include_str!(
                "../../tests/fixtures/torch-errors/25-torchrun-childfailed-sigkill.txt"
            ),
            other => panic!("no fixture {other}"),
        };
        raw.lines()
            .skip_while(|l| l.starts_with("# source:"))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    fn only_oom(name: &str) -> CudaOom {
        let events = scan_text(&fixture(name));
        assert_eq!(events.len(), 1, "{name}: {events:?}");
        match events.into_iter().next() {
            Some(TorchEvent::CudaOom(oom)) => oom,
            other => panic!("{name}: expected a CUDA OOM, got {other:?}"),
        }
    }

    fn only_worker(name: &str) -> WorkerDied {
        let events = scan_text(&fixture(name));
        assert_eq!(events.len(), 1, "{name}: {events:?}");
        match events.into_iter().next() {
            Some(TorchEvent::WorkerDied(died)) => died,
            other => panic!("{name}: expected a worker death, got {other:?}"),
        }
    }

    /// An OOM with no figures, for building expectations.
    fn blank(message: &str) -> CudaOom {
        CudaOom {
            device: None,
            tried_bytes: None,
            total_bytes: None,
            free_bytes: None,
            allocated_bytes: None,
            reserved_unallocated_bytes: None,
            reserved_bytes: None,
            process_bytes: None,
            pid: None,
            processes: Vec::new(),
            message: message.to_string(),
        }
    }

    fn joined(advice: &[String]) -> String {
        advice.join("\n")
    }

    // Sizes: X.XX <unit> × 2^10/2^20/2^30, rounded half up to a byte.

    #[test]
    fn sizes_convert_exactly() {
        assert_eq!(size_to_bytes("0", "bytes"), Some(0));
        assert_eq!(size_to_bytes("512", "bytes"), Some(512));
        assert_eq!(size_to_bytes("1.00", "KiB"), Some(1024));
        assert_eq!(size_to_bytes("12.50", "MiB"), Some(13_107_200)); // 12.5 × 1048576
        assert_eq!(size_to_bytes("8.57", "MiB"), Some(8_986_296)); // 8986296.32
        assert_eq!(size_to_bytes("9.28", "GiB"), Some(9_964_324_127)); // 9964324126.72
        assert_eq!(size_to_bytes("0.005", "KiB"), Some(5)); // 5.12
        assert_eq!(size_to_bytes("16.00", "GiB"), Some(1 << 34));
        // NVML's "not available" marker: 2^34 GiB = 2^64 bytes.
        assert_eq!(size_to_bytes("17179869184.00", "GiB"), None);
        assert_eq!(size_to_bytes("1.5", "furlongs"), None);
        assert_eq!(size_to_bytes("", "MiB"), None);
        assert_eq!(size_to_bytes("9".repeat(40).as_str(), "bytes"), None);
    }

    #[test]
    fn format_size_matches_pytorch() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1023), "1023 bytes");
        assert_eq!(format_size(13_107_200), "12.50 MiB");
        assert_eq!(format_size(24_459_838_751), "22.78 GiB");
    }

    // The fixtures, field by field. Expected bytes are the printed figure times
    // its unit, rounded half up: e.g. 10.92 GiB = 10.92 × 2^30 = 11725260718.08.

    #[test]
    fn fixture_01_thc_runtime_error_has_no_figures() {
        let oom = only_oom("01");
        assert_eq!(
            oom,
            blank(
                "RuntimeError: cuda runtime error (2) : out of memory at \
                 /tmp/pip-ikrnhryb-build/torch/lib/THC/generic/THCStorage.cu:66"
            )
        );
        assert!(!is_fragmentation(&oom));
        assert!(joined(&cuda_oom_advice(&oom)).contains("no figures"));
    }

    #[test]
    fn a_bus_error_cascade_is_one_worker_death() {
        let text = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).
Traceback (most recent call last):
  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 1133, in _try_get_data
    data = self._data_queue.get(timeout=timeout)
RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.

The above exception was the direct cause of the following exception:

RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly
";
        let events = scan_text(text);
        assert_eq!(events.len(), 1, "{events:?}");
        let TorchEvent::WorkerDied(w) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(w.pid, Some(4242));
        assert_eq!(w.pids, vec![4242]);
        assert_eq!(w.signal.as_deref(), Some("SIGBUS"));
        assert!(w.shm_hint);
        assert_eq!(w.message.lines().count(), 2);
    }

    #[test]
    fn two_deaths_are_two_events() {
        let text = "DataLoader worker (pid 1) is killed by signal: Killed.
DataLoader worker (pid 2) is killed by signal: Killed.
DataLoader worker (pid(s) 2) exited unexpectedly
";
        let pids: Vec<_> = scan_text(text)
            .into_iter()
            .filter_map(|e| match e {
                TorchEvent::WorkerDied(w) => w.pid,
                _ => None,
            })
            .collect();
        assert_eq!(pids, vec![1, 2]);
    }

    #[test]
    fn torchrun_agent_and_report_make_one_failed_rank() {
        let text = "[2025-05-21 15:43:02,123] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 14749 closing signal SIGTERM
[2025-05-21 15:43:02,124] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 14751 closing signal SIGTERM
[2025-05-21 15:43:03,001] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 1 (pid: 14750) of binary: /usr/bin/python3
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2025-05-21_15:43:03
  host      : node7
  rank      : 4 (local_rank: 0)
  exitcode  : -15 (pid: 14749)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 14749
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-05-21_15:43:03
  host      : node7
  rank      : 5 (local_rank: 1)
  exitcode  : -9 (pid: 14750)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 14750
============================================================
";
        let events = scan_text(text);
        assert_eq!(events.len(), 1, "{events:?}");
        let TorchEvent::RankFailed(r) = &events[0] else {
            panic!("{events:?}");
        };
        // The sibling torn down with SIGTERM is not a failure.
        assert_eq!(r.failures.len(), 1, "{r:?}");
        let f = &r.failures[0];
        assert_eq!(
            (f.rank, f.local_rank, f.pid),
            (Some(5), Some(1), Some(14750))
        );
        assert_eq!(f.exitcode, Some(-9));
        assert_eq!(f.signal.as_deref(), Some("SIGKILL"));
        assert_eq!(r.script.as_deref(), Some("train.py"));
    }

    #[test]
    fn a_torchrun_agent_line_alone_is_a_failed_rank() {
        let text = "torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 1 (pid: 77) of binary: /usr/bin/python3\n";
        let events = scan_text(text);
        let [TorchEvent::RankFailed(r)] = events.as_slice() else {
            panic!("{events:?}");
        };
        assert_eq!(r.failures[0].pid, Some(77));
        assert_eq!(r.failures[0].local_rank, Some(1));
        assert_eq!(r.failures[0].signal.as_deref(), Some("SIGKILL"));
    }

    /// A worker's bus-error death as the job prints it: the worker's own
    /// line, a traceback, the trainer's line and the `exited` line.
    const BUS_ERROR_CASCADE: &str = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n\
Traceback (most recent call last):\n  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 1133, in _try_get_data\n    data = self._data_queue.get(timeout=timeout)\n\
RuntimeError: DataLoader worker (pid 3855) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n\
RuntimeError: DataLoader worker (pid(s) 3855) exited unexpectedly\n";

    /// The three message kinds: the 1.x `cached` CUDA OOM, a worker death
    /// cascade, torchrun's failure report.
    fn kind_text(kind: usize) -> String {
        match kind {
            0 => fixture("02"),
            1 => BUS_ERROR_CASCADE.to_string(),
            _ => fixture("25"),
        }
    }

    fn exercise(events: Vec<TorchEvent>) -> usize {
        for event in &events {
            match event {
                TorchEvent::CudaOom(o) => {
                    let _ = cuda_oom_advice(o);
                }
                TorchEvent::WorkerDied(w) => {
                    let _ = worker_died_advice(w, true);
                }
                TorchEvent::RankFailed(r) => {
                    let _ = rank_failed_advice(r, true);
                }
                TorchEvent::Progress(_) | TorchEvent::Framework(_) => {}
            }
        }
        events.len()
    }

    #[test]
    fn the_three_kinds_whole_are_one_event_each() {
        let events = scan_text(&kind_text(0));
        assert!(
            matches!(events.as_slice(), [TorchEvent::CudaOom(o)] if o.reserved_bytes.is_some()),
            "{events:?}"
        );
        let events = scan_text(&kind_text(1));
        assert!(
            matches!(events.as_slice(), [TorchEvent::WorkerDied(w)] if w.pid == Some(3855) && w.shm_hint),
            "{events:?}"
        );
        let events = scan_text(&kind_text(2));
        assert!(
            matches!(events.as_slice(), [TorchEvent::RankFailed(_)]),
            "{events:?}"
        );
    }

    proptest! {
        /// Each kind cut at any character, with any character replaced, or
        /// with its lines shuffled in pieces, never panics (and its advice
        /// is computed for whatever was found).
        #[test]
        fn the_three_kinds_cut_or_corrupted_never_panic(
            kind in 0usize..3,
            cut in any::<proptest::sample::Index>(),
            at in any::<proptest::sample::Index>(),
            ch in any::<char>(),
            dropped in any::<proptest::sample::Index>(),
        ) {
            let text = kind_text(kind);
            let chars: Vec<char> = text.chars().collect();
            let cut_text: String = chars[..cut.index(chars.len() + 1)].iter().collect();
            exercise(scan_text(&cut_text));
            let mut corrupted = chars.clone();
            let i = at.index(corrupted.len());
            corrupted[i] = ch;
            exercise(scan_text(&corrupted.into_iter().collect::<String>()));
            let lines: Vec<&str> = text.lines().collect();
            let skip = dropped.index(lines.len());
            let without: Vec<&str> = lines
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != skip)
                .map(|(_, l)| *l)
                .collect();
            prop_assert!(exercise(scan_text(&without.join("\n"))) <= lines.len());
        }
    }

    proptest! {
        #[test]
        fn random_cascades_never_panic(lines in proptest::collection::vec(
            prop_oneof![
                Just("ERROR: Unexpected bus error encountered in worker.".to_string()),
                (0u32..5).prop_map(|p| format!("DataLoader worker (pid {p}) is killed by signal: Killed.")),
                (0u32..5).prop_map(|p| format!("DataLoader worker (pid(s) {p}, 9) exited unexpectedly")),
                (0u32..5).prop_map(|p| format!("Sending process {p} closing signal SIGTERM")),
                (0u32..5).prop_map(|p| format!("failed (exitcode: -9) local_rank: 1 (pid: {p}) of binary: x")),
                Just("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:".to_string()),
                Just("=".repeat(20)),
                "\\PC{0,40}",
            ], 0..40),
            cut in 0usize..40,
        ) {
            let mut text = lines.join("\n");
            let mut end = text.len().saturating_sub(cut);
            while !text.is_char_boundary(end) { end -= 1; }
            text.truncate(end);
            let _ = scan_text(&text);
        }
    }

    #[test]
    fn fixture_02_cached_is_reserved_but_unallocated() {
        let oom = only_oom("02");
        assert_eq!(oom.device, Some(0));
        assert_eq!(oom.tried_bytes, Some(13_107_200)); // 12.50 MiB
        assert_eq!(oom.total_bytes, Some(11_725_260_718)); // 10.92 GiB
        assert_eq!(oom.allocated_bytes, Some(8_986_296)); // 8.57 MiB
        assert_eq!(oom.free_bytes, Some(9_964_324_127)); // 9.28 GiB
        // "cached" (PR #13751): held by the allocator, not used by the program.
        assert_eq!(oom.reserved_unallocated_bytes, Some(4_907_336)); // 4.68 MiB
        // The reserve: allocated + cached, as 1.4+ prints it.
        assert_eq!(oom.reserved_bytes, Some(8_986_296 + 4_907_336));
        assert_eq!(oom.process_bytes, None);
        assert_eq!(oom.pid, None);
        assert!(
            oom.message
                .starts_with("RuntimeError: CUDA out of memory. Tried")
        );
        assert!(oom.message.ends_with("4.68 MiB cached)"));

        // 4.68 MiB held < 12.50 MiB asked: not fragmentation. 9.28 GiB free
        // exceeds the request, which the advice must point out; 10.92 − 9.28
        // − (8.57 + 4.68 MiB) ≈ 1.63 GiB is outside the allocator.
        assert!(!is_fragmentation(&oom));
        let advice = joined(&cuda_oom_advice(&oom));
        assert!(
            advice.contains("the request of 12.50 MiB did not fit"),
            "{advice}"
        );
        assert!(
            advice.contains("9.28 GiB free, more than the 12.50 MiB requested"),
            "{advice}"
        );
        assert!(
            advice.contains("1.63 GiB of GPU 0 was in use outside"),
            "{advice}"
        );
        assert!(!advice.contains("expandable_segments"), "{advice}");
    }

    #[test]
    fn fixture_04_reserved_in_total() {
        let oom = only_oom("04");
        assert_eq!(oom.device, Some(0));
        assert_eq!(oom.tried_bytes, Some(2_097_152)); // 2.00 MiB
        assert_eq!(oom.total_bytes, Some(4_069_481_513)); // 3.79 GiB
        assert_eq!(oom.allocated_bytes, Some(686_785_823)); // 654.97 MiB
        assert_eq!(oom.free_bytes, Some(6_291_456)); // 6.00 MiB
        assert_eq!(oom.reserved_bytes, Some(698_351_616)); // 666.00 MiB
        assert_eq!(oom.reserved_unallocated_bytes, None);
        assert_eq!(oom.process_bytes, None);

        // 666.00 − 654.97 = 11.03 MiB reserved but unallocated ≥ 2.00 MiB.
        assert_eq!(unallocated_bytes(&oom), Some(698_351_616 - 686_785_823));
        assert!(is_fragmentation(&oom));
        let advice = joined(&cuda_oom_advice(&oom));
        assert!(advice.contains("expandable_segments:True"), "{advice}");
        assert!(
            advice.contains("11.03 MiB reserved but unallocated"),
            "{advice}"
        );
        // 3.79 GiB − 6 MiB free − 666 MiB reserved ≈ 3.13 GiB outside PyTorch.
        assert!(
            advice.contains("3.13 GiB of GPU 0 was in use outside"),
            "{advice}"
        );
    }

    #[test]
    fn fixture_06_torch_cuda_out_of_memory_error() {
        let oom = only_oom("06");
        assert_eq!(oom.device, Some(0));
        assert_eq!(oom.tried_bytes, Some(1_814_623_683)); // 1.69 GiB
        assert_eq!(oom.total_bytes, Some(15_633_680_957)); // 14.56 GiB
        assert_eq!(oom.allocated_bytes, Some(681_542_943)); // 649.97 MiB
        assert_eq!(oom.free_bytes, Some(1_406_601_789)); // 1.31 GiB
        assert_eq!(oom.reserved_bytes, Some(1_084_479_242)); // 1.01 GiB
        assert_eq!(oom.reserved_unallocated_bytes, None);
        assert!(oom.message.ends_with("PYTORCH_CUDA_ALLOC_CONF"));

        // 1.01 GiB − 649.97 MiB ≈ 384 MiB < 1.69 GiB: a genuine shortage; and
        // 14.56 − 1.31 − 1.01 = 12.24 GiB is used by something else.
        assert!(!is_fragmentation(&oom));
        let advice = joined(&cuda_oom_advice(&oom));
        assert!(
            advice.contains("the request of 1.69 GiB did not fit"),
            "{advice}"
        );
        assert!(advice.contains("reduce the batch size"), "{advice}");
        assert!(
            advice.contains("12.24 GiB of GPU 0 was in use outside"),
            "{advice}"
        );
    }

    #[test]
    fn fixture_08_this_process_and_expandable_segments() {
        let oom = only_oom("08");
        assert_eq!(oom.device, Some(0));
        assert_eq!(oom.tried_bytes, Some(23_068_672)); // 22.00 MiB
        assert_eq!(oom.total_bytes, Some(25_393_994_138)); // 23.65 GiB
        assert_eq!(oom.free_bytes, Some(11_597_251)); // 11.06 MiB
        assert_eq!(oom.process_bytes, Some(25_340_307_046)); // 23.60 GiB
        assert_eq!(oom.allocated_bytes, Some(24_588_687_770)); // 22.90 GiB
        assert_eq!(oom.reserved_unallocated_bytes, Some(204_336_005)); // 194.87 MiB
        assert_eq!(oom.reserved_bytes, None);
        assert_eq!(oom.pid, None);
        assert!(oom.processes.is_empty());

        // 194.87 MiB held ≥ 22.00 MiB asked.
        assert!(is_fragmentation(&oom));
        let advice = cuda_oom_advice(&oom);
        assert_eq!(advice.len(), 1, "{advice:?}");
        assert!(advice[0].contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
        assert!(advice[0].contains("194.87 MiB reserved but unallocated"));
        assert!(advice[0].contains("22.00 MiB that failed"));
    }

    #[test]
    fn fixture_09_torch_out_of_memory_error_genuine_shortage() {
        let oom = only_oom("09");
        assert_eq!(oom.device, Some(0));
        assert_eq!(oom.tried_bytes, Some(24_459_838_751)); // 22.78 GiB
        assert_eq!(oom.total_bytes, Some(33_790_655_201)); // 31.47 GiB
        assert_eq!(oom.free_bytes, Some(13_668_733_420)); // 12.73 GiB
        assert_eq!(oom.process_bytes, Some(20_111_184_364)); // 18.73 GiB
        assert_eq!(oom.allocated_bytes, Some(9_749_575_762)); // 9.08 GiB
        assert_eq!(oom.reserved_unallocated_bytes, Some(10_039_486_054)); // 9.35 GiB
        assert_eq!(oom.pid, None);

        // 9.35 GiB held < 22.78 GiB asked; 31.47 − 12.73 − 18.73 ≈ 0.01 GiB
        // for others, not worth naming.
        assert!(!is_fragmentation(&oom));
        let advice = cuda_oom_advice(&oom);
        assert_eq!(advice.len(), 1, "{advice:?}");
        assert!(advice[0].contains("the request of 22.78 GiB did not fit"));
        assert!(advice[0].contains("9.08 GiB allocated by PyTorch"));
        assert!(advice[0].contains("12.73 GiB free of 31.47 GiB on GPU 0"));
        assert!(advice[0].contains("activation checkpointing"));
    }

    #[test]
    fn fixture_10_container_process_line_names_the_pid() {
        let oom = only_oom("10");
        assert_eq!(oom.device, Some(0));
        assert_eq!(oom.tried_bytes, Some(17_179_869_184)); // 16.00 GiB
        assert_eq!(oom.total_bytes, Some(47_813_723_423)); // 44.53 GiB
        assert_eq!(oom.free_bytes, Some(197_069_373)); // 187.94 MiB
        assert_eq!(oom.process_bytes, Some(47_609_712_476)); // 44.34 GiB
        assert_eq!(oom.pid, Some(3_910_771));
        assert_eq!(
            oom.processes,
            vec![GpuProcessMemory {
                pid: 3_910_771,
                bytes: Some(47_609_712_476)
            }]
        );
        assert_eq!(oom.allocated_bytes, Some(46_890_305_454)); // 43.67 GiB
        assert_eq!(oom.reserved_unallocated_bytes, Some(351_346_360)); // 335.07 MiB

        assert!(!is_fragmentation(&oom));
        let advice = cuda_oom_advice(&oom);
        assert_eq!(advice.len(), 1, "{advice:?}");
        assert!(advice[0].contains("the request of 16.00 GiB did not fit"));
    }

    #[test]
    fn fixture_13_no_process_line() {
        let oom = only_oom("13");
        assert_eq!(oom.device, Some(0));
        assert_eq!(oom.tried_bytes, Some(20_971_520)); // 20.00 MiB
        assert_eq!(oom.total_bytes, Some(4_294_967_296)); // 4.00 GiB
        assert_eq!(oom.free_bytes, Some(2_523_293_286)); // 2.35 GiB
        assert_eq!(oom.allocated_bytes, Some(865_232_486)); // 825.15 MiB
        assert_eq!(oom.reserved_unallocated_bytes, Some(26_057_114)); // 24.85 MiB
        assert_eq!(oom.process_bytes, None);
        assert_eq!(oom.pid, None);

        // 24.85 MiB held ≥ 20.00 MiB asked; 2.35 GiB free ≥ 20 MiB too.
        assert!(is_fragmentation(&oom));
        let advice = joined(&cuda_oom_advice(&oom));
        assert!(advice.contains("expandable_segments:True"), "{advice}");
        assert!(
            advice.contains("2.35 GiB free, more than the 20.00 MiB"),
            "{advice}"
        );
        // 4.00 − 2.35 GiB − 850 MiB ≈ 0.8 GiB: within a CUDA context's size.
        assert!(!advice.contains("outside"), "{advice}");
    }

    #[test]
    fn fixture_16_worker_killed() {
        let died = only_worker("16");
        assert_eq!(
            died,
            WorkerDied {
                pid: Some(19597),
                pids: vec![19597],
                signal: Some("SIGKILL".to_string()),
                exit_code: None,
                shm_hint: false,
                message: "RuntimeError: DataLoader worker (pid 19597) is killed by signal: Killed."
                    .to_string(),
            }
        );
        let critical = joined(&worker_died_advice(&died, true));
        assert!(critical.contains("kernel OOM killer"), "{critical}");
        assert!(critical.contains("pid 19597"), "{critical}");
        assert!(critical.contains("num_workers"), "{critical}");
        let calm = joined(&worker_died_advice(&died, false));
        assert!(calm.contains("something outside"), "{calm}");
        assert!(!calm.contains("OOM killer"), "{calm}");
    }

    #[test]
    fn fixture_17_worker_bus_error_shm() {
        let died = only_worker("17");
        assert_eq!(died.pid, Some(3855));
        assert_eq!(died.pids, vec![3855]);
        assert_eq!(died.signal.as_deref(), Some("SIGBUS"));
        assert_eq!(died.exit_code, None);
        assert!(died.shm_hint);
        assert!(died.message.ends_with("raise your shared memory limit."));
        let advice = joined(&worker_died_advice(&died, false));
        assert!(advice.contains("/dev/shm is too small"), "{advice}");
        assert!(advice.contains("--shm-size"), "{advice}");
        assert!(advice.contains("file_system"), "{advice}");
        let critical = joined(&worker_died_advice(&died, true));
        assert!(
            critical.contains("memory limit, not /dev/shm"),
            "{critical}"
        );
    }

    #[test]
    fn fixture_19_worker_pids_exited_unexpectedly() {
        let died = only_worker("19");
        assert_eq!(
            died,
            WorkerDied {
                pid: None,
                pids: vec![18056, 20540, 4512],
                signal: None,
                exit_code: None,
                shm_hint: false,
                message: "DataLoader worker (pid(s) 18056, 20540, 4512) exited unexpectedly"
                    .to_string(),
            }
        );
        let advice = joined(&worker_died_advice(&died, true));
        assert!(advice.contains("pids 18056, 20540, 4512"), "{advice}");
        assert!(advice.contains("OOM killer"), "{advice}");
    }

    #[test]
    fn fixture_23_kernel_line_is_not_a_torch_message() {
        assert_eq!(scan_text(&fixture("23")), Vec::new());
    }

    #[test]
    fn fixture_25_torchrun_child_failed() {
        let events = scan_text(&fixture("25"));
        assert_eq!(events.len(), 1, "{events:?}");
        let Some(TorchEvent::RankFailed(report)) = events.into_iter().next() else {
            panic!("expected a torchrun report");
        };
        assert_eq!(report.script.as_deref(), Some("src/open_r1/grpo_gsm.py"));
        assert_eq!(
            report.failures,
            vec![RankFailure {
                root_cause: true,
                rank: Some(0),
                local_rank: Some(0),
                host: Some(
                    "mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker".to_string()
                ),
                pid: Some(14750),
                exitcode: Some(-9),
                signal: Some("SIGKILL".to_string()),
            }]
        );
        assert!(report.message.starts_with("torch.distributed.elastic"));
        assert!(report.message.ends_with("Signal 9 (SIGKILL) received by PID 14750\n============================================================"));
        let critical = joined(&rank_failed_advice(&report, true));
        assert!(
            critical.contains("OOM killer most likely took rank 0 (pid 14750)"),
            "{critical}"
        );
        let calm = joined(&rank_failed_advice(&report, false));
        assert!(calm.contains("something outside"), "{calm}");
    }

    #[test]
    fn every_fixture_is_recognised_line_by_line_too() {
        // Feeding line by line (as the supervisor does) gives the same events
        // as scan_text, in the same order, once finish() is called.
        for name in [
            "01", "02", "04", "06", "08", "09", "10", "13", "16", "17", "19", "23", "25",
        ] {
            let text = fixture(name);
            let mut scanner = TorchScanner::new();
            let mut events = Vec::new();
            for line in text.split_inclusive('\n') {
                events.extend(scanner.feed(line));
                while let Some(e) = scanner.poll() {
                    events.push(e);
                }
            }
            events.extend(scanner.finish());
            assert_eq!(events, scan_text(&text), "{name}");
        }
    }

    // Variants the fixtures do not show.

    #[test]
    fn one_line_messages_are_returned_at_once() {
        let mut scanner = TorchScanner::new();
        let line = fixture("08");
        assert!(matches!(scanner.feed(&line), Some(TorchEvent::CudaOom(_))));
        let line = fixture("04");
        assert!(matches!(scanner.feed(&line), Some(TorchEvent::CudaOom(_))));
        let line = fixture("16");
        let events: Vec<_> = line.lines().filter_map(|l| scanner.feed(l)).collect();
        assert_eq!(events.len(), 1);
        assert!(scanner.finish().is_empty());
    }

    #[test]
    fn a_split_old_message_is_joined() {
        let mut scanner = TorchScanner::new();
        assert_eq!(
            scanner.feed("RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 1; 7.93 GiB total capacity; 130.35 MiB already"),
            None
        );
        let Some(TorchEvent::CudaOom(oom)) = scanner.feed(
            "allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch) If reserved memory is >> allocated memory try",
        ) else {
            panic!("the closing parenthesis completes the message");
        };
        assert_eq!(oom.device, Some(1));
        assert_eq!(oom.tried_bytes, Some(36 << 20));
        assert_eq!(oom.allocated_bytes, size_to_bytes("130.35", "MiB"));
        assert_eq!(oom.free_bytes, size_to_bytes("47.06", "MiB"));
        assert_eq!(oom.reserved_bytes, Some(188 << 20));
        assert!(oom.message.contains('\n'));
        // The trailer line that follows is not a new event.
        assert_eq!(
            scanner.feed("setting max_split_size_mb to avoid fragmentation."),
            None
        );
        assert!(scanner.finish().is_empty());
    }

    #[test]
    fn a_split_new_message_is_joined() {
        let text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n\
                    GPU 3 has a total capacity of 79.15 GiB of which 1.50 GiB is free.\n\
                    Process 77 has 60.00 GiB memory in use. Including non-PyTorch memory, this process has 17.60 GiB memory in use.\n\
                    Of the allocated memory 12.00 GiB is allocated by PyTorch, and 5.00 GiB is reserved by PyTorch but unallocated.\n\
                    next line of the log\n";
        let events = scan_text(text);
        assert_eq!(events.len(), 1, "{events:?}");
        let TorchEvent::CudaOom(oom) = &events[0] else {
            panic!("expected an OOM");
        };
        assert_eq!(oom.device, Some(3));
        assert_eq!(oom.tried_bytes, Some(2 << 30));
        assert_eq!(oom.free_bytes, Some(3 << 29));
        assert_eq!(oom.process_bytes, size_to_bytes("17.60", "GiB"));
        assert_eq!(
            oom.pid, None,
            "the lone Process line is another process here"
        );
        assert_eq!(
            oom.processes,
            vec![GpuProcessMemory {
                pid: 77,
                bytes: Some(60 << 30)
            }]
        );
        assert_eq!(oom.reserved_unallocated_bytes, Some(5 << 30));
        assert!(is_fragmentation(oom));
        let advice = joined(&cuda_oom_advice(oom));
        assert!(advice.contains("expandable_segments:True"), "{advice}");
        // 79.15 − 1.50 − 17.60 = 60.05 GiB used by others, pid 77 named.
        assert!(
            advice
                .contains("other processes use about 60.05 GiB of GPU 3 (pid 77 holds 60.00 GiB)"),
            "{advice}"
        );
    }

    #[test]
    fn an_unfinished_message_is_released_by_an_unrelated_line_or_finish() {
        let mut scanner = TorchScanner::new();
        assert_eq!(scanner.feed("RuntimeError: CUDA out of memory."), None);
        let Some(TorchEvent::CudaOom(oom)) = scanner.feed("  File \"train.py\", line 3") else {
            panic!("an unrelated line releases the held message");
        };
        assert_eq!(oom.message, "RuntimeError: CUDA out of memory.");

        assert_eq!(scanner.feed("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 4.00 GiB total capacity;"), None);
        let events = scanner.finish();
        assert_eq!(events.len(), 1);
        let TorchEvent::CudaOom(oom) = &events[0] else {
            panic!("expected an OOM");
        };
        assert_eq!(oom.tried_bytes, Some(20 << 20));
        assert_eq!(oom.total_bytes, Some(4 << 30));
        assert_eq!(oom.free_bytes, None);
    }

    #[test]
    fn two_messages_completed_by_one_line_are_both_returned() {
        let mut scanner = TorchScanner::new();
        assert_eq!(scanner.feed("RuntimeError: CUDA out of memory."), None);
        // A new anchor line is never a continuation: it releases the held
        // message and is its own message.
        let first = scanner.feed(&fixture("08"));
        assert!(matches!(&first, Some(TorchEvent::CudaOom(o)) if o.tried_bytes.is_none()));
        let second = scanner.poll();
        assert!(matches!(&second, Some(TorchEvent::CudaOom(o)) if o.tried_bytes == Some(22 << 20)));
        assert_eq!(scanner.poll(), None);
    }

    #[test]
    fn prefixes_colours_and_carriage_returns_are_tolerated() {
        let line = "\x1b[31mERROR 05-01 12:00:00 [engine.py:160]\x1b[0m torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 15.77 GiB of which 12.00 MiB is free. Of the allocated memory 14.00 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.\r\n";
        let events = scan_text(line);
        assert_eq!(events.len(), 1);
        let TorchEvent::CudaOom(oom) = &events[0] else {
            panic!("expected an OOM");
        };
        assert_eq!(oom.tried_bytes, Some(1 << 30));
        assert!(oom.message.starts_with("ERROR 05-01"));
        assert!(!oom.message.contains('\x1b'));

        let progress = " 45%|████▌     | 45/100 [00:10<00:12]\rRuntimeError: DataLoader worker (pid 42) is killed by signal: Killed.";
        let events = scan_text(progress);
        assert_eq!(events.len(), 1);
        let TorchEvent::WorkerDied(died) = &events[0] else {
            panic!("expected a worker death");
        };
        assert_eq!(died.pid, Some(42));
        assert!(died.message.starts_with("RuntimeError"));
    }

    #[test]
    fn the_2_1_typo_private_pools_and_unavailable_values() {
        let text = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacty of 8.00 GiB of which 0 bytes is free. Process 11 has 17179869184.00 GiB memory in use. Of the allocated memory 6.50 GiB is allocated by PyTorch, with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), and 90.00 MiB is reserved by PyTorch but unallocated.";
        let oom = parse_cuda_oom(text).expect("an OOM");
        assert_eq!(oom.total_bytes, Some(8 << 30));
        assert_eq!(oom.free_bytes, Some(0));
        assert_eq!(oom.allocated_bytes, Some(13 << 29));
        assert_eq!(oom.reserved_unallocated_bytes, Some(90 << 20));
        assert_eq!(oom.pid, Some(11));
        assert_eq!(oom.process_bytes, None, "NVML said not available");
        assert!(is_fragmentation(&oom));
    }

    #[test]
    fn the_allowed_variant_and_a_shape_bug() {
        let text = "RuntimeError: CUDA out of memory. Tried to allocate 130674.91 GiB (GPU 0; 23.70 GiB total capacity; 2.00 GiB already allocated; 20.00 GiB free; 12.00 GiB allowed; 2.10 GiB reserved in total by PyTorch)";
        let oom = parse_cuda_oom(text).expect("an OOM");
        assert_eq!(oom.tried_bytes, size_to_bytes("130674.91", "GiB"));
        assert_eq!(oom.free_bytes, Some(20 << 30));
        assert_eq!(oom.reserved_bytes, size_to_bytes("2.10", "GiB"));
        assert!(!is_fragmentation(&oom));
        let advice = cuda_oom_advice(&oom);
        assert_eq!(advice.len(), 1);
        assert!(
            advice[0].contains("larger than GPU 0's whole capacity"),
            "{advice:?}"
        );
    }

    #[test]
    fn non_allocator_cuda_error() {
        let text = "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n";
        let events = scan_text(text);
        assert_eq!(
            events,
            vec![TorchEvent::CudaOom(blank(
                "RuntimeError: CUDA error: out of memory"
            ))]
        );
        let TorchEvent::CudaOom(oom) = &events[0] else {
            unreachable!()
        };
        assert!(joined(&cuda_oom_advice(oom)).contains("outside PyTorch's caching allocator"));
    }

    #[test]
    fn lookalikes_are_not_cuda_ooms() {
        for line in [
            "Memory cgroup out of memory: Killed process 629 (python)",
            "Out of memory: Killed process 1234 (python3) total-vm:1kB",
            "It is possible that dataloader's workers are out of shared memory.",
            "    raise ChildFailedError(",
            "java.lang.OutOfMemoryError: Java heap space",
            "except torch.cuda.OutOfMemoryError as e",
        ] {
            assert_eq!(scan_text(line), Vec::new(), "{line}");
        }
    }

    #[test]
    fn worker_variants() {
        let died = parse_worker_died(
            "RuntimeError: DataLoader worker (pid 7) exited unexpectedly with exit code 1. Details are lost due to multiprocessing. Rerunning with num_workers=0 may give better error trace.",
        )
        .expect("a worker death");
        assert_eq!(
            (died.pid, died.exit_code, died.signal.clone()),
            (Some(7), Some(1), None)
        );
        assert!(joined(&worker_died_advice(&died, false)).contains("exited with code 1"));

        let died = parse_worker_died(
            "RuntimeError: DataLoader worker (pid 8) is killed by signal: Terminated. ",
        )
        .expect("a worker death");
        assert_eq!(died.signal.as_deref(), Some("SIGTERM"));
        assert!(joined(&worker_died_advice(&died, true)).contains("other than its parent"));

        let died = parse_worker_died(
            "RuntimeError: DataLoader worker (pid 9) is killed by signal: Segmentation fault. ",
        )
        .expect("a worker death");
        assert_eq!(died.signal.as_deref(), Some("SIGSEGV"));
        assert!(!died.shm_hint);

        let died = parse_worker_died(
            "RuntimeError: DataLoader worker (pid 10) is killed by signal: Killed: 9.",
        )
        .expect("a worker death");
        assert_eq!(died.signal.as_deref(), Some("SIGKILL"));

        let died = parse_worker_died(
            "RuntimeError: DataLoader worker (pid 11) is killed by signal: Unknown signal 99.",
        )
        .expect("a worker death");
        assert_eq!(died.signal.as_deref(), Some("Unknown signal 99"));

        let died = parse_worker_died("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).")
            .expect("a worker death");
        assert_eq!(
            (died.pid, died.signal.as_deref(), died.shm_hint),
            (None, Some("SIGBUS"), true)
        );

        let died = parse_worker_died("ERROR: Unexpected segmentation fault encountered in worker.")
            .expect("a worker death");
        assert_eq!(died.signal.as_deref(), Some("SIGSEGV"));

        let died =
            parse_worker_died("RuntimeError: DataLoader worker (pid(s) 5) exited unexpectedly")
                .expect("a worker death");
        assert_eq!((died.pid, died.pids), (Some(5), vec![5]));
    }

    #[test]
    fn torchrun_report_of_the_1_9_era() {
        let text = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
***************************************\n\
            train.py FAILED            \n\
=======================================\n\
Root Cause:\n\
[0]:\n\
  time: 2021-09-01_10:00:00\n\
  rank: 1 (local_rank: 1)\n\
  exitcode: 1 (pid: 321)\n\
  error_file: <N/A>\n\
  msg: \"Process failed with exitcode 1\"\n\
=======================================\n\
Other Failures:\n\
[1]:\n\
  time: 2021-09-01_10:00:01\n\
  rank: 0 (local_rank: 0)\n\
  exitcode: -15 (pid: 320)\n\
  error_file: <N/A>\n\
  msg: \"Signal 15 (SIGTERM) received by PID 320\"\n\
***************************************\n\
after the report\n";
        let events = scan_text(text);
        assert_eq!(events.len(), 1, "{events:?}");
        let TorchEvent::RankFailed(report) = &events[0] else {
            panic!("expected a torchrun report");
        };
        assert_eq!(report.script.as_deref(), Some("train.py"));
        assert_eq!(report.failures.len(), 2);
        let root = &report.failures[0];
        assert!(root.root_cause);
        assert_eq!(
            (root.rank, root.pid, root.exitcode, root.signal.as_deref()),
            (Some(1), Some(321), Some(1), None)
        );
        let other = &report.failures[1];
        assert!(!other.root_cause);
        assert_eq!(
            (
                other.rank,
                other.pid,
                other.exitcode,
                other.signal.as_deref()
            ),
            (Some(0), Some(320), Some(-15), Some("SIGTERM"))
        );
        assert!(!report.message.contains("after the report"));
        assert!(
            joined(&rank_failed_advice(report, false))
                .contains("rank 1 (pid 321) exited with code 1")
        );
    }

    #[test]
    fn a_child_failed_line_without_a_report_is_closed_quickly() {
        let text = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: see above\na\nb\nc\nRuntimeError: DataLoader worker (pid 3) is killed by signal: Killed.\n";
        let events = scan_text(text);
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(matches!(&events[0], TorchEvent::RankFailed(r) if r.failures.is_empty()));
        assert!(matches!(&events[1], TorchEvent::WorkerDied(w) if w.pid == Some(3)));
        assert!(
            joined(&rank_failed_advice(
                match &events[0] {
                    TorchEvent::RankFailed(r) => r,
                    _ => unreachable!(),
                },
                true
            ))
            .contains("printed above")
        );
    }

    #[test]
    fn an_oom_inside_a_report_traceback_is_still_seen() {
        let text = format!(
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
             ============================================================\n\
             train.py FAILED\n\
             Root Cause (first observed failure):\n\
             [0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 5)\n\
             \x20 traceback : Traceback (most recent call last):\n{}\
             ============================================================\n",
            fixture("09")
        );
        let events = scan_text(&text);
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(matches!(&events[0], TorchEvent::CudaOom(_)));
        assert!(
            matches!(&events[1], TorchEvent::RankFailed(r) if r.failures[0].exitcode == Some(1))
        );
    }

    #[test]
    fn long_lines_and_long_reports_are_bounded() {
        let mut long = fixture("08");
        long.push_str(&"é".repeat(MAX_LINE_BYTES));
        let events = scan_text(&long);
        assert_eq!(events.len(), 1);
        let TorchEvent::CudaOom(oom) = &events[0] else {
            panic!("expected an OOM");
        };
        assert!(oom.message.len() <= MAX_LINE_BYTES);

        let mut scanner = TorchScanner::new();
        scanner.feed("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ");
        scanner.feed("==========");
        let filler = "x".repeat(1000);
        let mut released = Vec::new();
        for _ in 0..MAX_REPORT_LINES + 10 {
            released.extend(scanner.feed(&filler));
        }
        assert_eq!(released.len(), 1, "the report is closed by force");
        let TorchEvent::RankFailed(report) = &released[0] else {
            panic!("expected a report");
        };
        assert!(report.message.len() <= MAX_MESSAGE_BYTES);
        assert!(scanner.finish().is_empty());
    }

    #[test]
    fn events_serialise_with_a_kind_tag() {
        let event = TorchEvent::CudaOom(only_oom("10"));
        let json = serde_json::to_value(&event).expect("serialises");
        assert_eq!(json["kind"], "cuda_oom");
        assert_eq!(json["tried_bytes"], 17_179_869_184u64);
        assert_eq!(json["pid"], 3_910_771);
        let back: TorchEvent = serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, event);
        let json = serde_json::to_value(only_oom("08")).expect("serialises");
        assert!(json.get("processes").is_none(), "empty lists are left out");
        assert!(json["pid"].is_null());
    }

    fn all_fixture_text() -> String {
        [
            "01", "02", "04", "06", "08", "09", "10", "13", "16", "17", "19", "23", "25",
        ]
        .iter()
        .map(|n| fixture(n))
        .collect()
    }

    proptest! {
        #[test]
        fn arbitrary_input_never_panics(lines in proptest::collection::vec(".{0,300}", 0..40)) {
            let mut scanner = TorchScanner::new();
            for line in &lines {
                let _ = scanner.feed(line);
                while scanner.poll().is_some() {}
            }
            let _ = scanner.finish();
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4000)) {
            let text = String::from_utf8_lossy(&bytes);
            for event in scan_text(&text) {
                if let TorchEvent::CudaOom(oom) = &event {
                    let _ = cuda_oom_advice(oom);
                }
            }
        }

        #[test]
        fn real_lines_cut_anywhere_never_panic(cuts in proptest::collection::vec(0usize..6000, 1..12)) {
            // Cut the fixtures at arbitrary points (snapped to characters)
            // and feed the pieces as lines, as a pipe split mid-message would.
            let text = all_fixture_text();
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
            points.sort_unstable();
            let mut start = 0;
            let mut scanner = TorchScanner::new();
            for mut point in points.into_iter().chain([text.len()]) {
                while !text.is_char_boundary(point) {
                    point -= 1;
                }
                if point < start {
                    continue;
                }
                for line in text[start..point].split('\n') {
                    for event in scanner.feed(line).into_iter().chain(std::iter::from_fn(|| scanner.poll())) {
                        match &event {
                            TorchEvent::CudaOom(o) => { let _ = cuda_oom_advice(o); }
                            TorchEvent::WorkerDied(w) => { let _ = worker_died_advice(w, true); }
                            TorchEvent::RankFailed(r) => { let _ = rank_failed_advice(r, false); }
                            TorchEvent::Progress(_) | TorchEvent::Framework(_) => {}
                        }
                    }
                }
                start = point;
            }
            let _ = scanner.finish();
        }

        #[test]
        fn whole_mebibytes_convert_exactly(n in 0u64..10_000_000) {
            prop_assert_eq!(size_to_bytes(&format!("{n}.00"), "MiB"), Some(n << 20));
        }

        #[test]
        fn figures_survive_a_round_trip(tried in 1u64..(1 << 40), unalloc in 0u64..(1 << 40)) {
            // Whatever two-decimal figures PyTorch prints, the parser reads
            // them back as the same bytes the printed text means.
            let text = format!(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of 80.00 GiB of which 1.00 GiB is free. Of the allocated memory 1.00 GiB is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.",
                format_size(tried), format_size(unalloc)
            );
            let oom = parse_cuda_oom(&text).expect("an OOM");
            let printed = |s: String| {
                let (n, u) = s.split_once(' ').expect("number and unit");
                size_to_bytes(n, u)
            };
            prop_assert_eq!(oom.tried_bytes, printed(format_size(tried)));
            prop_assert_eq!(oom.reserved_unallocated_bytes, printed(format_size(unalloc)));
        }
    }
}
