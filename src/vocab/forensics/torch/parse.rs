//! The figures of one PyTorch message: sizes as `format_size()` prints them,
//! signal names, and the parsers for a single CUDA out-of-memory or
//! DataLoader worker-death message. The scanner decides which lines make a
//! message; these only read one.

use regex::Regex;

use crate::vocab::model::{SIGNALS, known_signal};

use super::{
    ALLOC_NEW, ALLOC_OLD, CACHED, CudaOom, DEVICE, FREE_NEW, FREE_OLD, GpuProcessMemory,
    OOM_ANCHOR, OTHER_PROCESS, RESERVED_TOTAL, SHM_HINT, THIS_PROCESS, TOTAL_NEW, TOTAL_OLD, TRIED,
    UNALLOC_NEW, WORKER_EXIT_CODE, WORKER_PIDS, WORKER_SELF, WORKER_SIGNAL, WorkerDied,
};

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
        && let Some(name) = known_signal(number)
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
