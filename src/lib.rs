//! oomguard: supervise a memory-hungry job (PyTorch training with DataLoader
//! workers first of all), measure its whole process tree honestly, and act
//! before the kernel OOM killer does.
//!
//! Data flows one way, once per tick (design.md §3):
//!
//! ```text
//! probe (proc tree, system, cgroup, psi, gpu)  -> model::Sample
//! Sample + history                             -> model::View (headroom, ETA)
//! policy (pure)                                -> decisions
//! run / supervise (signals, hooks, restarts)   -> outcomes
//! log, summary                                 <- samples, decisions, outcomes
//! ```
//!
//! Only `main.rs` knows about the terminal; everything else writes to the
//! NDJSON log or returns data. stdout and stderr belong to the job;
//! oomguard's own lines go to stderr with an `oomguard:` prefix.

pub mod ask;
pub mod attach;
pub mod cli;
pub mod clock;
pub mod companion;
pub mod demo;
pub mod demo_job;
pub mod doctor;
pub mod exit;
pub mod forensics;
pub mod github;
pub mod growth;
pub mod help;
pub mod inject;
pub mod keeper;
pub mod log;
pub mod manpage;
pub mod metrics;
pub mod model;
pub mod options;
pub mod policy;
pub mod probe;
pub mod pty;
pub mod relay;
pub mod replay;
pub mod report;
pub mod restart;
pub mod runtime;
pub mod settings;
pub mod supervise;
pub mod systemd;
pub mod tui;
pub mod units;
pub mod values;
pub mod verdict;
