//! Probes: everything oomguard reads from the kernel and drivers. Readers take
//! an injectable root so tests can point them at fixture trees; parsers take
//! text. Missing kernel data is `None`, never an error.

pub mod cgroup;
pub mod gpu;
pub mod proc;
pub mod pss;
pub mod shm;
pub mod system;
pub mod torch_stats;
