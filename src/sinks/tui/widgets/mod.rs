//! The dashboard's widgets. Each renders a small view struct built from
//! the `App` (never the `App` itself), so it can be tested against a
//! `Buffer` with hand-made data.

pub mod chart;
pub mod events;
pub mod gauge;
pub mod gpu;
pub mod header;
pub mod output;
pub mod overlay;
pub mod procs;
pub mod summary;

pub use chart::ChartView;
pub use events::EventsView;
pub use gauge::GaugeView;
pub use gpu::{GpuPanelView, GpuProc};
pub use header::HeaderView;
pub use output::OutputView;
pub use overlay::{FooterView, HelpView, ModalView};
pub use procs::ProcTableView;
pub use summary::SummaryView;

#[cfg(test)]
pub(crate) mod testing {
    //! Reading rendered buffers back as text.
    use ratatui::buffer::Buffer;

    /// Row `y` as text, trailing blanks removed.
    pub fn row_text(buf: &Buffer, y: u16) -> String {
        let a = buf.area;
        let mut s = String::new();
        let mut skip = 0;
        for x in a.x..a.x + a.width {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if let Some(c) = buf.cell((x, a.y + y)) {
                s.push_str(c.symbol());
                // A wide character covers the next cell too.
                skip = crate::sinks::tui::theme::width(c.symbol()).saturating_sub(1);
            }
        }
        s.trim_end().to_string()
    }

    /// The whole buffer as text, one line per row.
    pub fn buffer_text(buf: &Buffer) -> String {
        (0..buf.area.height)
            .map(|y| row_text(buf, y))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
