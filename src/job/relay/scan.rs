//! Splitting the job's output into lines and scanning them: for PyTorch's
//! messages (`forensics::torch`), progress and the framework's banner.
//! The prefilters here decide which lines are read at all.

use crate::vocab::forensics::progress;
use crate::vocab::forensics::torch::{Framework, MAX_LINE_BYTES, TorchEvent, TorchScanner};

use super::pump::keep_event;

/// Splits raw output into lines and feeds them to a [`TorchScanner`].
///
/// Lines end at `\n` or `\r` (a progress bar rewrites its line with `\r`;
/// each state is a line), `\r\n` counts once, and empty `\r` segments are
/// skipped. A line is cut at [`MAX_LINE_BYTES`] (the rest until its end is
/// ignored, so one endless line costs no memory), and bytes that are not
/// UTF-8 are replaced, never rejected. The TUI, which reads the job's pty
/// itself, can use this directly.
#[derive(Debug, Default)]
pub struct OutputScanner {
    pub(super) line: Vec<u8>,
    /// The last terminator was `\r` and nothing followed it yet.
    pub(super) after_cr: bool,
    /// Bytes of `line` already read for progress while unfinished.
    pub(super) partial_scanned: usize,
    pub(super) torch: TorchScanner,
    pub(super) progress: progress::ProgressParser,
    pub(super) events: Vec<TorchEvent>,
    pub(super) dropped_events: u64,
    /// Lightning's banner was seen.
    pub(super) lightning: bool,
}

impl OutputScanner {
    /// A scanner with nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scans raw bytes; an unfinished last line is kept for the next call.
    pub fn feed(&mut self, bytes: &[u8]) {
        // The first line completes the one held from the previous read; the
        // whole lines after it are read in place (see `scan_block`); the
        // unfinished rest is held.
        let Some(first) = bytes.iter().position(|&b| is_terminator(b)) else {
            self.feed_lines(bytes);
            return;
        };
        self.feed_lines(&bytes[..=first]);
        let rest = &bytes[first + 1..];
        match rest.iter().rposition(|&b| is_terminator(b)) {
            Some(last) => {
                let (block, tail) = rest.split_at(last + 1);
                self.scan_block(block, tail);
                self.feed_lines(tail);
            }
            None => self.feed_lines(rest),
        }
    }

    /// Reads whole lines (`block` ends with a terminator) without copying
    /// them. Lines in which no trigger occurs are skipped unread while the
    /// torch scanner holds nothing: a single pass of one automaton finds
    /// the next line that can matter, so a read of ordinary log lines costs
    /// little more than the copy. `tail` is what this read has after the
    /// block (an unfinished line).
    pub(super) fn scan_block(&mut self, block: &[u8], tail: &[u8]) {
        let mut pos = 0;
        while pos < block.len() {
            let start = if self.torch.is_idle() {
                let Some(hit) = triggers().find_at(block, pos) else {
                    break;
                };
                block[pos..hit.start()]
                    .iter()
                    .rposition(|&b| is_terminator(b))
                    .map_or(pos, |i| pos + i + 1)
            } else {
                pos
            };
            // `block` ends with a terminator, so every line has one.
            let Some(len) = block[start..].iter().position(|&b| is_terminator(b)) else {
                break;
            };
            let end = start + len;
            if start > pos {
                self.after_cr = block[start - 1] == b'\r';
            }
            let next = if end + 1 < block.len() {
                &block[end + 1..]
            } else {
                tail
            };
            self.segment(&block[start..end], block[end] == b'\r', next);
            pos = end + 1;
        }
        self.after_cr = block.last() == Some(&b'\r');
    }

    /// One whole line or `\r` segment read in place; `cr` says it ended with
    /// `\r`, `next` is what this read has after its terminator.
    pub(super) fn segment(&mut self, seg: &[u8], cr: bool, next: &[u8]) {
        // `\r\n`, `\r\r` and a bare `\r` at a line's start end nothing.
        if seg.is_empty() && (cr || self.after_cr) {
            self.after_cr = cr;
            return;
        }
        self.after_cr = cr;
        let seg = &seg[..seg.len().min(MAX_LINE_BYTES)];
        self.note_framework(seg);
        let for_torch = !self.torch.is_idle() || torch_triggers().is_match(seg);
        // A bar state redrawn by the same bar in the same read is already
        // stale (the later one is what the job shows, at the same instant):
        // only the newest state of a redrawn bar is read for progress.
        let superseded = cr && redraws(seg, next);
        if !for_torch && superseded {
            return;
        }
        let text = String::from_utf8_lossy(seg);
        if for_torch {
            self.feed_torch(&text);
        }
        if !superseded && let Some(update) = self.progress.line(&text) {
            keep_event(
                &mut self.events,
                TorchEvent::Progress(update),
                &mut self.dropped_events,
            );
        }
    }

    /// Splits bytes into lines, one by one.
    pub(super) fn feed_lines(&mut self, mut bytes: &[u8]) {
        while let Some(i) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.push(&bytes[..i]);
            let cr = bytes[i] == b'\r';
            // `\r\n`, `\r\r` and a bare `\r` at a line's start end nothing a
            // terminal would show; a `\n` alone ends an (empty) line.
            if !self.line.is_empty() || !(cr || self.after_cr) {
                self.emit();
            }
            self.line.clear();
            self.partial_scanned = 0;
            self.after_cr = cr;
            bytes = &bytes[i + 1..];
        }
        self.push(bytes);
        self.scan_partial();
    }

    /// A progress bar's newest state is the segment after its last `\r`,
    /// which nothing ends until the next redraw: read progress from it now,
    /// or the job's position would lag one redraw behind (a whole phase,
    /// when the phase's first state is the one shown as memory runs out).
    /// A line grown no longer (or cut at its bound) is not read again.
    pub(super) fn scan_partial(&mut self) {
        if self.line.len() == self.partial_scanned {
            return;
        }
        self.partial_scanned = self.line.len();
        let text = String::from_utf8_lossy(&self.line);
        if let Some(update) = self.progress.partial(&text) {
            keep_event(
                &mut self.events,
                TorchEvent::Progress(update),
                &mut self.dropped_events,
            );
        }
    }

    /// The output has ended: scans an unfinished last line and anything the
    /// torch scanner still holds (a message waiting for its continuation).
    pub fn finish(&mut self) {
        if !self.line.is_empty() {
            self.emit();
            self.line.clear();
        }
        self.partial_scanned = 0;
        self.after_cr = false;
        let rest = self.torch.finish();
        for event in rest {
            self.keep(event);
        }
    }

    /// The events recognised so far, oldest first.
    pub fn take_events(&mut self) -> Vec<TorchEvent> {
        std::mem::take(&mut self.events)
    }

    /// Events dropped because [`OutputScanner::take_events`] was not called.
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
    }

    pub(super) fn push(&mut self, part: &[u8]) {
        if part.is_empty() {
            return;
        }
        self.after_cr = false;
        let room = MAX_LINE_BYTES.saturating_sub(self.line.len());
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }

    pub(super) fn emit(&mut self) {
        let line = std::mem::take(&mut self.line);
        self.note_framework(&line);
        let text = String::from_utf8_lossy(&line);
        self.feed_torch(&text);
        if let Some(update) = self.progress.line(&text) {
            keep_event(
                &mut self.events,
                TorchEvent::Progress(update),
                &mut self.dropped_events,
            );
        }
        drop(text);
        self.line = line;
    }

    pub(super) fn feed_torch(&mut self, text: &str) {
        let first = self.torch.feed(text);
        let (events, dropped) = (&mut self.events, &mut self.dropped_events);
        if let Some(event) = first {
            keep_event(events, event, dropped);
        }
        while let Some(event) = self.torch.poll() {
            keep_event(events, event, dropped);
        }
    }

    /// Lightning's start-up banner (`GPU available: False, used: False`),
    /// said once; a launcher's prefix (`[rank0]: `) may come first.
    pub(super) fn note_framework(&mut self, line: &[u8]) {
        if self.lightning || line.len() > 200 {
            return;
        }
        let banner = FRAMEWORK_TRIGGERS.as_bytes();
        let found = line
            .windows(banner.len())
            .position(|w| w == banner)
            .is_some_and(|at| at <= 32 && line[at..].windows(8).any(|w| w == b", used: "));
        if found {
            self.lightning = true;
            self.keep(TorchEvent::Framework(Framework::Lightning));
        }
    }

    pub(super) fn keep(&mut self, event: TorchEvent) {
        keep_event(&mut self.events, event, &mut self.dropped_events);
    }
}

/// Whether `next` (the bytes after a `\r`) redraws the bar `seg` showed:
/// their first bytes are the same but for digits. Only a prefix is
/// compared, so this costs the same however long the lines are.
pub(super) fn redraws(seg: &[u8], next: &[u8]) -> bool {
    const PREFIX: usize = 12;
    let next = &next[..next.len().min(PREFIX)];
    let next = next
        .iter()
        .position(|&b| is_terminator(b))
        .map_or(next, |i| &next[..i]);
    let seg = &seg[..seg.len().min(PREFIX)];
    !next.is_empty()
        && seg.len() == next.len()
        && seg
            .iter()
            .zip(next)
            .all(|(a, b)| a == b || (a.is_ascii_digit() && b.is_ascii_digit()))
}

pub(super) fn is_terminator(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

/// What the torch scanner starts on, when it holds nothing: `out of memory`
/// / `OutOfMemoryError` (any case, hence `emory`/`EMORY`),
/// `ChildFailedError`, `worker`, torchrun's agent (`exitcode`, `closing
/// signal`). A line without one of these changes nothing in an idle torch
/// scanner.
pub(super) const TORCH_TRIGGERS: &str =
    r"emory|EMORY|ChildFailedError|worker|WORKER|exitcode|closing signal";

/// What every line the progress parser reads has: a counter (`580/1288`,
/// `[ 10/100]`), a bar (`%|`), an epoch, step or iteration (HF's `'epoch':
/// 1.2` dicts too) and Lightning's phase names (its bars of unknown total
/// print `0/?`), and Keras' `Downloading data from`, which says the next
/// bar counts bytes. Only literals, in the three cases people print, so that
/// the search runs on a vectorised literal prefilter rather than byte by
/// byte through an automaton (log lines are full of digits).
pub(super) const PROGRESS_TRIGGERS: &str = r"/ ?[0-9]|%\||[Ee]poch|EPOCH|[Ss]tep|STEP|[Ii]ter|ITER|Sanity|Validat|Test|Predict|Downloading data from";

/// Lines that name the framework (see [`TorchEvent::Framework`]).
pub(super) const FRAMEWORK_TRIGGERS: &str = r"GPU available: ";

pub(super) fn triggers() -> &'static regex::bytes::Regex {
    static RE: std::sync::LazyLock<regex::bytes::Regex> = std::sync::LazyLock::new(|| {
        regex::bytes::Regex::new(&format!(
            "(?-u:{TORCH_TRIGGERS}|{PROGRESS_TRIGGERS}|{FRAMEWORK_TRIGGERS})"
        ))
        .expect("static pattern compiles")
    });
    &RE
}

pub(super) fn torch_triggers() -> &'static regex::bytes::Regex {
    static RE: std::sync::LazyLock<regex::bytes::Regex> = std::sync::LazyLock::new(|| {
        regex::bytes::Regex::new(&format!("(?-u:{TORCH_TRIGGERS})"))
            .expect("static pattern compiles")
    });
    &RE
}
