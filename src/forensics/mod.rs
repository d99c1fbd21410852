//! Explaining deaths after the fact: kernel OOM reports (`kernel`, read live
//! through `kmsg`) and the job's own PyTorch error messages (`torch`).

pub mod kernel;
pub mod kmsg;
pub mod progress;
pub mod torch;
