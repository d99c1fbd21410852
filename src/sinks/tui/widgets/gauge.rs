//! One headroom gauge per ceiling: how full it is, what it counts as used
//! and under which name (`footprint`, a cgroup's `working set`, the
//! machine's `used`: see `tui::footprint`), where the warn and critical
//! marks sit, how much is left, and when it runs out.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

use crate::sinks::tui::theme;
use crate::vocab::model::CeilingState;

/// What one gauge row shows.
#[derive(Debug, Clone)]
pub struct GaugeView {
    pub state: CeilingState,
    /// Headroom percentages at which the policy warns / acts.
    pub warn_percent: Option<f64>,
    pub critical_percent: Option<f64>,
    /// The nearest ceiling: marked, and the one the ETA is about.
    pub nearest: bool,
    /// Seconds until the headroom is gone (nearest ceiling only).
    pub eta_seconds: Option<f64>,
    /// Growth of the footprint in bytes/s (positive = growing).
    pub growth_per_second: Option<f64>,
    /// What the used figure is: `footprint`, `working set`, `used`.
    pub used_label: &'static str,
    /// Where that figure comes from, said where there is room: the
    /// footprint's `working set` or `PSS`.
    pub used_note: Option<&'static str>,
    /// Cells kept for the text after the bar, so the bars of several
    /// gauges line up (see `text_width`); `None`: as much as it needs.
    pub text_cols: Option<usize>,
}

/// Marker and label column.
const LABEL_W: usize = 9;
const MIN_BAR: usize = 10;

impl GaugeView {
    fn texts(&self) -> Vec<Vec<(String, Style)>> {
        let s = &self.state;
        let pct = s.headroom_percent();
        let zone = theme::zone(pct, self.warn_percent, self.critical_percent);
        let hr = Style::new().fg(zone).add_modifier(Modifier::BOLD);
        let dim = Style::new().fg(theme::DIM);
        let plain = Style::new();
        let eta = self.eta_seconds.map(|e| {
            let color = if e < 60.0 {
                theme::CRIT
            } else if e < 600.0 {
                theme::WARN
            } else {
                Color::Reset
            };
            (
                format!("ETA {}", theme::duration(e)),
                Style::new().fg(color).add_modifier(Modifier::BOLD),
            )
        });
        let rate = self
            .growth_per_second
            .filter(|r| *r > 0.0)
            .map(|r| (format!(" ({}/s)", theme::signed_bytes(r)), dim));
        let used = theme::bytes(s.used_bytes);
        let of = format!("{used} / {}", theme::bytes(s.ceiling.bytes));
        let left = format!("{} left", theme::bytes(s.headroom_bytes));
        let pct_s = format!("{pct:.1}%");
        let sep = ("  ".to_string(), plain);
        let label = |note: Option<&str>| {
            let text = match note {
                Some(n) => format!("{} ({n}) ", self.used_label),
                None => format!("{} ", self.used_label),
            };
            (text, dim)
        };
        let tail = vec![
            sep.clone(),
            (left.clone(), hr),
            (format!(" ({pct_s})"), dim),
        ];
        let mut noted = vec![label(self.used_note), (of.clone(), plain)];
        noted.extend(tail.iter().cloned());
        let mut long = vec![label(None), (of, plain)];
        long.extend(tail);
        let mut named = vec![
            label(None),
            (used, plain),
            sep.clone(),
            (left.clone(), hr),
            (format!(" {pct_s}"), dim),
        ];
        let mut mid = vec![(left, hr), (format!(" {pct_s}"), dim)];
        let mut short = vec![(pct_s, hr)];
        if let Some(eta) = eta {
            for form in [&mut noted, &mut long] {
                form.push(sep.clone());
                form.push(eta.clone());
                if let Some(r) = &rate {
                    form.push(r.clone());
                }
            }
            for form in [&mut named, &mut mid] {
                form.push(sep.clone());
                form.push(eta.clone());
            }
            short.push((" ".into(), plain));
            short.push(eta);
        }
        let mut forms = vec![long, named, mid, short];
        if self.used_note.is_some() {
            forms.insert(0, noted);
        }
        forms
    }
}

impl GaugeView {
    /// Cells the text after the bar takes in a row `width` cells wide
    /// (including the space before it).
    pub fn text_width(&self, width: u16) -> usize {
        let room = (width as usize).saturating_sub(LABEL_W.min(width as usize / 3));
        self.texts()
            .iter()
            .map(|t| text_width(t) + 1)
            .find(|tw| room >= tw + MIN_BAR.max(room / 4))
            .unwrap_or(0)
    }
}

impl Widget for &GaugeView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 || area.width < 4 {
            return;
        }
        let w = area.width as usize;
        let label_w = LABEL_W.min(w / 3);
        let mut label = String::from(if self.nearest { "▶ " } else { "  " });
        label.push_str(self.state.ceiling.source.as_str());
        let label_style = if self.nearest {
            Style::new().add_modifier(Modifier::BOLD)
        } else {
            Style::new().fg(theme::DIM)
        };
        let label = theme::fit(&label, label_w);
        buf.set_stringn(area.x, area.y, &label, label_w, label_style);

        let room = w - label_w;
        let texts = self.texts();
        let cols = self
            .text_cols
            .unwrap_or_else(|| self.text_width(area.width));
        let text = texts
            .iter()
            .find(|t| text_width(t) < cols)
            .cloned()
            .unwrap_or_default();
        let text_w = if text.is_empty() { 0 } else { cols.min(room) };
        let bar_w = room.saturating_sub(text_w);
        let bar_x = area.x + label_w as u16;
        self.draw_bar(Rect::new(bar_x, area.y, bar_w as u16, 1), buf);
        if !text.is_empty() {
            let spans: Vec<Span<'_>> = std::iter::once(Span::raw(" "))
                .chain(text.into_iter().map(|(s, st)| Span::styled(s, st)))
                .collect();
            Line::from(spans).render(
                Rect::new(bar_x + bar_w as u16, area.y, text_w as u16, 1),
                buf,
            );
        }
    }
}

fn text_width(parts: &[(String, Style)]) -> usize {
    parts.iter().map(|(s, _)| theme::width(s)).sum()
}

impl GaugeView {
    fn draw_bar(&self, area: Rect, buf: &mut Buffer) {
        let w = area.width as usize;
        if w == 0 {
            return;
        }
        let s = &self.state;
        let frac = if s.ceiling.bytes == 0 {
            1.0
        } else {
            (s.used_bytes as f64 / s.ceiling.bytes as f64).clamp(0.0, 1.0)
        };
        let filled = (frac * w as f64).round() as usize;
        let zone = theme::zone(
            s.headroom_percent(),
            self.warn_percent,
            self.critical_percent,
        );
        let mark_at = |p: Option<f64>| {
            p.filter(|p| (0.0..100.0).contains(p))
                .map(|p| (((100.0 - p) / 100.0 * w as f64).round() as usize).min(w - 1))
        };
        let warn = mark_at(self.warn_percent);
        let crit = mark_at(self.critical_percent);
        for i in 0..w {
            let x = area.x + i as u16;
            let in_fill = i < filled;
            let (sym, style) = if Some(i) == crit || Some(i) == warn {
                let c = if Some(i) == crit {
                    theme::CRIT
                } else {
                    theme::WARN
                };
                if in_fill {
                    // A dark line cut into the bar stays visible on any fill.
                    ("┃", Style::new().fg(Color::Black).bg(zone))
                } else {
                    ("┃", Style::new().fg(c).add_modifier(Modifier::BOLD))
                }
            } else if in_fill {
                ("█", Style::new().fg(zone))
            } else {
                ("░", Style::new().fg(theme::DIM))
            };
            if let Some(cell) = buf.cell_mut((x, area.y)) {
                cell.set_symbol(sym).set_style(style);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::widgets::testing::row_text;
    use crate::vocab::model::{Ceiling, CeilingSource};

    fn gauge(used: u64, limit: u64) -> GaugeView {
        GaugeView {
            state: CeilingState {
                ceiling: Ceiling {
                    source: CeilingSource::Cgroup,
                    bytes: limit,
                },
                used_bytes: used,
                headroom_bytes: limit - used,
            },
            warn_percent: Some(20.0),
            critical_percent: Some(10.0),
            nearest: true,
            eta_seconds: Some(192.0),
            growth_per_second: Some(4.0 * 1024.0 * 1024.0),
            used_label: "footprint",
            used_note: None,
            text_cols: None,
        }
    }

    #[test]
    fn bar_marks_and_text() {
        let area = Rect::new(0, 0, 120, 1);
        let mut buf = Buffer::empty(area);
        (&gauge(3 << 30, 4 << 30)).render(area, &mut buf);
        let text = row_text(&buf, 0);
        assert!(text.starts_with("▶ cgroup "), "{text}");
        assert!(
            text.ends_with(
                "footprint 3.0 GiB / 4.0 GiB  1.0 GiB left (25.0%)  ETA 3m 12s (+4.0 MiB/s)"
            ),
            "{text}"
        );
        // 25 % headroom under a 20 % warn mark: still green.
        let bar: String = text.chars().skip(9).take_while(|c| *c != ' ').collect();
        let n = bar.chars().count();
        assert_eq!(bar.chars().filter(|c| *c == '┃').count(), 2, "{bar}");
        // The marks sit at 80 % and 90 % of the bar, past the 75 % fill.
        let marks: Vec<usize> = bar
            .chars()
            .enumerate()
            .filter(|(_, c)| *c == '┃')
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            marks,
            [
                (n as f64 * 0.8).round() as usize,
                (n as f64 * 0.9).round() as usize
            ]
        );
        assert_eq!(buf.cell((9, 0)).unwrap().fg, theme::OK);
        assert_eq!(buf.cell((9 + marks[0] as u16, 0)).unwrap().fg, theme::WARN);
        assert_eq!(buf.cell((9 + marks[1] as u16, 0)).unwrap().fg, theme::CRIT);
    }

    #[test]
    fn critical_fill_is_red_and_marks_cut_into_it() {
        let area = Rect::new(0, 0, 60, 1);
        let mut buf = Buffer::empty(area);
        let mut g = gauge(95, 100);
        g.eta_seconds = None;
        (&g).render(area, &mut buf);
        assert_eq!(buf.cell((9, 0)).unwrap().fg, theme::CRIT);
        let text = row_text(&buf, 0);
        assert!(!text.contains("ETA"), "{text}");
        assert!(text.contains("5 B left"), "{text}");
        let mark = (9..60)
            .find(|&x| buf.cell((x, 0)).unwrap().symbol() == "┃")
            .unwrap();
        assert_eq!(buf.cell((mark, 0)).unwrap().bg, theme::CRIT);
    }

    #[test]
    fn a_common_text_column_aligns_the_bars() {
        let area = Rect::new(0, 0, 100, 1);
        let a = gauge(3 << 30, 4 << 30);
        let mut b = gauge(1 << 30, 4 << 30);
        b.eta_seconds = None;
        b.nearest = false;
        let cols = a.text_width(100).max(b.text_width(100));
        let bar_end = |g: &GaugeView| {
            let g = GaugeView {
                text_cols: Some(cols),
                ..g.clone()
            };
            let mut buf = Buffer::empty(area);
            (&g).render(area, &mut buf);
            (0..100u16)
                .rev()
                .find(|&x| matches!(buf.cell((x, 0)).unwrap().symbol(), "█" | "░" | "┃"))
                .unwrap()
        };
        assert_eq!(bar_end(&a), bar_end(&b));
    }

    #[test]
    fn narrow_gauge_keeps_the_percentage() {
        let area = Rect::new(0, 0, 36, 1);
        let mut buf = Buffer::empty(area);
        (&gauge(3 << 30, 4 << 30)).render(area, &mut buf);
        let text = row_text(&buf, 0);
        assert!(text.contains("25.0%"), "{text}");
        assert!(text.contains('█'), "{text}");
    }
}
