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

mod plot;
mod scale;
mod style;

use std::fmt::Write;

use super::run_log::{RunLog, SamplePoint, Timed};
use crate::sinks::log::Event as Logged;

use plot::{Plot, step_points};
use scale::{Frame, MemScale, YScale, decimate, mem_scale};
use style::{
    CEILING, FONT, GPU_COLOURS, GPU_H, INK, LANE_H, MARKER_R, MAX_LANES, MEM_H, ML, MR, MUTED,
    PANEL_GAP, PSS_SUM, PW, STACK, STEP_AXIS_H, SWAP, W, WARN, marker_style, role_colour,
    shape_path,
};
pub(super) use style::{esc, time_label};

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
    Marker(Logged),
}

/// Draws the whole timeline. Returns an empty string for a log without
/// samples (the page then says so instead).
pub fn timeline(log: &RunLog) -> String {
    let samples_all: Vec<&SamplePoint> = log.samples.iter().collect();
    if samples_all.is_empty() {
        return String::new();
    }
    let markers: Vec<&Timed> = log.events.iter().filter(|e| e.has_marker()).collect();
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
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="timeline" class="timeline" viewBox="0 0 {W} {height:.0}" width="100%" role="img" aria-labelledby="timeline-title timeline-desc" font-family="{FONT}" font-size="12" fill="{INK}"><title id="timeline-title">Memory timeline</title><desc id="timeline-desc">The footprint the policy compared with the ceiling, with the ceiling and thresholds; PSS stacked by role with the PSS and RSS sums and swap as breakdowns; GPU memory per device, and one numbered marker per event.</desc>"#
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
    markers: &[&Timed],
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
    legend.push(line_item(
        format!("footprint ({})", log.footprint_kind()),
        INK,
        2.2,
        "",
    ));
    if log.footprint_is_working_set() {
        legend.push(line_item("PSS sum".into(), PSS_SUM, 1.5, "8 3"));
    }
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
        let key = match &e.event {
            Logged::Rule(r) if r.state == crate::sinks::log::RuleState::Cleared => "rule cleared",
            Logged::Rule(_) => "rule firing",
            k => k.name(),
        };
        if !seen_kinds.contains(&key) {
            seen_kinds.push(key);
            legend.push(LegendItem {
                label: key.replace('_', " "),
                swatch: Swatch::Marker(e.event.clone()),
            });
        }
    }
    legend
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
fn lane_assignment(frame: &Frame, markers: &[&Timed]) -> Vec<usize> {
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
    use super::scale::{
        Threshold, byte_axis, byte_label, decimate, nice_step, thresholds, time_step,
    };
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
        crate::tools::report::load::load(&lines.join("\n")).unwrap()
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
        let log = crate::tools::report::load(&text).unwrap();
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
