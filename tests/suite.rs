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
