//! What a test needs of the machine while it runs, declared as locks.
//!
//! All of the suite's tests run in one binary on many threads
//! (`RUST_TEST_THREADS`, set in `tests/suite.rs`); most of those threads
//! wait here. Every test is one of two kinds:
//!
//! - [`alone`]: it measures something the rest of the machine would
//!   disturb (a rate, a peak, PSS, CPU share), races the kernel's OOM
//!   killer, makes the kernel kill (so no other test sees the machine's
//!   `oom_kill` count or kernel log move), or needs a machine-wide thing
//!   quiet (`/proc/pressure/memory`, `ns_last_pid`), or boots a VM (a
//!   guest's race against its own OOM killer, under TCG, lost once with two
//!   VMs and the rest of the suite beside it). It holds the machine
//!   lock exclusively: no other test that takes a lock runs beside it.
//! - [`beside`]: it mostly waits on a job (a trainer at a fixed step rate)
//!   and its assertions hold on a busy machine. It holds the
//!   machine lock shared and one of [`BESIDE`] slots, so at most that many
//!   run at once, and never beside an [`alone`] one. A test that asks for
//!   nothing and starts a process through the harness (`common::oomguard`,
//!   `MemCgroup::command`: anything that arms its deadline) takes [`beside`]
//!   on its first start, held until its thread ends.
//!
//! A [`beside`] test may name [`Need`]s too: things that few tests can use
//! at once. It waits for them first, holding nothing else, so a test
//! waiting for a SLURM keeps neither a slot nor the machine from others; then
//! the machine lock, then a slot. Every test takes its locks in that one
//! order, so no two wait on each other in a circle.
//!
//! The locks are `flock`s on files in the temp directory, so they hold
//! across processes too (a second `cargo test`, a bench). `.ci/run`'s
//! clippy and wheel take none: they run at nice 19, and the scheduler
//! gives a nice-19 process 15/1024 of the share of a nice-0 one, so a
//! test's processes take a core from them as soon as they want it. With
//! `OOMGUARD_TEST_TIMES` set (`.ci/run` sets it) each hold, when released,
//! appends the test's name, its kind, its seconds waiting and its seconds
//! holding to that file: the per-test figures of docs/development.md.

use std::cell::{Cell, RefCell};
use std::fs;
use std::io::Write as _;
use std::time::{Duration, Instant};

/// Set in the environment of a test binary that a test runs as its child
/// (`--exact --ignored NAME`): the parent holds the locks, and a child
/// waiting for a slot its parent's peers hold would never finish.
pub const CHILD: &str = "OOMGUARD_TEST_CHILD";

/// How many [`beside`] tests run at once. Four kept the suite green with
/// room to spare on this 2-core machine (the machine was a third busy on
/// average, docs/development.md); six leave the three [`Need::Torch`]
/// lanes three more for the short tests.
pub const BESIDE: usize = 6;

thread_local! {
    /// The lock a test took by starting a process ([`implicit`]).
    static IMPLICIT: RefCell<Option<Held>> = const { RefCell::new(None) };
    /// How many [`Held`] this test's thread has, and whether the machine
    /// lock among them is exclusive.
    static MACHINE: Cell<(u32, bool)> = const { Cell::new((0, false)) };
}

/// Something that only a few tests may use at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// The single-host SLURM (slurmctld, two slurmd, munge, their ports
    /// and state directories) and the documented recipes' rendezvous port
    /// 29500.
    Slurm,
    /// The two-node torchrun jobs of `multinode`: they find their
    /// processes by an environment variable in every process's
    /// environment, so two such jobs at once would find each other's.
    Multinode,
    /// torch, Lightning, transformers or accelerate jobs: each rank's
    /// import takes seconds of a core and half a GiB, so three such tests
    /// run at once, not more. They are the longest of the suite's
    /// [`beside`] tests: with two lanes they alone set the length of the
    /// suite's side-by-side part (about 570 of its 626 s in the run at
    /// 96743f3).
    Torch,
}

impl Need {
    /// The lock files of this need: one per test that may hold it at once.
    fn slots(self) -> Vec<String> {
        let (name, n) = match self {
            Need::Slurm => ("slurm", 1),
            Need::Multinode => ("multinode", 1),
            Need::Torch => ("torch", 3),
        };
        (0..n)
            .map(|i| format!("oomguard-test-need-{name}-{i}.lock"))
            .collect()
    }
}

/// Held while a test runs; dropping it releases its locks.
pub struct Held {
    files: Vec<fs::File>,
    /// Whether this took the machine lock (the thread's first hold) or
    /// rode on one the thread already had.
    machine: bool,
    test: String,
    kind: &'static str,
    asked: Instant,
    got: Instant,
}

/// The whole machine: no other test that takes a lock runs beside this one.
pub fn alone() -> Held {
    // A process this test started before asking holds the machine lock
    // shared: give it up first, or this would wait on itself.
    IMPLICIT.with(|i| i.borrow_mut().take());
    take(true, &[], "alone")
}

/// Beside other [`beside`] tests, never beside an [`alone`] one.
pub fn beside() -> Held {
    take(false, &[], "beside")
}

/// [`beside`], holding `needs` too.
pub fn beside_with(needs: &[Need]) -> Held {
    // Needs come before the machine lock: a hold taken by starting a
    // process goes first.
    IMPLICIT.with(|i| i.borrow_mut().take());
    take(false, needs, "beside")
}

/// Called for each process a test starts through the harness: a test
/// that holds no lock yet takes [`beside`] until its thread ends.
pub fn implicit() {
    if MACHINE.with(Cell::get).0 > 0 {
        return;
    }
    let held = take(false, &[], "beside (started a process)");
    IMPLICIT.with(|i| *i.borrow_mut() = Some(held));
}

/// The needs, then the machine lock (exclusive or shared) and a slot,
/// unless this thread holds the machine already (a helper that asks
/// inside a test that asked).
fn take(exclusive: bool, needs: &[Need], kind: &'static str) -> Held {
    use rustix::fs::FlockOperation::{LockExclusive, LockShared};
    let asked = Instant::now();
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .to_string();
    if std::env::var_os(CHILD).is_some() {
        return Held {
            files: Vec::new(),
            machine: false,
            test,
            kind,
            asked,
            got: asked,
        };
    }
    let (holds, has_all) = MACHINE.with(Cell::get);
    assert!(
        holds == 0 || has_all || !exclusive,
        "a test asked for the machine alone while it held it shared: ask for `alone` first"
    );
    assert!(
        holds == 0 || needs.is_empty(),
        "a test asked for {needs:?} while it held the machine: name them in its first lock"
    );
    let mut needs = needs.to_vec();
    needs.sort();
    needs.dedup();
    // A test with needs is one of the long ones (torch ranks, a
    // SLURM): it asks for a free slot more often, so the long ones start
    // first and the short ones fill the gaps, instead of the order of the
    // tests' names deciding which long one is left to run last.
    let every = if needs.is_empty() {
        Duration::from_millis(250)
    } else {
        Duration::from_millis(20)
    };
    let mut files: Vec<fs::File> = needs.into_iter().map(|n| slot(&n.slots(), every)).collect();
    if holds == 0 {
        let machine = open("oomguard-serial-tests.lock");
        rustix::fs::flock(&machine, if exclusive { LockExclusive } else { LockShared })
            .expect("flock on the machine lock");
        files.push(machine);
        if !exclusive {
            let slots: Vec<String> = (0..BESIDE)
                .map(|i| format!("oomguard-test-beside-{i}.lock"))
                .collect();
            files.push(slot(&slots, every));
        }
    }
    MACHINE.with(|m| m.set((holds + 1, has_all || exclusive)));
    let got = Instant::now();
    // A deadline armed before the wait starts again from here.
    super::deadline::postpone(got - asked);
    Held {
        files,
        machine: holds == 0,
        test,
        kind,
        asked,
        got,
    }
}

/// One free file of `names` locked, trying `every` so long when all are
/// taken.
fn slot(names: &[String], every: Duration) -> fs::File {
    use rustix::fs::FlockOperation::{LockExclusive, NonBlockingLockExclusive};
    let files: Vec<fs::File> = names.iter().map(|n| open(n)).collect();
    if let [only] = files.as_slice() {
        rustix::fs::flock(only, LockExclusive).expect("flock on a lock file");
        return files.into_iter().next().expect("one lock file");
    }
    loop {
        if let Some(i) = files
            .iter()
            .position(|f| rustix::fs::flock(f, NonBlockingLockExclusive).is_ok())
        {
            return files.into_iter().nth(i).expect("the locked file");
        }
        std::thread::sleep(every);
    }
}

fn open(name: &str) -> fs::File {
    let path = std::env::temp_dir().join(name);
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open the test lock {}: {e}", path.display()))
}

impl Drop for Held {
    fn drop(&mut self) {
        // At the thread's end (an implicit hold) the count may be gone
        // already: so is the thread.
        let _ = MACHINE.try_with(|m| {
            let (n, all) = m.get();
            let n = n.saturating_sub(1);
            m.set((n, all && n > 0));
        });
        if !self.machine {
            return;
        }
        let Some(out) = std::env::var_os("OOMGUARD_TEST_TIMES") else {
            return;
        };
        let line = format!(
            "{}\t{}\t{:.1}\t{:.1}\n",
            self.test,
            self.kind,
            (self.got - self.asked).as_secs_f64(),
            self.got.elapsed().as_secs_f64()
        );
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(out) {
            let _ = f.write_all(line.as_bytes());
        }
        // The locks go with the files, after the line is written.
        self.files.clear();
    }
}
