//! The runs one log file holds. `oomguard run --log FILE` appends to FILE,
//! so a job run again (a requeue, a resume) adds its run after the one that
//! explains why it had to: each run begins with its `run_start` line. Its
//! readers (`report`, `replay`) take one run at a time; this finds where
//! each begins and ends, in one pass that holds no line, and hands them the
//! bytes of the one they asked for.

use std::io::{self, BufRead, Read, Seek, SeekFrom};
use std::path::Path;

/// What `"event":"run_start"` looks like in the lines oomguard writes: the
/// envelope's second field, well within the first bytes of the line.
const RUN_START: &[u8] = b"\"event\":\"run_start\"";
/// How much of a line's start is searched for [`RUN_START`].
const HEAD_BYTES: usize = 256;

/// Which run of a log to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunPick {
    /// The newest (the default: the run that just ended).
    #[default]
    Last,
    /// The n-th, counting from 1.
    Nth(usize),
}

impl RunPick {
    /// `--run N` (from 1), or the last without it.
    pub fn from_arg(n: Option<u64>) -> Self {
        n.map_or(RunPick::Last, |n| {
            RunPick::Nth(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }
}

/// One run's bytes in the file, and the number of its first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSpan {
    pub start: u64,
    pub len: u64,
    pub first_line: usize,
}

/// A run asked for that the log does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the log holds {of} run{}: there is no run {asked} (--run 1 to --run {of})", if *.of == 1 { "" } else { "s" })]
pub struct NoSuchRun {
    pub asked: usize,
    pub of: usize,
}

/// Where each run of `input` begins and ends: at each `run_start` line.
/// Lines before the first `run_start` (a log cut at its head) are a run of
/// their own; a log without one is one run.
pub fn spans(mut input: impl BufRead) -> io::Result<Vec<RunSpan>> {
    let mut starts: Vec<(u64, usize)> = Vec::new();
    let (mut at, mut line) = (0u64, 0usize);
    let mut head: Vec<u8> = Vec::with_capacity(HEAD_BYTES);
    let mut line_start = 0u64;
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let (chunk, ends_line) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = HEAD_BYTES.saturating_sub(head.len());
        head.extend_from_slice(&buf[..chunk.min(room)]);
        input.consume(chunk);
        at += chunk as u64;
        if ends_line {
            line += 1;
            if is_run_start(&head) {
                starts.push((line_start, line));
            }
            head.clear();
            line_start = at;
        }
    }
    if !head.is_empty() {
        line += 1;
        if is_run_start(&head) {
            starts.push((line_start, line));
        }
    }
    // Lines before the first run_start are the tail of a run whose start
    // is gone (a log cut at its head): a run of their own.
    if starts.first().is_none_or(|&(s, _)| s > 0) {
        starts.insert(0, (0, 1));
    }
    let ends: Vec<u64> = starts.iter().skip(1).map(|s| s.0).chain([at]).collect();
    Ok(starts
        .iter()
        .zip(ends)
        .map(|(&(start, first_line), end)| RunSpan {
            start,
            len: end - start,
            first_line,
        })
        .collect())
}

fn is_run_start(head: &[u8]) -> bool {
    head.first() == Some(&b'{') && head.windows(RUN_START.len()).any(|w| w == RUN_START)
}

/// Whether the log's last byte is not a newline (an empty file is not):
/// a run killed mid-write, whose cut line the next run must not continue.
pub(super) fn ends_mid_line(f: &mut std::fs::File) -> io::Result<bool> {
    if f.metadata()?.len() == 0 {
        return Ok(false);
    }
    f.seek(SeekFrom::End(-1))?;
    let mut last = [0u8; 1];
    f.read_exact(&mut last)?;
    Ok(last[0] != b'\n')
}

/// The run `pick` names among `spans`: its number (from 1) and its span.
pub fn pick(spans: &[RunSpan], pick: RunPick) -> Result<(usize, RunSpan), NoSuchRun> {
    let of = spans.len();
    let n = match pick {
        RunPick::Last => of,
        RunPick::Nth(n) => n,
    };
    match n.checked_sub(1).and_then(|i| spans.get(i)) {
        Some(s) => Ok((n, *s)),
        None => Err(NoSuchRun { asked: n, of }),
    }
}

/// The bytes of one run of a seekable log: positioned at its start,
/// reading no further than its end.
pub fn open_run<R: Read + Seek>(mut file: R, span: RunSpan) -> io::Result<io::Take<R>> {
    file.seek(SeekFrom::Start(span.start))?;
    Ok(file.take(span.len))
}

/// Why a run of a log could not be had.
#[derive(Debug, thiserror::Error)]
pub enum OpenRunError {
    #[error(transparent)]
    Read(#[from] io::Error),
    #[error(transparent)]
    NoSuchRun(#[from] NoSuchRun),
}

/// One run of a log, ready to read.
pub struct OpenRun {
    pub reader: Box<dyn BufRead>,
    /// Which run it is (from 1), and how many the log holds.
    pub index: usize,
    pub of: usize,
}

/// Run `which` of the log at `path`; `-` is stdin, held in memory to find
/// its runs (a file is read twice instead: once to find them).
pub fn open(path: &Path, which: RunPick) -> Result<OpenRun, OpenRunError> {
    if path == Path::new("-") {
        let mut bytes = Vec::new();
        io::stdin().lock().read_to_end(&mut bytes)?;
        let all = spans(bytes.as_slice())?;
        let (index, span) = pick(&all, which)?;
        let end = (span.start + span.len) as usize;
        let run = bytes
            .get(span.start as usize..end)
            .unwrap_or_default()
            .to_vec();
        return Ok(OpenRun {
            reader: Box::new(io::Cursor::new(run)),
            index,
            of: all.len(),
        });
    }
    let file = std::fs::File::open(path)?;
    let all = spans(io::BufReader::with_capacity(1 << 16, &file))?;
    let (index, span) = pick(&all, which)?;
    let run = open_run(file, span)?;
    Ok(OpenRun {
        reader: Box::new(io::BufReader::with_capacity(1 << 16, run)),
        index,
        of: all.len(),
    })
}

/// How many runs the log at `path` holds (a file only: 1 for stdin, which
/// can be read once).
pub fn count(path: &Path) -> io::Result<usize> {
    if path == Path::new("-") {
        return Ok(1);
    }
    let file = std::fs::File::open(path)?;
    Ok(spans(io::BufReader::with_capacity(1 << 16, file))?.len())
}

/// Claims the log for this oomguard: two appending to one file interleave
/// their lines (two SLURM tasks of a node given `%N`), so the second is
/// refused. The lock goes with the last descriptor, so a killed oomguard
/// leaves none behind; a file system without locks (some network mounts)
/// is no reason to refuse the log, only a lock another holds is.
pub fn claim(f: &std::fs::File) -> io::Result<()> {
    use rustix::fs::{FlockOperation, flock};
    if flock(f, FlockOperation::NonBlockingLockExclusive) == Err(rustix::io::Errno::WOULDBLOCK) {
        return Err(io::Error::other(
            "another oomguard is writing it; give each its own log \
             (under srun: --log 'logs/%j/run-%r.ndjson', one per task)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(t: u32) -> String {
        format!(r#"{{"schema":"oomguard/1","event":"run_start","t":{t},"attempt":1}}"#)
    }

    fn sample(t: u32) -> String {
        format!(r#"{{"schema":"oomguard/1","event":"sample","t":{t},"attempt":1}}"#)
    }

    fn text_of(spans: &[RunSpan], text: &str, i: usize) -> String {
        let s = spans[i];
        text[s.start as usize..(s.start + s.len) as usize].to_string()
    }

    #[test]
    fn each_run_start_begins_a_run() {
        let run1 = format!("{}\n{}\n", start(0), sample(1));
        let run2 = format!("{}\n{}\n{}\n", start(0), sample(1), sample(2));
        let text = format!("{run1}{run2}");
        let spans = spans(text.as_bytes()).unwrap();
        assert_eq!(spans.len(), 2);
        assert_eq!(text_of(&spans, &text, 0), run1);
        assert_eq!(text_of(&spans, &text, 1), run2);
        assert_eq!((spans[0].first_line, spans[1].first_line), (1, 3));
        assert_eq!(pick(&spans, RunPick::Last).unwrap().0, 2);
        assert_eq!(pick(&spans, RunPick::Nth(1)).unwrap().1, spans[0]);
        let e = pick(&spans, RunPick::Nth(3)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the log holds 2 runs: there is no run 3 (--run 1 to --run 2)"
        );
        assert!(pick(&spans, RunPick::Nth(0)).is_err());
        // Seeking to a run reads that run alone.
        let mut r = open_run(io::Cursor::new(text.as_bytes()), spans[0]).unwrap();
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, run1);
    }

    #[test]
    fn a_log_without_a_run_start_or_cut_short_is_still_read_whole() {
        // The first run's start lost: what comes before the next run_start
        // is a run of its own.
        let text = format!("{}\n{}\n{}", sample(1), start(0), sample(2));
        let s = spans(text.as_bytes()).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(text_of(&s, &text, 0), format!("{}\n", sample(1)));
        // The last line cut short (no newline) is the last run's.
        assert_eq!(
            text_of(&s, &text, 1),
            format!("{}\n{}", start(0), sample(2))
        );
        let s = spans(sample(1).as_bytes()).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(spans(&b""[..]).unwrap().len(), 1);
        // A job's stray line that mentions a run_start far into it, or not
        // as an object, starts nothing.
        let stray = format!("{} {}\nnot json {}\n", "x".repeat(300), start(0), start(0));
        assert_eq!(spans(stray.as_bytes()).unwrap().len(), 1);
    }

    #[test]
    fn a_very_long_line_is_not_held() {
        // A line far longer than the reader's buffer is crossed a chunk at
        // a time; only its first bytes are kept.
        let long = format!("{}{}\n", start(0), " ".repeat(1 << 20));
        let text = format!("{long}{}\n", start(5));
        let s = spans(io::BufReader::with_capacity(4096, text.as_bytes())).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].start, long.len() as u64);
    }
}
