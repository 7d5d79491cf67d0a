//! What a fan-out sends: one lock's keys and value, and which operation.

use crate::protocol::{Op, ReleaseMode, Waiter};

/// Which operation to send, with owned data so node futures can outlive the caller.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OpKind {
    Acquire {
        ttl_ms: u64,
    },
    RaiseFence {
        token: u64,
    },
    /// See [`ReleaseMode`].
    Release {
        mode: ReleaseMode,
    },
    Extend {
        ttl_ms: u64,
    },
    /// Leave the keys' wait queues, passing on a hand-over not taken (see `queue.rs`).
    Dequeue,
}

/// The keys and the random value of one lock.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) keys: Vec<String>,
    /// The fencing counters, one per key; empty without fencing.
    pub(crate) fence_keys: Vec<String>,
    pub(crate) value: String,
    /// How long a release reserves the lock for the next queued waiter (ms).
    pub(crate) handoff_ms: u64,
    /// Set for the attempts of a queued waiter (one resource only).
    pub(crate) waiter: Option<Waiter>,
    /// A request that will not wait (one attempt): a lock being handed over to a queued
    /// waiter counts as free for it (see `Redlock::try_lock`).
    pub(crate) barge: bool,
    /// The step of the clock floor of fencing tokens, in µs (see [`fence_step_us`]).
    pub(crate) fence_step_us: u64,
}

/// The step of the clock floor of fencing tokens (µs) for a client whose restart
/// quarantine lasts `quarantine` (its maximum TTL): half of it, at least 1 µs.
///
/// A token is not below the granting node's clock rounded down to this step, so the
/// nodes of one acquisition agree on the token (and no write-back is needed) unless
/// their clocks straddle a step; and a node that lost its counters, voting again at
/// least `quarantine` after it last stored one, floors the next token past every token
/// issued before, as long as the nodes' clocks agree to within the other half.
pub(crate) fn fence_step_us(quarantine: std::time::Duration) -> u64 {
    u64::try_from((quarantine / 2).as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl Target {
    pub(crate) fn op(&self, kind: OpKind) -> Op<'_> {
        match kind {
            OpKind::Acquire { ttl_ms } => Op::Acquire {
                keys: &self.keys,
                fence_keys: &self.fence_keys,
                value: &self.value,
                ttl_ms,
                waiter: self.waiter.as_ref(),
                barge: self.barge,
                fence_step_us: self.fence_step_us,
            },
            OpKind::RaiseFence { token } => Op::RaiseFence {
                fence_keys: &self.fence_keys,
                token,
            },
            OpKind::Release { mode } => Op::Release {
                keys: &self.keys,
                value: &self.value,
                mode,
                handoff_ms: self.handoff_ms,
                dequeue: None,
            },
            OpKind::Dequeue => Op::Release {
                keys: &self.keys,
                value: &self.value,
                mode: ReleaseMode::HandOver,
                handoff_ms: self.handoff_ms,
                dequeue: self.waiter.as_ref().map(|w| w.id.as_str()),
            },
            OpKind::Extend { ttl_ms } => Op::Extend {
                keys: &self.keys,
                value: &self.value,
                ttl_ms,
            },
        }
    }
}
