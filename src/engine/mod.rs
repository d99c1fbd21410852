//! What reads the job and decides: the probes (process tree, PSS, system,
//! cgroup, PSI, GPU) and the pure policy engine.

pub mod policy;
pub mod probe;
