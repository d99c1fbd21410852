//! PyTorch caching-allocator statistics reported from inside the job (`--torch-stats`).
