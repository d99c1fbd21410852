//! The top line: policy state, the command, attempt, training progress
//! (step/total, phase, steps/s, the step at which the ceiling is reached),
//! elapsed time and the nearest ceiling.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

use crate::sinks::tui::app::PolicyState;
use crate::sinks::tui::theme;
use crate::vocab::model::CeilingState;

/// What the header shows.
#[derive(Debug, Clone)]
pub struct HeaderView<'a> {
    pub command: &'a str,
    pub attempt: u32,
    /// What the job printed about its progress, if anything.
    pub progress: Option<&'a crate::vocab::forensics::progress::Progress>,
    pub elapsed: f64,
    pub policy: PolicyState,
    pub nearest: Option<CeilingState>,
    /// Colours the nearest ceiling's headroom.
    pub warn_percent: Option<f64>,
    pub critical_percent: Option<f64>,
}

/// One form of the header's right side: its parts, each with whether it
/// is the nearest ceiling (coloured by its headroom).
type Form = Vec<(String, bool)>;

impl HeaderView<'_> {
    /// The right side's forms, longest first, each with the width the
    /// command must keep for it to be chosen (the first that leaves the
    /// command at least that much wins).
    fn right_side(&self) -> (Vec<Form>, Vec<usize>) {
        // Right side, longest form first; the first that leaves the command
        // at least a few cells wins.
        let nearest_long = self.nearest.map(|n| {
            format!(
                "{} {} · {} left",
                n.ceiling.source.label(),
                theme::bytes(n.ceiling.bytes),
                theme::bytes(n.headroom_bytes)
            )
        });
        let nearest_short = self.nearest.map(|n| {
            format!(
                "{} {} left",
                n.ceiling.source.label(),
                theme::bytes(n.headroom_bytes)
            )
        });
        let clock = theme::clock(self.elapsed);
        let attempt = (format!("attempt {}", self.attempt), false);
        // The three forms without progress: labelled, long, short.
        let labelled = vec![
            attempt.clone(),
            (format!("elapsed {clock}"), false),
            (
                nearest_long
                    .clone()
                    .map_or("no sample yet".into(), |s| format!("nearest {s}")),
                true,
            ),
        ];
        let long = vec![
            attempt.clone(),
            (clock.clone(), false),
            (nearest_long.unwrap_or_else(|| "no sample yet".into()), true),
        ];
        let short = vec![
            attempt,
            (clock.clone(), false),
            (nearest_short.unwrap_or_else(|| "no sample".into()), true),
        ];
        let with_progress = |form: &Form, text: String| {
            let mut parts = form.clone();
            parts.insert(1, (text, false));
            parts
        };
        let mut candidates: Vec<Form> = Vec::new();
        if let Some((progress_long, progress_short)) = self.progress.map(progress_text) {
            // The whole progress line (rate, ceiling step) is worth more
            // than the words "elapsed" and "nearest".
            for (form, text) in [
                (&labelled, &progress_long),
                (&short, &progress_long),
                (&short, &progress_short),
            ] {
                if let Some(t) = text {
                    candidates.push(with_progress(form, t.clone()));
                } else {
                    candidates.push(form.clone());
                }
            }
        }
        candidates.extend([labelled, long, short, vec![(clock, false)]]);
        // The longer forms only while the command keeps a useful width;
        // the short ones as long as some of it shows.
        let cmd_w = theme::width(self.command);
        let mut cmd_min = vec![cmd_w.min(40), cmd_w.min(40), cmd_w.min(12), 0];
        if self.progress.is_some() {
            cmd_min.splice(0..0, [cmd_w.min(30), cmd_w.min(12), cmd_w.min(12)]);
        }
        (candidates, cmd_min)
    }
}

impl Widget for &HeaderView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 || area.width == 0 {
            return;
        }
        let w = area.width as usize;
        let dim = Style::new().fg(theme::DIM);
        let badge = format!(" {} ", self.policy.label());

        let (candidates, cmd_min) = self.right_side();
        let brand = " oomguard ";
        let show_brand = w >= 100;
        let fixed_left = theme::width(&badge) + 1 + if show_brand { brand.len() + 1 } else { 0 };
        // Two leading spaces, then the parts separated by " │ ".
        let joined = |parts: &[(String, bool)]| -> usize {
            parts.iter().map(|(s, _)| theme::width(s)).sum::<usize>() + 3 * parts.len() - 1
        };
        let right = candidates
            .iter()
            .zip(cmd_min)
            .find(|(c, min)| fixed_left + joined(c) + min <= w)
            .map(|(c, _)| c)
            .or(candidates.last())
            .cloned()
            .unwrap_or_default();
        let right_w = joined(&right).min(w.saturating_sub(fixed_left));
        let cmd_w = w.saturating_sub(fixed_left + right_w);

        let mut spans = Vec::new();
        if show_brand {
            spans.push(Span::styled(
                brand,
                Style::new()
                    .fg(ratatui::style::Color::Black)
                    .bg(theme::ACCENT)
                    .add_modifier(Modifier::BOLD),
            ));
            spans.push(Span::raw(" "));
        }
        spans.push(Span::styled(badge, theme::policy(self.policy)));
        spans.push(Span::raw(" "));
        let cmd = theme::fit(self.command, cmd_w);
        let pad = cmd_w.saturating_sub(theme::width(&cmd));
        spans.push(Span::styled(cmd, Style::new().add_modifier(Modifier::BOLD)));
        spans.push(Span::raw(" ".repeat(pad)));
        let headroom_color = self.nearest.map(|n| {
            theme::zone(
                n.headroom_percent(),
                self.warn_percent,
                self.critical_percent,
            )
        });
        for (i, (text, is_nearest)) in right.iter().enumerate() {
            spans.push(Span::styled(if i == 0 { "  " } else { " │ " }, dim));
            let style = match (is_nearest, headroom_color) {
                (true, Some(c)) => Style::new().fg(c),
                _ => Style::new(),
            };
            spans.push(Span::styled(text.clone(), style));
        }
        Line::from(spans).render(area, buf);
    }
}

/// The progress part of the header, long and short: "epoch 3 · val
/// 128/400 · 9.4 steps/s · ceiling ≈ step 1240" and "val 128/400".
fn progress_text(
    p: &crate::vocab::forensics::progress::Progress,
) -> (Option<String>, Option<String>) {
    use crate::vocab::forensics::progress::Phase;
    let step = p.step.map(|s| match p.total {
        Some(t) => format!("{s}/{t}"),
        None => s.to_string(),
    });
    let phase = match p.phase {
        Some(Phase::Train) | None => None,
        Some(Phase::Validation) => Some("val"),
        Some(other) => Some(other.as_str()),
    };
    let short = match (phase, &step) {
        (Some(ph), Some(s)) => format!("{ph} {s}"),
        (None, Some(s)) => format!("step {s}"),
        (Some(ph), None) => ph.to_string(),
        (None, None) => p
            .epoch
            .as_ref()
            .map_or(String::new(), |e| format!("epoch {e}")),
    };
    let mut long = Vec::new();
    if let Some(e) = &p.epoch
        && step.is_some()
    {
        long.push(format!("epoch {e}"));
    }
    long.push(short.clone());
    if let Some(r) = p.steps_per_second {
        long.push(format!("{r:.1} steps/s"));
    }
    if let Some(c) = p.ceiling_step {
        long.push(format!("ceiling ≈ step {c}"));
    }
    let short = (!short.is_empty()).then_some(short);
    (Some(long.join(" · ")).filter(|l| !l.is_empty()), short)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::tui::widgets::testing::row_text;
    use crate::vocab::model::{Ceiling, CeilingSource};

    fn view(cmd: &str) -> HeaderView<'_> {
        HeaderView {
            command: cmd,
            attempt: 2,
            progress: None,
            elapsed: 723.0,
            policy: PolicyState::Warning,
            nearest: Some(CeilingState {
                ceiling: Ceiling {
                    source: CeilingSource::Cgroup,
                    bytes: 4 << 30,
                },
                used_bytes: (4 << 30) - (812 << 20),
                headroom_bytes: 812 << 20,
            }),
            warn_percent: Some(25.0),
            critical_percent: Some(10.0),
        }
    }

    #[test]
    fn wide_header_has_everything() {
        let area = Rect::new(0, 0, 120, 1);
        let mut buf = Buffer::empty(area);
        (&view("python train.py --epochs 10")).render(area, &mut buf);
        let text = row_text(&buf, 0);
        assert!(
            text.starts_with(" oomguard   WARNING  python train.py --epochs 10"),
            "{text}"
        );
        assert!(
            text.ends_with("attempt 2 │ elapsed 12:03 │ nearest cgroup 4.0 GiB · 812 MiB left"),
            "{text}"
        );
        // The badge carries the state's colour.
        let badge = buf.cell((12, 0)).unwrap();
        assert_eq!(badge.bg, theme::WARN);
        // Headroom under 25 % of the ceiling is shown as a warning.
        let last = buf.cell((119, 0)).unwrap();
        assert_eq!(last.fg, theme::WARN);
    }

    #[test]
    fn a_dev_shm_nearest_is_named_as_the_path() {
        let mut v = view("python train.py");
        v.nearest = Some(CeilingState {
            ceiling: Ceiling {
                source: CeilingSource::Shm,
                bytes: 64 << 20,
            },
            used_bytes: 52 << 20,
            headroom_bytes: 12 << 20,
        });
        let area = Rect::new(0, 0, 120, 1);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        let text = row_text(&buf, 0);
        assert!(
            text.ends_with("nearest /dev/shm 64.0 MiB · 12.0 MiB left"),
            "{text}"
        );
    }

    #[test]
    fn narrow_header_cuts_the_command_not_the_state() {
        let area = Rect::new(0, 0, 80, 1);
        let mut buf = Buffer::empty(area);
        let long = "python -m torch.distributed.run --nproc_per_node 8 train.py --config big.yaml";
        (&view(long)).render(area, &mut buf);
        let text = row_text(&buf, 0);
        assert!(text.starts_with(" WARNING  python"), "{text}");
        assert!(text.contains('…'), "{text}");
        assert!(
            text.contains("attempt 2 │ 12:03 │ cgroup 812 MiB left"),
            "{text}"
        );
        let area = Rect::new(0, 0, 30, 1);
        let mut buf = Buffer::empty(area);
        (&view(long)).render(area, &mut buf);
        assert!(row_text(&buf, 0).contains("12:03"));
    }

    #[test]
    fn progress_shows_step_phase_rate_and_the_ceiling_step() {
        let p = crate::vocab::forensics::progress::Progress {
            step: Some(128),
            total: Some(400),
            epoch: Some("1".into()),
            phase: Some(crate::vocab::forensics::progress::Phase::Validation),
            steps_per_second: Some(9.41),
            bytes_per_step: Some(1 << 20),
            ceiling_step: Some(1240),
        };
        let mut v = view("python train.py");
        v.progress = Some(&p);
        let area = Rect::new(0, 0, 200, 1);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        let text = row_text(&buf, 0);
        assert!(
            text.contains("attempt 2 │ epoch 1 · val 128/400 · 9.4 steps/s · ceiling ≈ step 1240 │ elapsed 12:03"),
            "{text}"
        );
        // Narrower: the short form.
        let area = Rect::new(0, 0, 80, 1);
        let mut buf = Buffer::empty(area);
        (&v).render(area, &mut buf);
        let text = row_text(&buf, 0);
        assert!(text.contains("val 128/400"), "{text}");
        assert!(text.contains("cgroup 812 MiB left"), "{text}");
    }
}
