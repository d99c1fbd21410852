//! Training progress read from the job's output: which step, epoch and phase
//! the job is at, how fast it goes, and how memory grows per step.
//!
//! This module owns two things. [`parse`] turns one line (or one
//! `\r`-terminated segment of a progress bar) into a [`ProgressUpdate`], for
//! the formats people actually see: tqdm bars (with or without a
//! description), PyTorch Lightning's `Epoch N:` / `Validation DataLoader 0:` /
//! `Sanity Checking` / `Testing` / `Predicting` bars (tqdm and rich), the
//! Hugging Face Trainer's bar and its `{'loss': …, 'epoch': 1.2}` lines,
//! Keras (`580/1288 [====>...]`, `Epoch 3/10`), and plain loops (`step
//! 580/10000`, `Epoch [3/10], Step [580/1288]`, `iter 580`). A line that is
//! not one of these is never progress: bars whose description names other
//! work (`Downloading`, `Map`, `Loading checkpoint shards`) and byte-counting
//! bars are rejected.
//!
//! [`ProgressTracker`] folds the updates into the job's current
//! [`Progress`], computes the rate in steps per second over a recent window,
//! and, fed the memory figures of each tick, the bytes each training step
//! adds, the step at which the nearest ceiling will be reached, and phases
//! (validation, testing) that change memory sharply.
//!
//! Everything here is pure: no clock, no I/O. Callers pass the time.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::vocab::growth::{self, Figure};

/// What the job is doing in the training loop, as its progress output says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Train,
    Validation,
    Test,
    Sanity,
    Predict,
}

impl Phase {
    /// The name in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Train => "train",
            Phase::Validation => "validation",
            Phase::Test => "test",
            Phase::Sanity => "sanity",
            Phase::Predict => "predict",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one line said about progress. Fields the line did not carry are
/// `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ProgressUpdate {
    /// The counter as printed (the number before `/`).
    pub step: Option<u64>,
    /// The number after `/`, when there is one (not `?`).
    pub total: Option<u64>,
    /// The epoch as printed (`3`, `1.2`).
    pub epoch: Option<String>,
    /// The phase the line names. `None` with a `step` is a bar without a
    /// description (the HF Trainer's training and evaluation bars look
    /// alike): [`ProgressTracker`] infers it.
    pub phase: Option<Phase>,
    /// The rate the line itself printed, in steps per second.
    pub printed_rate: Option<f64>,
}

impl ProgressUpdate {
    /// Merges a later update into this one: the step, total, phase and rate
    /// come as a group from the later line when it has a step (they describe
    /// one bar); the epoch from the later line when it has one.
    pub fn merge(&mut self, later: ProgressUpdate) {
        if later.step.is_some() {
            self.step = later.step;
            self.total = later.total;
            self.phase = later.phase;
            self.printed_rate = later.printed_rate;
        } else if later.phase.is_some() && self.step.is_none() {
            self.phase = later.phase;
        }
        if later.epoch.is_some() {
            self.epoch = later.epoch;
        }
    }
}

/// The job's progress as logged (`progress` on samples and events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Progress {
    pub step: Option<u64>,
    pub total: Option<u64>,
    pub epoch: Option<String>,
    pub phase: Option<Phase>,
    /// Training steps per second over the recent window (or as printed,
    /// until there is a window).
    pub steps_per_second: Option<f64>,
    /// Bytes the nearest ceiling's usage grows per training step, over the
    /// recent window (negative when it shrinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_step: Option<i64>,
    /// The training step at which that growth reaches the nearest ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling_step: Option<u64>,
}

impl Progress {
    /// "epoch 1, validation step 128/400" — where the job was, for people.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(e) = &self.epoch {
            parts.push(format!("epoch {e}"));
        }
        if let Some(step) = self.step {
            let phase = match self.phase {
                Some(Phase::Train) | None => String::new(),
                Some(p) => format!("{p} "),
            };
            let total = self.total.map_or(String::new(), |t| format!("/{t}"));
            parts.push(format!("{phase}step {step}{total}"));
        } else if let Some(p) = self.phase
            && p != Phase::Train
        {
            parts.push(format!("during {p}"));
        }
        parts.join(", ")
    }

    /// The fields that say where the job is (not how fast): what makes a
    /// sample carry `progress` again.
    fn position(&self) -> (Option<u64>, Option<u64>, Option<&str>, Option<Phase>) {
        (self.step, self.total, self.epoch.as_deref(), self.phase)
    }
}

// ---------------------------------------------------------------------------
// Parsing.

macro_rules! re {
    ($name:ident, $pat:expr) => {
        static $name: LazyLock<Regex> =
            LazyLock::new(|| Regex::new($pat).expect("static pattern compiles"));
    };
}

// tqdm: `desc: 45%|████▌     | 580/1288 [01:02<01:15,  9.41it/s, loss=1]`;
// Lightning's unknown total prints `0/?`.
re!(
    TQDM,
    r"^(?P<desc>.*?)\s*(?:\d{1,3}%)?\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+|\?)\s*\[(?P<rest>[^\]]*)"
);
// The rate in a tqdm bracket: `9.41it/s`, `1.06s/it`, `3.2batch/s`.
re!(
    TQDM_RATE,
    r"(?P<x>\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z]*)/(?P<per>s|it)\b"
);
// Keras 2 (`580/1288 [=====>....] - ETA: 1:15`) and Keras 3 (`━━━`).
re!(KERAS, r"^(?P<n>\d+)/(?P<total>\d+)\s+(?:\[[=>.]*\]|━+)");
re!(
    KERAS_RATE,
    r"(?P<x>\d+(?:\.\d+)?)(?P<unit>us|µs|ms|s)/step\b"
);
re!(KERAS_EPOCH, r"^Epoch (?P<e>\d+)/\d+$");
// Lightning's rich bar: `Epoch 3/9  ━━━━━━━ 580/1288 0:01:02 • …`.
re!(RICH, r"^(?P<desc>.*?)\s*━+\s*(?P<n>\d+)/(?P<total>\d+)");
re!(RICH_RATE, r"(?P<x>\d+(?:\.\d+)?)it/s\b");
// Plain loops. The epoch may be followed by a bracketed counter, as in the
// ImageNet example (`Epoch: [3][ 580/1288]`) and MNIST's (`Train Epoch: 1
// [640/60000 (1%)]`).
re!(
    PLAIN,
    r"(?i)(?-u:\b)(?P<kw>epoch|step|iteration|iter|batch)(?-u:\b)\s*[:=#]?\s*\[?\s*(?P<n>\d+)(?:\s*(?:/|of)\s*(?P<total>\d+))?\s*\]?(?:\s*\[\s*(?P<n2>\d+)\s*/\s*(?P<total2>\d+))?"
);
// `Test: [ 10/100]` (the ImageNet example's evaluation loop).
re!(
    PLAIN_PHASE_BAR,
    r"(?i)^(?P<kw>test|val|validation|eval|evaluation)\s*:\s*\[\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)\s*\]"
);
re!(
    PHASE_WORD,
    r"(?i)(?-u:\b)(?:(?P<sanity>sanity)|(?P<predict>predict|predicting|prediction)|(?P<test>test|testing)|(?P<val>val|valid|validation|validating|eval|evaluation|evaluating|evaluate)|(?P<train>train|training|epoch|step|iter|iteration|batch|dataloader))(?-u:\b)"
);
re!(DESC_EPOCH, r"(?i)(?-u:\b)epoch\s*[:#]?\s*(?P<e>\d+)");
// HF Trainer's log dicts: `{'loss': 2.31, 'learning_rate': 4.9e-05, 'epoch': 1.2}`.
re!(HF_EPOCH, r#"['"]epoch['"]\s*:\s*['"]?(?P<e>\d+(?:\.\d+)?)"#);
re!(ANSI_CSI, r"\x1b\[[0-9;?]*[ -/]*[@-~]");

/// Reads progress from one line or one `\r` segment. `None` when the line is
/// not progress.
pub fn parse(line: &str) -> Option<ProgressUpdate> {
    // Nearly every line of output is not progress: leave early and cheaply.
    if !line.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    let line: Cow<'_, str> = if line.contains('\x1b') {
        ANSI_CSI.replace_all(line, "")
    } else {
        Cow::Borrowed(line)
    };
    let line = line.trim();
    if line.starts_with('{') {
        return parse_dict(line);
    }
    if line.contains('/') {
        if line.contains('|')
            && let Some(u) = parse_tqdm(line)
        {
            return Some(u);
        }
        if (line.starts_with("Epoch ") || line.starts_with(|c: char| c.is_ascii_digit()))
            && let Some(u) = parse_keras(line)
        {
            return Some(u);
        }
        if line.contains('━')
            && let Some(u) = parse_rich(line)
        {
            return Some(u);
        }
    }
    if !has_keyword(line.as_bytes()) {
        return None;
    }
    parse_plain(line)
}

/// Reads progress line by line, remembering what one line cannot say: that
/// a Keras bar counts the bytes of a download. Keras' `get_file` (the
/// datasets' `load_data()`) prints `Downloading data from URL` and then a
/// bar in the training bar's very format (`11490434/11490434 [====] - 0s
/// 0us/step`).
#[derive(Debug, Default)]
pub struct ProgressParser {
    /// A download's bar may follow.
    download: bool,
}

impl ProgressParser {
    /// A parser that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a finished line (or a `\r` segment the next redraw ended).
    pub fn line(&mut self, line: &str) -> Option<ProgressUpdate> {
        if line.trim_start().starts_with("Downloading data from ") {
            self.download = true;
            return None;
        }
        if self.download {
            match keras_counter(line) {
                Some((n, total)) => {
                    // The download is done when its bar is full.
                    self.download = n < total;
                    return None;
                }
                None => self.download = false,
            }
        }
        parse(line)
    }

    /// Reads a bar's unfinished newest state: the same, but it can only
    /// be a download's bar, never end the download (it may be cut short).
    pub fn partial(&self, line: &str) -> Option<ProgressUpdate> {
        if self.download && keras_counter(line).is_some() {
            return None;
        }
        parse(line)
    }
}

/// `n/total` of a Keras bar (either version), if the line is one.
fn keras_counter(line: &str) -> Option<(u64, u64)> {
    let caps = KERAS.captures(line.trim())?;
    Some((number(caps.name("n"))?, number(caps.name("total"))?))
}

/// Whether the line names one of the plain loops' counters, in any case: a
/// scan far cheaper than the case-insensitive pattern on every line.
fn has_keyword(bytes: &[u8]) -> bool {
    const WORDS: [&[u8]; 6] = [b"epoch", b"step", b"iter", b"batch", b"test", b"val"];
    bytes.iter().enumerate().any(|(i, b)| {
        matches!(b | 0x20, b'e' | b's' | b'i' | b'b' | b't' | b'v')
            && WORDS.iter().any(|w| {
                bytes
                    .get(i..i + w.len())
                    .is_some_and(|s| s.eq_ignore_ascii_case(w))
            })
    })
}

fn parse_dict(line: &str) -> Option<ProgressUpdate> {
    if !line.ends_with('}') {
        return None;
    }
    let caps = HF_EPOCH.captures(line)?;
    Some(ProgressUpdate {
        epoch: Some(caps.name("e")?.as_str().to_string()),
        ..ProgressUpdate::default()
    })
}

/// A bar's description: its phase and epoch, or `Err` when it names work
/// that is not a training loop (`Downloading`, `Map`, …).
fn classify_desc(desc: &str) -> Result<(Option<Phase>, Option<String>), ()> {
    let desc = desc.trim().trim_end_matches(':').trim();
    if desc.is_empty() {
        return Ok((None, None));
    }
    let mut phase = None;
    for caps in PHASE_WORD.captures_iter(desc) {
        let p = if caps.name("sanity").is_some() {
            Phase::Sanity
        } else if caps.name("predict").is_some() {
            Phase::Predict
        } else if caps.name("test").is_some() {
            Phase::Test
        } else if caps.name("val").is_some() {
            Phase::Validation
        } else {
            Phase::Train
        };
        // A named phase wins over the generic words (`Validation DataLoader`).
        if phase.is_none() || phase == Some(Phase::Train) {
            phase = Some(p);
        }
    }
    let phase = phase.ok_or(())?;
    let epoch = DESC_EPOCH
        .captures(desc)
        .and_then(|c| c.name("e"))
        .map(|m| m.as_str().to_string());
    Ok((Some(phase), epoch))
}

fn number(s: Option<regex::Match<'_>>) -> Option<u64> {
    s?.as_str().parse().ok()
}

fn parse_tqdm(line: &str) -> Option<ProgressUpdate> {
    let caps = TQDM.captures(line)?;
    let (phase, epoch) = classify_desc(caps.name("desc")?.as_str()).ok()?;
    let mut printed_rate = None;
    if let Some(rate) = TQDM_RATE.captures(caps.name("rest")?.as_str()) {
        let unit = rate.name("unit").map_or("", |m| m.as_str());
        // unit_scale bars count bytes: a download, not a training loop.
        if unit.ends_with('B') {
            return None;
        }
        let x: f64 = rate.name("x")?.as_str().parse().ok()?;
        printed_rate = match rate.name("per").map(|m| m.as_str()) {
            Some("it") if x > 0.0 => Some(1.0 / x),
            Some("s") => Some(x),
            _ => None,
        };
    }
    Some(ProgressUpdate {
        step: number(caps.name("n")),
        total: number(caps.name("total")),
        epoch,
        phase,
        printed_rate,
    })
}

fn parse_keras(line: &str) -> Option<ProgressUpdate> {
    if let Some(caps) = KERAS_EPOCH.captures(line) {
        return Some(ProgressUpdate {
            epoch: Some(caps.name("e")?.as_str().to_string()),
            phase: Some(Phase::Train),
            ..ProgressUpdate::default()
        });
    }
    let caps = KERAS.captures(line)?;
    let printed_rate = KERAS_RATE.captures(line).and_then(|r| {
        let x: f64 = r.name("x")?.as_str().parse().ok()?;
        let secs = match r.name("unit")?.as_str() {
            "us" | "µs" => x / 1e6,
            "ms" => x / 1e3,
            _ => x,
        };
        (secs > 0.0).then(|| 1.0 / secs)
    });
    Some(ProgressUpdate {
        step: number(caps.name("n")),
        total: number(caps.name("total")),
        epoch: None,
        phase: Some(Phase::Train),
        printed_rate,
    })
}

fn parse_rich(line: &str) -> Option<ProgressUpdate> {
    let caps = RICH.captures(line)?;
    let (phase, epoch) = classify_desc(caps.name("desc")?.as_str()).ok()?;
    let printed_rate = RICH_RATE
        .captures(&line[caps.get(0)?.end()..])
        .and_then(|r| r.name("x")?.as_str().parse().ok());
    Some(ProgressUpdate {
        step: number(caps.name("n")),
        total: number(caps.name("total")),
        epoch,
        // A rich bar always has a description; without one it is training.
        phase: phase.or(Some(Phase::Train)),
        printed_rate,
    })
}

fn parse_plain(line: &str) -> Option<ProgressUpdate> {
    if let Some(caps) = PLAIN_PHASE_BAR.captures(line) {
        let kw = caps.name("kw")?.as_str().to_ascii_lowercase();
        return Some(ProgressUpdate {
            step: number(caps.name("n")),
            total: number(caps.name("total")),
            phase: Some(if kw == "test" {
                Phase::Test
            } else {
                Phase::Validation
            }),
            ..ProgressUpdate::default()
        });
    }
    let mut u = ProgressUpdate::default();
    let mut found = false;
    for caps in PLAIN.captures_iter(line) {
        let end = ["n", "total", "n2", "total2"]
            .iter()
            .filter_map(|g| caps.name(g).map(|m| m.end()))
            .max()
            .unwrap_or(0);
        // `step 5.5`, `step 1e-3`, `epoch 3s`: a number of something else.
        let rest = &line[end..];
        let mut next = rest.chars();
        match (next.next(), next.next()) {
            (Some(c), _) if c.is_alphanumeric() || c == '_' => continue,
            (Some('.'), Some(d)) if d.is_ascii_digit() => continue,
            _ => {}
        }
        let kw = caps
            .name("kw")
            .map_or(String::new(), |m| m.as_str().to_ascii_lowercase());
        match kw.as_str() {
            "epoch" => {
                if u.epoch.is_some() {
                    continue;
                }
                u.epoch = caps.name("n").map(|m| m.as_str().to_string());
                if let Some(n) = number(caps.name("n2")) {
                    u.step = Some(n);
                    u.total = number(caps.name("total2"));
                }
                found = true;
            }
            "batch" => {
                if u.step.is_some() || caps.name("total").is_none() {
                    continue;
                }
                u.step = number(caps.name("n"));
                u.total = number(caps.name("total"));
                found = true;
            }
            _ => {
                if u.step.is_some() && kw != "step" {
                    continue;
                }
                u.step = number(caps.name("n"));
                u.total = number(caps.name("total"));
                found = true;
            }
        }
    }
    if !found {
        return None;
    }
    u.phase = Some(line_phase(line));
    Some(u)
}

/// The phase a plain log line names (`val step 5/10`), training otherwise.
/// Only words count: `val_loss` does not make a line validation.
fn line_phase(line: &str) -> Phase {
    for caps in PHASE_WORD.captures_iter(line) {
        if caps.name("sanity").is_some() {
            return Phase::Sanity;
        }
        if caps.name("predict").is_some() {
            return Phase::Predict;
        }
        if caps.name("test").is_some() {
            return Phase::Test;
        }
        if caps.name("val").is_some() {
            return Phase::Validation;
        }
    }
    Phase::Train
}

// ---------------------------------------------------------------------------
// Tracking.

/// Seconds of training steps the rate is computed over.
const RATE_WINDOW_SECONDS: f64 = 30.0;

/// Points kept for the rate (a bar redrawn 10 times a second for 30 s).
const MAX_RATE_POINTS: usize = 512;

/// (steps, bytes) pairs kept for the growth per step.
const MAX_MEMORY_POINTS: usize = 64;

/// Memory pairs needed before a growth per step is stated.
const MIN_MEMORY_POINTS: usize = growth::SURE_POINTS + 1;
/// Points from which no rate is said to be flat: twice the fewest with
/// which a trend can be sure, so that one test on a short series does not
/// call a leak flat.
const FLAT_MEMORY_POINTS: usize = 2 * growth::SURE_POINTS;
/// A step told longer ago than this (seconds), with no rate to carry it
/// forward, is not the step of a reading taken now.
const STALE_WORD: f64 = 0.5;

/// A phase must change memory by this much at least to be flagged …
const PHASE_MEMORY_MIN_BYTES: u64 = 256 << 20;

/// … and by this fraction of the ceiling.
const PHASE_MEMORY_MIN_FRACTION: f64 = 0.05;

/// A phase that changed memory sharply (`validation adds 800 MiB`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseMemory {
    pub phase: Phase,
    /// The epoch it happened in, as printed.
    pub epoch: Option<String>,
    /// Usage toward the nearest ceiling when the phase began.
    pub before_bytes: u64,
    /// How much that usage grew during the phase so far.
    pub added_bytes: u64,
}

impl PhaseMemory {
    /// The question to ask about it.
    pub fn advice(&self) -> String {
        let mib = self.added_bytes / (1 << 20);
        match self.phase {
            Phase::Validation | Phase::Test | Phase::Predict => format!(
                "{} adds {mib} MiB: are predictions or outputs being accumulated (keep them on the CPU, detach them, or reduce them per batch)?",
                self.phase
            ),
            Phase::Sanity => format!("the sanity check adds {mib} MiB before training even starts"),
            Phase::Train => format!("training adds {mib} MiB after the previous phase"),
        }
    }
}

/// Step, total, epoch and phase: where the job is.
type Position = (Option<u64>, Option<u64>, Option<String>, Option<Phase>);

/// Folds progress updates into the job's [`Progress`] and ties it to memory.
#[derive(Debug, Default)]
pub struct ProgressTracker {
    current: Option<Progress>,
    /// The position last reported as changed.
    reported: Option<Position>,
    /// The total of the first description-less bar: the training bar.
    main_total: Option<Option<u64>>,
    main_step: u64,
    /// The last training step seen and the training steps done in all,
    /// across counters that restart every epoch.
    last_train_step: Option<u64>,
    advanced: u64,
    rate_points: VecDeque<(f64, u64)>,
    printed_rate: Option<f64>,
    /// (steps advanced, usage) at the ticks that followed a step's word.
    memory_points: VecDeque<(f64, f64)>,
    /// `advanced` at the newest memory point.
    memory_advanced: Option<u64>,
    phase_entry: Option<PhaseEntry>,
    /// The job began to exit: its teardown (freeing, or a last burst of
    /// allocations while steps still print) says nothing about training,
    /// so the estimate of the ceiling's step stays the last one made
    /// before.
    frozen: bool,
    /// The companion has spoken: its words are the count.
    exact: bool,
    /// See [`ProgressTracker::unread`].
    unread: usize,
}

impl ProgressTracker {
    /// A tracker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The progress so far, if any was printed.
    pub fn current(&self) -> Option<&Progress> {
        self.current.as_ref()
    }

    /// True (once) when the step, total, epoch or phase changed since the
    /// last call: a sample carries `progress` only then.
    pub fn take_changed(&mut self) -> bool {
        let Some(p) = &self.current else {
            return false;
        };
        let (s, t, e, ph) = p.position();
        let now = (s, t, e.map(str::to_string), ph);
        if self.reported.as_ref() == Some(&now) {
            return false;
        }
        self.reported = Some(now);
        true
    }

    /// Applies the companion's word, written at run time `t`. Its count
    /// is exact and replaces the output's: at its first word the count the
    /// output gave so far, and the readings tied to it, are set aside. The
    /// output's lines are read as they are printed, the companion's first
    /// word up to a second late: "step 1" came after the output's "step
    /// 15", and taken as a new count it put every later reading's step 15
    /// ahead of the earlier ones' (0.94 MiB a step read for 1.0).
    pub fn update_exact(&mut self, u: ProgressUpdate, t: f64) {
        if !self.exact {
            self.exact = true;
            self.last_train_step = None;
            self.rate_points.clear();
            self.set_readings_aside();
        }
        self.update(u, t);
    }

    /// The readings tied to steps so far stand on another basis than the
    /// ones to come: the growth per step is fitted afresh.
    fn set_readings_aside(&mut self) {
        self.memory_points.clear();
        self.memory_advanced = None;
    }

    /// Applies one update printed at run time `t` (seconds).
    pub fn update(&mut self, u: ProgressUpdate, t: f64) {
        let p = self.current.get_or_insert_with(Progress::default);
        if let Some(e) = u.epoch {
            p.epoch = Some(e);
        }
        let Some(step) = u.step else {
            if let Some(phase) = u.phase
                && p.step.is_none()
            {
                p.phase = Some(phase);
            }
            return;
        };
        let phase = match u.phase {
            Some(phase) => phase,
            None => {
                // A bar without a description: the first one is training;
                // one with another total while that is unfinished is the
                // evaluation bar (the HF Trainer's arrangement).
                match self.main_total {
                    Some(total) if total == u.total => {
                        self.main_step = step;
                        Phase::Train
                    }
                    Some(total) if total.is_none_or(|t| self.main_step < t) => Phase::Validation,
                    _ => {
                        self.main_total = Some(u.total);
                        self.main_step = step;
                        Phase::Train
                    }
                }
            }
        };
        // A training step a little behind the last is the same count told
        // late (the companion's word, sent before the output line read
        // first: 350 then 345), not a new count. It moves nothing: taken
        // as the new last step, the steps from it to the last were counted
        // again by the next word (40 steps for 350 to 385). Counted as a
        // new count, it made 345 steps in a second.
        let late = |prev: u64| step < prev && step > prev / 2;
        if phase == Phase::Train && self.last_train_step.is_some_and(late) {
            return;
        }
        p.step = Some(step);
        p.total = u.total;
        p.phase = Some(phase);
        if phase != Phase::Train {
            return;
        }
        match self.last_train_step {
            Some(prev) if step >= prev => self.advanced += step - prev,
            // The counter started again (a new epoch's bar).
            Some(_) => self.advanced += step,
            None => {}
        }
        self.last_train_step = Some(step);
        if u.printed_rate.is_some() {
            self.printed_rate = u.printed_rate;
        }
        if self
            .rate_points
            .back()
            .is_none_or(|&(_, a)| a != self.advanced)
        {
            self.rate_points.push_back((t, self.advanced));
        }
        while self.rate_points.len() > MAX_RATE_POINTS
            || self
                .rate_points
                .front()
                .is_some_and(|&(t0, _)| t - t0 > RATE_WINDOW_SECONDS && self.rate_points.len() > 2)
        {
            self.rate_points.pop_front();
        }
        let measured = self.measured_rate();
        let p = self.current.get_or_insert_with(Progress::default);
        p.steps_per_second = measured.or(self.printed_rate).map(round3);
    }

    /// Steps the job has likely made since it last told its step, at run
    /// time `t`: the measured rate times the word's age (at most 2 s).
    /// `None` when the word is older than [`STALE_WORD`] and there is no
    /// rate yet to carry it forward: such a reading belongs to no step
    /// known.
    fn since_word(&self, t: f64) -> Option<f64> {
        let &(t1, _) = self.rate_points.back()?;
        // Negative for a word written after the reading was taken (both
        // come to the tick that reads them).
        let age = (t - t1).clamp(-2.0, 2.0);
        match self.measured_rate() {
            Some(rate) => Some(rate * age),
            None => (age <= STALE_WORD).then_some(0.0),
        }
    }

    /// Training steps a second over the rate window (at least 1 s of it,
    /// with steps made), from the job's own words.
    fn measured_rate(&self) -> Option<f64> {
        match (self.rate_points.front(), self.rate_points.back()) {
            (Some(&(t0, a0)), Some(&(t1, a1))) if t1 - t0 >= 1.0 && a1 > a0 => {
                Some((a1 - a0) as f64 / (t1 - t0))
            }
            _ => None,
        }
    }

    /// The job began to exit (a stop, a signal, Ctrl-C, its main process
    /// ended): the growth per step and the ceiling's step are kept as
    /// they are now.
    pub fn freeze(&mut self) {
        self.frozen = true;
    }

    /// How many of the job's processes that are not workers have not had
    /// their memory read yet (`smaps_rollup`). Until read, such a process
    /// counts only what it wrote since oomguard first saw it; its first
    /// reading adds what it held then (the interpreter) less its share of
    /// the libraries: a step in the footprint that is no step's cost
    /// (5 MiB, 3 s into a run, read 0.97 MiB a step for 1.0). When the
    /// count falls, the readings tied to steps before it are set aside.
    /// A process that is never read leaves them as they are.
    pub fn unread(&mut self, count: usize) {
        if count < self.unread {
            self.set_readings_aside();
        }
        self.unread = count;
    }

    /// Ties the progress to memory at run time `t`: `used` is the usage
    /// toward the nearest ceiling, `headroom` what is left below it.
    /// Returns a phase, just ended, that grew memory sharply while it ran.
    ///
    /// The step a reading belongs to is the one the job had reached when
    /// it was taken, not the last one it told: the companion tells at most
    /// once a second and the ticks come once a second, so the word can be
    /// up to a second old (20 steps of a 20-step/s loop: a leak of 4 MiB a
    /// step read as 3.0 MiB 58 steps in). The steps since are the measured
    /// rate times the word's age, for at most 2 s.
    pub fn observe_memory(
        &mut self,
        used: u64,
        headroom: Option<u64>,
        t: f64,
    ) -> Option<PhaseMemory> {
        let since_word = self.since_word(t);
        let p = self.current.as_mut()?;
        if let Some(since_word) = since_word
            && p.phase == Some(Phase::Train)
            && !self.frozen
            && self.last_train_step.is_some()
            && self.memory_advanced != Some(self.advanced)
        {
            self.memory_advanced = Some(self.advanced);
            let x = self.advanced as f64 + since_word;
            self.memory_points.push_back((x, used as f64));
            if self.memory_points.len() > MAX_MEMORY_POINTS {
                self.memory_points.pop_front();
            }
            p.bytes_per_step = slope(&self.memory_points).map(|s| s.round() as i64);
            p.ceiling_step = match (p.bytes_per_step, headroom, self.last_train_step) {
                (Some(per), Some(room), Some(step)) if per > 0 => {
                    Some((step as f64 + since_word).round() as u64 + room / per.unsigned_abs())
                }
                _ => None,
            };
        }
        let phase = p.phase;
        let ceiling = used.saturating_add(headroom.unwrap_or(0));
        let threshold =
            PHASE_MEMORY_MIN_BYTES.max((ceiling as f64 * PHASE_MEMORY_MIN_FRACTION) as u64);
        match &mut self.phase_entry {
            Some(entry) if entry.phase == phase => {
                entry.peak = entry.peak.max(used);
                None
            }
            slot => {
                // The phase ended: what did it leave behind at its fullest?
                let ended = slot.replace(PhaseEntry {
                    phase,
                    epoch: p.epoch.clone(),
                    before: used,
                    peak: used,
                })?;
                let left = ended.phase?;
                let added = ended.peak.saturating_sub(ended.before);
                (left != Phase::Train && added >= threshold).then_some(PhaseMemory {
                    phase: left,
                    epoch: ended.epoch,
                    before_bytes: ended.before,
                    added_bytes: added,
                })
            }
        }
    }
}

/// The phase memory was last observed in.
#[derive(Debug)]
struct PhaseEntry {
    phase: Option<Phase>,
    epoch: Option<String>,
    /// Usage when it began, and the most it reached since.
    before: u64,
    peak: u64,
}

/// The growth of bytes per step: the median slope ([`growth::Trend`]), not
/// least squares, since a
/// training run has readings far off the line at its ends. Measured: a
/// loop leaking 1 MiB a step read 1.00 MiB/step until its last reading,
/// taken while the interpreter freed what it held (footprint 597 → 64 MiB
/// at the same step count), which made the least-squares figure 852 KiB.
/// `None` until there are enough points; 0 (flat) where
/// [`growth::figure`], the rule every growth figure follows, finds no
/// rate: a flat loop's allocator noise read "1.9 KiB per training step, so
/// the ceiling is reached near step 11549577", and the workers' start-up
/// in its first 80 steps "ceiling ≈ step 2742". Flat only from
/// [`FLAT_MEMORY_POINTS`] points on: with fewer, the figure tries the
/// whole series alone, and a leak of 4 MiB a step was logged as 0 B/step
/// at its first figure (eight points at least), its step words lagging.
fn slope(points: &VecDeque<(f64, f64)>) -> Option<f64> {
    if points.len() < MIN_MEMORY_POINTS {
        return None;
    }
    let points: Vec<(f64, f64)> = points.iter().copied().collect();
    match growth::figure(&points, 0.0) {
        Figure::Rate(per_step) => Some(per_step),
        Figure::Flat if points.len() >= FLAT_MEMORY_POINTS => Some(0.0),
        Figure::Flat | Figure::Unknown => None,
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: &str) -> ProgressUpdate {
        parse(line).unwrap_or_else(|| panic!("not progress: {line:?}"))
    }

    fn at(
        step: u64,
        total: Option<u64>,
        phase: Option<Phase>,
    ) -> (Option<u64>, Option<u64>, Option<Phase>) {
        (Some(step), total, phase)
    }

    fn pos(u: &ProgressUpdate) -> (Option<u64>, Option<u64>, Option<Phase>) {
        (u.step, u.total, u.phase)
    }

    #[test]
    fn tqdm_bars() {
        let u = p(" 45%|████▌     | 580/1288 [01:02<01:15,  9.41it/s]");
        assert_eq!(pos(&u), at(580, Some(1288), None));
        assert_eq!(u.printed_rate, Some(9.41));
        let u = p("train:  45%|####5     | 580/1288 [01:02<01:15,  1.25s/it, loss=0.31]");
        assert_eq!(pos(&u), at(580, Some(1288), Some(Phase::Train)));
        assert_eq!(u.printed_rate, Some(0.8));
        let u = p("Epoch 3/10: 100%|██████████| 50/50 [00:05<00:00,  9.98batch/s]");
        assert_eq!(u.epoch.as_deref(), Some("3"));
        assert_eq!(pos(&u), at(50, Some(50), Some(Phase::Train)));
    }

    #[test]
    fn lightning_bars() {
        let u = p(
            "Epoch 3:  45%|████▌     | 580/1288 [01:02<01:15,  9.41it/s, v_num=0, train_loss=0.123]",
        );
        assert_eq!(u.epoch.as_deref(), Some("3"));
        assert_eq!(pos(&u), at(580, Some(1288), Some(Phase::Train)));
        let u = p("Validation DataLoader 0:  30%|███       | 120/400 [00:03<00:07, 38.1it/s]");
        assert_eq!(pos(&u), at(120, Some(400), Some(Phase::Validation)));
        assert_eq!(u.epoch, None);
        let u = p("Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 20.1it/s]");
        assert_eq!(pos(&u), at(2, Some(2), Some(Phase::Sanity)));
        let u = p("Testing DataLoader 0:  10%|█         | 4/40 [00:00<00:03, 11.0it/s]");
        assert_eq!(pos(&u), at(4, Some(40), Some(Phase::Test)));
        let u = p("Predicting DataLoader 0:  50%|█████     | 5/10 [00:00<00:00, 11.0it/s]");
        assert_eq!(pos(&u), at(5, Some(10), Some(Phase::Predict)));
        let u = p("Validation: |          | 0/? [00:00<?, ?it/s]");
        assert_eq!(pos(&u), at(0, None, Some(Phase::Validation)));
        let u = p("Epoch 2/9  ━━━━━━━━━━━━━━━━━━ 580/1288 0:01:02 • 0:01:15 9.41it/s v_num: 0");
        assert_eq!(u.epoch.as_deref(), Some("2"));
        assert_eq!(pos(&u), at(580, Some(1288), Some(Phase::Train)));
        assert_eq!(u.printed_rate, Some(9.41));
        let u = p("Validation DataLoader 0 ━━━━━━━━━━━━━ 12/40 0:00:01 • 0:00:02 30.2it/s");
        assert_eq!(pos(&u), at(12, Some(40), Some(Phase::Validation)));
    }

    #[test]
    fn hf_trainer_dicts() {
        let u = p("{'loss': 2.31, 'learning_rate': 4.9e-05, 'epoch': 1.2}");
        assert_eq!(u.epoch.as_deref(), Some("1.2"));
        assert_eq!(u.step, None);
        let u = p("{'eval_loss': 2.1, 'eval_runtime': 3.2, 'epoch': 2.0}");
        assert_eq!(u.epoch.as_deref(), Some("2.0"));
        assert_eq!(parse("{'loss': 2.31, 'learning_rate': 4.9e-05}"), None);
    }

    #[test]
    fn keras() {
        let u = p("580/1288 [=============>................] - ETA: 1:15 - loss: 0.1234");
        assert_eq!(pos(&u), at(580, Some(1288), Some(Phase::Train)));
        let u = p(" 580/1288 ━━━━━━━━━━━━━━━━━━━━ 1:15 58ms/step - loss: 0.1234");
        assert_eq!(pos(&u), at(580, Some(1288), Some(Phase::Train)));
        let rate = u.printed_rate.unwrap_or(0.0);
        assert!((rate - 17.241).abs() < 0.01, "{rate}");
        let u = p("Epoch 3/10");
        assert_eq!(u.epoch.as_deref(), Some("3"));
        assert_eq!(u.step, None);
    }

    #[test]
    fn plain_loops() {
        let u = p("step 580/10000 loss=2.31");
        assert_eq!(pos(&u), at(580, Some(10000), Some(Phase::Train)));
        let u = p("Epoch [3/10], Step [580/1288], Loss: 0.1234");
        assert_eq!(u.epoch.as_deref(), Some("3"));
        assert_eq!(pos(&u), at(580, Some(1288), Some(Phase::Train)));
        let u = p("iter 580");
        assert_eq!(pos(&u), at(580, None, Some(Phase::Train)));
        let u = p("Epoch: [3][ 580/1288]\tTime  0.251 ( 0.262)\tLoss 2.3e+00");
        assert_eq!(u.epoch.as_deref(), Some("3"));
        assert_eq!(pos(&u), at(580, Some(1288), Some(Phase::Train)));
        let u = p("Train Epoch: 1 [640/60000 (1%)]\tLoss: 2.301");
        assert_eq!(u.epoch.as_deref(), Some("1"));
        assert_eq!(pos(&u), at(640, Some(60000), Some(Phase::Train)));
        let u = p("Test: [ 10/100]\tTime  0.1");
        assert_eq!(pos(&u), at(10, Some(100), Some(Phase::Test)));
        let u = p("val step 5/10 val_loss=1.0");
        assert_eq!(pos(&u), at(5, Some(10), Some(Phase::Validation)));
        let u = p("epoch 2 step 30 train_loss=1.0 val_loss=2.0");
        assert_eq!(u.epoch.as_deref(), Some("2"));
        assert_eq!(pos(&u), at(30, None, Some(Phase::Train)));
    }

    #[test]
    fn ansi_colours_are_ignored() {
        let u = p("\x1b[32mEpoch 1:\x1b[0m  10%|█         | 10/100 [00:01<00:09, 9.9it/s]");
        assert_eq!(u.epoch.as_deref(), Some("1"));
        assert_eq!(pos(&u), at(10, Some(100), Some(Phase::Train)));
    }

    #[test]
    fn lines_that_are_not_progress() {
        for line in [
            "",
            "Loading the model",
            "Downloading model.safetensors:  45%|████▌     | 1.21G/2.69G [00:10<00:12, 120MB/s]",
            "Downloading data: 100%|██████████| 5/5 [00:01<00:00,  4.1it/s]",
            "Map: 100%|██████████| 1000/1000 [00:00<00:00, 5000.00 examples/s]",
            "Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.5s/it]",
            "model.safetensors: 100%|██████████| 2048/2048 [00:01<00:00, 1500.0B/s]",
            "Using 4/8 GPUs",
            "2024/01/05 12:00:00 starting",
            "StepLR(step_size=30, gamma=0.1)",
            "warmup_steps: 500, max_steps=1000",
            "global_step_500 saved",
            "optimizer.step(closure) at line 580",
            "lr step 0.001",
            "Traceback (most recent call last): File \"x.py\", line 580",
            "HTTP/1.1 200 OK",
            "steps_per_epoch = 100",
            "{'learning_rate': 0.001}",
            "Epoch-level metrics: 3 computed",
            "epoch 3s elapsed",
            "batch size 32",
            "RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 3.79 GiB total capacity)",
            "DataLoader worker (pid 1234) is killed by signal: Killed.",
        ] {
            assert_eq!(parse(line), None, "{line:?}");
        }
    }

    #[test]
    fn merging_keeps_a_bars_fields_together() {
        let mut a = p("Epoch 3/10");
        a.merge(p(
            "Validation DataLoader 0:  30%|███       | 120/400 [00:03<00:07, 38.1it/s]",
        ));
        assert_eq!(a.epoch.as_deref(), Some("3"));
        assert_eq!(pos(&a), at(120, Some(400), Some(Phase::Validation)));
        a.merge(p(" 10%|█         | 1/10 [00:00<00:01, 9.9it/s]"));
        assert_eq!(pos(&a), at(1, Some(10), None));
        a.merge(p("{'loss': 1.0, 'epoch': 3.5}"));
        assert_eq!(a.epoch.as_deref(), Some("3.5"));
        assert_eq!(a.step, Some(1));
    }

    #[test]
    fn a_keras_download_bar_is_not_progress() {
        let mut p = ProgressParser::new();
        assert_eq!(
            p.line("Downloading data from https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"),
            None
        );
        let bar = " 4194304/11490434 [=========>....................] - ETA: 0s";
        assert!(parse(bar).is_some(), "alone it looks like training");
        assert_eq!(p.partial(bar), None);
        assert_eq!(p.line(bar), None);
        assert_eq!(
            p.line("11490434/11490434 [==============================] - 0s 0us/step"),
            None
        );
        // The download is over: the next bar is training again.
        assert_eq!(p.line("Epoch 1/10").and_then(|u| u.epoch), Some("1".into()));
        let u = p.line("580/1875 [=====>....] - ETA: 2s - loss: 0.2");
        assert_eq!(u.map(|u| (u.step, u.total)), Some((Some(580), Some(1875))));
        // A download cut short ends at the next line that is not its bar.
        p.line("Downloading data from https://example.org/x.npz");
        assert_eq!(p.line("100/999 [==>...] - ETA: 1s"), None);
        assert!(p.line("step 5/10").is_some());
    }

    fn feed(t: &mut ProgressTracker, line: &str, at: f64) {
        t.update(p(line), at);
    }

    #[test]
    fn hf_evaluation_bar_is_inferred() {
        let mut t = ProgressTracker::new();
        feed(
            &mut t,
            " 25%|██▌       | 500/2000 [01:00<03:00,  8.3it/s]",
            60.0,
        );
        assert_eq!(t.current().and_then(|p| p.phase), Some(Phase::Train));
        feed(
            &mut t,
            " 30%|███       | 12/40 [00:01<00:02, 12.0it/s]",
            61.0,
        );
        let c = t.current().cloned().unwrap_or_default();
        assert_eq!(
            (c.step, c.total, c.phase),
            (Some(12), Some(40), Some(Phase::Validation))
        );
        feed(
            &mut t,
            " 25%|██▌       | 501/2000 [01:02<03:00,  8.3it/s]",
            62.0,
        );
        assert_eq!(t.current().and_then(|p| p.phase), Some(Phase::Train));
    }

    #[test]
    fn rate_spans_epochs_whose_counters_restart() {
        let mut t = ProgressTracker::new();
        // 10 steps per second; the bar restarts every 100 steps.
        for i in 0..300u64 {
            let line = format!(
                "Epoch {}: |#| {}/100 [00:01<00:01, 10.0it/s]",
                i / 100 + 1,
                i % 100 + 1
            );
            feed(&mut t, &line, i as f64 / 10.0);
        }
        let c = t.current().cloned().unwrap_or_default();
        assert_eq!(c.epoch.as_deref(), Some("3"));
        let rate = c.steps_per_second.unwrap_or(0.0);
        assert!((rate - 10.0).abs() < 0.05, "{rate}");
    }

    #[test]
    fn growth_per_step_and_the_ceiling_step() {
        let mut t = ProgressTracker::new();
        let mib = 1u64 << 20;
        // 1.5 MiB per step from 4 GiB; the ceiling is 8 GiB.
        for step in (0..=200u64).step_by(10) {
            feed(&mut t, &format!("step {step}/2000"), step as f64);
            let used = 4096 * mib + step * 3 * mib / 2;
            t.observe_memory(used, Some(8192 * mib - used), step as f64);
        }
        let c = t.current().cloned().unwrap_or_default();
        assert_eq!(c.bytes_per_step, Some((3 * mib / 2) as i64));
        // 4096 MiB left at step 0 / 1.5 MiB per step: step 2730.
        let at = c.ceiling_step.unwrap_or(0);
        assert!((2729..=2731).contains(&at), "{at}");
    }

    #[test]
    fn no_rate_on_few_readings_is_no_figure_not_flat() {
        let mib = (1u64 << 20) as f64;
        // 4 MiB a step, then level for the newest three: no rate.
        let few: VecDeque<(f64, f64)> = (0..8u32)
            .map(|i| (f64::from(i) * 15.0, f64::from(i.min(5)) * 60.0 * mib))
            .collect();
        assert_eq!(growth::figure(&Vec::from(few.clone()), 0.0), Figure::Flat);
        assert_eq!(slope(&few), None);
        // Level over sixteen: flat.
        let level: VecDeque<(f64, f64)> = (0..16u32)
            .map(|i| {
                (
                    f64::from(i) * 15.0,
                    300.0 * mib + f64::from(i % 2) * 0.1 * mib,
                )
            })
            .collect();
        assert_eq!(slope(&level), Some(0.0));
    }

    /// Readings at a run's ends that are no step's cost: the first ones
    /// after a resume can hold a checkpoint being loaded, the last one
    /// before the job's end is noticed can be the interpreter freeing what
    /// it held (at the same step count). Neither moves the growth per step.
    #[test]
    fn readings_off_the_line_at_the_ends_do_not_move_the_growth_per_step() {
        let mut t = ProgressTracker::new();
        let mib = 1u64 << 20;
        for step in 4001..=4064u64 {
            feed(&mut t, &format!("step {step}/9000"), step as f64);
            let mut used = 1024 * mib + (step - 4000) * mib;
            if step <= 4003 {
                used += 900 * mib;
            }
            if step == 4064 {
                used = 64 * mib;
            }
            t.observe_memory(used, Some((8192 * mib).saturating_sub(used)), step as f64);
        }
        let c = t.current().cloned().unwrap_or_default();
        let per = c.bytes_per_step.unwrap_or(0) as f64 / mib as f64;
        assert!((per - 1.0).abs() < 0.02, "{per} MiB/step");
        // The least-squares line through the same points reads far off.
        let pts = t.memory_points.iter().copied();
        let ls = crate::vocab::growth::least_squares_slope(pts).unwrap() / mib as f64;
        assert!(ls < 0.5, "least squares {ls}");
    }

    /// The companion tells its step once a second and the ticks come once
    /// a second on their own clock: a reading's step is the one the job
    /// had reached when it was taken, not the last one told (which lags it
    /// by 0 to 20 steps of a 20-step/s loop as the two clocks drift).
    #[test]
    fn a_reading_belongs_to_the_step_reached_when_it_was_taken() {
        let mut t = ProgressTracker::new();
        let mib = 1u64 << 20;
        let (mut word, mut tick) = (0.0f64, 0.35f64);
        while tick < 19.5 {
            if word <= tick {
                feed(&mut t, &format!("step {}/9000", (word * 20.0) as u64), word);
                word += 1.0;
            } else {
                let used = 1024 * mib + (tick * 20.0 * 4.0 * mib as f64) as u64;
                t.observe_memory(used, Some(8192 * mib - used), tick);
                tick += 1.13;
            }
        }
        let c = t.current().cloned().unwrap_or_default();
        let per = c.bytes_per_step.unwrap_or(0) as f64 / mib as f64;
        assert!((per - 4.0).abs() < 0.001, "{per} MiB/step");
    }

    /// The companion takes over from the job's output, as measured: the
    /// output told each step as it ended (1 to 22 at 20 steps a second),
    /// and the companion's words, written once a second from step 1 on,
    /// are read at the ticks that follow (the first one a second late).
    /// Every figure reads the leak of 1 MiB a step.
    #[test]
    fn the_companion_taking_over_from_the_output_counts_no_step_twice() {
        let mut t = ProgressTracker::new();
        let mib = 1u64 << 20;
        let step_at = |at: f64| (at * 20.0) as u64 + 1;
        let ticks: Vec<f64> = (0..19).map(|j| 1.07 + j as f64 * 1.02).collect();
        // (when it is read, what): a line, a word (with when it was
        // written) or a reading; a tick reads memory first, then words.
        let mut events: Vec<(f64, u8, u64, f64)> = (1..=22u64)
            .map(|s| ((s - 1) as f64 / 20.0, 0, s, 0.0))
            .collect();
        for k in 0..19 {
            let written = k as f64;
            let read = ticks
                .iter()
                .copied()
                .find(|&tk| tk > written)
                .unwrap_or(99.0);
            events.push((read + 0.01, 1, step_at(written), written));
        }
        events.extend(ticks.iter().map(|&tk| (tk, 2, step_at(tk), tk)));
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut figures = Vec::new();
        for (at, kind, step, written) in events {
            let line = format!("step {step}/9000");
            match kind {
                0 if !t.exact => feed(&mut t, &line, at),
                1 => t.update_exact(p(&line), written),
                2 => {
                    let used = 14 * mib + step * mib;
                    t.observe_memory(used, Some(8192 * mib - used), at);
                    figures.extend(t.current().and_then(|c| c.bytes_per_step));
                }
                _ => {}
            }
        }
        assert!(figures.len() >= 8, "{figures:?}");
        for per in figures {
            let per = per as f64 / mib as f64;
            assert!((per - 1.0).abs() < 0.01, "{per} MiB/step");
        }
    }

    /// The trainer's first reading, 4 s in: before it, its figure was what
    /// it wrote since first seen; after it, its share of everything, 5 MiB
    /// less. The growth per step is read from the readings after it.
    #[test]
    fn the_first_reading_of_a_process_sets_the_earlier_readings_aside() {
        let mut t = ProgressTracker::new();
        let mib = 1u64 << 20;
        for tick in 1..=14u64 {
            let step = tick * 20;
            feed(&mut t, &format!("step {step}/9000"), tick as f64);
            t.unread(usize::from(tick <= 4));
            let base = if tick <= 4 { 19 * mib } else { 14 * mib };
            let used = base + step * mib;
            t.observe_memory(used, Some(8192 * mib - used), tick as f64);
            // Every figure stated along the way.
            if let Some(per) = t.current().and_then(|c| c.bytes_per_step) {
                let per = per as f64 / mib as f64;
                assert!((per - 1.0).abs() < 0.005, "tick {tick}: {per} MiB/step");
            }
        }
        assert!(t.current().is_some_and(|c| c.bytes_per_step.is_some()));
    }

    /// Two sources of one count disagree for a moment (the output's line
    /// read before the companion's older word): no steps are made up.
    #[test]
    fn a_step_told_late_is_not_a_new_count() {
        let mut t = ProgressTracker::new();
        feed(&mut t, "step 350/9000", 1.0);
        feed(&mut t, "step 345/9000", 2.0);
        assert_eq!(t.current().and_then(|c| c.step), Some(350));
        feed(&mut t, "step 365/9000", 3.0);
        feed(&mut t, "step 385/9000", 4.0);
        // 350 to 385: the 5 steps from 345 to 350 are not counted twice.
        assert_eq!(t.advanced, 35);
        // A new epoch's bar is a new count.
        feed(&mut t, "step 2/9000", 5.0);
        assert_eq!(t.advanced, 37);
    }

    /// Memory that grows in steps (an allocator taking 16 MiB every 16
    /// training steps) reads near its mean growth per step.
    #[test]
    fn growth_in_stairs_reads_near_its_mean() {
        let mut t = ProgressTracker::new();
        let mib = 1u64 << 20;
        for step in 1..=64u64 {
            feed(&mut t, &format!("step {step}/9000"), step as f64);
            let used = 1024 * mib + (step / 16) * 16 * mib;
            t.observe_memory(used, Some(8192 * mib - used), step as f64);
        }
        let c = t.current().cloned().unwrap_or_default();
        let per = c.bytes_per_step.unwrap_or(0) as f64 / mib as f64;
        assert!((per - 1.0).abs() < 0.15, "{per} MiB/step");
    }

    #[test]
    fn the_estimate_stays_as_it_was_when_the_job_began_to_exit() {
        let mut t = ProgressTracker::new();
        let mib = 1u64 << 20;
        for step in (0..=100u64).step_by(10) {
            feed(&mut t, &format!("step {step}/2000"), step as f64);
            let used = 4096 * mib + step * mib;
            t.observe_memory(used, Some(8192 * mib - used), step as f64);
        }
        let before = t.current().cloned().unwrap_or_default();
        t.freeze();
        // The teardown: steps still print while memory jumps.
        for step in (110..=150u64).step_by(10) {
            feed(&mut t, &format!("step {step}/2000"), step as f64);
            let used = 4096 * mib + step * 40 * mib;
            t.observe_memory(used, Some((8192 * mib).saturating_sub(used)), step as f64);
        }
        let after = t.current().cloned().unwrap_or_default();
        assert_eq!(after.bytes_per_step, before.bytes_per_step);
        assert_eq!(after.ceiling_step, before.ceiling_step);
        assert_eq!(after.step, Some(150));
    }

    #[test]
    fn a_phase_that_adds_memory_is_flagged_once() {
        let mut t = ProgressTracker::new();
        let mib = 1u64 << 20;
        let ceiling = 8192 * mib;
        feed(
            &mut t,
            "Epoch 1:  50%|█████     | 50/100 [00:05<00:05, 10it/s]",
            1.0,
        );
        assert_eq!(
            t.observe_memory(4096 * mib, Some(ceiling - 4096 * mib), 0.0),
            None
        );
        feed(
            &mut t,
            "Validation DataLoader 0:  10%|█         | 4/40 [00:00<00:03, 11.0it/s]",
            2.0,
        );
        assert_eq!(
            t.observe_memory(4100 * mib, Some(ceiling - 4100 * mib), 0.0),
            None
        );
        let mut flagged = Vec::new();
        for used in [4400, 4700, 4900, 4600] {
            flagged.extend(t.observe_memory(used * mib, Some(ceiling - used * mib), 0.0));
        }
        assert!(flagged.is_empty(), "flagged before the phase ended");
        feed(
            &mut t,
            "Epoch 1:  51%|█████     | 51/100 [00:05<00:05, 10it/s]",
            3.0,
        );
        flagged.extend(t.observe_memory(4600 * mib, Some(ceiling - 4600 * mib), 0.0));
        flagged.extend(t.observe_memory(4600 * mib, Some(ceiling - 4600 * mib), 0.0));
        assert_eq!(flagged.len(), 1, "{flagged:?}");
        assert_eq!(flagged[0].phase, Phase::Validation);
        assert_eq!(flagged[0].added_bytes, 800 * mib);
        assert!(flagged[0].advice().starts_with("validation adds 800 MiB"));
    }

    #[test]
    fn changes_are_reported_once() {
        let mut t = ProgressTracker::new();
        assert!(!t.take_changed());
        feed(&mut t, "step 1/10", 0.0);
        assert!(t.take_changed());
        assert!(!t.take_changed());
        feed(&mut t, "step 1/10", 1.0);
        assert!(!t.take_changed());
        feed(&mut t, "step 2/10", 2.0);
        assert!(t.take_changed());
    }

    #[test]
    fn describe_says_where() {
        let p = Progress {
            step: Some(128),
            total: Some(400),
            epoch: Some("1".into()),
            phase: Some(Phase::Validation),
            ..Progress::default()
        };
        assert_eq!(p.describe(), "epoch 1, validation step 128/400");
    }

    proptest::proptest! {
        #[test]
        fn any_text_is_safe(s in "\\PC{0,200}") {
            let _ = parse(&s);
        }

        #[test]
        fn any_bar_like_text_is_safe(s in "[0-9/|\\[\\]:%.<>━=, a-zA-Z{}'\\x1b]{0,120}") {
            if let Some(u) = parse(&s) {
                let mut t = ProgressTracker::new();
                t.update(u, 0.0);
                let _ = t.observe_memory(1, Some(1), 0.0);
            }
        }

        #[test]
        fn truncated_bars_are_safe(cut in 0usize..120) {
            let line = "Validation DataLoader 0:  30%|███       | 120/400 [00:03<00:07, 38.1it/s]";
            let mut end = cut.min(line.len());
            while !line.is_char_boundary(end) { end -= 1; }
            let _ = parse(&line[..end]);
        }
    }
}
