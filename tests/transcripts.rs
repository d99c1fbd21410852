//! Whole training transcripts through the real binary: each file in
//! `tests/fixtures/transcripts/` (real-format output of tqdm, Lightning, the
//! HF Trainer, Keras and plain loops, with `\r` redraws that never end a
//! line, prints on the other stream and validation phases) is replayed by a
//! small emitter under `oomguard run --log`, and the `progress` the log
//! carries is checked against the transcript's `expect` and `end`
//! directives (see the fixtures' README). The `noise` transcript holds only
//! lines that look like progress and are not: nothing of it may become
//! progress.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{read_log, schema};

/// Replays a transcript: one directive a line, every write flushed, so
/// oomguard sees the bytes as a live job writes them (a bar's newest state
/// usually arrives alone, without its terminator).
const EMITTER: &str = r##"
import sys, time
path, pause = sys.argv[1], float(sys.argv[2])
streams = {"o": sys.stdout, "e": sys.stderr}
EIGHTHS = " ▏▎▍▌▋▊▉"

def tqdm_fill(frac):
    cells = frac * 10
    full = min(int(cells), 10)
    s = "█" * full
    if full < 10:
        s += EIGHTHS[int((cells - full) * 8)] + " " * (9 - full)
    return s

def keras_fill(frac):
    done = min(int(frac * 30), 30)
    return "=" * 30 if done == 30 else "=" * done + ">" + "." * (29 - done)

def expand(text, n=None, total=None):
    text = text.replace("\\e", "\x1b").replace("\\t", "\t")
    if n is None:
        return text
    frac = n / total if total else 0.0
    return text.format(n=n, total=total, pct=int(100 * frac),
                       fill=tqdm_fill(frac), keras=keras_fill(frac))

def write(stream, s):
    streams[stream].write(s)
    streams[stream].flush()

for raw in open(path, encoding="utf-8"):
    line = raw.rstrip("\n")
    if not line or line.startswith("#"):
        continue
    verb, _, text = line.partition(" ")
    if verb in ("o", "e"):
        write(verb, expand(text) + "\n")
    elif verb in ("or", "er"):
        write(verb[0], "\r" + expand(text))
    elif verb in ("on", "en"):
        write(verb[0], "\n")
    elif verb[1:] in ("bar", "loop"):
        a, b, by, total, tpl = text.split(" ", 4)
        ns = range(int(a), int(b) + 1, int(by))
        pace = min(0.002, 0.3 / max(len(ns), 1))
        for n in ns:
            s = expand(tpl, n, int(total))
            write(verb[0], "\r" + s if verb[1:] == "bar" else s + "\n")
            time.sleep(pace)
    elif verb in ("expect", "pause"):
        time.sleep(pause)
    elif verb not in ("end", "never"):
        sys.exit(f"unknown directive {verb!r}")
"##;

/// Seconds the emitter waits at an `expect`: several sampling intervals.
const PAUSE: &str = "0.6";

/// Where a transcript says the job is.
#[derive(Debug, Default, PartialEq)]
struct Want {
    step: Option<u64>,
    total: Option<u64>,
    epoch: Option<String>,
    phase: Option<String>,
}

impl Want {
    fn matches(&self, p: &schema::Progress) -> bool {
        self.step == p.step
            && self.total == p.total
            && self.epoch == p.epoch
            && self.phase == p.phase
    }
}

/// `step=580 total=1288 epoch=- phase=train [rate=yes]`.
fn parse_want(args: &str) -> (Want, bool) {
    let mut want = Want::default();
    let mut rate = false;
    for kv in args.split_whitespace() {
        let (k, v) = kv
            .split_once('=')
            .unwrap_or_else(|| panic!("bad expectation {kv:?}"));
        let v = (v != "-").then(|| v.to_string());
        match k {
            "step" => want.step = v.map(|v| v.parse().unwrap()),
            "total" => want.total = v.map(|v| v.parse().unwrap()),
            "epoch" => want.epoch = v,
            "phase" => want.phase = v,
            "rate" => rate = v.as_deref() == Some("yes"),
            _ => panic!("unknown key {k:?}"),
        }
    }
    (want, rate)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/transcripts")
        .join(format!("{name}.txt"))
}

fn has_python() -> bool {
    std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success())
}

/// Replays the transcript under oomguard and checks the log against it.
fn replay(name: &str) {
    if !common::require(has_python(), "python3 is not installed") {
        return;
    }
    let path = fixture(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let emitter = common::script(dir.path(), "emit.py", EMITTER);
    let log = dir.path().join("run.ndjson");
    let out = common::oomguard()
        .args(["run", "--no-gpu", "--interval", "100ms", "--log"])
        .arg(&log)
        .args(["--", "python3"])
        .arg(&emitter)
        .arg(&path)
        .arg(PAUSE)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{name}: stderr:\n{err}");
    let lines = read_log(&log);
    schema::check_envelope(&lines);

    // What the samples said, in order: a sample carries progress when it
    // moved.
    let seen: Vec<&schema::Progress> = lines
        .iter()
        .filter(|l| matches!(l.event, schema::Event::Sample(_)))
        .filter_map(|l| l.progress.as_ref())
        .collect();
    let show = |seen: &[&schema::Progress]| {
        seen.iter()
            .map(|p| format!("{:?}/{:?} e{:?} {:?}", p.step, p.total, p.epoch, p.phase))
            .collect::<Vec<_>>()
            .join("\n  ")
    };
    assert!(
        text.lines().any(|l| l.starts_with("end ")),
        "{name}: the transcript has no `end`"
    );
    let mut from = 0;
    for directive in text.lines() {
        if let Some(args) = directive.strip_prefix("expect ") {
            let (want, _) = parse_want(args);
            let Some(i) = seen[from..].iter().position(|p| want.matches(p)) else {
                panic!(
                    "{name}: no sample after the previous expectation carries {want:?}; samples carried:\n  {}",
                    show(&seen)
                );
            };
            from += i + 1;
        } else if let Some(args) = directive.strip_prefix("never ") {
            // Any line, any time: the given fields must never all match.
            let (never, _) = parse_want(args);
            let bad = |p: &schema::Progress| {
                never.step.is_none_or(|s| p.step == Some(s))
                    && never.total.is_none_or(|t| p.total == Some(t))
                    && never
                        .epoch
                        .as_ref()
                        .is_none_or(|e| p.epoch.as_ref() == Some(e))
                    && never
                        .phase
                        .as_ref()
                        .is_none_or(|ph| p.phase.as_ref() == Some(ph))
            };
            let found: Vec<_> = lines
                .iter()
                .filter_map(|l| l.progress.as_ref())
                .filter(|p| bad(p))
                .collect();
            assert!(found.is_empty(), "{name}: the log carries {found:?}");
        } else if directive == "end none" {
            let with: Vec<_> = lines.iter().filter(|l| l.progress.is_some()).collect();
            assert!(
                with.is_empty(),
                "{name}: lines that are not progress became progress: {:?}",
                with.iter().map(|l| &l.progress).collect::<Vec<_>>()
            );
        } else if let Some(args) = directive.strip_prefix("end ") {
            let (want, rate) = parse_want(args);
            let end = lines.last().unwrap();
            assert!(matches!(end.event, schema::Event::RunEnd(_)));
            let p = end
                .progress
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: run_end carries no progress"));
            assert!(
                want.matches(p),
                "{name}: run_end carries {p:?}, the job ended at {want:?}"
            );
            if rate {
                assert!(
                    p.steps_per_second.is_some_and(|r| r > 0.0),
                    "{name}: no rate: {p:?}"
                );
            }
        }
    }
}

#[test]
fn tqdm_with_a_description_and_an_eval_bar() {
    let _machine = common::machine::beside();
    replay("tqdm");
}

#[test]
fn lightning_sanity_training_validation_test_and_predict() {
    let _machine = common::machine::beside();
    replay("lightning");
}

#[test]
fn hf_trainer_bars_and_log_dicts() {
    let _machine = common::machine::beside();
    replay("hf_trainer");
}

#[test]
fn keras_2() {
    let _machine = common::machine::beside();
    replay("keras");
}

#[test]
fn keras_3() {
    let _machine = common::machine::beside();
    replay("keras3");
}

#[test]
fn plain_imagenet_example() {
    let _machine = common::machine::beside();
    replay("plain_imagenet");
}

#[test]
fn plain_mnist_example() {
    let _machine = common::machine::beside();
    replay("plain_mnist");
}

#[test]
fn plain_epoch_step_val_step_and_iter() {
    let _machine = common::machine::beside();
    replay("plain_steps");
}

#[test]
fn plain_nanogpt() {
    let _machine = common::machine::beside();
    replay("plain_nanogpt");
}

#[test]
fn lines_that_only_look_like_progress_never_become_progress() {
    let _machine = common::machine::beside();
    replay("noise");
}

/// 100 MB of one tqdm bar redrawn with `\r`, never ending a line, then the
/// final state on a line of its own; the number of the last state goes to
/// the file named by the first argument.
const REDRAWS: &str = r##"
import sys
out = sys.stdout.buffer
n = written = 0
while written < 100_000_000:
    parts = []
    for _ in range(10_000):
        n += 1
        parts.append(b"\rEpoch 1: %3d%%|#         | %d/3000000 [00:01<00:02, 50.00it/s]" % (n * 100 // 3000000, n))
    block = b"".join(parts)
    out.write(block)
    written += len(block)
out.write(b"\n")
out.flush()
open(sys.argv[1], "w").write(str(n))
"##;

/// oomguard's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[test]
fn serial_a_100_mb_redrawn_bar_with_no_newline_keeps_memory_bounded() {
    let _serial = common::machine::beside();
    if !common::require(has_python(), "python3 is not installed") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let job = common::script(dir.path(), "redraw.py", REDRAWS);
    let last = dir.path().join("last");
    let log = dir.path().join("run.ndjson");
    let mut child = common::oomguard()
        .args(["run", "--no-gpu", "--log"])
        .arg(&log)
        .args(["--", "python3"])
        .arg(&job)
        .arg(&last)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0;
    let status = loop {
        if let Some(kib) = peak_rss_kib(pid) {
            peak = peak.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    // The queue to the destination (1 MiB), a read (1 MiB), a line cut at
    // 16 KiB, and the binary itself: far below the 100 MB that went by.
    assert!(peak > 0, "VmHWM was never read");
    assert!(peak < 40 << 10, "oomguard's peak RSS {peak} KiB");
    // Every byte was scanned: the log ends at the last state.
    let n: u64 = std::fs::read_to_string(&last).unwrap().parse().unwrap();
    let lines = read_log(&log);
    let p = lines.last().unwrap().progress.as_ref().unwrap();
    assert_eq!((p.step, p.total), (Some(n), Some(3_000_000)));
    assert_eq!(p.epoch.as_deref(), Some("1"));
}
