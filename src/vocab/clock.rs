//! The clocks. Every `Instant` the supervision loop and its log read comes
//! from tokio's clock, so a test that runs the loop on a paused runtime
//! (`start_paused`) moves time by itself, with no real waiting and no
//! timing to race. Anywhere else (and always in a release build, which has
//! no paused clock) this is the real monotonic clock. The wall clock serves
//! times that outlive the process and names that must not repeat.

use std::time::{Duration, Instant};

/// Now, on the loop's clock.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long ago `earlier` was, on the loop's clock (never negative).
pub fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// Seconds since the Unix epoch on the wall clock, for figures that leave
/// the process (a record read by the next run, a peer's vote, a metric's
/// timestamp); 0 on a clock set before 1970.
pub fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The wall clock's nanoseconds within its second: a part of a name that a
/// reused pid alone would repeat.
pub fn nonce() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
