//! oomguard: supervise a memory-hungry job (PyTorch training with DataLoader
//! workers first of all), measure its whole process tree honestly, and act
//! before the kernel OOM killer does.

pub mod forensics;
pub mod probe;
