//! Whether memory is still growing: the one definition of *continuing
//! growth* versus a *plateau* that every growth estimate reads — the ETA,
//! the fastest grower, the GPU ETA — and that the report uses to tell a
//! one-off ramp (a data set or checkpoint loaded, a cache filled once) from
//! a leak.
//!
//! A trend (least squares over the last 10 s) says how fast memory has been
//! growing; it cannot say whether it still is: a ramp that ended a second
//! ago still tilts it for seconds. So each estimate is gated on the newest
//! readings:
//!
//! **Growth continues at a reading** when, over its last two intervals (the
//! newest three readings), memory rose by more than [`FLOOR_BYTES`] *and*
//! by at least [`KEEP_UP`] of what the trend predicts for that span.
//! Otherwise memory is on a **plateau** (or falling, or levelling off), and
//! the estimate reads "no growth".
//!
//! - Two intervals, not one: one flat tick in a real leak (a worker waiting
//!   on I/O) does not hide it, and growth that ended is forgotten two ticks
//!   later whatever the tick length — near a ceiling that is 40 ms.
//! - The floor is counter noise: the kernel charges a cgroup in per-CPU
//!   batches of 64 pages, and allocators keep and return slack.
//! - The share of the trend is what makes it robust to allocator noise on a
//!   plateau: right after a fast ramp the trend is steep, so noise must
//!   match it to count, and by the time the trend has flattened, an ETA
//!   from it is long anyway.

/// Rise (bytes) over the last two intervals below which memory is flat.
pub const FLOOR_BYTES: f64 = (1u64 << 20) as f64;

/// Share of the trend's predicted rise that the newest readings must show
/// for growth to be continuing (below it, growth is levelling off).
pub const KEEP_UP: f64 = 0.5;

/// Readings the gate looks at: the newest and two before it.
pub const TAIL: usize = 3;

/// Whether growth continues at the last of `tail` (readings `(t, bytes)`,
/// oldest first; only the last [`TAIL`] are read), given the trend's rate in
/// bytes/s. Fewer than two readings, or no time between them: not growing.
pub fn continuing(tail: &[(f64, f64)], trend_rate: f64) -> bool {
    let n = tail.len();
    if n < 2 {
        return false;
    }
    let (t0, v0) = tail[n.saturating_sub(TAIL)];
    let (t1, v1) = tail[n - 1];
    let span = t1 - t0;
    if span <= 0.0 {
        return false;
    }
    let rise = v1 - v0;
    rise > FLOOR_BYTES && rise >= KEEP_UP * trend_rate.max(0.0) * span
}

/// The newest [`TAIL`] readings of one series, as a tick loop sees them.
#[derive(Debug, Clone, Default)]
pub struct Tail {
    points: Vec<(f64, f64)>,
}

impl Tail {
    pub fn push(&mut self, t: f64, bytes: f64) {
        if self.points.last().is_some_and(|&(last, _)| t < last) {
            self.points.clear();
        }
        if self.points.len() == TAIL {
            self.points.remove(0);
        }
        self.points.push((t, bytes));
    }

    pub fn clear(&mut self) {
        self.points.clear();
    }

    /// [`continuing`] over these readings.
    pub fn continuing(&self, trend_rate: f64) -> bool {
        continuing(&self.points, trend_rate)
    }
}

/// Ordinary least-squares slope of y over x; `None` for fewer than two
/// distinct x values.
pub fn least_squares_slope(points: impl Iterator<Item = (f64, f64)> + Clone) -> Option<f64> {
    let (mut n, mut sx, mut sy) = (0.0, 0.0, 0.0);
    for (x, y) in points.clone() {
        n += 1.0;
        sx += x;
        sy += y;
    }
    if n < 2.0 {
        return None;
    }
    let (mx, my) = (sx / n, sy / n);
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, y) in points {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
    }
    if sxx <= f64::EPSILON {
        None
    } else {
        Some(sxy / sxx)
    }
}

/// Seconds until `remaining` bytes are used up at the trend of `series`
/// (`(t, bytes used)`, oldest first, already cut to the trend's window),
/// or `None` unless growth [`continuing`] at its newest readings.
pub fn eta(series: &[(f64, f64)], remaining: f64) -> Option<f64> {
    let rate = least_squares_slope(series.iter().copied())?;
    (rate > 0.0 && continuing(series, rate)).then(|| (remaining / rate).max(0.0))
}

/// How a whole series of readings moved, for findings after the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// No growth beyond noise.
    Flat,
    /// Grew, then stopped: a one-off load. `bytes` gained from the first
    /// reading to the peak, over `seconds` from the first reading to the
    /// time the peak was first reached within [`FLOOR_BYTES`].
    Ramp { bytes: f64, seconds: f64 },
    /// Still growing at its last reading, at the trend's rate (bytes/s).
    Growing { rate: f64 },
}

/// Classifies `series` (`(t, bytes)`, oldest first) by the same rule the
/// policy uses: growing when growth [`continuing`] at the last reading over
/// the trend of the last `window` seconds; else a ramp when it rose, flat
/// when it did not.
pub fn shape(series: &[(f64, f64)], window: f64) -> Shape {
    let Some(&(t_last, _)) = series.last() else {
        return Shape::Flat;
    };
    let recent = series
        .iter()
        .copied()
        .filter(|&(t, _)| t_last - t <= window);
    let rate = least_squares_slope(recent).unwrap_or(0.0);
    if rate > 0.0 && continuing(series, rate) {
        return Shape::Growing { rate };
    }
    let (t0, v0) = series[0];
    let peak = series.iter().map(|p| p.1).fold(f64::MIN, f64::max);
    if peak - v0 <= FLOOR_BYTES {
        return Shape::Flat;
    }
    let reached = series
        .iter()
        .find(|&&(_, v)| v >= peak - FLOOR_BYTES)
        .map_or(t_last, |p| p.0);
    Shape::Ramp {
        bytes: peak - v0,
        seconds: reached - t0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = (1u64 << 20) as f64;

    #[test]
    fn growth_that_ended_is_forgotten_after_two_readings() {
        // 100 MiB/s, then flat: the first flat reading still spans growth,
        // the second does not.
        let pts = [(0.0, 0.0), (1.0, 100.0 * MIB), (2.0, 200.0 * MIB)];
        assert!(continuing(&pts, 100.0 * MIB));
        let pts = [(1.0, 100.0 * MIB), (2.0, 200.0 * MIB), (3.0, 200.0 * MIB)];
        assert!(continuing(&pts, 100.0 * MIB));
        let pts = [(2.0, 200.0 * MIB), (3.0, 200.0 * MIB), (4.0, 200.0 * MIB)];
        assert!(!continuing(&pts, 100.0 * MIB));
    }

    #[test]
    fn noise_on_a_plateau_after_a_steep_trend_is_not_growth() {
        // Right after a fast load the trend is steep: 3 MiB of allocator
        // noise over 2 s is far below half of what it predicts.
        let pts = [
            (10.0, 800.0 * MIB),
            (11.0, 801.0 * MIB),
            (12.0, 803.0 * MIB),
        ];
        assert!(!continuing(&pts, 80.0 * MIB));
        // Under the floor, whatever the trend.
        let pts = [(10.0, 0.0), (10.02, 0.4 * MIB), (10.04, 0.9 * MIB)];
        assert!(!continuing(&pts, 0.0));
    }

    #[test]
    fn a_burst_after_a_flat_trend_is_growth_at_once() {
        let pts = [(5.0, 500.0 * MIB), (5.1, 530.0 * MIB), (5.2, 560.0 * MIB)];
        assert!(continuing(&pts, 1.0 * MIB));
    }

    #[test]
    fn slowing_growth_is_levelling_off() {
        // Trend 100 MiB/s, the newest two seconds 20 MiB/s.
        let pts = [(8.0, 900.0 * MIB), (9.0, 920.0 * MIB), (10.0, 940.0 * MIB)];
        assert!(!continuing(&pts, 100.0 * MIB));
    }

    #[test]
    fn eta_is_none_two_readings_after_growth_ends() {
        // A GPU filling 100 MiB/s, 1 GiB left, then flat.
        let mut series: Vec<(f64, f64)> = (0..5)
            .map(|i| (f64::from(i), f64::from(i) * 100.0 * MIB))
            .collect();
        let eta = eta(&series, 1024.0 * MIB).unwrap();
        assert!((eta - 10.24).abs() < 1e-6, "{eta}");
        series.push((5.0, 400.0 * MIB));
        assert!(super::eta(&series, 1024.0 * MIB).is_some());
        series.push((6.0, 400.0 * MIB));
        assert_eq!(super::eta(&series, 1024.0 * MIB), None);
    }

    #[test]
    fn tail_keeps_three_and_resets_on_time_going_back() {
        let mut t = Tail::default();
        for i in 0..5 {
            t.push(f64::from(i), f64::from(i) * 10.0 * MIB);
        }
        assert!(t.continuing(10.0 * MIB));
        t.push(0.0, 0.0);
        assert!(!t.continuing(0.0));
    }

    #[test]
    fn shapes_of_a_load_a_leak_and_flat_memory() {
        let load: Vec<(f64, f64)> = (0..20)
            .map(|i| (f64::from(i), f64::from(i.min(3)) * 100.0 * MIB))
            .collect();
        assert_eq!(
            shape(&load, 10.0),
            Shape::Ramp {
                bytes: 300.0 * MIB,
                seconds: 3.0
            }
        );
        let leak: Vec<(f64, f64)> = (0..20)
            .map(|i| (f64::from(i), f64::from(i) * 5.0 * MIB))
            .collect();
        match shape(&leak, 10.0) {
            Shape::Growing { rate } => assert!((rate - 5.0 * MIB).abs() < 1.0),
            other => panic!("{other:?}"),
        }
        let flat: Vec<(f64, f64)> = (0..20).map(|i| (f64::from(i), 50.0 * MIB)).collect();
        assert_eq!(shape(&flat, 10.0), Shape::Flat);
        assert_eq!(shape(&[], 10.0), Shape::Flat);
    }
}
