//! The dashboard's colours and the few text helpers every widget shares
//! (sizes, clocks, fitting text into a width), so the screen reads as one.
//!
//! Colours are the 16 ANSI ones: they follow the user's terminal palette
//! and survive terminals without true colour.

use std::time::Duration;

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Span;
use ratatui::widgets::{Block, BorderType, Borders};

use super::app::{PolicyState, Severity};
use crate::vocab::units::HumanBytes;

/// Plenty of headroom.
pub const OK: Color = Color::Green;
/// Past the warning threshold.
pub const WARN: Color = Color::Yellow;
/// Past the critical threshold; deaths and failures.
pub const CRIT: Color = Color::Red;
/// The job is paused.
pub const PAUSED: Color = Color::Cyan;
/// oomguard acting on the job (stop, restart).
pub const ACT: Color = Color::Magenta;
/// Secondary text: units, times, hints.
pub const DIM: Color = Color::DarkGray;
/// Titles and the focused pane.
pub const ACCENT: Color = Color::Cyan;

/// Chart series.
pub const FOOTPRINT: Color = Color::White;
pub const PSS: Color = Color::Cyan;
pub const RSS: Color = Color::Blue;
/// What a ceiling counts as used where that is not the footprint.
pub const USED: Color = Color::Gray;
pub const LIMIT: Color = Color::Red;
pub const CRIT_LINE: Color = Color::LightRed;
pub const SWAP: Color = Color::Magenta;
/// GPU devices, in index order (wrapping).
pub const GPUS: [Color; 4] = [
    Color::LightGreen,
    Color::LightBlue,
    Color::LightMagenta,
    Color::LightYellow,
];

/// Thresholds used for colouring when the policy has none.
pub const DEFAULT_WARN_PERCENT: f64 = 25.0;
pub const DEFAULT_CRIT_PERCENT: f64 = 10.0;

/// The colour of a headroom percentage against the thresholds.
pub fn zone(headroom_percent: f64, warn: Option<f64>, crit: Option<f64>) -> Color {
    let crit = crit.unwrap_or(DEFAULT_CRIT_PERCENT);
    let warn = warn.unwrap_or(DEFAULT_WARN_PERCENT).max(crit);
    if headroom_percent <= crit {
        CRIT
    } else if headroom_percent <= warn {
        WARN
    } else {
        OK
    }
}

/// The header badge of a policy state.
pub fn policy(state: PolicyState) -> Style {
    let bg = match state {
        PolicyState::Normal => OK,
        PolicyState::Warning => WARN,
        PolicyState::Paused => PAUSED,
        PolicyState::Stopping => CRIT,
        PolicyState::Restarting => ACT,
    };
    Style::new()
        .fg(Color::Black)
        .bg(bg)
        .add_modifier(Modifier::BOLD)
}

/// The colour and marker of an event line.
pub fn severity(s: Severity) -> (Style, &'static str) {
    match s {
        Severity::Info => (Style::new(), "·"),
        Severity::Ok => (Style::new().fg(OK), "✓"),
        Severity::Warn => (Style::new().fg(WARN), "!"),
        Severity::Act => (Style::new().fg(ACT).add_modifier(Modifier::BOLD), "»"),
        Severity::Critical => (Style::new().fg(CRIT).add_modifier(Modifier::BOLD), "✗"),
    }
}

/// A pane's frame; the focused one is drawn in the accent colour.
pub fn pane<'a>(title: impl Into<ratatui::text::Line<'a>>, focused: bool) -> Block<'a> {
    let (border, title_style) = if focused {
        (
            Style::new().fg(ACCENT),
            Style::new().fg(ACCENT).add_modifier(Modifier::BOLD),
        )
    } else {
        (
            Style::new().fg(DIM),
            Style::new().add_modifier(Modifier::BOLD),
        )
    };
    Block::new()
        .borders(Borders::ALL)
        .border_type(if focused {
            BorderType::Thick
        } else {
            BorderType::Rounded
        })
        .border_style(border)
        .title_style(title_style)
        .title(title)
}

/// `812 MiB`.
pub fn bytes(b: u64) -> String {
    HumanBytes(b).to_string()
}

/// A rate in bytes per minute with its sign: `+12.0 MiB`, `-3.0 KiB`, `0`.
pub fn signed_bytes(v: f64) -> String {
    if v.abs() < 1.0 {
        return "0".into();
    }
    let sign = if v < 0.0 { '-' } else { '+' };
    format!("{sign}{}", HumanBytes(v.abs() as u64))
}

/// Run time as a clock: `12:03`, `1:02:03`.
pub fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m:02}:{s:02}")
    }
}

/// A duration the way people say it: `45.2s`, `3m 12s`, `1h 02m`.
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() {
        return "∞".into();
    }
    crate::vocab::units::human_duration(Duration::from_secs_f64(seconds.max(0.0)))
}

/// Display width of text in terminal cells.
pub fn width(s: &str) -> usize {
    Span::raw(s).width()
}

/// `s` cut to at most `max` cells, with `…` when something was cut.
pub fn fit(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut out = String::new();
    let mut used = 0;
    let mut buf = [0u8; 4];
    for c in s.chars() {
        let w = width(c.encode_utf8(&mut buf));
        if used + w > max - 1 {
            break;
        }
        out.push(c);
        used += w;
    }
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(clock(723.9), "12:03");
        assert_eq!(clock(3723.0), "1:02:03");
        assert_eq!(signed_bytes(12.0 * 1024.0 * 1024.0), "+12.0 MiB");
        assert_eq!(signed_bytes(-2048.0), "-2.0 KiB");
        assert_eq!(signed_bytes(0.2), "0");
        assert_eq!(fit("python train.py", 8), "python …");
        assert_eq!(fit("日本語テキスト", 5), "日本…");
        assert_eq!(fit("short", 8), "short");
        assert_eq!(duration(192.0), "3m 12s");
        assert_eq!(zone(50.0, Some(20.0), Some(10.0)), OK);
        assert_eq!(zone(15.0, Some(20.0), Some(10.0)), WARN);
        assert_eq!(zone(5.0, None, None), CRIT);
    }
}
