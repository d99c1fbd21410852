//! oomguard's own exit codes, beside the job's (which it passes on): a leaf
//! that the runtime, the CI reporting and the demo all read, so none of
//! them imports another for a number.

/// The policy ended the job (EX_TEMPFAIL: requeue, retry).
pub const POLICY: i32 = 75;
/// The job succeeded but its peak footprint exceeded `--fail-above` (a
/// memory regression).
pub const FAIL_ABOVE: i32 = 76;
/// oomguard's own failure after the job started (EX_SOFTWARE).
pub const INTERNAL: i32 = 70;
/// The job succeeded but its output could not all be written where
/// oomguard's went (EX_IOERR: a full disk, an I/O error; a reader that went
/// away is not one).
pub const OUTPUT_LOST: i32 = 74;
