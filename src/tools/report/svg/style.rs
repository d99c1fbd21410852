//! How the timeline looks: its dimensions, the palette and what each
//! colour stands for, the event markers' shapes, and the text helpers
//! (escaping, time labels) every panel and the pages around the picture
//! use. The layout (`scale`) and the panels (`plot`) read it; it reads
//! neither.

use std::fmt::Write;

use crate::sinks::log::Event as Logged;
use crate::vocab::model::Role;

/// Width of the drawing in SVG units; the page scales it to its column.
pub(super) const W: f64 = 1136.0;
pub(super) const ML: f64 = 78.0;
/// Right gutter: the labels of the ceiling and threshold lines.
pub(super) const MR: f64 = 118.0;
pub(super) const PW: f64 = W - ML - MR;
pub(super) const MEM_H: f64 = 330.0;
pub(super) const GPU_H: f64 = 150.0;
pub(super) const PANEL_GAP: f64 = 30.0;
pub(super) const LANE_H: f64 = 22.0;
pub(super) const MAX_LANES: usize = 3;
pub(super) const MARKER_R: f64 = 8.0;
/// Ceilings and RSS sums this many times above the footprint would squash
/// the interesting part flat; they are noted instead of drawn.
pub(super) const OFF_SCALE: f64 = 2.5;

pub(super) const INK: &str = "#1f2430";
pub(super) const MUTED: &str = "#5b6473";
pub(super) const GRID: &str = "#e4e7ec";
pub(super) const FONT: &str = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Noto Sans', 'Liberation Sans', 'DejaVu Sans', Arial, sans-serif";

/// Stack order, bottom to top: the trainer is the stable base, the workers'
/// growth shows on top of it.
pub(super) const STACK: [Role; 4] = [Role::Trainer, Role::Worker, Role::Other, Role::Launcher];

pub(super) fn role_colour(r: Role) -> &'static str {
    match r {
        Role::Trainer => "#0072B2",
        Role::Worker => "#E69F00",
        Role::Other => "#CC79A7",
        Role::Launcher => "#8c8c8c",
    }
}

pub(super) const GPU_COLOURS: [&str; 6] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
];
pub(super) const SWAP: &str = "#009E73";
/// The PSS sum beside a footprint that is a cgroup's working set.
pub(super) const PSS_SUM: &str = "#7A5195";
pub(super) const CEILING: &str = "#D55E00";
pub(super) const WARN: &str = "#A86F00";

/// Marker style per event: fill, text colour, shape.
pub(super) fn marker_style(event: &Logged) -> (&'static str, &'static str, Shape) {
    match event {
        Logged::Rule(r) if r.state == crate::sinks::log::RuleState::Cleared => {
            ("#ffffff", "#8a5a00", Shape::Up)
        }
        Logged::Rule(_) => ("#E69F00", "#1a1a1a", Shape::Up),
        Logged::Action(_) => ("#0072B2", "#ffffff", Shape::Square),
        Logged::Restart(_) => ("#009E73", "#ffffff", Shape::Circle),
        Logged::OomKill(_) => ("#D55E00", "#ffffff", Shape::Diamond),
        Logged::CudaOom(_) => ("#CC79A7", "#1a1a1a", Shape::Hexagon),
        Logged::WorkerDied(_) => ("#2b2b2b", "#ffffff", Shape::Down),
        Logged::RankFailed(r) if r.oom_killed => ("#D55E00", "#ffffff", Shape::Down),
        Logged::RankFailed(_) => ("#7a3b00", "#ffffff", Shape::Down),
        Logged::PhaseMemory(_) => ("#56B4E9", "#1a1a1a", Shape::Square),
        Logged::CheckpointDone(_) => ("#009E73", "#1a1a1a", Shape::Up),
        Logged::Fault(_) => ("#D55E00", "#ffffff", Shape::Hexagon),
        // `child_exit`, and the lines the loader never keeps as events.
        _ => ("#8c8c8c", "#ffffff", Shape::Circle),
    }
}

#[derive(Clone, Copy)]
pub(super) enum Shape {
    Up,
    Down,
    Square,
    Circle,
    Diamond,
    Hexagon,
}

pub(super) fn shape_path(shape: Shape, cx: f64, cy: f64, r: f64) -> String {
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
pub(in crate::tools::report) fn esc(s: &str) -> String {
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

/// `45s`, `2m`, `2m30s`, `1h`, `1h30m`.
pub(in crate::tools::report) fn time_label(t: f64) -> String {
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

/// Height of the step axis under the time axis, when the log has progress.
pub(super) const STEP_AXIS_H: f64 = 30.0;
