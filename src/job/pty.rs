//! The job's own terminal. The dashboard owns the real one, yet the job
//! must still see a terminal (Python line-buffers and tqdm draws bars only
//! on a tty), so it gets a pseudo-terminal: oomguard keeps the master end,
//! reads the job's output from it for the output pane (and the output
//! log), sets its window size to the pane's, and writes the interrupt
//! character to it for Ctrl-C.
//!
//! Use, in this order:
//! 1. `open_pty(cols, rows)` with `ui::output_pane_size`;
//! 2. spawn the job with the slave as stdin, stdout and stderr, calling
//!    `make_controlling` in `pre_exec` (a new session whose controlling
//!    terminal is the pty; do not also put the child in a process group);
//! 3. drop the parent's slave, so the master reports the end once the job
//!    and everything that inherited the terminal has gone;
//! 4. `PtyMaster::new(master)` and `read` it in the loop; `resize` on
//!    every terminal resize.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use rustix::termios::{SpecialCodeIndex, Winsize};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Why the pty could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("cannot open a pseudo-terminal: {0}")]
    Open(#[source] io::Error),
    #[error("cannot set the job's terminal size to {cols}×{rows}: {source}")]
    WindowSize {
        cols: u16,
        rows: u16,
        #[source]
        source: io::Error,
    },
    #[error("cannot watch the job's terminal for output: {0}")]
    Watch(#[source] io::Error),
}

/// Opens a pseudo-terminal of `cols`×`rows` with default settings (echo,
/// canonical mode, signals, `\n` → `\r\n` on output). Returns (master,
/// slave), both close-on-exec: the job gets the slave through its stdio,
/// which clears the flag on fds 0–2.
pub fn open_pty(cols: u16, rows: u16) -> Result<(OwnedFd, OwnedFd), PtyError> {
    let (master, slave) = openpty(&winsize(cols, rows)).map_err(PtyError::Open)?;
    for fd in [&master, &slave] {
        // openpty(3) cannot set O_CLOEXEC atomically. oomguard does not
        // fork from other threads, so nothing can inherit the fds between
        // the two calls.
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)
            .map_err(|e| PtyError::Open(e.into()))?;
    }
    Ok((master, slave))
}

fn winsize(cols: u16, rows: u16) -> Winsize {
    Winsize {
        ws_row: rows.max(1),
        ws_col: cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

#[allow(unsafe_code)]
fn openpty(ws: &Winsize) -> io::Result<(OwnedFd, OwnedFd)> {
    let ws = libc::winsize {
        ws_row: ws.ws_row,
        ws_col: ws.ws_col,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let (mut master, mut slave): (libc::c_int, libc::c_int) = (-1, -1);
    // SAFETY: the two out-pointers point at live locals that openpty only
    // writes; the name and termios pointers are null, which openpty(3)
    // allows (no name is copied, the kernel's default settings are kept);
    // the winsize pointer points at a live struct it only reads.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success both fds are new, open, and owned by nothing else
    // in this process, so each may be owned by exactly one `OwnedFd`.
    Ok(unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) })
}

/// Registers `fd` with tokio's reactor for readability.
pub(crate) fn watch(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    watch_for(fd, Interest::READABLE)
}

/// Registers `fd` with tokio's reactor for `interest`.
#[allow(unsafe_code)]
pub(crate) fn watch_for(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is an open descriptor that stays open, and is the
    // same descriptor, until it is dropped; the `AsyncFd` owns it for its
    // whole life, which is what registration requires.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(io::Error::from)
}

/// Sets the window size of a pty (master or slave end); the job's
/// foreground process group gets SIGWINCH.
pub fn set_window_size(fd: impl AsFd, cols: u16, rows: u16) -> Result<(), PtyError> {
    rustix::termios::tcsetwinsize(fd, winsize(cols, rows)).map_err(|e| PtyError::WindowSize {
        cols,
        rows,
        source: e.into(),
    })
}

/// Makes `tty` the controlling terminal of the calling process, in a new
/// session of which it is the leader. Meant for `pre_exec`, between fork
/// and exec: it only makes two system calls and allocates nothing.
///
/// The process must not be a process group leader (setsid fails with
/// EPERM), so do not combine it with `Command::process_group`: the new
/// session is also a new process group whose id is the job's pid.
pub fn make_controlling(tty: impl AsFd) -> io::Result<()> {
    rustix::process::setsid()?;
    rustix::process::ioctl_tiocsctty(tty)?;
    Ok(())
}

/// The master end of the job's pty, registered with tokio.
#[derive(Debug)]
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

impl std::os::fd::AsFd for PtyMaster {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

impl PtyMaster {
    /// Takes the master end. Must be called inside a tokio runtime.
    pub fn new(master: OwnedFd) -> Result<Self, PtyError> {
        rustix::io::ioctl_fionbio(&master, true).map_err(|e| PtyError::Watch(e.into()))?;
        let fd = watch(master).map_err(PtyError::Watch)?;
        Ok(Self { fd })
    }

    /// Waits for output and reads what is there into `buf`. `Ok(0)` means
    /// the end: no process has the terminal open any more (Linux reports
    /// that as EIO). Cancel-safe: nothing is lost when the future is
    /// dropped, so it can sit in `tokio::select!`.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let res = guard
                .try_io(|fd| rustix::io::read(fd.get_ref(), &mut *buf).map_err(io::Error::from));
            match res {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                // Spurious readiness: wait again.
                Err(_would_block) => {}
            }
        }
    }

    /// Reads what is there now, without waiting: `Ok(0)` when nothing is
    /// (or the terminal has no writer left). For the job's last output,
    /// once its processes are gone and nothing more can come.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match rustix::io::read(self.fd.get_ref(), buf) {
            Ok(n) => Ok(n),
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::IO => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Sets the job's terminal size (call on every resize of the output
    /// pane); the job gets SIGWINCH.
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), PtyError> {
        set_window_size(self.fd.get_ref(), cols, rows)
    }

    /// Types the terminal's interrupt character (normally ^C). The pty then
    /// does what a terminal does: SIGINT to the job's foreground process
    /// group, or the plain byte when the job turned signals off (raw mode).
    pub fn interrupt(&self) -> io::Result<()> {
        let fd = self.fd.get_ref();
        let intr = rustix::termios::tcgetattr(fd)
            .map(|t| t.special_codes[SpecialCodeIndex::VINTR])
            .unwrap_or(0x03);
        // 0 is _POSIX_VDISABLE: no interrupt character; ^C is what the
        // user pressed.
        let intr = if intr == 0 { 0x03 } else { intr };
        let n = rustix::io::write(fd, &[intr])?;
        if n == 1 {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the job's terminal did not take the interrupt character",
            ))
        }
    }

    /// The master fd, e.g. to read the terminal's settings.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_sets_size_and_cloexec() {
        let (master, slave) = open_pty(100, 30).unwrap();
        let ws = rustix::termios::tcgetwinsize(&slave).unwrap();
        assert_eq!((ws.ws_col, ws.ws_row), (100, 30));
        set_window_size(&master, 81, 25).unwrap();
        let ws = rustix::termios::tcgetwinsize(&slave).unwrap();
        assert_eq!((ws.ws_col, ws.ws_row), (81, 25));
        for fd in [&master, &slave] {
            let flags = rustix::io::fcntl_getfd(fd).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        }
        assert!(rustix::termios::isatty(&slave));
    }

    #[test]
    fn zero_size_is_raised_to_one() {
        let (_master, slave) = open_pty(0, 0).unwrap();
        let ws = rustix::termios::tcgetwinsize(&slave).unwrap();
        assert_eq!((ws.ws_col, ws.ws_row), (1, 1));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn master_reads_what_the_slave_writes_and_ends_with_zero() {
        let (master, slave) = open_pty(80, 24).unwrap();
        let m = PtyMaster::new(master).unwrap();
        rustix::io::write(&slave, b"hi\n").unwrap();
        let mut buf = [0u8; 64];
        let n = m.read(&mut buf).await.unwrap();
        // The line discipline turned \n into \r\n.
        assert_eq!(&buf[..n], b"hi\r\n");
        drop(slave);
        assert_eq!(m.read(&mut buf).await.unwrap(), 0);
    }
}
