//! The events pane: rules, actions, restarts, OOM kills, CUDA OOMs and
//! deaths, newest last, coloured by severity.

use std::collections::VecDeque;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

use crate::sinks::tui::app::EventLine;
use crate::sinks::tui::theme;

/// What the events pane shows (inside its frame).
#[derive(Debug, Clone)]
pub struct EventsView<'a> {
    pub events: &'a VecDeque<EventLine>,
    /// Events scrolled up from the newest (0 = following).
    pub scroll: usize,
}

/// Time and marker column; continuation rows are indented to match.
const INDENT: usize = 8;

/// The rows of one event: the first with its time and marker, the rest
/// wrapped under the text.
fn event_rows(ev: &EventLine, width: usize) -> Vec<Line<'static>> {
    let (style, mark) = theme::severity(ev.severity);
    let room = width.saturating_sub(INDENT).max(1);
    let chunks = word_wrap(&ev.text, room);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let lead = if i == 0 {
                vec![
                    Span::styled(
                        format!("{:>5} ", theme::clock(ev.t)),
                        Style::new().fg(theme::DIM),
                    ),
                    Span::styled(format!("{mark} "), style),
                ]
            } else {
                vec![Span::raw(" ".repeat(INDENT))]
            };
            let mut spans = lead;
            spans.push(Span::styled(chunk, style));
            Line::from(spans)
        })
        .collect()
}

/// Splits `text` into rows of at most `width` cells, between words where
/// it can and inside a word only when the word alone is too long.
fn word_wrap(text: &str, width: usize) -> Vec<String> {
    let mut rows = Vec::new();
    let mut cur = String::new();
    let mut used = 0;
    let mut buf = [0u8; 4];
    for word in text.split(' ') {
        let ww = theme::width(word);
        let sep = usize::from(!cur.is_empty());
        if used + sep + ww <= width {
            if sep == 1 {
                cur.push(' ');
            }
            cur.push_str(word);
            used += sep + ww;
            continue;
        }
        if !cur.is_empty() {
            rows.push(std::mem::take(&mut cur));
            used = 0;
        }
        for c in word.chars() {
            let w = theme::width(c.encode_utf8(&mut buf));
            if used + w > width && !cur.is_empty() {
                rows.push(std::mem::take(&mut cur));
                used = 0;
            }
            cur.push(c);
            used += w;
        }
    }
    rows.push(cur);
    rows
}

/// Ends a row whose event goes on below the pane with `…`, in the last
/// cell if the row fills the width.
fn mark_cut(row: &mut Line<'static>, width: usize) {
    let style = row.spans.last().map(|s| s.style).unwrap_or_default();
    if row.width() >= width
        && let Some(span) = row.spans.last_mut()
    {
        let text = span.content.to_string();
        // `fit` ends what it shortens with `…`.
        span.content = theme::fit(&text, theme::width(&text).saturating_sub(1).max(1)).into();
        return;
    }
    row.spans.push(Span::styled("…", style));
}

impl Widget for &EventsView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 || area.width == 0 {
            return;
        }
        if self.events.is_empty() {
            Line::styled("no events yet", Style::new().fg(theme::DIM)).render(area, buf);
            return;
        }
        let h = area.height as usize;
        let end = self.events.len().saturating_sub(self.scroll).max(1);
        // Newest at the bottom: walk up until the pane is full. An event
        // with more rows than are left keeps its first ones: its time and
        // what happened are at the start, a cut there leaves a tail that
        // says neither.
        let mut groups: Vec<Vec<Line<'static>>> = Vec::new();
        let mut left = h;
        for ev in self.events.range(..end).rev() {
            if left == 0 {
                break;
            }
            let mut ev_rows = event_rows(ev, area.width as usize);
            if ev_rows.len() > left {
                ev_rows.truncate(left);
                if let Some(last) = ev_rows.last_mut() {
                    mark_cut(last, area.width as usize);
                }
            }
            left -= ev_rows.len();
            groups.push(ev_rows);
        }
        let rows: Vec<Line<'static>> = groups.into_iter().rev().flatten().collect();
        for (y, row) in rows.into_iter().enumerate() {
            row.render(Rect::new(area.x, area.y + y as u16, area.width, 1), buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::app::Severity;
    use crate::sinks::tui::widgets::testing::{buffer_text, row_text};

    fn events(n: usize) -> VecDeque<EventLine> {
        (0..n)
            .map(|i| EventLine {
                t: 60.0 * i as f64,
                severity: if i == 2 {
                    Severity::Critical
                } else {
                    Severity::Info
                },
                text: format!("event {i}"),
            })
            .collect()
    }

    #[test]
    fn wraps_between_words() {
        assert_eq!(
            word_wrap("rule fired: headroom 19.9% (threshold 20.0%)", 16),
            ["rule fired:", "headroom 19.9%", "(threshold", "20.0%)"]
        );
        assert_eq!(word_wrap("abcdefgh ij", 3), ["abc", "def", "gh", "ij"]);
    }

    #[test]
    fn newest_last_and_coloured() {
        let ev = events(3);
        let v = EventsView {
            events: &ev,
            scroll: 0,
        };
        let area = Rect::new(0, 0, 30, 4);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert_eq!(row_text(&buf, 0), "00:00 · event 0");
        assert_eq!(row_text(&buf, 2), "02:00 ✗ event 2");
        assert_eq!(buf.cell((8, 2)).unwrap().fg, theme::CRIT);
    }

    #[test]
    fn shows_the_last_that_fit_and_scrolls() {
        let ev = events(10);
        let area = Rect::new(0, 0, 30, 3);
        let mut buf = Buffer::empty(area);
        (&EventsView {
            events: &ev,
            scroll: 0,
        })
            .render(area, &mut buf);
        assert_eq!(row_text(&buf, 2), "09:00 · event 9");
        let mut buf = Buffer::empty(area);
        (&EventsView {
            events: &ev,
            scroll: 5,
        })
            .render(area, &mut buf);
        assert_eq!(row_text(&buf, 2), "04:00 · event 4");
        // Long texts wrap under the text column; the newest stays at the
        // bottom.
        let mut ev = events(1);
        ev.push_back(EventLine {
            t: 1.0,
            severity: Severity::Warn,
            text: format!("{} tail", "x".repeat(25)),
        });
        let mut buf = Buffer::empty(area);
        (&EventsView {
            events: &ev,
            scroll: 0,
        })
            .render(area, &mut buf);
        assert_eq!(
            buffer_text(&buf),
            "00:00 · event 0\n00:01 ! xxxxxxxxxxxxxxxxxxxxxx\n        xxx tail"
        );
    }

    /// The pane, 30 cells wide and `rows` high, following the newest.
    fn draw(ev: &VecDeque<EventLine>, rows: u16) -> Buffer {
        let area = Rect::new(0, 0, 30, rows);
        let mut buf = Buffer::empty(area);
        (&EventsView {
            events: ev,
            scroll: 0,
        })
            .render(area, &mut buf);
        buf
    }

    fn warning(t: f64) -> EventLine {
        EventLine {
            t,
            severity: Severity::Warn,
            text: "headroom-warn firing: headroom 19.6% (threshold 20.0%)".into(),
        }
    }

    /// An event taller than the room left keeps its start (its time and
    /// what fired), cut at the end with `…`: the newest in a short pane,
    /// and an older one at the top of a full pane.
    #[test]
    fn an_event_that_does_not_fit_keeps_its_start() {
        let ev: VecDeque<EventLine> = [warning(262.0)].into_iter().collect();
        assert_eq!(
            buffer_text(&draw(&ev, 2)),
            "04:22 ! headroom-warn firing:\n        headroom 19.6%…"
        );

        let mut ev = events(1);
        ev.push_back(warning(262.0));
        ev.push_back(EventLine {
            t: 263.0,
            severity: Severity::Act,
            text: "warn (headroom-warn)".into(),
        });
        assert_eq!(
            buffer_text(&draw(&ev, 3)),
            "04:22 ! headroom-warn firing:\n        headroom 19.6%…\n04:23 » warn (headroom-warn)"
        );
    }
}
