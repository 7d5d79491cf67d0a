//! The monotonic clock core reads: std's, and under unit tests (and feature `sim`)
//! tokio's, so that the simulators (`tests::sim`, and those of crates built on this one)
//! run validity, deadlines and the watchdog's schedule on tokio's paused clock. Outside a paused runtime, tokio's clock is std's.

#[cfg(not(any(test, feature = "sim")))]
pub(crate) use std::time::Instant;
#[cfg(any(test, feature = "sim"))]
pub(crate) use tokio::time::Instant;

#[cfg(any(test, feature = "sim"))]
thread_local! {
    /// The simulator's wall clock on this thread: a tokio instant and the time (ms since
    /// the Unix epoch) it stands for.
    static WALL: std::cell::Cell<Option<(Instant, u64)>> = const { std::cell::Cell::new(None) };
}

/// Under unit tests and feature `sim`, makes this thread's wall clock read `ms` (ms since the Unix epoch)
/// now and move on with tokio's clock (`None`: the host's clock again).
#[cfg(any(test, feature = "sim"))]
pub(crate) fn set_wall_clock(ms: Option<u64>) {
    WALL.set(ms.map(|ms| (Instant::now(), ms)));
}

/// The simulator's wall clock, where it set one on this thread.
#[cfg(any(test, feature = "sim"))]
pub(crate) fn simulated_wall_ms() -> Option<u64> {
    let (at, ms) = WALL.get()?;
    Some(ms.saturating_add(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX)))
}

/// The instant type of the public API (`Lock::valid_until` and its kin): std's, also
/// with feature `sim`, so that enabling it for a simulation changes no signature the
/// crates built on this one compile against; under unit tests tokio's, as inside.
#[cfg(test)]
pub(crate) type ApiInstant = tokio::time::Instant;
/// The instant type of the public API: std's.
#[cfg(not(test))]
pub(crate) type ApiInstant = std::time::Instant;

/// `at` as the public API reports it (see [`ApiInstant`]); with feature `sim`, tokio's
/// instant as std's (the same outside a paused runtime).
pub(crate) fn to_api(at: Instant) -> ApiInstant {
    #[cfg(all(feature = "sim", not(test)))]
    let at = at.into_std();
    at
}
