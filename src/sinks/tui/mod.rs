//! The live terminal dashboard (`oomguard run` on a terminal).
//!
//! Split the way ratatui applications usually are:
//! - `app`: the state (`App`), fed by the supervision loop with samples,
//!   events and the job's output, and by the user with keys, which come
//!   back as `UiCommand`s for the loop to carry out; `growth`: its growth
//!   column (a family's growth for a process with children); `event`: the
//!   events and the words each becomes; `footprint`: what each memory
//!   figure is called (the footprint the policy uses, its breakdowns);
//! - `ui` and `widgets`: pure rendering of that state into a buffer;
//! - `term`: the real terminal (raw mode, alternate screen, restore on
//!   exit, panic and signals; keys and resizes as async events);
//! - `output`: turning the job's bytes (progress bars, colours) into lines;
//!   `afterword`: what is left on the terminal when the dashboard closes.
//!
//! The loop's part, per iteration: `select!` on the sampler tick, the
//! job's pty (`PtyMaster::read` → `App::on_output`), `Tui::next_event`
//! (keys → `App::on_key`, resizes → `PtyMaster::resize`) and its own
//! signals; after any of them, `Tui::draw`.

mod afterword;
pub mod app;
mod event;
mod footprint;
mod growth;
pub mod keys;
pub mod output;
pub mod term;
pub mod theme;
pub mod ui;
pub mod widgets;

pub use afterword::afterword;
pub use app::{
    ActionKind, App, KEYS, Overlay, Pane, PolicyState, Severity, SortKey, UiCommand, UiEvent,
};
#[cfg(test)]
pub(crate) use event::describe;
pub use output::OutputBuffer;
// The job's pty lives below the dashboard (`crate::job::pty`): the relay uses it
// without a dashboard too.
pub use crate::job::pty::{self, PtyError, PtyMaster, make_controlling, open_pty, set_window_size};
pub use term::{TermError, TermEvent, Tui, detach_dead_terminal, restore};
pub use ui::{draw, output_pane_size, render};

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod screens;
