//! Whole screens through ratatui's `TestBackend`, compared with committed
//! insta snapshots (`src/sinks/tui/snapshots/`). The snapshots are plain text:
//! colours are checked by the widget tests. To review a change, run the
//! tests with `INSTA_UPDATE=always` and read the diff; CI runs with
//! `INSTA_UPDATE=no`.

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;

use super::app::{ActionKind, App, PolicyState, Severity, UiEvent};
use super::fixtures::{self, Run};
use super::ui;
use super::widgets::testing::buffer_text;
use crate::vocab::model::Role;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn screen(app: &App, cols: u16, rows: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(cols, rows)).unwrap();
    terminal.draw(|f| ui::render(app, f)).unwrap();
    let buf: &Buffer = terminal.backend().buffer();
    buffer_text(buf)
}

fn started(app: &mut App) {
    app.on_event(UiEvent::Note {
        t: 0.0,
        severity: Severity::Info,
        text: "started pid 4100 in cgroup /user.slice/job-1234 (limit 16.0 GiB)".into(),
    });
}

fn firing(t: f64, value: f64) -> UiEvent {
    UiEvent::RuleFiring {
        t,
        rule: "headroom-warn".into(),
        metric: "headroom_percent".into(),
        value,
        threshold: 20.0,
    }
}

#[test]
fn normal() {
    let run = Run {
        gpus: 2,
        ..Run::default()
    };
    let mut app = fixtures::app(&run);
    started(&mut app);
    fixtures::output(&mut app);
    let text = screen(&app, 120, 40);
    insta::assert_snapshot!("normal", text);
}

#[test]
fn gpus_on_a_tall_terminal() {
    let run = Run {
        gpus: 2,
        leak: 6 * MIB,
        ..Run::default()
    };
    let mut app = fixtures::app(&run);
    started(&mut app);
    fixtures::output(&mut app);
    let text = screen(&app, 140, 60);
    insta::assert_snapshot!("gpus_on_a_tall_terminal", text);
}

/// `run` with a 15 MiB/s leak in worker 2, which crossed the warning at
/// 4:22, in policy state `state`.
fn past_the_warning(run: Run, state: PolicyState) -> App {
    let mut app = fixtures::app(&Run {
        leak: 15 * MIB,
        ..run
    });
    app.set_policy_state(state);
    started(&mut app);
    app.on_event(firing(262.0, 19.6));
    app
}

#[test]
fn warning() {
    let mut app = past_the_warning(Run::default(), PolicyState::Warning);
    app.on_event(UiEvent::Action {
        t: 262.0,
        action: ActionKind::Warn,
        reason: "headroom-warn".into(),
        pids: vec![],
        error: None,
    });
    fixtures::output(&mut app);
    let text = screen(&app, 120, 40);
    insta::assert_snapshot!("warning", text);
}

#[test]
fn paused() {
    let run = Run {
        leak: 20 * MIB,
        frozen_at: Some(280),
        ..Run::default()
    };
    let mut app = fixtures::app(&run);
    app.set_policy_state(PolicyState::Paused);
    started(&mut app);
    app.on_event(firing(196.0, 19.8));
    app.on_event(UiEvent::RuleFiring {
        t: 280.0,
        rule: "headroom-critical".into(),
        metric: "headroom_percent".into(),
        value: 9.9,
        threshold: 10.0,
    });
    app.on_event(UiEvent::Action {
        t: 280.0,
        action: ActionKind::Pause,
        reason: "headroom-critical".into(),
        pids: vec![4100, 4101, 4200, 4201, 4202, 4203],
        error: None,
    });
    fixtures::output(&mut app);
    let text = screen(&app, 120, 40);
    insta::assert_snapshot!("paused", text);
}

#[test]
fn after_oom_kill() {
    let run = Run {
        leak: 30 * MIB,
        killed_at: Some(250),
        gpus: 1,
        ..Run::default()
    };
    let mut app = fixtures::app(&run);
    started(&mut app);
    app.on_event(firing(214.0, 19.9));
    app.on_event(UiEvent::CudaOom {
        t: 231.0,
        pid: Some(4101),
        device: Some(0),
        tried_bytes: Some(2 * GIB),
    });
    app.on_event(UiEvent::OomKill {
        t: 249.5,
        pid: 4202,
        comm: "pt_data_worker".into(),
        role: Some(Role::Worker),
    });
    app.on_event(UiEvent::WorkerDied {
        t: 249.6,
        pid: 4202,
        comm: "pt_data_worker".into(),
        how: "killed by SIGKILL".into(),
    });
    app.on_event(UiEvent::RuleCleared {
        t: 252.0,
        rule: "headroom-warn".into(),
        metric: "headroom_percent".into(),
        value: 45.2,
        threshold: 20.0,
    });
    fixtures::output(&mut app);
    app.on_output(b"\r\nERROR: DataLoader worker (pid 4202) is killed by signal: Killed.\r\n");
    let text = screen(&app, 120, 40);
    insta::assert_snapshot!("after_oom_kill", text);
}

#[test]
fn tree_of_64_workers() {
    let run = Run {
        workers: 64,
        leak: 2 * MIB,
        limit: 72 * GIB,
        mem_total: 256 * GIB,
        seconds: 120,
        ..Run::default()
    };
    let mut app = fixtures::app(&run);
    started(&mut app);
    fixtures::output(&mut app);
    // Select a worker further down; the table scrolls to it.
    app.selected = Some(4230);
    let text = screen(&app, 160, 50);
    insta::assert_snapshot!("tree_of_64_workers", text);
    assert!(text.contains("4230"), "{text}");
}

/// A leaking job with one GPU, past its warning, with some output.
fn warned() -> App {
    let run = Run {
        gpus: 1,
        ..Run::default()
    };
    let mut app = past_the_warning(run, PolicyState::Warning);
    fixtures::output(&mut app);
    app
}

#[test]
fn narrow_80x24() {
    let mut app = warned();
    app.set_attempt(2);
    app.set_restart_available(true);
    let text = screen(&app, 80, 24);
    insta::assert_snapshot!("narrow_80x24", text);
    for line in text.lines() {
        assert!(crate::sinks::tui::theme::width(line) <= 80, "{line}");
    }
}

/// A Lightning job in validation, its memory growing per training step.
fn with_progress(phase: crate::vocab::forensics::progress::Phase) -> App {
    let mut app = warned();
    app.set_progress(Some(crate::vocab::forensics::progress::Progress {
        step: Some(128),
        total: Some(400),
        epoch: Some("3".into()),
        phase: Some(phase),
        steps_per_second: Some(9.41),
        bytes_per_step: Some(3 << 19),
        ceiling_step: Some(1240),
    }));
    app
}

#[test]
fn progress_in_the_header_wide() {
    use crate::vocab::forensics::progress::Phase;
    let text = screen(&with_progress(Phase::Validation), 160, 40);
    insta::assert_snapshot!("progress_wide", text);
    let header = text.lines().next().unwrap_or_default();
    for part in [
        "epoch 3",
        "val 128/400",
        "9.4 steps/s",
        "ceiling ≈ step 1240",
    ] {
        assert!(header.contains(part), "{part:?} missing: {header}");
    }
}

#[test]
fn progress_in_the_header_narrow() {
    use crate::vocab::forensics::progress::Phase;
    let text = screen(&with_progress(Phase::Validation), 80, 24);
    insta::assert_snapshot!("progress_narrow_80x24", text);
    let header = text.lines().next().unwrap_or_default();
    assert!(header.contains("val 128/400"), "{header}");
    for line in text.lines() {
        assert!(crate::sinks::tui::theme::width(line) <= 80, "{line}");
    }
    // Training is the default phase: the step alone says it.
    let text = screen(&with_progress(Phase::Train), 80, 24);
    insta::assert_snapshot!("progress_training_narrow_80x24", text);
    let header = text.lines().next().unwrap_or_default();
    assert!(header.contains("step 128/400"), "{header}");
}

#[test]
fn help_overlay_80x24() {
    let mut app = fixtures::app(&Run::default());
    app.on_key(crossterm::event::KeyEvent::from(
        crossterm::event::KeyCode::Char('?'),
    ));
    let text = screen(&app, 80, 24);
    insta::assert_snapshot!("help_overlay_80x24", text);
}

#[test]
fn quit_dialog() {
    let mut app = fixtures::app(&Run::default());
    fixtures::output(&mut app);
    app.on_key(crossterm::event::KeyEvent::from(
        crossterm::event::KeyCode::Char('q'),
    ));
    let text = screen(&app, 120, 40);
    insta::assert_snapshot!("quit_dialog", text);
}

#[test]
fn before_the_first_sample_and_too_small() {
    let app = App::new("python train.py".into());
    insta::assert_snapshot!("first_frame", screen(&app, 80, 24));
    insta::assert_snapshot!("too_small", screen(&app, 30, 8));
}

/// Every screen at every size from tiny to wide renders without panicking
/// and without writing past the screen.
#[test]
fn any_size_renders() {
    let mut apps = vec![App::new("x".into())];
    let mut gpu = fixtures::app(&Run {
        gpus: 3,
        workers: 20,
        leak: 9 * MIB,
        ..Run::default()
    });
    fixtures::output(&mut gpu);
    started(&mut gpu);
    apps.push(gpu);
    let mut modal = fixtures::app(&Run::default());
    modal.on_key(crossterm::event::KeyEvent::from(
        crossterm::event::KeyCode::Char('s'),
    ));
    apps.push(modal);
    let mut help = fixtures::app(&Run::default());
    help.on_key(crossterm::event::KeyEvent::from(
        crossterm::event::KeyCode::Char('?'),
    ));
    apps.push(help);
    for app in &apps {
        for cols in (1..=220).step_by(9) {
            for rows in (1..=70).step_by(4) {
                let text = screen(app, cols, rows);
                assert_eq!(text.split('\n').count(), rows as usize);
                for line in text.lines() {
                    assert!(
                        crate::sinks::tui::theme::width(line) <= cols as usize,
                        "{cols}x{rows}: {line}"
                    );
                }
            }
        }
    }
}

/// A live dashboard on the real terminal, for looking at it: fixture
/// samples every half second, a real job on a pty, keys working. Run in a
/// terminal with
/// `cargo test --lib tui::screens::live_demo -- --ignored --nocapture`.
/// It is also the shape of the supervision loop's TUI branch.
#[test]
#[ignore = "interactive: needs a terminal and a person"]
fn live_demo() {
    use crate::job::pty::{PtyMaster, make_controlling, open_pty};
    use crate::sinks::tui::term::{TermEvent, Tui};
    use crate::vocab::model::History;
    use std::os::unix::process::CommandExt;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let run = Run {
            leak: 12 * MIB,
            gpus: 1,
            seconds: 600,
            ..Run::default()
        };
        let mut app = App::new("python3 demo_train.py --epochs 3".into());
        app.set_thresholds(Some(20.0), Some(10.0));
        app.set_restart_available(true);
        let mut tui = Tui::new().unwrap();
        let (cols, rows) = tui.size().unwrap();
        let (pc, pr) = ui::output_pane_size(&app, cols, rows);
        let (master, slave) = open_pty(pc, pr).unwrap();
        let script = r##"
import sys, time
for epoch in range(1, 1000):
    for step in range(0, 101, 5):
        bar = "#" * (step // 5)
        sys.stdout.write(f"\repoch {epoch}: {step:3d}%|{bar:<20}| {step*50}/5000")
        sys.stdout.flush()
        time.sleep(0.1)
    print(f"\n\x1b[32mINFO\x1b[0m epoch {epoch} loss {3.0/epoch:.3f}")
"##;
        let mut cmd = std::process::Command::new("python3");
        cmd.args(["-c", script])
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave.try_clone().unwrap());
        #[allow(unsafe_code)]
        // SAFETY: only `make_controlling` (two syscalls) runs after fork.
        unsafe {
            cmd.pre_exec(|| make_controlling(rustix::stdio::stdin()));
        }
        let mut child = cmd.spawn().unwrap();
        // The command keeps its copies of the slave until dropped; with any
        // copy left the master never reports the end.
        drop(cmd);
        drop(slave);
        let pty = PtyMaster::new(master).unwrap();
        let mut history = History::new(30.0);
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        let mut t = 0u32;
        let mut buf = [0u8; 4096];
        let mut paused = false;
        loop {
            tokio::select! {
                _ = tick.tick(), if !paused => {
                    let s = fixtures::sample(&run, t.min(run.seconds));
                    let v = history.push(&s);
                    app.on_sample(&s, &v);
                    app.set_policy_state(match v.headroom_percent() {
                        Some(p) if p < 10.0 => PolicyState::Stopping,
                        Some(p) if p < 20.0 => PolicyState::Warning,
                        _ => PolicyState::Normal,
                    });
                    t += 2;
                }
                n = pty.read(&mut buf) => {
                    match n {
                        Ok(0) | Err(_) => break,
                        Ok(n) => app.on_output(&buf[..n]),
                    }
                }
                ev = tui.next_event() => match ev.unwrap() {
                    TermEvent::Key(k) => match app.on_key(k) {
                        Some(super::app::UiCommand::Quit { .. }) => break,
                        Some(super::app::UiCommand::TogglePause) => {
                            paused = !paused;
                            app.set_policy_state(if paused { PolicyState::Paused } else { PolicyState::Normal });
                            app.on_event(UiEvent::Action {
                                t: f64::from(t),
                                action: if paused { ActionKind::Pause } else { ActionKind::Resume },
                                reason: "user".into(),
                                pids: vec![child.id()],
                                error: None,
                            });
                        }
                        Some(super::app::UiCommand::Interrupt) => pty.interrupt().unwrap(),
                        Some(c) => app.on_event(UiEvent::Note {
                            t: f64::from(t),
                            severity: Severity::Act,
                            text: format!("{c:?} requested"),
                        }),
                        None => {}
                    },
                    TermEvent::Resize { cols, rows } => {
                        let (pc, pr) = ui::output_pane_size(&app, cols, rows);
                        pty.resize(pc, pr).unwrap();
                    }
                },
            }
            tui.draw(&app).unwrap();
        }
        drop(tui);
        let _ = child.kill();
        let _ = child.wait();
    });
}

/// The memory chart's plot area, row by row (between the y axis and the
/// pane's right edge), and its x-axis labels.
fn memory_chart(text: &str) -> (Vec<Vec<char>>, String) {
    let lines: Vec<&str> = text.lines().collect();
    let top = lines.iter().position(|l| l.contains("Memory")).unwrap();
    let axis = top + lines[top..].iter().position(|l| l.contains('└')).unwrap();
    let plot = lines[top + 1..axis]
        .iter()
        .map(|l| l.split('│').nth(2).unwrap().chars().collect())
        .collect();
    let labels = lines[axis + 1].trim_matches(|c| c == '│' || c == ' ');
    (plot, labels.to_string())
}

fn braille(c: char) -> bool {
    ('\u{2801}'..='\u{28ff}').contains(&c)
}

/// Whether the lines reach both edges of the plot.
fn spans_the_width(plot: &[Vec<char>]) -> bool {
    let width = plot[0].len();
    [0, width - 1].iter().all(|&x| {
        plot.iter()
            .any(|row| row.get(x).copied().is_some_and(braille))
    })
}

/// Checks that `seconds` into a run, the memory chart's lines reach both
/// edges and its axis reads `labels`.
fn chart_spans(seconds: u32, snapshot: &str, labels: [&str; 3]) {
    let mut app = fixtures::app(&Run {
        seconds,
        ..Run::default()
    });
    started(&mut app);
    let text = screen(&app, 120, 40);
    insta::assert_snapshot!(snapshot, text);
    let (plot, axis) = memory_chart(&text);
    assert!(spans_the_width(&plot), "{text}");
    assert_eq!(
        axis.split_whitespace().collect::<Vec<_>>(),
        labels,
        "{text}"
    );
}

/// 8 s into a run, the chart spans those 8 s: the lines fill its width
/// (on a fixed one-minute axis they would sit in its right 15 %).
#[test]
fn early_in_the_run_the_chart_spans_the_run() {
    chart_spans(8, "early_in_the_run", ["-8s", "-4s", "now"]);
}

/// Past the window, the chart shows the last ten minutes, edge to edge.
#[test]
fn past_the_window_the_chart_spans_the_window() {
    chart_spans(700, "past_the_window", ["-10m", "-5m", "now"]);
}

/// 16 s after the trainer forked its workers, its own PSS is 1.6 GiB
/// lower: those pages moved to the workers, nothing was freed. Its row
/// shows its family's growth, marked Σ, not a decrease.
#[test]
fn right_after_the_fork_the_trainer_shows_its_familys_growth() {
    let run = Run {
        seconds: 60,
        forked_at: Some(24),
        ..Run::default()
    };
    let mut app = fixtures::app(&run);
    started(&mut app);
    let text = screen(&app, 120, 40);
    insta::assert_snapshot!("right_after_the_fork", text);
    // The table's part of a row (the events pane is beside it).
    let row = |pid: &str| {
        let line = text.lines().find(|l| l.contains(pid)).unwrap();
        line.split('┃').nth(1).unwrap().to_string()
    };
    let trainer = row("4101 trainer");
    let growth = trainer.split_whitespace().rev().nth(1).unwrap();
    assert!(growth.starts_with("Σ+"), "{text}");
    assert!(!trainer.contains('-'), "{text}");
    // A worker has no children: its own growth, unmarked.
    assert!(!row("4200 worker").contains('Σ'), "{text}");
}

/// The growth of the fastest process, in the header and in its table row:
/// one figure per process in one frame (each row's last column).
#[test]
fn the_header_and_the_table_give_the_fastest_process_the_same_growth() {
    for app in [warned(), fixtures::app(&Run::default())] {
        let text = screen(&app, 160, 45);
        let header = text
            .lines()
            .find_map(|l| l.split(" fastest ").nth(1))
            .expect("a fastest process in the header");
        let mut words = header.split_whitespace();
        let pid = words.next().unwrap();
        // `+904 MiB/min` in the header, `▲+904 MiB` (or `Σ…`) in the row.
        let before_min = header.split("/min").next().unwrap();
        let words: Vec<&str> = before_min.split_whitespace().collect();
        let figure = words[words.len() - 2..].join(" ");
        let row = text
            .lines()
            .find(|l| {
                l.trim_start_matches(['┃', ' '])
                    .starts_with(&format!("{pid} "))
            })
            .unwrap_or_else(|| panic!("no row for {pid}\n{text}"));
        let part = row
            .split('┃')
            .find(|part| part.trim_start().starts_with(pid))
            .unwrap();
        let cells: Vec<&str> = part.split_whitespace().collect();
        let cell = cells[cells.len() - 2..].join(" ");
        let cell = cell.trim_start_matches(['Σ', '▲']);
        assert_eq!(cell, figure, "header: {header}\nrow: {row}");
    }
}

fn screen_buffer(app: &App, cols: u16, rows: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(cols, rows)).unwrap();
    terminal.draw(|f| ui::render(app, f)).unwrap();
    terminal.backend().buffer().clone()
}

/// The memory pane of a screen: its top and bottom rows and its right
/// edge.
fn memory_pane(buf: &Buffer) -> (u16, u16, u16) {
    let area = buf.area;
    let row = |y: u16| -> String { (0..area.width).map(|x| buf[(x, y)].symbol()).collect() };
    let top = (0..area.height)
        .find(|&y| row(y).contains("╭ Memory"))
        .unwrap();
    let bottom = (top + 1..area.height)
        .find(|&y| buf[(0, y)].symbol() == "╰")
        .unwrap();
    let right = (1..area.width)
        .find(|&x| buf[(x, top)].symbol() == "╮")
        .unwrap();
    (top, bottom, right)
}

/// The rows of the memory chart where dots of `colour` show.
fn rows_in(buf: &Buffer, colour: ratatui::style::Color) -> Vec<u16> {
    let (top, bottom, right) = memory_pane(buf);
    (top + 1..bottom)
        .filter(|&y| {
            (1..right).any(|x| {
                let c = &buf[(x, y)];
                c.fg == colour && c.symbol().chars().next().is_some_and(braille)
            })
        })
        .collect()
}

/// The text of one row of a buffer.
fn row_of(buf: &Buffer, y: u16) -> String {
    (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect()
}

/// A size as the dashboard prints it (`16.8 GiB`), in bytes.
fn parse_bytes(s: &str) -> f64 {
    let mut it = s.split_whitespace();
    let n: f64 = it.next().unwrap().parse().unwrap();
    let unit = match it.next().unwrap() {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => MIB as f64,
        "GiB" => GIB as f64,
        "TiB" => GIB as f64 * 1024.0,
        u => panic!("unit {u}"),
    };
    n * unit
}

/// At 80×24 the chart has three rows: the limit, critical and warning
/// lines would all fall in the top one and read as one line. Each is
/// drawn on a row of its own, or named on the pane's edge as left out.
#[test]
fn at_80x24_the_threshold_lines_sit_on_distinct_rows_or_are_named() {
    use crate::sinks::tui::theme;
    let buf = screen_buffer(&warned(), 80, 24);
    let (_, bottom, _) = memory_pane(&buf);
    let edge = row_of(&buf, bottom);
    let mut drawn: Vec<(&str, Vec<u16>)> = Vec::new();
    for (name, colour) in [
        ("limit", theme::LIMIT),
        ("crit", ratatui::style::Color::LightRed),
        ("warn", theme::WARN),
    ] {
        let rows = rows_in(&buf, colour);
        if rows.is_empty() {
            assert!(
                edge.contains(name),
                "{name} neither drawn nor named: {edge}"
            );
        } else {
            drawn.push((name, rows));
        }
    }
    assert!(!drawn.is_empty());
    for (i, (a, ra)) in drawn.iter().enumerate() {
        for (b, rb) in &drawn[i + 1..] {
            assert!(
                ra.iter().all(|r| !rb.contains(r)),
                "{a} {ra:?} and {b} {rb:?} share a row"
            );
        }
    }
}

/// The y axis holds every curve the chart draws: the RSS sum (20.6 GiB,
/// over a 16 GiB limit) is either on the scale or left out and named.
#[test]
fn the_y_axis_holds_every_curve_it_draws() {
    use crate::sinks::tui::theme;
    let app = warned();
    let buf = screen_buffer(&app, 160, 45);
    let text = buffer_text(&buf);
    let (top, bottom, _) = memory_pane(&buf);
    let axis_top = row_of(&buf, top + 1);
    let label = axis_top.split('│').nth(1).unwrap().trim();
    let y_max = parse_bytes(label);
    let rss = app.sample.as_ref().unwrap().tree.rss_bytes as f64;
    if rss > y_max {
        assert!(rows_in(&buf, theme::RSS).is_empty(), "{text}");
        assert!(row_of(&buf, bottom).contains("RSS Σ"), "{text}");
    }
    // Every other curve fits: the footprint, the PSS and the limit.
    let s = app.sample.as_ref().unwrap();
    for v in [s.tree.footprint_bytes, s.tree.pss_bytes, 16 * GIB] {
        assert!((v as f64) <= y_max, "{v} above {label}");
    }
}

/// The gauge shows the footprint (here the cgroup's working set, 300 MiB
/// above the PSS sum) and names it; the PSS sum appears only under its
/// own name, and the chart has a footprint curve apart from PSS.
#[test]
fn the_gauge_is_the_footprint_and_pss_shows_only_as_pss() {
    use crate::sinks::tui::theme;
    let app = fixtures::app(&Run::default());
    let s = app.sample.as_ref().unwrap();
    assert!(s.tree.footprint_bytes >= s.tree.pss_bytes + 100 * MIB);
    let (footprint, pss) = (
        theme::bytes(s.tree.footprint_bytes),
        theme::bytes(s.tree.pss_bytes),
    );
    assert_ne!(footprint, pss);
    let text = screen(&app, 160, 45);
    let gauge = text.lines().find(|l| l.contains("▶ cgroup")).unwrap();
    assert!(
        gauge.contains(&format!("footprint (working set) {footprint} / 16.0 GiB")),
        "{gauge}"
    );
    assert!(!gauge.contains(&pss), "{gauge}");
    for (i, _) in text.match_indices(&pss) {
        assert!(
            text[..i].ends_with("PSS "),
            "unlabelled PSS at {i}:\n{text}"
        );
    }
    let legend = text.lines().find(|l| l.contains("Memory")).unwrap();
    assert!(
        legend.contains("━ footprint (working set) ━ PSS"),
        "{legend}"
    );
}

/// A stop tears the tree down: its processes hold no pages (RSS 0) and
/// their PSS is a stale estimate while the cgroup still holds its working
/// set. The frame says the tree is exiting instead of setting `RSS Σ 0 B`
/// beside a gauge of several GiB, and the gauge says what it shows.
#[test]
fn a_stopping_frame_agrees_with_itself() {
    let run = Run {
        exiting_at: Some(300),
        ..Run::default()
    };
    let mut app = past_the_warning(run, PolicyState::Stopping);
    app.on_event(UiEvent::Action {
        t: 298.0,
        action: ActionKind::Stop,
        reason: "headroom-critical".into(),
        pids: vec![4101],
        error: None,
    });
    fixtures::output(&mut app);
    let text = screen(&app, 120, 40);
    let totals = text.lines().find(|l| l.starts_with(" procs")).unwrap();
    assert!(totals.contains("exiting, holding no memory"), "{totals}");
    for stale in ["PSS", "RSS Σ", "USS", "fastest"] {
        assert!(!totals.contains(stale), "{totals}");
    }
    let gauge = text.lines().find(|l| l.contains("▶ cgroup")).unwrap();
    assert!(gauge.contains("working set 12."), "{gauge}");
    assert!(!gauge.contains("ETA"), "{gauge}");
    // Nor does the table give the exiting processes the sweeper's stale
    // PSS beside their RSS of 0.
    let trainer = text.lines().find(|l| l.contains("4101 trainer")).unwrap();
    let cells = trainer.split('┃').nth(1).unwrap();
    assert!(!cells.contains("MiB"), "{trainer}");
    insta::assert_snapshot!("stopping", text);
}
