//! One line of totals under the gauges: the tree's size, its breakdowns
//! (PSS, RSS Σ, USS, each under its own name), swap, pressure and the
//! fastest-growing process. Items that do not fit are left out by
//! priority, never cut in half. A tree that holds no memory any more (torn
//! down by a stop) says so instead of showing stale breakdowns beside the
//! memory its cgroup still holds.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

use crate::sinks::tui::theme;
use crate::vocab::model::{Psi, SystemSample, TreeTotals};

/// What the totals line shows.
#[derive(Debug, Clone)]
pub struct SummaryView<'a> {
    pub tree: &'a TreeTotals,
    pub system: &'a SystemSample,
    pub psi: Option<Psi>,
    /// (pid, comm, bytes/s) of the fastest-growing process.
    pub fastest: Option<(u32, &'a str, f64)>,
    /// No process of the tree holds memory any more (`footprint::tree_released`).
    pub released: bool,
}

/// (priority: lower shows first, label, value, value style)
type Item<'a> = (u8, &'a str, String, Style);

impl SummaryView<'_> {
    /// The tree's figures by process, summed: each under its own name (the
    /// footprint is the gauges').
    fn breakdowns(&self) -> Vec<Item<'static>> {
        let bold = Style::new().add_modifier(Modifier::BOLD);
        let swap_style = if self.tree.swap_bytes > 0 || self.system.swap_out_bytes_per_s > 0.0 {
            Style::new().fg(theme::WARN)
        } else {
            Style::new()
        };
        let mut swap = theme::bytes(self.tree.swap_bytes);
        if self.system.swap_out_bytes_per_s >= 1024.0 {
            swap.push_str(&format!(
                " (out {}/s)",
                theme::bytes(self.system.swap_out_bytes_per_s as u64)
            ));
        }
        vec![
            (0, "procs ", self.tree.procs.to_string(), bold),
            (
                0,
                "PSS ",
                theme::bytes(self.tree.pss_bytes),
                bold.fg(theme::PSS),
            ),
            (
                3,
                "RSS Σ ",
                theme::bytes(self.tree.rss_bytes),
                Style::new().fg(theme::RSS),
            ),
            (4, "USS ", theme::bytes(self.tree.uss_bytes), Style::new()),
            (2, "swap ", swap, swap_style),
        ]
    }

    /// The machine's side: memory pressure and what is available.
    fn push_system(&self, items: &mut Vec<Item<'_>>) {
        if let Some(p) = self.psi {
            let style = if p.full_avg10 >= 10.0 {
                Style::new().fg(theme::CRIT)
            } else if p.some_avg10 >= 10.0 {
                Style::new().fg(theme::WARN)
            } else {
                Style::new()
            };
            items.push((
                2,
                "PSI ",
                format!("{:.1}/{:.1}", p.some_avg10, p.full_avg10),
                style,
            ));
        }
        if self.system.mem_total_bytes > 0 {
            items.push((
                5,
                "avail ",
                theme::bytes(self.system.mem_available_bytes),
                Style::new(),
            ));
        }
    }
}

impl Widget for &SummaryView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 {
            return;
        }
        let dim = Style::new().fg(theme::DIM);
        let bold = Style::new().add_modifier(Modifier::BOLD);
        let mut items: Vec<Item<'_>> = if self.released {
            let state = if self.tree.procs == 0 {
                "no process left"
            } else {
                "exiting, holding no memory"
            };
            vec![
                (0, "procs ", self.tree.procs.to_string(), bold),
                (0, "", state.to_string(), bold.fg(theme::WARN)),
            ]
        } else {
            self.breakdowns()
        };
        self.push_system(&mut items);
        if let Some((pid, comm, rate)) = self.fastest.filter(|_| !self.released) {
            items.push((
                1,
                "fastest ",
                format!(
                    "{pid} {} {}/min",
                    theme::fit(comm, 16),
                    theme::signed_bytes(rate * 60.0)
                ),
                Style::new().fg(theme::CRIT).add_modifier(Modifier::BOLD),
            ));
        }
        let sep = " · ";
        let item_w = |i: &Item<'_>| theme::width(i.1) + theme::width(&i.2);
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| items[i].0);
        let mut keep = vec![false; items.len()];
        let mut used = 1; // leading space
        for i in order {
            let need = item_w(&items[i]) + if used > 1 { theme::width(sep) } else { 0 };
            if used + need <= area.width as usize {
                keep[i] = true;
                used += need;
            }
        }
        let mut spans = vec![Span::raw(" ")];
        for (i, (_, label, value, style)) in items.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            if spans.len() > 1 {
                spans.push(Span::styled(sep, dim));
            }
            spans.push(Span::styled(*label, dim));
            spans.push(Span::styled(value.clone(), *style));
        }
        Line::from(spans).render(area, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::widgets::testing::row_text;

    #[test]
    fn drops_low_priority_items_when_narrow() {
        let tree = TreeTotals {
            procs: 9,
            rss_bytes: 5 << 30,
            pss_bytes: 3 << 30,
            uss_bytes: 2 << 30,
            swap_bytes: 0,
            footprint_bytes: 3 << 30,
            pss_age_seconds: 0.0,
        };
        let system = SystemSample {
            mem_total_bytes: 16 << 30,
            mem_available_bytes: 8 << 30,
            ..Default::default()
        };
        let v = SummaryView {
            tree: &tree,
            system: &system,
            psi: Some(Psi {
                some_avg10: 1.25,
                full_avg10: 0.0,
            }),
            fastest: Some((4242, "python", 1024.0 * 1024.0)),
            released: false,
        };
        let area = Rect::new(0, 0, 140, 1);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert_eq!(
            row_text(&buf, 0),
            " procs 9 · PSS 3.0 GiB · RSS Σ 5.0 GiB · USS 2.0 GiB · swap 0 B · PSI 1.2/0.0 · avail 8.0 GiB · fastest 4242 python +60.0 MiB/min"
        );
        let area = Rect::new(0, 0, 60, 1);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        assert_eq!(
            row_text(&buf, 0),
            " procs 9 · PSS 3.0 GiB · fastest 4242 python +60.0 MiB/min"
        );
    }
}
