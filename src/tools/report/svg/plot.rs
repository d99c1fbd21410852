//! The panels once the layout is known: attempt bands, the time and step
//! axes, the memory panel's role areas, sums, ceiling and thresholds, the
//! GPU panel and the event markers. Each draws its part of the picture into
//! the same SVG string, in the order `timeline` calls them.

use std::fmt::Write;

use super::scale::{Frame, MemScale, YScale, byte_axis, line_path, step_path, time_step, y_axis};
use super::style::{
    CEILING, GPU_COLOURS, GPU_H, GRID, INK, LANE_H, MARKER_R, MEM_H, ML, MUTED, PSS_SUM, PW, STACK,
    STEP_AXIS_H, SWAP, Shape, WARN, esc, marker_style, role_colour, shape_path, time_label,
};
use crate::sinks::log::Event as Logged;
use crate::tools::report::run_log::{RunLog, SamplePoint, Timed};
use crate::tools::report::text::event_summary;
use crate::vocab::units::HumanBytes;

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

/// Everything the panels share once the layout is known.
pub(super) struct Plot<'a> {
    pub(super) log: &'a RunLog,
    pub(super) frame: Frame,
    /// The decimated samples that are drawn.
    pub(super) samples: Vec<&'a SamplePoint>,
    pub(super) markers: Vec<&'a Timed>,
    pub(super) gpu_ids: Vec<(u32, String, u64)>,
    pub(super) sc: MemScale,
    pub(super) mem: YScale,
    /// The marker lane of each marker.
    pub(super) lanes: Vec<usize>,
    pub(super) lanes_top: f64,
    pub(super) gpu_top: f64,
    /// The bottom of the last panel.
    pub(super) bottom: f64,
}

impl Plot<'_> {
    /// Attempt bands (every other attempt shaded) and the plot backgrounds.
    pub(super) fn attempt_bands(&self, svg: &mut String) {
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
    pub(super) fn time_axis(&self, svg: &mut String) {
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
    pub(super) fn step_axis(&self, svg: &mut String, steps: &[StepPoint]) {
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
    pub(super) fn memory_panel(&self, svg: &mut String) {
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

    /// Swap, the RSS sum, the PSS sum and the footprint.
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
        // The PSS sum is a breakdown beside a working set (it counts file
        // pages charged elsewhere); without a cgroup it is the footprint,
        // drawn once, below.
        if self.log.footprint_is_working_set() {
            let pts = self.broken(&|s| Some(s.pss_bytes as f64));
            let _ = write!(
                svg,
                r#"<g id="series-pss-total" class="series line" fill="none" stroke="{PSS_SUM}" stroke-width="1.5" stroke-dasharray="8 3" stroke-linejoin="round"><path d="{}"/></g>"#,
                line_path(frame, mem, &pts)
            );
        } else {
            let _ = write!(
                svg,
                r#"<g id="series-pss-total" class="series line same-as-footprint"></g>"#
            );
        }
        // What the policy compared with the ceiling and the thresholds.
        let pts = self.broken(&|s| Some(s.footprint() as f64));
        let _ = write!(
            svg,
            r#"<g id="series-footprint" class="series line" fill="none" stroke="{INK}" stroke-width="2.2" stroke-linejoin="round"><path d="{}"/></g>"#,
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
    pub(super) fn gpu_panel(&self, svg: &mut String) {
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
    pub(super) fn markers(&self, svg: &mut String) {
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
            let (fill, text_colour, shape) = marker_style(&e.event);
            let name = e.event.name();
            let severe = matches!(
                e.event,
                Logged::OomKill(_) | Logged::CudaOom(_) | Logged::RankFailed(_)
            );
            let stroke = match &e.event {
                Logged::Rule(r) if r.state == crate::sinks::log::RuleState::Cleared => "#E69F00",
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
pub(super) struct StepPoint {
    t: f64,
    attempt: u32,
    step: u64,
    epoch: Option<String>,
}

/// The training steps in the log's `progress` (validation and test bars
/// count their own steps: those are left out), in time order.
pub(super) fn step_points(log: &RunLog) -> Vec<StepPoint> {
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
