//! Memory over the last minutes. The memory chart has the tree's
//! footprint (what the policy holds against the ceilings), its PSS where
//! the footprint is a working set apart from it, the RSS sum, what the
//! nearest ceiling counts as used where that is not the footprint, the
//! ceiling with its warn and critical lines, and swap. What it cannot draw
//! faithfully it leaves out and names (`left_out_note`): threshold lines
//! that would share a row, an RSS sum above the axis. GPU memory per
//! device gets its own chart (in the GPU panel): on one axis, 80 GiB of GPU
//! memory would flatten a 16 GiB cgroup limit and everything under it into
//! the bottom rows.

use std::collections::VecDeque;

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Chart, Dataset, GraphType, Paragraph, Widget};

use crate::sinks::tui::app::{CHART_WINDOW_SECONDS, ChartPoint};
use crate::sinks::tui::footprint;
use crate::sinks::tui::theme;
use crate::vocab::model::CeilingSource;

/// One line of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its name in a narrow legend.
    pub name: String,
    /// Its name where the legend has room (`footprint (working set)`).
    pub label: String,
    pub color: Color,
    /// (t, bytes).
    pub points: Vec<(f64, f64)>,
}

/// What the chart shows, in drawing order (later series on top).
#[derive(Debug, Clone, PartialEq)]
pub struct ChartView {
    pub series: Vec<Series>,
    /// Seconds shown, ending at `now`.
    pub span: f64,
    pub now: f64,
    pub y_max: f64,
    /// Lines and curves not drawn, for the legend to say so.
    pub left_out: Vec<LeftOut>,
}

/// A line the chart does not draw, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct LeftOut {
    pub name: String,
    pub why: Why,
}

/// Why a line is not drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Why {
    /// It would share a row with a more important line.
    NoRoom,
    /// It rises above the scale, to this many bytes.
    AboveTheScale(f64),
}

/// The narrowest x axis, for a run's first sample: a zero-wide axis would
/// have no scale.
const MIN_SPAN_SECONDS: f64 = 2.0;

/// From this height on the chart has an x axis with labels.
const X_LABELS_MIN_ROWS: u16 = 6;

impl ChartView {
    /// The memory chart of `points` against the ceiling of kind `source`
    /// (the nearest one now), with threshold lines at these headroom
    /// percentages. `kind`: what the footprint is now; where it is the PSS
    /// sum, one curve is both.
    pub(crate) fn memory(
        points: &VecDeque<ChartPoint>,
        source: Option<CeilingSource>,
        warn_percent: Option<f64>,
        critical_percent: Option<f64>,
        kind: footprint::Kind,
    ) -> Self {
        let (now, span) = time_span(points);
        let collect = |f: &dyn Fn(&ChartPoint) -> Option<u64>| -> Vec<(f64, f64)> {
            points
                .iter()
                .filter_map(|p| f(p).map(|v| (p.t, v as f64)))
                .collect()
        };
        let ceiling = |p: &ChartPoint| {
            source.and_then(|s| p.ceilings.iter().find(|c| c.0 == s).map(|c| (c.1, c.2)))
        };
        let series_of = |name: &str, color, f: &dyn Fn(&ChartPoint) -> Option<u64>| Series {
            name: name.into(),
            label: name.into(),
            color,
            points: collect(f),
        };
        // Drawing order: where lines cross, the later one shows. The
        // approximate RSS sum goes below everything, the limit and its
        // marks above the usage lines, and the footprint on top.
        let mut series = vec![series_of("RSS Σ", theme::RSS, &|p| Some(p.rss))];
        if points.iter().any(|p| p.swap > 0) {
            series.push(series_of("swap", theme::SWAP, &|p| Some(p.swap)));
        }
        if let Some(src) = source {
            // What the ceiling counts as used gets a curve of its own only
            // where it is not the footprint (a limit on a cgroup holding
            // more than the job; the machine's used memory).
            let used_is_footprint = points
                .back()
                .is_some_and(|p| ceiling(p).is_some_and(|c| c.1 == p.footprint));
            if !used_is_footprint {
                let name = format!("{} used", src.as_str());
                series.push(series_of(&name, theme::USED, &|p| ceiling(p).map(|c| c.1)));
            }
            let line_at = |pct: f64| {
                move |p: &ChartPoint| ceiling(p).map(|c| (c.0 as f64 * (1.0 - pct / 100.0)) as u64)
            };
            if let Some(w) = warn_percent {
                series.push(series_of("warn", theme::WARN, &line_at(w)));
            }
            if let Some(c) = critical_percent {
                series.push(series_of("crit", theme::CRIT_LINE, &line_at(c)));
            }
            series.push(series_of("limit", theme::LIMIT, &|p| {
                ceiling(p).map(|c| c.0)
            }));
        }
        if kind == footprint::Kind::WorkingSet {
            series.push(series_of("PSS", theme::PSS, &|p| Some(p.pss)));
        }
        let mut fp = series_of("footprint", theme::FOOTPRINT, &|p| Some(p.footprint));
        fp.label = format!("footprint ({})", kind.as_str());
        series.push(fp);
        let mut view = Self {
            series,
            span,
            now,
            y_max: 1.0,
            left_out: Vec::new(),
        };
        view.scale(source.is_some());
        view
    }

    /// Sets the y axis to the curves drawn. Under a ceiling, the axis is
    /// the ceiling's and what counts against it: the RSS sum double-counts
    /// shared pages and can be several times the PSS with forked workers,
    /// and letting it set the scale would squash the lines that matter
    /// (and merge the threshold lines into one row). Where it rises above
    /// that axis it is left out, and the legend says so, rather than drawn
    /// off the top.
    fn scale(&mut self, under_a_ceiling: bool) {
        let max_of = |s: &Series| s.points.iter().map(|p| p.1).fold(0.0, f64::max);
        let rss = self
            .series
            .iter()
            .find(|s| s.name == "RSS Σ")
            .map_or(0.0, max_of);
        let scaled = |s: &&Series| !under_a_ceiling || s.name != "RSS Σ";
        let top = self
            .series
            .iter()
            .filter(scaled)
            .map(max_of)
            .fold(0.0, f64::max);
        self.y_max = if top > 0.0 { top * 1.05 } else { 1.0 };
        if rss > self.y_max {
            self.series.retain(|s| s.name != "RSS Σ");
            self.left_out.push(LeftOut {
                name: "RSS Σ".into(),
                why: Why::AboveTheScale(rss),
            });
        }
    }

    /// Leaves out the threshold lines that would share a row of a chart
    /// drawn in `area` with a more important one (the limit, then the
    /// critical line, then the warning): on one row their dots merge into
    /// one line of the last colour drawn, which reads as one line.
    pub fn fit_rows(&mut self, area: Rect) {
        let rows = plot_rows(area);
        if rows == 0 {
            return;
        }
        let mut taken: Vec<u16> = Vec::new();
        for name in ["limit", "crit", "warn"] {
            let Some(i) = self.series.iter().position(|s| s.name == name) else {
                continue;
            };
            let Some(&(_, v)) = self.series[i].points.last() else {
                continue;
            };
            let row = row_of(v, self.y_max, rows);
            if taken.contains(&row) {
                self.series.remove(i);
                self.left_out.push(LeftOut {
                    name: name.into(),
                    why: Why::NoRoom,
                });
            } else {
                taken.push(row);
            }
        }
    }

    /// GPU memory used per device; the y axis goes up to the largest
    /// device's total.
    pub(crate) fn gpu(points: &VecDeque<ChartPoint>) -> Self {
        let (now, span) = time_span(points);
        let mut devices: Vec<u32> = points
            .iter()
            .flat_map(|p| p.gpus.iter().map(|g| g.0))
            .collect();
        devices.sort_unstable();
        devices.dedup();
        let series = devices
            .iter()
            .enumerate()
            .map(|(i, dev)| Series {
                name: format!("GPU{dev}"),
                label: format!("GPU{dev}"),
                color: theme::GPUS[i % theme::GPUS.len()],
                points: points
                    .iter()
                    .filter_map(|p| {
                        p.gpus
                            .iter()
                            .find(|g| g.0 == *dev)
                            .map(|g| (p.t, g.1 as f64))
                    })
                    .collect(),
            })
            .collect();
        let total = points
            .iter()
            .flat_map(|p| p.gpus.iter().map(|g| g.2.max(g.1)))
            .max()
            .unwrap_or(0);
        Self {
            series,
            span,
            now,
            y_max: if total > 0 { total as f64 } else { 1.0 },
            left_out: Vec::new(),
        }
    }

    /// The legend, for the pane title, in at most `width` cells: `━
    /// footprint (working set) ━ PSS ━ limit …`, most important first;
    /// where not all fit, the short names, then the least important left
    /// out (never half an entry).
    pub fn legend(&self, width: usize) -> Vec<Span<'static>> {
        let rank = |name: &str| match name {
            "footprint" => 0,
            "PSS" => 1,
            n if n.ends_with("used") => 2,
            "limit" => 3,
            "crit" => 4,
            "warn" => 5,
            _ => 6,
        };
        let mut order: Vec<&Series> = self.series.iter().collect();
        order.sort_by_key(|s| rank(&s.name));
        let entry_w = |text: &str| 3 + theme::width(text);
        // The trailing space after the last entry.
        let all_long = 1 + order.iter().map(|s| entry_w(&s.label)).sum::<usize>();
        let long = all_long <= width;
        let mut spans = Vec::new();
        let mut used = 1;
        for s in order {
            let text = if long { &s.label } else { &s.name };
            if used + entry_w(text) > width {
                break;
            }
            used += entry_w(text);
            spans.push(Span::styled(" ━", Style::new().fg(s.color)));
            spans.push(Span::raw(format!(" {text}")));
        }
        spans.push(Span::raw(" "));
        spans
    }

    /// What the chart left out, for the pane's bottom edge, in at most
    /// `width` cells: `crit, warn: no room at this height · RSS Σ (to
    /// 41.2 GiB) above the scale`, or shorter; `None` when it left out
    /// nothing.
    pub fn left_out_note(&self, width: usize) -> Option<String> {
        if self.left_out.is_empty() {
            return None;
        }
        let names = |why: fn(&Why) -> bool| -> Vec<&str> {
            self.left_out
                .iter()
                .filter(|l| why(&l.why))
                .map(|l| l.name.as_str())
                .collect()
        };
        let no_room = names(|w| matches!(w, Why::NoRoom));
        let mut long = Vec::new();
        if !no_room.is_empty() {
            long.push(format!("{}: no room at this height", no_room.join(", ")));
        }
        for l in &self.left_out {
            if let Why::AboveTheScale(max) = l.why {
                long.push(format!(
                    "{} (to {}) above the scale",
                    l.name,
                    theme::bytes(max as u64)
                ));
            }
        }
        let all: Vec<&str> = self.left_out.iter().map(|l| l.name.as_str()).collect();
        let forms = [
            format!(" {} ", long.join(" · ")),
            format!(" not drawn: {} ", all.join(", ")),
        ];
        let fits = forms.iter().find(|f| theme::width(f) <= width);
        Some(match fits {
            Some(f) => f.clone(),
            None => theme::fit(&forms[1], width),
        })
    }
}

/// Rows of the plot inside a chart drawn in `area`: the x axis and its
/// labels take two rows where the chart has them (see `render`).
fn plot_rows(area: Rect) -> u16 {
    if area.height >= X_LABELS_MIN_ROWS {
        area.height - 2
    } else {
        area.height
    }
}

/// The row (0 at the top) of a plot `rows` high on a 0..`y_max` axis in
/// which a braille dot for `v` lands, the way ratatui's canvas places it.
fn row_of(v: f64, y_max: f64, rows: u16) -> u16 {
    let dots = f64::from(rows) * 4.0;
    let y = ((y_max - v.clamp(0.0, y_max)) * (dots - 1.0) / y_max).round();
    (y as u16 / 4).min(rows - 1)
}

/// The latest time and the x-axis span: the run so far until it fills the
/// window. A fixed span would squeeze a young run into the right edge (at
/// 8 s into a one-minute axis, the last 15 % of the width), where a growth
/// that matters looks flat; a span rounded up to a round figure would
/// leave a blank strip on the left. The chart keeps one point at or past
/// the window's edge, so past the window the span is the window.
fn time_span(points: &VecDeque<ChartPoint>) -> (f64, f64) {
    let now = points.back().map_or(0.0, |p| p.t);
    let first = points.front().map_or(0.0, |p| p.t);
    let span = now - first;
    // A NaN time (bad input) gives the narrowest axis, not a NaN one.
    let span = if span.is_nan() {
        MIN_SPAN_SECONDS
    } else {
        span.clamp(MIN_SPAN_SECONDS, CHART_WINDOW_SECONDS)
    };
    (now, span)
}

/// How long before now a point of the axis is: `-8.4s` (tenths under
/// 10 s, where a rounded second would be off by several cells), `-37s`,
/// `-1m`, `-1m37s`.
fn span_label(seconds: f64) -> String {
    let tenths = (seconds * 10.0).round().max(0.0) as u64;
    if tenths < 100 && !tenths.is_multiple_of(10) {
        return format!("-{}.{}s", tenths / 10, tenths % 10);
    }
    let s = (seconds.round().max(0.0)) as u64;
    match (s / 60, s % 60) {
        (0, s) => format!("-{s}s"),
        (m, 0) => format!("-{m}m"),
        (m, s) => format!("-{m}m{s:02}s"),
    }
}

impl Widget for &ChartView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 || area.width == 0 {
            return;
        }
        if self.series.iter().all(|s| s.points.is_empty()) {
            Paragraph::new("waiting for samples…")
                .style(Style::new().fg(theme::DIM))
                .alignment(Alignment::Center)
                .render(area, buf);
            return;
        }
        let datasets: Vec<Dataset<'_>> = self
            .series
            .iter()
            .map(|s| {
                Dataset::default()
                    .marker(Marker::Braille)
                    .graph_type(GraphType::Line)
                    .style(Style::new().fg(s.color))
                    .data(&s.points)
            })
            .collect();
        let dim = Style::new().fg(theme::DIM);
        let mut x_axis = Axis::default()
            .bounds([self.now - self.span, self.now])
            .style(dim);
        if area.height >= X_LABELS_MIN_ROWS {
            x_axis = x_axis.labels(vec![
                Line::from(span_label(self.span)),
                Line::from(span_label(self.span / 2.0)),
                Line::from("now"),
            ]);
        }
        let y_labels: Vec<Line<'_>> = if area.height >= 5 {
            vec![
                Line::from("0"),
                Line::from(theme::bytes((self.y_max / 2.0) as u64)),
                Line::from(theme::bytes(self.y_max as u64)),
            ]
        } else {
            vec![Line::from("0"), Line::from(theme::bytes(self.y_max as u64))]
        };
        let y_axis = Axis::default()
            .bounds([0.0, self.y_max])
            .labels(y_labels)
            .style(dim);
        Chart::new(datasets)
            .x_axis(x_axis)
            .y_axis(y_axis)
            .legend_position(None)
            .render(area, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::widgets::testing::buffer_text;

    fn points() -> VecDeque<ChartPoint> {
        (0..60)
            .map(|i| ChartPoint {
                t: 100.0 + i as f64 * 2.0,
                footprint: (1 << 30) + i * (20 << 20),
                pss: (1 << 30) + i * (16 << 20),
                rss: (2 << 30) + i * (16 << 20),
                swap: 0,
                ceilings: vec![(CeilingSource::Cgroup, 4 << 30, (1 << 30) + i * (20 << 20))],
                gpus: vec![(0, 1 << 29, 80 << 30)],
            })
            .collect()
    }

    /// The memory chart of `pts` under a cgroup limit, warned at 20 % and
    /// critical at 10 % headroom.
    fn thresholds(pts: &VecDeque<ChartPoint>, kind: footprint::Kind) -> ChartView {
        ChartView::memory(
            pts,
            Some(CeilingSource::Cgroup),
            Some(20.0),
            Some(10.0),
            kind,
        )
    }

    #[test]
    fn series_thresholds_and_span() {
        let v = thresholds(&points(), footprint::Kind::WorkingSet);
        let names: Vec<&str> = v.series.iter().map(|s| s.name.as_str()).collect();
        // The cgroup's used is the footprint: one curve, named footprint.
        assert_eq!(
            names,
            ["RSS Σ", "warn", "crit", "limit", "PSS", "footprint"]
        );
        let legend = |v: &ChartView, w| -> String {
            v.legend(w).iter().map(|s| s.content.as_ref()).collect()
        };
        assert_eq!(
            legend(&v, 80),
            " ━ footprint (working set) ━ PSS ━ limit ━ crit ━ warn ━ RSS Σ "
        );
        // Narrower: short names, then the least important left out.
        assert_eq!(
            legend(&v, 50),
            " ━ footprint ━ PSS ━ limit ━ crit ━ warn ━ RSS Σ "
        );
        assert_eq!(legend(&v, 30), " ━ footprint ━ PSS ━ limit ");
        // The run so far: 118 s of points.
        assert_eq!(v.span, 118.0);
        let warn = &v.series[1].points[0].1;
        assert_eq!(v.series[1].name, "warn");
        assert!((warn - 0.8 * (4u64 << 30) as f64).abs() < 2.0);
        // The ceiling is always in view.
        assert!(v.y_max >= (4u64 << 30) as f64);

        // A footprint that is the PSS sum is one curve; what the cgroup
        // counts (more than the job) is another.
        let mut pts = points();
        for p in &mut pts {
            p.footprint = p.pss;
        }
        let v = thresholds(&pts, footprint::Kind::Pss);
        let names: Vec<&str> = v.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["RSS Σ", "cgroup used", "warn", "crit", "limit", "footprint"]
        );
        assert!(legend(&v, 80).starts_with(" ━ footprint (PSS) ━ cgroup used ━ limit"));
    }

    #[test]
    fn renders_lines_and_labels() {
        let v = ChartView::memory(
            &points(),
            Some(CeilingSource::Cgroup),
            Some(20.0),
            None,
            footprint::Kind::WorkingSet,
        );
        let area = Rect::new(0, 0, 60, 12);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        let text = buffer_text(&buf);
        assert!(text.contains("4.2 GiB"), "{text}");
        assert!(text.contains("now"), "{text}");
        assert!(text.contains("-1m58s"), "{text}");
        assert!(text.contains("-59s"), "{text}");
        // Braille dots were drawn in the series colours.
        let colours: Vec<Color> = buf
            .content()
            .iter()
            .filter(|c| {
                c.symbol()
                    .chars()
                    .next()
                    .is_some_and(|ch| ('\u{2801}'..='\u{28ff}').contains(&ch))
            })
            .map(|c| c.fg)
            .collect();
        assert!(colours.contains(&theme::FOOTPRINT));
        assert!(colours.contains(&theme::PSS));
        assert!(colours.contains(&theme::LIMIT));
        assert!(colours.contains(&theme::WARN));
    }

    /// Under a ceiling, an RSS sum above everything else is left out (and
    /// the legend says so) rather than drawn off the top. Without a
    /// ceiling it sets the scale.
    #[test]
    fn rss_sum_does_not_set_the_scale_under_a_ceiling() {
        let ws = footprint::Kind::WorkingSet;
        let mut pts = points();
        for p in &mut pts {
            p.rss = 40 << 30;
        }
        let v = ChartView::memory(&pts, Some(CeilingSource::Cgroup), None, None, ws);
        assert!((v.y_max - 1.05 * (4u64 << 30) as f64).abs() < 1.0);
        assert!(v.series.iter().all(|s| s.name != "RSS Σ"));
        assert_eq!(
            v.left_out_note(80).as_deref(),
            Some(" RSS Σ (to 40.0 GiB) above the scale ")
        );
        assert_eq!(v.left_out_note(20).as_deref(), Some(" not drawn: RSS Σ "));
        let v = ChartView::memory(&pts, None, None, None, ws);
        assert!(v.y_max >= (40u64 << 30) as f64);
        assert_eq!(v.left_out_note(80), None);
        for p in &mut pts {
            p.rss = 3 << 30;
        }
        let v = ChartView::memory(&pts, Some(CeilingSource::Cgroup), None, None, ws);
        assert!(v.series.iter().any(|s| s.name == "RSS Σ"));
        for s in &v.series {
            assert!(s.points.iter().all(|p| p.1 <= v.y_max), "{}", s.name);
        }
    }

    /// In three rows the limit, critical and warning lines would share the
    /// top one: the limit stays, the others are named as left out. With
    /// room, all three stay, each on its own row.
    #[test]
    fn threshold_lines_that_would_share_a_row_are_left_out() {
        let make = || thresholds(&points(), footprint::Kind::WorkingSet);
        let mut v = make();
        v.fit_rows(Rect::new(0, 0, 40, 3));
        let names: Vec<&str> = v.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["RSS Σ", "limit", "PSS", "footprint"]);
        assert_eq!(
            v.left_out_note(40).as_deref(),
            Some(" crit, warn: no room at this height ")
        );
        let mut v = make();
        v.fit_rows(Rect::new(0, 0, 40, 40));
        assert!(v.left_out.is_empty());
        let rows: Vec<u16> = ["limit", "crit", "warn"]
            .iter()
            .map(|n| {
                let s = v.series.iter().find(|s| s.name == *n).unwrap();
                row_of(s.points[0].1, v.y_max, plot_rows(Rect::new(0, 0, 40, 40)))
            })
            .collect();
        assert!(rows[0] < rows[1] && rows[1] < rows[2], "{rows:?}");
    }

    #[test]
    fn gpu_chart_goes_up_to_the_device_total() {
        let v = ChartView::gpu(&points());
        assert_eq!(v.series.len(), 1);
        assert_eq!(v.series[0].name, "GPU0");
        assert_eq!(v.y_max, (80u64 << 30) as f64);
    }

    #[test]
    fn span_is_the_run_so_far_up_to_the_window() {
        let at = |ts: &[f64]| {
            let pts = ts
                .iter()
                .map(|&t| ChartPoint {
                    t,
                    ..points()[0].clone()
                })
                .collect();
            time_span(&pts).1
        };
        assert_eq!(at(&[]), MIN_SPAN_SECONDS);
        assert_eq!(at(&[5.0]), MIN_SPAN_SECONDS);
        assert_eq!(at(&[0.0, 8.0]), 8.0);
        assert_eq!(at(&[0.5, 8.4]), 7.9);
        assert_eq!(at(&[0.0, 3000.0]), CHART_WINDOW_SECONDS);
        assert_eq!(at(&[0.0, f64::NAN]), MIN_SPAN_SECONDS);
        assert_eq!(span_label(8.0), "-8s");
        assert_eq!(span_label(8.44), "-8.4s");
        assert_eq!(span_label(4.2), "-4.2s");
        assert_eq!(span_label(37.4), "-37s");
        assert_eq!(span_label(60.0), "-1m");
        assert_eq!(span_label(97.0), "-1m37s");
    }

    #[test]
    fn empty_chart_says_so() {
        let v = ChartView::memory(&VecDeque::new(), None, None, None, footprint::Kind::Pss);
        let area = Rect::new(0, 0, 40, 5);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert!(buffer_text(&buf).contains("waiting for samples"));
    }
}
