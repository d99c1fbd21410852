//! oomguard binary entry point.
fn main() {}
