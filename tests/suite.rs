//! The integration suite: one test binary whose modules are the files
//! beside this one (`tests/shapes.rs` is `shapes::…`). One binary, not one
//! per file: cargo links it once and runs its files' tests side by side
//! instead of one binary after another; what may share the machine with
//! what is decided by the locks in `common` (docs/development.md, "Tests
//! side by side").

mod common;
mod support;

mod attach;
mod cgroup_fixtures;
mod cgroup_lifecycle;
mod companion;
mod deadline;
mod demo;
mod diagnosis;
mod docs;
mod doctor;
mod figures;
mod forensics_kernel;
mod github;
mod gpu;
mod identity;
mod layers;
mod lifecycle;
mod metrics;
mod multinode;
mod notify;
mod output;
mod policy;
mod preempt;
mod progress;
mod psi;
mod pss;
mod replay;
mod report;
mod restart;
mod run;
mod sbatch;
mod shapes;
mod shm;
mod snippets;
mod torch_stats;
mod torchrun;
mod transcripts;
mod tui;
mod tui_e2e;
mod unprivileged;
mod vm_attach_v2;
mod vm_cgroup_v2;
mod vm_systemd;

/// Every test of this binary takes its lock first and waits there for its
/// turn (`common::machine`), so the threads only decide how many can wait
/// from the start: all of them, so that the order of the names does not
/// leave the longest tests for last. Set before libtest's `main` reads it,
/// for this binary alone: the library's unit tests keep libtest's default
/// (one thread a core), which their real-time tests were written for. A
/// `RUST_TEST_THREADS` of your own (or `-- --test-threads N`) wins.
#[allow(unsafe_code)]
#[used]
#[unsafe(link_section = ".init_array")]
static WAIT_FROM_THE_START: extern "C" fn() = wait_from_the_start;

extern "C" fn wait_from_the_start() {
    if std::env::var_os("RUST_TEST_THREADS").is_none() {
        #[allow(unsafe_code)]
        // SAFETY: an `.init_array` entry runs before `main`, on the only
        // thread there is, so nothing reads the environment meanwhile.
        unsafe {
            std::env::set_var("RUST_TEST_THREADS", "400");
        }
    }
}
