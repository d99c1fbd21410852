//! One channel's pump: reading what the job wrote, passing it on to its
//! destination (spliced where the destination is a pipe), copying it to
//! the output log and scanning it, within a budget per wake, with the
//! pace and the backpressure that keep the job's writes blocking exactly
//! as a pipe would.

use std::io;
use std::os::fd::OwnedFd;
use std::task::{Context, Poll};
use std::time::Instant;

use super::sink::Sink;
use super::{Channel, MAX_PENDING_EVENTS, NAP, OutputError, OutputLog, OutputScanner, PUMP_BUDGET};
use crate::job::keeper::Keeper;
use crate::vocab::forensics::torch::TorchEvent;

/// What one channel's pump works with, besides the channel.
pub(super) struct PumpIo<'a> {
    pub sinks: &'a mut [Sink],
    pub log: &'a mut Option<OutputLog>,
    pub errors: &'a mut Vec<OutputError>,
    pub buf: &'a mut [u8],
    pub keeper: &'a mut Option<Keeper>,
}

/// Reads one channel until its budget is used up, its destination is full
/// or it has nothing more: (the budget ran out, the channel ended).
pub(super) fn pump_channel(
    ch: &mut Channel,
    io: &mut PumpIo<'_>,
    cx: &mut Context<'_>,
) -> (bool, bool) {
    let PumpIo {
        sinks,
        log,
        errors,
        buf,
        keeper,
    } = io;
    let mut ended = false;
    let mut budget = PUMP_BUDGET;
    while budget > 0 {
        // Backpressure: while the destination's queue is full the
        // channel is left unread, so the job's writes block.
        if !sinks[ch.sink].ready(cx) {
            break;
        }
        match after_failure(ch, &sinks[ch.sink], errors, buf) {
            Step::Go => {}
            Step::Again(k) => {
                budget = budget.saturating_sub(k);
                continue;
            }
            Step::End { closed } => {
                if closed {
                    // Its copy of the channel would keep the job from
                    // getting EPIPE.
                    **keeper = None;
                }
                ended = true;
                break;
            }
        }
        let sink = &sinks[ch.sink];
        // Scanned bytes still in the job's pipe go first.
        if let Some(tee) = ch.tee.as_mut().filter(|t| t.pending > 0) {
            match tee.pass_on(sink, cx, ch.fd.get_ref()) {
                Poll::Ready(n) => budget = budget.saturating_sub(n),
                // Full: the job's pipe stays unread, so its writes
                // block until the reader takes more.
                Poll::Pending => break,
            }
            continue;
        }
        let mut guard = match ch.fd.poll_read_ready(cx) {
            Poll::Ready(Ok(guard)) => guard,
            Poll::Ready(Err(source)) => {
                ch.unreadable(errors, source);
                ended = true;
                break;
            }
            Poll::Pending => break,
        };
        let pty = ch.pty;
        let tee = ch.tee.as_mut().filter(|_| sink.can_splice());
        let res = guard.try_io(|fd| match &tee {
            Some(t) => t.duplicate(fd.get_ref(), buf.len()),
            None => read_some(fd.get_ref(), buf, pty),
        });
        drop(guard);
        match res {
            Ok(Ok(Some(n))) => {
                let passed_on = if let Some(t) = tee {
                    t.pending = n;
                    sink.count_read(n);
                    // Passed on before the scan, so the reader and
                    // the job get on while the duplicate is scanned.
                    if let Poll::Ready(moved) = t.pass_on(sink, cx, ch.fd.get_ref()) {
                        budget = budget.saturating_sub(moved);
                    }
                    match t.read_duplicate(&mut buf[..n]) {
                        Ok(got) => observe(&buf[..got], log, &mut ch.scanner, errors),
                        Err(source) => {
                            ch.unreadable(errors, source);
                            ended = true;
                            break;
                        }
                    }
                    t.pending == 0
                } else {
                    budget = budget.saturating_sub(n);
                    sink.push(&buf[..n]);
                    observe(&buf[..n], log, &mut ch.scanner, errors);
                    true
                };
                // Every read counts for the pace, passed on or not.
                let nap = ch.pace.nap_after(n, Instant::now());
                // A sleep, not a timer: the job's pipe would stay in
                // the reactor, and each of its writes would wake the
                // loop all the same. The rest of the loop waits at
                // most one NAP per read, less than a large read's
                // scan takes, and only while output streams.
                if nap && passed_on {
                    std::thread::sleep(NAP);
                }
            }
            // A kernel without tee for this pipe: copy from now on.
            Ok(Err(e)) if tee.is_some() && e.raw_os_error() == Some(libc::EINVAL) => {
                ch.tee = None;
            }
            Ok(Ok(None)) => {
                ch.open = false;
                ended = true;
                break;
            }
            Ok(Err(source)) => {
                ch.unreadable(errors, source);
                ended = true;
                break;
            }
            // Not readable after all; readiness was cleared, so the
            // next poll registers the waker.
            Err(_would_block) => {}
        }
    }
    (budget == 0, ended)
}

/// What a destination that failed makes of a channel's next step.
enum Step {
    /// Nothing failed (or nothing is pending): read on.
    Go,
    /// Scanned bytes were discarded: go round again.
    Again(usize),
    /// The channel ended; `closed`: as a pipe's reader left.
    End { closed: bool },
}

/// A full disk or an I/O error is not a reader that left: the job is not
/// ended for it (a SIGPIPE would kill a training run over its log's disk),
/// and the rest is read and discarded, and counted, so the run fails with
/// 74 once the job is done. A reader that left is a pipe's: the job's next
/// write fails with EPIPE (or SIGPIPE), and what it wrote that is still
/// in its pipe is lost with it (scanned bytes are counted as read already).
fn after_failure(
    ch: &mut Channel,
    sink: &Sink,
    errors: &mut Vec<OutputError>,
    buf: &mut [u8],
) -> Step {
    let failed = sink.failed();
    if failed && sink.broken() {
        let Some(tee) = ch.tee.as_mut().filter(|t| t.pending > 0) else {
            return Step::Go;
        };
        return match tee.discard(ch.fd.get_ref(), buf) {
            Ok(k) => Step::Again(k),
            Err(e) => {
                ch.unreadable(errors, e);
                Step::End { closed: false }
            }
        };
    }
    if !sink.drop_when_full && failed {
        let pending = rustix::io::ioctl_fionread(ch.fd.get_ref()).unwrap_or(0);
        let scanned = ch.tee.as_ref().map_or(0, |t| t.pending) as u64;
        sink.count_unread_loss(pending.saturating_sub(scanned));
        ch.open = false;
        ch.closed = true;
        return Step::End { closed: true };
    }
    Step::Go
}

/// One non-blocking read: `Some(n)` bytes, `None` at the end (a pty master
/// reports the end, once no process has the slave open, as EIO).
pub(super) fn read_some(fd: &OwnedFd, buf: &mut [u8], pty: bool) -> io::Result<Option<usize>> {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Ok(0) => return Ok(None),
            Ok(n) => return Ok(Some(n)),
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::IO) if pty => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Passes bytes read to the output log and the scanner.
pub(super) fn observe(
    bytes: &[u8],
    log: &mut Option<OutputLog>,
    scanner: &mut OutputScanner,
    errors: &mut Vec<OutputError>,
) {
    if let Some(log) = log
        && let Some(file) = &mut log.file
        && let Err(source) = file.write_all(bytes)
    {
        // A full disk must not cost the job its output or oomguard its
        // loop: report once, keep relaying.
        log.left_out += file.left_out();
        log.file = None;
        errors.push(OutputError::WriteLog {
            path: log.path.clone(),
            source,
        });
    }
    scanner.feed(bytes);
}

/// What [`collect`] moved.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Collected {
    /// More than a progress update.
    pub urgent: bool,
    pub progress: bool,
}

/// Moves the scanner's events to the relay's queue.
pub(super) fn collect(
    scanner: &mut OutputScanner,
    events: &mut Vec<TorchEvent>,
    dropped: &mut u64,
) -> Collected {
    *dropped += scanner.dropped_events;
    scanner.dropped_events = 0;
    let mut got = Collected::default();
    for event in scanner.take_events() {
        let progress = matches!(event, TorchEvent::Progress(_));
        got.progress |= progress;
        got.urgent |= !progress;
        keep_event(events, event, dropped);
    }
    got
}

/// Queues an event, bounded. A progress update right after another is
/// merged into it: a bar redrawn a thousand times between two reads is one
/// update, and cannot push a CUDA OOM out of the queue.
pub(super) fn keep_event(events: &mut Vec<TorchEvent>, event: TorchEvent, dropped: &mut u64) {
    if let TorchEvent::Progress(update) = event {
        if let Some(TorchEvent::Progress(last)) = events.last_mut() {
            last.merge(update);
            return;
        }
        if events.len() < MAX_PENDING_EVENTS {
            events.push(TorchEvent::Progress(update));
        } else {
            *dropped += 1;
        }
        return;
    }
    if events.len() < MAX_PENDING_EVENTS {
        events.push(event);
    } else {
        *dropped += 1;
    }
}
