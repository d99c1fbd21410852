//! A deadline for every test that starts a process: `cargo test` has none,
//! so a hung job, oomguard or VM would hang the whole CI run without a
//! name. Each process a test starts through this harness re-arms its
//! deadline (`arm`: 300 s from that start), unless the test set one for
//! all its runs (`arm_for`); a watchdog thread,
//! one per test binary, checks every 200 ms. Past a deadline it names the
//! test, SIGKILLs every process this test binary started (its whole
//! descendant tree), and exits the binary with 101: the hang becomes a
//! failure with a name. A test's deadline ends with its thread (libtest
//! runs every test on a thread of its own, named after the test).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// A test's deadline unless it asks for another.
pub const DEFAULT: Duration = Duration::from_secs(300);

/// Per test thread: its name, deadline, limit, and whether the test set
/// it itself (`arm_for`) rather than the harness (`arm`).
type Armed = Mutex<HashMap<ThreadId, (String, Instant, Duration, bool)>>;

fn armed() -> &'static Armed {
    static ARMED: OnceLock<Armed> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::thread::spawn(watch);
        Mutex::new(HashMap::new())
    })
}

/// Ends this thread's deadline when the test's thread ends.
struct Disarm(ThreadId);

impl Drop for Disarm {
    fn drop(&mut self) {
        if let Ok(mut m) = armed().lock() {
            m.remove(&self.0);
        }
    }
}

thread_local! {
    static GUARD: RefCell<Option<Disarm>> = const { RefCell::new(None) };
}

/// Arms the calling test's deadline at [`DEFAULT`] from now: called for
/// each process a test starts through the harness, so a test that runs
/// several jobs gives each its own [`DEFAULT`] rather than sharing one.
/// A deadline the test set itself ([`arm_for`]) is left alone.
pub fn arm() {
    arm_at(DEFAULT, false);
}

/// Sets the calling test's deadline to `limit` from now (a test that is
/// slow on purpose: a VM boot, a corpus of runs), sized for all its runs.
pub fn arm_for(limit: Duration) {
    arm_at(limit, true);
}

/// Moves the calling test's deadline (if it has one) `by` later: the time
/// it waited for a lock (`machine`) is not the test's own.
pub fn postpone(by: Duration) {
    let id = std::thread::current().id();
    if let Ok(mut m) = armed().lock()
        && let Some(e) = m.get_mut(&id)
    {
        e.1 += by;
    }
}

fn arm_at(limit: Duration, explicit: bool) {
    let me = std::thread::current();
    // A bench's `main` (not a test) keeps no deadline.
    let Some(name) = me.name().filter(|n| *n != "main").map(str::to_string) else {
        return;
    };
    // Before the deadline starts: waiting for an `alone` test to finish
    // is not this test's time.
    super::machine::implicit();
    let id = me.id();
    let Ok(mut m) = armed().lock() else { return };
    if !explicit && m.get(&id).is_some_and(|e| e.3) {
        return;
    }
    m.insert(id, (name, Instant::now() + limit, limit, explicit));
    drop(m);
    GUARD.with(|g| {
        g.borrow_mut().get_or_insert(Disarm(id));
    });
}

fn watch() {
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let late = armed().lock().ok().and_then(|m| {
            m.values()
                .find(|(_, at, _, _)| Instant::now() >= *at)
                .map(|(name, _, limit, _)| (name.clone(), *limit))
        });
        if let Some((name, limit)) = late {
            eprintln!(
                "test '{name}' passed its deadline of {} s: killing the processes it started and failing",
                limit.as_secs()
            );
            kill_descendants(std::process::id());
            std::process::exit(101);
        }
    }
}

/// SIGKILLs every descendant of `pid`, deepest first.
fn kill_descendants(pid: u32) {
    let mut kids = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                kids.extend(c.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
            }
        }
    }
    for k in kids {
        kill_descendants(k);
        if let Some(p) = rustix::process::Pid::from_raw(k as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}
