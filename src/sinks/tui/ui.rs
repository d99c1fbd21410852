//! The screen layout: which pane goes where at which terminal size, and
//! the small views handed to each widget. Rendering reads the `App` and
//! writes a `Buffer`; the only thing it records is what the last frame's
//! panes could show (for paging and keeping the table's scroll position).
//!
//! Layout, top to bottom: header; one gauge per ceiling and a totals line;
//! the memory chart (with the GPU panel beside it when there are GPUs);
//! the process table (with events beside it on wide terminals); the job's
//! output (with events beside it on narrow ones); key hints. Short
//! terminals lose the chart first, then the bottom row.

use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Widget, Wrap};

use super::app::{App, Overlay, Pane, PolicyState};
use super::footprint;
use super::theme;
use super::widgets::procs::visible_rows;
use super::widgets::{
    ChartView, EventsView, FooterView, GaugeView, GpuPanelView, GpuProc, HeaderView, HelpView,
    ModalView, OutputView, ProcTableView, SummaryView,
};

/// Smaller than this and the dashboard only says so.
pub const MIN_COLS: u16 = 40;
pub const MIN_ROWS: u16 = 10;
/// From this width on, events sit beside the process table.
const WIDE: u16 = 120;

/// Where each pane goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Areas {
    header: Rect,
    gauges: Rect,
    chart: Rect,
    gpu: Rect,
    table: Rect,
    events: Rect,
    output: Rect,
    footer: Rect,
}

fn split_h(r: Rect, left_w: u16) -> (Rect, Rect) {
    let left_w = left_w.min(r.width);
    (
        Rect::new(r.x, r.y, left_w, r.height),
        Rect::new(r.x + left_w, r.y, r.width - left_w, r.height),
    )
}

fn layout(app: &App, area: Rect) -> Areas {
    let mut a = Areas::default();
    let (x, w) = (area.x, area.width);
    let mut y = area.y;
    let mut take = |h: u16| {
        let r = Rect::new(x, y, w, h);
        y += h;
        r
    };
    a.header = take(1);
    let gauge_rows = app
        .sample
        .as_ref()
        .map_or(1, |s| s.ceilings().len() as u16 + 1);
    let rest_before = area.height.saturating_sub(2);
    a.gauges = take(gauge_rows.min(rest_before));
    let rest = rest_before - a.gauges.height;

    // The chart gets a fixed share, the output and events a minimum; the
    // table takes what its rows need from the rest (never less than a few
    // rows, and on wide terminals enough for the events beside it); the
    // output gets what is left over.
    let wide = w >= WIDE;
    let need = app.sample.as_ref().map_or(1, |s| s.procs.len()).max(1) as u16 + 3;
    // A third of the room for the chart on tall terminals; on short ones
    // the table's rows matter more.
    let chart_h = match rest {
        30.. => rest * 34 / 100,
        17..=29 => (rest * 26 / 100).max(5),
        _ => 0,
    };
    let bottom_min = if rest >= 10 { (rest / 4).max(5) } else { 0 };
    let avail = rest - chart_h - bottom_min;
    let mut table_h = need.max(if wide { 10 } else { 5 }).min(avail);
    let mut bottom_h = rest - chart_h - table_h;
    if bottom_h < 3 {
        // Too short to show a line: the table has it.
        table_h += bottom_h;
        bottom_h = 0;
    }

    let chart_row = take(chart_h);
    let gpus = app.sample.as_ref().is_some_and(|s| !s.gpus.is_empty());
    let gpu_w = (w * 38 / 100).clamp(36, 60);
    if gpus && w >= 80 && w - gpu_w >= 40 {
        (a.chart, a.gpu) = split_h(chart_row, w - gpu_w);
    } else {
        a.chart = chart_row;
    }

    let table_row = take(table_h);
    let bottom_row = take(bottom_h);
    if wide {
        (a.table, a.events) = split_h(table_row, w * 62 / 100);
        a.output = bottom_row;
    } else {
        a.table = table_row;
        (a.output, a.events) = split_h(bottom_row, w * 55 / 100);
    }
    if bottom_h == 0 && !wide {
        a.output = Rect::default();
        a.events = Rect::default();
    }
    a.footer = Rect::new(x, area.y + area.height.saturating_sub(1), w, 1);
    a
}

/// The size (columns, rows) of the output pane's inside on a screen of
/// this size: the size to give the job's terminal, so progress bars fit
/// the pane they are shown in.
pub fn output_pane_size(app: &App, cols: u16, rows: u16) -> (u16, u16) {
    let a = layout(app, Rect::new(0, 0, cols, rows));
    let inner = Block::bordered().inner(a.output);
    if inner.width == 0 || inner.height == 0 {
        // The pane is hidden; a sane terminal is still better than 0×0.
        (cols.max(MIN_COLS), rows.max(MIN_ROWS))
    } else {
        (inner.width, inner.height)
    }
}

/// Draws the whole dashboard into the frame.
pub fn render(app: &App, frame: &mut Frame<'_>) {
    let area = frame.area();
    draw(app, area, frame.buffer_mut());
}

/// Draws the whole dashboard into `area` of `buf`.
pub fn draw(app: &App, area: Rect, buf: &mut Buffer) {
    if area.width < MIN_COLS || area.height < MIN_ROWS {
        Paragraph::new(format!(
            "oomguard: the terminal is {}×{}; the dashboard needs at least {MIN_COLS}×{MIN_ROWS}.",
            area.width, area.height
        ))
        .wrap(Wrap { trim: true })
        .render(area, buf);
        return;
    }
    let a = layout(app, area);
    let view = app.view.as_ref();
    let nearest = view.and_then(|v| v.nearest);

    (&HeaderView {
        command: &app.command,
        attempt: app.attempt,
        progress: app.progress.as_ref(),
        elapsed: app.elapsed,
        policy: app.policy,
        nearest,
        warn_percent: app.warn_percent,
        critical_percent: app.critical_percent,
    })
        .render(a.header, buf);

    draw_gauges(app, a.gauges, buf);

    if a.chart.height > 0 {
        draw_chart(app, a.chart, buf);
    }
    if a.gpu.height > 0
        && let Some(s) = &app.sample
    {
        let procs = s
            .procs
            .iter()
            .filter(|p| p.gpu_bytes.is_some_and(|b| b > 0) || app.torch.contains_key(&p.pid))
            .map(|p| GpuProc {
                pid: p.pid,
                comm: p.comm.clone(),
                gpu_bytes: p.gpu_bytes,
                torch: app.torch.get(&p.pid).cloned().unwrap_or_default(),
            })
            .collect();
        let panel = GpuPanelView {
            gpus: &s.gpus,
            procs,
            history: Some(ChartView::gpu(&app.chart)),
        };
        let block = theme::pane(panel.title(), false);
        let inner = block.inner(a.gpu);
        block.render(a.gpu, buf);
        (&panel).render(inner, buf);
    }

    draw_table(app, a.table, buf);
    draw_events(app, a.events, buf);
    draw_output(app, a.output, buf);

    (&FooterView {
        flash: app.flash.as_deref(),
        restart_available: app.restart_available,
        paused: app.policy == PolicyState::Paused,
    })
        .render(a.footer, buf);

    match app.overlay {
        Overlay::None => {}
        Overlay::Help => (&HelpView {
            restart_available: app.restart_available,
        })
            .render(area, buf),
        o => (&ModalView {
            overlay: o,
            policy: app.policy,
            attempt: app.attempt,
        })
            .render(area, buf),
    }
}

/// The memory chart in its pane: the legend on the top edge, what the
/// chart left out (and why) on the bottom edge.
fn draw_chart(app: &App, area: Rect, buf: &mut Buffer) {
    let nearest = app.view.as_ref().and_then(|v| v.nearest);
    let kind = app
        .sample
        .as_ref()
        .map_or(footprint::Kind::Pss, |s| footprint::of(s).1);
    let mut chart = ChartView::memory(
        &app.chart,
        nearest.map(|n| n.ceiling.source),
        app.warn_percent,
        app.critical_percent,
        kind,
    );
    let inner = Block::bordered().inner(area);
    chart.fit_rows(inner);
    let name = " Memory ";
    let room = (inner.width as usize).saturating_sub(theme::width(name));
    let mut title = vec![Span::styled(
        name,
        Style::new().add_modifier(Modifier::BOLD),
    )];
    title.extend(chart.legend(room));
    let mut block = theme::pane(Line::from(title), false);
    if let Some(note) = chart.left_out_note(inner.width as usize) {
        block = block.title_bottom(Line::styled(note, Style::new().fg(theme::DIM)));
    }
    block.render(area, buf);
    (&chart).render(inner, buf);
}

fn draw_gauges(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let (Some(sample), Some(view)) = (&app.sample, &app.view) else {
        Line::styled(
            " waiting for the first sample…",
            Style::new().fg(theme::DIM),
        )
        .render(area, buf);
        return;
    };
    let nearest = view.nearest.map(|n| n.ceiling.source);
    let released = footprint::tree_released(sample);
    let mut gauges: Vec<GaugeView> = sample
        .ceilings()
        .into_iter()
        .map(|state| {
            let is_nearest = Some(state.ceiling.source) == nearest;
            let used_label = footprint::used_label(sample, &state);
            GaugeView {
                used_label,
                used_note: (used_label == "footprint").then(|| footprint::of(sample).1.as_str()),
                state,
                warn_percent: app.warn_percent,
                critical_percent: app.critical_percent,
                nearest: is_nearest,
                // A tree being torn down is not growing towards anything.
                eta_seconds: if is_nearest && !released {
                    view.eta_seconds
                } else {
                    None
                },
                growth_per_second: if is_nearest && !released {
                    view.headroom_slope.map(|s| -s)
                } else {
                    None
                },
                text_cols: None,
            }
        })
        .collect();
    // One text column for all, so the bars line up.
    let cols = gauges.iter().map(|g| g.text_width(area.width)).max();
    let mut y = area.y;
    for g in &mut gauges {
        if y >= area.y + area.height {
            return;
        }
        g.text_cols = cols;
        (&*g).render(Rect::new(area.x, y, area.width, 1), buf);
        y += 1;
    }
    if y < area.y + area.height {
        // The process the table marks, with the table's own figure for it
        // (its growth over the last minute): one figure per process on the
        // screen, not a second rate over another window.
        // None where that figure is not a rising rate: the policy's pick
        // rests on a 10 s window, the figure on the table's minute.
        let fastest = view.fastest.and_then(|(pid, _)| {
            let p = sample.procs.iter().find(|p| p.pid == pid)?;
            let r = app.growth(p.pid, p.start_time).rate()?;
            (r > 0.0).then_some((pid, p.comm.as_str(), r))
        });
        (&SummaryView {
            tree: &sample.tree,
            system: &sample.system,
            psi: sample.psi,
            fastest,
            released,
        })
            .render(Rect::new(area.x, y, area.width, 1), buf);
    }
}

fn draw_table(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let rows = app.proc_rows();
    let focused = app.focus == Pane::Processes;
    let title = format!(" Processes ({}) ", rows.len());
    let block = theme::pane(title, focused);
    let inner = block.inner(area);
    block.render(area, buf);
    let visible = visible_rows(inner.height);
    app.viewport.table_rows.set(visible);
    let mut offset = app.viewport.table_offset.get();
    if let Some(i) = app
        .selected
        .and_then(|pid| rows.iter().position(|r| r.pid == pid))
    {
        if i < offset {
            offset = i;
        } else if i >= offset + visible {
            offset = i + 1 - visible;
        }
    }
    offset = offset.min(rows.len().saturating_sub(visible));
    app.viewport.table_offset.set(offset);
    (&ProcTableView {
        rows,
        sort: app.sort,
        reverse: app.sort_reverse,
        selected: app.selected,
        fastest: app.view.as_ref().and_then(|v| v.fastest.map(|f| f.0)),
        offset,
        gpu: app.sample.as_ref().is_some_and(|s| !s.gpus.is_empty()),
    })
        .render(inner, buf);
}

fn scrolled_title(name: &str, count: Option<usize>, scroll: usize) -> Line<'static> {
    let mut spans = vec![Span::raw(match count {
        Some(n) => format!(" {name} ({n}) "),
        None => format!(" {name} "),
    })];
    if scroll > 0 {
        spans.push(Span::styled(
            format!("↑{scroll} · End follows "),
            Style::new().fg(theme::WARN),
        ));
    }
    Line::from(spans)
}

fn draw_events(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let block = theme::pane(
        scrolled_title("Events", Some(app.events.len()), app.events_scroll),
        app.focus == Pane::Events,
    );
    let inner = block.inner(area);
    block.render(area, buf);
    app.viewport.events_rows.set(inner.height as usize);
    (&EventsView {
        events: &app.events,
        scroll: app.events_scroll,
    })
        .render(inner, buf);
}

fn draw_output(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let block = theme::pane(
        scrolled_title("Output", None, app.output_scroll),
        app.focus == Pane::Output,
    );
    let inner = block.inner(area);
    block.render(area, buf);
    app.viewport.output_rows.set(inner.height as usize);
    (&OutputView {
        output: &app.output,
        scroll: app.output_scroll,
    })
        .render(inner, buf);
}
