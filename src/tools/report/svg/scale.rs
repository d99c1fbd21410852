//! Where things go on the picture: the scales from time and bytes to SVG
//! units, round axis steps and their labels, the policy's thresholds as
//! levels under the ceiling, and what the memory panel's scale must show.
//! Kept apart from the panels so the numbers can be checked on their own.

use std::fmt::Write;

use super::style::{GRID, INK, ML, MUTED, OFF_SCALE, PW, esc};
use crate::sinks::log::ActionKind;
use crate::tools::report::run_log::{RunLog, SamplePoint};
use crate::vocab::units::HumanBytes;

/// A headroom threshold of the policy, drawn relative to the ceiling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Threshold {
    /// Headroom of H% left: usage at (100 − H)% of the ceiling.
    Percent(f64),
    /// Headroom of B bytes left.
    Bytes(f64),
}

impl Threshold {
    pub(super) fn level(self, ceiling: f64) -> f64 {
        match self {
            Threshold::Percent(h) => ceiling * (1.0 - h / 100.0),
            Threshold::Bytes(b) => (ceiling - b).max(0.0),
        }
    }

    pub(super) fn label(self) -> String {
        match self {
            Threshold::Percent(h) => format!("{:.0}% of ceiling", 100.0 - h),
            Threshold::Bytes(b) => format!("ceiling − {}", HumanBytes(b as u64)),
        }
    }
}

/// The warn and critical headroom thresholds from `run_start.policy`: for
/// each, the rule that fires first (most headroom left).
pub(super) fn thresholds(log: &RunLog) -> (Option<Threshold>, Option<Threshold>) {
    let Some(start) = &log.start else {
        return (None, None);
    };
    let mut warn: Option<Threshold> = None;
    let mut crit: Option<Threshold> = None;
    for r in &start.rules {
        let Some(v) = r.threshold else { continue };
        if r.op.as_deref().is_some_and(|op| op.contains('>')) {
            continue;
        }
        let unit = r.unit.as_deref().unwrap_or("");
        let th = match r.metric.as_str() {
            "headroom_percent" => Threshold::Percent(v),
            "headroom" if unit == "%" || unit == "percent" => Threshold::Percent(v),
            "headroom_bytes" | "headroom" => Threshold::Bytes(v),
            _ => continue,
        };
        let slot = match r.action {
            ActionKind::Warn => &mut warn,
            a if a.is_decisive() => &mut crit,
            _ => continue,
        };
        // The first to fire is the one with more headroom; compare levels
        // on a nominal ceiling since units may differ.
        let better = slot.is_none_or(|old| th.level(1e12) < old.level(1e12));
        if better {
            *slot = Some(th);
        }
    }
    (warn, crit)
}

/// Keeps at most two samples (the lowest and highest footprint) per pixel
/// column, so a day-long log stays a small picture and the peaks the policy
/// saw are never lost.
pub(super) fn decimate<'a>(samples: &[&'a SamplePoint], t0: f64, t1: f64) -> Vec<&'a SamplePoint> {
    if samples.len() <= (PW as usize) * 2 {
        return samples.to_vec();
    }
    let span = (t1 - t0).max(1e-9);
    let mut out: Vec<&SamplePoint> = Vec::new();
    let mut bucket: Vec<&SamplePoint> = Vec::new();
    let mut key = None;
    let flush = |bucket: &mut Vec<&'a SamplePoint>, out: &mut Vec<&'a SamplePoint>| {
        let lo = bucket.iter().enumerate().min_by_key(|(_, s)| s.footprint());
        let hi = bucket.iter().enumerate().max_by_key(|(_, s)| s.footprint());
        if let (Some((i, a)), Some((j, b))) = (lo, hi) {
            match i.cmp(&j) {
                std::cmp::Ordering::Less => out.extend([*a, *b]),
                std::cmp::Ordering::Greater => out.extend([*b, *a]),
                std::cmp::Ordering::Equal => out.push(*a),
            }
        }
        bucket.clear();
    };
    for s in samples {
        let k = (((s.t - t0) / span) * PW).floor() as i64;
        if key.is_some_and(|old| old != k) {
            flush(&mut bucket, &mut out);
        }
        key = Some(k);
        bucket.push(s);
    }
    flush(&mut bucket, &mut out);
    out
}

/// A "nice" axis step (1, 2, 2.5, 5 × 10^k) for about `target` ticks.
pub(super) fn nice_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// Byte axis: the unit for the labels and a step in bytes.
pub(super) fn byte_axis(max: f64) -> (f64, &'static str, f64) {
    let (unit, name) = if max >= f64::from(1u32 << 30) {
        (f64::from(1u32 << 30), "GiB")
    } else if max >= 2.0 * f64::from(1u32 << 20) {
        (f64::from(1u32 << 20), "MiB")
    } else {
        (1024.0, "KiB")
    };
    let step = nice_step(max / unit, 5.0) * unit;
    (unit, name, step)
}

pub(super) fn byte_label(v: f64, unit: f64, name: &str) -> String {
    let x = v / unit;
    if v == 0.0 {
        "0".to_string()
    } else if (x - x.round()).abs() < 1e-6 {
        format!("{x:.0} {name}")
    } else {
        // Steps of 0.25 need two decimals; 0.5 needs one.
        let t = format!("{x:.2}");
        format!("{} {name}", t.trim_end_matches('0'))
    }
}

/// Time axis step in seconds: round human durations.
pub(super) fn time_step(span: f64) -> f64 {
    const STEPS: [f64; 22] = [
        0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0,
        1800.0, 3600.0, 7200.0, 10800.0, 21600.0, 43200.0, 86400.0, 172800.0,
    ];
    let raw = span / 9.0;
    STEPS
        .iter()
        .copied()
        .find(|s| *s >= raw)
        .unwrap_or(raw.ceil())
}

pub(super) struct Frame {
    pub(super) t0: f64,
    pub(super) t1: f64,
}

impl Frame {
    pub(super) fn x(&self, t: f64) -> f64 {
        ML + (t - self.t0) / (self.t1 - self.t0).max(1e-9) * PW
    }
}

pub(super) struct YScale {
    pub(super) top: f64,
    pub(super) h: f64,
    pub(super) max: f64,
}

impl YScale {
    pub(super) fn y(&self, v: f64) -> f64 {
        self.top + self.h - (v / self.max).clamp(0.0, 1.2) * self.h
    }
}

/// A polyline path over `(t, value)` points, broken (new `M`) where
/// `breaks` says a new segment starts.
pub(super) fn line_path(frame: &Frame, y: &YScale, pts: &[(f64, f64, bool)]) -> String {
    let mut d = String::new();
    for (i, (t, v, brk)) in pts.iter().enumerate() {
        let cmd = if i == 0 || *brk { 'M' } else { 'L' };
        let _ = write!(d, "{cmd}{:.1},{:.1}", frame.x(*t), y.y(*v));
    }
    d
}

/// A step path (value holds until the next point), as a ceiling behaves.
pub(super) fn step_path(frame: &Frame, y: &YScale, pts: &[(f64, f64)], end: f64) -> String {
    let mut d = String::new();
    let mut last: Option<f64> = None;
    for (t, v) in pts {
        match last {
            None => {
                let _ = write!(d, "M{:.1},{:.1}", frame.x(*t), y.y(*v));
            }
            Some(prev) if (prev - v).abs() > 0.5 => {
                let _ = write!(
                    d,
                    "L{:.1},{:.1}L{:.1},{:.1}",
                    frame.x(*t),
                    y.y(prev),
                    frame.x(*t),
                    y.y(*v)
                );
            }
            Some(_) => {}
        }
        last = Some(*v);
    }
    if let Some(v) = last {
        let _ = write!(d, "L{:.1},{:.1}", frame.x(end), y.y(v));
    }
    d
}

/// The memory panel's scale and what fits on it.
pub(super) struct MemScale {
    /// `(t, bytes)` of the nearest ceiling, where it changed.
    pub(super) ceilings: Vec<(f64, f64)>,
    pub(super) ceiling_max: f64,
    pub(super) rss_max: f64,
    pub(super) has_swap: bool,
    pub(super) rss_on_scale: bool,
    pub(super) ceiling_on_scale: bool,
    pub(super) warn: Option<Threshold>,
    pub(super) crit: Option<Threshold>,
    pub(super) unit: f64,
    pub(super) unit_name: &'static str,
    pub(super) step: f64,
    pub(super) ymax: f64,
}

pub(super) fn mem_scale(
    log: &RunLog,
    samples_all: &[&SamplePoint],
    samples: &[&SamplePoint],
    t0: f64,
) -> MemScale {
    let pss_max = samples_all
        .iter()
        .map(|s| s.pss_bytes.max(s.footprint()))
        .max()
        .unwrap_or(0) as f64;
    let rss_max = samples_all.iter().map(|s| s.rss_bytes).max().unwrap_or(0) as f64;
    let swap_max = samples_all
        .iter()
        .filter_map(|s| s.swap_used_bytes)
        .max()
        .unwrap_or(0) as f64;
    let ceilings: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| s.ceiling.as_ref().map(|c| (s.t, c.bytes as f64)))
        .collect();
    let ceilings = if ceilings.is_empty() {
        log.start
            .as_ref()
            .and_then(|s| s.ceilings.iter().map(|c| c.bytes).min())
            .map(|b| vec![(t0, b as f64)])
            .unwrap_or_default()
    } else {
        ceilings
    };
    let ceiling_max = ceilings.iter().map(|c| c.1).fold(0.0, f64::max);
    let ceiling_min = ceilings.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
    let (warn, crit) = thresholds(log);
    // What the scale must show: the footprint and swap; then the RSS sum
    // and the ceiling, each unless it would squash the rest flat.
    let mut base = pss_max.max(swap_max).max(1.0);
    let with_rss = if rss_max <= base * OFF_SCALE {
        base.max(rss_max)
    } else {
        base
    };
    let ceiling_on_scale = ceiling_max > 0.0 && ceiling_min <= with_rss * OFF_SCALE;
    if ceiling_on_scale {
        base = base.max(ceiling_max);
    }
    let rss_on_scale = rss_max <= base * OFF_SCALE;
    let top_value = if rss_on_scale {
        base.max(rss_max)
    } else {
        base
    };
    let (unit, unit_name, step) = byte_axis(top_value * 1.06);
    let ymax = ((top_value * 1.06) / step).ceil() * step;
    MemScale {
        ceilings,
        ceiling_max,
        rss_max,
        has_swap: swap_max > 0.0,
        rss_on_scale,
        ceiling_on_scale,
        warn,
        crit,
        unit,
        unit_name,
        step,
        ymax,
    }
}

pub(super) fn y_axis(
    svg: &mut String,
    y: &YScale,
    unit: f64,
    unit_name: &str,
    step: f64,
    title: &str,
) {
    let _ = write!(svg, r#"<g class="y-axis" font-size="11.5" fill="{MUTED}">"#);
    let mut v = 0.0;
    for _ in 0..100 {
        if v > y.max + step * 1e-6 {
            break;
        }
        let yy = y.y(v);
        let _ = write!(
            svg,
            r#"<line x1="{ML}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="{GRID}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            ML + PW,
            ML - 8.0,
            yy + 4.0,
            esc(&byte_label(v, unit, unit_name))
        );
        v += step;
    }
    let cy = y.top + y.h / 2.0;
    let _ = write!(
        svg,
        r#"<text x="16" y="{cy:.1}" transform="rotate(-90 16 {cy:.1})" text-anchor="middle" font-size="12" fill="{INK}">{}</text></g>"#,
        esc(title)
    );
}
