//! The monotonic clock core reads: std's, and under unit tests tokio's, so that the
//! simulator (`tests::sim`) runs validity, deadlines and the watchdog's schedule on
//! tokio's paused clock. Outside a paused runtime, tokio's clock is std's.

#[cfg(not(test))]
pub(crate) use std::time::Instant;
#[cfg(test)]
pub(crate) use tokio::time::Instant;

#[cfg(test)]
thread_local! {
    /// The simulator's wall clock on this thread: a tokio instant and the time (ms since
    /// the Unix epoch) it stands for.
    static WALL: std::cell::Cell<Option<(Instant, u64)>> = const { std::cell::Cell::new(None) };
}

/// Under unit tests, makes this thread's wall clock read `ms` (ms since the Unix epoch)
/// now and move on with tokio's clock (`None`: the host's clock again).
#[cfg(test)]
pub(crate) fn set_wall_clock(ms: Option<u64>) {
    WALL.set(ms.map(|ms| (Instant::now(), ms)));
}

/// The simulator's wall clock, where it set one on this thread.
#[cfg(test)]
pub(crate) fn simulated_wall_ms() -> Option<u64> {
    let (at, ms) = WALL.get()?;
    Some(ms.saturating_add(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX)))
}
