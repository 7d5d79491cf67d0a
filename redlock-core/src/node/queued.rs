//! Whether a command sits in its node's connection queue, and whether someone counts on
//! that.

use std::sync::atomic::{AtomicU8, Ordering};

/// Not (or no longer) in the connection's queue.
const NOT_QUEUED: u8 = 0;
/// In the connection's queue: a command sent later on it runs after this one.
const QUEUED: u8 = 1;
/// In the queue, and someone counted on that: it sends later commands without waiting
/// for this one, so this one may not send a second step.
const RELIED_ON: u8 = 2;

/// Where one node's command stands in the node's connection queue.
///
/// Commands on one connection run in the order they were queued, so a lock's later
/// command (a release) need not wait for an earlier one (its acquire) that is already
/// queued there: the fan-out asks [`rely`](Self::rely). A command that may take a second
/// round trip (a `SET .. NX GET` that found the key being handed over runs a script
/// next) asks [`unmark`](Self::unmark) first: if someone already relied on its being
/// queued, the second step would run after their later command, so it is not sent.
#[derive(Debug, Default)]
pub(crate) struct Queued(AtomicU8);

impl Queued {
    /// Not queued yet.
    pub(crate) fn new() -> Self {
        Self(AtomicU8::new(NOT_QUEUED))
    }

    /// The command is now in the connection's queue.
    pub(crate) fn mark(&self) {
        let _ = self
            .0
            .compare_exchange(NOT_QUEUED, QUEUED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// For a second step: true if it may go (nobody relied on the first being the
    /// command's last), and the command then counts as not queued until it is done.
    pub(crate) fn unmark(&self) -> bool {
        match self
            .0
            .compare_exchange(QUEUED, NOT_QUEUED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state != RELIED_ON,
        }
    }

    /// For a later command that will not wait for this one: true if this one is queued
    /// (and from now on sends nothing more), false if the later one must wait for it.
    pub(crate) fn rely(&self) -> bool {
        match self
            .0
            .compare_exchange(QUEUED, RELIED_ON, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == RELIED_ON,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_step_goes_unless_relied_on() {
        let queued = Queued::new();
        assert!(!queued.rely(), "not queued: a later command must wait");
        assert!(queued.unmark(), "nobody relied on it");
        queued.mark();
        assert!(queued.unmark());
        assert!(!queued.rely(), "unmarked: a later command must wait");
        queued.mark();
        assert!(queued.rely());
        assert!(queued.rely(), "relied on stays relied on");
        assert!(!queued.unmark(), "relied on: no second step");
        queued.mark();
        assert!(
            queued.rely(),
            "marking again changes nothing once relied on"
        );
    }
}
