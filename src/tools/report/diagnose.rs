//! Diagnosis: from the measurements in a [`RunLog`] to findings a person can
//! act on. Each [`Finding`] cites the numbers it was computed from, so the
//! advice can be checked against the timeline instead of being trusted.
//!
//! Pure functions of the log: no I/O, no clock.

use super::finding::MIB;
use super::finding::{Cited, Finding, Severity, processes, rate_text, time_text};
use super::fit::{prefetch_share, worker_fit};
use super::run_log::{RunLog, SamplePoint};
use crate::sinks::log::Event as Logged;
use crate::sinks::log::EventName;
use crate::sinks::log::{CheckpointDoneEvent, CudaOomEvent, OomKillEvent, WorkerDiedEvent};
use crate::vocab::units::HumanBytes;

/// Everything the log says, as findings, most urgent first.
pub fn diagnose(log: &RunLog) -> Vec<Finding> {
    let procs = processes(log);
    let mut out = Vec::new();
    oom_kills(log, &mut out);
    progress(log, &mut out);
    failed_ranks(log, &mut out);
    phase_memory(log, &mut out);
    cuda_ooms(log, &mut out);
    worker_deaths(log, &mut out);
    super::did::what_oomguard_did(log, &mut out);
    super::workers::worker_growth(log, &procs, &mut out);
    super::trainer::trainer_growth(log, &procs, &mut out);
    worker_fit(log, &mut out);
    prefetch_share(log, &mut out);
    super::shm::shm_use(log, &mut out);
    swap_growth(log, &mut out);
    log_integrity(log, &mut out);
    // Stable: within a severity, the order above (causes before sizing).
    out.sort_by_key(|f| f.severity);
    out
}

/// Memory per training step, and the steps each restart made the job redo.
fn progress(log: &RunLog, out: &mut Vec<Finding>) {
    if let Some(p) = log
        .progress
        .iter()
        .rev()
        .find(|p| p.bytes_per_step.is_some())
        && let Some(per) = p.bytes_per_step.filter(|&b| b > 0)
    {
        let at = p.ceiling_step.map_or(String::new(), |c| {
            format!(", so the ceiling is reached near step {c}")
        });
        let of = p.total.map_or(String::new(), |t| format!(" of {t}"));
        out.push(Finding {
            kind: "step_growth",
            severity: Severity::Info,
            title: format!(
                "memory grows {} per training step{at}{of}",
                HumanBytes(per.unsigned_abs())
            ),
            advice: "Memory that grows with every step is held from step to step: \
                     losses kept as tensors (use .item()), outputs appended to a list, \
                     or a cache without a bound."
                .to_string(),
            numbers: Vec::new(),
        });
    }
    for r in log
        .progress
        .iter()
        .filter(|p| p.event == Some(EventName::Restart))
    {
        let (Some(stopped), next) = (r.step, r.attempt) else {
            continue;
        };
        // The companion's checkpoint of the ended attempt: exact.
        let saved = log.events.iter().rev().find_map(|e| match &e.event {
            Logged::CheckpointDone(CheckpointDoneEvent {
                step: Some(s),
                ok: true,
                ..
            }) if e.attempt + 1 == next => Some(*s),
            _ => None,
        });
        if let Some(at) = saved {
            let lost = stopped.saturating_sub(at);
            out.push(Finding {
                kind: "steps_lost",
                severity: Severity::Info,
                title: format!(
                    "attempt {next} resumed from the companion's checkpoint at step {at}: {lost} step{} lost",
                    if lost == 1 { "" } else { "s" }
                ),
                advice: "The step the trainer saved on oomguard's request, against the last \
                         step it reported."
                    .to_string(),
                numbers: Vec::new(),
            });
            continue;
        }
        let resumed = log.progress.iter().find(|p| {
            p.attempt == next
                && p.event != Some(EventName::Restart)
                && p.phase.as_deref() == Some("train")
        });
        let Some(resumed_at) = resumed.and_then(|p| p.step) else {
            continue;
        };
        let same_epoch = resumed.is_some_and(|p| p.epoch == r.epoch || p.epoch.is_none());
        if !same_epoch || resumed_at > stopped {
            continue;
        }
        out.push(Finding {
            kind: "steps_lost",
            severity: Severity::Info,
            title: format!(
                "attempt {next} resumed at step {resumed_at}: {} steps recomputed",
                stopped - resumed_at
            ),
            advice: "Steps since the last checkpoint are lost at a restart; checkpoint \
                     more often (or on the checkpoint signal) to lose fewer."
                .to_string(),
            numbers: Vec::new(),
        });
    }
}

/// torchrun's failed rank, tied to the kernel's kill of the same pid when
/// the log has one.
fn failed_ranks(log: &RunLog, out: &mut Vec<Finding>) {
    for e in &log.events {
        let Logged::RankFailed(r) = &e.event else {
            continue;
        };
        let mut numbers = vec![Cited::seconds("t_seconds", "time of the failure", e.t)];
        if let Some(rank) = r.rank {
            numbers.push(Cited::count("rank", "global rank", u64::from(rank)));
        }
        let advice = if r.oom_killed {
            "torchrun reported the rank's failure and the kernel's report names the same \
             process: the rank died of memory, and torchrun then stopped its siblings. \
             See the OOM kill finding for what held the memory."
                .to_string()
        } else {
            let said: Vec<&str> = r.advice.iter().map(String::as_str).collect();
            if said.is_empty() {
                "torchrun stopped every other rank after this one failed: look at this \
                 rank's own output for the cause."
                    .to_string()
            } else {
                said.join(" ")
            }
        };
        out.push(Finding {
            kind: "rank_failed",
            severity: if r.oom_killed {
                Severity::Critical
            } else {
                Severity::Warning
            },
            title: format!("{} at {}", capitalised(&r.describe()), time_text(e.t)),
            advice,
            numbers,
        });
    }
}

/// A phase (validation, testing) that added memory sharply.
fn phase_memory(log: &RunLog, out: &mut Vec<Finding>) {
    for e in &log.events {
        let Logged::PhaseMemory(p) = &e.event else {
            continue;
        };
        let epoch = p
            .epoch
            .as_ref()
            .map_or(String::new(), |ep| format!(" in epoch {ep}"));
        out.push(Finding {
            kind: "phase_memory",
            severity: Severity::Warning,
            title: format!(
                "{} adds {}{epoch}",
                capitalised(p.phase.as_str()),
                HumanBytes(p.added_bytes)
            ),
            advice: if p.advice.is_empty() {
                "Memory that a phase adds and keeps is usually outputs or predictions \
                 being accumulated on the GPU or in a list."
                    .to_string()
            } else {
                p.advice.clone()
            },
            numbers: vec![
                Cited::seconds("t_seconds", "when it was flagged", e.t),
                Cited::bytes("before_bytes", "usage when the phase began", p.before_bytes),
                Cited::bytes("added_bytes", "added during the phase", p.added_bytes),
            ],
        });
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or_else(String::new, |f| {
        f.to_uppercase().collect::<String>() + c.as_str()
    })
}

fn oom_kills(log: &RunLog, out: &mut Vec<Finding>) {
    for e in &log.events {
        let Logged::OomKill(kill) = &e.event else {
            continue;
        };
        let OomKillEvent {
            pid,
            comm,
            role,
            anon_rss_bytes,
            constraint,
            ..
        } = kill.as_ref();
        let who = proc_name(*pid, comm.as_deref(), role.as_deref());
        let mut numbers = vec![Cited::seconds("t_seconds", "time of the kill", e.t)];
        if let Some(a) = anon_rss_bytes {
            numbers.push(Cited::bytes(
                "anon_rss_bytes",
                "victim's anonymous memory",
                *a,
            ));
        }
        let scope = match constraint.as_deref() {
            Some(c) if c.contains("memcg") || c.contains("cgroup") => {
                " The limit hit was the memory cgroup's, not the machine's."
            }
            Some(c) if c.contains("none") || c == "global" => {
                " The whole machine ran out of memory."
            }
            _ => "",
        };
        let advice = match role.as_deref() {
            Some("worker") => format!(
                "The kernel chose a DataLoader worker: the workers' memory pushed the job over its ceiling.{scope} See the worker findings below for how many workers fit and whether they leak."
            ),
            Some("trainer") => format!(
                "The kernel killed the training process itself, so anything since the last checkpoint is lost.{scope} Reduce the trainer's footprint (batch size, cached data) or give the job more memory, and let oomguard stop it gracefully before the ceiling."
            ),
            _ => format!(
                "The kernel ended {who} because the job exceeded its memory ceiling.{scope}"
            ),
        };
        out.push(Finding {
            kind: "oom_kill",
            severity: Severity::Critical,
            title: format!("The kernel OOM killer killed {who} at {}", time_text(e.t)),
            advice,
            numbers,
        });
    }
}

fn cuda_ooms(log: &RunLog, out: &mut Vec<Finding>) {
    for e in &log.events {
        let Logged::CudaOom(CudaOomEvent {
            device,
            tried_bytes,
            total_bytes,
            free_bytes,
            allocated_bytes,
            reserved_unallocated_bytes,
            reserved_bytes,
            ..
        }) = &e.event
        else {
            continue;
        };
        let dev = device.map_or_else(|| "the GPU".to_string(), |d| format!("GPU {d}"));
        let slack = reserved_unallocated_bytes.or_else(|| {
            reserved_bytes
                .zip(*allocated_bytes)
                .map(|(r, a)| r.saturating_sub(a))
        });
        let mut numbers = vec![Cited::seconds("t_seconds", "time", e.t)];
        for (name, label, v) in [
            ("tried_bytes", "failed request", tried_bytes),
            ("total_bytes", "device capacity", total_bytes),
            ("free_bytes", "free on the device", free_bytes),
            ("allocated_bytes", "allocated by PyTorch", allocated_bytes),
            (
                "reserved_unallocated_bytes",
                "reserved by PyTorch but unallocated",
                &slack,
            ),
        ] {
            if let Some(v) = v {
                numbers.push(Cited::bytes(name, label, *v));
            }
        }
        let fragmented = slack
            .zip(*tried_bytes)
            .is_some_and(|(s, t)| s >= t && t > 0);
        if fragmented {
            out.push(Finding {
                kind: "fragmentation",
                severity: Severity::Critical,
                title: format!("CUDA out of memory on {dev}: the allocator was fragmented"),
                advice: format!(
                    "PyTorch held {} reserved but unallocated, at least the {} it failed to allocate, but not in one piece. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so the cache can grow segments instead of splitting them (or restart with oomguard's --restart-on cuda-oom, which adds it).",
                    HumanBytes(slack.unwrap_or(0)),
                    HumanBytes(tried_bytes.unwrap_or(0)),
                ),
                numbers,
            });
        } else {
            let used = allocated_bytes
                .zip(*total_bytes)
                .map(|(a, t)| {
                    format!(
                        " PyTorch had {} of {} allocated.",
                        HumanBytes(a),
                        HumanBytes(t)
                    )
                })
                .unwrap_or_default();
            out.push(Finding {
                kind: "cuda_oom",
                severity: Severity::Critical,
                title: format!("CUDA out of memory on {dev}"),
                advice: format!(
                    "The GPU was genuinely full, not fragmented.{used} Lower the batch size, use mixed precision or activation checkpointing, or free tensors held across steps (losses kept with their graph)."
                ),
                numbers,
            });
        }
    }
}

fn worker_deaths(log: &RunLog, out: &mut Vec<Finding>) {
    let killed_pids = log.oom_killed_pids();
    for e in &log.events {
        let Logged::WorkerDied(WorkerDiedEvent {
            pid,
            signal,
            exit_code,
            shm_hint,
            ..
        }) = &e.event
        else {
            continue;
        };
        let who = pid.map_or_else(
            || "A DataLoader worker".to_string(),
            |p| format!("DataLoader worker {p}"),
        );
        let how = match (signal, exit_code) {
            (Some(s), _) => format!("was killed by {s}"),
            (None, Some(c)) => format!("exited with {c}"),
            _ => "died".to_string(),
        };
        let mut numbers = vec![Cited::seconds("t_seconds", "time", e.t)];
        if let Some(p) = pid {
            numbers.push(Cited::count("pid", "worker pid", u64::from(*p)));
        }
        if *shm_hint {
            out.push(Finding {
                kind: "shm",
                severity: Severity::Critical,
                title: format!("{who} {how}: /dev/shm is too small"),
                advice: "DataLoader workers hand batches to the trainer through shared memory in /dev/shm; a bus error means it ran out. Enlarge it (Docker: --shm-size=8g or --ipc=host; Kubernetes: an emptyDir with medium Memory mounted at /dev/shm), or lower num_workers × prefetch_factor.".to_string(),
                numbers,
            });
        } else if pid.is_some_and(|p| killed_pids.contains(&p)) {
            // The oom_kill finding already tells this death's story.
        } else if signal
            .as_deref()
            .is_some_and(|s| s.contains("KILL") || s.ends_with(" 9"))
        {
            out.push(Finding {
                kind: "worker_killed",
                severity: Severity::Critical,
                title: format!("{who} {how}"),
                advice: "A worker killed by SIGKILL that nobody signalled is almost always the kernel OOM killer. The log has no matching kernel report; check `oomguard forensics` on the machine's kernel log.".to_string(),
                numbers,
            });
        } else {
            out.push(Finding {
                kind: "worker_died",
                severity: Severity::Warning,
                title: format!("{who} {how}"),
                advice: "The worker died for a reason other than memory as far as the log shows; the job's own output has the traceback.".to_string(),
                numbers,
            });
        }
    }
}

fn swap_growth(log: &RunLog, out: &mut Vec<Finding>) {
    let pts: Vec<(&SamplePoint, u64)> = log
        .samples
        .iter()
        .filter_map(|s| s.swap_used_bytes.map(|w| (s, w)))
        .collect();
    let Some(&(first, base)) = pts.first() else {
        return;
    };
    let Some(&(peak_s, peak)) = pts.iter().max_by_key(|p| p.1) else {
        return;
    };
    let growth = peak.saturating_sub(base);
    if growth < 64 * MIB {
        return;
    }
    // When swap started to move: the first sample a sixteenth of the way up.
    let onset = pts
        .iter()
        .find(|(_, w)| w.saturating_sub(base) >= (growth / 16).max(8 * MIB))
        .map_or(first.t, |(s, _)| s.t);
    let rate = if peak_s.t > onset {
        growth as f64 / (peak_s.t - onset)
    } else {
        0.0
    };
    let next_trouble = log
        .events
        .iter()
        .filter(|e| e.t >= onset)
        .find(|e| match &e.event {
            Logged::OomKill(_) | Logged::CudaOom(_) => true,
            Logged::Rule(r) => r.state == crate::sinks::log::RuleState::Firing,
            _ => false,
        });
    let peak_in = log
        .samples
        .iter()
        .filter_map(|s| s.swap_in_bytes_per_s)
        .fold(0.0_f64, f64::max);
    let mut numbers = vec![
        Cited::bytes("swap_growth_bytes", "swap growth", growth),
        Cited::seconds("onset_t_seconds", "swap started to grow at", onset),
        Cited::rate("swap_growth_bytes_per_second", "growth rate", rate),
    ];
    if peak_in > 0.0 {
        numbers.push(Cited::rate(
            "peak_swap_in_bytes_per_second",
            "peak swap-in",
            peak_in,
        ));
    }
    let lead = match next_trouble {
        Some(e) => {
            numbers.push(Cited::seconds(
                "lead_seconds",
                "warning ahead of the next alarm",
                e.t - onset,
            ));
            format!(
                " It started {} before the {} at {}: the earliest sign in this run.",
                time_text(e.t - onset),
                match &e.event {
                    Logged::Rule(r) => format!("rule {}", r.rule),
                    Logged::OomKill(_) => "kernel OOM kill".to_string(),
                    Logged::CudaOom(_) => "CUDA out-of-memory error".to_string(),
                    k => k.name().replace('_', " "),
                },
                time_text(e.t)
            )
        }
        None => String::new(),
    };
    out.push(Finding {
        kind: "swap_growth",
        severity: Severity::Warning,
        title: format!("Swap grew by {} from {}", HumanBytes(growth), time_text(onset)),
        advice: format!(
            "The machine moved memory to swap at {} (from {} to {}).{lead} Swapping slows training long before a kill; treat it as the early warning: add a rule on swap used or swap-in rate, or give the job memory for its peak.",
            rate_text(rate),
            HumanBytes(base),
            HumanBytes(peak)
        ),
        numbers,
    });
}

fn log_integrity(log: &RunLog, out: &mut Vec<Finding>) {
    if log.end.is_none() {
        let t = log.samples.last().map_or(0.0, |s| s.t);
        out.push(Finding {
            kind: "no_run_end",
            severity: Severity::Warning,
            title: "The log has no run_end line".to_string(),
            advice: format!(
                "The log stops at {} without run_end: oomguard was killed or is still running, so the outcome and the peaks below are what the samples show up to there.",
                time_text(t)
            ),
            numbers: vec![Cited::seconds("last_t_seconds", "last line", t)],
        });
    }
}

fn proc_name(pid: Option<u32>, comm: Option<&str>, role: Option<&str>) -> String {
    let mut s = match (pid, comm) {
        (Some(p), Some(c)) => format!("pid {p} ({c}"),
        (Some(p), None) => format!("pid {p} ("),
        (None, Some(c)) => format!("{c} ("),
        (None, None) => "a process (".to_string(),
    };
    match role {
        Some(r) if s.ends_with('(') => s.push_str(r),
        Some(r) => s.push_str(&format!(", {r}")),
        None => {}
    }
    if s.ends_with('(') {
        s.truncate(s.len() - 2);
    } else {
        s.push(')');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::report::fit::worker_fit_numbers;
    use crate::tools::report::load;

    const ENV: &str = r#""schema":"oomguard/1","ts":"2026-01-01T00:00:00.000Z""#;

    /// A log of a trainer with `n` workers sampled every second; worker
    /// private memory is `w0 + rate × t` MiB.
    fn workers_log(n: u32, w0: u64, rate: u64, seconds: u32, extra: &[String]) -> String {
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python","train.py"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            1024 * MIB
        )];
        for s in 1..=seconds {
            let t = f64::from(s);
            let shared = 100 * MIB;
            let mut procs = vec![format!(
                r#"{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":{},"pss_bytes":{},"uss_bytes":{}}}"#,
                300 * MIB,
                200 * MIB + shared / u64::from(n + 1),
                200 * MIB
            )];
            let wp = (w0 + rate * u64::from(s)) * MIB;
            for i in 0..n {
                procs.push(format!(
                    r#"{{"pid":{},"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":{},"pss_bytes":{},"uss_bytes":{wp}}}"#,
                    101 + i,
                    wp + shared,
                    wp + shared / u64::from(n + 1),
                ));
            }
            let pss = 200 * MIB + shared + u64::from(n) * wp;
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{t},"attempt":1,"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"pss_bytes":{pss},"rss_bytes":{}}},"procs":[{}]}}"#,
                (1024 * MIB).saturating_sub(pss),
                1024 * MIB,
                pss * 2,
                procs.join(",")
            ));
        }
        lines.extend(extra.iter().cloned());
        lines.join("\n")
    }

    fn kinds(f: &[Finding]) -> Vec<&'static str> {
        f.iter().map(|f| f.kind).collect()
    }

    /// The report of a recorded run (`text`): no `not` finding, and the
    /// `kind` finding's `name` within `share` of the reader's `truth` (MiB).
    fn recorded(text: &str, not: &str, kind: &str, name: &str, truth: f64, share: f64) {
        let f = diagnose(&load(text).unwrap());
        assert!(!kinds(&f).contains(&not), "{:?}", kinds(&f));
        let v = cited(&f, kind, name);
        assert!(
            v.is_some_and(|v| (v - truth).abs() <= truth * share),
            "{name} {v:?} MiB against {truth} in {:?}",
            kinds(&f)
        );
    }

    /// The number `name` of the first `kind` finding, in MiB (or MiB/s).
    fn cited(f: &[Finding], kind: &str, name: &str) -> Option<f64> {
        (f.iter().find(|f| f.kind == kind))
            .and_then(|f| f.numbers.iter().find(|c| c.name == name))
            .map(|c| c.value / MIB as f64)
    }

    #[test]
    fn leaking_workers_are_named_with_their_rate_and_a_count_that_fits() {
        let log = load(&workers_log(4, 20, 5, 10, &[])).unwrap();
        let f = diagnose(&log);
        let leak = f.iter().find(|f| f.kind == "worker_leak").unwrap();
        for pid in ["101", "102", "103", "104"] {
            assert!(leak.advice.contains(pid), "{}", leak.advice);
        }
        assert!(leak.title.contains("4 of 4"), "{}", leak.title);
        assert!(leak.title.contains("5.0 MiB/s"), "{}", leak.title);
        let fit = f.iter().find(|f| f.kind == "num_workers").unwrap();
        // 0.9 × 1024 − 200 − 100 = 621.6 MiB; peak worker 70 MiB → 8.
        let n = fit
            .numbers
            .iter()
            .find(|c| c.name == "workers_fit")
            .unwrap();
        assert_eq!(n.value, 8.0);
        // The leak, not the memory, sets the count: none is advised.
        assert!(fit.title.contains("fix the leak first"), "{}", fit.title);
        assert!(!fit.title.contains("num_workers="), "{}", fit.title);
        assert!(!fit.advice.contains("num_workers=8"), "{}", fit.advice);
    }

    #[test]
    fn too_many_workers_give_a_smaller_num_workers() {
        // Flat workers (leaking ones give no count).
        let log = load(&workers_log(8, 110, 0, 10, &[])).unwrap();
        let fit = worker_fit_numbers(&log).unwrap();
        // 0.9 × 1024 − 200 − 100 = 621.6 MiB over 110 MiB → 5.
        assert_eq!(fit.fits, 5);
        // 100 MiB split nine ways, rounded down per process.
        assert!(
            fit.shared_bytes.abs_diff(100 * MIB) < 16,
            "{}",
            fit.shared_bytes
        );
        assert_eq!(fit.trainer_bytes, 200 * MIB);
        let f = diagnose(&log);
        let fit = f.iter().find(|f| f.kind == "num_workers").unwrap();
        assert!(fit.title.contains("num_workers=5"), "{}", fit.title);
    }

    #[test]
    fn a_process_is_first_read_when_its_reading_was_taken() {
        // First listed at 10 s with a reading 1.5 s old, on a line whose
        // oldest reading is 3 s old.
        let line = |t: u32, age: &str, tree_age: f64| {
            format!(
                r#"{{{ENV},"event":"sample","t":{t},"attempt":1,"headroom_bytes":1,"ceiling":{{"source":"cgroup","bytes":1}},"tree":{{"pss_bytes":1,"rss_bytes":1,"pss_age_seconds":{tree_age}}},"procs":[{{"pid":7,"ppid":1,"role":"trainer","comm":"python","rss_bytes":9,"pss_bytes":8,"uss_bytes":7{age}}}]}}"#
            )
        };
        let log = load(&format!(
            "{}\n{}",
            line(10, r#","read_age_seconds":1.5"#, 3.0),
            line(12, "", 4.0)
        ))
        .unwrap();
        let p = &processes(&log)[0];
        assert_eq!(p.first_read_t, 8.5);
        // An older log without ages: the line's oldest reading.
        let log = load(&line(12, "", 4.0)).unwrap();
        assert_eq!(processes(&log)[0].first_read_t, 8.0);
    }

    #[test]
    fn time_held_by_oomguard_does_not_dilute_a_workers_growth() {
        // 10 MiB/s for 5 s, then frozen at the edge (SIGSTOP) and read
        // again, unchanged, 15 s later.
        let frozen = |t: u32| {
            let procs: Vec<String> = (101..104)
                .map(|pid| {
                    format!(
                        r#"{{"pid":{pid},"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":{w},"pss_bytes":{p},"uss_bytes":{w}}}"#,
                        w = 70 * MIB,
                        // Read: it shares pages with the trainer.
                        p = 80 * MIB
                    )
                })
                .collect();
            format!(
                r#"{{{ENV},"event":"sample","t":{t},"attempt":1,"headroom_bytes":1,"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"pss_bytes":1,"rss_bytes":1}},"procs":[{}]}}"#,
                1024 * MIB,
                procs.join(",")
            )
        };
        let log = load(&workers_log(
            3,
            20,
            10,
            5,
            &[stop_at5(), frozen(12), frozen(20)],
        ))
        .unwrap();
        let procs = processes(&log);
        let w = procs.iter().find(|p| p.pid == 101).unwrap();
        assert_eq!(w.snapshots, 7);
        let slope = w.uss_slope.unwrap() / MIB as f64;
        assert!((slope - 10.0).abs() < 0.01, "{slope} MiB/s");
        // Released (SIGCONT), it is measured again.
        let cont = format!(
            r#"{{{ENV},"event":"action","t":15,"attempt":1,"action":"resume","reason":"cleared","pids":[101],"signal":"SIGCONT","result":"ok"}}"#
        );
        let log = load(&workers_log(3, 20, 10, 5, &[stop_at5(), cont, frozen(20)])).unwrap();
        let w = processes(&log).into_iter().find(|p| p.pid == 101).unwrap();
        assert!(w.uss_slope.unwrap() / (MIB as f64) < 9.0);
    }

    fn stop_at5() -> String {
        format!(
            r#"{{{ENV},"event":"action","t":5,"attempt":1,"action":"pause","reason":"last resort","pids":[101,102,103],"signal":"SIGSTOP","result":"ok"}}"#
        )
    }

    #[test]
    fn one_worker_that_fits_is_named_in_the_singular() {
        // 621.6 MiB of room over a 350 MiB peak: one.
        let log = load(&workers_log(4, 350, 0, 10, &[])).unwrap();
        let f = diagnose(&log);
        let fit = f.iter().find(|f| f.kind == "num_workers").unwrap();
        assert!(
            fit.title.starts_with("At most 1 DataLoader worker fits;"),
            "{}",
            fit.title
        );
        assert!(
            fit.advice.contains("room for 1 worker at"),
            "{}",
            fit.advice
        );
    }

    #[test]
    fn a_fast_leak_stopped_within_seconds_is_a_leak() {
        // Per-process lists 1 s apart (a stop's rule and action ticks):
        // +20 MiB/s is a leak though it is under a quarter of 195 MiB.
        let log = load(&workers_log(2, 175, 20, 2, &[])).unwrap();
        let f = diagnose(&log);
        assert!(kinds(&f).contains(&"worker_leak"), "{:?}", kinds(&f));
        assert!(!kinds(&f).contains(&"worker_flat"));
    }

    /// A trainer's private memory at each second (MiB), as per-process
    /// lists of a log.
    fn trainer_log(uss_mib: &[u64]) -> String {
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python","train.py"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            4096 * MIB
        )];
        lines.extend(trainer_samples(1, 0, 100, uss_mib));
        lines.join("\n")
    }

    /// [`trainer_log`]'s sample lines for trainer `pid` of `attempt`, the
    /// first at `t0 + 1`.
    fn trainer_samples(attempt: u32, t0: usize, pid: u32, uss_mib: &[u64]) -> Vec<String> {
        let mut lines = Vec::new();
        for (s, uss) in uss_mib.iter().enumerate() {
            let b = uss * MIB;
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{},"attempt":{attempt},"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"pss_bytes":{b},"rss_bytes":{b}}},"procs":[{{"pid":{pid},"ppid":1,"role":"trainer","comm":"python","rss_bytes":{b},"pss_bytes":{b},"uss_bytes":{b}}}]}}"#,
                t0 + s + 1,
                4096 * MIB - b,
                4096 * MIB
            ));
        }
        lines
    }

    #[test]
    fn a_start_up_load_then_a_plateau_is_a_load_not_a_leak() {
        // 40 MiB, a 340 MiB data set read in 2 s, then level for 8 s.
        let mut uss = vec![40, 210, 380];
        uss.extend([380, 381, 380, 379, 380, 381, 380, 380]);
        let f = diagnose(&load(&trainer_log(&uss)).unwrap());
        assert!(!kinds(&f).contains(&"trainer_growth"), "{:?}", kinds(&f));
        let l = f.iter().find(|f| f.kind == "trainer_load").unwrap();
        assert_eq!(l.severity, Severity::Info);
        assert!(
            l.title.contains("loaded 341 MiB in 2 s at start-up"),
            "{}",
            l.title
        );
        assert!(!l.advice.contains("detach"), "{}", l.advice);
        // The same growth still going at the end is a leak.
        let uss: Vec<u64> = (0..11).map(|s| 40 + 34 * s).collect();
        let f = diagnose(&load(&trainer_log(&uss)).unwrap());
        assert!(kinds(&f).contains(&"trainer_growth"), "{:?}", kinds(&f));
        assert!(!kinds(&f).contains(&"trainer_load"));
    }

    #[test]
    fn a_load_is_named_though_the_trainer_reads_lower_after_its_workers_exit() {
        // 40 MiB, 500 MiB read in 1 s, workers forked at 4 s (the trainer's
        // private figure falls to its part beside them, its PSS stays), and
        // a last list after they exited read at 200 MiB (an estimate: RSS
        // fell by 60 MiB, taken from private pages first). The trainer's
        // whole-run USS slope is negative; it loaded 500 MiB all the same.
        let uss: [u64; 12] = [40, 540, 540, 300, 310, 320, 330, 330, 330, 330, 330, 200];
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python","train.py"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            4096 * MIB
        )];
        for (s, &u) in uss.iter().enumerate() {
            let (u, pss) = (u * MIB, if s == 0 { 40 * MIB } else { 540 * MIB });
            let rss = if s == 11 { 500 * MIB } else { pss.max(u) };
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{},"attempt":1,"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"pss_bytes":{pss},"rss_bytes":{rss}}},"roles":[{{"role":"trainer","pss_bytes":{pss},"rss_bytes":{rss}}}],"procs":[{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":{rss},"pss_bytes":{pss},"uss_bytes":{u}}}]}}"#,
                s + 1,
                4096 * MIB - pss,
                4096 * MIB
            ));
        }
        let log = load(&lines.join("\n")).unwrap();
        let procs = processes(&log);
        let trainer = &procs[0];
        assert!(trainer.uss_slope.unwrap() < 0.0, "{trainer:?}");
        let f = diagnose(&log);
        let l = f.iter().find(|f| f.kind == "trainer_load");
        assert!(l.is_some_and(|l| l.title.contains("500 MiB")), "{f:#?}");
    }

    /// tests/diagnosis.rs's pandas case (pytorch#5902), recorded with both
    /// cores busy (tests/fixtures/logs/README.md): lists 3 s apart read
    /// the two workers last at 106.3 MiB, a sweep before they exited and
    /// still rising (96 to 106 MiB), where the independent reader saw
    /// them settle at 111.3 and 111.1 MiB. From 106.3, 17 workers were
    /// advised where 16 fit.
    #[test]
    fn workers_still_rising_at_their_last_reading_are_raised_to_where_they_settled() {
        let log = load(include_str!(
            "../../../tests/fixtures/logs/cow-pandas-busy.ndjson"
        ))
        .unwrap();
        let f = diagnose(&log);
        let num = |kind: &str, name: &str| {
            f.iter()
                .find(|f| f.kind == kind)
                .and_then(|f| f.numbers.iter().find(|c| c.name == name))
                .map(|c| c.value)
                .unwrap_or_else(|| panic!("no {name} in {kind}: {:?}", kinds(&f)))
        };
        let peak = num("worker_cow", "per_worker_private_peak_bytes") / MIB as f64;
        assert!(
            (peak - 111.3).abs() <= 111.3 * 0.03,
            "per-worker peak {peak:.1} MiB"
        );
        let settled = num("worker_cow", "per_worker_settled_bytes") / MIB as f64;
        assert!(
            (settled - 111.2).abs() <= 111.2 * 0.03,
            "settled at {settled:.1} MiB"
        );
        assert_eq!(num("num_workers", "workers_fit"), 16.0);
    }

    /// tests/diagnosis.rs's re-forked case, recorded with both cores busy
    /// (tests/fixtures/logs/README.md): the trainer's PSS and USS fell at
    /// each fork and rose as each set of workers exited, the second set
    /// seconds before the end, so both read as still growing there; its RSS
    /// was level from 3 s. Judged by its PSS, no trainer finding was made.
    #[test]
    fn a_trainer_that_re_forks_its_workers_is_judged_by_what_it_maps() {
        // The reader: 14 MiB at the start, 579.9 MiB before the fork.
        recorded(
            include_str!("../../../tests/fixtures/logs/cow-reforked-busy.ndjson"),
            "trainer_growth",
            "trainer_load",
            "loaded_bytes",
            566.0,
            0.05,
        );
    }

    /// tests/diagnosis.rs's pandas case, recorded with both cores busy
    /// (tests/fixtures/logs/README.md): the trainer's lists read its
    /// private memory at 621 MiB at 7.0 s, 334–372 MiB after its workers
    /// forked, so their last 10 s fell and rose again (flat), and its last
    /// list came after the workers exited, its RSS 14 MiB up on a level
    /// held from 4.6 s. No trainer finding was made.
    #[test]
    fn a_load_hidden_by_the_fork_in_the_lists_window_is_named() {
        // The reader: 7 MiB at the start, 626.1 MiB before the fork.
        recorded(
            include_str!("../../../tests/fixtures/logs/cow-pandas-fork-in-window.ndjson"),
            "trainer_growth",
            "trainer_load",
            "loaded_bytes",
            618.2,
            0.05,
        );
    }

    /// tests/figures.rs's 4 MiB-a-step leak in a clean-clone CI run
    /// (tests/fixtures/logs/README.md): beside other tests its pace halved
    /// from 10.2 s (from 64 to about 32 MiB/s), oomguard checkpointed it at
    /// 12.2 s and stopped it at 13.9 s. Its readings a second apart to the
    /// checkpoint are 13, too few for a stretch of the newer pace, and the
    /// whole read flat: no finding.
    #[test]
    fn a_leak_that_slowed_before_oomguard_acted_is_named_with_its_window() {
        let f = leak_up_to_a_checkpoint(
            include_str!("../../../tests/fixtures/logs/leak-4mib-stopped-ci.ndjson"),
            12.207,
        );
        // No reader ran beside it: the rate lies between the two paces.
        let rate = cited(&f, "trainer_growth", "growth_bytes_per_second").unwrap();
        assert!((32.0..=64.0).contains(&rate), "{rate} MiB/s");
    }

    /// The same leak run here, its `python3` started through a pyenv shim:
    /// the first list holds a `pyenv-hooks` process of 0 MiB with the
    /// trainer's role. The trainer is still the only one: its rate is taken
    /// on every sample line, up to oomguard's checkpoint, and says so.
    #[test]
    fn a_trainer_listed_once_is_no_rank_beside_the_trainer() {
        leak_up_to_a_checkpoint(
            include_str!("../../../tests/fixtures/logs/leak-4mib-pyenv-shim.ndjson"),
            9.082,
        );
    }

    /// The findings of `text`, whose `trainer_growth` names a window that
    /// ends at oomguard's checkpoint at `at` s.
    fn leak_up_to_a_checkpoint(text: &str, at: f64) -> Vec<Finding> {
        let (leak, f) = growing_trainer(text);
        let end = (leak.numbers.iter()).find(|c| c.name == "growth_window_end_seconds");
        assert_eq!(end.map(|c| c.value), Some(at), "{}", leak.title);
        let named = format!("before oomguard's checkpoint at {at:.1}s and");
        assert!(leak.title.contains(&named), "{}", leak.title);
        f
    }

    /// The `trainer_growth` finding of `text`, and all its findings.
    fn growing_trainer(text: &str) -> (Finding, Vec<Finding>) {
        let f = diagnose(&load(text).unwrap());
        let leak = f.iter().find(|f| f.kind == "trainer_growth").cloned();
        (leak.unwrap_or_else(|| panic!("{:?}", kinds(&f))), f)
    }

    /// tests/diagnosis.rs's leak case, recorded with both cores busy
    /// (tests/fixtures/logs/README.md): its last list 2.9 s before its end,
    /// and the start-up in the lists' last 10 s, so that they read as a
    /// load that had stopped; every sample after them shows the leak.
    #[test]
    fn a_leak_after_the_last_list_is_still_a_leak() {
        // The reader: 36–38 MiB/s over the trainer's last seconds.
        recorded(
            include_str!("../../../tests/fixtures/logs/leak-busy.ndjson"),
            "trainer_load",
            "trainer_growth",
            "growth_bytes_per_second",
            37.0,
            0.1,
        );
    }

    /// A log of one trainer at `mib[t − 1]` MiB (its RSS, PSS and USS) on a
    /// sample line each second from t = 1, with its process list where
    /// `listed(t)`, and `extra(t)` after that line.
    fn sampled_trainer(
        mib: &[u64],
        listed: impl Fn(u64) -> bool,
        extra: impl Fn(u64) -> Option<String>,
    ) -> String {
        let ticks: Vec<Tick> = (mib.iter())
            .map(|&m| Tick {
                rss: m,
                pss: m,
                workers: 0,
            })
            .collect();
        sampled(&ticks, listed, extra)
    }

    /// One second of a sampled trainer: its RSS and its PSS (also its USS)
    /// in MiB, and how many DataLoader workers share its RSS.
    #[derive(Clone, Copy)]
    struct Tick {
        rss: u64,
        pss: u64,
        workers: u32,
    }

    /// [`sampled_trainer`] of `ticks[t − 1]`: each worker maps all the
    /// trainer's pages and 1 MiB of its own.
    fn sampled(
        ticks: &[Tick],
        listed: impl Fn(u64) -> bool,
        extra: impl Fn(u64) -> Option<String>,
    ) -> String {
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python","train.py"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            4096 * MIB
        )];
        for (t, k) in (1u64..).zip(ticks) {
            let (r, p, n) = (k.rss * MIB, k.pss * MIB, u64::from(k.workers));
            // What the trainer does not hold of its pages, its workers do.
            let w = (r - p) / n.max(1) + MIB;
            let mut procs = vec![format!(
                r#"{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":{r},"pss_bytes":{p},"uss_bytes":{p}}}"#
            )];
            procs.extend((0..n).map(|i| {
                format!(
                    r#"{{"pid":{},"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":{},"pss_bytes":{w},"uss_bytes":{MIB}}}"#,
                    101 + i,
                    r + MIB
                )
            }));
            let procs = if listed(t) {
                format!(r#","procs":[{}]"#, procs.join(","))
            } else {
                String::new()
            };
            let roles = if n > 0 {
                format!(
                    r#",{{"role":"worker","pss_bytes":{},"rss_bytes":{}}}"#,
                    w * n,
                    (r + MIB) * n
                )
            } else {
                String::new()
            };
            let tree = p + w * n;
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{t},"attempt":1,"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"pss_bytes":{tree},"rss_bytes":{}}},"roles":[{{"role":"trainer","pss_bytes":{p},"rss_bytes":{r}}}{roles}]{procs}}}"#,
                4096 * MIB - tree,
                4096 * MIB,
                r + (r + MIB) * n
            ));
            lines.extend(extra(t));
        }
        lines.join("\n")
    }

    #[test]
    fn a_trainer_beside_workers_is_judged_by_what_it_maps() {
        // 600 MiB loaded at start-up, four workers forked at 5 s (its PSS
        // falls to a fifth), exiting one by one from 12 s: its PSS climbs
        // back to 600 MiB to the end, with no byte allocated, its RSS level
        // from 3 s. Judged by its PSS, it is still growing at its end and
        // not allocating: nothing is said of it.
        let ticks: Vec<Tick> = (1..=17u64)
            .map(|t| {
                let workers = match t {
                    ..5 => 0,
                    5..12 => 4,
                    _ => 16u32.saturating_sub(t as u32),
                };
                let rss = [10, 300].get(t as usize - 1).copied().unwrap_or(600);
                let rss = if t == 17 { 200 } else { rss };
                Tick {
                    rss,
                    pss: rss / (u64::from(workers) + 1),
                    workers,
                }
            })
            .collect();
        let log = sampled(&ticks, |t| t % 3 == 1, |_| None);
        let f = diagnose(&load(&log).unwrap());
        assert!(kinds(&f).contains(&"trainer_load"), "{:?}", kinds(&f));
    }

    #[test]
    fn growth_after_the_last_list_is_judged_on_every_sample() {
        // 10 MiB, then 900 MiB at 2 s and +36 MiB/s; lists at 1, 6 and
        // 10 s, samples to 14 s, the last one as the trainer tears its
        // memory down. To 10 s, the start-up's jump in the trend's window
        // makes the newest seconds look slow (72 MiB over 2 s against a
        // trend of 82.6 MiB/s): a load that stopped. To 13 s, +36 MiB/s.
        let mib: Vec<u64> = (1..=14u64)
            .map(|t| match t {
                1 => 10,
                14 => 300,
                _ => 900 + 36 * (t - 2),
            })
            .collect();
        let log = sampled_trainer(&mib, |t| [1, 6, 10].contains(&t), |_| None);
        let f = diagnose(&load(&log).unwrap());
        assert!(kinds(&f).contains(&"trainer_growth"), "{:?}", kinds(&f));
        assert!(!kinds(&f).contains(&"trainer_load"), "{:?}", kinds(&f));
    }

    /// tests/diagnosis.rs's evaluation case in a clean-clone CI run
    /// (tests/fixtures/logs/README.md): only the trainer's last list read
    /// the release, which the samples after it held for 5 s.
    #[test]
    fn a_release_the_samples_hold_after_the_last_list_is_an_accumulation() {
        // The reader: 292.4 MiB; the ticks, 1.1 s apart, miss up to 50 MiB
        // of the peak of a 50 MiB/s accumulation.
        recorded(
            include_str!("../../../tests/fixtures/logs/eval-ci.ndjson"),
            "trainer_load",
            "trainer_accumulation",
            "released_bytes",
            292.4,
            0.15,
        );
    }

    #[test]
    fn a_leak_stopped_by_oomguard_is_judged_up_to_the_stop() {
        // +20 MiB/s from 100 MiB; oomguard stops it at 20.5 s and it is
        // level for 5 s while it saves and exits (lists at 1, 4, …, 25).
        let mib: Vec<u64> = (1..=26u64).map(|t| 100 + 20 * t.min(20)).collect();
        let stop = |t| {
            (t == 20).then(|| {
                format!(
                    r#"{{{ENV},"event":"action","t":20.5,"attempt":1,"action":"stop","pids":[100],"reason":"critical-headroom","result":"ok","signal":"SIGTERM"}}"#
                )
            })
        };
        let log = sampled_trainer(&mib, |t| t % 3 == 1, stop);
        let f = diagnose(&load(&log).unwrap());
        assert!(kinds(&f).contains(&"trainer_growth"), "{:?}", kinds(&f));
    }

    #[test]
    fn a_rate_window_is_said_to_end_at_oomguards_action_only_where_it_does() {
        // +20 MiB/s from 100 MiB to the end; oomguard checkpoints it at
        // 10.5 s and it goes on (lists at 1, 4, …, 25).
        let mib: Vec<u64> = (1..=26u64).map(|t| 100 + 20 * t).collect();
        let checkpoint = |t| {
            (t == 10).then(|| {
                format!(
                    r#"{{{ENV},"event":"action","t":10.5,"attempt":1,"action":"checkpoint","pids":[100],"reason":"checkpoint-headroom","result":"ok"}}"#
                )
            })
        };
        let log = sampled_trainer(&mib, |t| t % 3 == 1, checkpoint);
        let (cut, _) = growing_trainer(&log);
        let named = "before oomguard's checkpoint at 10.5s";
        assert!(cut.title.contains(named), "{}", cut.title);
        // Sample lines without role figures (an older oomguard's log): the
        // rate comes from the lists, to the last, and its window is its
        // last seconds.
        let bare: Vec<String> = (log.lines())
            .map(|l| match l.split_once(r#","roles":["#) {
                Some((head, tail)) => format!("{head}{}", &tail[tail.find(']').unwrap() + 1..]),
                None => l.to_string(),
            })
            .collect();
        let (lists, _) = growing_trainer(&bare.join("\n"));
        assert!(lists.title.contains("over its last"), "{}", lists.title);
        let end = (lists.numbers.iter()).find(|c| c.name == "growth_window_end_seconds");
        assert!(end.is_none(), "{}", lists.title);
    }

    #[test]
    fn pages_shared_with_workers_that_exit_are_not_a_trainer_leak() {
        // A 600 MiB data set read at start-up; workers fork at 7 s (the
        // trainer's USS falls to 270 MiB, its RSS stays), copy until 14 s,
        // and exit at 15 s: its pages are its own again. The last 10 s
        // begin before the fork, so USS ends where it began and rose at
        // the end, with no byte allocated.
        let mut uss: Vec<u64> = vec![40, 250, 450, 600, 600, 600];
        uss.extend([270, 280, 290, 300, 310, 320, 330, 345, 600, 600]);
        let rss: Vec<u64> = (0..uss.len())
            .map(|i| if i < 6 { uss[i] } else { 600 })
            .collect();
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python","train.py"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            4096 * MIB
        )];
        for (s, (u, r)) in uss.iter().zip(&rss).enumerate() {
            let (u, r) = (u * MIB, r * MIB);
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{},"attempt":1,"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"pss_bytes":{u},"rss_bytes":{r}}},"procs":[{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":{r},"pss_bytes":{u},"uss_bytes":{u}}}]}}"#,
                s + 1,
                4096 * MIB - u,
                4096 * MIB
            ));
        }
        let f = diagnose(&load(&lines.join("\n")).unwrap());
        assert!(!kinds(&f).contains(&"trainer_growth"), "{:?}", kinds(&f));
    }

    #[test]
    fn a_rise_while_the_job_trained_is_not_called_a_start_up_load() {
        // Level at 200 MiB, then +8 MiB/s from 20 s to 60 s, then level
        // for 40 s: it grew while the job ran, so not "at start-up".
        let mut uss = vec![200; 20];
        uss.extend((1..=40).map(|s| 200 + 8 * s));
        uss.extend([520; 40]);
        let f = diagnose(&load(&trainer_log(&uss)).unwrap());
        let l = f.iter().find(|f| f.kind == "trainer_load").unwrap();
        assert!(!l.title.contains("start-up"), "{}", l.title);
        assert!(l.title.contains("between 20.0s and 1m 00s"), "{}", l.title);
        assert!(!l.advice.contains("read in once"), "{}", l.advice);
        assert!(l.advice.contains("while the job ran"), "{}", l.advice);
        // A restarted attempt loads again at its own start-up (100 s into
        // the run): that is a start-up load.
        let mut log = trainer_log(&[200; 99]);
        log.push('\n');
        log.push_str(
            &trainer_samples(
                2,
                99,
                200,
                &[40, 210, 380, 380, 381, 380, 379, 380, 381, 380],
            )
            .join("\n"),
        );
        let f = diagnose(&load(&log).unwrap());
        let l = f
            .iter()
            .find(|f| f.kind == "trainer_load" && f.title.contains("(200 "))
            .unwrap();
        assert!(l.title.contains("in 2 s at start-up"), "{}", l.title);
    }

    #[test]
    fn a_process_that_execs_is_measured_from_its_new_program() {
        // pid 100 is first seen as the launcher's bash (3 MiB), then as
        // python at a flat 200 MiB: no growth to report.
        let mut log = workers_log(1, 50, 0, 10, &[]);
        log = log.replacen(
            r#""pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":314572800,"pss_bytes":262144000,"uss_bytes":209715200"#,
            r#""pid":100,"ppid":1,"role":"trainer","comm":"bash","rss_bytes":4194304,"pss_bytes":3145728,"uss_bytes":3145728"#,
            1,
        );
        assert!(log.contains(r#""comm":"bash""#));
        let procs = processes(&load(&log).unwrap());
        let trainer = procs.iter().find(|p| p.pid == 100).unwrap();
        assert_eq!(trainer.comm, "python");
        assert_eq!(trainer.first_uss_bytes, 200 * MIB);
        assert!(!trainer.leaks());
        let f = diagnose(&load(&log).unwrap());
        assert!(!kinds(&f).contains(&"trainer_growth"), "{:?}", kinds(&f));
    }

    #[test]
    fn flat_workers_are_not_a_leak() {
        let log = load(&workers_log(3, 50, 0, 10, &[])).unwrap();
        let f = diagnose(&log);
        assert!(kinds(&f).contains(&"worker_flat"), "{:?}", kinds(&f));
        assert!(!kinds(&f).contains(&"worker_leak"));
        // Not a single rule: nothing to prevent, nothing fired.
        assert!(kinds(&f).contains(&"quiet"), "{:?}", kinds(&f));
    }

    /// A log of a trainer and two workers read at `(t, worker MiB)`.
    fn worker_readings(readings: &[(f64, f64)]) -> String {
        let mut lines = vec![format!(
            r#"{{{ENV},"event":"run_start","t":0,"attempt":1,"argv":["python","train.py"],"ceilings":[{{"source":"cgroup","bytes":{}}}],"policy":{{"rules":[]}}}}"#,
            1024 * MIB
        )];
        for &(t, mib) in readings {
            let w = (mib * MIB as f64) as u64;
            let procs: Vec<String> = std::iter::once(format!(
                r#"{{"pid":100,"ppid":1,"role":"trainer","comm":"python","rss_bytes":{},"pss_bytes":{},"uss_bytes":{}}}"#,
                300 * MIB,
                250 * MIB,
                200 * MIB
            ))
            .chain((101..103).map(|pid| {
                format!(
                    r#"{{"pid":{pid},"ppid":100,"role":"worker","comm":"pt_data_worker","rss_bytes":{},"pss_bytes":{},"uss_bytes":{w}}}"#,
                    w + 100 * MIB,
                    w + 30 * MIB
                )
            }))
            .collect();
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{t},"attempt":1,"headroom_bytes":{},"ceiling":{{"source":"cgroup","bytes":{}}},"tree":{{"pss_bytes":{},"rss_bytes":{}}},"procs":[{}]}}"#,
                600 * MIB,
                1024 * MIB,
                400 * MIB,
                700 * MIB,
                procs.join(",")
            ));
        }
        lines.join("\n")
    }

    fn drift(f: &[Finding]) -> Option<f64> {
        let flat = f.iter().find(|f| f.kind == "worker_flat")?;
        flat.numbers
            .iter()
            .find(|c| c.name == "max_growth_bytes_per_second")
            .map(|c| c.value)
    }

    #[test]
    fn flat_workers_cite_a_drift_only_where_their_readings_support_one() {
        // Caught starting by the first lists (every 60 s after the first
        // 10 s), then level: a least-squares slope (+3.5 MiB/min), not a
        // drift.
        let start = [(2.0, 14.0), (5.0, 18.0), (10.0, 20.0), (60.0, 20.0)];
        let log = load(&worker_readings(&start)).unwrap();
        let f = diagnose(&log);
        assert!(kinds(&f).contains(&"worker_flat"), "{:?}", kinds(&f));
        assert_eq!(drift(&f), None);
        // The HTML's process table says the same: too few readings ("—").
        let html = crate::tools::report::html::render_html(&log, &f);
        let cells = |pid: &str| {
            let row = html
                .split("<tr>")
                .find(|r| r.contains(&format!(">{pid}</td>")))?;
            row.split(r#"<td class="num">"#)
                .nth(6)
                .map(|c| c.split('<').next().unwrap_or("").to_string())
        };
        assert_eq!(cells("101").as_deref(), Some("—"), "{html}");
        // Level for 20 readings with allocator noise: flat, no drift.
        let noisy: Vec<(f64, f64)> = (0..20)
            .map(|i| (f64::from(i), 20.0 + f64::from(i % 3) * 0.3))
            .collect();
        let f = diagnose(&load(&worker_readings(&noisy)).unwrap());
        assert_eq!(drift(&f), None, "{:?}", kinds(&f));
        // A steady 0.25 MiB/s over 20 readings (5 MiB: under a leak's
        // 8 MiB): the drift the readings support.
        let rising: Vec<(f64, f64)> = (0..20)
            .map(|i| (f64::from(i), 20.0 + f64::from(i) * 0.25))
            .collect();
        let log = load(&worker_readings(&rising)).unwrap();
        let f = diagnose(&log);
        let d = drift(&f).map(|d| d / MIB as f64);
        assert!(
            d.is_some_and(|d| (d - 0.25).abs() < 0.01),
            "{d:?} {:?}",
            kinds(&f)
        );
        let html = crate::tools::report::html::render_html(&log, &f);
        assert!(html.contains(r#"<td class="num">256 KiB/s</td>"#), "{html}");
        let noisy = load(&worker_readings(&noisy)).unwrap();
        let html = crate::tools::report::html::render_html(&noisy, &diagnose(&noisy));
        assert!(html.contains(r#"<td class="num">flat</td>"#), "{html}");
    }

    #[test]
    fn fragmentation_advises_expandable_segments() {
        let e = |body: &str| format!(r#"{{{ENV},"event":"cuda_oom","t":5,"attempt":1,{body}}}"#);
        let log = load(&workers_log(
            1,
            10,
            0,
            3,
            &[
                e(r#""device":"0","tried_bytes":2147483648,"reserved_unallocated_bytes":3221225472,"allocated_bytes":1,"total_bytes":4"#),
                e(r#""device":"1","tried_bytes":2147483648,"reserved_bytes":3000,"allocated_bytes":2000,"total_bytes":4000"#),
            ],
        ))
        .unwrap();
        let f = diagnose(&log);
        let frag = f.iter().find(|f| f.kind == "fragmentation").unwrap();
        assert!(frag.advice.contains("expandable_segments:True"));
        assert!(frag.advice.contains("3.0 GiB"), "{}", frag.advice);
        let full = f.iter().find(|f| f.kind == "cuda_oom").unwrap();
        assert!(!full.advice.contains("expandable_segments"));
        assert!(full.title.contains("GPU 1"));
    }

    #[test]
    fn progress_gives_growth_per_step_and_steps_lost_per_restart() {
        let l = |event: &str, t: u32, attempt: u32, p: &str| {
            format!(r#"{{{ENV},"event":"{event}","t":{t},"attempt":{attempt},"progress":{{{p}}}}}"#)
        };
        let text = [
            l("sample", 1, 1, r#""step":100,"total":2000,"epoch":"1","phase":"train","steps_per_second":9.4,"bytes_per_step":1572864,"ceiling_step":1240"#),
            l("restart", 2, 2, r#""step":533,"total":2000,"epoch":"1","phase":"train","steps_per_second":9.4"#),
            l("sample", 3, 2, r#""step":500,"total":2000,"epoch":"1","phase":"train","steps_per_second":null"#),
        ]
        .join("\n");
        let log = load(&text).unwrap();
        let f = diagnose(&log);
        let titles: Vec<_> = f.iter().map(|f| f.title.as_str()).collect();
        assert!(
            titles.contains(&"memory grows 1.5 MiB per training step, so the ceiling is reached near step 1240 of 2000"),
            "{titles:?}"
        );
        assert!(
            titles.contains(&"attempt 2 resumed at step 500: 33 steps recomputed"),
            "{titles:?}"
        );
    }

    #[test]
    fn a_failed_rank_is_tied_to_the_oom_kill_of_its_pid_and_a_phase_flag_is_shown() {
        let e = |event: &str, t: u32, body: &str| {
            format!(r#"{{{ENV},"event":"{event}","t":{t},"attempt":1,{body}}}"#)
        };
        let log = load(&workers_log(
            2,
            10,
            0,
            3,
            &[
                e(
                    "phase_memory",
                    4,
                    r#""phase":"validation","epoch":"2","before_bytes":3221225472,"added_bytes":838860800,"advice":"validation adds 800 MiB: are predictions or outputs being accumulated?""#,
                ),
                // torchrun's message comes before oomguard reads the
                // kernel's report: the tie is made on the whole log.
                e(
                    "rank_failed",
                    5,
                    r#""rank":1,"local_rank":1,"pid":4242,"exit_code":-9,"signal":"SIGKILL","oom_killed":false,"advice":[]"#,
                ),
                e(
                    "rank_failed",
                    5,
                    r#""rank":3,"pid":77,"exit_code":1,"advice":["look at rank 3's traceback"]"#,
                ),
                e(
                    "oom_kill",
                    6,
                    r#""pid":4242,"comm":"python","role":"trainer","anon_rss_bytes":1073741824"#,
                ),
            ],
        ))
        .unwrap();
        let f = diagnose(&log);
        let titles: Vec<_> = f.iter().map(|f| f.title.as_str()).collect();
        assert!(
            titles.contains(&"Rank 1 (pid 4242) was killed by the kernel OOM killer at 5.0s"),
            "{titles:?}"
        );
        let other = f.iter().find(|f| f.title.starts_with("Rank 3")).unwrap();
        assert_eq!(other.severity, Severity::Warning);
        assert!(
            other.title.contains("failed with exit code 1"),
            "{}",
            other.title
        );
        assert_eq!(other.advice, "look at rank 3's traceback");
        let phase = f.iter().find(|f| f.kind == "phase_memory").unwrap();
        assert_eq!(phase.title, "Validation adds 800 MiB in epoch 2");
        assert!(phase.advice.contains("accumulated"), "{}", phase.advice);

        let text = crate::tools::report::text::render_text(&log, &f);
        assert!(
            text.contains("rank 1 (pid 4242) was killed by the kernel OOM killer"),
            "{text}"
        );
        assert!(
            text.contains("validation adds 800 MiB (epoch 2, from 3.0 GiB)"),
            "{text}"
        );
        let html = crate::tools::report::html::render_html(&log, &f);
        assert!(html.contains("Rank 1 (pid 4242) was killed by the kernel OOM killer"));
        assert!(html.contains("Validation adds 800 MiB in epoch 2"));
        let svg = crate::tools::report::svg::timeline(&log);
        assert!(
            svg.contains(r#"data-event="rank_failed""#),
            "no rank marker"
        );
        assert!(
            svg.contains(r#"data-event="phase_memory""#),
            "no phase marker"
        );
    }

    #[test]
    fn bus_error_points_at_dev_shm_and_sigkill_at_the_oom_killer() {
        let e = |body: &str| format!(r#"{{{ENV},"event":"worker_died","t":5,"attempt":1,{body}}}"#);
        let log = load(&workers_log(
            2,
            10,
            0,
            3,
            &[
                e(r#""pid":101,"signal":"SIGBUS","shm_hint":true"#),
                e(r#""pid":102,"signal":"SIGKILL","shm_hint":false"#),
            ],
        ))
        .unwrap();
        let f = diagnose(&log);
        let shm = f.iter().find(|f| f.kind == "shm").unwrap();
        assert!(shm.advice.contains("/dev/shm"));
        assert!(shm.title.contains("101"));
        let k = f.iter().find(|f| f.kind == "worker_killed").unwrap();
        assert!(k.title.contains("102"));
    }

    #[test]
    fn oom_kill_without_policy_and_swap_as_early_warning() {
        let mut extra = Vec::new();
        for s in 11..=20u64 {
            extra.push(format!(
                r#"{{{ENV},"event":"sample","t":{s},"attempt":1,"tree":{{"pss_bytes":1}},"system":{{"swap_used_bytes":{},"swap_in_bytes_per_s":1048576}}}}"#,
                (s - 10) * 50 * MIB
            ));
        }
        extra.push(format!(
            r#"{{{ENV},"event":"oom_kill","t":21,"attempt":1,"pid":103,"comm":"python","role":"worker","anon_rss_bytes":{}}}"#,
            300 * MIB
        ));
        extra.push(format!(
            r#"{{{ENV},"event":"run_end","t":22,"attempt":1,"outcome":"oom_killed","exit_code":137}}"#
        ));
        let log = load(&workers_log(3, 20, 5, 10, &extra)).unwrap();
        let f = diagnose(&log);
        let k = kinds(&f);
        assert_eq!(&k[..2], ["oom_kill", "not_prevented"], "{k:?}");
        assert!(
            f[0].title.contains("pid 103 (python, worker)"),
            "{}",
            f[0].title
        );
        assert!(f[1].title.contains("No policy"), "{}", f[1].title);
        let swap = f.iter().find(|f| f.kind == "swap_growth").unwrap();
        assert!(swap.title.contains("450 MiB"), "{}", swap.title);
        assert!(
            swap.advice.contains("before the kernel OOM kill"),
            "{}",
            swap.advice
        );
        assert!(!k.contains(&"no_run_end"));
    }

    #[test]
    fn prevention_is_reported_with_the_actions() {
        let ev = |t: u32, body: &str| {
            format!(
                r#"{{{ENV},"event":"{}","t":{t},"attempt":1,{body}}}"#,
                if body.contains("\"action\"") {
                    "action"
                } else {
                    "rule"
                }
            )
        };
        let log = load(&workers_log(
            2,
            20,
            5,
            10,
            &[
                ev(8, r#""rule":"critical","value":7.5,"threshold":8,"state":"firing""#),
                ev(8, r#""action":"stop","reason":"critical","pids":[100],"signal":"SIGTERM","result":"ok""#),
                format!(r#"{{{ENV},"event":"run_end","t":12,"attempt":1,"outcome":"stopped_by_policy","exit_code":75}}"#),
            ],
        ))
        .unwrap();
        let f = diagnose(&log);
        let p = f.iter().find(|f| f.kind == "prevented").unwrap();
        assert_eq!(p.severity, Severity::Ok);
        assert!(
            p.advice.contains("stop at 8.0s (rule critical)"),
            "{}",
            p.advice
        );
        assert!(p.advice.contains("stopped by policy"), "{}", p.advice);
    }

    /// A stop in a log cut short (oomguard killed, or still running) is
    /// not claimed as a prevention: a kill after the last line would not
    /// be in the log.
    #[test]
    fn a_stop_in_a_log_without_run_end_claims_nothing() {
        let log = load(&workers_log(
            2,
            20,
            5,
            10,
            &[format!(
                r#"{{{ENV},"event":"action","t":8,"attempt":1,"action":"stop","reason":"critical","pids":[100],"signal":"SIGTERM","result":"ok"}}"#
            )],
        ))
        .unwrap();
        let f = diagnose(&log);
        let p = f.iter().find(|f| f.kind == "prevented").unwrap();
        assert_eq!(p.severity, Severity::Info);
        assert!(p.title.contains("ends before the run did"), "{}", p.title);
        assert!(!p.title.contains("prevented"), "{}", p.title);
    }

    #[test]
    fn every_finding_cites_numbers_and_a_missing_run_end_is_noted() {
        let log = load(&workers_log(2, 20, 5, 5, &[])).unwrap();
        let f = diagnose(&log);
        assert!(kinds(&f).contains(&"no_run_end"));
        for x in &f {
            assert!(!x.numbers.is_empty(), "{} cites nothing", x.kind);
            assert!(!x.advice.is_empty());
        }
        assert!(f.windows(2).all(|w| w[0].severity <= w[1].severity));
    }

    #[test]
    fn growing_shared_memory_is_reported_as_batches_in_flight() {
        // Flat private memory; the shared part grows from 100 to 300 MiB.
        let mut lines = Vec::new();
        for s in 0..6u64 {
            let shared = (100 + 40 * s) * MIB;
            lines.push(format!(
                r#"{{{ENV},"event":"sample","t":{s},"attempt":1,"tree":{{"pss_bytes":{}}},"procs":[{{"pid":1,"role":"trainer","pss_bytes":{},"uss_bytes":{}}},{{"pid":2,"role":"worker","pss_bytes":{},"uss_bytes":{}}}]}}"#,
                400 * MIB + shared,
                300 * MIB + shared / 2,
                300 * MIB,
                100 * MIB + shared / 2,
                100 * MIB
            ));
        }
        let log = load(&lines.join("\n")).unwrap();
        let f = diagnose(&log);
        let p = f.iter().find(|f| f.kind == "prefetch").unwrap();
        assert!(p.advice.contains("from 100 MiB to 300 MiB"), "{}", p.advice);
        let share = p
            .numbers
            .iter()
            .find(|c| c.name == "prefetch_share_percent")
            .unwrap();
        // 200 MiB of a 700 MiB PSS sum.
        assert!((share.value - 200.0 / 7.0).abs() < 0.5, "{}", share.value);
        assert!(!kinds(&f).contains(&"worker_leak"));
    }

    #[test]
    fn rates() {
        assert_eq!(rate_text(4.0 * MIB as f64), "4.0 MiB/s");
        assert_eq!(rate_text(1000.0), "3.4 MiB/h");
        assert_eq!(rate_text(-2048.0 * 1024.0), "-2.0 MiB/s");
        assert_eq!(rate_text(0.0), "0 B/s");
    }

    #[test]
    fn proc_names() {
        assert_eq!(
            proc_name(Some(5), Some("py"), Some("worker")),
            "pid 5 (py, worker)"
        );
        assert_eq!(proc_name(Some(5), None, None), "pid 5");
        assert_eq!(proc_name(None, None, None), "a process");
        assert_eq!(proc_name(None, Some("py"), None), "py");
    }
}
