//! Machine-wide memory: `/proc/meminfo`, swap traffic from `/proc/vmstat`,
//! and memory pressure (PSI) from `/proc/pressure/memory`.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use procfs::FromBufRead;

use crate::vocab::model::{Psi, SystemSample};

/// The `/proc/vmstat` counters oomguard follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmCounters {
    /// Pages swapped in / out since boot.
    pub pswpin: u64,
    pub pswpout: u64,
    /// Kernel OOM kills since boot (4.13+).
    pub oom_kill: Option<u64>,
}

/// Parses the counters of `/proc/vmstat`.
pub fn parse_vmstat(text: &str) -> VmCounters {
    let mut c = VmCounters::default();
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = v.parse() else { continue };
        match k {
            "pswpin" => c.pswpin = v,
            "pswpout" => c.pswpout = v,
            "oom_kill" => c.oom_kill = Some(v),
            _ => {}
        }
    }
    c
}

/// Parses `/proc/meminfo` into (total, available, swap total, swap free),
/// in bytes.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64, u64, u64)> {
    let m = procfs::Meminfo::from_buf_read(text.as_bytes()).ok()?;
    // Kernels before 3.14 lack MemAvailable; free memory is the closest
    // conservative stand-in.
    let available = m.mem_available.unwrap_or(m.mem_free);
    Some((m.mem_total, available, m.swap_total, m.swap_free))
}

/// Parses a PSI file (`some avg10=… avg60=… avg300=… total=…` and `full …`).
pub fn parse_psi(text: &str) -> Option<Psi> {
    let (some, full) = procfs::get_pressure(text.as_bytes()).ok()?;
    Some(Psi {
        some_avg10: f64::from(some.avg10),
        full_avg10: f64::from(full.avg10),
    })
}

/// Reads the machine's memory each tick and turns swap counters into rates.
#[derive(Debug)]
pub struct SystemReader {
    proc_root: PathBuf,
    page_size: u64,
    last: Option<(Instant, VmCounters)>,
    psi_missing: bool,
}

impl SystemReader {
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
            page_size: super::proc::page_size(),
            last: None,
            psi_missing: false,
        }
    }

    pub fn read(&mut self, now: Instant) -> SystemSample {
        let mut s = SystemSample::default();
        if let Some((total, avail, swap_total, swap_free)) =
            fs::read_to_string(self.proc_root.join("meminfo"))
                .ok()
                .as_deref()
                .and_then(parse_meminfo)
        {
            s.mem_total_bytes = total;
            s.mem_available_bytes = avail;
            s.swap_total_bytes = swap_total;
            s.swap_used_bytes = swap_total.saturating_sub(swap_free);
        }
        if let Ok(text) = fs::read_to_string(self.proc_root.join("vmstat")) {
            let c = parse_vmstat(&text);
            if let Some((then, prev)) = self.last {
                let dt = now.saturating_duration_since(then).as_secs_f64();
                if dt > 0.0 {
                    let rate =
                        |a: u64, b: u64| a.saturating_sub(b) as f64 * self.page_size as f64 / dt;
                    s.swap_in_bytes_per_s = rate(c.pswpin, prev.pswpin);
                    s.swap_out_bytes_per_s = rate(c.pswpout, prev.pswpout);
                }
            }
            s.oom_kill_total = c.oom_kill;
            self.last = Some((now, c));
        }
        s
    }

    /// Machine-wide PSI; `None` (and no further tries) where the kernel has
    /// no `/proc/pressure`.
    pub fn psi(&mut self) -> Option<Psi> {
        if self.psi_missing {
            return None;
        }
        let text = fs::read_to_string(self.proc_root.join("pressure/memory")).ok();
        let psi = text.as_deref().and_then(parse_psi);
        self.psi_missing = text.is_none();
        psi
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmstat() {
        let c = parse_vmstat("nr_free_pages 100\npswpin 7\npswpout 9\noom_kill 2\nbogus\n");
        assert_eq!(
            c,
            VmCounters {
                pswpin: 7,
                pswpout: 9,
                oom_kill: Some(2)
            }
        );
        assert_eq!(parse_vmstat("pswpin x\n").oom_kill, None);
    }

    #[test]
    fn meminfo() {
        let text = TEST_MEMINFO;
        let (t, a, st, sf) = parse_meminfo(text).unwrap();
        assert_eq!(t, 24000000 * 1024);
        assert_eq!(a, 22000000 * 1024);
        assert_eq!((st, sf), (2000000 * 1024, 1500000 * 1024));
        assert_eq!(parse_meminfo("garbage"), None);
    }

    #[test]
    fn psi() {
        let text = "some avg10=1.50 avg60=0.20 avg300=0.00 total=1234\n\
                    full avg10=0.75 avg60=0.00 avg300=0.00 total=99\n";
        assert_eq!(
            parse_psi(text),
            Some(Psi {
                some_avg10: 1.5,
                full_avg10: 0.75
            })
        );
        assert_eq!(parse_psi("nonsense"), None);
    }

    #[test]
    fn live_machine_reads() {
        let mut r = SystemReader::new("/proc");
        let s = r.read(Instant::now());
        assert!(s.mem_total_bytes > 0 && s.mem_available_bytes <= s.mem_total_bytes);
    }
}

/// A kernel wake-up source watched with `POLLPRI`: a PSI trigger on a
/// `memory.pressure` file (the kernel signals when tasks stalled on memory
/// for longer than a threshold within a window), or a cgroup v2
/// `memory.events` file (signalled on every change: `high`, `max`, `oom`,
/// `oom_kill`). Either wakes the supervision loop at once, on kernels and
/// cgroup versions where v1 thresholds do not exist.
#[derive(Debug)]
pub struct PriWake {
    pub what: String,
    file: fs::File,
}

impl PriWake {
    /// A PSI trigger: wake when some task stalled on memory for `stall_us`
    /// within every `window_us` (see Documentation/accounting/psi.rst).
    pub fn psi_trigger(
        path: &std::path::Path,
        stall_us: u64,
        window_us: u64,
    ) -> std::io::Result<Self> {
        use std::io::Write;
        let mut file = fs::OpenOptions::new().read(true).write(true).open(path)?;
        file.write_all(format!("some {stall_us} {window_us}\0").as_bytes())?;
        Ok(Self {
            what: format!("{} trigger", path.display()),
            file,
        })
    }

    /// Change notifications of a cgroup v2 events file.
    pub fn events(path: &std::path::Path) -> std::io::Result<Self> {
        let file = fs::File::open(path)?;
        Ok(Self {
            what: path.display().to_string(),
            file,
        })
    }

    /// After a wake-up: events files must be re-read to re-arm.
    pub fn rearm(&mut self) {
        use std::io::{Read, Seek};
        let mut buf = [0u8; 512];
        let _ = self.file.seek(std::io::SeekFrom::Start(0));
        let _ = self.file.read(&mut buf);
    }
}

impl std::os::fd::AsFd for PriWake {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl std::os::fd::AsRawFd for PriWake {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

/// A whole `/proc/meminfo` (procfs wants every field), for tests.
#[cfg(test)]
pub const TEST_MEMINFO: &str = "MemTotal:       24000000 kB\nMemFree:        20000000 kB\n\
            MemAvailable:   22000000 kB\nBuffers: 1 kB\nCached: 1 kB\nSwapCached: 0 kB\n\
            Active: 1 kB\nInactive: 1 kB\nUnevictable: 0 kB\nMlocked: 0 kB\n\
            SwapTotal:       2000000 kB\nSwapFree:        1500000 kB\nDirty: 0 kB\n\
            Writeback: 0 kB\nAnonPages: 1 kB\nMapped: 1 kB\nShmem: 1 kB\nSlab: 1 kB\n\
            SReclaimable: 1 kB\nSUnreclaim: 1 kB\nKernelStack: 1 kB\nPageTables: 1 kB\n\
            NFS_Unstable: 0 kB\nBounce: 0 kB\nWritebackTmp: 0 kB\nCommitLimit: 1 kB\n\
            Committed_AS: 1 kB\nVmallocTotal: 1 kB\nVmallocUsed: 0 kB\nVmallocChunk: 0 kB\n";

#[cfg(test)]
mod wake_tests {
    use super::*;

    #[test]
    fn psi_trigger_registers_where_the_kernel_has_psi() {
        // In CI the machine has PSI and the tests run as root: a missing
        // file or a refusal there is a failure, not a skip.
        let ci = crate::settings::in_ci();
        let path = std::path::Path::new("/proc/pressure/memory");
        if !path.exists() {
            assert!(!ci, "CI=true: {} is missing", path.display());
            return;
        }
        // Unprivileged triggers need a window that is a multiple of 2 s;
        // as root any window from 500 ms works.
        match PriWake::psi_trigger(path, 100_000, 2_000_000) {
            Ok(w) => assert!(w.what.contains("pressure")),
            Err(e) => {
                assert!(!ci, "CI=true: the PSI trigger was refused: {e}");
                assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
            }
        }
        assert!(
            PriWake::psi_trigger(path, 0, 0).is_err(),
            "a zero window is invalid"
        );
    }
}
