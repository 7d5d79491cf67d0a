//! What a fan-out sends: one lock's keys and value, and which operation.

use std::sync::Arc;

use crate::protocol::{Op, ReleaseMode, RwKeys, Waiter, WaitingWriter};

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
    /// Become this target: a write lock becoming this read lock (see `rwlock.rs`).
    Convert,
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
    /// An ordinary lock, or one side of a read-write lock.
    pub(crate) mode: Mode,
}

/// What kind of lock a [`Target`] is: which scripts take and release it (an extension is
/// the same for all: a compare-and-`PEXPIRE` of the target's keys).
#[derive(Debug)]
pub(crate) enum Mode {
    /// An ordinary lock (a mutex, a semaphore's slot).
    Exclusive,
    /// A read lock of a read-write lock; the target's key is the reader's own.
    Read(Arc<RwKeys>),
    /// The write lock of a read-write lock; the target's key is the writer's.
    Write {
        rw: Arc<RwKeys>,
        writer: WaitingWriter,
    },
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
        let key = self.keys.first().map_or("", String::as_str);
        match (&self.mode, kind) {
            (Mode::Exclusive, _) | (_, OpKind::Extend { .. } | OpKind::RaiseFence { .. }) => {}
            (Mode::Read(rw), OpKind::Acquire { ttl_ms }) => {
                return Op::AcquireRead {
                    key,
                    rw,
                    value: &self.value,
                    ttl_ms,
                };
            }
            (Mode::Write { rw, writer }, OpKind::Acquire { ttl_ms }) => {
                return Op::AcquireWrite {
                    rw,
                    fence_keys: &self.fence_keys,
                    value: &self.value,
                    ttl_ms,
                    writer,
                    fence_step_us: self.fence_step_us,
                };
            }
            (Mode::Read(rw), OpKind::Release { mode }) => {
                return Op::ReleaseRead {
                    key,
                    rw,
                    value: &self.value,
                    wake: mode == ReleaseMode::HandOver,
                };
            }
            (Mode::Read(rw), OpKind::Dequeue) => {
                return Op::ReleaseRead {
                    key,
                    rw,
                    value: &self.value,
                    wake: true,
                };
            }
            (Mode::Write { rw, .. }, OpKind::Release { mode }) => {
                return Op::ReleaseWrite {
                    rw,
                    value: &self.value,
                    wake: mode == ReleaseMode::HandOver,
                };
            }
            (Mode::Write { rw, .. }, OpKind::Dequeue) => {
                return Op::ReleaseWrite {
                    rw,
                    value: &self.value,
                    wake: true,
                };
            }
            (Mode::Read(rw), OpKind::Convert) => {
                return Op::Downgrade {
                    key,
                    rw,
                    value: &self.value,
                };
            }
            (Mode::Write { .. }, OpKind::Convert) => {}
        }
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
            // Only a read lock's target is converted to; anything else asks, harmlessly,
            // how long its keys live.
            OpKind::Convert => Op::Remaining { keys: &self.keys },
        }
    }
}
