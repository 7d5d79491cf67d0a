//! Fanning one operation out to every node and counting the votes.
//!
//! Each node answers yes, no, or fails (error or timeout). A [`Fanout`] sends the
//! operation to all nodes at once and can stop listening as soon as the majority outcome
//! is decided: either a majority said yes, or so many said no or failed that a majority
//! can no longer be reached. The node operations still in flight at that point are not
//! abandoned: [`Fanout::finish_in_background`] lets them complete on the runtime.

mod fanout;
mod in_flight;
mod target;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use self::fanout::{Answers, Decision, Fanout, Pending, Until};
pub(crate) use self::in_flight::InFlight;
pub(crate) use self::target::{Mode, OpKind, Target, fence_step_us};
use crate::node::{Identities, Node};

/// The fixed part of the clock-drift allowance (the reference algorithm's 2 ms).
const DRIFT_FIXED: Duration = Duration::from_millis(2);

/// The N nodes a lock is taken on, how long each may take to answer, and how far their
/// clocks may drift: what a fan-out needs.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<Node>,
    /// Bounds every operation on one node, connecting included.
    pub(crate) node_timeout: Duration,
    /// The clock-drift factor (at most 0.25, checked by the builder).
    pub(crate) drift_factor: f64,
    /// Which server each node is (one server listed twice is refused).
    pub(crate) identities: Arc<Identities>,
}

impl Cluster {
    /// Nodes needed for a majority.
    pub(crate) fn quorum(&self) -> usize {
        majority(self.nodes.len())
    }

    /// The clock-drift allowance for `ttl`: `ttl * factor + 2 ms`.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        // `ttl <= MAX_TTL` and `factor <= 0.25` are checked before, so this cannot overflow.
        ttl.mul_f64(self.drift_factor).saturating_add(DRIFT_FIXED)
    }
}

/// The majority of `n` nodes: `n / 2 + 1`.
pub(crate) fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// Counts of votes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) nodes: usize,
    pub(crate) quorum: usize,
    pub(crate) yes: usize,
    pub(crate) no: usize,
    pub(crate) failed: usize,
}

impl Tally {
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            nodes,
            quorum: majority(nodes),
            yes: 0,
            no: 0,
            failed: 0,
        }
    }

    /// A majority said yes.
    pub(crate) fn won(&self) -> bool {
        self.yes >= self.quorum
    }

    /// A majority of yes can no longer be reached.
    pub(crate) fn lost(&self) -> bool {
        self.no + self.failed > self.nodes - self.quorum
    }

    /// Either way, the outcome is known.
    pub(crate) fn decided(&self) -> bool {
        self.won() || self.lost()
    }

    /// A majority of nodes answered (yes or no): the outcome is not a matter of
    /// unreachable nodes.
    pub(crate) fn majority_answered(&self) -> bool {
        self.yes + self.no >= self.quorum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_of_n() {
        assert_eq!(majority(1), 1);
        assert_eq!(majority(2), 2);
        assert_eq!(majority(3), 2);
        assert_eq!(majority(4), 3);
        assert_eq!(majority(5), 3);
    }

    #[test]
    fn decided_by_yes_majority_or_when_unreachable() {
        let mut t = Tally::new(5);
        t.yes = 2;
        t.no = 2;
        assert!(!t.decided());
        t.yes = 3;
        assert!(t.won() && t.decided());
        let mut t = Tally::new(5);
        t.no = 1;
        t.failed = 1;
        assert!(!t.lost());
        t.failed = 2;
        assert!(t.lost() && !t.won());
        let mut single = Tally::new(1);
        single.failed = 1;
        assert!(single.lost());
    }

    #[test]
    fn majority_answered_ignores_failures() {
        let mut t = Tally::new(5);
        t.no = 2;
        t.failed = 3;
        assert!(!t.majority_answered());
        t.no = 3;
        t.failed = 2;
        assert!(t.majority_answered());
    }
}
