//! Helpers some of the suite's files share: the fake NVML, Prometheus, the
//! report screenshot, the memory shapes, the cgroup v2 VM and a proxy in
//! front of a job's store.

pub mod fake_nvml;
pub mod prometheus;
pub mod screenshot;
pub mod shapes;
pub mod store_proxy;
pub mod vm;
