//! The `/dev/shm` finding: how full the tmpfs DataLoader workers pass
//! batches through became when it was a ceiling, and, when it came near
//! full, which of two causes: shared memory that grew with the steps
//! (batches or outputs the trainer keeps alive: a leak) or a steady use the
//! size cannot hold (the batches in flight: a size to raise, or fewer
//! workers × prefetch).

use super::finding::{Cited, Finding, Severity};
use super::run_log::{RunLog, SamplePoint};
use crate::vocab::model::ShmSample;
use crate::vocab::units::HumanBytes;

/// Above this share of its size, `/dev/shm` was near full: a cause is named.
const NEAR_FULL_PERCENT: f64 = 75.0;
/// A rise over the run of at least this share of the size is growth.
const GROWTH_SHARE: f64 = 0.25;

pub fn shm_use(log: &RunLog, out: &mut Vec<Finding>) {
    let pts: Vec<(&SamplePoint, ShmSample)> = (log.samples.iter())
        .filter_map(|s| {
            let shm = s.shm?;
            shm.is_ceiling(s.mem_total_bytes.unwrap_or(0))
                .then_some((s, shm))
        })
        .collect();
    let Some(&(_, peak)) = pts.iter().max_by_key(|(_, s)| s.used_bytes) else {
        return;
    };
    let size = peak.size_bytes.max(1);
    let share = peak.used_bytes as f64 / size as f64 * 100.0;
    let mut numbers = vec![
        Cited::bytes("shm_size_bytes", "/dev/shm size", peak.size_bytes),
        Cited::bytes("shm_peak_bytes", "/dev/shm peak use", peak.used_bytes),
        Cited::percent("shm_peak_percent", "peak share of /dev/shm", share),
    ];
    let of = format!(
        "{} of {} ({share:.0}%)",
        HumanBytes(peak.used_bytes),
        HumanBytes(peak.size_bytes)
    );
    if share < NEAR_FULL_PERCENT {
        out.push(Finding {
            kind: "shm_use",
            severity: Severity::Info,
            title: format!("/dev/shm peaked at {of}"),
            advice: "The batches DataLoader workers had in flight fit in /dev/shm with room \
                     to spare."
                .into(),
            numbers,
        });
        return;
    }
    // The rise from the first quarter of the run to its end: batches kept
    // alive add up; batches in flight fill it at once and stay.
    let (t0, t1) = (pts[0].0.t, pts[pts.len() - 1].0.t);
    let quarter = t0 + (t1 - t0) / 4.0;
    let early = (pts.iter())
        .filter(|(s, _)| s.t <= quarter)
        .map(|(_, m)| m.used_bytes)
        .max()
        .unwrap_or(0);
    let rise = peak.used_bytes.saturating_sub(early);
    let per_step = per_step_growth(log, &pts);
    if rise as f64 >= GROWTH_SHARE * size as f64 {
        let step_text = per_step.map_or_else(String::new, |b| {
            numbers.push(Cited::bytes(
                "shm_growth_per_step_bytes",
                "growth per step",
                b,
            ));
            format!(", {} per training step", HumanBytes(b))
        });
        numbers.push(Cited::bytes(
            "shm_rise_bytes",
            "rise after the first quarter",
            rise,
        ));
        out.push(Finding {
            kind: "shm_leak",
            severity: Severity::Warning,
            title: format!("/dev/shm filled as training went on: {of}"),
            advice: format!(
                "Shared memory grew by {} after the first quarter of the run{step_text}: \
                 batches (or outputs computed from them) kept alive by the trainer hold \
                 the shared-memory segments their workers made. Keep only what you need, \
                 detached and copied out (loss.item(), t.detach().clone()), or drop the \
                 references; a larger /dev/shm only delays the failure.",
                HumanBytes(rise)
            ),
            numbers,
        });
    } else {
        out.push(Finding {
            kind: "shm_too_small",
            severity: Severity::Warning,
            title: format!("/dev/shm is too small for the batches in flight: {of}"),
            advice: format!(
                "Shared memory held steady near {}: the batches DataLoader workers keep in \
                 flight (num_workers × prefetch_factor batches) need about that much, and \
                 /dev/shm holds {}. Give it more room (docker run --shm-size=…, or \
                 --ipc=host; on Kubernetes a larger emptyDir with medium: Memory at \
                 /dev/shm), or lower num_workers × prefetch_factor.",
                HumanBytes(peak.used_bytes),
                HumanBytes(peak.size_bytes)
            ),
            numbers,
        });
    }
}

/// Shared-memory growth per training step: the rise between the first and
/// the last reading that came with a step, up to the peak, over the steps
/// between them. None when the steps read do not go forward with time (a
/// bar and the companion disagreeing): no figure rather than a wrong one.
fn per_step_growth(log: &RunLog, pts: &[(&SamplePoint, ShmSample)]) -> Option<u64> {
    let step_at = |t: f64, attempt: u32| {
        (log.progress.iter())
            .filter(|p| p.attempt == attempt && p.t <= t)
            .filter_map(|p| p.step)
            .next_back()
    };
    let peak_t = pts.iter().max_by_key(|(_, m)| m.used_bytes)?.0.t;
    let with_step: Vec<(u64, u64)> = (pts.iter())
        .filter(|(s, _)| s.t <= peak_t)
        .filter_map(|(s, m)| Some((step_at(s.t, s.attempt)?, m.used_bytes)))
        .collect();
    if with_step.windows(2).any(|w| w[1].0 < w[0].0) {
        return None;
    }
    let (&(s0, b0), &(s1, b1)) = (with_step.first()?, with_step.last()?);
    (s1 > s0 && b1 > b0).then(|| (b1 - b0) / (s1 - s0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::report::load::load;

    const MIB: u64 = 1 << 20;
    const ENV: &str = r#""schema":"oomguard/1","ts":"2026-01-01T00:00:00.000Z""#;

    /// A log of `used` MiB of a 64 MiB /dev/shm, one sample a second, the
    /// job at step `i` at sample `i`.
    fn shm_log(used: &[u64]) -> RunLog {
        let lines: Vec<String> = (used.iter().enumerate())
            .map(|(i, u)| {
                format!(
                    r#"{{{ENV},"event":"sample","t":{i},"attempt":1,"progress":{{"step":{i}}},"tree":{{"pss_bytes":1}},"system":{{"mem_total_bytes":{}}},"shm":{{"size_bytes":{},"used_bytes":{}}}}}"#,
                    16u64 << 30,
                    64 * MIB,
                    u * MIB
                )
            })
            .collect();
        load(&lines.join("\n")).unwrap()
    }

    fn finding(used: &[u64]) -> Finding {
        let mut out = Vec::new();
        shm_use(&shm_log(used), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        out.remove(0)
    }

    #[test]
    fn batches_kept_alive_are_a_leak_with_their_growth_per_step() {
        let f = finding(&[8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60]);
        assert_eq!(f.kind, "shm_leak");
        assert!(
            f.title.contains("60.0 MiB of 64.0 MiB (94%)"),
            "{}",
            f.title
        );
        assert!(
            f.advice.contains("4.0 MiB per training step"),
            "{}",
            f.advice
        );
    }

    #[test]
    fn a_steady_use_too_large_for_the_size_says_which_sizes_to_change() {
        let f = finding(&[50, 58, 57, 58, 58, 57, 58, 58, 58, 57]);
        assert_eq!(f.kind, "shm_too_small");
        assert!(f.advice.contains("--shm-size") && f.advice.contains("prefetch_factor"));
    }

    #[test]
    fn half_full_is_said_with_its_share() {
        let f = finding(&[20, 30, 31, 30, 30]);
        assert_eq!((f.kind, f.severity), ("shm_use", Severity::Info));
        assert!(
            f.title.contains("31.0 MiB of 64.0 MiB (48%)"),
            "{}",
            f.title
        );
    }

    #[test]
    fn a_default_sized_dev_shm_is_memory_not_a_finding() {
        // 8 GiB of a 16 GiB machine: the kernel's default.
        let line = format!(
            r#"{{{ENV},"event":"sample","t":1,"attempt":1,"tree":{{"pss_bytes":1}},"system":{{"mem_total_bytes":{}}},"shm":{{"size_bytes":{},"used_bytes":{}}}}}"#,
            16u64 << 30,
            8u64 << 30,
            7u64 << 30
        );
        let mut out = Vec::new();
        shm_use(&load(&line).unwrap(), &mut out);
        assert!(out.is_empty(), "{out:?}");
    }
}
