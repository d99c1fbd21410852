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

/// The middle value (the lower of the two middle ones); 0 for none.
pub fn lower_median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

/// Mann–Kendall z from which a trend's direction is taken as sure: about
/// one flat series in 700 reads as growing by chance, and a series needs 7
/// readings, every one above those before it, to reach it.
pub const SURE_Z: f64 = 3.0;

/// How far ahead the live ETA looks. Its trend is the last 10 s: carried
/// further than an hour it is a guess, and on a flat job the guess is
/// hours of allocator noise ("ETA 5h 47m"). A slow leak's long view is the
/// growth per training step and the step it would reach the ceiling at.
pub const ETA_HORIZON_SECONDS: f64 = 3600.0;

/// An ETA under this is given on the least-squares trend alone: a burst
/// toward the ceiling is acted on before its readings are many enough to
/// be sure of (the policy's `critical-eta` fires under 10 s). A longer one
/// is given only when the window's readings rose for sure
/// ([`Trend::z`] ≥ [`SURE_Z`]).
pub const ETA_UNSURE_SECONDS: f64 = 60.0;

/// A rate with what it rests on: the Theil–Sen slope, and the Mann–Kendall
/// statistic of the same pairs, which says how sure its direction is (the
/// share of pairs that rose against those that fell, against what chance
/// gives for that many readings). The pair is the usual one for a trend in
/// noisy readings: neither assumes the noise is normal, and one reading far
/// off moves neither.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trend {
    /// y per unit of x.
    pub slope: f64,
    /// The Mann–Kendall z (positive: rising).
    pub z: f64,
    /// The x the readings span.
    pub span: f64,
    /// The interquartile range of the readings about the slope (of
    /// `y − slope·x`): their noise, in y.
    pub spread: f64,
}

impl Trend {
    /// The trend of `points` (`(x, y)`, any order of x); `None` for fewer
    /// than two distinct x values.
    pub fn of(points: &[(f64, f64)]) -> Option<Trend> {
        let n = points.len();
        let mut slopes = Vec::with_capacity(n * n.saturating_sub(1) / 2);
        let mut s: f64 = 0.0;
        for (i, &(x0, y0)) in points.iter().enumerate() {
            for &(x1, y1) in &points[i + 1..] {
                if x1 != x0 {
                    let slope = (y1 - y0) / (x1 - x0);
                    slopes.push(slope);
                    if slope > 0.0 {
                        s += 1.0;
                    } else if slope < 0.0 {
                        s -= 1.0;
                    }
                }
            }
        }
        if slopes.is_empty() {
            return None;
        }
        let mid = (slopes.len() - 1) / 2;
        let (_, &mut slope, _) = slopes.select_nth_unstable_by(mid, f64::total_cmp);
        let nf = n as f64;
        let sd = (nf * (nf - 1.0) * (2.0 * nf + 5.0) / 18.0).sqrt();
        // The continuity correction: S moves in steps of 2.
        let z = (s - s.signum()) / sd;
        let (lo, hi) = points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.0), hi.max(p.0))
        });
        let mut level: Vec<f64> = points.iter().map(|&(x, y)| y - slope * x).collect();
        level.sort_by(f64::total_cmp);
        let spread = level[(3 * (n - 1)) / 4] - level[(n - 1) / 4];
        Some(Trend {
            slope,
            z,
            span: hi - lo,
            spread,
        })
    }

    /// Whether the readings rose (or fell) for sure, and by the slope over
    /// their span by more than `floor` and than twice their noise: a
    /// figure rests on it. Noise lines up now and then (allocator noise of
    /// 1–4 MiB on a plateau read "+12.8 MiB/min" over 15 readings with
    /// both cores busy); it does not outgrow itself.
    pub fn sure(&self, floor: f64) -> bool {
        let rise = (self.slope * self.span).abs();
        self.z.abs() >= SURE_Z && rise > floor && rise > 2.0 * self.spread
    }
}

/// What a growth figure shows: a number only where the readings support
/// one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Figure {
    /// Too few readings, or too short a span, to tell ("…"); or a rise
    /// whose pace changed in its newest readings, too few to read the new
    /// pace from.
    Unknown,
    /// No growth or fall that the readings are sure of, or growth that has
    /// stopped at the newest readings ("flat").
    Flat,
    /// Bytes per second, rising or falling.
    Rate(f64),
}

impl Figure {
    /// The rate, where there is one.
    pub fn rate(self) -> Option<f64> {
        match self {
            Figure::Rate(r) => Some(r),
            Figure::Flat | Figure::Unknown => None,
        }
    }
}

/// The seconds `series` (`(t, …)`, oldest first) spans.
fn span(series: &[(f64, f64)]) -> f64 {
    match (series.first(), series.last()) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0.0,
    }
}

/// The growth figure of a series of readings `(t, bytes)`, oldest first:
/// unknown with [`SURE_POINTS`] readings or fewer, or under `min_span`
/// seconds; else the rate of the longest of the whole series, its newest
/// half and its newest quarter (at least twice [`SURE_POINTS`] readings)
/// that has a [`sure_rate`]; else flat, or unknown where the shortest
/// tried still rose, slower than its trend ([`Verdict::Slowed`]). The
/// shorter stretches speak when the window holds two regimes: a load or a
/// fork's jump and then a steady rise (the whole window's slope is the
/// jump's), or a long flat stretch and then a
/// leak that began seconds ago (too few rising pairs for the whole to be
/// sure, and a slope that lags the leak's).
pub fn figure(series: &[(f64, f64)], min_span: f64) -> Figure {
    let n = series.len();
    if n <= SURE_POINTS || span(series) < min_span {
        return Figure::Unknown;
    }
    // A quarter at least: a few readings of allocator noise line up by
    // chance more often than the z says (measured: "-48.4 MiB/min" once
    // in 30 screens of a plateau when stretches went down to 7 readings).
    let shortest = (n / 4).max(2 * SURE_POINTS).min(n);
    let mut len = n;
    loop {
        match sure_rate(&series[n - len..]) {
            Verdict::Sure(rate) => return Figure::Rate(rate),
            // No stretch left that is short enough to read the slower pace
            // from: a rise it cannot state is not flat (a leak stopped at
            // its budget had halved its pace in its last 2 s, beside other
            // work, and read flat over its 13 readings).
            Verdict::Slowed if len == shortest => return Figure::Unknown,
            _ if len == shortest => return Figure::Flat,
            _ => {}
        }
        len = (len / 2).max(shortest);
    }
}

/// What [`sure_rate`] finds in a stretch of readings.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// A rate that holds over the whole stretch.
    Sure(f64),
    /// A rate that held, but the newest quarter moved, beyond its noise,
    /// at less than [`KEEP_UP`] of it: growth that slowed, not stopped.
    Slowed,
    /// No rate.
    None,
}

/// The slope of `series` ([`Verdict::Sure`]) when its [`Trend`] is sure,
/// moved more than [`FLOOR_BYTES`], and its newer half's middle reading
/// moved from its older half's by [`KEEP_UP`] to 1/[`KEEP_UP`] times what
/// the slope predicts: a load at start-up followed by a plateau (or a
/// worker's exit followed by a level) has none once the plateau holds the older half's
/// middle, and a leak that sped up is read from its newer readings.
/// Unlike [`continuing`], a slow rise (a worker's 4 MiB a minute) need
/// not pass the floor within two ticks to count.
fn sure_rate(series: &[(f64, f64)]) -> Verdict {
    let Some(trend) = Trend::of(series) else {
        return Verdict::None;
    };
    // The halves' middles: a stair (an allocator taking 16 MiB every 16
    // steps) or one reading far off moves neither, where the newest few
    // readings alone would read a stair's flat top as growth ended.
    let middle = |half: &[(f64, f64)]| {
        let x = lower_median(half.iter().map(|p| p.0).collect());
        let y = lower_median(half.iter().map(|p| p.1).collect());
        (x, y)
    };
    let (older, newer) = series.split_at(series.len() / 2);
    let ((x0, y0), (x1, y1)) = (middle(older), middle(newer));
    // In the trend's direction: a fall is held to it as a rise is.
    let predicted = (trend.slope * (x1 - x0)).abs();
    let moved = (y1 - y0) * trend.slope.signum();
    let on_line = x1 > x0 && moved >= KEEP_UP * predicted && moved <= predicted / KEEP_UP;
    // And the newer half sure of the same direction on its own: a load's
    // few readings at the start of a window tilt its slope and lift its
    // z, and with noise that lined up a plateau read "+16.7 MiB/min" with
    // both cores busy.
    // (Asked once it has the readings to be: a fast leak's run may have
    // only 8 readings at which its step moved.)
    let newer_sure = newer.len() < SURE_POINTS
        || Trend::of(newer).is_some_and(|h| h.sure(FLOOR_BYTES) && h.slope * trend.slope > 0.0);
    // And not stopped: the newest quarter (and the reading before it, so
    // that a stair a quarter long still shows its rise) moved at all, by
    // its range, which one reading far off cannot hide. A job paused 20 s
    // ago read "+1.1 GiB/min" on the halves alone.
    let recent = &series[series.len() - (series.len() / 4 + 1).max(TAIL)..];
    let (lo, hi) = recent.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    let recent_span = recent[recent.len() - 1].0 - recent[0].0;
    let moving = hi - lo >= KEEP_UP * trend.slope.abs() * recent_span;
    if !(trend.sure(FLOOR_BYTES) && on_line && newer_sure) {
        Verdict::None
    } else if moving {
        Verdict::Sure(trend.slope)
    } else if hi - lo > FLOOR_BYTES.max(2.0 * trend.spread) {
        Verdict::Slowed
    } else {
        Verdict::None
    }
}

/// The fewest readings with which [`SURE_Z`] can be reached; a figure
/// needs one more, and once its newer half has as many, that half must
/// reach it too.
pub const SURE_POINTS: usize = 7;

/// Seconds until `remaining` bytes are used up at the trend of `series`
/// (`(t, bytes used)`, oldest first, already cut to the trend's window),
/// or `None` unless growth [`continuing`] at its newest readings.
pub fn eta(series: &[(f64, f64)], remaining: f64) -> Option<f64> {
    let rate = least_squares_slope(series.iter().copied())?;
    let span = series.last()?.0 - series.first()?.0;
    if !(rate > 0.0 && continuing(series, rate)) {
        return None;
    }
    keep_eta((remaining / rate).max(0.0), rate, span, || series.to_vec())
}

/// `eta` (seconds, from a trend of `rate` bytes/s over `span` seconds),
/// when it is given: the trend moved more than [`FLOOR_BYTES`] over its
/// span (less is counter and allocator noise, whatever its slope), the
/// ceiling is within [`ETA_HORIZON_SECONDS`], and one of
/// [`ETA_UNSURE_SECONDS`] or more rests on readings (`used`, `(t, bytes
/// used)`, made only then) that rose for sure: allocator noise on a
/// plateau tilts the least-squares line enough for an ETA of 55 min now
/// and then; it does not line up its readings. The live ETA and the GPU
/// ETA both go through it.
pub fn keep_eta(
    eta: f64,
    rate: f64,
    span: f64,
    used: impl FnOnce() -> Vec<(f64, f64)>,
) -> Option<f64> {
    let given = rate * span > FLOOR_BYTES && eta <= ETA_HORIZON_SECONDS;
    let sure = || Trend::of(&used()).is_some_and(|t| t.z > 0.0 && t.sure(FLOOR_BYTES));
    (given && (eta < ETA_UNSURE_SECONDS || sure())).then_some(eta)
}

/// Seconds of a process's newest readings behind the growth figure every
/// surface gives for it (the dashboard's column and `fastest`, the
/// report's rate for a growing trainer): one window, so one rate.
pub const FIGURE_WINDOW_SECONDS: f64 = 60.0;

/// At most one reading a second in a figure's series: near a ceiling ticks
/// come every 20 ms, and the figure's pairs grow with the square of its
/// readings.
pub const FIGURE_GAP_SECONDS: f64 = 1.0;

/// Adds `(t, bytes)` to a figure's series, oldest first: the newest reading
/// replaces the one before it when that came within
/// [`FIGURE_GAP_SECONDS`] of the reading before it (measured from there,
/// not from the newest: against the newest, fast ticks would replace it
/// forever); readings older than [`FIGURE_WINDOW_SECONDS`] leave (two
/// stay). Returns whether the newest was replaced.
pub fn keep_for_figure(
    series: &mut std::collections::VecDeque<(f64, f64)>,
    t: f64,
    bytes: f64,
) -> bool {
    if series.back().is_some_and(|&(last, _)| t < last) {
        series.clear();
    }
    let n = series.len();
    let replace = n > 1 && t - series[n - 2].0 < FIGURE_GAP_SECONDS;
    if replace {
        series.pop_back();
    }
    series.push_back((t, bytes));
    while series
        .front()
        .is_some_and(|&(old, _)| t - old > FIGURE_WINDOW_SECONDS)
        && series.len() > 2
    {
        series.pop_front();
    }
    replace
}

/// The figure a whole series ends with, as a surface that followed it
/// reading by reading shows it: its newest [`FIGURE_WINDOW_SECONDS`], a
/// reading a second ([`keep_for_figure`]). With the seconds it spans.
pub fn newest_figure(series: &[(f64, f64)], min_span: f64) -> (Figure, f64) {
    let mut kept = std::collections::VecDeque::new();
    for &(t, b) in series {
        keep_for_figure(&mut kept, t, b);
    }
    let kept: Vec<(f64, f64)> = kept.into();
    (figure(&kept, min_span), span(&kept))
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
    fn the_newest_figure_is_the_dashboards_last_minute() {
        // Ticks every 20 ms for 2 minutes: 1 MiB/s, then 3 MiB/s from 60 s.
        let series: Vec<(f64, f64)> = (0..6000)
            .map(|i| {
                let t = f64::from(i) * 0.02;
                (t, MIB * (t + 2.0 * (t - 60.0).max(0.0)))
            })
            .collect();
        let (fig, span) = newest_figure(&series, 0.0);
        let Figure::Rate(r) = fig else {
            panic!("{fig:?}")
        };
        assert!((r / MIB - 3.0).abs() < 0.01, "{} MiB/s", r / MIB);
        assert!((59.0..=60.0).contains(&span), "{span}");
        // A reading a second: the figure's pairs stay few.
        let mut kept = std::collections::VecDeque::new();
        for &(t, b) in &series {
            keep_for_figure(&mut kept, t, b);
        }
        assert!((60..=62).contains(&kept.len()), "{}", kept.len());
        // Too few readings: no figure.
        assert_eq!(newest_figure(&series[..150], 0.0).0, Figure::Unknown);
    }

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

    /// A load-plateau's readings: 3 s of loading 200 MiB/s, then flat with
    /// 1–4 MiB of allocator noise (`benches/shapes.py`'s `load_plateau`).
    fn load_then_noise(seconds: u32) -> Vec<(f64, f64)> {
        let noise = [0.0, 3.0, 1.0, 4.0, 0.0, 2.0, 1.0, 3.5, 0.5, 2.5, 1.5];
        (0..=seconds)
            .map(|i| {
                let level = f64::from(i.min(3)) * 200.0 * MIB;
                (f64::from(i), level + noise[i as usize % noise.len()] * MIB)
            })
            .collect()
    }

    #[test]
    fn a_load_then_noise_is_flat_and_a_steady_leak_is_its_rate() {
        for seconds in [16, 25, 60] {
            assert_eq!(
                figure(&load_then_noise(seconds), 5.0),
                Figure::Flat,
                "{seconds}"
            );
        }
        let leak: Vec<(f64, f64)> = (0..30)
            .map(|i| {
                (
                    f64::from(i),
                    f64::from(i) * 2.0 * MIB + (i % 3) as f64 * 0.5 * MIB,
                )
            })
            .collect();
        let Figure::Rate(r) = figure(&leak, 5.0) else {
            panic!("{:?}", figure(&leak, 5.0));
        };
        assert!((r / MIB - 2.0).abs() < 0.1, "{}", r / MIB);
        // Seven readings are too few.
        assert_eq!(figure(&leak[..7], 5.0), Figure::Unknown);
    }

    #[test]
    fn after_a_jump_the_figure_is_the_rise_since() {
        // 20 s flat, a fork's 160 MiB, then 1 MiB/s: the newest third's
        // rate, not the jump spread over the window nor flat.
        let series: Vec<(f64, f64)> = (0..=40)
            .map(|i| {
                let t = f64::from(i);
                let v = if i < 20 {
                    0.0
                } else {
                    160.0 * MIB + (t - 20.0) * MIB
                };
                (t, v)
            })
            .collect();
        assert_eq!(figure(&series, 5.0), Figure::Rate(MIB));
        // A leak that began 8 s ago after 50 s of flat readings.
        let late: Vec<(f64, f64)> = (0..=58)
            .map(|i| (f64::from(i), f64::from(i.max(50) - 50) * 3.0 * MIB))
            .collect();
        match figure(&late, 5.0) {
            Figure::Rate(r) => assert!((2.0 * MIB..=3.0 * MIB).contains(&r), "{}", r / MIB),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_rise_that_slowed_with_no_shorter_stretch_to_read_is_unknown_not_flat() {
        // 13 readings a second: 64 MiB/s, then 28 from the tenth (a leak
        // beside other work); no stretch of 14 to read the newer pace from.
        let slowed: Vec<(f64, f64)> = (0..13)
            .map(|i| {
                let t = f64::from(i);
                (t, 64.0 * MIB * t.min(9.0) + 28.0 * MIB * (t - 9.0).max(0.0))
            })
            .collect();
        assert_eq!(figure(&slowed, 5.0), Figure::Unknown);
        // Stopped instead: flat.
        let stopped: Vec<(f64, f64)> = (0..13)
            .map(|i| (f64::from(i), 64.0 * MIB * f64::from(i.min(9))))
            .collect();
        assert_eq!(figure(&stopped, 5.0), Figure::Flat);
        // And at an even pace, its rate.
        let even: Vec<(f64, f64)> = (0..13)
            .map(|i| (f64::from(i), 64.0 * MIB * f64::from(i)))
            .collect();
        assert_eq!(figure(&even, 5.0), Figure::Rate(64.0 * MIB));
    }

    #[test]
    fn the_direction_is_sure_only_with_enough_agreeing_pairs() {
        let rising: Vec<(f64, f64)> = (0..7).map(|i| (f64::from(i), f64::from(i))).collect();
        let t = Trend::of(&rising).unwrap();
        assert!(t.z >= SURE_Z && t.slope == 1.0, "{t:?}");
        assert!(!Trend::of(&rising[..6]).unwrap().sure(0.0));
        // Sure of the direction, but under the floor over its span.
        assert!(!t.sure(FLOOR_BYTES));
        let falling: Vec<(f64, f64)> = rising.iter().map(|&(x, y)| (x, -y * MIB)).collect();
        assert!(Trend::of(&falling).unwrap().z <= -SURE_Z);
    }

    #[test]
    fn an_eta_needs_a_rise_above_noise_and_a_ceiling_within_the_horizon() {
        let rising = || {
            (0..10)
                .map(|i| (f64::from(i), f64::from(i) * 2.0 * MIB))
                .collect()
        };
        // 44 KiB/s over 10 s (allocator noise on a plateau): no ETA.
        assert_eq!(keep_eta(30.0, 44.0 * 1024.0, 10.0, rising), None);
        // 2 MiB/s: an ETA within the hour, none beyond it.
        assert_eq!(keep_eta(3000.0, 2.0 * MIB, 10.0, rising), Some(3000.0));
        assert_eq!(
            keep_eta(ETA_HORIZON_SECONDS + 1.0, 2.0 * MIB, 10.0, rising),
            None
        );
        // Past a minute, noise that does not line up gives none.
        let noise = || {
            (0..10)
                .map(|i| (f64::from(i), f64::from(i % 3) * MIB))
                .collect()
        };
        assert_eq!(keep_eta(3000.0, 2.0 * MIB, 10.0, noise), None);
        assert_eq!(keep_eta(30.0, 2.0 * MIB, 10.0, noise), Some(30.0));
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
