//! The destinations of the job's output (oomguard's stdout and stderr):
//! a bounded queue and a writer thread each, or a pipe the job's bytes are
//! spliced into (see `Tee`).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use super::{OutputError, PIPE_SIZE, Stream, StreamStats, WRITE_CHUNK};
use crate::job::pty;

#[derive(Debug, Default)]
pub(super) struct QueueState {
    pub(super) queue: VecDeque<u8>,
    /// The writer thread holds a chunk it is writing.
    pub(super) writing: bool,
    /// The destination failed; everything from now on is discarded.
    pub(super) failed: bool,
    /// The error that made it fail, until the relay reports it.
    pub(super) error: Option<io::Error>,
    /// The destination failed with an error other than EPIPE (a full
    /// disk, an I/O error): output was lost, not declined by a reader.
    pub(super) broken: bool,
    /// The relay is gone: write what is queued, then end.
    pub(super) shutdown: bool,
    /// The relay's pump, waiting for room in the queue (or for the
    /// destination to fail).
    pub(super) waker: Option<Waker>,
    pub(super) read_bytes: u64,
    pub(super) written_bytes: u64,
    pub(super) dropped_bytes: u64,
}

#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) state: Mutex<QueueState>,
    pub(super) cond: Condvar,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A writer thread that panicked holding the lock leaves consistent
        // counters behind; keep using them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One destination (oomguard's stdout or stderr) and its writer thread.
#[derive(Debug)]
pub(super) struct Sink {
    pub(super) stream: Stream,
    pub(super) shared: Arc<Shared>,
    /// A copy of the destination, to read a terminal's window size.
    pub(super) probe: OwnedFd,
    pub(super) tty: bool,
    pub(super) max_buffered: usize,
    pub(super) drop_when_full: bool,
    /// The destination, watched for room, when it is a pipe the job's bytes
    /// can be spliced into (see [`Tee`]).
    pub(super) splice_to: Option<AsyncFd<OwnedFd>>,
}

impl Sink {
    pub(super) fn start(
        stream: Stream,
        dest: OwnedFd,
        max_buffered: usize,
        drop_when_full: bool,
    ) -> Result<Self, OutputError> {
        let probe = dup(&dest).map_err(|source| OutputError::Dup { stream, source })?;
        let tty = rustix::termios::isatty(&dest);
        let spliceable = !drop_when_full
            && rustix::fs::fstat(&dest)
                .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_fifo());
        if spliceable {
            grow_pipe(&dest);
        }
        // Watching needs the runtime's reactor (a relay is made inside
        // one); without a copy to watch (out of descriptors) the bytes
        // still go through the writer thread.
        let in_runtime = tokio::runtime::Handle::try_current().is_ok();
        let splice_to = (spliceable && in_runtime)
            .then(|| dup(&dest).ok())
            .flatten()
            .and_then(|fd| pty::watch_for(fd, tokio::io::Interest::WRITABLE).ok());
        let shared = Arc::new(Shared::default());
        let for_thread = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("oomguard-{stream}"))
            .spawn(move || write_loop(&dest, &for_thread))
            .map_err(|source| OutputError::Thread { stream, source })?;
        Ok(Self {
            stream,
            shared,
            probe,
            tty,
            max_buffered: max_buffered.max(1),
            drop_when_full,
            splice_to,
        })
    }

    /// Whether the channel feeding this sink may be read now: the queue
    /// has room, or the destination failed (then the caller decides). If
    /// not, `cx` is woken when the writer makes room or fails.
    pub(super) fn ready(&self, cx: &mut Context<'_>) -> bool {
        if self.drop_when_full {
            return true;
        }
        let mut st = self.shared.lock();
        if st.failed || st.queue.len() < self.max_buffered {
            return true;
        }
        st.waker = Some(cx.waker().clone());
        false
    }

    /// The destination failed; nothing more will be written to it.
    pub(super) fn failed(&self) -> bool {
        self.shared.lock().failed
    }

    /// The destination failed with something other than EPIPE.
    pub(super) fn broken(&self) -> bool {
        self.shared.lock().broken
    }

    /// Queues bytes for the writer; never waits for the destination. Only
    /// with `--output-drop` does a full queue lose its oldest bytes;
    /// otherwise the caller stops reading while [`Sink::ready`] says so,
    /// and the queue outgrows its bound by at most one read (or by what
    /// `finish` reads once the job is gone).
    pub(super) fn push(&self, bytes: &[u8]) {
        self.shared.lock().read_bytes += bytes.len() as u64;
        self.enqueue(bytes);
    }

    /// Queues bytes already counted as read (scanned on the splice path,
    /// then left in the job's pipe).
    pub(super) fn enqueue(&self, bytes: &[u8]) {
        let mut st = self.shared.lock();
        if st.failed {
            st.dropped_bytes += bytes.len() as u64;
            return;
        }
        if !self.drop_when_full {
            st.queue.extend(bytes);
            drop(st);
            self.shared.cond.notify_all();
            return;
        }
        // Only the newest `max_buffered` bytes can survive.
        let keep = &bytes[bytes.len().saturating_sub(self.max_buffered)..];
        st.dropped_bytes += (bytes.len() - keep.len()) as u64;
        let over = (st.queue.len() + keep.len()).saturating_sub(self.max_buffered);
        if over > 0 {
            st.queue.drain(..over);
            st.dropped_bytes += over as u64;
        }
        st.queue.extend(keep);
        drop(st);
        self.shared.cond.notify_all();
    }

    /// Whether the next bytes may bypass the queue: the destination is a
    /// pipe and nothing queued or being written would be overtaken.
    pub(super) fn can_splice(&self) -> bool {
        self.splice_to.is_some() && {
            let st = self.shared.lock();
            !st.failed && st.queue.is_empty() && !st.writing
        }
    }

    /// Moves up to `len` bytes from the head of the job's pipe into the
    /// destination, without waiting: `Pending` (and `cx` woken) while the
    /// destination is full.
    pub(super) fn poll_splice(
        &self,
        cx: &mut Context<'_>,
        from: &OwnedFd,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let Some(dest) = &self.splice_to else {
            return Poll::Ready(Err(io::ErrorKind::Unsupported.into()));
        };
        loop {
            let mut guard = match dest.poll_write_ready(cx) {
                Poll::Ready(Ok(guard)) => guard,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let flags = rustix::pipe::SpliceFlags::NONBLOCK | rustix::pipe::SpliceFlags::MOVE;
            let moved = guard.try_io(|d| {
                loop {
                    match rustix::pipe::splice(from, None, d.get_ref(), None, len, flags) {
                        Err(rustix::io::Errno::INTR) => {}
                        r => break r.map_err(io::Error::from),
                    }
                }
            });
            if let Ok(r) = moved {
                if let Ok(n) = r {
                    self.shared.lock().written_bytes += n as u64;
                }
                return Poll::Ready(r);
            }
            // Full after all; readiness was cleared, so the next poll
            // registers the waker.
        }
    }

    /// Bytes left unread in a channel closed after this destination
    /// failed: never passed on.
    pub(super) fn count_unread_loss(&self, n: u64) {
        let mut st = self.shared.lock();
        st.read_bytes += n;
        st.dropped_bytes += n;
    }

    /// Counts bytes read on the splice path.
    pub(super) fn count_read(&self, n: usize) {
        self.shared.lock().read_bytes += n as u64;
    }

    /// The destination failed on the splice path: `lost` bytes read will
    /// never reach it.
    pub(super) fn fail(&self, error: io::Error, lost: usize) {
        let mut st = self.shared.lock();
        st.failed = true;
        st.dropped_bytes += lost as u64;
        st.broken |= error.kind() != io::ErrorKind::BrokenPipe;
        st.error = Some(error);
    }

    /// Waits until everything queued was written (or the destination
    /// failed), as long as the destination keeps taking bytes: gives up
    /// after `stall` without progress. True when nothing is left.
    pub(super) fn flush(&self, stall: Duration) -> bool {
        let mut st = self.shared.lock();
        let mut written = st.written_bytes;
        let mut deadline = Instant::now() + stall;
        loop {
            if st.failed || (st.queue.is_empty() && !st.writing) {
                return true;
            }
            if st.written_bytes != written {
                written = st.written_bytes;
                deadline = Instant::now() + stall;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            st = match self.shared.cond.wait_timeout(st, left) {
                Ok((st, _)) => st,
                Err(e) => e.into_inner().0,
            };
        }
    }

    pub(super) fn stats(&self) -> StreamStats {
        let st = self.shared.lock();
        StreamStats {
            read_bytes: st.read_bytes,
            written_bytes: st.written_bytes,
            dropped_bytes: st.dropped_bytes,
            broken: st.broken,
        }
    }

    pub(super) fn take_error(&self) -> Option<io::Error> {
        self.shared.lock().error.take()
    }

    /// The destination's window size, if it is a terminal.
    pub(super) fn window_size(&self) -> Option<(u16, u16)> {
        if !self.tty {
            return None;
        }
        rustix::termios::tcgetwinsize(&self.probe)
            .ok()
            .filter(|ws| ws.ws_col > 0 && ws.ws_row > 0)
            .map(|ws| (ws.ws_col, ws.ws_row))
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // The thread writes what is still queued, then ends; it is not
        // joined, since a destination nobody reads would hold it forever.
        self.shared.lock().shutdown = true;
        self.shared.cond.notify_all();
    }
}

/// The writer thread: takes chunks off the queue and writes them with
/// ordinary blocking writes. Blocking here is the point: it keeps the wait
/// for a slow terminal or pipe off the supervision loop, without putting
/// O_NONBLOCK on a file description oomguard shares with its parent shell.
pub(super) fn write_loop(dest: &OwnedFd, shared: &Shared) {
    block_sigttou();
    let mut chunk = Vec::with_capacity(WRITE_CHUNK);
    loop {
        {
            let mut st = shared.lock();
            while st.queue.is_empty() && !st.shutdown {
                st = match shared.cond.wait(st) {
                    Ok(st) => st,
                    Err(e) => e.into_inner(),
                };
            }
            if st.queue.is_empty() {
                return;
            }
            let n = st.queue.len().min(WRITE_CHUNK);
            chunk.clear();
            let (front, back) = st.queue.as_slices();
            let from_front = front.len().min(n);
            chunk.extend_from_slice(&front[..from_front]);
            chunk.extend_from_slice(&back[..n - from_front]);
            st.queue.drain(..n);
            st.writing = true;
            if let Some(w) = st.waker.take() {
                w.wake();
            }
        }
        let result = write_all(dest, &chunk);
        let mut st = shared.lock();
        st.writing = false;
        match result {
            Ok(()) => st.written_bytes += chunk.len() as u64,
            Err((written, e)) => {
                st.written_bytes += written as u64;
                let rest = (chunk.len() - written) as u64 + st.queue.len() as u64;
                st.dropped_bytes += rest;
                st.queue.clear();
                st.failed = true;
                st.broken |= e.kind() != io::ErrorKind::BrokenPipe;
                st.error = Some(e);
                if let Some(w) = st.waker.take() {
                    w.wake();
                }
            }
        }
        let failed = st.failed;
        drop(st);
        shared.cond.notify_all();
        if failed {
            // Push discards from now on; nothing more to write.
            return;
        }
    }
}

/// Gives a destination pipe the capacity of the job's (a shell's pipe has
/// 64 KiB): the reader then takes up to 1 MiB per wake-up instead of
/// waiting for oomguard to refill 64 KiB. Only ever grows it, and only as
/// far as an unprivileged process may (the reader sees more buffering,
/// nothing else); where the kernel refuses, the pipe stays as it was.
pub(super) fn grow_pipe(dest: &OwnedFd) {
    if rustix::pipe::fcntl_getpipe_size(dest).is_ok_and(|size| size < PIPE_SIZE) {
        let _ = rustix::pipe::fcntl_setpipe_size(dest, PIPE_SIZE);
    }
}

/// Writes all of `bytes`; on failure returns how much was written.
pub(super) fn write_all(fd: &OwnedFd, mut bytes: &[u8]) -> Result<(), (usize, io::Error)> {
    let total = bytes.len();
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => {
                return Err((
                    total - bytes.len(),
                    io::Error::new(io::ErrorKind::WriteZero, "the destination took no bytes"),
                ));
            }
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            // Someone else made the description non-blocking: wait for room
            // (this thread may wait; the loop does not).
            Err(rustix::io::Errno::AGAIN) => {
                let mut fds = [rustix::event::PollFd::new(
                    fd,
                    rustix::event::PollFlags::OUT,
                )];
                let _ = rustix::event::poll(&mut fds, None);
            }
            Err(e) => return Err((total - bytes.len(), e.into())),
        }
    }
    Ok(())
}

/// Blocks SIGTTOU in the calling thread. oomguard sits in a background
/// process group while the job owns the terminal; with `stty tostop` a
/// write to the terminal from there would stop all of oomguard. The kernel
/// lets the write through when the writing thread blocks the signal.
#[allow(unsafe_code)]
pub(super) fn block_sigttou() {
    // SAFETY: the sigset is a local initialised by sigemptyset before use;
    // pthread_sigmask only changes this thread's mask and reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

pub(super) fn dup(fd: impl AsFd) -> io::Result<OwnedFd> {
    // Above 2, so a copy never lands on a standard stream that happens to
    // be closed; close-on-exec, so no hook or helper inherits it.
    rustix::io::fcntl_dupfd_cloexec(fd, 3).map_err(io::Error::from)
}
