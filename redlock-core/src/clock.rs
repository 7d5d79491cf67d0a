//! The monotonic clock core reads: std's, and under unit tests tokio's, so that the
//! simulator (`tests::sim`) runs validity, deadlines and the watchdog's schedule on
//! tokio's paused clock. Outside a paused runtime, tokio's clock is std's.

#[cfg(not(test))]
pub(crate) use std::time::Instant;
#[cfg(test)]
pub(crate) use tokio::time::Instant;
