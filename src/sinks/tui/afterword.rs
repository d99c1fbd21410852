//! What the dashboard leaves on the terminal when it closes. The dashboard
//! draws on the alternate screen, which goes with it: the warning that was
//! on screen for half a second, the critical line, the checkpoint and the
//! job's last output would vanish, and the summary alone would be left.
//! These lines go to the terminal's scrollback, before the summary.

use super::app::{App, EventLine};
use super::theme;

/// Events listed at most (the newest); the log has every one.
const MAX_EVENTS: usize = 40;

/// The run's events with their times, then the job's last `output_lines`
/// lines of output, as plain text lines for stderr.
pub fn afterword(app: &App, output_lines: usize) -> Vec<String> {
    let mut out = Vec::new();
    let events: Vec<&EventLine> = app.events().collect();
    let skip = events.len().saturating_sub(MAX_EVENTS);
    match (events.len(), skip) {
        (0, _) => {}
        (_, 0) => out.push("oomguard: events:".to_string()),
        (_, n) => out.push(format!(
            "oomguard: events (the last {MAX_EVENTS}; {n} earlier ones are in the log):"
        )),
    }
    for ev in &events[skip..] {
        let (_, mark) = theme::severity(ev.severity);
        out.push(format!(
            "oomguard: {:>5} {mark} {}",
            theme::clock(ev.t),
            ev.text
        ));
    }
    let last = last_lines(app, output_lines);
    if !last.is_empty() {
        let n = last.len();
        out.push(format!(
            "oomguard: the job's last {}:",
            if n == 1 {
                "line of output".to_string()
            } else {
                format!("{n} lines of output")
            }
        ));
        out.extend(last);
    }
    out
}

/// The newest `n` lines of the job's output, as the pane showed them (a
/// progress bar's last state, not each redraw), without trailing blanks.
fn last_lines(app: &App, n: usize) -> Vec<String> {
    let buf = app.output();
    let mut lines: Vec<String> = Vec::new();
    let mut i = buf.len();
    // Blank lines at the end are where the cursor waited, not output.
    let mut trailing = true;
    while i > 0 && lines.len() < n {
        i -= 1;
        let line = buf.plain_line(i).unwrap_or_default();
        if trailing && line.trim().is_empty() {
            continue;
        }
        trailing = false;
        lines.push(line);
    }
    lines.reverse();
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::{Severity, UiEvent};

    #[test]
    fn events_with_times_then_the_last_lines() {
        let mut app = App::new("python train.py".into());
        app.on_event(UiEvent::Note {
            t: 75.0,
            severity: Severity::Warn,
            text: "warning: headroom 18 %".into(),
        });
        for i in 0..30 {
            app.on_output(format!("step {i}\r\n").as_bytes());
        }
        let lines = afterword(&app, 3);
        assert_eq!(
            lines,
            [
                "oomguard: events:",
                "oomguard: 01:15 ! warning: headroom 18 %",
                "oomguard: the job's last 3 lines of output:",
                "step 27",
                "step 28",
                "step 29",
            ]
        );
        // 0: no output lines, the events stay.
        assert_eq!(afterword(&app, 0).len(), 2);
    }

    #[test]
    fn nothing_to_leave_is_nothing() {
        let app = App::new("true".into());
        assert!(afterword(&app, 20).is_empty());
    }
}
