//! Reading the live kernel log: `/dev/kmsg`, then `dmesg`, then `journalctl -k`.
//!
//! This module owns getting the kernel's messages off the running machine
//! as text that [`crate::vocab::forensics::kernel::parse`] understands, optionally
//! only the recent ones. It does no parsing of OOM reports itself.
//!
//! `/dev/kmsg` is preferred: it needs no external tool, and a fresh reader
//! starts at the oldest record still in the ring buffer. It is read
//! non-blocking until `EAGAIN`, so the call returns at the current end of
//! the log instead of waiting for new records. When it cannot be read
//! (typically `kernel.dmesg_restrict=1` without `CAP_SYSLOG`, or a container
//! without the device), `dmesg` and then `journalctl -k` are tried, each
//! under a time limit so that a hung tool cannot block the supervisor.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The kernel log device.
pub const KMSG_PATH: &str = "/dev/kmsg";

/// How long `dmesg` or `journalctl` may run before they are stopped.
const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// A record is at most about 8 KiB (text plus dictionary); a read with a
/// smaller buffer fails with `EINVAL`, so leave room.
const RECORD_BUFFER: usize = 16 * 1024;

/// Upper bound on reads from `/dev/kmsg` in one call: the ring buffer holds
/// far fewer records, so this only stops a reader that a flood of new
/// messages would otherwise keep busy forever.
const MAX_KMSG_READS: usize = 1_000_000;

/// Where the kernel log was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    /// The `/dev/kmsg` device.
    Kmsg,
    /// The `dmesg` command.
    Dmesg,
    /// `journalctl -k` (kernel messages of the current boot).
    Journal,
}

impl fmt::Display for LogSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogSource::Kmsg => KMSG_PATH,
            LogSource::Dmesg => "dmesg",
            LogSource::Journal => "journalctl -k",
        })
    }
}

/// The kernel log as read from the running machine.
#[derive(Debug)]
pub struct KernelLog {
    /// One message per line, prefixed with the printk timestamp
    /// (`[  sec.usec] message`; journalctl lines keep their `host kernel:`
    /// tag). Ready for [`crate::vocab::forensics::kernel::parse`].
    pub text: String,
    /// Which source produced `text`.
    pub source: LogSource,
    /// Why the sources tried before `source` failed (empty when the first
    /// one worked), for a diagnostic note.
    pub skipped: Vec<SourceError>,
}

/// Why one source of the kernel log could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The device or file could not be opened.
    #[error("cannot open {}: {error}", path.display())]
    Open {
        /// The path that was opened.
        path: PathBuf,
        /// The error from `open`.
        error: io::Error,
    },
    /// Reading the device failed with something other than the end of the
    /// log or lost records.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        /// The path that was read.
        path: PathBuf,
        /// The error from `read`.
        error: io::Error,
    },
    /// The command could not be started.
    #[error("cannot run `{command}`: {error}")]
    Spawn {
        /// The command line.
        command: String,
        /// The error from spawning it.
        error: io::Error,
    },
    /// The command ran longer than allowed and was killed.
    #[error("`{command}` did not finish within {} s and was stopped", timeout.as_secs_f64())]
    TimedOut {
        /// The command line.
        command: String,
        /// The time it was given.
        timeout: Duration,
    },
    /// The command exited unsuccessfully.
    #[error("`{command}` failed ({status}){}", stderr_note(stderr))]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// The command succeeded but printed no kernel message at all (a
    /// journal without kernel messages, or hidden from this user).
    #[error("`{command}` printed no kernel messages{}", stderr_note(stderr))]
    Empty {
        /// The command line.
        command: String,
        /// What it printed besides messages, on either stream (trimmed).
        stderr: String,
    },
}

fn stderr_note(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

impl SourceError {
    /// Whether the failure means "not allowed" rather than "not there".
    pub fn is_permission_denied(&self) -> bool {
        match self {
            SourceError::Open { error, .. } | SourceError::Read { error, .. } => {
                error.kind() == io::ErrorKind::PermissionDenied
                    || error.raw_os_error() == Some(libc::EPERM)
            }
            SourceError::Failed { stderr, .. } | SourceError::Empty { stderr, .. } => {
                let lower = stderr.to_ascii_lowercase();
                [
                    "not permitted",
                    "permission denied",
                    "insufficient permissions",
                ]
                .iter()
                .any(|needle| lower.contains(needle))
            }
            SourceError::Spawn { .. } | SourceError::TimedOut { .. } => false,
        }
    }
}

/// No source of the kernel log could be read.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    /// At least one source exists but this user may not read it.
    #[error(
        "reading the kernel log is not permitted ({}). Run as root, or `sudo sysctl kernel.dmesg_restrict=0`, or pass the saved log as a file: `sudo dmesg > k.log; oomguard forensics k.log`",
        list(attempts)
    )]
    NotPermitted {
        /// Every source tried, in order, with its failure.
        attempts: Vec<SourceError>,
    },
    /// No source is available on this machine.
    #[error(
        "cannot read the kernel log ({}). Pass a saved log as a file instead: `dmesg > k.log; oomguard forensics k.log`",
        list(attempts)
    )]
    Unavailable {
        /// Every source tried, in order, with its failure.
        attempts: Vec<SourceError>,
    },
}

fn list(attempts: &[SourceError]) -> String {
    attempts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Reads the kernel log of the running machine, from `/dev/kmsg`, or
/// `dmesg`, or `journalctl -k`, whichever works first.
///
/// With `since`, only records newer than now − `since` are returned,
/// compared on the kernel's monotonic clock (CLOCK_MONOTONIC from
/// `/proc/timer_list` when readable, else `/proc/uptime`, which also counts
/// time spent suspended and then makes the window too short after a
/// suspend). After a kill, `read_kernel_log(Some(Duration::from_secs(120)))`
/// is a cheap way to fetch just its report.
pub fn read_kernel_log(since: Option<Duration>) -> Result<KernelLog, KmsgError> {
    read_with(&Sources::system(), since)
}

/// The sources to try and how; tests point them at fakes.
#[derive(Debug, Clone)]
struct Sources {
    kmsg: PathBuf,
    dmesg: Vec<String>,
    journal: Vec<String>,
    timeout: Duration,
}

impl Sources {
    fn system() -> Self {
        Sources {
            kmsg: PathBuf::from(KMSG_PATH),
            dmesg: vec!["dmesg".to_owned()],
            journal: ["journalctl", "-k", "-o", "short-monotonic", "--no-pager"]
                .map(str::to_owned)
                .to_vec(),
            timeout: TOOL_TIMEOUT,
        }
    }
}

fn read_with(sources: &Sources, since: Option<Duration>) -> Result<KernelLog, KmsgError> {
    // Microseconds on the printk clock below which records are too old.
    let cutoff_us = since.map(|window| {
        let now = monotonic_now().unwrap_or(Duration::MAX);
        now.saturating_sub(window).as_micros()
    });
    let mut skipped = Vec::new();

    match read_kmsg(&sources.kmsg, cutoff_us) {
        Ok(text) => {
            return Ok(KernelLog {
                text,
                source: LogSource::Kmsg,
                skipped,
            });
        }
        Err(e) => skipped.push(e),
    }
    for (argv, source) in [
        (&sources.dmesg, LogSource::Dmesg),
        (&sources.journal, LogSource::Journal),
    ] {
        match run_tool(argv, sources.timeout).and_then(|out| keep_recent(argv, out, cutoff_us)) {
            Ok(text) => {
                return Ok(KernelLog {
                    text,
                    source,
                    skipped,
                });
            }
            Err(e) => skipped.push(e),
        }
    }
    if skipped.iter().any(SourceError::is_permission_denied) {
        Err(KmsgError::NotPermitted { attempts: skipped })
    } else {
        Err(KmsgError::Unavailable { attempts: skipped })
    }
}

/// Reads every record from the oldest in the ring buffer to the current end.
fn read_kmsg(path: &Path, cutoff_us: Option<u128>) -> Result<String, SourceError> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|error| SourceError::Open {
            path: path.to_owned(),
            error,
        })?;
    let mut buf = vec![0u8; RECORD_BUFFER];
    let mut out = String::new();
    for _ in 0..MAX_KMSG_READS {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => append_record(&buf[..n], cutoff_us, &mut out),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // Records were overwritten before we read them: the next read
            // continues at the oldest one still there.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                return Err(SourceError::Read {
                    path: path.to_owned(),
                    error,
                });
            }
        }
    }
    Ok(out)
}

/// Appends one `/dev/kmsg` record (`prio,seq,usec,flags[,…];text\n` plus
/// ` KEY=value` dictionary lines) as a dmesg-style line.
fn append_record(record: &[u8], cutoff_us: Option<u128>, out: &mut String) {
    let record = String::from_utf8_lossy(record);
    let first = record.lines().next().unwrap_or("");
    let Some((header, message)) = first.split_once(';') else {
        return;
    };
    let Some(usec) = header.split(',').nth(2).and_then(|f| f.parse::<u64>().ok()) else {
        return;
    };
    if cutoff_us.is_some_and(|cutoff| u128::from(usec) < cutoff) {
        return;
    }
    out.push_str(&format!(
        "[{:>5}.{:06}] {message}\n",
        usec / 1_000_000,
        usec % 1_000_000
    ));
}

/// Keeps the lines of a `dmesg` / `journalctl -o short-monotonic` output
/// whose leading `[sec.usec]` is at or after the cutoff. Lines without a
/// stamp follow the decision for the line before them.
fn keep_recent(
    argv: &[String],
    out: ToolOutput,
    cutoff_us: Option<u128>,
) -> Result<String, SourceError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut noise = Vec::new();
    let mut kept = String::new();
    let mut any_record = false;
    let mut keep = cutoff_us.is_none();
    for line in stdout.lines() {
        // journalctl's own notes (`-- No entries --`, `Hint: …`).
        if line.starts_with("-- ") || line.starts_with("Hint: ") {
            noise.push(line.trim());
            continue;
        }
        if let Some(us) = leading_uptime_us(line) {
            any_record = true;
            keep = cutoff_us.is_none_or(|cutoff| us >= cutoff);
        }
        if keep {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    if !any_record {
        let stderr = String::from_utf8_lossy(&out.stderr);
        noise.push(stderr.trim());
        noise.retain(|n| !n.is_empty());
        return Err(SourceError::Empty {
            command: argv.join(" "),
            stderr: noise.join(" "),
        });
    }
    Ok(kept)
}

fn leading_uptime_us(line: &str) -> Option<u128> {
    let inner = line.trim_start().strip_prefix('[')?;
    let (stamp, _) = inner.split_once(']')?;
    let (secs, frac) = stamp.trim().split_once('.')?;
    let secs: u128 = secs.parse().ok()?;
    if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Scale any number of fraction digits to microseconds.
    let mut micros: u128 = 0;
    for b in frac.bytes().chain(std::iter::repeat(b'0')).take(6) {
        micros = micros * 10 + u128::from(b - b'0');
    }
    secs.checked_mul(1_000_000)?.checked_add(micros)
}

/// What a finished command printed.
struct ToolOutput {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs `argv` with a time limit. Output is drained by threads so that a
/// full pipe cannot stall the tool, and on timeout only our own child is
/// killed.
fn run_tool(argv: &[String], timeout: Duration) -> Result<ToolOutput, SourceError> {
    let command = argv.join(" ");
    let Some((program, args)) = argv.split_first() else {
        return Err(SourceError::Spawn {
            command,
            error: io::Error::new(io::ErrorKind::InvalidInput, "empty command"),
        });
    };
    let mut child = Command::new(program)
        .args(args)
        // Messages we match (permission errors) are in English only under C.
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| SourceError::Spawn {
            command: command.clone(),
            error,
        })?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status: ExitStatus = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SourceError::TimedOut { command, timeout });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(error) => return Err(SourceError::Spawn { command, error }),
        }
    };
    // A grandchild could hold the pipes open after the tool exits; do not
    // wait for it beyond the deadline.
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    let stdout = stdout.recv_timeout(remaining).unwrap_or_default();
    let stderr = stderr.recv_timeout(remaining).unwrap_or_default();
    if !status.success() {
        return Err(SourceError::Failed {
            command,
            status: status.to_string(),
            stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
        });
    }
    Ok(ToolOutput { stdout, stderr })
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// Now on the printk clock, as closely as safe code can read it.
///
/// printk stamps records with the scheduler clock, which like
/// CLOCK_MONOTONIC stops during suspend. `/proc/timer_list` prints
/// CLOCK_MONOTONIC (`now at N nsecs`) but only root may read it;
/// `/proc/uptime` is CLOCK_BOOTTIME, which keeps counting while suspended.
fn monotonic_now() -> Option<Duration> {
    timer_list_now().or_else(uptime_now)
}

fn timer_list_now() -> Option<Duration> {
    let mut head = vec![0u8; 4096];
    let mut file = File::open("/proc/timer_list").ok()?;
    let n = file.read(&mut head).ok()?;
    let head = String::from_utf8_lossy(&head[..n]);
    let line = head.lines().find_map(|l| l.strip_prefix("now at "))?;
    let nanos: u64 = line.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

fn uptime_now() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/uptime").ok()?;
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    Duration::try_from_secs_f64(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()]
    }

    fn fake_sources(dmesg: &str, journal: &str) -> Sources {
        Sources {
            kmsg: PathBuf::from("/nonexistent/oomguard-test/kmsg"),
            dmesg: sh(dmesg),
            journal: sh(journal),
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn kmsg_records_become_dmesg_lines() {
        let mut out = String::new();
        append_record(b"6,1234,5003001,-;hello world\n", None, &mut out);
        append_record(
            b"3,1235,6000000,-,caller=T12;Out of memory: Killed process 1 (x)\n SUBSYSTEM=mem\n DEVICE=+x\n",
            None,
            &mut out,
        );
        append_record(b"garbage without header", None, &mut out);
        assert_eq!(
            out,
            "[    5.003001] hello world\n[    6.000000] Out of memory: Killed process 1 (x)\n"
        );
    }

    #[test]
    fn kmsg_cutoff_drops_old_records() {
        let mut out = String::new();
        append_record(b"6,1,1000000,-;old\n", Some(2_000_000), &mut out);
        append_record(b"6,2,2000000,-;new\n", Some(2_000_000), &mut out);
        assert_eq!(out, "[    2.000000] new\n");
    }

    #[test]
    fn uptime_prefix_is_read_in_microseconds() {
        assert_eq!(leading_uptime_us("[    5.003001] x"), Some(5_003_001));
        assert_eq!(leading_uptime_us("[12.5] x"), Some(12_500_000));
        assert_eq!(leading_uptime_us("[ 1.1234567] x"), Some(1_123_456));
        assert_eq!(leading_uptime_us("[  pid  ] x"), None);
        assert_eq!(leading_uptime_us("no stamp"), None);
        let huge = format!("[{}.0] x", u128::MAX);
        assert_eq!(leading_uptime_us(&huge), None);
    }

    #[test]
    fn falls_back_to_dmesg_and_filters_by_time() {
        let sources = fake_sources(
            "printf '[    1.000000] old\\n continuation\\n[99999999.000000] new\\n'",
            "exit 1",
        );
        let all = read_with(&sources, None).expect("dmesg fallback");
        assert_eq!(all.source, LogSource::Dmesg);
        assert_eq!(all.skipped.len(), 1);
        assert!(matches!(all.skipped[0], SourceError::Open { .. }));
        assert!(all.text.contains("old\n continuation\n"));

        // Everything but the line from the far future is older than a minute.
        let recent = read_with(&sources, Some(Duration::from_secs(60))).expect("dmesg");
        assert_eq!(recent.text, "[99999999.000000] new\n");
    }

    #[test]
    fn falls_back_to_journal_when_dmesg_hangs() {
        let mut sources = fake_sources(
            "sleep 5",
            "echo '-- Journal begins --'; echo '[    3.000000] host kernel: hi'",
        );
        sources.timeout = Duration::from_millis(300);
        let started = Instant::now();
        let log = read_with(&sources, None).expect("journal fallback");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "hung tool was not stopped"
        );
        assert_eq!(log.source, LogSource::Journal);
        assert!(matches!(log.skipped[1], SourceError::TimedOut { .. }));
        assert_eq!(log.text, "[    3.000000] host kernel: hi\n");
    }

    #[test]
    fn restricted_log_gives_actionable_error() {
        let sources = fake_sources(
            "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1",
            "echo '-- No entries --'; echo 'No journal files were opened due to insufficient permissions.' >&2",
        );
        let err = read_with(&sources, None).expect_err("nothing readable");
        assert!(matches!(err, KmsgError::NotPermitted { .. }), "{err:?}");
        let msg = err.to_string();
        for needle in [
            "/nonexistent/oomguard-test/kmsg",
            "read kernel buffer failed: Operation not permitted",
            "insufficient permissions",
            "run as root",
            "sudo sysctl kernel.dmesg_restrict=0",
            "oomguard forensics k.log",
        ] {
            assert!(
                msg.to_lowercase().contains(&needle.to_lowercase()),
                "{needle:?} missing in {msg}"
            );
        }
    }

    #[test]
    fn missing_tools_are_unavailable_not_forbidden() {
        let sources = Sources {
            kmsg: PathBuf::from("/nonexistent/oomguard-test/kmsg"),
            dmesg: vec!["/nonexistent/oomguard-test/dmesg".to_owned()],
            journal: vec!["/nonexistent/oomguard-test/journalctl".to_owned()],
            timeout: Duration::from_secs(1),
        };
        let err = read_with(&sources, None).expect_err("nothing there");
        assert!(matches!(err, KmsgError::Unavailable { ref attempts } if attempts.len() == 3));
        assert!(
            err.to_string()
                .contains("cannot run `/nonexistent/oomguard-test/dmesg`")
        );
    }

    #[test]
    fn monotonic_clock_is_readable() {
        let now = monotonic_now().expect("a monotonic clock");
        assert!(now > Duration::ZERO);
    }
}
