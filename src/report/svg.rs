//! The timeline picture: one inline SVG with the memory panel (PSS stacked
//! by role, the PSS and RSS sums, swap, the ceiling and the policy's
//! thresholds), a GPU panel when GPUs were watched, and a numbered marker
//! per event.
//!
//! Styling is in presentation attributes, not CSS, so the SVG looks the same
//! when cut out of the page. Every series is a `<g>` with a stable `id`
//! (`series-pss-worker`, `series-ceiling`, `series-gpu-0`, …) and every
//! marker a `<g class="marker marker-EVENT" id="marker-N">`: tests and
//! users' scripts can find them. Colours are the Okabe–Ito palette, which
//! stays distinguishable with the common colour-vision deficiencies, and
//! every colour is backed by a shape, dash pattern or label.

use std::fmt::Write;

use super::load::{Event, EventKind, RunLog, SamplePoint};
use super::text::event_summary;
use crate::model::Role;
use crate::units::HumanBytes;

/// Width of the drawing in SVG units; the page scales it to its column.
const W: f64 = 1136.0;
const ML: f64 = 78.0;
/// Right gutter: the labels of the ceiling and threshold lines.
const MR: f64 = 118.0;
const PW: f64 = W - ML - MR;
const MEM_H: f64 = 330.0;
const GPU_H: f64 = 150.0;
const PANEL_GAP: f64 = 30.0;
const LANE_H: f64 = 22.0;
const MAX_LANES: usize = 3;
const MARKER_R: f64 = 8.0;
/// Ceilings and RSS sums this many times above the footprint would squash
/// the interesting part flat; they are noted instead of drawn.
const OFF_SCALE: f64 = 2.5;

const INK: &str = "#1f2430";
const MUTED: &str = "#5b6473";
const GRID: &str = "#e4e7ec";
const FONT: &str = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Noto Sans', 'Liberation Sans', 'DejaVu Sans', Arial, sans-serif";

/// Stack order, bottom to top: the trainer is the stable base, the workers'
/// growth shows on top of it.
const STACK: [Role; 4] = [Role::Trainer, Role::Worker, Role::Other, Role::Launcher];

fn role_colour(r: Role) -> &'static str {
    match r {
        Role::Trainer => "#0072B2",
        Role::Worker => "#E69F00",
        Role::Other => "#CC79A7",
        Role::Launcher => "#8c8c8c",
    }
}

const GPU_COLOURS: [&str; 6] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
];
const SWAP: &str = "#009E73";
const CEILING: &str = "#D55E00";
const WARN: &str = "#A86F00";

/// Marker style per event: fill, text colour, shape.
fn marker_style(kind: &EventKind) -> (&'static str, &'static str, Shape) {
    match kind {
        EventKind::Rule { state, .. } if state == "cleared" => ("#ffffff", "#8a5a00", Shape::Up),
        EventKind::Rule { .. } => ("#E69F00", "#1a1a1a", Shape::Up),
        EventKind::Action { .. } => ("#0072B2", "#ffffff", Shape::Square),
        EventKind::Restart { .. } => ("#009E73", "#ffffff", Shape::Circle),
        EventKind::OomKill { .. } => ("#D55E00", "#ffffff", Shape::Diamond),
        EventKind::CudaOom { .. } => ("#CC79A7", "#1a1a1a", Shape::Hexagon),
        EventKind::WorkerDied { .. } => ("#2b2b2b", "#ffffff", Shape::Down),
        EventKind::ChildExit { .. } => ("#8c8c8c", "#ffffff", Shape::Circle),
        EventKind::RankFailed(r) if r.oom_killed => ("#D55E00", "#ffffff", Shape::Down),
        EventKind::RankFailed(_) => ("#7a3b00", "#ffffff", Shape::Down),
        EventKind::PhaseMemory(_) => ("#56B4E9", "#1a1a1a", Shape::Square),
        EventKind::CheckpointDone { .. } => ("#009E73", "#1a1a1a", Shape::Up),
    }
}

#[derive(Clone, Copy)]
enum Shape {
    Up,
    Down,
    Square,
    Circle,
    Diamond,
    Hexagon,
}

fn shape_path(shape: Shape, cx: f64, cy: f64, r: f64) -> String {
    let pts: Vec<(f64, f64)> = match shape {
        Shape::Circle => {
            return format!(
                "M{:.1},{:.1}a{r:.1},{r:.1} 0 1,0 {:.1},0a{r:.1},{r:.1} 0 1,0 {:.1},0Z",
                cx - r,
                cy,
                2.0 * r,
                -2.0 * r
            );
        }
        Shape::Up => vec![
            (cx, cy - 1.25 * r),
            (cx + 1.15 * r, cy + 0.8 * r),
            (cx - 1.15 * r, cy + 0.8 * r),
        ],
        Shape::Down => vec![
            (cx - 1.15 * r, cy - 0.8 * r),
            (cx + 1.15 * r, cy - 0.8 * r),
            (cx, cy + 1.25 * r),
        ],
        Shape::Square => vec![
            (cx - 0.9 * r, cy - 0.9 * r),
            (cx + 0.9 * r, cy - 0.9 * r),
            (cx + 0.9 * r, cy + 0.9 * r),
            (cx - 0.9 * r, cy + 0.9 * r),
        ],
        Shape::Diamond => vec![
            (cx, cy - 1.25 * r),
            (cx + 1.2 * r, cy),
            (cx, cy + 1.25 * r),
            (cx - 1.2 * r, cy),
        ],
        Shape::Hexagon => (0..6)
            .map(|i| {
                let a = std::f64::consts::PI / 3.0 * f64::from(i);
                (cx + 1.08 * r * a.cos(), cy + 1.08 * r * a.sin())
            })
            .collect(),
    };
    let mut d = String::new();
    for (i, (x, y)) in pts.iter().enumerate() {
        let _ = write!(d, "{}{x:.1},{y:.1}", if i == 0 { "M" } else { "L" });
    }
    d.push('Z');
    d
}

/// Escapes text for XML content and attribute values.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A headroom threshold of the policy, drawn relative to the ceiling.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Threshold {
    /// Headroom of H% left: usage at (100 − H)% of the ceiling.
    Percent(f64),
    /// Headroom of B bytes left.
    Bytes(f64),
}

impl Threshold {
    fn level(self, ceiling: f64) -> f64 {
        match self {
            Threshold::Percent(h) => ceiling * (1.0 - h / 100.0),
            Threshold::Bytes(b) => (ceiling - b).max(0.0),
        }
    }

    fn label(self) -> String {
        match self {
            Threshold::Percent(h) => format!("{:.0}% of ceiling", 100.0 - h),
            Threshold::Bytes(b) => format!("ceiling − {}", HumanBytes(b as u64)),
        }
    }
}

/// The warn and critical headroom thresholds from `run_start.policy`: for
/// each, the rule that fires first (most headroom left).
fn thresholds(log: &RunLog) -> (Option<Threshold>, Option<Threshold>) {
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
        let slot = match r.action.as_str() {
            "warn" => &mut warn,
            "stop" | "pause" | "kill" | "restart" => &mut crit,
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

/// Role split of the PSS sum at each sample of one attempt.
///
/// Sample lines carry their role totals (`roles`), which are used as they
/// are. Logs from before that have only the slower per-process lists: the
/// split at a sample is then the role shares interpolated between the lists
/// around it, applied to that sample's exact PSS sum.
fn role_stack(samples: &[&SamplePoint], log: &RunLog, attempt: u32) -> Option<Vec<[f64; 4]>> {
    let exact = |s: &SamplePoint| {
        let mut sums = [0.0; 4];
        for &(role, pss) in &s.role_pss {
            if let Some(i) = STACK.iter().position(|r| *r == role) {
                sums[i] += pss as f64;
            }
        }
        sums
    };
    if !samples.is_empty() && samples.iter().all(|s| !s.role_pss.is_empty()) {
        return Some(samples.iter().map(|s| exact(s)).collect());
    }
    let snaps: Vec<(f64, [f64; 4])> = log
        .snapshots
        .iter()
        .filter(|s| s.attempt == attempt)
        .filter_map(|s| {
            let mut sums = [0.0; 4];
            for p in &s.procs {
                if let Some(i) = STACK.iter().position(|r| *r == p.role) {
                    sums[i] += p.pss_bytes as f64;
                }
            }
            let total: f64 = sums.iter().sum();
            (total > 0.0).then(|| (s.t, sums.map(|v| v / total)))
        })
        .collect();
    if snaps.is_empty() {
        return None;
    }
    Some(
        samples
            .iter()
            .map(|s| {
                if !s.role_pss.is_empty() {
                    return exact(s);
                }
                let after = snaps.iter().position(|(t, _)| *t >= s.t);
                let shares = match after {
                    Some(0) => snaps[0].1,
                    None => snaps[snaps.len() - 1].1,
                    Some(i) => {
                        let (t0, a) = snaps[i - 1];
                        let (t1, b) = snaps[i];
                        let f = if t1 > t0 { (s.t - t0) / (t1 - t0) } else { 1.0 };
                        [0, 1, 2, 3].map(|k| a[k] + (b[k] - a[k]) * f)
                    }
                };
                shares.map(|sh| sh * s.pss_bytes as f64)
            })
            .collect(),
    )
}

/// Keeps at most two samples (the lowest and highest PSS) per pixel column,
/// so a day-long log stays a small picture and peaks are never lost.
fn decimate<'a>(samples: &[&'a SamplePoint], t0: f64, t1: f64) -> Vec<&'a SamplePoint> {
    if samples.len() <= (PW as usize) * 2 {
        return samples.to_vec();
    }
    let span = (t1 - t0).max(1e-9);
    let mut out: Vec<&SamplePoint> = Vec::new();
    let mut bucket: Vec<&SamplePoint> = Vec::new();
    let mut key = None;
    let flush = |bucket: &mut Vec<&'a SamplePoint>, out: &mut Vec<&'a SamplePoint>| {
        let lo = bucket.iter().enumerate().min_by_key(|(_, s)| s.pss_bytes);
        let hi = bucket.iter().enumerate().max_by_key(|(_, s)| s.pss_bytes);
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
fn nice_step(span: f64, target: f64) -> f64 {
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
fn byte_axis(max: f64) -> (f64, &'static str, f64) {
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

fn byte_label(v: f64, unit: f64, name: &str) -> String {
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
fn time_step(span: f64) -> f64 {
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

/// `45s`, `2m`, `2m30s`, `1h`, `1h30m`.
pub(super) fn time_label(t: f64) -> String {
    let s = t.round() as i64;
    if t.abs() < 60.0 {
        if (t - t.round()).abs() > 1e-6 {
            format!("{t:.1}s")
        } else {
            format!("{s}s")
        }
    } else if s < 3600 {
        match s % 60 {
            0 => format!("{}m", s / 60),
            r => format!("{}m{r:02}s", s / 60),
        }
    } else {
        match (s % 3600) / 60 {
            0 => format!("{}h", s / 3600),
            m => format!("{}h{m:02}m", s / 3600),
        }
    }
}

struct Frame {
    t0: f64,
    t1: f64,
}

impl Frame {
    fn x(&self, t: f64) -> f64 {
        ML + (t - self.t0) / (self.t1 - self.t0).max(1e-9) * PW
    }
}

struct YScale {
    top: f64,
    h: f64,
    max: f64,
}

impl YScale {
    fn y(&self, v: f64) -> f64 {
        self.top + self.h - (v / self.max).clamp(0.0, 1.2) * self.h
    }
}

/// A polyline path over `(t, value)` points, broken (new `M`) where
/// `breaks` says a new segment starts.
fn line_path(frame: &Frame, y: &YScale, pts: &[(f64, f64, bool)]) -> String {
    let mut d = String::new();
    for (i, (t, v, brk)) in pts.iter().enumerate() {
        let cmd = if i == 0 || *brk { 'M' } else { 'L' };
        let _ = write!(d, "{cmd}{:.1},{:.1}", frame.x(*t), y.y(*v));
    }
    d
}

/// A step path (value holds until the next point), as a ceiling behaves.
fn step_path(frame: &Frame, y: &YScale, pts: &[(f64, f64)], end: f64) -> String {
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

struct LegendItem {
    label: String,
    swatch: Swatch,
}

enum Swatch {
    Area(&'static str),
    Line {
        colour: &'static str,
        width: f64,
        dash: &'static str,
    },
    Marker(EventKind),
}

/// Draws the whole timeline. Returns an empty string for a log without
/// samples (the page then says so instead).
pub fn timeline(log: &RunLog) -> String {
    let samples_all: Vec<&SamplePoint> = log.samples.iter().collect();
    if samples_all.is_empty() {
        return String::new();
    }
    let markers: Vec<&Event> = log.events.iter().filter(|e| e.kind.has_marker()).collect();
    let t0 = samples_all
        .iter()
        .map(|s| s.t)
        .chain(markers.iter().map(|e| e.t))
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    let t_end = samples_all
        .iter()
        .map(|s| s.t)
        .chain(log.events.iter().map(|e| e.t))
        .chain(log.end.as_ref().map(|e| e.t))
        .fold(t0, f64::max);
    let t1 = if t_end - t0 < 1.0 { t0 + 1.0 } else { t_end };
    let frame = Frame { t0, t1 };
    let samples = decimate(&samples_all, t0, t1);
    let gpu_ids = gpu_ids(log);
    let sc = mem_scale(log, &samples_all, &samples, t0);
    let legend = legend_items(log, &markers, &gpu_ids, &sc);

    let mut body = String::new();
    let legend_h = draw_legend(&mut body, &legend);
    let lanes = lane_assignment(&frame, &markers);
    let lane_count = lanes.iter().copied().max().map_or(0, |m| m + 1).max(1);
    let lanes_top = legend_h + 10.0;
    let mem_top = lanes_top + lane_count as f64 * LANE_H + 8.0;
    let gpu_top = mem_top + MEM_H + PANEL_GAP;
    let bottom = if gpu_ids.is_empty() {
        mem_top + MEM_H
    } else {
        gpu_top + GPU_H
    };
    let steps = step_points(log);
    let height = bottom + 46.0 + if steps.is_empty() { 0.0 } else { STEP_AXIS_H };
    let plot = Plot {
        log,
        frame,
        samples,
        markers,
        gpu_ids,
        mem: YScale {
            top: mem_top,
            h: MEM_H,
            max: sc.ymax,
        },
        sc,
        lanes,
        lanes_top,
        gpu_top,
        bottom,
    };

    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="timeline" class="timeline" viewBox="0 0 {W} {height:.0}" width="100%" role="img" aria-labelledby="timeline-title timeline-desc" font-family="{FONT}" font-size="12" fill="{INK}"><title id="timeline-title">Memory timeline</title><desc id="timeline-desc">PSS stacked by role with the PSS and RSS sums, swap, ceiling and thresholds over time, GPU memory per device, and one numbered marker per event.</desc>"#
    );
    let _ = write!(
        svg,
        r#"<defs><clipPath id="clip-mem"><rect x="{ML}" y="{:.1}" width="{PW}" height="{:.1}"/></clipPath></defs>"#,
        mem_top - 1.0,
        MEM_H + 2.0
    );
    svg.push_str(&body);
    plot.attempt_bands(&mut svg);
    plot.time_axis(&mut svg);
    plot.step_axis(&mut svg, &steps);
    plot.memory_panel(&mut svg);
    plot.gpu_panel(&mut svg);
    plot.markers(&mut svg);
    svg.push_str("</svg>");
    svg
}

/// Height of the step axis under the time axis, when the log has progress.
const STEP_AXIS_H: f64 = 30.0;

/// Every GPU seen: index, name and the largest capacity reported.
fn gpu_ids(log: &RunLog) -> Vec<(u32, String, u64)> {
    let mut ids: Vec<(u32, String, u64)> = Vec::new();
    for s in &log.samples {
        for g in &s.gpus {
            match ids.iter_mut().find(|(i, _, _)| *i == g.index) {
                Some(e) => e.2 = e.2.max(g.total_bytes),
                None => ids.push((g.index, g.name.clone(), g.total_bytes)),
            }
        }
    }
    ids.sort_by_key(|g| g.0);
    ids
}

/// The memory panel's scale and what fits on it.
struct MemScale {
    /// `(t, bytes)` of the nearest ceiling, where it changed.
    ceilings: Vec<(f64, f64)>,
    ceiling_max: f64,
    rss_max: f64,
    has_swap: bool,
    rss_on_scale: bool,
    ceiling_on_scale: bool,
    warn: Option<Threshold>,
    crit: Option<Threshold>,
    unit: f64,
    unit_name: &'static str,
    step: f64,
    ymax: f64,
}

fn mem_scale(
    log: &RunLog,
    samples_all: &[&SamplePoint],
    samples: &[&SamplePoint],
    t0: f64,
) -> MemScale {
    let pss_max = samples_all.iter().map(|s| s.pss_bytes).max().unwrap_or(0) as f64;
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

fn line_item(label: String, colour: &'static str, width: f64, dash: &'static str) -> LegendItem {
    LegendItem {
        label,
        swatch: Swatch::Line {
            colour,
            width,
            dash,
        },
    }
}

/// The legend, laid out first: the panels go below it.
fn legend_items(
    log: &RunLog,
    markers: &[&Event],
    gpu_ids: &[(u32, String, u64)],
    sc: &MemScale,
) -> Vec<LegendItem> {
    let mut legend: Vec<LegendItem> = Vec::new();
    for r in STACK {
        let used = log
            .snapshots
            .iter()
            .any(|s| s.procs.iter().any(|p| p.role == r && p.pss_bytes > 0))
            || log
                .samples
                .iter()
                .any(|s| s.role_pss.iter().any(|&(role, pss)| role == r && pss > 0));
        if used {
            legend.push(LegendItem {
                label: format!("{} PSS", r.as_str()),
                swatch: Swatch::Area(role_colour(r)),
            });
        }
    }
    legend.push(line_item("PSS sum (footprint)".into(), INK, 2.0, ""));
    if sc.rss_on_scale {
        legend.push(line_item("RSS sum".into(), MUTED, 1.5, "5 3"));
    }
    if sc.has_swap {
        legend.push(line_item(
            "swap used (machine)".into(),
            SWAP,
            2.0,
            "1.5 2.5",
        ));
    }
    if sc.ceiling_on_scale {
        legend.push(line_item("ceiling".into(), CEILING, 2.2, ""));
    }
    if let Some(c) = sc.crit.filter(|_| sc.ceiling_on_scale) {
        legend.push(line_item(
            format!("critical ({})", c.label()),
            CEILING,
            1.5,
            "7 4",
        ));
    }
    if let Some(w) = sc.warn.filter(|_| sc.ceiling_on_scale) {
        legend.push(line_item(format!("warn ({})", w.label()), WARN, 1.5, "2 3"));
    }
    for (i, (idx, name, _)) in gpu_ids.iter().enumerate() {
        legend.push(line_item(
            format!("GPU {idx} used ({})", short_gpu_name(name)),
            GPU_COLOURS[i % GPU_COLOURS.len()],
            2.0,
            "",
        ));
    }
    let mut seen_kinds: Vec<&'static str> = Vec::new();
    for e in markers {
        let key = match &e.kind {
            EventKind::Rule { state, .. } if state == "cleared" => "rule cleared",
            EventKind::Rule { .. } => "rule firing",
            k => k.name(),
        };
        if !seen_kinds.contains(&key) {
            seen_kinds.push(key);
            legend.push(LegendItem {
                label: key.replace('_', " "),
                swatch: Swatch::Marker(e.kind.clone()),
            });
        }
    }
    legend
}

/// Everything the panels share once the layout is known.
struct Plot<'a> {
    log: &'a RunLog,
    frame: Frame,
    /// The decimated samples that are drawn.
    samples: Vec<&'a SamplePoint>,
    markers: Vec<&'a Event>,
    gpu_ids: Vec<(u32, String, u64)>,
    sc: MemScale,
    mem: YScale,
    /// The marker lane of each marker.
    lanes: Vec<usize>,
    lanes_top: f64,
    gpu_top: f64,
    /// The bottom of the last panel.
    bottom: f64,
}

impl Plot<'_> {
    /// Attempt bands (every other attempt shaded) and the plot backgrounds.
    fn attempt_bands(&self, svg: &mut String) {
        let (mem_top, gpu_top, bottom) = (self.mem.top, self.gpu_top, self.bottom);
        let log = self.log;
        let _ = write!(
            svg,
            r##"<g class="attempts"><rect class="plot-bg" x="{ML}" y="{mem_top:.1}" width="{PW}" height="{MEM_H}" fill="#fbfbfc" stroke="{GRID}"/>"##
        );
        if !self.gpu_ids.is_empty() {
            let _ = write!(
                svg,
                r##"<rect class="plot-bg" x="{ML}" y="{gpu_top:.1}" width="{PW}" height="{GPU_H}" fill="#fbfbfc" stroke="{GRID}"/>"##
            );
        }
        if log.attempts.len() > 1 {
            for (i, a) in log.attempts.iter().enumerate() {
                let x0 = self.frame.x(a.start_t);
                let x1 = log
                    .attempts
                    .get(i + 1)
                    .map_or(self.frame.x(self.frame.t1), |n| self.frame.x(n.start_t));
                if i % 2 == 1 {
                    for (top, h) in panels(mem_top, gpu_top, !self.gpu_ids.is_empty()) {
                        let _ = write!(
                            svg,
                            r##"<rect class="attempt-band" x="{x0:.1}" y="{top:.1}" width="{:.1}" height="{h}" fill="#eef1f6"/>"##,
                            (x1 - x0).max(0.0)
                        );
                    }
                }
                if i > 0 {
                    let _ = write!(
                        svg,
                        r#"<line class="attempt-start" x1="{x0:.1}" x2="{x0:.1}" y1="{mem_top:.1}" y2="{bottom:.1}" stroke="{MUTED}" stroke-width="1"/>"#
                    );
                }
                let _ = write!(
                    svg,
                    r#"<text class="attempt-label" x="{:.1}" y="{:.1}" font-size="11" font-weight="600" fill="{MUTED}">attempt {}</text>"#,
                    x0 + 6.0,
                    mem_top + 15.0,
                    a.number
                );
            }
        }
        svg.push_str("</g>");
    }

    /// The time of each tick of the time axis.
    fn ticks(&self) -> Vec<f64> {
        let (t0, t1) = (self.frame.t0, self.frame.t1);
        let tstep = time_step(t1 - t0);
        let mut out = Vec::new();
        let mut tick = (t0 / tstep).ceil() * tstep;
        // Capped: at absurd magnitudes adding the step may not move the tick.
        for _ in 0..100 {
            if tick > t1 + 1e-9 {
                break;
            }
            out.push(tick);
            tick += tstep;
        }
        out
    }

    /// The time grid across every panel and the time axis under them.
    fn time_axis(&self, svg: &mut String) {
        let (grid_top, bottom) = (self.mem.top, self.bottom);
        let _ = write!(svg, r#"<g class="x-axis" font-size="11.5" fill="{MUTED}">"#);
        for tick in self.ticks() {
            let x = self.frame.x(tick);
            let _ = write!(
                svg,
                r#"<line x1="{x:.1}" x2="{x:.1}" y1="{grid_top:.1}" y2="{bottom:.1}" stroke="{GRID}" stroke-width="1"/><line x1="{x:.1}" x2="{x:.1}" y1="{bottom:.1}" y2="{:.1}" stroke="{MUTED}"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                bottom + 4.0,
                bottom + 18.0,
                esc(&time_label(tick))
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="{INK}">time since start</text></g>"#,
            ML + PW / 2.0,
            bottom + 38.0
        );
    }

    /// Under the time axis: the training step the job had printed by each
    /// time tick, and where each epoch began.
    fn step_axis(&self, svg: &mut String, steps: &[StepPoint]) {
        if steps.is_empty() {
            return;
        }
        let y = self.bottom + 46.0 + STEP_AXIS_H / 2.0;
        let _ = write!(
            svg,
            r#"<g class="step-axis" font-size="11" fill="{MUTED}"><text x="{:.1}" y="{:.1}" text-anchor="end" fill="{INK}">step</text>"#,
            ML - 8.0,
            y + 4.0
        );
        let mut last_x = f64::NEG_INFINITY;
        for tick in self.ticks() {
            let Some(p) = steps.iter().rev().find(|p| p.t <= tick + 1e-9) else {
                continue;
            };
            let x = self.frame.x(tick);
            let _ = write!(
                svg,
                r#"<text class="step-tick" x="{x:.1}" y="{:.1}" text-anchor="middle" data-t="{tick:.3}" data-step="{}">{}</text>"#,
                y + 4.0,
                p.step,
                p.step
            );
            last_x = last_x.max(x);
        }
        let mut epoch: Option<(u32, &str)> = None;
        for p in steps {
            let Some(e) = p.epoch.as_deref() else {
                continue;
            };
            if epoch == Some((p.attempt, e)) {
                continue;
            }
            let first = epoch.is_none();
            epoch = Some((p.attempt, e));
            if first && p.t <= self.frame.t0 + 1e-9 {
                continue;
            }
            let x = self.frame.x(p.t);
            let _ = write!(
                svg,
                r#"<g class="epoch-start" data-t="{:.3}"><line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="{INK}" stroke-width="1.2"/><text x="{:.1}" y="{:.1}" font-size="10" fill="{INK}">epoch {}</text></g>"#,
                p.t,
                y - 10.0,
                y + 8.0,
                x + 3.0,
                y - 2.0,
                esc(e)
            );
        }
        svg.push_str("</g>");
    }

    /// The memory panel: role areas, the sums, swap, ceiling and thresholds.
    fn memory_panel(&self, svg: &mut String) {
        let sc = &self.sc;
        let _ = write!(svg, r#"<g class="panel panel-memory">"#);
        y_axis(svg, &self.mem, sc.unit, sc.unit_name, sc.step, "memory");
        let _ = write!(svg, r#"<g clip-path="url(#clip-mem)">"#);
        self.role_areas(svg);
        self.sum_lines(svg);
        svg.push_str("</g>");
        self.ceiling_lines(svg);
        svg.push_str("</g>");
    }

    /// Stacked role areas, one path per attempt and role.
    fn role_areas(&self, svg: &mut String) {
        let (frame, mem) = (&self.frame, &self.mem);
        let mut stacks: Vec<(Vec<&SamplePoint>, Vec<[f64; 4]>)> = Vec::new();
        for a in &self.log.attempts {
            let pts: Vec<&SamplePoint> = self
                .samples
                .iter()
                .copied()
                .filter(|s| s.attempt == a.number)
                .collect();
            if pts.is_empty() {
                continue;
            }
            if let Some(st) = role_stack(&pts, self.log, a.number) {
                stacks.push((pts, st));
            }
        }
        for (k, role) in STACK.iter().enumerate() {
            let colour = role_colour(*role);
            let _ = write!(
                svg,
                r#"<g id="series-pss-{}" class="series area role-{}" fill="{colour}" fill-opacity="0.42" stroke="{colour}" stroke-width="1" stroke-linejoin="round">"#,
                role.as_str(),
                role.as_str()
            );
            for (pts, st) in &stacks {
                if st.iter().all(|v| v[k] <= 0.0) {
                    continue;
                }
                let cum = |i: usize, upto: usize| st[i][..upto].iter().sum::<f64>();
                let mut d = String::new();
                for (i, s) in pts.iter().enumerate() {
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1}",
                        if i == 0 { "M" } else { "L" },
                        frame.x(s.t),
                        mem.y(cum(i, k + 1))
                    );
                }
                for (i, s) in pts.iter().enumerate().rev() {
                    let _ = write!(d, "L{:.1},{:.1}", frame.x(s.t), mem.y(cum(i, k)));
                }
                d.push('Z');
                let _ = write!(svg, r#"<path d="{d}"/>"#);
            }
            svg.push_str("</g>");
        }
    }

    /// `(t, value, starts a new segment)` of one series, broken between
    /// attempts.
    fn broken(&self, f: &dyn Fn(&SamplePoint) -> Option<f64>) -> Vec<(f64, f64, bool)> {
        let mut prev_attempt = None;
        self.samples
            .iter()
            .filter_map(|s| {
                let v = f(s)?;
                let brk = prev_attempt.is_some_and(|a| a != s.attempt);
                prev_attempt = Some(s.attempt);
                Some((s.t, v, brk))
            })
            .collect()
    }

    /// Swap, the RSS sum and the PSS sum.
    fn sum_lines(&self, svg: &mut String) {
        let (frame, mem) = (&self.frame, &self.mem);
        if self.sc.has_swap {
            let pts = self.broken(&|s| s.swap_used_bytes.map(|v| v as f64));
            let _ = write!(
                svg,
                r#"<g id="series-swap" class="series line" fill="none" stroke="{SWAP}" stroke-width="2.2" stroke-dasharray="1.5 2.5" stroke-linecap="round"><path d="{}"/></g>"#,
                line_path(frame, mem, &pts)
            );
        }
        if self.sc.rss_on_scale {
            let pts = self.broken(&|s| Some(s.rss_bytes as f64));
            let _ = write!(
                svg,
                r#"<g id="series-rss" class="series line" fill="none" stroke="{MUTED}" stroke-width="1.5" stroke-dasharray="5 3"><path d="{}"/></g>"#,
                line_path(frame, mem, &pts)
            );
        } else {
            let _ = write!(
                svg,
                r#"<g id="series-rss" class="series line off-scale"></g>"#
            );
        }
        let pts = self.broken(&|s| Some(s.pss_bytes as f64));
        let _ = write!(
            svg,
            r#"<g id="series-pss-total" class="series line" fill="none" stroke="{INK}" stroke-width="2" stroke-linejoin="round"><path d="{}"/></g>"#,
            line_path(frame, mem, &pts)
        );
    }

    /// Ceiling and thresholds, labelled at their right end, and notes for
    /// what is off the scale.
    fn ceiling_lines(&self, svg: &mut String) {
        let (sc, frame, mem, log) = (&self.sc, &self.frame, &self.mem, self.log);
        let t1 = frame.t1;
        let mut notes: Vec<String> = Vec::new();
        let mut labels: Vec<(f64, String, &str)> = Vec::new();
        if !sc.ceilings.is_empty() {
            let source = self
                .samples
                .iter()
                .rev()
                .find_map(|s| s.ceiling.as_ref().map(|c| c.source.clone()))
                .or_else(|| {
                    log.start
                        .as_ref()
                        .and_then(|s| s.ceilings.iter().min_by_key(|c| c.bytes))
                        .map(|c| c.source.clone())
                })
                .unwrap_or_default();
            let last = sc.ceilings.last().map_or(0.0, |c| c.1);
            if sc.ceiling_on_scale {
                let _ = write!(
                    svg,
                    r#"<g id="series-ceiling" class="series line" fill="none" stroke="{CEILING}" stroke-width="2.2"><path d="{}"/></g>"#,
                    step_path(frame, mem, &sc.ceilings, t1)
                );
                labels.push((
                    mem.y(last),
                    format!("ceiling {}", HumanBytes(last as u64)),
                    CEILING,
                ));
                for (id, th, colour, dash, name) in [
                    ("series-critical", sc.crit, CEILING, "7 4", "critical"),
                    ("series-warn", sc.warn, WARN, "2 3", "warn"),
                ] {
                    let Some(th) = th else { continue };
                    let pts: Vec<(f64, f64)> = sc
                        .ceilings
                        .iter()
                        .map(|(t, c)| (*t, th.level(*c)))
                        .collect();
                    let _ = write!(
                        svg,
                        r#"<g id="{id}" class="series line threshold" fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="{dash}"><path d="{}"/></g>"#,
                        step_path(frame, mem, &pts, t1)
                    );
                    labels.push((
                        mem.y(th.level(last)),
                        format!("{name} {}", HumanBytes(th.level(last) as u64)),
                        colour,
                    ));
                }
            } else {
                let _ = write!(
                    svg,
                    r#"<g id="series-ceiling" class="series line off-scale"></g>"#
                );
                notes.push(format!(
                    "{source} ceiling {} is off the scale",
                    HumanBytes(sc.ceiling_max as u64)
                ));
            }
        }
        if !sc.rss_on_scale {
            notes.push(format!(
                "RSS sum (peak {}) is off the scale",
                HumanBytes(sc.rss_max as u64)
            ));
        }
        gutter_labels(svg, &mut labels, mem.top, mem.top + MEM_H);
        for (i, n) in notes.iter().enumerate() {
            let _ = write!(
                svg,
                r#"<text class="scale-note" x="{:.1}" y="{:.1}" text-anchor="end" font-size="11.5" fill="{MUTED}" font-style="italic">↑ {}</text>"#,
                ML + PW - 6.0,
                mem.top + 16.0 + 15.0 * i as f64,
                esc(n)
            );
        }
    }

    /// GPU memory per device, with each device's capacity.
    fn gpu_panel(&self, svg: &mut String) {
        let gpu_ids = &self.gpu_ids;
        if gpu_ids.is_empty() {
            return;
        }
        let gpu_top = self.gpu_top;
        let gmax_used = self
            .log
            .samples
            .iter()
            .flat_map(|s| s.gpus.iter().map(|g| g.used_bytes))
            .max()
            .unwrap_or(0) as f64;
        let gmax_total = gpu_ids.iter().map(|g| g.2).max().unwrap_or(0) as f64;
        let gtop = gmax_total.max(gmax_used).max(1.0) * 1.04;
        let (gunit, gname, gstep) = byte_axis(gtop);
        let gy = YScale {
            top: gpu_top,
            h: GPU_H,
            max: (gtop / gstep).ceil() * gstep,
        };
        let _ = write!(svg, r#"<g class="panel panel-gpu">"#);
        y_axis(svg, &gy, gunit, gname, gstep, "GPU memory");
        for (i, (idx, _, total)) in gpu_ids.iter().enumerate() {
            let colour = GPU_COLOURS[i % GPU_COLOURS.len()];
            let pts = self.broken(&|s| {
                s.gpus
                    .iter()
                    .find(|g| g.index == *idx)
                    .map(|g| g.used_bytes as f64)
            });
            let _ = write!(
                svg,
                r#"<g id="series-gpu-{idx}" class="series line gpu" fill="none" stroke="{colour}" stroke-width="2" stroke-linejoin="round"><path d="{}"/>"#,
                line_path(&self.frame, &gy, &pts)
            );
            if *total > 0 {
                let y = gy.y(*total as f64);
                let _ = write!(
                    svg,
                    r#"<line class="gpu-total" x1="{ML}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="{MUTED}" stroke-width="1.2" stroke-dasharray="3 3"/>"#,
                    ML + PW
                );
            }
            svg.push_str("</g>");
        }
        // Capacity labels in the gutter (one when every device is alike).
        let mut caps: Vec<(f64, String, &str)> = Vec::new();
        let same = gpu_ids.windows(2).all(|w| w[0].2 == w[1].2);
        for (i, (idx, _, total)) in gpu_ids.iter().enumerate() {
            if *total == 0 || (same && i > 0) {
                continue;
            }
            let text = if same && gpu_ids.len() > 1 {
                format!("total {}", HumanBytes(*total))
            } else {
                format!("GPU {idx} {}", HumanBytes(*total))
            };
            caps.push((
                gy.y(*total as f64),
                text,
                if same {
                    MUTED
                } else {
                    GPU_COLOURS[i % GPU_COLOURS.len()]
                },
            ));
        }
        gutter_labels(svg, &mut caps, gpu_top, gpu_top + GPU_H);
        svg.push_str("</g>");
    }

    /// One numbered marker per event, last so they sit on top.
    fn markers(&self, svg: &mut String) {
        let (lanes_top, bottom) = (self.lanes_top, self.bottom);
        let _ = write!(svg, r#"<g class="markers">"#);
        if !self.markers.is_empty() {
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11.5" fill="{MUTED}">events</text>"#,
                ML - 8.0,
                lanes_top + LANE_H / 2.0 + 4.0
            );
        }
        for (e, lane) in self.markers.iter().zip(&self.lanes) {
            let x = self.frame.x(e.t);
            let cy = lanes_top + *lane as f64 * LANE_H + LANE_H / 2.0;
            let (fill, text_colour, shape) = marker_style(&e.kind);
            let name = e.kind.name();
            let severe = matches!(
                e.kind,
                EventKind::OomKill { .. } | EventKind::CudaOom { .. } | EventKind::RankFailed(_)
            );
            let stroke = match &e.kind {
                EventKind::Rule { state, .. } if state == "cleared" => "#E69F00",
                _ => "#ffffff",
            };
            let line_colour = if fill == "#ffffff" { "#E69F00" } else { fill };
            let font = if e.seq >= 100 { 7.5 } else { 9.5 };
            let _ = write!(
                svg,
                r#"<g class="marker marker-{name}" id="marker-{}" data-event="{name}" data-t="{:.3}"><title>{}</title><line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{bottom:.1}" stroke="{line_colour}" stroke-width="{}" stroke-dasharray="{}" opacity="0.85"/><path d="{}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="{font}" font-weight="700" fill="{text_colour}">{}</text></g>"#,
                e.seq,
                e.t,
                esc(&format!(
                    "#{} at {}: {}",
                    e.seq,
                    time_label(e.t),
                    event_summary(e)
                )),
                cy + MARKER_R,
                if severe { 1.6 } else { 1.0 },
                if severe { "none" } else { "3 3" },
                shape_path(shape, x, cy, MARKER_R),
                cy + font * 0.36
                    + if matches!(shape, Shape::Up) {
                        1.5
                    } else if matches!(shape, Shape::Down) {
                        -1.5
                    } else {
                        0.0
                    },
                e.seq
            );
        }
        svg.push_str("</g>");
    }
}

/// A training step the job had printed, on the report's time axis.
struct StepPoint {
    t: f64,
    attempt: u32,
    step: u64,
    epoch: Option<String>,
}

/// The training steps in the log's `progress` (validation and test bars
/// count their own steps: those are left out), in time order.
fn step_points(log: &RunLog) -> Vec<StepPoint> {
    let mut out: Vec<StepPoint> = log
        .progress
        .iter()
        .filter(|p| matches!(p.phase.as_deref(), None | Some("train")))
        .filter_map(|p| {
            Some(StepPoint {
                t: p.t,
                attempt: p.attempt,
                step: p.step?,
                epoch: p.epoch.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    out
}

/// Labels in the right gutter at the height of their line, moved apart so
/// none overlaps the one above.
fn gutter_labels(svg: &mut String, labels: &mut [(f64, String, &str)], top: f64, bottom: f64) {
    labels.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut prev = f64::NEG_INFINITY;
    for (y, text, colour) in labels.iter() {
        let y = (y + 4.0).max(prev + 14.0).max(top + 8.0).min(bottom + 4.0);
        prev = y;
        let _ = write!(
            svg,
            r#"<text class="series-label" x="{:.1}" y="{y:.1}" font-size="11.5" font-weight="600" fill="{colour}">{}</text>"#,
            ML + PW + 8.0,
            esc(text)
        );
    }
}

fn panels(mem_top: f64, gpu_top: f64, gpu: bool) -> Vec<(f64, f64)> {
    let mut v = vec![(mem_top, MEM_H)];
    if gpu {
        v.push((gpu_top, GPU_H));
    }
    v
}

fn short_gpu_name(name: &str) -> String {
    let n = name.trim_start_matches("NVIDIA ").trim();
    if n.chars().count() > 22 {
        let mut s: String = n.chars().take(21).collect();
        s.push('…');
        s
    } else {
        n.to_string()
    }
}

fn y_axis(svg: &mut String, y: &YScale, unit: f64, unit_name: &str, step: f64, title: &str) {
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

/// Lays the legend out in rows; returns its height.
fn draw_legend(svg: &mut String, items: &[LegendItem]) -> f64 {
    let row_h = 22.0;
    let (mut x, mut y) = (ML, 16.0);
    let _ = write!(svg, r#"<g class="legend" font-size="12.5">"#);
    for item in items {
        // Width estimate for a sans-serif at 12.5 px: good enough to wrap.
        let w = 24.0 + item.label.chars().count() as f64 * 6.9 + 18.0;
        if x + w > W - MR && x > ML {
            x = ML;
            y += row_h;
        }
        let sy = y - 4.0;
        match &item.swatch {
            Swatch::Area(c) => {
                let _ = write!(
                    svg,
                    r#"<rect x="{x:.1}" y="{:.1}" width="16" height="11" fill="{c}" fill-opacity="0.42" stroke="{c}"/>"#,
                    sy - 5.5
                );
            }
            Swatch::Line {
                colour,
                width,
                dash,
            } => {
                let _ = write!(
                    svg,
                    r#"<line x1="{x:.1}" x2="{:.1}" y1="{sy:.1}" y2="{sy:.1}" stroke="{colour}" stroke-width="{width}" stroke-dasharray="{dash}" stroke-linecap="butt"/>"#,
                    x + 18.0
                );
            }
            Swatch::Marker(kind) => {
                let (fill, _, shape) = marker_style(kind);
                let stroke = if fill == "#ffffff" { "#E69F00" } else { fill };
                let _ = write!(
                    svg,
                    r#"<path d="{}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>"#,
                    shape_path(shape, x + 8.0, sy, 6.0)
                );
            }
        }
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 24.0,
            y,
            esc(&item.label)
        );
        x += w;
    }
    svg.push_str("</g>");
    y + 8.0
}

/// Puts each marker in the first lane where it does not overlap the one
/// before it; with every lane taken, the one free soonest.
fn lane_assignment(frame: &Frame, markers: &[&Event]) -> Vec<usize> {
    let mut last_x = [f64::NEG_INFINITY; MAX_LANES];
    markers
        .iter()
        .map(|e| {
            let x = frame.x(e.t);
            let lane = (0..MAX_LANES)
                .find(|&l| x - last_x[l] >= 2.6 * MARKER_R + 6.0)
                .unwrap_or_else(|| {
                    (0..MAX_LANES)
                        .min_by(|a, b| last_x[*a].total_cmp(&last_x[*b]))
                        .unwrap_or(0)
                });
            last_x[lane] = x;
            lane
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples every second for 40 s; `progress` gives each sample's
    /// `(step, epoch, phase)` or none.
    fn progress_log(progress: impl Fn(u32) -> Option<(u64, u32, &'static str)>) -> RunLog {
        let lines: Vec<String> = (0..=40u32)
            .map(|t| {
                let p = progress(t).map_or(String::new(), |(step, epoch, phase)| {
                    format!(
                        r#","progress":{{"step":{step},"total":1000,"epoch":"{epoch}","phase":"{phase}"}}"#
                    )
                });
                format!(
                    r#"{{"schema":"oomguard/1","event":"sample","t":{t},"attempt":1,"tree":{{"pss_bytes":{}}}{p}}}"#,
                    (100 + t) << 20
                )
            })
            .collect();
        crate::report::load::load(&lines.join("\n")).unwrap()
    }

    #[test]
    fn a_step_axis_with_epoch_starts_when_the_log_has_progress() {
        // 10 steps a second; epoch 2 begins at 20 s; a validation bar
        // (its own counter) runs from 15 s to 19 s and is left out.
        let log = progress_log(|t| {
            let (step, epoch) = if t < 20 {
                (u64::from(t) * 10, 1)
            } else {
                (u64::from(t - 20) * 10, 2)
            };
            Some(match t {
                15..=19 => (u64::from(t - 15), 1, "validation"),
                _ => (step, epoch, "train"),
            })
        });
        let svg = timeline(&log);
        assert!(svg.contains(r#"class="step-axis""#), "no step axis");
        // The ticks fall every 5 s: at 10 s the job had printed step 100;
        // at 15 s and at 20 s the last training step was 140, then 0 of
        // epoch 2.
        assert!(svg.contains(r#"data-t="10.000" data-step="100""#), "{svg}");
        assert!(svg.contains(r#"data-t="15.000" data-step="140""#), "{svg}");
        assert!(svg.contains(r#"data-t="20.000" data-step="0""#), "{svg}");
        assert!(svg.contains(r#"data-t="40.000" data-step="200""#), "{svg}");
        assert_eq!(svg.matches(r#"class="epoch-start""#).count(), 1, "{svg}");
        assert!(svg.contains(">epoch 2</text>"));
        let height = |svg: &str| -> f64 {
            let v = svg.split("viewBox=\"0 0 ").nth(1).unwrap();
            v.split(['"', ' ']).nth(1).unwrap().parse().unwrap()
        };
        let plain = timeline(&progress_log(|_| None));
        assert!(!plain.contains("step-axis"));
        assert_eq!(height(&svg), height(&plain) + STEP_AXIS_H);
    }

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(12.0, 5.0), 2.5);
        let (unit, name, step) = byte_axis(600.0 * 1048576.0);
        assert_eq!((unit, name), (1048576.0, "MiB"));
        assert_eq!(step, 200.0 * 1048576.0);
        let (_, name, _) = byte_axis(30.0 * 1073741824.0);
        assert_eq!(name, "GiB");
        assert_eq!(byte_label(512.0 * 1048576.0, 1048576.0, "MiB"), "512 MiB");
        assert_eq!(byte_label(0.0, 1.0, "GiB"), "0");
        let g = 1073741824.0;
        assert_eq!(byte_label(0.25 * g, g, "GiB"), "0.25 GiB");
        assert_eq!(byte_label(1.5 * g, g, "GiB"), "1.5 GiB");
    }

    #[test]
    fn time_labels() {
        assert_eq!(time_label(0.0), "0s");
        assert_eq!(time_label(45.0), "45s");
        assert_eq!(time_label(2.5), "2.5s");
        assert_eq!(time_label(120.0), "2m");
        assert_eq!(time_label(150.0), "2m30s");
        assert_eq!(time_label(5400.0), "1h30m");
        assert_eq!(time_step(30.0), 5.0);
        assert_eq!(time_step(3600.0), 600.0);
    }

    #[test]
    fn escaping() {
        assert_eq!(esc("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&#39;");
        assert_eq!(esc("x\u{1}y"), "x\u{FFFD}y");
    }

    #[test]
    fn thresholds_from_policy() {
        let text = r#"{"schema":"oomguard/1","event":"run_start","t":0,"attempt":1,"policy":{"rules":[
            {"name":"warn","metric":"headroom_percent","op":"<","threshold":20,"unit":"%","action":"warn"},
            {"name":"crit","metric":"headroom_percent","op":"<","threshold":8,"unit":"%","action":"stop"},
            {"name":"eta","metric":"eta_seconds","op":"<","threshold":10,"unit":"s","action":"stop"},
            {"name":"low","metric":"headroom_percent","op":"<","threshold":3,"action":"kill"}]}}"#
            .replace('\n', "");
        let log = crate::report::load(&text).unwrap();
        let (w, c) = thresholds(&log);
        assert_eq!(w, Some(Threshold::Percent(20.0)));
        assert_eq!(c, Some(Threshold::Percent(8.0)));
        assert!((c.unwrap().level(1000.0) - 920.0).abs() < 1e-9);
    }

    #[test]
    fn decimation_keeps_peaks_and_bounds_size() {
        let samples: Vec<SamplePoint> = (0..100_000)
            .map(|i| SamplePoint {
                t: f64::from(i),
                attempt: 1,
                pss_bytes: if i == 54_321 {
                    1 << 40
                } else {
                    1000 + (i % 7) as u64
                },
                ..Default::default()
            })
            .collect();
        let refs: Vec<&SamplePoint> = samples.iter().collect();
        let d = decimate(&refs, 0.0, 99_999.0);
        assert!(d.len() <= 2 * PW as usize + 2, "{}", d.len());
        assert!(d.iter().any(|s| s.pss_bytes == 1 << 40));
        assert!(d.windows(2).all(|w| w[0].t <= w[1].t));
    }
}
