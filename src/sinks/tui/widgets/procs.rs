//! The process table: one row per process of the tree, indented by depth
//! in tree order, with the fastest-growing process marked. A process with
//! children shows its family's growth, marked `Σ` (see `tui::growth`).
//! Columns that do not fit are dropped least useful first; the command
//! column takes the rest.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Cell, Row, Scrollbar, ScrollbarOrientation, ScrollbarState, StatefulWidget, Table, Widget,
};

use crate::sinks::tui::app::{ProcRow, SortKey};
use crate::sinks::tui::theme;
use crate::vocab::growth::Figure;
use crate::vocab::model::Role;

/// What the table shows (inside its pane frame).
#[derive(Debug, Clone)]
pub struct ProcTableView {
    pub(crate) rows: Vec<ProcRow>,
    pub sort: SortKey,
    pub reverse: bool,
    pub selected: Option<u32>,
    /// The fastest-growing process (`View::fastest`).
    pub fastest: Option<u32>,
    /// Index of the first row shown.
    pub offset: usize,
    /// Whether any GPU is watched (otherwise the GPU column is left out).
    pub gpu: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Pid,
    Role,
    Comm,
    Rss,
    Pss,
    Uss,
    Swap,
    Gpu,
    Growth,
}

impl Col {
    fn title(self) -> &'static str {
        match self {
            Col::Pid => "PID",
            Col::Role => "ROLE",
            Col::Comm => "COMMAND",
            Col::Rss => "RSS",
            Col::Pss => "PSS",
            Col::Uss => "USS",
            Col::Swap => "SWAP",
            Col::Gpu => "GPU",
            Col::Growth => "GROWTH/m",
        }
    }

    fn width(self) -> u16 {
        match self {
            Col::Pid => 7,
            Col::Role => 7,
            Col::Comm => 16,
            Col::Growth => 10,
            _ => 8,
        }
    }

    fn sort(self) -> Option<SortKey> {
        Some(match self {
            Col::Pid => SortKey::Pid,
            Col::Role => return None,
            Col::Comm => SortKey::Comm,
            Col::Rss => SortKey::Rss,
            Col::Pss => SortKey::Pss,
            Col::Uss => SortKey::Uss,
            Col::Swap => SortKey::Swap,
            Col::Gpu => SortKey::Gpu,
            Col::Growth => SortKey::Growth,
        })
    }

    fn right_aligned(self) -> bool {
        !matches!(self, Col::Role | Col::Comm)
    }
}

/// Rows the table can show in `height` cells (one goes to the header).
pub fn visible_rows(height: u16) -> usize {
    height.saturating_sub(1) as usize
}

fn role_label(r: Role) -> (&'static str, Style) {
    let style = match r {
        Role::Launcher => Style::new().fg(theme::DIM),
        Role::Trainer => Style::new().fg(theme::ACCENT),
        Role::Worker => Style::new(),
        Role::Other => Style::new().fg(Color::Magenta),
    };
    let text = match r {
        Role::Launcher => "launch",
        Role::Trainer => "trainer",
        Role::Worker => "worker",
        Role::Other => "other",
    };
    (text, style)
}

impl ProcTableView {
    /// The columns that fit in `width`, in display order.
    fn columns(&self, width: u16) -> Vec<Col> {
        let any = |f: &dyn Fn(&ProcRow) -> bool| self.rows.iter().any(f);
        let mut cols = vec![
            Col::Pid,
            Col::Role,
            Col::Comm,
            Col::Rss,
            Col::Pss,
            Col::Uss,
            Col::Swap,
            Col::Gpu,
            Col::Growth,
        ];
        if !self.gpu && !any(&|r| r.gpu.is_some()) {
            cols.retain(|c| *c != Col::Gpu);
        }
        // Dropped in this order until the command gets its minimum.
        let mut drop = vec![
            Col::Uss,
            Col::Rss,
            Col::Gpu,
            Col::Role,
            Col::Growth,
            Col::Pid,
        ];
        if !any(&|r| r.swap > 0) {
            drop.insert(0, Col::Swap);
        } else {
            drop.insert(2, Col::Swap);
        }
        let need = |cols: &[Col]| -> u16 {
            cols.iter().map(|c| c.width()).sum::<u16>() + cols.len().saturating_sub(1) as u16
        };
        for d in drop {
            if need(&cols) <= width {
                break;
            }
            cols.retain(|c| *c != d);
        }
        cols
    }

    /// One cell of row `r` in column `c`.
    fn cell(&self, c: Col, r: &ProcRow, fastest: bool) -> Line<'static> {
        match c {
            Col::Pid => Line::raw(r.pid.to_string()),
            Col::Role => {
                let (t, s) = role_label(r.role);
                Line::styled(t, s)
            }
            Col::Comm => {
                let indent = if self.sort == SortKey::Tree && r.depth > 0 {
                    format!("{}└ ", "  ".repeat((r.depth - 1).min(6)))
                } else {
                    String::new()
                };
                Line::from(vec![
                    Span::styled(indent, Style::new().fg(theme::DIM)),
                    Span::raw(r.comm.clone()),
                ])
            }
            Col::Rss => Line::raw(theme::bytes(r.rss)),
            Col::Pss => Line::styled(
                theme::bytes(r.pss),
                Style::new().add_modifier(Modifier::BOLD),
            ),
            Col::Uss => Line::raw(theme::bytes(r.uss)),
            Col::Swap => {
                if r.swap > 0 {
                    Line::styled(theme::bytes(r.swap), Style::new().fg(theme::WARN))
                } else {
                    Line::styled("0", Style::new().fg(theme::DIM))
                }
            }
            Col::Gpu => match r.gpu {
                Some(b) => Line::raw(theme::bytes(b)),
                None => Line::styled("-", Style::new().fg(theme::DIM)),
            },
            Col::Growth => growth_cell(r, fastest),
        }
    }
}

/// The growth column of row `r`: `Σ` where the figure is the family's,
/// `▲` on the fastest grower otherwise.
fn growth_cell(r: &ProcRow, fastest: bool) -> Line<'static> {
    let g = match r.growth {
        Figure::Rate(per_second) => per_second * 60.0,
        Figure::Flat => return Line::styled("flat", Style::new().fg(theme::DIM)),
        Figure::Unknown => return Line::styled("…", Style::new().fg(theme::DIM)),
    };
    // The fastest grower is the one whose own PSS grows fastest: a family
    // figure beside its `▲` would read as that rate (the row's colour
    // still marks it, and the summary line gives its own rate).
    let mark = match (r.family, fastest) {
        (true, _) => "Σ",
        (false, true) => "▲",
        (false, false) => "",
    };
    let text = format!("{mark}{}", theme::signed_bytes(g));
    if fastest {
        Line::styled(
            text,
            Style::new().fg(theme::CRIT).add_modifier(Modifier::BOLD),
        )
    } else if g >= 1024.0 * 1024.0 {
        Line::styled(text, Style::new().fg(theme::WARN))
    } else {
        Line::raw(text)
    }
}

impl Widget for &ProcTableView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 || area.width == 0 {
            return;
        }
        if self.rows.is_empty() {
            Line::styled("no processes yet", Style::new().fg(theme::DIM)).render(area, buf);
            return;
        }
        let visible = visible_rows(area.height);
        let scrollbar = self.rows.len() > visible && area.width > 20;
        let table_w = area.width - u16::from(scrollbar);
        let cols = self.columns(table_w);
        let header = Row::new(cols.iter().map(|c| {
            let mut title = c.title().to_string();
            let sorted = c.sort() == Some(self.sort);
            if sorted {
                let desc = matches!(
                    self.sort,
                    SortKey::Pss
                        | SortKey::Rss
                        | SortKey::Uss
                        | SortKey::Swap
                        | SortKey::Gpu
                        | SortKey::Growth
                ) != self.reverse;
                title.push(if desc { '▼' } else { '▲' });
            }
            let style = if sorted {
                Style::new().fg(theme::ACCENT).add_modifier(Modifier::BOLD)
            } else {
                Style::new().add_modifier(Modifier::BOLD)
            };
            let line = Line::styled(title, style);
            Cell::from(if c.right_aligned() {
                line.right_aligned()
            } else {
                line
            })
        }))
        .style(Style::new().bg(Color::Reset));
        let end = (self.offset + visible).min(self.rows.len());
        let start = self.offset.min(end);
        let rows = self.rows[start..end].iter().map(|r| {
            let fastest = self.fastest == Some(r.pid);
            let cells = cols.iter().map(|c| {
                let text = self.cell(*c, r, fastest);
                Cell::from(if c.right_aligned() {
                    text.right_aligned()
                } else {
                    text
                })
            });
            let mut style = Style::new();
            if fastest {
                style = style.fg(Color::LightRed).add_modifier(Modifier::BOLD);
            }
            if self.selected == Some(r.pid) {
                style = style.add_modifier(Modifier::REVERSED);
            }
            Row::new(cells).style(style)
        });
        let widths = cols.iter().map(|c| {
            if *c == Col::Comm {
                Constraint::Min(c.width())
            } else {
                Constraint::Length(c.width())
            }
        });
        let table = Table::new(rows, widths).header(header).column_spacing(1);
        Widget::render(table, Rect::new(area.x, area.y, table_w, area.height), buf);
        if scrollbar {
            let mut state = ScrollbarState::new(self.rows.len().saturating_sub(visible))
                .position(start)
                .viewport_content_length(visible);
            Scrollbar::new(ScrollbarOrientation::VerticalRight)
                .begin_symbol(None)
                .end_symbol(None)
                .track_symbol(Some("│"))
                .thumb_style(Style::new().fg(theme::ACCENT))
                .track_style(Style::new().fg(theme::DIM))
                .render(
                    Rect::new(area.x + area.width - 1, area.y + 1, 1, area.height - 1),
                    buf,
                    &mut state,
                );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::widgets::testing::{buffer_text, row_text};

    fn row(pid: u32, depth: usize, role: Role, pss: u64, growth: f64) -> ProcRow {
        ProcRow {
            pid,
            role,
            comm: "python".into(),
            depth,
            rss: pss * 2,
            pss,
            uss: pss / 2,
            swap: 0,
            gpu: None,
            growth: Figure::Rate(growth / 60.0),
            family: false,
        }
    }

    fn view() -> ProcTableView {
        ProcTableView {
            rows: vec![
                row(100, 0, Role::Launcher, 4 << 20, 0.0),
                ProcRow {
                    family: true,
                    ..row(101, 1, Role::Trainer, 2 << 30, 1024.0)
                },
                row(102, 2, Role::Worker, 300 << 20, 50.0 * 1024.0 * 1024.0),
            ],
            sort: SortKey::Tree,
            reverse: false,
            selected: Some(101),
            fastest: Some(102),
            offset: 0,
            gpu: false,
        }
    }

    #[test]
    fn wide_table_has_every_column_and_indents() {
        let area = Rect::new(0, 0, 100, 4);
        let mut buf = Buffer::empty(area);
        (&view()).render(area, &mut buf);
        let text = buffer_text(&buf);
        let header = row_text(&buf, 0);
        for h in ["PID", "ROLE", "COMMAND", "RSS", "PSS", "USS", "GROWTH/m"] {
            assert!(header.contains(h), "{header}");
        }
        // There is room for swap, but no GPU is watched.
        assert!(
            header.contains("SWAP") && !header.contains("GPU"),
            "{header}"
        );
        assert!(row_text(&buf, 2).contains("└ python"), "{text}");
        assert!(row_text(&buf, 3).contains("  └ python"), "{text}");
        assert!(row_text(&buf, 3).ends_with("▲+50.0 MiB"), "{text}");
        // The trainer has a child: its figure is its family's.
        assert!(row_text(&buf, 2).ends_with("Σ+1.0 KiB"), "{text}");
        assert!(!row_text(&buf, 3).contains('Σ'), "{text}");
        // The fastest row stands out, the selected one is reversed.
        assert_eq!(buf.cell((0, 3)).unwrap().fg, Color::LightRed);
        assert!(
            buf.cell((0, 2))
                .unwrap()
                .modifier
                .contains(Modifier::REVERSED)
        );
    }

    #[test]
    fn narrow_table_drops_columns_but_keeps_pss_and_growth() {
        let area = Rect::new(0, 0, 50, 4);
        let mut buf = Buffer::empty(area);
        (&view()).render(area, &mut buf);
        let header = row_text(&buf, 0);
        assert!(
            header.contains("PSS") && header.contains("GROWTH/m"),
            "{header}"
        );
        assert!(!header.contains("USS"), "{header}");
    }

    #[test]
    fn sorted_column_is_marked() {
        let mut v = view();
        v.sort = SortKey::Pss;
        let area = Rect::new(0, 0, 100, 4);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert!(row_text(&buf, 0).contains("PSS▼"));
        // Indentation only in tree order.
        assert!(!buffer_text(&buf).contains('└'));
    }

    #[test]
    fn long_tables_scroll_with_a_scrollbar() {
        let mut v = view();
        v.rows = (0..64)
            .map(|i| row(1000 + i, 1, Role::Worker, 1 << 20, 0.0))
            .collect();
        v.offset = 60;
        v.selected = None;
        v.fastest = None;
        let area = Rect::new(0, 0, 80, 5);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert!(
            row_text(&buf, 1).starts_with("   1060"),
            "{}",
            buffer_text(&buf)
        );
        assert!(
            row_text(&buf, 4).starts_with("   1063"),
            "{}",
            buffer_text(&buf)
        );
    }
}
