//! PyTorch error messages: CUDA out-of-memory and DataLoader worker deaths.
