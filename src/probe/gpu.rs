//! GPU memory through NVML (nvml-wrapper), loaded at run time.
