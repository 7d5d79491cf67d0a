//! Wall-clock time for the scheduler, injectable.
//!
//! Cron ticks are wall-clock times, so the scheduler asks a [`Clock`] what time it is and
//! to sleep until a tick. Locks and timeouts use tokio's monotonic time, never this clock.
//! [`SystemClock`] is the default; [`ManualClock`] is moved by hand (tests of jobs around a
//! DST transition, say); a clock of your own can model skew.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use redlock_scheduler::time::{Clock, ManualClock};
//!
//! let clock = ManualClock::new(Utc.with_ymd_and_hms(2026, 11, 1, 5, 0, 0).unwrap());
//! clock.advance(std::time::Duration::from_secs(90));
//! assert_eq!(clock.now(), Utc.with_ymd_and_hms(2026, 11, 1, 5, 1, 30).unwrap());
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// A boxed, sendable future (what [`Clock::sleep_until`] returns).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;

    /// Completes once [`now`](Self::now) has reached `deadline`.
    fn sleep_until(&self, deadline: DateTime<Utc>) -> BoxFuture<'_, ()>;
}

/// The system's clock; sleeps with tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> BoxFuture<'_, ()> {
        Box::pin(sleep_until_by(self, deadline))
    }
}

/// Sleeps on tokio's timer until `clock` reads `deadline` (re-checking after each
/// sleep: a clock may be stepped meanwhile).
pub(crate) async fn sleep_until_by<C: Clock + ?Sized>(clock: &C, deadline: DateTime<Utc>) {
    loop {
        let left = (deadline - clock.now()).to_std().unwrap_or(Duration::ZERO);
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(Duration::from_secs(60))).await;
    }
}

/// A clock that only moves when told to: [`advance`](Self::advance) or
/// [`set`](Self::set). Sleepers wake as soon as the time they wait for is reached.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<watch::Sender<DateTime<Utc>>>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Arc::new(watch::Sender::new(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        self.now.send_modify(|now| {
            *now = now.checked_add_signed(by).unwrap_or(*now);
        });
    }

    /// Sets the clock (backwards too).
    pub fn set(&self, to: DateTime<Utc>) {
        self.now.send_replace(to);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.borrow()
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> BoxFuture<'_, ()> {
        let mut rx = self.now.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|now| *now >= deadline).await;
        })
    }
}

/// A deadline further away than any wait: about 30 years, as tokio's own "no timeout".
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 86_400);

/// The monotonic (tokio) instant `after` from now. A deadline so far away that it cannot
/// be represented (`Duration::MAX`, say) is no deadline: it is clamped to about 30 years
/// instead of overflowing.
pub(crate) fn instant_after(after: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    // Thirty years from now always fits; `now` itself is never reached.
    now.checked_add(after.min(FAR_FUTURE)).unwrap_or(now)
}

/// `t - d`, or the earliest time there is.
pub(crate) fn earlier(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `t + d`, or the latest time there is.
pub(crate) fn later(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_deadline_beyond_representation_is_no_deadline() {
        let start = tokio::time::Instant::now();
        let far = instant_after(Duration::MAX);
        assert!(far >= start + FAR_FUTURE);
        let near = instant_after(Duration::from_secs(1));
        assert!(near >= start + Duration::from_secs(1) && near < far);
    }

    #[tokio::test]
    async fn manual_clock_wakes_sleepers_when_advanced() {
        let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let clock = ManualClock::new(start);
        let later = start + chrono::Duration::seconds(10);
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep_until(later).await })
        };
        clock.advance(Duration::from_secs(5));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(5));
        tokio::time::timeout(Duration::from_secs(1), sleeper)
            .await
            .unwrap()
            .unwrap();
    }
}
