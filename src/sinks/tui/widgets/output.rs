//! The output pane: the last lines of the job's output, long lines
//! wrapped, scrollable.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

use crate::sinks::tui::output::OutputBuffer;
use crate::sinks::tui::theme;

/// What the output pane shows (inside its frame).
#[derive(Debug, Clone)]
pub struct OutputView<'a> {
    pub output: &'a OutputBuffer,
    /// Lines scrolled up from the newest (0 = following).
    pub scroll: usize,
}

/// Splits a styled line into rows of at most `width` cells.
fn wrap(line: Line<'static>, width: usize) -> Vec<Line<'static>> {
    let mut rows = vec![Vec::<Span<'static>>::new()];
    let mut used = 0;
    let mut buf = [0u8; 4];
    for span in line.spans {
        let mut cur = String::new();
        for c in span.content.chars() {
            let w = theme::width(c.encode_utf8(&mut buf));
            if used + w > width && used > 0 {
                if !cur.is_empty()
                    && let Some(row) = rows.last_mut()
                {
                    row.push(Span::styled(std::mem::take(&mut cur), span.style));
                }
                rows.push(Vec::new());
                used = 0;
            }
            cur.push(c);
            used += w;
        }
        if !cur.is_empty()
            && let Some(row) = rows.last_mut()
        {
            row.push(Span::styled(cur, span.style));
        }
    }
    rows.into_iter().map(Line::from).collect()
}

impl Widget for &OutputView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 || area.width == 0 {
            return;
        }
        let len = self.output.len();
        if len == 0 {
            Line::styled("no output yet", Style::new().fg(theme::DIM)).render(area, buf);
            return;
        }
        let h = area.height as usize;
        let end = len.saturating_sub(self.scroll).max(1);
        // Walk up from the bottom until the pane is full.
        let mut rows: Vec<Line<'static>> = Vec::with_capacity(h);
        let mut i = end;
        while i > 0 && rows.len() < h {
            i -= 1;
            let wrapped = wrap(self.output.styled_line(i), area.width as usize);
            rows.extend(wrapped.into_iter().rev());
        }
        rows.truncate(h);
        rows.reverse();
        for (y, row) in rows.into_iter().enumerate() {
            row.render(Rect::new(area.x, area.y + y as u16, area.width, 1), buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::widgets::testing::row_text;

    #[test]
    fn bottom_lines_wrapped() {
        let mut out = OutputBuffer::default();
        out.feed(b"one\r\ntwo\r\n\x1b[31mthree-is-long\x1b[0m\r\n");
        let v = OutputView {
            output: &out,
            scroll: 0,
        };
        let area = Rect::new(0, 0, 8, 3);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert_eq!(row_text(&buf, 0), "two");
        assert_eq!(row_text(&buf, 1), "three-is");
        assert_eq!(row_text(&buf, 2), "-long");
        assert_eq!(buf.cell((0, 2)).unwrap().fg, ratatui::style::Color::Red);
        let v = OutputView {
            output: &out,
            scroll: 1,
        };
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert_eq!(row_text(&buf, 0), "one");
        assert_eq!(row_text(&buf, 1), "two");
    }

    #[test]
    fn wide_characters_wrap_on_cell_width() {
        let rows = wrap(Line::from("日本語テキ"), 4);
        let texts: Vec<String> = rows.iter().map(|l| l.to_string()).collect();
        assert_eq!(texts, ["日本", "語テ", "キ"]);
    }
}
