//! The zero-copy path of the relay: the job's bytes duplicated with
//! `tee(2)` for the scan and moved on with `splice(2)`.

use std::io;
use std::os::fd::OwnedFd;
use std::task::{Context, Poll};

use super::PIPE_SIZE;
use super::sink::Sink;

/// The zero-copy path from the job's pipe to a destination pipe: `tee`
/// duplicates what the job wrote into this private pipe (no copy: the two
/// pipes share the pages), that duplicate is read and scanned, and
/// `splice` then moves the job's own bytes on (no copy either). Nothing is
/// queued in oomguard: while the destination is full the bytes wait in the
/// job's pipe, and the job's writes block as with a direct pipe.
#[derive(Debug)]
pub(super) struct Tee {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes at the head of the job's pipe, scanned and not moved yet.
    pub(super) pending: usize,
}

impl Tee {
    pub(super) fn new() -> io::Result<Self> {
        let flags = rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK;
        let (read, write) = rustix::pipe::pipe_with(flags)?;
        let _ = rustix::pipe::fcntl_setpipe_size(&read, PIPE_SIZE);
        Ok(Self {
            read,
            write,
            pending: 0,
        })
    }

    /// Duplicates what the job's pipe holds (up to `max` bytes) into this
    /// pipe without taking it from the job's pipe: `Some(n)`, or `None` at
    /// the end.
    pub(super) fn duplicate(&self, from: &OwnedFd, max: usize) -> io::Result<Option<usize>> {
        let flags = rustix::pipe::SpliceFlags::NONBLOCK;
        loop {
            match rustix::pipe::tee(from, &self.write, max, flags) {
                Ok(0) => return Ok(None),
                Ok(n) => return Ok(Some(n)),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Moves the scanned bytes on as far as the destination takes them:
    /// how many moved, or `Pending` (and `cx` woken) while it is full. A
    /// destination that failed is marked so on the sink (the pump then
    /// treats it as a writer thread's failure).
    pub(super) fn pass_on(
        &mut self,
        sink: &Sink,
        cx: &mut Context<'_>,
        from: &OwnedFd,
    ) -> Poll<usize> {
        match sink.poll_splice(cx, from, self.pending) {
            // Nothing moved means nothing is there to move.
            Poll::Ready(Ok(0)) => {
                self.pending = 0;
                Poll::Ready(0)
            }
            Poll::Ready(Ok(n)) => {
                self.pending -= n.min(self.pending);
                Poll::Ready(n)
            }
            Poll::Ready(Err(e)) => {
                sink.fail(e, std::mem::take(&mut self.pending));
                Poll::Ready(0)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Reads the duplicate (all of it: `buf` is as long as what
    /// [`Tee::duplicate`] gave) so it can be scanned.
    pub(super) fn read_duplicate(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match rustix::io::read(&self.read, &mut buf[got..]) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(got)
    }

    /// Takes from the job's pipe what was scanned but will never be moved
    /// (the destination broke; it was counted as lost then): how many
    /// bytes went.
    pub(super) fn discard(&mut self, from: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.pending.min(buf.len());
        match rustix::io::read(from, &mut buf[..n]) {
            Ok(0) | Err(rustix::io::Errno::AGAIN) => {
                self.pending = 0;
                Ok(0)
            }
            Ok(k) => {
                self.pending -= k.min(self.pending);
                Ok(k)
            }
            Err(rustix::io::Errno::INTR) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }
}
