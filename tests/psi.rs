//! The PSI trigger oomguard registers on `/proc/pressure/memory` really
//! wakes a poller when tasks stall on memory: a reader thrashing the page
//! cache inside a small memory cgroup stalls in reclaim, and the trigger's
//! fd reports POLLPRI. A machine without PSI fails here in CI instead of
//! passing quietly.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::os::fd::AsFd;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use oomguard::engine::probe::system::PriWake;

/// Writes a file twice the cgroup's limit, then reads it over and over:
/// every read refaults pages that reclaim just evicted.
const THRASH: &str = r#"
import os, sys, time
path = sys.argv[1]
with open(path, "wb") as f:
    chunk = os.urandom(1 << 20)
    for _ in range(128):
        f.write(chunk)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
"#;

#[test]
fn serial_psi_trigger_fires_under_real_memory_pressure() {
    let _serial = serial();
    let psi = Path::new("/proc/pressure/memory");
    if !require(
        psi.exists(),
        "needs a kernel with PSI (/proc/pressure/memory)",
    ) {
        return;
    }
    let Some(cg) = MemCgroup::or_skip("psi", 32 << 20) else {
        return;
    };
    // What oomguard registers; unprivileged triggers need a window that is
    // a multiple of 2 s.
    let wake = PriWake::psi_trigger(psi, 100_000, 2_000_000).expect("register a PSI trigger");
    let fd = wake.as_fd();
    let pri = |timeout_ns: i64| {
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::PRI,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: timeout_ns,
        };
        let _ = rustix::event::poll(&mut fds, Some(&timeout));
        let r = fds[0].revents();
        // Without a registered trigger the kernel reports PRI together
        // with ERR: that is not a wake-up.
        r.contains(rustix::event::PollFlags::PRI) && !r.contains(rustix::event::PollFlags::ERR)
    };
    // Quiet before the pressure (a trigger that is always ready proves
    // nothing). Another test's pressure could make this flaky, hence serial_.
    let quiet = !pri(0);
    let dir = tempfile::tempdir().unwrap();
    let job = script(dir.path(), "thrash.py", THRASH);
    let data = dir.path().join("data.bin");
    let mut child = cg
        .command(
            Path::new("/usr/bin/env"),
            &[
                "python3",
                job.to_str().unwrap(),
                data.to_str().unwrap(),
                "8",
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut fired = false;
    while t0.elapsed() < Duration::from_secs(10) && !fired {
        fired = pri(200_000_000);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(quiet, "the trigger reported pressure before there was any");
    assert!(
        fired,
        "no PSI wake-up while a reader thrashed a 32 MiB cgroup for {:?}",
        t0.elapsed()
    );
}
