//! The supervision loop's clock. Every `Instant` the loop and its log read
//! comes from tokio's clock, so a test that runs the loop on a paused
//! runtime (`start_paused`) moves time by itself, with no real waiting and
//! no timing to race. Anywhere else (and always in a release build, which
//! has no paused clock) this is the real monotonic clock.

use std::time::{Duration, Instant};

/// Now, on the loop's clock.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long ago `earlier` was, on the loop's clock (never negative).
pub fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}
