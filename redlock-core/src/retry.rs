//! How a busy or unreachable lock is retried.
//!
//! After a failed attempt the client releases whatever it got, then sleeps
//! `base_delay + random(0..=jitter)` before the next one, so that competing clients do
//! not retry in lock-step. Attempts stop at `max_attempts`, or when the next sleep
//! would end past the `deadline` (measured from the first attempt), whichever comes
//! first.
//!
//! ```
//! use std::time::Duration;
//! use redlock_core::RetryPolicy;
//!
//! // Up to 2 s of waiting, whatever the number of attempts.
//! let patient = RetryPolicy::deadline(Duration::from_secs(2))
//!     .with_delay(Duration::from_millis(20), Duration::from_millis(30));
//! // Exactly one attempt: `try_lock`.
//! let once = RetryPolicy::once();
//! assert_eq!(once.max_attempts(), Some(1));
//! # let _ = patient;
//! ```

use std::time::Duration;

use rand::RngExt;

use crate::error::ArgumentError;

/// When and how often a failed acquisition is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: Option<u32>,
    deadline: Option<Duration>,
    base_delay: Duration,
    jitter: Duration,
    wake_jitter: Duration,
}

/// A random duration from zero to `max` (millisecond steps, microseconds below 1 ms).
pub(crate) fn random_up_to(max: Duration) -> Duration {
    let us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    if us == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(crate::value::rng().random_range(0..=us))
}

impl Default for RetryPolicy {
    /// 10 attempts, 50 ms + up to 50 ms of random jitter between them; woken up early
    /// by a release, retry after up to 2 ms of jitter.
    fn default() -> Self {
        Self {
            max_attempts: Some(10),
            deadline: None,
            base_delay: Duration::from_millis(50),
            jitter: Duration::from_millis(50),
            wake_jitter: Duration::from_millis(2),
        }
    }
}

impl RetryPolicy {
    /// Exactly one attempt, no retry.
    pub fn once() -> Self {
        Self::attempts(1)
    }

    /// At most `n` attempts (the default delays in between).
    pub fn attempts(n: u32) -> Self {
        Self {
            max_attempts: Some(n),
            ..Self::default()
        }
    }

    /// Retry until `deadline` has passed since the first attempt, with no attempt limit.
    pub fn deadline(deadline: Duration) -> Self {
        Self {
            max_attempts: None,
            deadline: Some(deadline),
            ..Self::default()
        }
    }

    /// Also stop after `n` attempts.
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// Also stop once `deadline` has passed since the first attempt.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sleep `base + random(0..=jitter)` between attempts.
    pub fn with_delay(mut self, base: Duration, jitter: Duration) -> Self {
        self.base_delay = base;
        self.jitter = jitter;
        self
    }

    /// When a release wakes a waiter up (see
    /// [`RedlockBuilder::wake_on_release`](crate::RedlockBuilder::wake_on_release)),
    /// it retries after a random `0..=jitter` (default 2 ms), so that waiters woken
    /// together do not split the votes.
    pub fn with_wake_jitter(mut self, jitter: Duration) -> Self {
        self.wake_jitter = jitter;
        self
    }

    /// The jitter after a wake-up.
    /// The fixed part of the sleep between two attempts.
    pub(crate) fn base_delay(&self) -> Duration {
        self.base_delay
    }

    /// The random part's maximum.
    pub(crate) fn jitter(&self) -> Duration {
        self.jitter
    }

    /// The longest sleep between two attempts.
    pub(crate) fn max_delay(&self) -> Duration {
        self.base_delay.saturating_add(self.jitter)
    }

    pub(crate) fn wake_jitter(&self) -> Duration {
        self.wake_jitter
    }

    /// The attempt limit, if any.
    pub fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The deadline, if any.
    pub fn deadline_after(&self) -> Option<Duration> {
        self.deadline
    }

    /// Checks that at least one attempt is allowed.
    pub(crate) fn validate(&self) -> Result<(), ArgumentError> {
        match self.max_attempts {
            Some(0) => Err(ArgumentError::ZeroAttempts),
            _ => Ok(()),
        }
    }

    /// The sleep before attempt number `attempts + 1`, or `None` if the policy says stop.
    /// `elapsed` is the time since the first attempt started.
    pub(crate) fn next_delay(&self, attempts: u32, elapsed: Duration) -> Option<Duration> {
        if self.max_attempts.is_some_and(|max| attempts >= max) {
            return None;
        }
        let delay = self.base_delay.saturating_add(random_up_to(self.jitter));
        match self.deadline {
            Some(deadline) if elapsed.saturating_add(delay) > deadline => {
                // Sleep only what is left, then make a last attempt, if anything is left.
                deadline.checked_sub(elapsed).filter(|left| !left.is_zero())
            }
            _ => Some(delay),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_stops_after_one_attempt() {
        assert_eq!(RetryPolicy::once().next_delay(1, Duration::ZERO), None);
    }

    #[test]
    fn delay_has_jitter_within_bounds() {
        let p = RetryPolicy::attempts(100)
            .with_delay(Duration::from_millis(10), Duration::from_millis(5));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let d = p.next_delay(1, Duration::ZERO).unwrap();
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(15));
            seen.insert(d);
        }
        assert!(seen.len() > 1, "jitter must vary the delay");
    }

    #[test]
    fn deadline_caps_the_last_sleep_and_then_stops() {
        let p = RetryPolicy::deadline(Duration::from_millis(100))
            .with_delay(Duration::from_millis(40), Duration::ZERO);
        assert_eq!(
            p.next_delay(5, Duration::from_millis(80)),
            Some(Duration::from_millis(20))
        );
        assert_eq!(p.next_delay(6, Duration::from_millis(100)), None);
        assert_eq!(p.next_delay(6, Duration::from_millis(150)), None);
    }

    #[test]
    fn zero_attempts_is_invalid() {
        assert_eq!(
            RetryPolicy::attempts(0).validate(),
            Err(ArgumentError::ZeroAttempts)
        );
    }
}
