//! Helpers some of the suite's files share: the fake NVML, Prometheus, the
//! report screenshot, the memory shapes and the cgroup v2 VM.

pub mod fake_nvml;
pub mod prometheus;
pub mod screenshot;
pub mod shapes;
pub mod vm;
