//! The dashboard's side of the loop: the user's keys and commands, the
//! redraw, and a terminal that hangs up.

use super::*;

impl Supervisor {
    /// A key or a resize on the dashboard.
    pub(super) fn on_term(&mut self, ev: Result<crate::tui::TermEvent, crate::tui::TermError>) {
        use crate::tui::{TermEvent, UiCommand};
        let ev = match ev {
            Ok(ev) => ev,
            Err(crate::tui::TermError::HangUp) => {
                self.on_hangup();
                return;
            }
            Err(e) => {
                if self.tui.as_ref().is_some_and(|t| t.hung_up()) {
                    self.on_hangup();
                    return;
                }
                // The terminal cannot be read: carry on without the dashboard.
                self.close_dashboard();
                self.say(format!("dashboard closed: {e}"));
                return;
            }
        };
        match ev {
            TermEvent::Resize { cols, rows } => {
                if let (Some(app), Some(pty)) = (&self.sinks.app, &self.pty) {
                    let (c, r) = crate::tui::output_pane_size(app, cols, rows);
                    let _ = pty.resize(c, r);
                }
            }
            TermEvent::Key(key) => {
                let Some(cmd) = self.sinks.app.as_mut().and_then(|a| a.on_key(key)) else {
                    return;
                };
                let t = crate::clock::since(self.started).as_secs_f64();
                let alive = self.main_status.is_none() && self.core.act.stop.is_none();
                match cmd {
                    UiCommand::Interrupt => self.on_ctrl_c(),
                    UiCommand::TogglePause if alive => {
                        if self.core.act.paused.is_empty() {
                            self.pause("manual (dashboard)");
                            self.core.engine.paused_externally(t);
                        } else {
                            self.resume("manual (dashboard)");
                            self.core.engine.resumed_externally();
                        }
                    }
                    UiCommand::Stop | UiCommand::Quit { stop_job: true } if alive => {
                        self.begin_stop(Action::Stop, words::MANUAL_STOP);
                    }
                    UiCommand::Restart if alive => {
                        self.begin_stop(Action::Restart, words::MANUAL_RESTART);
                    }
                    UiCommand::Quit { stop_job: false } if self.target.quit_detaches() => {
                        self.end_watch("detached from the dashboard".to_string());
                    }
                    UiCommand::Quit { stop_job: false } => {
                        self.leave_dashboard();
                        eprintln!(
                            "oomguard: dashboard closed; the job keeps running under oomguard (pid {}); its output is discarded",
                            std::process::id()
                        );
                    }
                    _ => {}
                }
            }
        }
    }

    /// Ctrl-C in the dashboard, where it is a key, not a signal: the first
    /// asks every rank to save its last step and then ends the job (as a
    /// SIGINT to oomguard does); without a companion, or once a save is
    /// under way, ^C is typed into the job's terminal as before.
    fn on_ctrl_c(&mut self) {
        self.core.act.poll_channel(crate::clock::now());
        self.acted(None);
        let saves = self.main_status.is_none()
            && signals::plan(libc::SIGINT, self.standing(), &self.cfg.on_signal)
                == SignalPlan::Save { exit: true };
        if saves {
            self.signal_save(libc::SIGINT, true, "Ctrl-C");
        } else if let Some(p) = &self.pty {
            self.typed_interrupt |= p.interrupt().is_ok() && self.main_status.is_none();
        }
    }

    /// The end of the run: the dashboard closes, and what it showed that
    /// the summary does not repeat (the run's events, the job's last
    /// lines) is left on the terminal, where the alternate screen would
    /// otherwise take it away. The job's last bytes still in its terminal
    /// are read first: they are often why it ended.
    pub(super) fn leave_dashboard(&mut self) {
        let mut buf = vec![0u8; 64 * 1024];
        // Bounded: a job that is gone cannot fill it again, but a tree
        // oomguard does not wait for (attach) might.
        for _ in 0..64 {
            match self.pty.as_ref().map(|p| p.try_read(&mut buf)) {
                Some(Ok(n)) if n > 0 => self.take_pty_output(&buf[..n]),
                _ => break,
            }
        }
        let app = self.sinks.app.take();
        self.close_dashboard();
        if let Some(app) = app
            && !self.cfg.quiet
            && !self.hung_up
        {
            let lines = crate::tui::afterword(&app, self.cfg.output_lines as usize);
            let mut err = std::io::stderr().lock();
            for line in lines {
                use std::io::Write;
                let _ = writeln!(err, "{line}");
            }
        }
    }

    /// Leaves the dashboard and gives the terminal back. The pty stays
    /// open (and drained) so the job is not hung up.
    pub(super) fn close_dashboard(&mut self) {
        if let Some(mut t) = self.tui.take() {
            let _ = t.restore();
        }
        self.sinks.app = None;
    }

    /// Redraws the dashboard (after every event; nothing runs while idle).
    pub(super) fn draw(&mut self) {
        use crate::tui::PolicyState;
        let (Some(tui), Some(app)) = (self.tui.as_mut(), self.sinks.app.as_mut()) else {
            return;
        };
        app.set_elapsed(crate::clock::since(self.started).as_secs_f64());
        let state = match &self.core.act.stop {
            Some(st) if st.action == Action::Restart => PolicyState::Restarting,
            Some(_) => PolicyState::Stopping,
            None if self.attempts.between() => PolicyState::Restarting,
            None if !self.core.act.paused.is_empty() => PolicyState::Paused,
            None if self.core.engine.warning() => PolicyState::Warning,
            None => PolicyState::Normal,
        };
        app.set_policy_state(state);
        if tui.draw(app).is_err() {
            if tui.hung_up() {
                self.on_hangup();
            } else {
                self.close_dashboard();
            }
        }
    }

    /// The dashboard's terminal hung up (an SSH connection dropped, a window
    /// or tmux session closed). By default as for a job run from a shell:
    /// the job gets SIGHUP and the run ends (SIGKILL after `--kill-after`
    /// for a tree that outlives it). With `--on-hangup detach` oomguard goes
    /// on supervising headless. Either way the dead terminal is never read
    /// or written again.
    pub(super) fn on_hangup(&mut self) {
        if self.hung_up {
            return;
        }
        self.hung_up = true;
        // First: ratatui reports a failed cleanup with `eprintln!`, which
        // panics on a dead terminal.
        crate::tui::detach_dead_terminal();
        self.close_dashboard();
        let go_on = self.cfg.tui.on_hangup == crate::cli::OnHangup::Detach;
        match signals::hangup_plan(go_on, self.standing()) {
            HangupPlan::GoOnHeadless => return,
            HangupPlan::EndWatch => {
                self.on_signal(SIG_TERM);
                return;
            }
            HangupPlan::CancelRestart => {
                self.attempts.cancel();
                self.shutdown_signal = Some(libc::SIGHUP);
                return;
            }
            HangupPlan::HangUpTheJob => {}
        }
        self.forward(libc::SIGHUP);
        let pids = vec![self.job.pid];
        self.begin_shutdown("terminal hangup", pids, libc::SIGHUP, "ok".into());
    }
}
