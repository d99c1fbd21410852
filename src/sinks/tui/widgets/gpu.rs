//! The GPU panel: per device how much is used and by whom (the tree or
//! processes outside it), per tree process its GPU memory, and PyTorch's
//! allocated / reserved figures when the job reports them.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

use crate::sinks::tui::app::TorchMem;
use crate::sinks::tui::theme;
use crate::sinks::tui::widgets::ChartView;
use crate::vocab::model::GpuSample;

/// One process with GPU memory.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProc {
    pub pid: u32,
    pub comm: String,
    pub gpu_bytes: Option<u64>,
    pub torch: Vec<TorchMem>,
}

/// What the GPU panel shows (inside its pane frame).
#[derive(Debug, Clone)]
pub struct GpuPanelView<'a> {
    pub gpus: &'a [GpuSample],
    pub procs: Vec<GpuProc>,
    /// GPU memory over time, drawn between the devices and the processes
    /// when there is room.
    pub history: Option<ChartView>,
}

/// Fewer rows than this and the GPU chart is left out.
const MIN_CHART_ROWS: usize = 4;

/// `54.3/80.0 GiB`, or `512 MiB/80.0 GiB` when the units differ.
fn used_of(used: u64, total: u64) -> String {
    let (u, t) = (theme::bytes(used), theme::bytes(total));
    match (u.rsplit_once(' '), t.rsplit_once(' ')) {
        (Some((un, uu)), Some(_)) if t.ends_with(uu) => format!("{un}/{t}"),
        _ => format!("{u}/{t}"),
    }
}

impl GpuPanelView<'_> {
    /// The pane title: the device model when every device is the same.
    pub fn title(&self) -> String {
        match self.gpus.first() {
            Some(first) if self.gpus.iter().all(|g| g.name == first.name) => {
                if self.gpus.len() > 1 {
                    format!(" GPU · {} ×{} ", first.name, self.gpus.len())
                } else {
                    format!(" GPU · {} ", first.name)
                }
            }
            _ => " GPU ".into(),
        }
    }

    /// (device lines, process lines).
    fn lines(&self, width: usize) -> (Vec<Line<'static>>, Vec<Line<'static>>) {
        let dim = Style::new().fg(theme::DIM);
        let bold = Style::new().add_modifier(Modifier::BOLD);
        let mut devices = Vec::new();
        let same_model = self.title() != " GPU ";
        for (i, g) in self.gpus.iter().enumerate() {
            let color = theme::GPUS[i % theme::GPUS.len()];
            if !same_model {
                devices.push(Line::styled(theme::fit(&g.name, width), dim));
            }
            let head = format!("{} ", g.index);
            let numbers = format!(" {}", used_of(g.used_bytes, g.total_bytes));
            let util = g
                .util_percent
                .map(|u| format!(" {u:>3}%"))
                .unwrap_or_default();
            let bar_w = width
                .saturating_sub(head.len() + theme::width(&numbers) + util.len())
                .max(4);
            let cells = |b: u64| {
                if g.total_bytes == 0 {
                    0
                } else {
                    ((b as f64 / g.total_bytes as f64) * bar_w as f64).round() as usize
                }
            };
            let tree = cells(g.tree_bytes).min(bar_w);
            let other = cells(g.used_bytes.saturating_sub(g.tree_bytes)).min(bar_w - tree);
            devices.push(Line::from(vec![
                Span::styled(head, bold.fg(color)),
                Span::styled("█".repeat(tree), Style::new().fg(color)),
                Span::styled("▒".repeat(other), Style::new().fg(theme::WARN)),
                Span::styled("░".repeat(bar_w - tree - other), dim),
                Span::styled(numbers, bold),
                Span::styled(util, dim),
            ]));
            devices.push(Line::from(vec![
                Span::styled("  tree ", dim),
                Span::styled(theme::bytes(g.tree_bytes), Style::new().fg(color)),
                Span::styled(" · others ", dim),
                Span::styled(
                    theme::bytes(g.foreign_bytes),
                    Style::new().fg(if g.foreign_bytes > 0 {
                        theme::WARN
                    } else {
                        theme::DIM
                    }),
                ),
            ]));
            let (alloc, reserved) = self.torch_on(g.index);
            if let Some(alloc) = alloc {
                let long = vec![
                    Span::styled("  torch alloc ", dim),
                    Span::raw(theme::bytes(alloc)),
                    Span::styled(" · reserved ", dim),
                    Span::raw(theme::bytes(reserved)),
                ];
                let line = Line::from(long);
                devices.push(if line.width() <= width {
                    line
                } else {
                    Line::from(vec![
                        Span::styled("  torch alloc/rsvd ", dim),
                        Span::raw(used_of(alloc, reserved)),
                    ])
                });
            }
        }
        let mut procs = Vec::new();
        if !self.procs.is_empty() {
            procs.push(Line::styled(
                format!("{:>7} {:<12} {:>8} {}", "PID", "COMMAND", "GPU", "TORCH"),
                bold,
            ));
            for p in &self.procs {
                let main = format!(
                    "{:>7} {:<12} {:>8}",
                    p.pid,
                    theme::fit(&p.comm, 12),
                    p.gpu_bytes.map_or("-".into(), theme::bytes)
                );
                if p.torch.is_empty() {
                    procs.push(Line::raw(main));
                    continue;
                }
                let torch: u64 = p.torch.iter().map(|t| t.allocated_bytes).sum();
                let reserved: u64 = p.torch.iter().map(|t| t.reserved_bytes).sum();
                let t = format!("{} / {}", theme::bytes(torch), theme::bytes(reserved));
                if theme::width(&main) + 1 + theme::width(&t) <= width {
                    procs.push(Line::raw(format!("{main} {t}")));
                } else {
                    // Too narrow for one line: the torch figures go below.
                    procs.push(Line::raw(main));
                    procs.push(Line::from(vec![
                        Span::styled(format!("{:>9}", "torch "), dim),
                        Span::raw(t),
                    ]));
                }
            }
        }
        (devices, procs)
    }

    /// PyTorch allocated and reserved on one device, summed over the tree.
    fn torch_on(&self, device: u32) -> (Option<u64>, u64) {
        let mut alloc = None;
        let mut reserved = 0;
        for t in self
            .procs
            .iter()
            .flat_map(|p| &p.torch)
            .filter(|t| t.device == device)
        {
            *alloc.get_or_insert(0) += t.allocated_bytes;
            reserved += t.reserved_bytes;
        }
        (alloc, reserved)
    }
}

impl Widget for &GpuPanelView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 || area.width == 0 {
            return;
        }
        if self.gpus.is_empty() {
            Line::styled("no GPU", Style::new().fg(theme::DIM)).render(area, buf);
            return;
        }
        let (devices, procs) = self.lines(area.width as usize);
        let h = area.height as usize;
        let rest = h.saturating_sub(devices.len());
        let chart_h = match &self.history {
            Some(_) if rest >= MIN_CHART_ROWS => {
                rest.saturating_sub(procs.len()).max(MIN_CHART_ROWS)
            }
            _ => 0,
        };
        let mut y = area.y;
        let bottom = area.y + area.height;
        for line in devices {
            if y >= bottom {
                return;
            }
            line.render(Rect::new(area.x, y, area.width, 1), buf);
            y += 1;
        }
        if let Some(chart) = &self.history
            && chart_h > 0
        {
            chart.render(Rect::new(area.x, y, area.width, chart_h as u16), buf);
            y += chart_h as u16;
        }
        // A header without a row under it says nothing.
        if bottom.saturating_sub(y) < 2 {
            return;
        }
        for line in procs {
            if y >= bottom {
                return;
            }
            line.render(Rect::new(area.x, y, area.width, 1), buf);
            y += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::widgets::testing::buffer_text;

    fn gpu(index: u32, name: &str) -> GpuSample {
        GpuSample {
            index,
            name: name.into(),
            uuid: format!("GPU-{index}"),
            used_bytes: 60 << 30,
            total_bytes: 80 << 30,
            free_bytes: 20 << 30,
            reserved_bytes: 0,
            util_percent: Some(87),
            tree_bytes: 40 << 30,
            foreign_bytes: 20 << 30,
            age_seconds: None,
        }
    }

    fn procs() -> Vec<GpuProc> {
        vec![GpuProc {
            pid: 4242,
            comm: "python".into(),
            gpu_bytes: Some(40 << 30),
            torch: vec![TorchMem {
                device: 0,
                allocated_bytes: 30 << 30,
                reserved_bytes: 36 << 30,
            }],
        }]
    }

    #[test]
    fn device_bar_split_and_torch() {
        let gpus = vec![gpu(0, "NVIDIA A100-SXM4-80GB")];
        let v = GpuPanelView {
            gpus: &gpus,
            procs: procs(),
            history: None,
        };
        assert_eq!(v.title(), " GPU · NVIDIA A100-SXM4-80GB ");
        let area = Rect::new(0, 0, 52, 8);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        let text = buffer_text(&buf);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("0 █"), "{text}");
        assert!(
            lines[0].ends_with("▒ 60.0/80.0 GiB  87%")
                || lines[0].ends_with("░ 60.0/80.0 GiB  87%"),
            "{text}"
        );
        assert_eq!(lines[1], "  tree 40.0 GiB · others 20.0 GiB");
        assert_eq!(lines[2], "  torch alloc 30.0 GiB · reserved 36.0 GiB");
        assert_eq!(
            lines[4],
            "   4242 python       40.0 GiB 30.0 GiB / 36.0 GiB"
        );
        // Half the bar is the tree's, a quarter other processes'.
        let tree = lines[0].chars().filter(|c| *c == '█').count();
        let other = lines[0].chars().filter(|c| *c == '▒').count();
        assert_eq!(tree, 2 * other, "{text}");
        // Narrow: the torch figures of a process move to their own line.
        let area = Rect::new(0, 0, 40, 9);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        let narrow = buffer_text(&buf);
        assert!(
            narrow.contains("   4242 python       40.0 GiB\n   torch 30.0 GiB / 36.0 GiB"),
            "{narrow}"
        );
        assert!(
            narrow.contains("  torch alloc/rsvd 30.0/36.0 GiB"),
            "{narrow}"
        );
    }

    #[test]
    fn mixed_models_are_named_per_device_and_the_chart_fits_between() {
        let gpus = vec![gpu(0, "A100"), gpu(1, "H100")];
        let points: std::collections::VecDeque<_> = (0..10)
            .map(|i| crate::sinks::tui::app::ChartPoint {
                t: f64::from(i),
                footprint: 0,
                pss: 0,
                rss: 0,
                swap: 0,
                ceilings: vec![],
                gpus: vec![(0, 10 << 30, 80 << 30), (1, 60 << 30, 80 << 30)],
            })
            .collect();
        let v = GpuPanelView {
            gpus: &gpus,
            procs: procs(),
            history: Some(ChartView::gpu(&points)),
        };
        assert_eq!(v.title(), " GPU ");
        let area = Rect::new(0, 0, 44, 20);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        let text = buffer_text(&buf);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "A100");
        assert_eq!(lines[4], "H100");
        // Device lines, then the chart (axis labels), then the processes.
        let chart = lines.iter().position(|l| l.starts_with("80.0 GiB│"));
        let pids = lines.iter().position(|l| l.contains("PID"));
        assert!(chart.is_some() && chart > Some(6) && pids > chart, "{text}");
    }
}
