//! Kernel OOM-killer reports: parsing every layout the kernel has printed.
