//! The safety checker: hold intervals on one monotonic clock, and fencing tokens.
//!
//! Every holder records when it got the lock and when its claim ended (it started to
//! release, or the validity ran out, whichever came first), with its fencing token.
//! [`SafetyLog::violations`] then finds any two claims that overlap, and any token that
//! is not strictly greater than the one of the claim before it.

use std::sync::Mutex;
use std::time::Instant;

/// One holder's claim on the resource.
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    /// Which client held it.
    pub client: usize,
    /// When the lock call returned.
    pub start: Instant,
    /// When the claim ended: release started, or validity ran out (the earlier).
    pub end: Instant,
    /// The fencing token, if any.
    pub token: Option<u64>,
}

/// A safety violation.
#[derive(Debug, Clone, Copy)]
pub enum Violation {
    /// Two claims overlapped in time: two holders at once.
    Overlap(Hold, Hold),
    /// A later claim carried a token not greater than the earlier one's.
    TokenNotIncreasing(Hold, Hold),
}

/// All claims of one run.
#[derive(Debug, Default)]
pub struct SafetyLog {
    holds: Mutex<Vec<Hold>>,
}

impl SafetyLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one claim.
    pub fn record(&self, hold: Hold) {
        self.holds.lock().expect("log lock").push(hold);
    }

    /// Number of claims recorded.
    pub fn len(&self) -> usize {
        self.holds.lock().expect("log lock").len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every violation, in time order.
    pub fn violations(&self) -> Vec<Violation> {
        let mut holds = self.holds.lock().expect("log lock").clone();
        holds.sort_by_key(|h| h.start);
        let mut found = Vec::new();
        // The claim reaching furthest so far: any later start before its end overlaps.
        let mut furthest: Option<Hold> = None;
        let mut previous: Option<Hold> = None;
        for hold in holds {
            if let Some(f) = furthest
                && hold.start < f.end
            {
                found.push(Violation::Overlap(f, hold));
            }
            if let (Some(p), Some(token)) = (previous, hold.token)
                && p.token.is_some_and(|prev| token <= prev)
            {
                found.push(Violation::TokenNotIncreasing(p, hold));
            }
            if furthest.is_none_or(|f| hold.end > f.end) {
                furthest = Some(hold);
            }
            previous = Some(hold);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hold(client: usize, start_ms: u64, end_ms: u64, token: u64, base: Instant) -> Hold {
        Hold {
            client,
            start: base + Duration::from_millis(start_ms),
            end: base + Duration::from_millis(end_ms),
            token: Some(token),
        }
    }

    #[test]
    fn finds_overlaps_and_stale_tokens() {
        let base = Instant::now();
        let log = SafetyLog::new();
        log.record(hold(0, 0, 10, 1, base));
        log.record(hold(1, 10, 20, 2, base));
        assert!(
            log.violations().is_empty(),
            "touching intervals do not overlap"
        );
        log.record(hold(2, 15, 16, 3, base));
        log.record(hold(3, 30, 40, 3, base));
        let v = log.violations();
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(matches!(v[0], Violation::Overlap(a, b) if a.client == 1 && b.client == 2));
        assert!(
            matches!(v[1], Violation::TokenNotIncreasing(a, b) if a.client == 2 && b.client == 3)
        );
    }

    #[test]
    fn an_overlap_with_an_earlier_long_claim_is_found() {
        let base = Instant::now();
        let log = SafetyLog::new();
        log.record(hold(0, 0, 100, 1, base));
        log.record(hold(1, 10, 20, 2, base));
        log.record(hold(2, 50, 60, 3, base));
        assert_eq!(log.violations().len(), 2);
    }
}

/// Hold intervals on one monotonic clock, from any number of holders (threads, tasks,
/// HTTP handlers); [`overlaps`](Self::overlaps) finds any two that intersect.
#[derive(Debug, Default)]
pub struct Intervals(Mutex<Vec<Interval>>);

/// One hold: start, end (monotonic clock), holder id.
pub type Interval = (Instant, Instant, usize);

impl Intervals {
    /// Records that `who` held from `start` to `end`.
    pub fn record(&self, start: Instant, end: Instant, who: usize) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((start, end, who));
    }

    /// Holds recorded.
    pub fn len(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether none was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pairs of overlapping holds (sorted by start, each compared with the next).
    pub fn overlaps(&self) -> Vec<(Interval, Interval)> {
        let mut all = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        all.sort_by_key(|i| i.0);
        all.windows(2)
            .filter(|w| w[1].0 < w[0].1)
            .map(|w| (w[0], w[1]))
            .collect()
    }
}
