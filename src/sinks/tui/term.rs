//! The real terminal: entering raw mode and the alternate screen, drawing
//! frames, waiting for keys and resizes without polling, and putting the
//! terminal back on every way out (normal exit, drop, panic, and a
//! `restore()` the loop calls on SIGTERM).
//!
//! Input is read only when the terminal has some: the tty is registered
//! with tokio, and when it becomes readable the bytes are read here and
//! parsed by `keys` (crossterm's own reader spins forever on a hung-up
//! terminal). Resizes arrive as SIGWINCH. Nothing wakes up while nothing
//! happens, so an idle dashboard costs nothing; a hangup (EOF, EIO,
//! POLLHUP) ends the wait with [`TermError::HangUp`].

use std::io::{self, IsTerminal, Stdout};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use std::collections::VecDeque;
use std::os::fd::AsFd;

use crossterm::event::KeyEvent;
use crossterm::terminal::{Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen};
use crossterm::{cursor, execute};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::app::App;
use super::ui;

/// Whether the terminal is in the dashboard's modes (raw, alternate
/// screen) and must be restored.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static PANIC_HOOK: Once = Once::new();

/// Why the terminal could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum TermError {
    #[error("the dashboard needs a terminal, but standard output is not one")]
    NotATerminal,
    #[error("the terminal hung up")]
    HangUp,
    #[error("cannot {what} the terminal: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> TermError {
    move |source| TermError::Io { what, source }
}

/// What the terminal reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEvent {
    /// A key press (give it to `App::on_key`, then redraw).
    Key(KeyEvent),
    /// The terminal's new size (redraw; resize the job's pty).
    Resize { cols: u16, rows: u16 },
}

/// The dashboard's hold on the terminal. Dropping it restores the terminal.
pub struct Tui {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    input: AsyncFd<OwnedFd>,
    winch: Signal,
    /// Keys read but not yet handed out (one read can hold several).
    keys: VecDeque<KeyEvent>,
}

impl std::fmt::Debug for Tui {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tui").finish_non_exhaustive()
    }
}

impl Tui {
    /// Takes over the terminal: raw mode, alternate screen, hidden cursor,
    /// and a panic hook that restores it before the panic is reported.
    /// Must be called inside a tokio runtime (with I/O and signals).
    pub fn new() -> Result<Self, TermError> {
        if !io::stdout().is_terminal() {
            return Err(TermError::NotATerminal);
        }
        // Register input and SIGWINCH before touching the terminal, so a
        // failure leaves nothing to undo.
        let input = open_input().map_err(io_err("watch the input of"))?;
        let input = super::pty::watch(input).map_err(io_err("watch the input of"))?;
        let winch = signal(SignalKind::window_change()).map_err(io_err("watch the size of"))?;
        install_panic_hook();
        let tui = (|| {
            ACTIVE.store(true, Ordering::SeqCst);
            crossterm::terminal::enable_raw_mode().map_err(io_err("enter raw mode on"))?;
            // Cleared here rather than with `Terminal::clear`, which asks
            // the terminal where its cursor is and waits for an answer
            // some terminals never give.
            execute!(
                io::stdout(),
                EnterAlternateScreen,
                cursor::Hide,
                Clear(ClearType::All)
            )
            .map_err(io_err("switch to the alternate screen of"))?;
            let terminal =
                Terminal::new(CrosstermBackend::new(io::stdout())).map_err(io_err("set up"))?;
            Ok(Tui {
                terminal,
                input,
                winch,
                keys: VecDeque::new(),
            })
        })();
        if tui.is_err() {
            let _ = restore();
        }
        tui
    }

    /// Draws the dashboard. Call after every sample, event, output chunk,
    /// key and resize; nothing else redraws it.
    pub fn draw(&mut self, app: &App) -> Result<(), TermError> {
        self.terminal
            .draw(|frame| ui::render(app, frame))
            .map_err(io_err("draw on"))?;
        Ok(())
    }

    /// The terminal's size (columns, rows).
    pub fn size(&self) -> Result<(u16, u16), TermError> {
        let s = self.terminal.size().map_err(io_err("read the size of"))?;
        Ok((s.width, s.height))
    }

    /// Waits for the next key or resize. Cancel-safe: use it in
    /// `tokio::select!` next to samples and output.
    pub async fn next_event(&mut self) -> Result<TermEvent, TermError> {
        loop {
            if let Some(k) = self.keys.pop_front() {
                return Ok(TermEvent::Key(k));
            }
            tokio::select! {
                ready = self.input.readable() => {
                    let mut guard = ready.map_err(io_err("read from"))?;
                    // The fd is blocking (it shares its file description
                    // with the shell's stdin, which must stay blocking), so
                    // it is read only when poll says there is input now.
                    match input_state(self.input.get_ref().as_fd()) {
                        Input::HangUp => return Err(TermError::HangUp),
                        Input::Empty => guard.clear_ready(),
                        Input::Data => {
                            let mut buf = [0u8; 1024];
                            match rustix::io::read(self.input.get_ref(), &mut buf) {
                                Ok(0) | Err(rustix::io::Errno::IO) => {
                                    return Err(TermError::HangUp);
                                }
                                Ok(n) => self.keys.extend(super::keys::parse(&buf[..n])),
                                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                                Err(e) => return Err(io_err("read from")(e.into())),
                            }
                        }
                    }
                }
                _ = self.winch.recv() => {
                    let (cols, rows) = crossterm::terminal::size()
                        .map_err(io_err("read the size of"))?;
                    return Ok(TermEvent::Resize { cols, rows });
                }
            }
        }
    }

    /// Whether the terminal has hung up (its reads end, writes fail).
    pub fn hung_up(&self) -> bool {
        matches!(input_state(self.input.get_ref().as_fd()), Input::HangUp)
    }

    /// Gives the terminal back (same as dropping the `Tui`).
    pub fn restore(&mut self) -> Result<(), TermError> {
        restore().map_err(io_err("restore"))
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        let _ = restore();
    }
}

enum Input {
    Data,
    Empty,
    HangUp,
}

/// What the terminal has for us right now, without blocking.
fn input_state(fd: std::os::fd::BorrowedFd<'_>) -> Input {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&zero)) {
        Ok(_) => {
            let r = fds[0].revents();
            if r.intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL) {
                Input::HangUp
            } else if r.contains(PollFlags::IN) {
                Input::Data
            } else {
                Input::Empty
            }
        }
        Err(_) => Input::Empty,
    }
}

/// Points stdout and stderr, where they hung up (a terminal gone, a pipe
/// nobody reads), at
/// `/dev/null`: every later write (the summary, a message) would fail with
/// EIO, and Rust's `eprintln!` panics on a failed write.
pub fn detach_dead_terminal() {
    let Ok(null) = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return;
    };
    for fd in [rustix::stdio::stdout(), rustix::stdio::stderr()] {
        // Not `isatty`: its ioctl fails on a hung-up terminal.
        if matches!(input_state(fd), Input::HangUp) {
            #[allow(unsafe_code)]
            // SAFETY: dup2 onto fd 1 or 2, which stay open for the life of
            // the process; nothing holds a typed owner of them.
            unsafe {
                libc::dup2(null.as_raw_fd(), fd.as_raw_fd());
            }
        }
    }
}

/// The fd crossterm reads keys from: standard input when it is a
/// terminal, `/dev/tty` otherwise. Duplicated so tokio can watch it
/// without owning (or closing) the original.
fn open_input() -> io::Result<OwnedFd> {
    let stdin = rustix::stdio::stdin();
    if rustix::termios::isatty(stdin) {
        return Ok(rustix::io::fcntl_dupfd_cloexec(stdin, 3)?);
    }
    Ok(rustix::fs::open(
        "/dev/tty",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NOCTTY,
        rustix::fs::Mode::empty(),
    )?)
}

/// Puts the terminal back: leaves the alternate screen, shows the cursor,
/// and ends raw mode. Does nothing when the dashboard is not active, so it
/// is safe to call from a signal path, a panic hook and `Drop` alike.
pub fn restore() -> io::Result<()> {
    if !ACTIVE.swap(false, Ordering::SeqCst) {
        return Ok(());
    }
    let screen = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
    let raw = crossterm::terminal::disable_raw_mode();
    screen.and(raw)
}

/// Whether the dashboard currently holds the terminal.
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::SeqCst)
}

fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // The report must land on a normal screen, not the alternate
            // one that is about to disappear.
            let _ = restore();
            previous(info);
        }));
    });
}
