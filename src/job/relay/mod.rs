//! The job's stdout and stderr: relayed to wherever oomguard's own stdout and
//! stderr go, unchanged, while every line is scanned for PyTorch's error
//! messages (`forensics::torch`). This module owns the channels the job
//! writes into (a pseudo-terminal where oomguard's stream is a terminal, a
//! pipe otherwise), the writer threads that pass the bytes on, the optional
//! raw copy (`--output-log`), and splitting the bytes into lines.
//!
//! Fidelity comes first: a job that had a terminal still has one (`isatty`,
//! the window size, colours and tqdm bars), and the bytes that reach the
//! user are the bytes the job wrote. So the pty does no output processing
//! (its `OPOST` is off: the real terminal already turns `\n` into `\r\n`),
//! and when oomguard's stdout and stderr are the same file, pipe or terminal
//! (`2>&1`), the job gets one channel for both, so their interleaving is the
//! job's own.
//!
//! Output is relayed as a pipe would carry it: nothing is lost, and a
//! reader that does not keep up slows the job down. When oomguard's own
//! stream is a pipe (`| tee`, CI runners, the shell's `|`), the bytes are
//! not copied through oomguard at all: `tee(2)` duplicates what the job
//! wrote into a private pipe, that duplicate is scanned, and `splice(2)`
//! moves the job's bytes into the destination; while the destination is
//! full they simply wait in the job's pipe (see [`Tee`]). Otherwise (a
//! file, a terminal, `--output-drop`) the bytes go through a bounded queue
//! to one writer thread per destination; while that queue is full the
//! channel is not read, so the job's own pipe (or pty) fills and its
//! writes block, exactly as they would with a slow reader on a direct
//! pipe. The supervision loop never waits on the user's terminal or pipe:
//! it only stops reading, and still ticks, handles signals and stops the
//! job; and bytes alone never wake it (the pump relays them and returns
//! only for what the loop must act on). A destination that is gone (EPIPE)
//! closes the job's channel, so the job gets EPIPE (or SIGPIPE) as it
//! would have. A destination that fails otherwise (a full disk, an I/O
//! error) does not end the job: the rest is read, discarded and counted,
//! and the run exits 74 if the job succeeded.
//!
//! `--output-drop` asks for the opposite trade, for a run watched on the
//! dashboard or in the log only: the job is never slowed, the oldest queued
//! bytes are dropped when the destination lags, a closed destination only
//! stops the writing, and what was dropped is counted.
//!
//! Every byte read is scanned (see [`OutputScanner`]); the scan jumps from
//! one line that can matter to the next and parses only the newest state of
//! a redrawn bar, so it costs little next to the copy.

use std::fmt;
use std::fs::OpenOptions;
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rustix::termios::{OptionalActions, OutputModes};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::job::keeper::Keeper;
use crate::job::pty::{self, PtyError};
use crate::vocab::forensics::torch::TorchEvent;

/// Bytes queued for one destination before its channel is no longer read
/// (or, with `--output-drop`, before the oldest are dropped).
pub const DEFAULT_MAX_BUFFERED: usize = 1 << 20;

/// Bytes one `pump` call reads from one channel before it returns, so a job
/// that prints without pause cannot starve the rest of the loop.
const PUMP_BUDGET: usize = 256 * 1024;

/// Bytes `finish` reads from one channel at most: it must not spin when
/// something outside the tree keeps writing.
const FINISH_BUDGET: usize = 16 << 20;

/// Bytes read per system call: large, so a fast job costs few reads and
/// few wake-ups of the writer.
const READ_CHUNK: usize = 1 << 20;

/// Bytes the writer thread takes off its queue per write.
const WRITE_CHUNK: usize = 1 << 20;

/// The size asked for the job's pipes (the default 64 KiB means a system
/// call per 64 KiB); the kernel may give less, which only costs speed.
const PIPE_SIZE: usize = 1 << 20;

/// How long a busy pipe is left alone after a small read, so the job's
/// next writes are read in one piece: a job writing 8 KiB at a time would
/// otherwise wake oomguard (and be woken back) once per write. The job
/// does not wait for it unless it fills its pipe in that time, and then
/// the read is large and no nap follows.
const NAP: Duration = Duration::from_micros(100);

/// A read counts as part of a busy stream when the channel's previous read
/// came less than this before it; a job printing a line now and then is
/// never napped on.
const BUSY_WITHIN: Duration = Duration::from_millis(1);

/// How often [`OutputRelay::pump`] returns for progress alone.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Events kept until [`OutputRelay::take_events`]; more are counted and
/// dropped (a caller that never takes them must not grow without bound).
const MAX_PENDING_EVENTS: usize = 256;

/// Window size given to a pty when the real terminal's cannot be read.
const FALLBACK_SIZE: (u16, u16) = (80, 24);

/// How often the real terminal's size is read while the job has a pty.
pub const DEFAULT_SIZE_POLL: Duration = Duration::from_millis(250);

/// One of the job's two output streams, or the destination of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// The stream's conventional name.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the relay could not be set up, or what went wrong while it ran.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot open the output log {}: {source}", path.display())]
    OpenLog {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the output log {} (no more output is kept there): {source}", path.display())]
    WriteLog {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot give the job a terminal for its {stream}: {source}")]
    Pty {
        stream: Stream,
        #[source]
        source: PtyError,
    },
    #[error("cannot turn off output processing on the job's terminal: {0}")]
    PtySettings(#[source] io::Error),
    #[error("cannot create a pipe for the job's {stream}: {source}")]
    Pipe {
        stream: Stream,
        #[source]
        source: io::Error,
    },
    #[error("cannot watch the job's {stream} for output: {source}")]
    Watch {
        stream: Stream,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the job's {stream}: {source}")]
    Read {
        stream: Stream,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the thread that writes the job's {stream}: {source}")]
    Thread {
        stream: Stream,
        #[source]
        source: io::Error,
    },
    #[error("cannot pass on the job's {stream} (the rest of it is discarded): {source}")]
    Write {
        stream: Stream,
        #[source]
        source: io::Error,
    },
    #[error("cannot duplicate the job's {stream} descriptor: {source}")]
    Dup {
        stream: Stream,
        #[source]
        source: io::Error,
    },
    #[error("the job's output channels were closed by after_spawn; call next_attempt for new ones")]
    AlreadySpawned,
    #[error("the previous attempt's output is still open; call finish before next_attempt")]
    StillOpen,
    #[error(
        "cannot start the output keeper ({0}): if oomguard dies, the job's next write to its output fails"
    )]
    Keeper(#[source] io::Error),
    #[error("cannot handle SIGWINCH to follow the terminal's size: {0}")]
    Winch(#[source] io::Error),
}

/// How the relay is set up.
#[derive(Debug, Default)]
pub struct RelayOptions {
    /// `--output-log FILE`: every byte of both streams is appended here, raw.
    pub output_log: Option<PathBuf>,
    /// `--output-log-max`: the most of it kept on disk (the newest).
    pub output_log_max: Option<u64>,
    /// Where the job's stdout goes; `None` is oomguard's own stdout. Tests
    /// pass a pipe or a pty here.
    pub stdout: Option<OwnedFd>,
    /// Where the job's stderr goes; `None` is oomguard's own stderr.
    pub stderr: Option<OwnedFd>,
    /// Bytes queued per destination before the channel is no longer read
    /// (or the oldest are dropped); `None` is [`DEFAULT_MAX_BUFFERED`].
    pub max_buffered_bytes: Option<usize>,
    /// `--output-drop`: never slow the job down; drop the oldest queued
    /// bytes when a destination lags, and keep draining the job when a
    /// destination is gone.
    pub drop_when_full: bool,
    /// How often the real terminal's size is read while the job has a pty;
    /// `None` is [`DEFAULT_SIZE_POLL`]. (SIGWINCH alone is not enough: the
    /// terminal sends it to its foreground process group, which is the
    /// job's, not oomguard's.)
    pub size_poll: Option<Duration>,
}

/// What the job gets as fds 1 and 2 (`Command::stdout` / `stderr`).
#[derive(Debug)]
pub struct JobStdio {
    pub stdout: Stdio,
    pub stderr: Stdio,
}

/// Why [`OutputRelay::pump`] returned. Bytes alone are no reason: they
/// are relayed inside the pump, and a wake-up of the whole loop per read
/// would cost more than the relaying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pumped {
    /// The output said something that cannot wait for the next tick (a
    /// CUDA OOM, a dead worker, torchrun's failures); progress updates wait
    /// in [`OutputRelay::take_events`] for whoever takes them next.
    Events,
    /// The terminal was resized and the job's pty now has its size. The
    /// caller forwards SIGWINCH to the job: resizing a pty that is not the
    /// job's controlling terminal signals nobody.
    Resized,
    /// The last open channel reached its end (every writer is gone). Bytes
    /// read by the same call were relayed too.
    Closed,
}

/// Counters of one destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Bytes read from the job for this destination.
    pub read_bytes: u64,
    /// Bytes the destination accepted.
    pub written_bytes: u64,
    /// Bytes never written: dropped from a full queue (`--output-drop`),
    /// or discarded after the destination failed.
    pub dropped_bytes: u64,
    /// The destination failed with an error other than EPIPE (a full
    /// disk, an I/O error), not a reader that went away.
    pub broken: bool,
}

impl StreamStats {
    /// Bytes read from the job that never reached the destination: those
    /// dropped, and those still queued when oomguard stopped waiting for
    /// a reader that took nothing.
    pub fn lost_bytes(&self) -> u64 {
        self.read_bytes
            .saturating_sub(self.written_bytes)
            .max(self.dropped_bytes)
    }
}

/// Counters of the whole relay, by destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    pub stdout: StreamStats,
    pub stderr: StreamStats,
    /// Events dropped because nobody took them.
    pub dropped_events: u64,
    /// Bytes `--output-log-max` left out of the output log.
    pub output_log_left_out: u64,
}

pub mod output_log;
mod pump;
mod scan;
mod sink;
mod tee;

use pump::{Collected, PumpIo, collect, observe, pump_channel, read_some};
pub use scan::OutputScanner;
use sink::{Sink, dup};
use tee::Tee;

// ---------------------------------------------------------------------------
// Channels: what the job writes into.

/// One channel of one attempt: a pty master or a pipe's read end.
#[derive(Debug)]
struct Channel {
    /// Which destination it feeds (index into `sinks`).
    sink: usize,
    /// The streams it carries, for messages.
    stream: Stream,
    pty: bool,
    /// The window size last given to the pty.
    size: (u16, u16),
    fd: AsyncFd<OwnedFd>,
    /// The zero-copy path, when the destination is a pipe.
    tee: Option<Tee>,
    scanner: OutputScanner,
    open: bool,
    /// The destination failed: close this end so the job sees EPIPE.
    closed: bool,
    pace: Pace,
}

impl Channel {
    /// The channel cannot be read: report why, and read it no more.
    fn unreadable(&mut self, errors: &mut Vec<OutputError>, source: io::Error) {
        errors.push(OutputError::Read {
            stream: self.stream,
            source,
        });
        self.open = false;
    }
}

/// When a channel naps before its next read (see [`NAP`]).
#[derive(Debug)]
struct Pace {
    /// Reads shorter than this on a busy stream are followed by a nap: a
    /// quarter of the job's pipe, so a nap never fills it at the rates
    /// that nap (0, never, for a pty: its small buffer would make the job
    /// wait).
    nap_below: usize,
    /// When the channel was last read.
    last_read: Option<Instant>,
}

impl Pace {
    fn new(nap_below: usize) -> Self {
        Self {
            nap_below,
            last_read: None,
        }
    }

    /// Whether to nap after reading `n` bytes at `now`: the read was small
    /// and came close after the previous one.
    fn nap_after(&mut self, n: usize, now: Instant) -> bool {
        let busy = self
            .last_read
            .is_some_and(|t| now.saturating_duration_since(t) < BUSY_WITHIN);
        self.last_read = Some(now);
        busy && n < self.nap_below
    }
}

/// The raw copy of the output.
#[derive(Debug)]
struct OutputLog {
    path: PathBuf,
    /// `None` once a write failed (said once; the job's output goes on).
    file: Option<output_log::OutputLogFile>,
    /// What the cap left out, kept when the file is given up.
    left_out: u64,
}

/// Relays the job's stdout and stderr to oomguard's own while scanning
/// them. See the module documentation; use, per attempt:
///
/// 1. [`OutputRelay::new`] (first attempt, inside the tokio runtime) or
///    [`OutputRelay::next_attempt`] (later ones) → a [`JobStdio`] for the
///    job's `Command`;
/// 2. spawn the job, drop the `Command`, then call
///    [`OutputRelay::after_spawn`]: the relay's own copies of the job's
///    ends must be closed, or the end of the output is never seen;
/// 3. [`OutputRelay::pump`] as one arm of the loop's `tokio::select!`,
///    then [`OutputRelay::take_events`];
/// 4. once the job's processes are gone, [`OutputRelay::finish`] and a
///    last [`OutputRelay::take_events`];
/// 5. before oomguard prints its own summary, [`OutputRelay::flush`].
#[derive(Debug)]
pub struct OutputRelay {
    /// Index 0 feeds oomguard's stdout, 1 its stderr.
    sinks: Vec<Sink>,
    /// For stdout and stderr, the sink it goes to.
    routes: [usize; 2],
    channels: Vec<Channel>,
    /// The relay's copies of the job's ends (pty slaves, pipe write ends)
    /// and, for stdout and stderr, which one the job gets.
    child_ends: Vec<OwnedFd>,
    job_ends: [usize; 2],
    log: Option<OutputLog>,
    winch: Option<Signal>,
    size_poll: Duration,
    size_timer: Option<tokio::time::Interval>,
    events: Vec<TorchEvent>,
    dropped_events: u64,
    /// When events were last handed over with progress among them.
    progress_handed: Option<Instant>,
    errors: Vec<OutputError>,
    buf: Vec<u8>,
    /// Holds this attempt's channels in case oomguard dies (see
    /// `crate::job::keeper`); killed when they close.
    keeper: Option<Keeper>,
}

impl OutputRelay {
    /// Sets up the destinations, the output log and the first attempt's
    /// channels. Must be called inside the tokio runtime, before the job is
    /// spawned; the returned [`JobStdio`] goes to its `Command`.
    pub fn new(opts: RelayOptions) -> Result<(Self, JobStdio), OutputError> {
        let max = opts.max_buffered_bytes.unwrap_or(DEFAULT_MAX_BUFFERED);
        let log = match opts.output_log {
            Some(path) => {
                let file = output_log::OutputLogFile::open(&path, opts.output_log_max).map_err(
                    |source| OutputError::OpenLog {
                        path: path.clone(),
                        source,
                    },
                )?;
                Some(OutputLog {
                    path,
                    file: Some(file),
                    left_out: 0,
                })
            }
            None => None,
        };
        let out = destination(opts.stdout, Stream::Stdout, io::stdout().as_fd())?;
        let err = destination(opts.stderr, Stream::Stderr, io::stderr().as_fd())?;
        // Same file, pipe or terminal (2>&1): one channel, so the job's own
        // interleaving of the two streams is what arrives.
        let shared = identity(&out).is_some_and(|id| Some(id) == identity(&err));
        let drop = opts.drop_when_full;
        let mut sinks = vec![Sink::start(Stream::Stdout, out, max, drop)?];
        let routes = if shared {
            [0, 0]
        } else {
            sinks.push(Sink::start(Stream::Stderr, err, max, drop)?);
            [0, 1]
        };
        let mut relay = Self {
            sinks,
            routes,
            channels: Vec::new(),
            child_ends: Vec::new(),
            job_ends: [0, 0],
            log,
            winch: None,
            size_poll: opts.size_poll.unwrap_or(DEFAULT_SIZE_POLL),
            size_timer: None,
            events: Vec::new(),
            dropped_events: 0,
            progress_handed: None,
            errors: Vec::new(),
            buf: vec![0; READ_CHUNK],
            keeper: None,
        };
        let stdio = relay.open_channels()?;
        Ok((relay, stdio))
    }

    /// New channels for the next attempt (the destinations, the output log
    /// and the writer threads stay). Call after [`OutputRelay::finish`]
    /// (or once [`OutputRelay::is_closed`]); the previous attempt's last
    /// events stay for [`OutputRelay::take_events`].
    pub fn next_attempt(&mut self) -> Result<JobStdio, OutputError> {
        if !self.is_closed() {
            return Err(OutputError::StillOpen);
        }
        self.finish();
        self.open_channels()
    }

    /// Another [`JobStdio`] for the same channels, for a spawn that is
    /// retried (the first one consumed its `Stdio`). Only before
    /// [`OutputRelay::after_spawn`].
    pub fn job_stdio(&self) -> Result<JobStdio, OutputError> {
        let get = |stream: Stream| -> Result<Stdio, OutputError> {
            let idx = self.job_ends[stream as usize];
            let fd = self
                .child_ends
                .get(idx)
                .ok_or(OutputError::AlreadySpawned)?;
            let copy = dup(fd).map_err(|source| OutputError::Dup { stream, source })?;
            Ok(Stdio::from(copy))
        };
        Ok(JobStdio {
            stdout: get(Stream::Stdout)?,
            stderr: get(Stream::Stderr)?,
        })
    }

    /// Closes the relay's copies of the job's ends. Call right after the
    /// spawn, once the `Command` (which holds the `Stdio`s) is dropped:
    /// while any copy outside the job stays open, the channel never ends.
    pub fn after_spawn(&mut self) {
        self.child_ends.clear();
    }

    /// Waits for output (or a terminal resize) and relays everything that
    /// is available now, up to a budget per channel. Cancel-safe: bytes are
    /// only read after the wait, inside one poll, so dropping the future
    /// loses nothing. Once every channel has ended it waits forever, so it
    /// can stay in a `select!`.
    pub async fn pump(&mut self) -> Pumped {
        loop {
            match poll_fn(|cx| self.poll_pump(cx)).await {
                Some(p) => return p,
                // A job printing without pause: let timers and signals in.
                None => tokio::task::yield_now().await,
            }
        }
    }

    /// Relays what is readable now without waiting: one pass of [`Self::pump`]
    /// for a caller about to act on memory, so that output the job wrote
    /// before it crossed a level (the step it started) is read before the
    /// decision, whichever of the two the loop happened to see first.
    pub fn pump_now(&mut self) -> Option<Pumped> {
        match self.poll_pump(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(p) => p,
            Poll::Pending => None,
        }
    }

    /// Events recognised since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<TorchEvent> {
        std::mem::take(&mut self.events)
    }

    /// Problems met while relaying (the output log failed, a destination
    /// failed, a channel could not be read), each reported once. A
    /// destination that fails with `BrokenPipe` is normal under `| head`.
    pub fn take_errors(&mut self) -> Vec<OutputError> {
        for sink in &self.sinks {
            if let Some(source) = sink.take_error() {
                self.errors.push(OutputError::Write {
                    stream: sink.stream,
                    source,
                });
            }
        }
        std::mem::take(&mut self.errors)
    }

    /// The attempt's output is over (call once the job's processes are
    /// gone): reads what is left without waiting, scans the unfinished last
    /// lines, flushes the scanners (their events go to
    /// [`OutputRelay::take_events`]) and closes the channels. Anything that
    /// still holds a channel open (a process that escaped the tree) then
    /// writes into a closed pipe or pty.
    pub fn finish(&mut self) {
        let Self {
            channels,
            sinks,
            log,
            events,
            dropped_events,
            errors,
            buf,
            ..
        } = self;
        for ch in channels.iter_mut().filter(|c| c.open) {
            let sink = &sinks[ch.sink];
            // What the splice path scanned and left in the job's pipe comes
            // first; it is queued, not scanned again.
            let mut scanned = ch.tee.as_ref().map_or(0, |t| t.pending);
            let mut budget = FINISH_BUDGET;
            while budget > 0 {
                match read_some(ch.fd.get_ref(), buf, ch.pty) {
                    Ok(Some(n)) => {
                        budget = budget.saturating_sub(n);
                        let (old, new) = buf[..n].split_at(scanned.min(n));
                        scanned -= old.len();
                        sink.enqueue(old);
                        sink.push(new);
                        observe(new, log, &mut ch.scanner, errors);
                    }
                    Ok(None) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(source) => {
                        errors.push(OutputError::Read {
                            stream: ch.stream,
                            source,
                        });
                        break;
                    }
                }
            }
            ch.open = false;
        }
        for ch in channels.iter_mut() {
            ch.scanner.finish();
            collect(&mut ch.scanner, events, dropped_events);
        }
        channels.clear();
        self.child_ends.clear();
        self.keeper = None;
    }

    /// The output keeper's pid: oomguard's child, not the job's.
    pub fn keeper_pid(&self) -> Option<u32> {
        self.keeper.as_ref().map(Keeper::pid)
    }

    /// True once every channel has ended (every writer is gone), or after
    /// [`OutputRelay::finish`].
    pub fn is_closed(&self) -> bool {
        self.channels.iter().all(|c| !c.open)
    }

    /// Waits until everything queued has been written to the
    /// destinations, as long as they keep taking bytes; gives up on one
    /// that takes nothing for `stall` (what is left counts as dropped in
    /// [`OutputRelay::stats`] only if it was never written). Call before
    /// oomguard prints its own lines after the job's, so they come last.
    /// True when nothing is left.
    pub fn flush(&self, stall: Duration) -> bool {
        self.sinks.iter().all(|s| s.flush(stall))
    }

    /// Bytes every destination has accepted so far: whether a slow
    /// reader still makes progress.
    pub fn written_bytes(&self) -> u64 {
        self.sinks
            .iter()
            .map(|s| s.shared.lock().written_bytes)
            .sum()
    }

    /// Everything read has been written, or could not be (a destination
    /// failed).
    pub fn flushed(&self) -> bool {
        self.sinks.iter().all(|s| {
            let st = s.shared.lock();
            st.failed || (st.queue.is_empty() && !st.writing)
        })
    }

    /// Counters by destination.
    pub fn stats(&self) -> RelayStats {
        let mut stats = RelayStats {
            dropped_events: self.dropped_events,
            output_log_left_out: self.log.as_ref().map_or(0, |l| {
                l.left_out
                    + l.file
                        .as_ref()
                        .map_or(0, output_log::OutputLogFile::left_out)
            }),
            ..Default::default()
        };
        for sink in &self.sinks {
            let s = sink.stats();
            match sink.stream {
                Stream::Stdout => stats.stdout = s,
                Stream::Stderr => stats.stderr = s,
            }
        }
        stats
    }

    /// Whether the job's `stream` reaches its destination by `splice`, not
    /// copied through oomguard (the destination is a pipe).
    pub fn splices(&self, stream: Stream) -> bool {
        self.sinks[self.routes[stream as usize]].splice_to.is_some()
    }

    /// Whether the job's `stream` is a pty (oomguard's was a terminal).
    pub fn is_pty(&self, stream: Stream) -> bool {
        let sink = self.routes[stream as usize];
        self.channels.iter().any(|c| c.sink == sink && c.pty)
    }

    /// Gives every pty of the job the size of the terminal it stands for,
    /// if that changed; true when one did. [`OutputRelay::pump`] does this
    /// on SIGWINCH and every `size_poll`.
    pub fn follow_window_size(&mut self) -> bool {
        let mut changed = false;
        for ch in self.channels.iter_mut().filter(|c| c.pty && c.open) {
            if let Some(size) = self.sinks[ch.sink].window_size()
                && size != ch.size
                // The job may be gone already; then nothing needs the size.
                && pty::set_window_size(ch.fd.get_ref(), size.0, size.1).is_ok()
            {
                ch.size = size;
                changed = true;
            }
        }
        changed
    }

    /// Creates this attempt's channels: one per destination.
    fn open_channels(&mut self) -> Result<JobStdio, OutputError> {
        let mut ends = Vec::new();
        for (idx, sink) in self.sinks.iter().enumerate() {
            // The channel is named by the first stream routed to it.
            let stream = if self.routes[0] == idx {
                Stream::Stdout
            } else {
                Stream::Stderr
            };
            let size = sink.window_size().unwrap_or(FALLBACK_SIZE);
            // No /dev/pts (a minimal container or initramfs): a pipe still
            // carries every byte; only the job's isatty() changes.
            let tty_pair = if sink.tty {
                match pty::open_pty(size.0, size.1) {
                    Ok(pair) => Some(pair),
                    Err(source) => {
                        eprintln!(
                            "oomguard: {}; passing it on through a pipe",
                            OutputError::Pty { stream, source }
                        );
                        None
                    }
                }
            } else {
                None
            };
            let is_pty = tty_pair.is_some();
            // A pty never naps (see `Pace`); a pipe naps on reads under a
            // quarter of what the kernel gave it, not of what was asked.
            let (read, write, nap_below) =
                if let Some((master, slave)) = tty_pair {
                    raw_output(&slave)?;
                    (master, slave, 0)
                } else {
                    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                        .map_err(|e| OutputError::Pipe {
                            stream,
                            source: e.into(),
                        })?;
                    let size = rustix::pipe::fcntl_setpipe_size(&r, PIPE_SIZE)
                        .or_else(|_| rustix::pipe::fcntl_getpipe_size(&r))
                        .unwrap_or(0);
                    (r, w, size / 4)
                };
            rustix::io::ioctl_fionbio(&read, true).map_err(|e| OutputError::Watch {
                stream,
                source: e.into(),
            })?;
            let fd = pty::watch(read).map_err(|source| OutputError::Watch { stream, source })?;
            // Out of descriptors for the private pipe: the bytes are copied.
            let tee = (!is_pty && sink.splice_to.is_some())
                .then(|| Tee::new().ok())
                .flatten();
            self.channels.push(Channel {
                sink: idx,
                stream,
                pty: is_pty,
                size,
                fd,
                tee,
                scanner: OutputScanner::new(),
                open: true,
                closed: false,
                pace: Pace::new(nap_below),
            });
            ends.push(write);
        }
        self.child_ends = ends;
        // Sinks and channels are one to one, so a stream's channel end has
        // the index of its sink.
        self.job_ends = self.routes;
        let pairs: Vec<_> = self
            .channels
            .iter()
            .map(|c| (c.fd.get_ref().as_fd(), self.sinks[c.sink].probe.as_fd()))
            .collect();
        self.keeper = match Keeper::spawn(&pairs) {
            Ok(k) => Some(k),
            Err(e) => {
                self.errors.push(OutputError::Keeper(e));
                None
            }
        };
        if self.winch.is_none() && self.channels.iter().any(|c| c.pty) {
            self.winch = Some(signal(SignalKind::window_change()).map_err(OutputError::Winch)?);
            let mut timer = tokio::time::interval(self.size_poll.max(Duration::from_millis(10)));
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            self.size_timer = Some(timer);
        }
        self.job_stdio()
    }

    /// `Ready(None)` when a channel used up its budget and more is waiting.
    /// Whether the terminal's size changed (SIGWINCH, or the size poll for
    /// a terminal that sends none) and the job's pty took the new one.
    fn poll_resize(&mut self, cx: &mut Context<'_>) -> bool {
        let pty_open = self.channels.iter().any(|c| c.pty && c.open);
        let mut check_size = false;
        if pty_open {
            if let Some(w) = self.winch.as_mut() {
                while let Poll::Ready(Some(())) = w.poll_recv(cx) {
                    check_size = true;
                }
            }
            if let Some(t) = self.size_timer.as_mut() {
                while t.poll_tick(cx).is_ready() {
                    check_size = true;
                }
            }
        }
        check_size && self.follow_window_size()
    }

    fn poll_pump(&mut self, cx: &mut Context<'_>) -> Poll<Option<Pumped>> {
        if self.is_closed() {
            return Poll::Pending;
        }
        // The resize first: a job that prints without pause must not keep
        // its terminal at the old size.
        let resized = self.poll_resize(cx);
        let Self {
            channels,
            sinks,
            log,
            events,
            dropped_events,
            errors,
            buf,
            keeper,
            ..
        } = self;
        let mut got = Collected::default();
        let mut exhausted = false;
        let mut ended = false;
        for ch in channels.iter_mut().filter(|c| c.open) {
            let mut io = PumpIo {
                sinks,
                log,
                errors,
                buf,
                keeper,
            };
            let (budget_used_up, channel_ended) = pump_channel(ch, &mut io, cx);
            exhausted |= budget_used_up;
            ended |= channel_ended;
            if !ch.open {
                // Nothing more can come: an unfinished last line and a held
                // message are complete now, not only at `finish`.
                ch.scanner.finish();
            }
            let c = collect(&mut ch.scanner, events, dropped_events);
            got.urgent |= c.urgent;
            got.progress |= c.progress;
        }
        // Dropping a channel closes oomguard's end of it.
        channels.retain(|c| !c.closed);
        if ended && channels.iter().all(|c| !c.open) {
            return Poll::Ready(Some(Pumped::Closed));
        }
        if resized {
            return Poll::Ready(Some(Pumped::Resized));
        }
        // Progress is handed over at most every PROGRESS_EVERY (and taken
        // at every tick): often enough that its times are right, rarely
        // enough that a bar redrawn per read costs no loop turn per read.
        let progress_due = got.progress
            && self
                .progress_handed
                .is_none_or(|t| t.elapsed() >= PROGRESS_EVERY);
        if got.urgent || progress_due {
            self.progress_handed = Some(Instant::now());
            return Poll::Ready(Some(Pumped::Events));
        }
        if exhausted {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// The destination for `stream`: the given fd, or a copy of oomguard's own.
/// When oomguard's own is closed, the job's output goes nowhere, as it
/// would have without oomguard.
fn destination(
    given: Option<OwnedFd>,
    stream: Stream,
    own: std::os::fd::BorrowedFd<'_>,
) -> Result<OwnedFd, OutputError> {
    if let Some(fd) = given {
        return Ok(fd);
    }
    match dup(own) {
        Ok(fd) => Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|source| OutputError::Dup { stream, source }),
        Err(source) => Err(OutputError::Dup { stream, source }),
    }
}

/// What a destination is (st_dev, st_ino): two destinations that are the
/// same file, pipe or terminal share one channel.
fn identity(fd: &OwnedFd) -> Option<(u64, u64)> {
    rustix::fs::fstat(fd).ok().map(|st| (st.st_dev, st.st_ino))
}

/// Turns off output processing on the job's pty: what the job writes is
/// what the master reads. The real terminal does its own `\n` → `\r\n`;
/// doing it here as well would send `\r\r\n`.
fn raw_output(slave: &OwnedFd) -> Result<(), OutputError> {
    let mut t =
        rustix::termios::tcgetattr(slave).map_err(|e| OutputError::PtySettings(e.into()))?;
    t.output_modes
        .remove(OutputModes::OPOST | OutputModes::ONLCR);
    rustix::termios::tcsetattr(slave, OptionalActions::Now, &t)
        .map_err(|e| OutputError::PtySettings(e.into()))
}

#[cfg(test)]
mod tests {
    use super::sink::grow_pipe;
    use super::*;
    use crate::vocab::forensics::progress;
    use crate::vocab::forensics::torch::{CudaOom, MAX_LINE_BYTES, WorkerDied};

    fn lines_of(chunks: &[&[u8]]) -> Vec<String> {
        // A scanner only exposes events; to see the lines themselves, run
        // them past a scanner that recognises worker deaths, one per line.
        let mut s = OutputScanner::new();
        for c in chunks {
            s.feed(c);
        }
        s.finish();
        s.take_events()
            .into_iter()
            .filter_map(|e| match e {
                TorchEvent::WorkerDied(WorkerDied { message, .. }) => Some(message),
                _ => None,
            })
            .collect()
    }

    fn died(pid: u32) -> String {
        format!("DataLoader worker (pid {pid}) is killed by signal: Killed.")
    }

    #[test]
    fn lightnings_banner_names_the_framework_once() {
        let frameworks = |chunks: &[&[u8]]| {
            let mut s = OutputScanner::new();
            for c in chunks {
                s.feed(c);
            }
            s.finish();
            s.take_events()
                .into_iter()
                .filter(|e| matches!(e, TorchEvent::Framework(_)))
                .count()
        };
        // Whole lines in one read (skipped between triggers), a line split
        // across reads, a launcher's prefix, and twice (said once).
        let banner = b"noise\nGPU available: False, used: False\nTPU available: False\n";
        assert_eq!(frameworks(&[banner]), 1);
        assert_eq!(
            frameworks(&[b"GPU avail", b"able: True (cuda), used: True\n"]),
            1
        );
        assert_eq!(
            frameworks(&[b"[rank0]: GPU available: False, used: False\n"]),
            1
        );
        assert_eq!(frameworks(&[banner, banner]), 1);
        // Not Lightning's sentence.
        assert_eq!(frameworks(&[b"GPU available: 2 devices\n"]), 0);
        assert_eq!(frameworks(&[b"x\n# GPU available: no\n"]), 0);
    }

    #[test]
    fn lines_split_on_newline_and_carriage_return() {
        let text = format!("{}\n{}\r{}\r\n{}", died(1), died(2), died(3), died(4));
        let got = lines_of(&[text.as_bytes()]);
        assert_eq!(got, vec![died(1), died(2), died(3), died(4)]);
    }

    #[test]
    fn a_line_split_across_reads_is_one_line() {
        let text = format!("{}\n", died(77));
        let bytes = text.as_bytes();
        let chunks: Vec<&[u8]> = bytes.chunks(3).collect();
        assert_eq!(lines_of(&chunks), vec![died(77)]);
    }

    #[test]
    fn crlf_and_empty_cr_segments_make_no_empty_lines() {
        // A multi-line OOM message with \r\n endings must stay one message:
        // an empty line in between would end it early.
        let text = "RuntimeError: CUDA out of memory.\r\n\r\rTried to allocate 2.00 MiB (GPU 0; 3.79 GiB total capacity; 654.97 MiB already allocated; 6.00 MiB free; 666.00 MiB reserved in total by PyTorch)\r\n";
        let mut s = OutputScanner::new();
        s.feed(text.as_bytes());
        s.finish();
        let events = s.take_events();
        assert_eq!(events.len(), 1, "{events:?}");
        let TorchEvent::CudaOom(CudaOom {
            tried_bytes,
            reserved_bytes,
            ..
        }) = &events[0]
        else {
            panic!("{events:?}");
        };
        assert_eq!(*tried_bytes, Some(2 << 20));
        assert_eq!(*reserved_bytes, Some(666 << 20));
    }

    #[test]
    fn progress_bar_states_are_lines() {
        let text = format!(" 10%|#   |\r 20%|##  |\r{}\n", died(5));
        assert_eq!(lines_of(&[text.as_bytes()]), vec![died(5)]);
    }

    #[test]
    fn long_lines_are_cut_and_memory_stays_bounded() {
        let mut s = OutputScanner::new();
        s.feed(died(9).as_bytes());
        for _ in 0..100 {
            s.feed(&[b'x'; 100_000]);
            assert!(s.line.len() <= MAX_LINE_BYTES);
        }
        s.feed(b"\n");
        s.feed(format!("{}\n", died(10)).as_bytes());
        s.finish();
        let got: Vec<_> = s.take_events();
        // The cut line still starts with the message.
        assert_eq!(got.len(), 2, "{got:?}");
    }

    #[test]
    fn lines_amid_many_skipped_ones_are_still_seen() {
        let filler = "y\n".repeat(10_000);
        let text = format!("{filler}{}\n{filler}", died(21));
        let mut s = OutputScanner::new();
        s.feed(b"partial ");
        s.feed(text.as_bytes());
        s.feed(format!("{}\r{filler}", died(22)).as_bytes());
        s.finish();
        assert_eq!(s.take_events().len(), 2);
    }

    /// The merged progress of everything fed, and the other events.
    fn scanned(chunks: &[&[u8]]) -> (Option<progress::ProgressUpdate>, Vec<TorchEvent>) {
        let mut s = OutputScanner::new();
        let mut events = Vec::new();
        for c in chunks {
            s.feed(c);
            events.extend(s.take_events());
        }
        s.finish();
        events.extend(s.take_events());
        let mut merged: Option<progress::ProgressUpdate> = None;
        let mut other = Vec::new();
        for e in events {
            match e {
                TorchEvent::Progress(u) => match &mut merged {
                    Some(m) => m.merge(u),
                    None => merged = Some(u),
                },
                e => other.push(e),
            }
        }
        (merged, other)
    }

    /// Lines of every format the progress parser reads, as they appear amid
    /// other output: the prefilter that skips whole lines must let each
    /// through.
    const PROGRESS_LINES: &[&str] = &[
        " 45%|████▌     | 580/1288 [01:02<01:15,  9.41it/s]",
        "train:  45%|####5     | 580/1288 [01:02<01:15,  1.25s/it, loss=0.31]",
        "Epoch 3:  45%|████▌     | 580/1288 [01:02<01:15,  9.41it/s, v_num=0]",
        "Validation DataLoader 0:  30%|███       | 120/400 [00:03<00:07, 38.1it/s]",
        "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 20.1it/s]",
        "Testing DataLoader 0:  10%|█         | 4/40 [00:00<00:03, 11.0it/s]",
        "Predicting DataLoader 0:  50%|█████     | 5/10 [00:00<00:00, 11.0it/s]",
        "Validation: |          | 0/? [00:00<?, ?it/s]",
        "Testing: |          | 0/? [00:00<?, ?it/s]",
        "Epoch 2/9  ━━━━━━━━━━━━━━━━━━ 580/1288 0:01:02 • 0:01:15 9.41it/s v_num: 0",
        "{'loss': 2.31, 'learning_rate': 4.9e-05, 'epoch': 1.2}",
        "580/1288 [=============>................] - ETA: 1:15 - loss: 0.1234",
        " 580/1288 ━━━━━━━━━━━━━━━━━━━━ 1:15 58ms/step - loss: 0.1234",
        "Epoch 3/10",
        "step 580/10000 loss=2.31",
        "STEP 580 OF 10000",
        "Epoch [3/10], Step [580/1288], Loss: 0.1234",
        "iter 580",
        "ITERATION 580",
        "Epoch: [3][ 580/1288]\tTime  0.251 ( 0.262)",
        "Train Epoch: 1 [640/60000 (1%)]\tLoss: 2.301",
        "Test: [ 10/100]\tTime  0.1",
        "val step 5/10 val_loss=1.0",
    ];

    #[test]
    fn every_progress_format_is_read_amid_skipped_lines() {
        let filler = "2026-11-23 INFO loss=0.1 lr=3e-4 tokens/s=12345\n".repeat(200);
        for line in PROGRESS_LINES {
            let want = progress::parse(line);
            assert!(want.is_some(), "not progress: {line:?}");
            for end in ["\n", "\r\n", "\r"] {
                let text = format!("{filler}{line}{end}{filler}");
                let (got, other) = scanned(&[b"x\n", text.as_bytes()]);
                assert_eq!(got, want, "{line:?} ended by {end:?}");
                assert!(other.is_empty());
            }
        }
    }

    #[test]
    fn only_the_newest_state_of_a_redrawn_bar_counts() {
        let mut text = String::from("start\n");
        for n in 1..=500 {
            text.push_str(&format!("\rEpoch 1: |#| {n}/1000 [00:01<00:01, 9.9it/s]"));
        }
        // A bar left on screen is read at its last state; the next bar's
        // newest state is the unfinished segment at the end.
        text.push_str("\nValidation DataLoader 0: |#| 3/40 [00:00<00:01, 40it/s]");
        text.push_str("\rValidation DataLoader 0: |#| 4/40 [00:00<00:01, 40it/s]");
        let mut s = OutputScanner::new();
        s.feed(text.as_bytes());
        let steps: Vec<_> = s
            .take_events()
            .into_iter()
            .filter_map(|e| match e {
                TorchEvent::Progress(u) => Some((u.step, u.phase)),
                _ => None,
            })
            .collect();
        // One merged update: the validation bar's newest state.
        assert_eq!(
            steps,
            vec![(Some(4), Some(progress::Phase::Validation))],
            "{steps:?}"
        );
    }

    proptest::proptest! {
        /// However the pipe splits the output into reads, the same messages
        /// are found and progress ends at the same place.
        #[test]
        fn reads_split_anywhere_find_the_same(cuts in proptest::collection::vec(0usize..4000, 0..12)) {
            let mut text = String::new();
            for (i, line) in PROGRESS_LINES.iter().enumerate() {
                text.push_str(line);
                text.push_str(["\n", "\r", "\r\n"][i % 3]);
                if i % 5 == 0 {
                    text.push_str(&format!("{}\n", died(i as u32 + 1)));
                    text.push_str("RuntimeError: CUDA out of memory.\r\nTried to allocate 2.00 MiB (GPU 0; 3.79 GiB total capacity; 654.97 MiB already allocated; 6.00 MiB free; 666.00 MiB reserved in total by PyTorch)\n");
                }
                text.push_str("INFO nothing to see\n");
            }
            text.push_str(PROGRESS_LINES[0]);
            let bytes = text.as_bytes();
            let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for p in points.into_iter().chain([bytes.len()]) {
                chunks.push(&bytes[start..p]);
                start = p;
            }
            let (whole_progress, whole) = scanned(&[bytes]);
            let (split_progress, split) = scanned(&chunks);
            proptest::prop_assert_eq!(format!("{whole:?}"), format!("{split:?}"));
            let at = |u: &Option<progress::ProgressUpdate>| u.as_ref().map(|u| (u.step, u.total, u.phase));
            proptest::prop_assert_eq!(at(&whole_progress), at(&split_progress));
        }
    }

    #[test]
    fn a_held_message_takes_its_continuation_from_a_later_read() {
        // The anchor ends one read; the figures, which match no trigger,
        // come amid other lines in the next.
        let mut s = OutputScanner::new();
        s.feed(b"x\nRuntimeError: CUDA out of mem");
        s.feed(b"ory.\nTried to allocate 2.00 MiB (GPU 0; 3.79 GiB total capacity; 654.97 MiB already allocated; 6.00 MiB free; 666.00 MiB reserved in total by PyTorch)\nmore\nlines\n");
        s.finish();
        let events = s.take_events();
        assert_eq!(events.len(), 1, "{events:?}");
        let TorchEvent::CudaOom(oom) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(oom.tried_bytes, Some(2 << 20));
    }

    #[test]
    fn invalid_utf8_is_tolerated() {
        let mut bytes = b"\xff\xfe garbage \xc3\n".to_vec();
        bytes.extend_from_slice(died(11).as_bytes());
        bytes.extend_from_slice(b"\xe2\x82\n");
        assert_eq!(lines_of(&[&bytes]).len(), 1);
    }

    #[test]
    fn unfinished_last_line_is_scanned_at_finish() {
        let mut s = OutputScanner::new();
        s.feed(died(12).as_bytes());
        assert!(s.take_events().is_empty());
        s.finish();
        assert_eq!(s.take_events().len(), 1);
    }

    #[test]
    fn pending_events_are_bounded() {
        let mut s = OutputScanner::new();
        for i in 0..(MAX_PENDING_EVENTS as u32 + 10) {
            s.feed(format!("{}\n", died(i + 1)).as_bytes());
        }
        assert_eq!(s.take_events().len(), MAX_PENDING_EVENTS);
        assert_eq!(s.dropped_events(), 10);
    }

    /// Waits until the writer thread holds a chunk it cannot write.
    fn wait_writing(sink: &Sink) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sink.shared.lock().writing {
            assert!(Instant::now() < deadline, "the writer never started");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn with_output_drop_a_full_queue_drops_the_oldest_bytes() {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        // Fill the pipe so the writer thread blocks on its first chunk.
        let filler = dup(&w).unwrap();
        rustix::io::ioctl_fionbio(&filler, true).unwrap();
        let mut filled = 0;
        while let Ok(n) = rustix::io::write(&filler, &[b'.'; 4096]) {
            filled += n;
        }
        let sink = Sink::start(Stream::Stdout, w, 10, true).unwrap();
        sink.push(b"first");
        wait_writing(&sink);
        // Queued: 10 bytes at most; the oldest go.
        sink.push(b"0123456789");
        sink.push(b"abc");
        let st = sink.stats();
        assert_eq!(st.read_bytes, 18);
        assert_eq!(st.dropped_bytes, 3);
        // More than the bound at once keeps only its newest bytes.
        sink.push(b"ABCDEFGHIJKLMNOP");
        assert_eq!(sink.stats().dropped_bytes, 3 + 10 + 6);

        // Drain the pipe: the filler, the chunk in flight, then the queue.
        rustix::io::ioctl_fionbio(&r, false).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        let want = filled + 5 + 10;
        while got.len() < want {
            let n = rustix::io::read(&r, &mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(&got[filled..], b"firstGHIJKLMNOP");
        assert!(sink.flush(Duration::from_secs(5)));
        assert_eq!(sink.stats().written_bytes, 15);
    }

    #[test]
    fn a_closed_destination_discards_and_reports() {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        let sink = Sink::start(Stream::Stdout, w, 1 << 20, false).unwrap();
        drop(r);
        sink.push(b"hello\n");
        assert!(sink.flush(Duration::from_secs(5)));
        sink.push(b"more\n");
        let st = sink.stats();
        assert_eq!(st.dropped_bytes, 11, "{st:?}");
        let e = sink.take_error().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_destination_pipe_only_ever_grows() {
        let (_r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        grow_pipe(&w);
        assert_eq!(rustix::pipe::fcntl_getpipe_size(&w).unwrap(), PIPE_SIZE);
        // Larger than ours already (as root may set): left alone.
        if rustix::pipe::fcntl_setpipe_size(&w, 4 * PIPE_SIZE).is_ok() {
            grow_pipe(&w);
            assert_eq!(rustix::pipe::fcntl_getpipe_size(&w).unwrap(), 4 * PIPE_SIZE);
        }
    }

    #[test]
    fn only_small_reads_of_a_busy_stream_nap() {
        let t0 = Instant::now();
        let mut pace = Pace::new(256 * 1024);
        // A first read, or one after a quiet spell: a line now and then.
        assert!(!pace.nap_after(100, t0));
        assert!(!pace.nap_after(100, t0 + Duration::from_millis(50)));
        // Small reads in quick succession: a job writing piece by piece.
        let busy = t0 + Duration::from_millis(50) + BUSY_WITHIN / 2;
        assert!(pace.nap_after(8192, busy));
        // A large read means the pipe fills between reads: no nap.
        assert!(!pace.nap_after(256 * 1024, busy + BUSY_WITHIN / 2));
        assert!(pace.nap_after(256 * 1024 - 1, busy + BUSY_WITHIN));
        // A pty never naps: its buffer is too small to wait on.
        let mut pty = Pace::new(0);
        assert!(!pty.nap_after(1, t0));
        assert!(!pty.nap_after(1, t0 + Duration::from_micros(10)));
    }

    #[test]
    fn raw_output_keeps_newlines() {
        let (master, slave) = pty::open_pty(80, 24).unwrap();
        raw_output(&slave).unwrap();
        rustix::io::write(&slave, b"a\nb\r\n").unwrap();
        let mut buf = [0u8; 16];
        let n = rustix::io::read(&master, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"a\nb\r\n");
    }

    /// Output that arrived with a memory wake-up is read by a tick that
    /// asks, though the loop has not polled the pump since.
    #[test]
    fn pump_now_reads_what_is_already_in_the_pipe() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let devnull = || Some(OwnedFd::from(std::fs::File::create("/dev/null").unwrap()));
            let (mut relay, stdio) = OutputRelay::new(RelayOptions {
                stdout: devnull(),
                stderr: devnull(),
                ..RelayOptions::default()
            })
            .unwrap();
            let mut child = std::process::Command::new("sh")
                .args([
                    "-c",
                    r"printf '\rEpoch 1:  30%%|###   | 12/40 [00:01<00:02, 9.00it/s]\r' >&2; exec sleep 5",
                ])
                .stdout(stdio.stdout)
                .stderr(stdio.stderr)
                .spawn()
                .unwrap();
            relay.after_spawn();
            // The driver sees the bytes; nothing polls the pump.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(relay.take_events().is_empty());
            assert_eq!(relay.pump_now(), Some(Pumped::Events));
            let events = relay.take_events();
            assert!(
                matches!(&events[..], [TorchEvent::Progress(u)] if u.step == Some(12)),
                "{events:?}"
            );
            child.kill().unwrap();
            child.wait().unwrap();
        });
    }
}
