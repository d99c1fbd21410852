//! Memory over the last minutes. The memory chart has the tree's PSS and
//! RSS, what the nearest ceiling counts as used, the ceiling with its warn
//! and critical lines, and swap. GPU memory per device gets its own chart
//! (in the GPU panel): on one axis, 80 GiB of GPU memory would flatten a
//! 16 GiB cgroup limit and everything under it into the bottom rows.

use std::collections::VecDeque;

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Chart, Dataset, GraphType, Paragraph, Widget};

use crate::model::CeilingSource;
use crate::tui::app::{CHART_WINDOW_SECONDS, ChartPoint};
use crate::tui::theme;

/// One line of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
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
}

/// The narrowest x axis, for a run's first sample: a zero-wide axis would
/// have no scale.
const MIN_SPAN_SECONDS: f64 = 2.0;

impl ChartView {
    /// The memory chart of `points` against the ceiling of kind `source`
    /// (the nearest one now), with threshold lines at these headroom
    /// percentages.
    pub(crate) fn memory(
        points: &VecDeque<ChartPoint>,
        source: Option<CeilingSource>,
        warn_percent: Option<f64>,
        critical_percent: Option<f64>,
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
        // Drawing order: where lines cross, the later one shows. The
        // approximate RSS sum goes below everything, the limit and its
        // marks above the usage lines, and the tree's PSS on top.
        let mut series = vec![Series {
            name: "RSS Σ".into(),
            color: theme::RSS,
            points: collect(&|p| Some(p.rss)),
        }];
        if points.iter().any(|p| p.swap > 0) {
            series.push(Series {
                name: "swap".into(),
                color: theme::SWAP,
                points: collect(&|p| Some(p.swap)),
            });
        }
        if let Some(src) = source {
            series.push(Series {
                name: format!("{} used", src.as_str()),
                color: theme::USED,
                points: collect(&|p| ceiling(p).map(|c| c.1)),
            });
            let line_at = |pct: f64| {
                move |p: &ChartPoint| ceiling(p).map(|c| (c.0 as f64 * (1.0 - pct / 100.0)) as u64)
            };
            if let Some(w) = warn_percent {
                series.push(Series {
                    name: "warn".into(),
                    color: theme::WARN,
                    points: collect(&line_at(w)),
                });
            }
            if let Some(c) = critical_percent {
                series.push(Series {
                    name: "crit".into(),
                    color: Color::LightRed,
                    points: collect(&line_at(c)),
                });
            }
            series.push(Series {
                name: "limit".into(),
                color: theme::LIMIT,
                points: collect(&|p| ceiling(p).map(|c| c.0)),
            });
        }
        series.push(Series {
            name: "PSS".into(),
            color: theme::PSS,
            points: collect(&|p| Some(p.pss)),
        });
        // Scaled to the ceiling and what counts against it. The RSS sum
        // double-counts shared pages and can be several times the PSS with
        // forked workers; letting it set the scale would squash the lines
        // that matter, so it may run off the top.
        let scale_rss = source.is_none();
        let y_max = series
            .iter()
            .filter(|s| scale_rss || s.name != "RSS Σ")
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max);
        Self {
            series,
            span,
            now,
            y_max: if y_max > 0.0 { y_max * 1.05 } else { 1.0 },
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
        }
    }

    /// The legend, for the pane title: `━ PSS ━ used ━ limit …`, most
    /// important first so a narrow title cuts the least useful.
    pub fn legend(&self) -> Vec<Span<'static>> {
        let rank = |name: &str| match name {
            "PSS" => 0,
            n if n.ends_with("used") => 1,
            "limit" => 2,
            "warn" => 3,
            "crit" => 4,
            _ => 5,
        };
        let mut order: Vec<&Series> = self.series.iter().collect();
        order.sort_by_key(|s| rank(&s.name));
        let mut spans = Vec::new();
        for s in order {
            spans.push(Span::styled(" ━", Style::new().fg(s.color)));
            spans.push(Span::raw(format!(" {}", s.name)));
        }
        spans.push(Span::raw(" "));
        spans
    }
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
        if area.height >= 6 {
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
    use crate::tui::widgets::testing::buffer_text;

    fn points() -> VecDeque<ChartPoint> {
        (0..60)
            .map(|i| ChartPoint {
                t: 100.0 + i as f64 * 2.0,
                pss: (1 << 30) + i * (16 << 20),
                rss: (2 << 30) + i * (16 << 20),
                swap: 0,
                ceilings: vec![(CeilingSource::Cgroup, 4 << 30, (1 << 30) + i * (20 << 20))],
                gpus: vec![(0, 1 << 29, 80 << 30)],
            })
            .collect()
    }

    #[test]
    fn series_thresholds_and_span() {
        let v = ChartView::memory(
            &points(),
            Some(CeilingSource::Cgroup),
            Some(20.0),
            Some(10.0),
        );
        let names: Vec<&str> = v.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["RSS Σ", "cgroup used", "warn", "crit", "limit", "PSS"]
        );
        let legend: String = v.legend().iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(
            legend,
            " ━ PSS ━ cgroup used ━ limit ━ warn ━ crit ━ RSS Σ "
        );
        // The run so far: 118 s of points.
        assert_eq!(v.span, 118.0);
        let warn = &v.series[2].points[0].1;
        assert_eq!(v.series[2].name, "warn");
        assert!((warn - 0.8 * (4u64 << 30) as f64).abs() < 2.0);
        // The ceiling is always in view.
        assert!(v.y_max >= (4u64 << 30) as f64);
    }

    #[test]
    fn renders_lines_and_labels() {
        let v = ChartView::memory(&points(), Some(CeilingSource::Cgroup), Some(20.0), None);
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
        assert!(colours.contains(&theme::PSS));
        assert!(colours.contains(&theme::LIMIT));
        assert!(colours.contains(&theme::WARN));
    }

    #[test]
    fn rss_sum_does_not_set_the_scale_under_a_ceiling() {
        let mut pts = points();
        for p in &mut pts {
            p.rss = 40 << 30;
        }
        let v = ChartView::memory(&pts, Some(CeilingSource::Cgroup), None, None);
        assert!((v.y_max - 1.05 * (4u64 << 30) as f64).abs() < 1.0);
        let v = ChartView::memory(&pts, None, None, None);
        assert!(v.y_max >= (40u64 << 30) as f64);
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
        let v = ChartView::memory(&VecDeque::new(), None, None, None);
        let area = Rect::new(0, 0, 40, 5);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert!(buffer_text(&buf).contains("waiting for samples"));
    }
}
