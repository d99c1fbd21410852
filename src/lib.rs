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

pub mod engine;
pub mod job;
pub mod runtime;
pub mod settings;
pub mod sinks;
pub mod tools;
pub mod vocab;
