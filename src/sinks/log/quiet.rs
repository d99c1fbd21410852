//! Which sample lines a steady run may leave out of the log. A day of a
//! node whose memory does not move is 86,400 lines saying the same thing;
//! once an attempt is [`QUIET_AFTER`] intervals old, the log keeps one in
//! [`QUIET_EVERY`] of those, and every line where a figure a reader acts
//! on moved ([`LineMark::moved_from`]). Lines with a
//! rule or action, a process list, progress, or a rule waiting are never
//! left out (the caller decides those), so `replay` sees every reading that
//! led to a decision, and the report every list.

use crate::vocab::model::{CeilingSource, Sample, View};

/// A steady run writes one sample line in this many `--interval`s.
pub const QUIET_EVERY: u32 = 10;

/// ...once an attempt has run this many `--interval`s (ten minutes at
/// defaults): a short run, and the start of every run, where the report
/// tells start-up load from growth and copy-on-write from a leak, keep
/// every line; a day loses nothing measurable to it.
pub const QUIET_AFTER: u32 = 600;

/// A memory figure moved when it changed by this much (or by
/// [`MOVED_SHARE`] of itself, whichever is larger) since the last line.
const MOVED_BYTES: u64 = 4 << 20;
const MOVED_SHARE: f64 = 0.005;
/// PSI's 10 s average moved by this many points.
const MOVED_PSI: f64 = 1.0;
/// An ETA shorter than this is written every interval: the run is heading
/// for a ceiling within the hour.
const NEAR_ETA_SECONDS: f64 = 3600.0;

/// What a line said, for the next one to be compared with.
#[derive(Debug, Clone, PartialEq)]
pub struct LineMark {
    source: Option<CeilingSource>,
    headroom_bytes: Option<u64>,
    footprint_bytes: u64,
    procs: u32,
    cgroup_bytes: Option<u64>,
    swap_used_bytes: u64,
    swapping: bool,
    psi_some: Option<f64>,
    oom_kills: (Option<u64>, Option<u64>),
    gpu_bytes: Vec<u64>,
    shm_used_bytes: Option<u64>,
    eta_near: bool,
}

impl LineMark {
    pub fn of(sample: &Sample, view: &View) -> Self {
        Self {
            source: view.nearest.map(|n| n.ceiling.source),
            headroom_bytes: view.headroom_bytes(),
            footprint_bytes: sample.tree.footprint_bytes,
            procs: sample.tree.procs,
            cgroup_bytes: sample.cgroup.as_ref().map(|c| c.usage_bytes),
            swap_used_bytes: sample.system.swap_used_bytes,
            swapping: sample.system.swap_in_bytes_per_s > 0.0
                || sample.system.swap_out_bytes_per_s > 0.0,
            psi_some: sample.psi.map(|p| p.some_avg10),
            oom_kills: (
                sample.system.oom_kill_total,
                sample.cgroup.as_ref().and_then(|c| c.oom_kill_count),
            ),
            gpu_bytes: sample.gpus.iter().map(|g| g.used_bytes).collect(),
            shm_used_bytes: sample.shm.map(|s| s.used_bytes),
            eta_near: view.eta_seconds.is_some_and(|e| e < NEAR_ETA_SECONDS),
        }
    }

    /// Whether this line says something `last` did not: a figure moved,
    /// something appeared or went, or a ceiling is near.
    pub fn moved_from(&self, last: &LineMark) -> bool {
        let bytes = |a: u64, b: u64| {
            let d = a.abs_diff(b);
            d >= MOVED_BYTES && d as f64 >= MOVED_SHARE * a.max(b) as f64
        };
        let opt_bytes = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => bytes(a, b),
            (a, b) => a.is_some() != b.is_some(),
        };
        self.eta_near
            || self.swapping
            || self.source != last.source
            || self.procs != last.procs
            || self.oom_kills != last.oom_kills
            || self.gpu_bytes.len() != last.gpu_bytes.len()
            || opt_bytes(self.headroom_bytes, last.headroom_bytes)
            || bytes(self.footprint_bytes, last.footprint_bytes)
            || opt_bytes(self.cgroup_bytes, last.cgroup_bytes)
            || opt_bytes(self.shm_used_bytes, last.shm_used_bytes)
            || bytes(self.swap_used_bytes, last.swap_used_bytes)
            || self.eta_near != last.eta_near
            || match (self.psi_some, last.psi_some) {
                (Some(a), Some(b)) => (a - b).abs() >= MOVED_PSI,
                (a, b) => a.is_some() != b.is_some(),
            }
            || (self.gpu_bytes.iter())
                .zip(&last.gpu_bytes)
                .any(|(&a, &b)| bytes(a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::model::{Ceiling, CeilingState, Psi};

    fn at(footprint: u64, headroom: u64) -> (Sample, View) {
        let mut s = Sample::default();
        s.tree.footprint_bytes = footprint;
        s.psi = Some(Psi {
            some_avg10: 0.0,
            full_avg10: 0.0,
        });
        let v = View {
            t: 0.0,
            nearest: Some(CeilingState {
                ceiling: Ceiling {
                    source: CeilingSource::Budget,
                    bytes: 8 << 30,
                },
                used_bytes: (8 << 30) - headroom,
                headroom_bytes: headroom,
            }),
            eta_seconds: None,
            headroom_slope: None,
            fastest: None,
        };
        (s, v)
    }

    #[test]
    fn jitter_is_steady_and_a_move_or_a_near_ceiling_is_not() {
        let gib = 1u64 << 30;
        let (s, v) = at(gib, 7 * gib);
        let last = LineMark::of(&s, &v);
        // A few pages either way: the same line.
        let (s2, v2) = at(gib + (300 << 10), 7 * gib - (300 << 10));
        assert!(!LineMark::of(&s2, &v2).moved_from(&last));
        // 4 MiB of a 1 GiB footprint is under half a percent: steady.
        let (s3, v3) = at(gib + (4 << 20), 7 * gib);
        assert!(!LineMark::of(&s3, &v3).moved_from(&last));
        // 64 MiB more: moved.
        let (s4, v4) = at(gib + (64 << 20), 7 * gib - (64 << 20));
        assert!(LineMark::of(&s4, &v4).moved_from(&last));
        // Pressure, a process more, a kill, a near ETA: each is news.
        let (mut s5, v5) = at(gib, 7 * gib);
        s5.psi = Some(Psi {
            some_avg10: 2.5,
            full_avg10: 0.0,
        });
        assert!(LineMark::of(&s5, &v5).moved_from(&last));
        let (mut s6, v6) = at(gib, 7 * gib);
        s6.tree.procs += 1;
        assert!(LineMark::of(&s6, &v6).moved_from(&last));
        let (mut s7, v7) = at(gib, 7 * gib);
        s7.system.oom_kill_total = Some(1);
        assert!(LineMark::of(&s7, &v7).moved_from(&last));
        let (s8, mut v8) = at(gib, 7 * gib);
        v8.eta_seconds = Some(1800.0);
        assert!(LineMark::of(&s8, &v8).moved_from(&last));
        v8.eta_seconds = Some(5.0 * 3600.0);
        assert!(!LineMark::of(&s8, &v8).moved_from(&last));
    }
}
