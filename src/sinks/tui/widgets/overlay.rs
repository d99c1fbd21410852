//! What sits on top of the dashboard: the help overlay listing every key,
//! the quit / stop / restart dialogs, and the key-hint footer line.

use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph, Widget, Wrap};

use crate::sinks::tui::app::{KEYS, Overlay, PolicyState};
use crate::sinks::tui::theme;

/// A box of `w`×`h` cells centred in `area` (shrunk to fit).
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

fn dialog(title: &str, color: ratatui::style::Color) -> Block<'_> {
    Block::new()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(Style::new().fg(color))
        .title(Line::styled(
            format!(" {title} "),
            Style::new().fg(color).add_modifier(Modifier::BOLD),
        ))
}

/// The help overlay.
#[derive(Debug, Clone)]
pub struct HelpView {
    pub restart_available: bool,
}

impl Widget for &HelpView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let key_w = KEYS.iter().map(|(k, _)| theme::width(k)).max().unwrap_or(0);
        let mut lines: Vec<Line<'_>> = KEYS
            .iter()
            .map(|(k, what)| {
                let dim = *k == "r" && !self.restart_available;
                let what = if dim {
                    format!("{what} (not configured for this run)")
                } else {
                    (*what).to_string()
                };
                Line::from(vec![
                    Span::styled(
                        format!(" {k:<key_w$}  "),
                        Style::new().fg(theme::ACCENT).add_modifier(Modifier::BOLD),
                    ),
                    Span::styled(
                        what,
                        if dim {
                            Style::new().fg(theme::DIM)
                        } else {
                            Style::new()
                        },
                    ),
                ])
            })
            .collect();
        lines.push(Line::default());
        lines.push(Line::styled(
            " Any of ? Esc Enter closes this help.",
            Style::new().fg(theme::DIM),
        ));
        let w = lines.iter().map(Line::width).max().unwrap_or(0) as u16 + 3;
        let h = lines.len() as u16 + 2;
        let r = centered(area, w, h);
        Clear.render(r, buf);
        Paragraph::new(lines)
            .block(dialog("Keys", theme::ACCENT))
            .render(r, buf);
    }
}

/// The quit, stop and restart dialogs.
#[derive(Debug, Clone)]
pub struct ModalView {
    pub overlay: Overlay,
    pub policy: PolicyState,
    pub attempt: u32,
}

impl Widget for &ModalView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let key = |k: &'static str| {
            Span::styled(
                format!("  {k:<5}"),
                Style::new().fg(theme::ACCENT).add_modifier(Modifier::BOLD),
            )
        };
        let (title, color, lines): (&str, _, Vec<Line<'_>>) = match self.overlay {
            Overlay::Quit => (
                "Quit",
                theme::WARN,
                vec![
                    Line::raw(if self.policy == PolicyState::Paused {
                        "The job is paused. What should happen to it?"
                    } else {
                        "The job is still running. What should happen to it?"
                    }),
                    Line::default(),
                    Line::from(vec![key("s"), Span::raw("stop it gracefully, then quit")]),
                    Line::from(vec![
                        key("d"),
                        Span::raw("detach: quit and leave it running"),
                    ]),
                    Line::from(vec![key("Esc"), Span::raw("cancel")]),
                ],
            ),
            Overlay::ConfirmStop => (
                "Stop the job",
                theme::CRIT,
                vec![
                    Line::raw(
                        "Stop the job gracefully? The trainer gets the checkpoint signal; the tree is stopped after the grace period.",
                    ),
                    Line::default(),
                    Line::from(vec![key("y"), Span::raw("stop")]),
                    Line::from(vec![key("n"), Span::raw("cancel")]),
                ],
            ),
            Overlay::ConfirmRestart => (
                "Restart the job",
                theme::ACT,
                vec![
                    Line::raw(format!(
                        "Restart the job? It is stopped gracefully and started again as attempt {}.",
                        self.attempt + 1
                    )),
                    Line::default(),
                    Line::from(vec![key("y"), Span::raw("restart")]),
                    Line::from(vec![key("n"), Span::raw("cancel")]),
                ],
            ),
            Overlay::Help | Overlay::None => return,
        };
        let w = 58u16.min(area.width.saturating_sub(2)).max(20);
        let inner_w = w.saturating_sub(4) as usize;
        // Wrapped height of the text at this width.
        let h = lines
            .iter()
            .map(|l| l.width().div_ceil(inner_w.max(1)).max(1))
            .sum::<usize>() as u16
            + 2;
        let r = centered(area, w, h);
        Clear.render(r, buf);
        Paragraph::new(lines)
            .wrap(Wrap { trim: true })
            .block(dialog(title, color).padding(ratatui::widgets::Padding::horizontal(1)))
            .render(r, buf);
    }
}

/// The bottom line: key hints, or a short message after a key that could
/// not do anything.
#[derive(Debug, Clone)]
pub struct FooterView<'a> {
    pub flash: Option<&'a str>,
    pub restart_available: bool,
    pub paused: bool,
}

impl Widget for &FooterView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 {
            return;
        }
        if let Some(msg) = self.flash {
            Line::styled(format!(" {msg}"), Style::new().fg(theme::WARN)).render(area, buf);
            return;
        }
        let mut hints: Vec<(&str, &str)> = vec![
            ("q", "quit"),
            ("p", if self.paused { "resume" } else { "pause" }),
            ("s", "stop"),
        ];
        if self.restart_available {
            hints.push(("r", "restart"));
        }
        hints.extend([
            ("Tab", "pane"),
            ("↑↓", "scroll"),
            ("m/g/t", "sort"),
            ("?", "help"),
        ]);
        let mut spans = Vec::new();
        // "? help" always fits at the end; the rest as far as they go.
        let help_w = 8;
        let mut used = 0;
        for (k, what) in hints {
            let w = theme::width(k) + theme::width(what) + 3;
            if k != "?" && used + w + help_w > area.width as usize {
                continue;
            }
            spans.push(Span::styled(
                format!(" {k}"),
                Style::new().fg(theme::ACCENT).add_modifier(Modifier::BOLD),
            ));
            spans.push(Span::styled(
                format!(" {what} "),
                Style::new().fg(theme::DIM),
            ));
            used += w;
        }
        Line::from(spans)
            .alignment(Alignment::Left)
            .render(area, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::widgets::testing::buffer_text;

    #[test]
    fn help_lists_every_key() {
        let area = Rect::new(0, 0, 80, 24);
        let mut buf = Buffer::empty(area);
        (&HelpView {
            restart_available: false,
        })
            .render(area, &mut buf);
        let text = buffer_text(&buf);
        for (k, _) in KEYS {
            assert!(text.contains(k), "{k} missing:\n{text}");
        }
        assert!(text.contains("not configured"), "{text}");
    }

    #[test]
    fn quit_dialog_offers_the_three_choices() {
        let area = Rect::new(0, 0, 80, 24);
        let mut buf = Buffer::empty(area);
        (&ModalView {
            overlay: Overlay::Quit,
            policy: PolicyState::Normal,
            attempt: 1,
        })
            .render(area, &mut buf);
        let text = buffer_text(&buf);
        assert!(
            text.contains("s    stop it gracefully, then quit"),
            "{text}"
        );
        assert!(
            text.contains("d    detach: quit and leave it running"),
            "{text}"
        );
        assert!(text.contains("Esc  cancel"), "{text}");
    }

    #[test]
    fn footer_fits_and_keeps_help() {
        let area = Rect::new(0, 0, 40, 1);
        let mut buf = Buffer::empty(area);
        (&FooterView {
            flash: None,
            restart_available: true,
            paused: true,
        })
            .render(area, &mut buf);
        let text = buffer_text(&buf);
        assert!(text.contains("p resume"), "{text}");
        assert!(text.contains("? help"), "{text}");
    }
}
