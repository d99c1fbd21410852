//! The dashboard's side of the loop. `Screen` owns the terminal
//! (`Tui`), the job's pty and its keeper, and what happened to them (a
//! hangup, a Ctrl-C typed into the job); the `Supervisor` chapter below
//! handles the user's keys and commands, the redraw, and a terminal that
//! hangs up.

use std::os::fd::AsFd;

use super::signals::{self, HangupPlan, SignalPlan};
use super::{SIG_TERM, Supervisor, words};
use crate::engine::policy::Action;
use crate::sinks::tui::{App, PtyMaster, TermError, TermEvent, Tui};

/// What the dashboard's terminal or the job's pty brought.
pub(super) enum Brought {
    Output(std::io::Result<usize>),
    Term(Result<TermEvent, TermError>),
}

/// The dashboard's terminal and the job's pty.
#[derive(Default)]
pub(super) struct Screen {
    /// The live dashboard's terminal (it owns the real terminal; the job
    /// gets a terminal of its own, `pty`).
    tui: Option<Tui>,
    pty: Option<PtyMaster>,
    /// Holds the job's pty in case oomguard dies (see `keeper`).
    keeper: Option<crate::job::keeper::Keeper>,
    /// The terminal hung up (handled once).
    hung_up: bool,
    /// Ctrl-C was typed into the job's terminal from the dashboard this
    /// attempt (no save asked for: the job was interrupted).
    typed_interrupt: bool,
}

impl Screen {
    pub fn new(tui: Option<Tui>, pty: Option<PtyMaster>) -> Self {
        Self {
            tui,
            pty,
            ..Self::default()
        }
    }

    /// Resolves with the job's next output on its pty, or the terminal's
    /// next key or resize; never when neither is open.
    pub async fn next(&mut self, buf: &mut [u8]) -> Brought {
        let output = async {
            match self.pty.as_ref() {
                Some(p) => p.read(buf).await,
                None => std::future::pending().await,
            }
        };
        let term = async {
            match self.tui.as_mut() {
                Some(t) => t.next_event().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            n = output => Brought::Output(n),
            ev = term => Brought::Term(ev),
        }
    }

    /// A pty for the next attempt's job, sized like the dashboard's output
    /// pane; its slave end for the job. None without a dashboard.
    pub fn open_job_pty(
        &mut self,
        app: Option<&App>,
    ) -> Option<Result<std::os::fd::OwnedFd, String>> {
        let (tui, app) = (self.tui.as_ref()?, app?);
        Some(super::open_job_pty(tui, app).map(|(m, s)| {
            self.pty = Some(m);
            s
        }))
    }

    /// The job's pty gave EOF or EIO: nobody has its side open any more.
    pub fn lost_pty(&mut self) {
        self.pty = None;
        self.keeper = None;
    }

    /// Starts an output keeper for the job's pty: if oomguard dies, the
    /// job's output goes to the terminal rather than failing. Its pid
    /// (not the job's), or why it could not start.
    pub fn keep_pty(&mut self) -> Option<Result<u32, std::io::Error>> {
        let pty = self.pty.as_ref()?;
        let stdout = std::io::stdout();
        Some(
            match crate::job::keeper::Keeper::spawn(&[(pty.as_fd(), stdout.as_fd())]) {
                Ok(k) => {
                    let pid = k.pid();
                    self.keeper = Some(k);
                    Ok(pid)
                }
                Err(e) => {
                    self.keeper = None;
                    Err(e)
                }
            },
        )
    }

    /// The run is over: the keeper is no longer needed.
    pub fn drop_keeper(&mut self) {
        self.keeper = None;
    }

    /// Reads what the job left in its pty (bounded: a tree oomguard does
    /// not wait for might fill it again).
    pub fn drain_pty(&mut self, mut take: impl FnMut(&[u8])) {
        let mut buf = vec![0u8; 64 * 1024];
        for _ in 0..64 {
            match self.pty.as_ref().map(|p| p.try_read(&mut buf)) {
                Some(Ok(n)) if n > 0 => take(&buf[..n]),
                _ => break,
            }
        }
    }

    /// The terminal took a new size: so does the job's pane.
    pub fn resize(&self, app: &App, cols: u16, rows: u16) {
        if let Some(pty) = &self.pty {
            let (c, r) = crate::sinks::tui::output_pane_size(app, cols, rows);
            let _ = pty.resize(c, r);
        }
    }

    /// Ctrl-C typed into the job's terminal (when the job still runs).
    pub fn type_interrupt(&mut self, job_running: bool) {
        if let Some(p) = &self.pty {
            self.typed_interrupt |= p.interrupt().is_ok() && job_running;
        }
    }

    pub fn typed_interrupt(&self) -> bool {
        self.typed_interrupt
    }

    /// A new attempt: nothing typed into it yet.
    pub fn new_attempt(&mut self) {
        self.typed_interrupt = false;
    }

    pub fn is_open(&self) -> bool {
        self.tui.is_some()
    }

    /// The terminal is gone (as the terminal itself reports it).
    pub fn terminal_hung_up(&self) -> bool {
        self.tui.as_ref().is_some_and(Tui::hung_up)
    }

    /// Whether a hangup was handled already.
    pub fn hung_up(&self) -> bool {
        self.hung_up
    }

    /// Marks the hangup handled; false when it already was.
    pub fn mark_hung_up(&mut self) -> bool {
        !std::mem::replace(&mut self.hung_up, true)
    }

    /// Gives the terminal back (the pty stays open, and drained, so the
    /// job is not hung up).
    pub fn close(&mut self) {
        if let Some(mut t) = self.tui.take() {
            let _ = t.restore();
        }
    }

    /// Draws `app`; false when the terminal failed.
    pub fn draw(&mut self, app: &App) -> bool {
        self.tui.as_mut().is_none_or(|t| t.draw(app).is_ok())
    }
}

impl Supervisor {
    /// A key or a resize on the dashboard.
    pub(super) fn on_term(&mut self, ev: Result<TermEvent, TermError>) {
        use crate::sinks::tui::UiCommand;
        let ev = match ev {
            Ok(ev) => ev,
            Err(TermError::HangUp) => {
                self.on_hangup();
                return;
            }
            Err(e) => {
                if self.screen.terminal_hung_up() {
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
                if let Some(app) = self.sinks.app() {
                    self.screen.resize(app, cols, rows);
                }
            }
            TermEvent::Key(key) => {
                let Some(cmd) = self.sinks.app_mut().and_then(|a| a.on_key(key)) else {
                    return;
                };
                let t = self.run_t();
                let alive = self.child.status().is_none() && self.core.act().stop().is_none();
                match cmd {
                    UiCommand::Interrupt => self.on_ctrl_c(),
                    UiCommand::TogglePause if alive => {
                        if self.core.act().paused().is_empty() {
                            self.pause("manual (dashboard)");
                            self.core.paused_externally(t);
                        } else {
                            self.resume("manual (dashboard)");
                            self.core.resumed_externally();
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
        self.core.act_mut().poll_channel(crate::vocab::clock::now());
        self.acted(None);
        let saves = self.child.status().is_none()
            && signals::plan(libc::SIGINT, self.standing(), &self.cfg.on_signal)
                == SignalPlan::Save { exit: true };
        if saves {
            self.signal_save(libc::SIGINT, true, "Ctrl-C");
        } else {
            self.screen.type_interrupt(self.child.status().is_none());
        }
    }

    /// The end of the run: the dashboard closes, and what it showed that
    /// the summary does not repeat (the run's events, the job's last
    /// lines) is left on the terminal, where the alternate screen would
    /// otherwise take it away. The job's last bytes still in its terminal
    /// are read first: they are often why it ended.
    pub(super) fn leave_dashboard(&mut self) {
        let mut taken = Vec::new();
        self.screen.drain_pty(|b| taken.extend_from_slice(b));
        if !taken.is_empty() {
            self.take_pty_output(&taken);
        }
        let app = self.sinks.take_app();
        self.close_dashboard();
        if let Some(app) = app
            && !self.cfg.quiet
            && !self.screen.hung_up()
        {
            let lines = crate::sinks::tui::afterword(&app, self.cfg.output_lines as usize);
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
        self.screen.close();
        drop(self.sinks.take_app());
    }

    /// Redraws the dashboard (after every event; nothing runs while idle).
    pub(super) fn draw(&mut self) {
        use crate::sinks::tui::PolicyState;
        let t = self.run_t();
        let Some(app) = self.sinks.app_mut().filter(|_| self.screen.is_open()) else {
            return;
        };
        app.set_elapsed(t);
        let state = match self.core.act().stop() {
            Some(st) if st.action() == Action::Restart => PolicyState::Restarting,
            Some(_) => PolicyState::Stopping,
            None if self.attempts.between() => PolicyState::Restarting,
            None if !self.core.act().paused().is_empty() => PolicyState::Paused,
            None if self.core.warning() => PolicyState::Warning,
            None => PolicyState::Normal,
        };
        app.set_policy_state(state);
        if !self.screen.draw(app) {
            if self.screen.terminal_hung_up() {
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
        if !self.screen.mark_hung_up() {
            return;
        }
        // First: ratatui reports a failed cleanup with `eprintln!`, which
        // panics on a dead terminal.
        crate::sinks::tui::detach_dead_terminal();
        self.close_dashboard();
        let go_on = self.cfg.tui.on_hangup == crate::settings::cli::OnHangup::Detach;
        match signals::hangup_plan(go_on, self.standing()) {
            HangupPlan::GoOnHeadless => return,
            HangupPlan::EndWatch => {
                self.on_signal(SIG_TERM);
                return;
            }
            HangupPlan::CancelRestart => {
                self.attempts.cancel();
                self.child.shutting_down(libc::SIGHUP);
                return;
            }
            HangupPlan::HangUpTheJob => {}
        }
        self.forward(libc::SIGHUP);
        let pids = vec![self.child.pid()];
        self.begin_shutdown("terminal hangup", pids, libc::SIGHUP, "ok".into());
    }
}
