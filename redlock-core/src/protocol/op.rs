//! The lock operations sent to one node, and the keys they touch.

use std::time::Duration;

use rand::RngExt;

/// The longest TTL accepted: 30 days.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The most permits a semaphore may have ([`Redlock::semaphore`](crate::Redlock::semaphore)
/// refuses more with [`ArgumentError::PermitsAboveMax`](crate::ArgumentError::PermitsAboveMax)).
/// A full semaphore's waiter looks at every slot (and marks every held one) when it starts
/// waiting and at each release or rescan, so its cost grows with the size; each call's
/// memory does not (the slots are looked at 256 at a time).
pub const MAX_PERMITS: u32 = 4096;

/// A lock operation on one node. Every one answers a number: 0 is a "no" vote, anything
/// else a "yes" (for a fencing acquire, the node's token).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    /// `SET key value NX PX ttl` on one key, or the all-or-nothing script on several;
    /// with fence keys, the fencing script.
    Acquire {
        keys: &'a [String],
        fence_keys: &'a [String],
        value: &'a str,
        ttl_ms: u64,
        /// A queued waiter's attempt: the queue-aware script.
        waiter: Option<&'a Waiter>,
        /// A lock handed over to a waiter (`~<waiter>`) counts as free.
        barge: bool,
        /// With fence keys: a token is not below the node's clock in microseconds rounded
        /// down to a multiple of this (see `scripts::ACQUIRE_FENCED`).
        fence_step_us: u64,
    },
    /// Raise the fencing counters to at least `token`.
    RaiseFence {
        fence_keys: &'a [String],
        token: u64,
    },
    /// Compare-and-delete every key, in one of the [`ReleaseMode`]s. `dequeue`: first
    /// remove this waiter from the keys' wait queues. Answers the number of keys
    /// released, plus 65536 times the longest hand-over left pending (ms).
    Release {
        keys: &'a [String],
        value: &'a str,
        mode: ReleaseMode,
        handoff_ms: u64,
        dequeue: Option<&'a str>,
    },
    /// Compare-and-`PEXPIRE` every key, all or nothing.
    Extend {
        keys: &'a [String],
        value: &'a str,
        ttl_ms: u64,
    },
    /// The longest remaining TTL (ms) among the keys; 0 when none exists. Not a vote:
    /// it tells a waiter when the holder's lock ends at the latest.
    Remaining { keys: &'a [String] },
    /// The node's clock (ms since the Unix epoch). Not a vote.
    ServerTime,
    /// A waiter takes (or refreshes) its place in the keys' wait queues; answers the
    /// keys' longest remaining TTL (ms), 0 when all are free. Not a vote.
    JoinQueue {
        keys: &'a [String],
        waiter: &'a Waiter,
    },
    /// A read lock of a read-write lock (see `rwlock.rs`): set the reader's own key
    /// `key` unless the writer's key is held or a writer waits.
    AcquireRead {
        key: &'a str,
        rw: &'a RwKeys,
        value: &'a str,
        ttl_ms: u64,
    },
    /// The write lock of a read-write lock: set the writer's key unless it is held,
    /// a reader holds the lock or an older writer waits; if refused, wait in the
    /// writers' queue (which stops new readers).
    AcquireWrite {
        rw: &'a RwKeys,
        fence_keys: &'a [String],
        value: &'a str,
        ttl_ms: u64,
        writer: &'a WaitingWriter,
        fence_step_us: u64,
    },
    /// Delete a reader's key and its name in the readers' set; with `wake`, tell the
    /// waiting writers. Plain commands, no script: the key names the value, so no
    /// other value can be in it (see `command::release_read`).
    ReleaseRead {
        key: &'a str,
        rw: &'a RwKeys,
        value: &'a str,
        wake: bool,
    },
    /// Compare-and-delete the writer's key; with `wake`, tell the waiters.
    ReleaseWrite {
        rw: &'a RwKeys,
        value: &'a str,
        wake: bool,
    },
    /// A write lock becomes a read lock of the same value, keeping its TTL.
    Downgrade {
        key: &'a str,
        rw: &'a RwKeys,
        value: &'a str,
    },
    /// Mark every held key as waited for, without queueing (see `scripts::MARK`); answers
    /// how many are held. Not a vote.
    Mark { keys: &'a [String] },
    /// A writer leaves the writers' queue (it gave up, or took the lock elsewhere).
    LeaveWriters {
        rw: &'a RwKeys,
        writer: &'a WaitingWriter,
    },
}

/// The keys of one read-write lock on a node. Every name starts with the writer's key
/// (one hash tag).
#[derive(Debug, Clone)]
pub(crate) struct RwKeys {
    /// The writer's key: an ordinary lock key, and the channel of its wake-ups.
    pub(crate) write: String,
    /// The set of the reader keys (`<write>:reader:<value>`), alive or not.
    pub(crate) readers: String,
    /// The waiting writers (sorted set: writer id by the time it began waiting).
    pub(crate) writers: String,
    /// Their deadlines (sorted set: writer id by the time its place expires).
    pub(crate) writer_deadlines: String,
}

impl RwKeys {
    /// The keys of the read-write lock whose writer's key is `write`.
    pub(crate) fn new(write: String) -> Self {
        Self {
            readers: format!("{write}:readers"),
            writers: format!("{write}:writer-waiting"),
            writer_deadlines: format!("{write}:writer-waiting:until"),
            write,
        }
    }

    /// The key of the reader holding `value`.
    pub(crate) fn reader(&self, value: &str) -> String {
        format!("{}:reader:{value}", self.write)
    }
}

/// A writer's place in the writers' queue of a read-write lock.
#[derive(Debug, Clone)]
pub(crate) struct WaitingWriter {
    /// Random, unique per write request.
    pub(crate) id: String,
    /// When it began waiting (ms since the Unix epoch, by the nodes' clock): its place.
    pub(crate) since_ms: u64,
    /// How long a node keeps its place after its last attempt (ms); 0 takes no place
    /// (the request's last attempt).
    pub(crate) keep_ms: u64,
}

impl<'a> Op<'a> {
    /// Whether the answer is a vote (a node in quarantine may not give one; a release
    /// still runs there, it only deletes).
    /// The keys the operation works on (lock keys; fence keys for a fence raise), for
    /// error messages.
    pub(crate) fn keys(&self) -> &'a [String] {
        match *self {
            Op::Acquire { keys, .. }
            | Op::Release { keys, .. }
            | Op::Extend { keys, .. }
            | Op::Remaining { keys }
            | Op::JoinQueue { keys, .. }
            | Op::Mark { keys } => keys,
            Op::RaiseFence { fence_keys, .. } => fence_keys,
            Op::AcquireRead { rw, .. }
            | Op::AcquireWrite { rw, .. }
            | Op::ReleaseRead { rw, .. }
            | Op::ReleaseWrite { rw, .. }
            | Op::Downgrade { rw, .. }
            | Op::LeaveWriters { rw, .. } => std::slice::from_ref(&rw.write),
            Op::ServerTime => &[],
        }
    }

    /// The operation's name, as the metrics label it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::Acquire { .. } => "acquire",
            Op::RaiseFence { .. } => "raise_fence",
            Op::Release { .. } => "release",
            Op::Extend { .. } => "extend",
            Op::Remaining { .. } => "remaining",
            Op::ServerTime => "server_time",
            Op::JoinQueue { .. } => "join_queue",
            Op::AcquireRead { .. } => "acquire_read",
            Op::AcquireWrite { .. } => "acquire_write",
            Op::ReleaseRead { .. } => "release_read",
            Op::ReleaseWrite { .. } => "release_write",
            Op::Downgrade { .. } => "downgrade",
            Op::LeaveWriters { .. } => "leave_writers",
            Op::Mark { .. } => "mark",
        }
    }

    pub(crate) fn votes(&self) -> bool {
        !matches!(
            self,
            Op::Release { .. }
                | Op::Remaining { .. }
                | Op::JoinQueue { .. }
                | Op::ServerTime
                | Op::ReleaseRead { .. }
                | Op::ReleaseWrite { .. }
                | Op::LeaveWriters { .. }
                | Op::Mark { .. }
        )
    }
}

/// How a release treats the keys it frees (see `scripts::RELEASE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseMode {
    /// The cleanup of an attempt that lost: delete, tell nobody.
    Quiet,
    /// A lock's release (or a waiter passing on a hand-over): hand the key over to the
    /// next live waiter, or delete it and wake the waiters.
    HandOver,
    /// After a hand-over: a key whose hand-over expired untaken goes to the next waiter.
    FollowUp,
}

/// Splits a release's answer: keys released, and the longest hand-over left pending.
pub(crate) fn release_answer(answer: u64) -> (u64, Duration) {
    (answer % 65_536, Duration::from_millis(answer / 65_536))
}

/// One waiter's place in a resource's queues.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    /// `<client>.<random>:<ms>`: the client's id (its hand-overs are published on its
    /// channel), random bits unique per acquisition request, and how long (ms) a
    /// hand-over to this waiter is reserved for it.
    pub(crate) id: String,
    /// The key's value while a lock is handed over to this waiter.
    pub(crate) placeholder: String,
    /// When it began waiting (ms since the Unix epoch, by the nodes' clock: see
    /// `server_clock.rs`): its place in the queue.
    pub(crate) since_ms: u64,
    /// How long a node keeps its place after its last attempt (ms); 0 takes no place
    /// (the request's last attempt).
    pub(crate) keep_ms: u64,
}

impl Waiter {
    /// A new waiter whose attempts come at most `max_delay` apart, waiting since
    /// `since_ms`; a hand-over to it is reserved for `handoff`.
    pub(crate) fn new(
        client: &str,
        max_delay: Duration,
        node_timeout: Duration,
        handoff: Duration,
        since_ms: u64,
    ) -> Self {
        let id = format!(
            "{client}.{:016x}:{}",
            crate::value::rng().random::<u64>(),
            handoff.min(MAX_TTL).as_millis().max(1)
        );
        // Saturating, and at most the longest TTL: a retry delay of `Duration::MAX` is
        // a valid (if odd) policy, and Redis rejects expiries beyond its range.
        let keep = max_delay
            .saturating_mul(2)
            .saturating_add(node_timeout)
            .clamp(Duration::from_millis(100), MAX_TTL);
        Self {
            placeholder: format!("~{id}"),
            id,
            since_ms,
            keep_ms: u64::try_from(keep.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// The lock keys, then their queues, then the queues' deadlines (the release script's
/// `KEYS`).
pub(crate) fn with_queues(keys: &[String]) -> Vec<String> {
    let mut all = keys.to_vec();
    all.extend(keys.iter().map(|k| queue_key(k)));
    all.extend(keys.iter().map(|k| deadlines_key(k)));
    all
}

/// A queued attempt's `KEYS`: the lock keys, their queues, their queues' deadlines, the
/// fence counters (if any).
pub(crate) fn waiter_keys(keys: &[String], fence_keys: &[String]) -> Vec<String> {
    let mut all = with_queues(keys);
    all.extend(fence_keys.iter().cloned());
    all
}

/// The wait queue of a lock key (a sorted set: waiter id by the time it began waiting).
/// Same hash tag as the key.
fn queue_key(key: &str) -> String {
    QueueKey(key).to_string()
}

/// The name of lock key `.0`'s wait queue, written where it is needed (into a command,
/// with no string of its own).
pub(crate) struct QueueKey<'a>(pub(crate) &'a str);

impl std::fmt::Display for QueueKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:queue", self.0)
    }
}

/// When each waiter's place in the queue expires (a sorted set: waiter id by deadline).
/// Its queue's name and `:until`: the release script builds it so.
fn deadlines_key(key: &str) -> String {
    format!("{}:until", queue_key(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read lock's script is given the writer's key alone and builds the other
    /// names from it: they must be the ones the writer's script and the release use.
    #[test]
    fn the_read_script_builds_the_names_rw_keys_gives() {
        let rw = RwKeys::new("w".to_owned());
        let source = crate::protocol::scripts::ACQUIRE_READ_SOURCE;
        for (name, suffix) in [
            (&rw.writer_deadlines, ":writer-waiting:until"),
            (&rw.readers, ":readers"),
            (&rw.reader("v"), ":reader:"),
        ] {
            assert!(
                name.starts_with("w") && name[1..].starts_with(suffix),
                "{name}"
            );
            assert!(
                source.contains(&format!("writer .. '{suffix}'")),
                "{suffix}"
            );
        }
        assert_eq!(rw.reader("v"), "w:reader:v");
    }
}
