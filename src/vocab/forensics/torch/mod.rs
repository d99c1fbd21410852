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

mod parse;
mod scanner;

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

pub use parse::{format_size, parse_cuda_oom, parse_worker_died, size_to_bytes};
pub use scanner::{TorchScanner, scan_text};

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
    /// Training progress (`crate::vocab::forensics::progress`): not a PyTorch
    /// message, but read from the same lines by the output scanner, so it
    /// keeps its order among them. Consecutive updates are merged.
    Progress(crate::vocab::forensics::progress::ProgressUpdate),
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
                "../../../../tests/fixtures/torch-errors/01-torch0x-thc-cuda-runtime-error.txt"
            ),
            "02" => {
                include_str!(
                    "../../../../tests/fixtures/torch-errors/02-torch1.0-1.3-cached-format.txt"
                )
            }
            "04" => include_str!(
                "../../../../tests/fixtures/torch-errors/04-torch1.4-1.9-reserved-in-total.txt"
            ),
            "06" => include_str!(
                "../../../../tests/fixtures/torch-errors/06-torch1.13-2.0-cuda-OutOfMemoryError-max-split.txt"
            ),
            "08" => include_str!(
                "../../../../tests/fixtures/torch-errors/08-torch2.2-2.4-expandable-segments-this-process.txt"
            ),
            "09" => include_str!(
                "../../../../tests/fixtures/torch-errors/09-torch2.4plus-torch.OutOfMemoryError.txt"
            ),
            "10" => include_str!(
                "../../../../tests/fixtures/torch-errors/10-container-own-process-as-Process-N.txt"
            ),
            "13" => {
                include_str!("../../../../tests/fixtures/torch-errors/13-no-process-info-line.txt")
            }
            "16" => include_str!(
                "../../../../tests/fixtures/torch-errors/16-dataloader-killed-by-signal-Killed.txt"
            ),
            "17" => include_str!(
                "../../../../tests/fixtures/torch-errors/17-dataloader-killed-by-signal-BusError-shm.txt"
            ),
            "19" => include_str!(
                "../../../../tests/fixtures/torch-errors/19-dataloader-exited-unexpectedly-pids.txt"
            ),
            "23" => {
                include_str!(
                    "../../../../tests/fixtures/torch-errors/23-kernel-memcg-oom-kill-line.txt"
                )
            }
            "25" => include_str!(
                "../../../../tests/fixtures/torch-errors/25-torchrun-childfailed-sigkill.txt"
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
