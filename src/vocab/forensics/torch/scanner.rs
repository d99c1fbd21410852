//! The line-by-line state machine over a job's output: which lines make one
//! message, holding a message that may continue on the next line or a
//! torchrun report until its closing fence, and joining the lines that
//! describe the same death. Memory stays bounded whatever the output.

use std::borrow::Cow;
use std::collections::VecDeque;

use super::{
    AGENT_CLOSING, AGENT_FAILED, ANSI_CSI, ENDS_UNFINISHED, MAX_LINE_BYTES, MAX_MESSAGE_BYTES,
    MAX_OOM_LINES, MAX_QUEUED_EVENTS, MAX_REPORT_LINES, NEW_BODY, OLD_BODY_OPEN, OOM_ANCHOR,
    OOM_CONTINUATION, OOM_NO_FIGURES, REPORT_ENTRY, REPORT_EXITCODE, REPORT_FIELD, REPORT_RANK,
    REPORT_SIGNAL, REPORT_START_LINES, RankFailed, RankFailure, TorchEvent, WorkerDied,
    parse_cuda_oom, parse_worker_died,
};

// ---------------------------------------------------------------------------
// The scanner.

/// Recognises PyTorch messages in a job's output, fed one line at a time.
///
/// Most messages are one line. Two are not: a CUDA OOM message that a log
/// formatter split (the scanner holds it until the next line shows whether it
/// continues), and torchrun's `ChildFailedError` report (held until its
/// closing fence). Memory is bounded: lines are cut at [`MAX_LINE_BYTES`],
/// held messages at a fixed size and line count.
///
/// A line can complete more than one event (it ends a held message and is a
/// message itself); [`TorchScanner::feed`] returns the first and
/// [`TorchScanner::poll`] the rest. At the end of the output call
/// [`TorchScanner::finish`] for anything still held.
#[derive(Debug, Default)]
pub struct TorchScanner {
    oom: Option<PendingOom>,
    report: Option<PendingReport>,
    ready: VecDeque<TorchEvent>,
    /// A worker's own death line (no pid), held for the trainer's line
    /// that names it, and the lines seen since.
    death: Option<(WorkerDied, usize)>,
    /// The pids and signal of the death last handed out, and the lines
    /// since: later lines about them are the same death.
    recent_death: Option<(Vec<u32>, Option<String>, usize)>,
    /// Ranks the agent reported failed, held for the `ChildFailedError`
    /// report that names their global rank, and the lines seen since.
    agent: Option<(Vec<RankFailure>, usize)>,
    /// Pids the agent sent a closing signal: siblings it tore down, not
    /// failures (bounded).
    closing: Vec<u32>,
}

/// Lines a worker death's cascade may span (a traceback sits between).
const DEATH_LINES: usize = 60;

/// Sibling pids remembered.
const MAX_CLOSING: usize = 256;

#[derive(Debug)]
struct PendingOom {
    text: String,
    lines: usize,
}

#[derive(Debug)]
struct PendingReport {
    message: String,
    lines: usize,
    /// The character of the report's outer fence (`=` now, `*` in 1.9–1.10).
    fence: Option<char>,
    in_root_cause: bool,
    script: Option<String>,
    failures: Vec<RankFailure>,
}

impl TorchScanner {
    /// A scanner with nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one line of output (with or without its newline) and returns an
    /// event completed by it, if any.
    pub fn feed(&mut self, line: &str) -> Option<TorchEvent> {
        let line = normalise(line);
        let line = line.as_ref();

        self.age_held();
        if line.contains("closing signal")
            && let Some(caps) = AGENT_CLOSING.captures(line)
            && let Some(pid) = caps.get(1).and_then(|m| m.as_str().parse().ok())
            && self.closing.len() < MAX_CLOSING
        {
            self.closing.push(pid);
        }
        if line.contains("of binary")
            && let Some(failure) = parse_agent_failure(line)
        {
            if !failure.pid.is_some_and(|p| self.closing.contains(&p)) {
                let held = self.agent.get_or_insert_with(|| (Vec::new(), 0));
                if held.0.len() < MAX_QUEUED_EVENTS {
                    held.0.push(failure);
                }
            }
            return self.poll();
        }
        if let Some(report) = &mut self.report {
            match report.feed(line) {
                ReportStep::Continue => {}
                ReportStep::Done => {
                    if let Some(report) = self.report.take() {
                        let report = self.settle_report(report.finish());
                        self.push(TorchEvent::RankFailed(report));
                    }
                }
            }
        } else if line.contains("ChildFailedError:") {
            self.report = Some(PendingReport::start(line));
            return self.poll();
        }

        if let Some(pending) = &mut self.oom {
            let continues = OOM_CONTINUATION.is_match(line)
                && !OOM_ANCHOR.is_match(line)
                && pending.lines < MAX_OOM_LINES
                && pending.text.len() + line.len() < MAX_MESSAGE_BYTES;
            if continues {
                pending.text.push('\n');
                pending.text.push_str(line.trim());
                pending.lines += 1;
                if oom_is_complete(&pending.text) {
                    self.flush_oom();
                }
                return self.poll();
            }
            self.flush_oom();
        }

        if OOM_ANCHOR.is_match(line) {
            self.oom = Some(PendingOom {
                text: line.trim().to_string(),
                lines: 1,
            });
            if oom_is_complete(line) {
                self.flush_oom();
            }
        } else if (line.contains("DataLoader worker") || line.contains("encountered in worker"))
            && let Some(died) = parse_worker_died(line)
        {
            self.worker_died(died);
        }
        self.poll()
    }

    /// One death is one event. The worker's own line (it has no pid) is
    /// held for the trainer's line that names the pid; a line with a pid
    /// goes out at once, and the lines after it about the same pid (`exited
    /// unexpectedly`) are part of it, not new deaths.
    fn worker_died(&mut self, mut died: WorkerDied) {
        let compatible =
            |a: &Option<String>, b: &Option<String>| a.is_none() || b.is_none() || a == b;
        if let Some((pids, signal, _)) = &self.recent_death
            && !died.pids.is_empty()
            && died.pids.iter().all(|p| pids.contains(p))
            && compatible(signal, &died.signal)
        {
            return;
        }
        if let Some((held, _)) = self.death.take() {
            if compatible(&held.signal, &died.signal) {
                died.signal = died.signal.or(held.signal);
                died.shm_hint |= held.shm_hint;
                if held.message.len() + died.message.len() < MAX_MESSAGE_BYTES {
                    died.message = format!("{}\n{}", held.message, died.message);
                }
            } else {
                self.push(TorchEvent::WorkerDied(held));
            }
        }
        if died.pids.is_empty() {
            self.death = Some((died, 0));
        } else {
            self.recent_death = Some((died.pids.clone(), died.signal.clone(), 0));
            self.push(TorchEvent::WorkerDied(died));
        }
    }

    fn flush_death(&mut self) {
        if let Some((died, _)) = self.death.take() {
            self.push(TorchEvent::WorkerDied(died));
        }
    }

    /// Held messages that waited long enough for their other lines go out.
    fn age_held(&mut self) {
        if let Some((_, lines)) = &mut self.death {
            *lines += 1;
            if *lines > DEATH_LINES {
                self.flush_death();
            }
        }
        if let Some((_, _, lines)) = &mut self.recent_death {
            *lines += 1;
            if *lines > DEATH_LINES {
                self.recent_death = None;
            }
        }
        if let Some((_, lines)) = &mut self.agent {
            *lines += 1;
            if *lines > MAX_REPORT_LINES && self.report.is_none() {
                self.flush_agent();
            }
        }
    }

    /// The agent's failures that no report named, as a report of their own.
    fn flush_agent(&mut self) {
        if let Some((failures, _)) = self.agent.take()
            && !failures.is_empty()
        {
            self.push(TorchEvent::RankFailed(RankFailed {
                script: None,
                failures,
                message: String::new(),
            }));
        }
    }

    /// Joins the agent's lines into the report (matched by pid) and drops
    /// the siblings torchrun tore down: only failed ranks stay.
    fn settle_report(&mut self, mut report: RankFailed) -> RankFailed {
        let closing = &self.closing;
        report
            .failures
            .retain(|f| f.root_cause || !f.pid.is_some_and(|p| closing.contains(&p)));
        if let Some((agent, _)) = self.agent.take() {
            for a in agent {
                match report
                    .failures
                    .iter_mut()
                    .find(|f| f.pid.is_some() && f.pid == a.pid)
                {
                    Some(f) => {
                        f.local_rank = f.local_rank.or(a.local_rank);
                        f.exitcode = f.exitcode.or(a.exitcode);
                        f.signal = f.signal.take().or(a.signal);
                    }
                    None => report.failures.push(a),
                }
            }
        }
        report
    }

    /// No message is held waiting for its continuation: a line that
    /// matches no trigger changes nothing.
    pub fn is_idle(&self) -> bool {
        self.oom.is_none() && self.report.is_none() && self.death.is_none() && self.agent.is_none()
    }

    /// The next event already completed but not yet returned.
    pub fn poll(&mut self) -> Option<TorchEvent> {
        self.ready.pop_front()
    }

    /// Ends the output: returns every event still queued or held, including
    /// an unfinished message (parsed for what it has).
    pub fn finish(&mut self) -> Vec<TorchEvent> {
        self.flush_oom();
        self.flush_death();
        if let Some(report) = self.report.take() {
            let report = self.settle_report(report.finish());
            self.push(TorchEvent::RankFailed(report));
        }
        self.flush_agent();
        self.ready.drain(..).collect()
    }

    fn flush_oom(&mut self) {
        if let Some(pending) = self.oom.take()
            && let Some(oom) = parse_cuda_oom(&pending.text)
        {
            self.push(TorchEvent::CudaOom(oom));
        }
    }

    fn push(&mut self, event: TorchEvent) {
        if self.ready.len() < MAX_QUEUED_EVENTS {
            self.ready.push_back(event);
        }
    }
}

/// Parses torchelastic's agent line for a failed local rank.
fn parse_agent_failure(line: &str) -> Option<RankFailure> {
    let caps = AGENT_FAILED.captures(line)?;
    let exitcode: i32 = caps.get(1)?.as_str().parse().ok()?;
    Some(RankFailure {
        root_cause: true,
        rank: None,
        local_rank: caps.get(2)?.as_str().parse().ok(),
        host: None,
        pid: caps.get(3)?.as_str().parse().ok(),
        exitcode: Some(exitcode),
        signal: (exitcode < 0)
            .then(|| {
                exitcode
                    .checked_neg()
                    .and_then(crate::vocab::model::known_signal)
            })
            .flatten()
            .map(str::to_string),
    })
}

/// Scans a whole text (e.g. a saved log) and returns every event in order.
pub fn scan_text(text: &str) -> Vec<TorchEvent> {
    let mut scanner = TorchScanner::new();
    let mut events = Vec::new();
    for line in text.lines() {
        if let Some(event) = scanner.feed(line) {
            events.push(event);
        }
        while let Some(event) = scanner.poll() {
            events.push(event);
        }
    }
    events.extend(scanner.finish());
    events
}

/// Cuts a line to [`MAX_LINE_BYTES`] on a character boundary, keeps what a
/// terminal would show after carriage returns (progress bars rewrite their
/// line with `\r`), and drops ANSI colour sequences.
fn normalise(line: &str) -> Cow<'_, str> {
    let mut end = line.len().min(MAX_LINE_BYTES);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let mut line = &line[..end];
    line = line.strip_suffix('\n').unwrap_or(line);
    if line.contains('\r') {
        line = line
            .rsplit('\r')
            .find(|segment| !segment.trim().is_empty())
            .unwrap_or("");
    }
    if line.contains('\x1b') {
        ANSI_CSI.replace_all(line, "")
    } else {
        Cow::Borrowed(line)
    }
}

/// Whether an OOM message can be handed out, or whether its next line may
/// still carry figures. Anything not known to be unfinished is complete, so
/// an unknown wording is never held back.
fn oom_is_complete(text: &str) -> bool {
    if OOM_NO_FIGURES.is_match(text) {
        return true;
    }
    if let Some(open) = OLD_BODY_OPEN.find(text) {
        return text[open.end()..].contains(')');
    }
    if NEW_BODY.is_match(text) {
        return text.to_ascii_lowercase().contains("unallocated");
    }
    !ENDS_UNFINISHED.is_match(text)
}

enum ReportStep {
    Continue,
    Done,
}

impl PendingReport {
    fn start(line: &str) -> Self {
        Self {
            message: line.trim().to_string(),
            lines: 1,
            fence: None,
            in_root_cause: false,
            script: None,
            failures: Vec::new(),
        }
    }

    fn feed(&mut self, line: &str) -> ReportStep {
        let trimmed = line.trim();
        let separator = fence_char(trimmed);
        if self.fence.is_none() {
            match separator {
                Some(c) => self.fence = Some(c),
                None if self.lines > REPORT_START_LINES => return ReportStep::Done,
                None => {}
            }
        } else if separator.is_some() && separator == self.fence {
            self.append(trimmed);
            return ReportStep::Done;
        }
        self.append(trimmed);
        if self.lines >= MAX_REPORT_LINES {
            return ReportStep::Done;
        }
        if separator.is_some() {
            return ReportStep::Continue;
        }

        if trimmed.starts_with("Root Cause") {
            self.in_root_cause = true;
        } else if trimmed.starts_with("Other Failures") || trimmed.starts_with("Failures:") {
            self.in_root_cause = false;
        } else if REPORT_ENTRY.is_match(trimmed) {
            self.failures.push(self.new_failure());
        } else if let Some(caps) = REPORT_FIELD.captures(trimmed) {
            let key = caps.get(1).map_or("", |m| m.as_str());
            let value = caps.get(2).map_or("", |m| m.as_str()).trim();
            self.field(key, value);
        } else if let Some(script) = trimmed.strip_suffix(" FAILED")
            && self.script.is_none()
        {
            self.script = Some(script.trim().to_string());
        }
        ReportStep::Continue
    }

    fn new_failure(&self) -> RankFailure {
        RankFailure {
            root_cause: self.in_root_cause,
            rank: None,
            local_rank: None,
            host: None,
            pid: None,
            exitcode: None,
            signal: None,
        }
    }

    fn field(&mut self, key: &str, value: &str) {
        if self.failures.is_empty() {
            self.failures.push(self.new_failure());
        }
        let Some(failure) = self.failures.last_mut() else {
            return;
        };
        match key {
            "host" => failure.host = Some(value.to_string()),
            "rank" => {
                if let Some(caps) = REPORT_RANK.captures(value) {
                    failure.rank = caps.get(1).and_then(|m| m.as_str().parse().ok());
                    failure.local_rank = caps.get(2).and_then(|m| m.as_str().parse().ok());
                }
            }
            "exitcode" => {
                if let Some(caps) = REPORT_EXITCODE.captures(value) {
                    failure.exitcode = caps.get(1).and_then(|m| m.as_str().parse().ok());
                    if let Some(pid) = caps.get(2).and_then(|m| m.as_str().parse().ok()) {
                        failure.pid = Some(pid);
                    }
                    // torchrun prints -N for "killed by signal N".
                    if let Some(code) = failure.exitcode
                        && code < 0
                        && failure.signal.is_none()
                    {
                        failure.signal = code
                            .checked_neg()
                            .and_then(crate::vocab::model::known_signal)
                            .map(str::to_string);
                    }
                }
            }
            "traceback" | "msg" => {
                if let Some(caps) = REPORT_SIGNAL.captures(value) {
                    if let Some(name) = caps.get(2) {
                        failure.signal = Some(name.as_str().to_string());
                    }
                    if failure.pid.is_none() {
                        failure.pid = caps.get(3).and_then(|m| m.as_str().parse().ok());
                    }
                }
            }
            _ => {}
        }
    }

    fn append(&mut self, trimmed: &str) {
        self.lines += 1;
        if self.message.len() + trimmed.len() < MAX_MESSAGE_BYTES {
            self.message.push('\n');
            self.message.push_str(trimmed);
        }
    }

    fn finish(self) -> RankFailed {
        RankFailed {
            script: self.script,
            failures: self.failures,
            message: self.message,
        }
    }
}

/// The fence character of a separator line (`=====`, `-----`, `*****`).
fn fence_char(trimmed: &str) -> Option<char> {
    let first = trimmed.chars().next()?;
    (matches!(first, '=' | '-' | '*') && trimmed.len() >= 10 && trimmed.chars().all(|c| c == first))
        .then_some(first)
}
