//! The output relay (`relay`) with real processes: the job writes
//! into the relay's pipes or pty, the relay passes the bytes on to
//! destinations the test holds (pipes, a pty standing for the user's
//! terminal) and scans them for PyTorch's messages. Plus the end-to-end
//! shape through `oomguard run`.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oomguard::job::relay::{OutputError, OutputRelay, Pumped, RelayOptions, RelayStats, Stream};
use oomguard::vocab::forensics::torch::{CudaOom, TorchEvent, WorkerDied, size_to_bytes};

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch-errors")
        .join(name);
    let text = fs::read_to_string(&path).unwrap();
    // `# source:` lines are provenance, not output.
    let mut out: String = text
        .lines()
        .filter(|l| !l.starts_with("# source:"))
        .map(|l| format!("{l}\n"))
        .collect();
    if out.is_empty() {
        out.push('\n');
    }
    out
}

const OOM_FIXTURE: &str = "08-torch2.2-2.4-expandable-segments-this-process.txt";
const WORKER_LINE: &str = "RuntimeError: DataLoader worker (pid 123) is killed by signal: Killed.";

fn pipe() -> (OwnedFd, OwnedFd) {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap()
}

/// Reads `fd` to its end on a thread (EOF, or EIO from a pty master).
fn collect(fd: OwnedFd) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut file = fs::File::from(fd);
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        got
    })
}

/// Like `collect`, but the bytes are visible while they arrive.
fn watch(fd: OwnedFd) -> (Arc<Mutex<Vec<u8>>>, JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let h = std::thread::spawn(move || {
        let mut file = fs::File::from(fd);
        let mut buf = [0u8; 4096];
        while let Ok(n) = file.read(&mut buf) {
            if n == 0 {
                break;
            }
            s.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (seen, h)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What a relayed job came to.
struct Relayed {
    relay: OutputRelay,
    status: ExitStatus,
    events: Vec<TorchEvent>,
    errors: Vec<OutputError>,
    stats: RelayStats,
}

/// Runs `cmd` with the relay as its stdout and stderr, pumping as the run
/// loop will, until the output ends; then `finish`.
fn relay_job(opts: RelayOptions, mut cmd: Command) -> Relayed {
    runtime().block_on(async move {
        let (mut relay, stdio) = OutputRelay::new(opts).unwrap();
        cmd.stdout(stdio.stdout)
            .stderr(stdio.stderr)
            .stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        // The Command holds the job's ends too.
        drop(cmd);
        relay.after_spawn();
        let mut events = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !relay.is_closed() {
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::timeout(left, relay.pump())
                .await
                .expect("the job's output never ended");
            events.extend(relay.take_events());
        }
        let status = child.wait().unwrap();
        relay.finish();
        events.extend(relay.take_events());
        let errors = relay.take_errors();
        let stats = relay.stats();
        Relayed {
            relay,
            status,
            events,
            errors,
            stats,
        }
    })
}

fn sh(script: &str) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", script]);
    c
}

fn cuda_ooms(events: &[TorchEvent]) -> Vec<&CudaOom> {
    events
        .iter()
        .filter_map(|e| match e {
            TorchEvent::CudaOom(o) => Some(o),
            _ => None,
        })
        .collect()
}

fn worker_deaths(events: &[TorchEvent]) -> Vec<&WorkerDied> {
    events
        .iter()
        .filter_map(|e| match e {
            TorchEvent::WorkerDied(w) => Some(w),
            _ => None,
        })
        .collect()
}

fn assert_fixture_oom(oom: &CudaOom) {
    assert_eq!(oom.device, Some(0));
    assert_eq!(oom.tried_bytes, Some(22 * MIB));
    assert_eq!(oom.allocated_bytes, size_to_bytes("22.90", "GiB"));
    assert!(oom.reserved_unallocated_bytes.is_some());
    assert!(oom.total_bytes.is_some() && oom.free_bytes.is_some());
}

fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, text).unwrap();
    p
}

// ---------------------------------------------------------------------------
// (1) Pipes: interleaved streams arrive byte for byte; both events found.

#[test]
fn pipes_relay_each_stream_unchanged_and_find_the_events() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let oom_text = fixture(OOM_FIXTURE);
    let oom = write_file(dir.path(), "oom.txt", &oom_text);
    let log = dir.path().join("output.log");
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let (out, err) = (collect(out_r), collect(err_r));
    let script = format!(
        "printf 'step 1\\n'; printf 'warn 1\\n' >&2; printf 'step 2\\n'; \
         cat '{}' >&2; printf 'step 3\\n'; echo '{WORKER_LINE}' >&2; \
         printf 'no newline at the end'",
        oom.display()
    );
    let r = relay_job(
        RelayOptions {
            output_log: Some(log.clone()),
            stdout: Some(out_w),
            stderr: Some(err_w),
            ..Default::default()
        },
        sh(&script),
    );
    assert!(r.status.success());
    assert!(!r.relay.is_pty(Stream::Stdout) && !r.relay.is_pty(Stream::Stderr));
    assert!(r.relay.flush(Duration::from_secs(10)));
    // After the flush everything read has been written.
    let stats = r.relay.stats();
    drop(r.relay);
    let want_out = "step 1\nstep 2\nstep 3\nno newline at the end";
    let want_err = format!("warn 1\n{oom_text}{WORKER_LINE}\n");
    assert_eq!(String::from_utf8(out.join().unwrap()).unwrap(), want_out);
    assert_eq!(String::from_utf8(err.join().unwrap()).unwrap(), want_err);

    // `step N` lines are training progress, read as such.
    let progress: Vec<_> = r
        .events
        .iter()
        .filter_map(|e| match e {
            TorchEvent::Progress(p) => p.step,
            _ => None,
        })
        .collect();
    assert_eq!(progress.last(), Some(&3), "{:?}", r.events);
    let messages = r
        .events
        .iter()
        .filter(|e| !matches!(e, TorchEvent::Progress(_)))
        .count();
    assert_eq!(messages, 2, "{:?}", r.events);
    assert_fixture_oom(cuda_ooms(&r.events)[0]);
    let died = worker_deaths(&r.events);
    assert_eq!(died[0].pid, Some(123));
    assert_eq!(died[0].signal.as_deref(), Some("SIGKILL"));
    assert!(!died[0].shm_hint);

    // The output log has both streams, each in its own order.
    let logged = fs::read_to_string(&log).unwrap();
    assert_eq!(logged.len(), want_out.len() + want_err.len());
    assert!(logged.contains(&oom_text) && logged.contains("no newline at the end"));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(stats.stdout.read_bytes, want_out.len() as u64);
    assert_eq!(stats.stdout.written_bytes, want_out.len() as u64);
    assert_eq!(stats.stderr.written_bytes, want_err.len() as u64);
    assert_eq!(stats.stderr.dropped_bytes, 0);
}

#[test]
fn one_destination_for_both_streams_keeps_the_jobs_interleaving() {
    let _machine = common::machine::beside();
    // oomguard ... > file 2>&1, or 2>&1 | tee: the job gets one channel,
    // so lines alternate exactly as written.
    let (r_end, w_end) = pipe();
    let w2 = rustix::io::fcntl_dupfd_cloexec(&w_end, 3).unwrap();
    let got = collect(r_end);
    let r = relay_job(
        RelayOptions {
            stdout: Some(w_end),
            stderr: Some(w2),
            ..Default::default()
        },
        sh("i=0; while [ $i -lt 200 ]; do echo out $i; echo err $i >&2; i=$((i+1)); done"),
    );
    assert!(r.status.success());
    assert!(r.relay.flush(Duration::from_secs(10)));
    drop(r.relay);
    let want: String = (0..200).map(|i| format!("out {i}\nerr {i}\n")).collect();
    assert_eq!(String::from_utf8(got.join().unwrap()).unwrap(), want);
}

#[test]
fn a_job_that_had_a_pipe_sees_no_terminal() {
    let _machine = common::machine::beside();
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let (out, _err) = (collect(out_r), collect(err_r));
    let r = relay_job(
        RelayOptions {
            stdout: Some(out_w),
            stderr: Some(err_w),
            ..Default::default()
        },
        sh("[ -t 1 ] && echo tty1; [ -t 2 ] && echo tty2; echo done"),
    );
    assert!(r.relay.flush(Duration::from_secs(10)));
    drop(r.relay);
    assert_eq!(out.join().unwrap(), b"done\n");
}

// ---------------------------------------------------------------------------
// (2) A terminal: the job gets a pty of the terminal's size, output arrives
// unchanged, SIGWINCH resizes it, the output log has the bytes.

/// A pty standing for the user's terminal, without output processing, so
/// the test reads exactly what the relay wrote.
fn fake_terminal(cols: u16, rows: u16) -> (OwnedFd, OwnedFd) {
    let (master, slave) = oomguard::sinks::tui::open_pty(cols, rows).unwrap();
    let mut t = rustix::termios::tcgetattr(&slave).unwrap();
    t.output_modes.remove(rustix::termios::OutputModes::OPOST);
    rustix::termios::tcsetattr(&slave, rustix::termios::OptionalActions::Now, &t).unwrap();
    (master, slave)
}

const TTY_JOB: &str = r#"
import os, sys, time
os.write(1, ("tty %s %s\n" % (os.isatty(1), os.isatty(2))).encode())
size = os.get_terminal_size(1)
os.write(1, ("size %d %d\n" % (size.columns, size.lines)).encode())
os.write(2, b"a\nb\r\n\x1b[31mred\x1b[0m\n")
deadline = time.time() + 20
while os.get_terminal_size(1) == size and time.time() < deadline:
    time.sleep(0.01)
size = os.get_terminal_size(2)
os.write(1, ("resized %d %d\n" % (size.columns, size.lines)).encode())
"#;

#[test]
fn a_job_that_had_a_terminal_still_has_one() {
    let _machine = common::machine::beside();
    // oomguard is in a background process group while the job has the
    // terminal, so no SIGWINCH comes: the size poll must see the change.
    terminal_case(false);
}

#[test]
fn sigwinch_resizes_the_jobs_terminal_at_once() {
    let _machine = common::machine::beside();
    // Without a job in the foreground, oomguard gets SIGWINCH itself.
    terminal_case(true);
}

fn terminal_case(by_signal: bool) {
    if !common::require(has_python(), "python3 is not installed") {
        return;
    }
    // The signal case sends SIGWINCH to this whole test process: the poll
    // case, beside it, would see a resize the poll did not find.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("output.log");
    let (term_master, term_slave) = fake_terminal(132, 43);
    let term_slave2 = rustix::io::fcntl_dupfd_cloexec(&term_slave, 3).unwrap();
    let (seen, reader) = watch(term_master.try_clone().unwrap());

    let mut cmd = Command::new("python3");
    cmd.args(["-c", TTY_JOB]);
    let (relay, status) = runtime().block_on(async {
        let (mut relay, stdio) = OutputRelay::new(RelayOptions {
            output_log: Some(log.clone()),
            stdout: Some(term_slave),
            stderr: Some(term_slave2),
            // With the signal, the poll must not be what finds the change.
            size_poll: by_signal.then_some(Duration::from_secs(3600)),
            ..Default::default()
        })
        .unwrap();
        assert!(relay.is_pty(Stream::Stdout) && relay.is_pty(Stream::Stderr));
        cmd.stdout(stdio.stdout)
            .stderr(stdio.stderr)
            .stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        drop(cmd);
        relay.after_spawn();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut resized = false;
        let mut saw_resize = false;
        while !relay.is_closed() {
            let left = deadline.saturating_duration_since(Instant::now());
            let step = left.min(Duration::from_millis(50));
            assert!(!left.is_zero(), "the job never ended");
            if let Ok(p) = tokio::time::timeout(step, relay.pump()).await {
                saw_resize |= p == Pumped::Resized;
            }
            let printed = seen.lock().unwrap().clone();
            if !resized && String::from_utf8_lossy(&printed).contains("red") {
                // The user's terminal changes size.
                oomguard::sinks::tui::set_window_size(&term_master, 100, 30).unwrap();
                if by_signal {
                    rustix::process::kill_process(
                        rustix::process::getpid(),
                        rustix::process::Signal::WINCH,
                    )
                    .unwrap();
                }
                resized = true;
            }
        }
        assert!(saw_resize, "pump never reported the resize");
        let status = child.wait().unwrap();
        relay.finish();
        (relay, status)
    });
    assert!(status.success());
    assert!(relay.flush(Duration::from_secs(10)));
    drop(relay);
    drop(term_master);
    let deadline = Instant::now() + Duration::from_secs(10);
    let want = "tty True True\nsize 132 43\na\nb\r\n\x1b[31mred\x1b[0m\nresized 100 30\n";
    while seen.lock().unwrap().len() < want.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let got = seen.lock().unwrap().clone();
    // Byte for byte: no \r added before \n, none doubled, colours kept.
    assert_eq!(String::from_utf8_lossy(&got), want);
    assert_eq!(fs::read(&log).unwrap(), want.as_bytes());
    drop(reader);
}

fn has_python() -> bool {
    Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success())
}

// ---------------------------------------------------------------------------
// (3) Backpressure. By default the relay behaves as a pipe: a slow reader
// slows the job and gets every byte, a reader that is gone gives the job
// EPIPE. Under `--output-drop` (`drop_when_full`) nobody reading, or a
// reader that is gone, does not hold up the job, and what could not be
// written is counted.

#[test]
fn a_slow_reader_gets_every_byte_in_order() {
    let _machine = common::machine::beside();
    let (out_r, out_w) = pipe();
    let reader = std::thread::spawn(move || {
        // Start reading only long after the job could have written it all.
        std::thread::sleep(Duration::from_millis(1500));
        let mut got = Vec::new();
        fs::File::from(out_r).read_to_end(&mut got).unwrap();
        got
    });
    let started = Instant::now();
    let r = relay_job(
        RelayOptions {
            stdout: Some(out_w),
            max_buffered_bytes: Some(MIB as usize),
            ..Default::default()
        },
        {
            let mut c = Command::new("seq");
            c.args(["1", "1000000"]);
            c
        },
    );
    assert!(r.status.success());
    // About 6.6 MiB cannot fit in the pipes (and, on the copying path, the
    // relay's bound): the job had to wait for the reader.
    assert!(started.elapsed() >= Duration::from_millis(1400));
    assert!(r.relay.flush(Duration::from_secs(10)));
    drop(r.relay);
    let want = Command::new("seq").args(["1", "1000000"]).output().unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got.len(), want.stdout.len());
    assert!(got == want.stdout, "the bytes differ");
    assert_eq!(r.stats.stdout.dropped_bytes, 0, "{:?}", r.stats);
}

/// Both ways bytes travel, a pipe spliced (never copied through oomguard)
/// and a file written by the writer thread: every byte in order, and the
/// scanner still sees every line of both.
#[test]
fn spliced_and_copied_destinations_get_every_byte_and_the_events() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("err.txt");
    let file = fs::File::create(&path).unwrap();
    let (out_r, out_w) = pipe();
    let out = collect(out_r);
    let part = |a: u32, b: u32| (a..=b).map(|i| format!("{i}\n")).collect::<String>();
    let want = format!("{}{WORKER_LINE}\n{}", part(1, 300_000), part(5, 200_000));
    let script = format!(
        "for s in 1 2; do seq 1 300000; echo '{WORKER_LINE}'; seq 5 200000; \
         exec 1>&2; done"
    );
    let r = relay_job(
        RelayOptions {
            stdout: Some(out_w),
            stderr: Some(OwnedFd::from(file)),
            ..Default::default()
        },
        sh(&script),
    );
    assert!(r.status.success());
    assert!(r.relay.splices(Stream::Stdout));
    assert!(!r.relay.splices(Stream::Stderr));
    assert!(r.relay.flush(Duration::from_secs(10)));
    // After the flush: the writer thread may still have been writing.
    let stats = r.relay.stats();
    drop(r.relay);
    for (name, got) in [
        ("pipe", out.join().unwrap()),
        ("file", fs::read(&path).unwrap()),
    ] {
        assert_eq!(got.len(), want.len(), "{name}");
        assert!(got == want.as_bytes(), "{name}: the bytes differ");
    }
    assert_eq!(worker_deaths(&r.events).len(), 2, "{:?}", r.events);
    for s in [stats.stdout, stats.stderr] {
        assert_eq!(s.read_bytes, want.len() as u64, "{stats:?}");
        assert_eq!(s.written_bytes, want.len() as u64, "{stats:?}");
        assert_eq!(s.dropped_bytes, 0, "{stats:?}");
    }
}

#[test]
fn a_closed_stdout_gives_the_job_epipe() {
    let _machine = common::machine::beside();
    let (out_r, out_w) = pipe();
    drop(out_r);
    let r = relay_job(
        RelayOptions {
            stdout: Some(out_w),
            ..Default::default()
        },
        // Endless output: only EPIPE (SIGPIPE) ends it.
        Command::new("yes"),
    );
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(r.status.signal(), Some(libc::SIGPIPE), "{:?}", r.status);
    let mut r = r;
    let mut errors = r.errors;
    errors.extend(r.relay.take_errors());
    assert!(
        errors.iter().any(|e| matches!(
            e,
            OutputError::Write { stream: Stream::Stdout, source }
                if source.kind() == std::io::ErrorKind::BrokenPipe
        )),
        "{errors:?}"
    );
}

#[test]
fn with_output_drop_a_stdout_nobody_reads_does_not_block_the_job() {
    let _machine = common::machine::beside();
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let err = collect(err_r);
    let r = relay_job(
        RelayOptions {
            stdout: Some(out_w),
            stderr: Some(err_w),
            max_buffered_bytes: Some(MIB as usize),
            drop_when_full: true,
            ..Default::default()
        },
        // 8 MiB on stdout, then a line on stderr.
        sh("head -c 8388608 /dev/zero; echo done >&2"),
    );
    assert!(r.status.success());
    let st = r.stats.stdout;
    assert_eq!(st.read_bytes, 8 * MIB);
    // At most the bound, the chunk in flight and the pipe's buffer (64 KiB,
    // up to 1 MiB if raised system-wide) can have been kept.
    assert!(st.dropped_bytes >= 8 * MIB - 3 * MIB, "{st:?}");
    // Only what fitted in the pipe was written.
    assert!(st.written_bytes <= MIB, "{st:?}");
    // The stuck stdout does not hold up stderr.
    assert!(!r.relay.flush(Duration::from_millis(100)));
    drop(r.relay);
    assert_eq!(err.join().unwrap(), b"done\n");
    drop(out_r);
}

#[test]
fn with_output_drop_a_closed_stdout_is_reported_and_the_job_is_still_drained() {
    let _machine = common::machine::beside();
    let (out_r, out_w) = pipe();
    drop(out_r);
    let (err_r, err_w) = pipe();
    let err = collect(err_r);
    let r = relay_job(
        RelayOptions {
            stdout: Some(out_w),
            stderr: Some(err_w),
            drop_when_full: true,
            ..Default::default()
        },
        sh("head -c 3000000 /dev/zero; echo done >&2"),
    );
    assert!(
        r.status.success(),
        "the job must not see EPIPE: {:?}",
        r.status
    );
    assert!(r.relay.flush(Duration::from_secs(10)));
    let errors = {
        let mut r = r;
        let mut errors = r.errors;
        errors.extend(r.relay.take_errors());
        let stats = r.relay.stats();
        assert_eq!(stats.stdout.read_bytes, 3_000_000);
        assert_eq!(stats.stdout.dropped_bytes, 3_000_000);
        drop(r.relay);
        errors
    };
    assert!(
        errors.iter().any(|e| matches!(
            e,
            OutputError::Write { stream: Stream::Stdout, source }
                if source.kind() == std::io::ErrorKind::BrokenPipe
        )),
        "{errors:?}"
    );
    assert_eq!(err.join().unwrap(), b"done\n");
}

// ---------------------------------------------------------------------------
// (4) Partial lines and progress bars.

#[test]
fn messages_split_across_writes_and_progress_bars_are_scanned() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let oom_text = fixture(OOM_FIXTURE);
    let (head, tail) = oom_text.split_at(oom_text.len() / 2);
    let head = write_file(dir.path(), "head.txt", head);
    let tail = write_file(dir.path(), "tail.txt", tail);
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let (out, err) = (collect(out_r), collect(err_r));
    // tqdm-style: states separated by \r on stderr, the message in two
    // writes with a pause between them (two reads for the relay), and a
    // worker line whose start follows a bar on the same line.
    let script = format!(
        "for p in 10 20 30; do printf '\\r%3d%%|###|' $p >&2; sleep 0.02; done; \
         printf '\\r' >&2; cat '{}' >&2; sleep 0.2; cat '{}' >&2; \
         printf ' 40%%|####|\\r{}' >&2; sleep 0.2; printf '\\n' >&2; echo ok",
        head.display(),
        tail.display(),
        WORKER_LINE.replace('%', "%%"),
    );
    let r = relay_job(
        RelayOptions {
            stdout: Some(out_w),
            stderr: Some(err_w),
            ..Default::default()
        },
        sh(&script),
    );
    assert!(r.status.success());
    assert!(r.relay.flush(Duration::from_secs(10)));
    drop(r.relay);
    assert_eq!(out.join().unwrap(), b"ok\n");
    let err = String::from_utf8(err.join().unwrap()).unwrap();
    assert!(
        err.starts_with("\r 10%|###|\r 20%|###|\r 30%|###|\r"),
        "{err:?}"
    );
    assert!(
        err.ends_with(&format!(" 40%|####|\r{WORKER_LINE}\n")),
        "{err:?}"
    );
    let ooms = cuda_ooms(&r.events);
    assert_eq!(ooms.len(), 1, "{:?}", r.events);
    assert_fixture_oom(ooms[0]);
    assert_eq!(worker_deaths(&r.events)[0].pid, Some(123));
}

// ---------------------------------------------------------------------------
// (5) Hostile output: invalid UTF-8, one 10 MiB line.

#[test]
fn invalid_utf8_and_a_ten_mib_line_pass_through() {
    let _machine = common::machine::beside();
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let (out, err) = (collect(out_r), collect(err_r));
    let script = format!(
        "printf '\\377\\376\\300 not utf-8\\n'; head -c 10485760 /dev/zero | tr '\\000' x; \
         printf '\\n'; echo '{WORKER_LINE}' >&2"
    );
    let r = relay_job(
        RelayOptions {
            stdout: Some(out_w),
            stderr: Some(err_w),
            // Room for all of it: this test is about the scanner.
            max_buffered_bytes: Some(32 << 20),
            ..Default::default()
        },
        sh(&script),
    );
    assert!(r.status.success());
    assert!(r.relay.flush(Duration::from_secs(30)));
    drop(r.relay);
    let out = out.join().unwrap();
    assert_eq!(out.len(), 14 + (10 << 20) + 1);
    assert_eq!(&out[..14], b"\xff\xfe\xc0 not utf-8\n");
    assert!(out[14..out.len() - 1].iter().all(|&b| b == b'x'));
    assert_eq!(err.join().unwrap(), format!("{WORKER_LINE}\n").as_bytes());
    assert_eq!(worker_deaths(&r.events).len(), 1, "{:?}", r.events);
}

// ---------------------------------------------------------------------------
// Attempts and fd hygiene.

#[test]
fn next_attempt_reuses_the_destinations() {
    let _machine = common::machine::beside();
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let (out, _err) = (collect(out_r), collect(err_r));
    let relay = runtime().block_on(async {
        let (mut relay, stdio) = OutputRelay::new(RelayOptions {
            stdout: Some(out_w),
            stderr: Some(err_w),
            ..Default::default()
        })
        .unwrap();
        let mut stdio = Some(stdio);
        for attempt in 1..=3 {
            let io = match stdio.take() {
                Some(io) => io,
                None => {
                    assert!(matches!(
                        relay.job_stdio(),
                        Err(OutputError::AlreadySpawned)
                    ));
                    relay.next_attempt().unwrap()
                }
            };
            let mut cmd = sh(&format!("echo attempt {attempt}"));
            cmd.stdout(io.stdout).stderr(io.stderr).stdin(Stdio::null());
            let mut child = cmd.spawn().unwrap();
            drop(cmd);
            relay.after_spawn();
            while !relay.is_closed() {
                tokio::time::timeout(Duration::from_secs(30), relay.pump())
                    .await
                    .unwrap();
            }
            child.wait().unwrap();
            relay.finish();
            // A closed relay's pump waits forever instead of spinning.
            assert!(
                tokio::time::timeout(Duration::from_millis(20), relay.pump())
                    .await
                    .is_err()
            );
        }
        relay
    });
    assert!(relay.flush(Duration::from_secs(10)));
    drop(relay);
    assert_eq!(out.join().unwrap(), b"attempt 1\nattempt 2\nattempt 3\n");
}

#[test]
fn the_end_is_seen_only_after_after_spawn() {
    let _machine = common::machine::beside();
    // Without after_spawn the relay's own copy keeps the pipe open: this is
    // why the call exists. With it, the end comes when the job exits.
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let (_out, _err) = (collect(out_r), collect(err_r));
    runtime().block_on(async {
        let (mut relay, stdio) = OutputRelay::new(RelayOptions {
            stdout: Some(out_w),
            stderr: Some(err_w),
            ..Default::default()
        })
        .unwrap();
        let mut cmd = sh("true");
        cmd.stdout(stdio.stdout)
            .stderr(stdio.stderr)
            .stdin(Stdio::null());
        cmd.spawn().unwrap().wait().unwrap();
        drop(cmd);
        let stuck = tokio::time::timeout(Duration::from_millis(200), relay.pump()).await;
        assert!(
            stuck.is_err(),
            "EOF while the relay still held the job's end"
        );
        assert!(matches!(relay.next_attempt(), Err(OutputError::StillOpen)));
        relay.after_spawn();
        let p = tokio::time::timeout(Duration::from_secs(10), relay.pump())
            .await
            .unwrap();
        assert_eq!(p, Pumped::Closed);
        assert!(relay.is_closed());
    });
}

#[test]
fn a_last_line_without_newline_is_scanned_when_the_output_ends() {
    let _machine = common::machine::beside();
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let (_out, _err) = (collect(out_r), collect(err_r));
    runtime().block_on(async {
        let (mut relay, stdio) = OutputRelay::new(RelayOptions {
            stdout: Some(out_w),
            stderr: Some(err_w),
            ..Default::default()
        })
        .unwrap();
        let mut cmd = sh(&format!("printf '%s' '{WORKER_LINE}' >&2"));
        cmd.stdout(stdio.stdout)
            .stderr(stdio.stderr)
            .stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        drop(cmd);
        relay.after_spawn();
        let mut events = Vec::new();
        while !relay.is_closed() {
            tokio::time::timeout(Duration::from_secs(30), relay.pump())
                .await
                .unwrap();
            events.extend(relay.take_events());
        }
        // Before `finish`: the end of the channel completes the line.
        assert_eq!(worker_deaths(&events).len(), 1, "{events:?}");
        child.wait().unwrap();
        relay.finish();
        assert!(relay.take_events().is_empty());
    });
}

#[test]
fn an_output_log_that_cannot_be_opened_is_an_error_naming_it() {
    let _machine = common::machine::beside();
    let rt = runtime();
    let _guard = rt.enter();
    let err = OutputRelay::new(RelayOptions {
        output_log: Some(PathBuf::from("/no/such/dir/output.log")),
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("/no/such/dir/output.log"), "{err}");
}

// ---------------------------------------------------------------------------
// End to end through `oomguard run` (needs the relay wired into run.rs).

#[test]
fn cuda_oom_and_worker_death_end_to_end() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let oom_text = fixture(OOM_FIXTURE);
    let pid_text = fixture("10-container-own-process-as-Process-N.txt");
    let shm_text = fixture("17-dataloader-killed-by-signal-BusError-shm.txt");
    let job_err = format!("{oom_text}{pid_text}{WORKER_LINE}\n{shm_text}");
    let err_file = write_file(dir.path(), "stderr.txt", &job_err);
    let log = dir.path().join("run.ndjson");
    let out = common::oomguard()
        .args(["run", "-q", "--log"])
        .arg(&log)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "printf 'training\\n'; cat '{}' >&2; exit 1",
            err_file.display()
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    // The user sees exactly what the job printed.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "training\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), job_err);

    let lines = common::read_log(&log);
    let ooms: Vec<&serde_json::Value> = lines
        .iter()
        .filter_map(|l| match &l.event {
            common::schema::Event::CudaOom(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(ooms.len(), 2, "{ooms:?}");
    for key in [
        "device",
        "tried_bytes",
        "total_bytes",
        "free_bytes",
        "allocated_bytes",
        "reserved_unallocated_bytes",
        "pid",
        "advice",
    ] {
        assert!(
            ooms[0].get(key).is_some(),
            "cuda_oom lacks {key}: {}",
            ooms[0]
        );
    }
    assert_eq!(ooms[0]["device"], 0);
    assert_eq!(ooms[0]["tried_bytes"], 22 * MIB);
    assert!(ooms[0]["total_bytes"].as_u64().unwrap() > 23 * 1024 * MIB);
    assert!(ooms[0]["free_bytes"].as_u64().unwrap() > 11 * MIB);
    assert!(ooms[0]["reserved_unallocated_bytes"].as_u64().unwrap() > 194 * MIB);
    // 194.87 MiB reserved but unallocated ≥ 22 MiB tried: fragmentation.
    let advice: Vec<&str> = ooms[0]["advice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        advice
            .iter()
            .any(|a| a.contains("expandable_segments:True")),
        "{advice:?}"
    );
    // A container's own process is named by its pid.
    assert_eq!(ooms[1]["pid"], 3910771);
    assert_eq!(ooms[1]["tried_bytes"], 16 * 1024 * MIB);

    let died: Vec<&serde_json::Value> = lines
        .iter()
        .filter_map(|l| match &l.event {
            common::schema::Event::WorkerDied(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(died.len(), 2, "{died:?}");
    for key in ["pid", "signal", "exit_code", "shm_hint"] {
        assert!(
            died[0].get(key).is_some(),
            "worker_died lacks {key}: {}",
            died[0]
        );
    }
    assert_eq!(died[0]["pid"], 123);
    assert_eq!(died[0]["signal"], "SIGKILL");
    assert_eq!(died[0]["shm_hint"], false);
    assert_eq!(died[1]["pid"], 3855);
    assert_eq!(died[1]["signal"], "SIGBUS");
    assert_eq!(died[1]["shm_hint"], true);
    assert!(
        died[1]["advice"].as_array().is_some_and(|a| a
            .iter()
            .any(|s| s.as_str().is_some_and(|s| s.contains("/dev/shm")))),
        "{}",
        died[1]
    );

    // Without -q, oomguard's own lines come after the job's.
    let out = common::oomguard()
        .args(["run", "--", "sh", "-c"])
        .arg(format!("cat '{}' >&2; exit 1", err_file.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with(&job_err), "{err}");
    assert!(
        err[job_err.len()..]
            .lines()
            .all(|l| l.starts_with("oomguard:")),
        "{err}"
    );
}

// ---------------------------------------------------------------------------
// Backpressure through `oomguard run`, in a shell pipeline as users run it.

/// Runs a bash pipeline (bash for PIPESTATUS) with `$OOMGUARD` set, within
/// a time limit; its stdout.
fn pipeline(script: &str) -> String {
    common::deadline::arm();
    let out = Command::new("timeout")
        .args(["60", "bash", "-c", script])
        .env("OOMGUARD", env!("CARGO_BIN_EXE_oomguard"))
        .env_remove("GITHUB_ACTIONS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_slow_reader_gets_every_byte_through_oomguard() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let bytes: Vec<u8> = (0..5_242_880u32).map(|i| (i % 251) as u8).collect();
    fs::write(&data, &bytes).unwrap();
    let log = dir.path().join("run.ndjson");
    let got = pipeline(&format!(
        "\"$OOMGUARD\" run -q --log '{}' -- head -c 5M '{}' | (sleep 3; wc -c); echo ${{PIPESTATUS[0]}}",
        log.display(),
        data.display()
    ));
    assert_eq!(got.split_whitespace().collect::<Vec<_>>(), ["5242880", "0"]);
    let lines = common::read_log(&log);
    assert_eq!(
        common::schema::run_end(&lines).output_dropped_bytes,
        Some(0)
    );
}

#[test]
fn a_slow_reader_gets_every_line_unchanged_through_oomguard() {
    let _machine = common::machine::beside();
    let direct = pipeline("seq 1 3000000 | md5sum");
    let relayed = pipeline("\"$OOMGUARD\" run -q -- seq 1 3000000 | (sleep 2; md5sum)");
    assert_eq!(relayed, direct);
}

#[test]
fn a_reader_that_goes_away_gives_the_job_epipe_through_oomguard() {
    let _machine = common::machine::beside();
    // `yes` never ends by itself: only SIGPIPE ends it, and oomguard with
    // it, exiting as the job did (128 + 13).
    let got = pipeline("\"$OOMGUARD\" run -q -- yes | head -c 1000 | wc -c; echo ${PIPESTATUS[0]}");
    assert_eq!(got.split_whitespace().collect::<Vec<_>>(), ["1000", "141"]);
}

#[test]
fn output_drop_counts_what_it_dropped_in_run_end() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let got = pipeline(&format!(
        "\"$OOMGUARD\" run -q --output-drop --log '{}' -- head -c 8M /dev/zero | (sleep 2; wc -c)",
        log.display()
    ));
    let received: u64 = got.trim().parse().unwrap();
    let lines = common::read_log(&log);
    let dropped = common::schema::run_end(&lines)
        .output_dropped_bytes
        .unwrap();
    assert!(dropped > 0, "nothing dropped, {received} received");
    assert_eq!(received + dropped, 8 * MIB);
}
