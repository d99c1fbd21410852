//! The output keeper: a small process that holds the read ends of the job's
//! output channels (its pipes, or its pty's master) for as long as oomguard
//! runs, and passes the job's output on if oomguard dies.
//!
//! When oomguard dies, even by SIGKILL, the job's main process gets SIGTERM
//! (`supervise::DEATH_SIGNAL`) so that a trainer can checkpoint. But
//! oomguard also held the only read ends of the job's stdout and stderr:
//! without the keeper, the trainer's next print would fail (EPIPE on a
//! pipe, EIO on a pty) and, in Python, raise inside the very handler that
//! saves the checkpoint. The keeper is oomguard's own binary, run as
//! `oomguard __keep R:W ...` in a process group of its own (terminal signals
//! are not for it). While oomguard lives it only waits on a *lifeline*, a
//! pipe whose write end only oomguard holds; it reads nothing, so the relay,
//! its scanners and its backpressure are unchanged. When the lifeline ends
//! without oomguard having killed it first, oomguard is gone: it copies each
//! channel to its destination until the job's last writer closes it.
//!
//! oomguard kills its keeper (through a pidfd, so a reaped keeper's recycled
//! pid is never hit) when an attempt's output is over and when a
//! destination fails, since a read end held open would keep the job from
//! getting EPIPE as it would from a closed pipe.
//!
//! The lifeline also carries the processes oomguard has stopped (pause,
//! throttle, last-resort freeze), as `PID START_TIME` lines: a stopped
//! trainer cannot act on its death signal, so when oomguard dies the keeper
//! first sends SIGCONT to each of them that is still the same process
//! (checked by start time through a pidfd, as oomguard does), and nothing
//! oomguard held stays stopped for good.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;

/// The hidden first argument that makes the binary a keeper.
pub const ARG: &str = "__keep";

/// The keeper's name in `ps` and /proc (exec'd as /proc/self/exe, it
/// would be `exe`).
const NAME: &std::ffi::CStr = c"oomguard-keep";

/// Bytes read per system call once the keeper relays.
const CHUNK: usize = 64 << 10;

/// A running keeper: killed when dropped.
#[derive(Debug)]
pub struct Keeper {
    pid: u32,
    pidfd: OwnedFd,
}

/// The write ends of the live keepers' lifelines, by keeper pid: closing
/// one (oomguard's exit) is the signal; what is written on it is what
/// oomguard stopped. Process-wide, since whatever sends SIGSTOP must tell
/// every keeper, whichever part of oomguard started it.
static LIFELINES: std::sync::Mutex<Vec<(u32, OwnedFd)>> = std::sync::Mutex::new(Vec::new());

fn lifelines() -> std::sync::MutexGuard<'static, Vec<(u32, OwnedFd)>> {
    LIFELINES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Tells the keepers that oomguard stopped this process: if oomguard dies
/// before it lets it run again, a keeper will. Never blocks: a lifeline
/// is non-blocking, and a keeper reads it as it is written.
pub fn note_stopped(pid: u32, start_time: u64) {
    let line = format!("{pid} {start_time}\n");
    for (_, fd) in lifelines().iter() {
        let _ = rustix::io::write(fd, line.as_bytes());
    }
}

impl Keeper {
    /// Starts a keeper for `pairs`: each channel's read end, and where its
    /// bytes go. Fails where the kernel has no pidfds (before 5.3): without
    /// one the keeper could not be killed safely once reaped.
    pub fn spawn(pairs: &[(BorrowedFd<'_>, BorrowedFd<'_>)]) -> io::Result<Keeper> {
        let (life_r, life_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        rustix::fs::fcntl_setfl(&life_w, rustix::fs::OFlags::NONBLOCK)?;
        // 0-2 are the keeper's own stdio (the lifeline, /dev/null): one of
        // oomguard's that low (its stdout, for the dashboard's pty) goes as
        // a copy above them, closed here once the keeper has its own.
        let mut lifted: Vec<OwnedFd> = Vec::new();
        let mut fds: Vec<RawFd> = Vec::new();
        for fd in pairs.iter().flat_map(|(r, w)| [r, w]) {
            if fd.as_raw_fd() > 2 {
                fds.push(fd.as_raw_fd());
            } else {
                let copy = rustix::io::fcntl_dupfd_cloexec(fd, 3)?;
                fds.push(copy.as_raw_fd());
                lifted.push(copy);
            }
        }
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg0("oomguard").arg(ARG);
        for pair in fds.chunks(2) {
            cmd.arg(format!("{}:{}", pair[0], pair[1]));
        }
        cmd.stdin(Stdio::from(life_r))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: between fork and exec the closure only calls fcntl, which
        // is async-signal-safe, on descriptors it was handed (the child's
        // copies of oomguard's; their close-on-exec flag is the child's
        // own), and allocates nothing.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(lifted);
        let pid = child.id();
        let pidfd = rustix::process::Pid::from_raw(pid as i32)
            .ok_or_else(|| io::Error::other("the keeper has no pid"))
            .and_then(|p| {
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                    .map_err(io::Error::from)
            });
        match pidfd {
            Ok(pidfd) => {
                lifelines().push((pid, life_w));
                Ok(Keeper { pid, pidfd })
            }
            Err(e) => {
                // Not reaped yet (only oomguard's loop reaps): the pid is
                // still the keeper's.
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// The keeper's pid, to leave it out of the job's tree.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // Gone already (killed, or reaped) is fine. Killed before its
        // lifeline closes, so it never takes this for oomguard's death.
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL);
        lifelines().retain(|(pid, _)| *pid != self.pid);
    }
}

/// Why the keeper's arguments cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not READ_FD:WRITE_FD")]
pub struct BadPair(String);

/// Parses `R:W` arguments into descriptor pairs.
fn parse_pairs(args: &[OsString]) -> Result<Vec<(RawFd, RawFd)>, BadPair> {
    args.iter()
        .map(|a| {
            let text = a.to_string_lossy();
            let parsed = text.split_once(':').and_then(|(r, w)| {
                let r: RawFd = r.parse().ok()?;
                let w: RawFd = w.parse().ok()?;
                (r > 2 && w > 2).then_some((r, w))
            });
            parsed.ok_or_else(|| BadPair(text.into_owned()))
        })
        .collect()
}

/// The keeper process: `args` are what follows [`ARG`]. Returns its exit
/// code. Waits for the lifeline (stdin) to end, then relays.
pub fn run(args: &[OsString]) -> i32 {
    let pairs = match parse_pairs(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("oomguard: {e} (this command is for oomguard's own use)");
            return 2;
        }
    };
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16
    // bytes, which NAME is.
    #[allow(unsafe_code)]
    unsafe {
        libc::prctl(libc::PR_SET_NAME, NAME.as_ptr());
    }
    // SAFETY: oomguard passed these descriptors to this process for it
    // alone (they were made inheritable for this exec only).
    #[allow(unsafe_code)]
    let channels: Vec<(OwnedFd, OwnedFd)> = pairs
        .into_iter()
        .map(|(r, w)| unsafe { (OwnedFd::from_raw_fd(r), OwnedFd::from_raw_fd(w)) })
        .collect();
    let held = wait_for_lifeline(io::stdin().as_fd());
    for (pid, start_time) in held {
        let _ = crate::job::supervise::signal_process(
            std::path::Path::new("/proc"),
            pid,
            start_time,
            libc::SIGCONT,
        );
    }
    relay(channels);
    0
}

/// Blocks until the lifeline's write end is closed everywhere; returns
/// the processes oomguard said it stopped (some may have run again since:
/// a SIGCONT to a running process changes nothing).
fn wait_for_lifeline(fd: BorrowedFd<'_>) -> std::collections::HashSet<(u32, u64)> {
    let mut held = std::collections::HashSet::new();
    let mut buf = [0u8; 4096];
    let mut line: Vec<u8> = Vec::new();
    loop {
        match rustix::io::read(fd, &mut buf) {
            Ok(0) => return held,
            Ok(n) => {
                for &b in &buf[..n] {
                    if b != b'\n' {
                        // A line is two numbers: anything longer is not one.
                        if line.len() < 64 {
                            line.push(b);
                        }
                        continue;
                    }
                    if let Some(id) = parse_held(&line) {
                        held.insert(id);
                    }
                    line.clear();
                }
            }
            Err(Errno::INTR) => {}
            Err(_) => return held,
        }
    }
}

/// `PID START_TIME`.
fn parse_held(line: &[u8]) -> Option<(u32, u64)> {
    let text = std::str::from_utf8(line).ok()?;
    let (pid, start) = text.split_once(' ')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// Copies every channel to its destination until each one ends (every
/// writer gone, or EIO from a pty whose job side is closed) or its
/// destination fails; a failed destination closes the channel, so the job
/// gets EPIPE as it would from a direct pipe.
fn relay(mut channels: Vec<(OwnedFd, OwnedFd)>) {
    let mut buf = vec![0u8; CHUNK];
    while !channels.is_empty() {
        let ready: Vec<bool> = {
            let mut polls: Vec<PollFd<'_>> = channels
                .iter()
                .map(|(r, _)| PollFd::new(r, PollFlags::IN))
                .collect();
            match rustix::event::poll(&mut polls, None) {
                Ok(_) => polls.iter().map(|p| !p.revents().is_empty()).collect(),
                Err(Errno::INTR) => continue,
                Err(_) => return,
            }
        };
        let mut i = ready.len();
        while i > 0 {
            i -= 1;
            if !ready[i] {
                continue;
            }
            let (src, dst) = &channels[i];
            let done = match rustix::io::read(src, &mut buf) {
                Ok(0) => true,
                Ok(n) => write_all(dst.as_fd(), &buf[..n]).is_err(),
                Err(Errno::INTR | Errno::AGAIN) => false,
                Err(_) => true,
            };
            if done {
                channels.swap_remove(i);
            }
        }
    }
}

/// Writes everything, waiting for room when the destination is
/// non-blocking (a pipe oomguard spliced into is).
fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                let mut p = [PollFd::new(&fd, PollFlags::OUT)];
                match rustix::event::poll(&mut p, None) {
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_lines_are_pid_and_start_time() {
        assert_eq!(parse_held(b"1234 5678"), Some((1234, 5678)));
        for bad in [&b""[..], b"1234", b"x 1", b"1 -2", b"1 2 3"] {
            assert_eq!(parse_held(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn pairs_are_parsed_and_bad_ones_named() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            parse_pairs(&args(&["7:9", "10:11"])),
            Ok(vec![(7, 9), (10, 11)])
        );
        for bad in ["7", "7:x", "1:9", "7:2", ":", "-3:9"] {
            assert_eq!(
                parse_pairs(&args(&["7:9", bad])),
                Err(BadPair(bad.to_string())),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_relay_passes_every_byte_on_and_ends_with_its_writers() {
        let (src_r, src_w) = rustix::pipe::pipe().unwrap();
        let (dst_r, dst_w) = rustix::pipe::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            for i in 0..1000u32 {
                write_all(src_w.as_fd(), format!("line {i}\n").as_bytes()).unwrap();
            }
        });
        let relay_thread = std::thread::spawn(move || relay(vec![(src_r, dst_w)]));
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match rustix::io::read(&dst_r, &mut buf).unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        writer.join().unwrap();
        relay_thread.join().unwrap();
        let want: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(String::from_utf8(got).unwrap(), want);
    }

    #[test]
    fn a_failed_destination_closes_the_channel() {
        let (src_r, src_w) = rustix::pipe::pipe().unwrap();
        let (dst_r, dst_w) = rustix::pipe::pipe().unwrap();
        drop(dst_r);
        write_all(src_w.as_fd(), b"x\n").unwrap();
        // Rust ignores SIGPIPE: the write fails with EPIPE instead.
        relay(vec![(src_r, dst_w)]);
        // The keeper's read end is closed: the job's next write fails.
        assert_eq!(rustix::io::write(&src_w, b"y\n").unwrap_err(), Errno::PIPE);
    }
}
