//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade: the application
//! installs the exporter it wants (Prometheus, OpenTelemetry, StatsD); without one, each
//! measurement costs an atomic load. Events (why a node failed, which lock was lost) go
//! to `tracing`; metrics count and time them.
//!
//! Labels carry bounded values only: outcomes and operation names from fixed lists, and
//! node addresses as configured (no credentials). Resource names are never labels.
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `redlock_acquisitions_total` | counter | `outcome`: `granted`, `contended`, `unavailable`, `invalid` | lock requests, by how they ended |
//! | `redlock_acquire_duration_seconds` | histogram | `outcome` | how long a lock request took, retries and waiting included |
//! | `redlock_acquire_attempts` | histogram | `outcome` | attempts per lock request |
//! | `redlock_releases_total` | counter | `outcome`: `released`, `failed` | releases asked for (`failed`: no majority answered) |
//! | `redlock_handovers_total` | counter | | releases that handed the lock over to a queued waiter, per node |
//! | `redlock_extensions_total` | counter | `outcome`: `extended`, `failed` | the watchdog's extensions, per lock per round |
//! | `redlock_locks_lost_total` | counter | | watched locks declared lost (not extended on a majority in time) |
//! | `redlock_queue_waiters` | gauge | | this process's requests waiting in a lock's queue |
//! | `redlock_permit_acquisitions_total` | counter | `outcome` | semaphore permit requests ([`Semaphore`](crate::semaphore::Semaphore)), by how they ended |
//! | `redlock_permit_acquire_duration_seconds` | histogram | `outcome` | how long a permit request took, waiting included |
//! | `redlock_permits_held` | gauge | | permits this process holds |
//! | `redlock_rw_acquisitions_total` | counter | `side`: `read`, `write`; `outcome` | read-write lock requests ([`RwLock`](crate::rwlock::RwLock)), by how they ended |
//! | `redlock_rw_acquire_duration_seconds` | histogram | `side`, `outcome` | how long a read or write request took, waiting included |
//! | `redlock_rw_locks_held` | gauge | `side` | read and write locks this process holds |
//! | `redlock_permit_waiters` | gauge | | this process's permit requests waiting for a permit (a waiting `acquire` also queues on one slot: `redlock_queue_waiters` counts it too) |
//! | `redlock_rw_waiters` | gauge | `side` | this process's read and write requests waiting |
//! | `redlock_node_duration_seconds` | histogram | `node`, `op` | one command to one node, answered or failed |
//! | `redlock_node_errors_total` | counter | `node`, `kind`: `timeout`, `connection`, `quarantined`, `refused`, `redis` | failed node commands |
//! | `redlock_node_quarantined` | gauge | `node` | 1 while the node sits in restart quarantine, else 0 |
//!
//! A permit is a semaphore's slot lock, so its attempts also count as lock requests
//! (one per slot tried), and its releases and extensions as a lock's.
//!
//! `op` is one of `acquire`, `release`, `extend`, `raise_fence`, `remaining`,
//! `server_time`, `join_queue`, `batch` (the watchdog's pipelined extensions), for
//! read-write locks `acquire_read`, `acquire_write`, `release_read`, `release_write`,
//! `downgrade`, `leave_writers`, and for
//! the operator's tools (see [`inspect`](crate::inspect)) `scan`, `inspect`, `health`,
//! `force_release`. Call [`describe`] once after installing a recorder to give
//! exporters the descriptions and units.
//!
//! The metrics of every lock operation are registered with the recorder once and their
//! handles kept, so that a measurement costs one atomic operation, not a lookup by
//! name and labels. Install the recorder before the first lock operation: handles are
//! kept from the first measurement made while a recorder is installed.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{
    Counter, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};

use crate::error::{Error, ErrorClass, NodeError};

/// Lock requests, by outcome.
pub const ACQUISITIONS: &str = "redlock_acquisitions_total";
/// How long a lock request took, by outcome.
pub const ACQUIRE_DURATION: &str = "redlock_acquire_duration_seconds";
/// Attempts per lock request, by outcome.
pub const ACQUIRE_ATTEMPTS: &str = "redlock_acquire_attempts";
/// Releases, by outcome.
pub const RELEASES: &str = "redlock_releases_total";
/// Releases that handed the lock over to a queued waiter, per node.
pub const HANDOVERS: &str = "redlock_handovers_total";
/// The watchdog's extensions, by outcome.
pub const EXTENSIONS: &str = "redlock_extensions_total";
/// Watched locks declared lost.
pub const LOCKS_LOST: &str = "redlock_locks_lost_total";
/// This process's requests waiting in a lock's queue.
pub const QUEUE_WAITERS: &str = "redlock_queue_waiters";
/// Semaphore permit requests, by outcome.
pub const PERMIT_ACQUISITIONS: &str = "redlock_permit_acquisitions_total";
/// How long a permit request took, by outcome.
pub const PERMIT_ACQUIRE_DURATION: &str = "redlock_permit_acquire_duration_seconds";
/// Permits this process holds.
pub const PERMITS_HELD: &str = "redlock_permits_held";
/// Read-write lock requests, by side and outcome.
pub const RW_ACQUISITIONS: &str = "redlock_rw_acquisitions_total";
/// How long a read-write lock request took, by side and outcome.
pub const RW_ACQUIRE_DURATION: &str = "redlock_rw_acquire_duration_seconds";
/// Read and write locks this process holds, by side.
pub const RW_LOCKS_HELD: &str = "redlock_rw_locks_held";
/// Permit requests waiting (found every permit taken, and wait by their retry policy).
pub const PERMIT_WAITERS: &str = "redlock_permit_waiters";
/// Read and write requests waiting, by side.
pub const RW_WAITERS: &str = "redlock_rw_waiters";
/// One command to one node, by node and operation.
pub const NODE_DURATION: &str = "redlock_node_duration_seconds";
/// Failed node commands, by node and kind.
pub const NODE_ERRORS: &str = "redlock_node_errors_total";
/// Whether a node sits in restart quarantine (1) or not (0).
pub const NODE_QUARANTINED: &str = "redlock_node_quarantined";

/// Gives the installed recorder each metric's description and unit (call it once,
/// after installing the recorder; exporters show them, e.g. as Prometheus `# HELP`).
pub fn describe() {
    describe_counter!(ACQUISITIONS, "Lock requests, by how they ended.");
    describe_histogram!(
        ACQUIRE_DURATION,
        Unit::Seconds,
        "How long a lock request took, retries and waiting included."
    );
    describe_histogram!(ACQUIRE_ATTEMPTS, Unit::Count, "Attempts per lock request.");
    describe_counter!(
        RELEASES,
        "Releases, by outcome (failed: no majority answered)."
    );
    describe_counter!(
        HANDOVERS,
        "Releases that handed the lock over to a queued waiter, per node."
    );
    describe_counter!(EXTENSIONS, "The watchdog's extensions, per lock per round.");
    describe_counter!(
        LOCKS_LOST,
        "Watched locks declared lost (not extended on a majority in time)."
    );
    describe_gauge!(
        QUEUE_WAITERS,
        "This process's requests waiting in a lock's queue."
    );
    describe_counter!(
        PERMIT_ACQUISITIONS,
        "Semaphore permit requests, by how they ended."
    );
    describe_histogram!(
        PERMIT_ACQUIRE_DURATION,
        Unit::Seconds,
        "How long a permit request took, waiting included."
    );
    describe_gauge!(PERMITS_HELD, "Semaphore permits this process holds.");
    describe_counter!(
        RW_ACQUISITIONS,
        "Read-write lock requests, by side and how they ended."
    );
    describe_histogram!(
        RW_ACQUIRE_DURATION,
        Unit::Seconds,
        "How long a read or write request took, waiting included."
    );
    describe_gauge!(RW_LOCKS_HELD, "Read and write locks this process holds.");
    describe_gauge!(
        PERMIT_WAITERS,
        "This process's permit requests waiting for a permit."
    );
    describe_gauge!(
        RW_WAITERS,
        "This process's read and write requests waiting."
    );
    describe_histogram!(
        NODE_DURATION,
        Unit::Seconds,
        "One command to one node, answered or failed."
    );
    describe_counter!(NODE_ERRORS, "Failed node commands, by kind.");
    describe_gauge!(
        NODE_QUARANTINED,
        "1 while the node sits in restart quarantine (it gets no vote), else 0."
    );
}

/// A handle registered with the installed recorder on first use, then reused.
///
/// Nothing is kept while no recorder is installed, so a recorder installed later still
/// gets every measurement from then on.
pub(crate) struct Cached<H>(OnceLock<H>);

impl<H> Cached<H> {
    pub(crate) const fn new() -> Self {
        Self(OnceLock::new())
    }

    fn with(&self, register: impl FnOnce() -> H, measure: impl FnOnce(&H)) {
        if let Some(handle) = self.0.get() {
            return measure(handle);
        }
        if recorder_stateful() {
            measure(self.0.get_or_init(register));
        } else {
            // The facade's stand-in (no recorder installed), or a recorder without
            // state of its own: asked every time, as the macros do.
            measure(&register());
        }
    }
}

/// Whether the current recorder has state, so that its handles can be kept: the
/// facade's stand-in, when none is installed, has none (a recorder that has none
/// either is asked at every measurement, which is correct, only slower).
fn recorder_stateful() -> bool {
    metrics::with_recorder(|recorder| std::mem::size_of_val(recorder) != 0)
}

/// The outcomes of a lock request, as labelled.
const OUTCOMES: [&str; 4] = ["granted", "contended", "unavailable", "invalid"];

static ACQUISITION_COUNTS: [Cached<Counter>; 4] = [const { Cached::new() }; 4];
static ACQUISITION_TIMES: [Cached<Histogram>; 4] = [const { Cached::new() }; 4];
static ACQUISITION_ATTEMPTS: [Cached<Histogram>; 4] = [const { Cached::new() }; 4];
static RELEASE_COUNTS: [Cached<Counter>; 2] = [const { Cached::new() }; 2];
static EXTENSION_COUNTS: [Cached<Counter>; 2] = [const { Cached::new() }; 2];

/// A lock request ended after `attempts` attempts and `elapsed`.
pub(crate) fn acquisition(result: Result<(), &Error>, attempts: u32, elapsed: Duration) {
    let index = outcome_index(result);
    let outcome = OUTCOMES[index];
    ACQUISITION_COUNTS[index].with(
        || counter!(ACQUISITIONS, "outcome" => outcome),
        |c| c.increment(1),
    );
    ACQUISITION_TIMES[index].with(
        || histogram!(ACQUIRE_DURATION, "outcome" => outcome),
        |h| h.record(elapsed.as_secs_f64()),
    );
    ACQUISITION_ATTEMPTS[index].with(
        || histogram!(ACQUIRE_ATTEMPTS, "outcome" => outcome),
        |h| h.record(f64::from(attempts)),
    );
}

/// The index of a request's outcome in [`OUTCOMES`].
fn outcome_index(result: Result<(), &Error>) -> usize {
    match result {
        Ok(()) => 0,
        Err(err) => match err.class() {
            ErrorClass::Contended { .. } => 1,
            ErrorClass::InvalidInput | ErrorClass::InvalidResource => 3,
            _ => 2,
        },
    }
}

/// A semaphore permit request ended after `elapsed`.
pub(crate) fn permit_acquisition(result: Result<(), &Error>, elapsed: Duration) {
    let outcome = OUTCOMES[outcome_index(result)];
    counter!(PERMIT_ACQUISITIONS, "outcome" => outcome).increment(1);
    histogram!(PERMIT_ACQUIRE_DURATION, "outcome" => outcome).record(elapsed.as_secs_f64());
}

/// A side of a read-write lock, as labelled.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RwSide {
    Read,
    Write,
}

impl RwSide {
    fn label(self) -> &'static str {
        match self {
            RwSide::Read => "read",
            RwSide::Write => "write",
        }
    }
}

/// A read or write request ended after `elapsed`.
pub(crate) fn rw_acquisition(side: RwSide, result: Result<(), &Error>, elapsed: Duration) {
    let outcome = OUTCOMES[outcome_index(result)];
    counter!(RW_ACQUISITIONS, "side" => side.label(), "outcome" => outcome).increment(1);
    histogram!(RW_ACQUIRE_DURATION, "side" => side.label(), "outcome" => outcome)
        .record(elapsed.as_secs_f64());
}

/// Counts one thing in its gauge while it lives: a held permit or read-write lock, or
/// a request waiting for one.
#[derive(Debug)]
pub(crate) struct Counted {
    gauge: &'static str,
    side: Option<RwSide>,
}

impl Counted {
    fn new(gauge: &'static str, side: Option<RwSide>) -> Self {
        let counted = Self { gauge, side };
        counted.add(1.0);
        counted
    }

    fn add(&self, delta: f64) {
        match self.side {
            None => gauge!(self.gauge).increment(delta),
            Some(side) => gauge!(self.gauge, "side" => side.label()).increment(delta),
        }
    }

    /// A permit, held.
    pub(crate) fn held_permit() -> Self {
        Self::new(PERMITS_HELD, None)
    }

    /// A read or write lock, held.
    pub(crate) fn held_rw(side: RwSide) -> Self {
        Self::new(RW_LOCKS_HELD, Some(side))
    }

    /// A permit request, waiting.
    pub(crate) fn waiting_permit() -> Self {
        Self::new(PERMIT_WAITERS, None)
    }

    /// A read or write request, waiting.
    pub(crate) fn waiting_rw(side: RwSide) -> Self {
        Self::new(RW_WAITERS, Some(side))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.add(-1.0);
    }
}

/// A release ended: a majority answered (`true`) or not.
pub(crate) fn release(answered: bool) {
    let (index, outcome) = if answered {
        (0, "released")
    } else {
        (1, "failed")
    };
    RELEASE_COUNTS[index].with(
        || counter!(RELEASES, "outcome" => outcome),
        |c| c.increment(1),
    );
}

/// `nodes` nodes handed a released lock over to a queued waiter.
pub(crate) fn handovers(nodes: usize) {
    if nodes > 0 {
        counter!(HANDOVERS).increment(u64::try_from(nodes).unwrap_or(u64::MAX));
    }
}

/// The watchdog extended a lock on a majority (`true`) or failed to.
pub(crate) fn extension(extended: bool) {
    let (index, outcome) = if extended {
        (0, "extended")
    } else {
        (1, "failed")
    };
    EXTENSION_COUNTS[index].with(
        || counter!(EXTENSIONS, "outcome" => outcome),
        |c| c.increment(1),
    );
}

/// The watchdog declared a lock lost.
pub(crate) fn lock_lost() {
    counter!(LOCKS_LOST).increment(1);
}

/// A request joined (`+1`) or left (`-1`) a lock's wait queue.
pub(crate) fn queue_waiters(delta: f64) {
    gauge!(QUEUE_WAITERS).increment(delta);
}

/// The operations timed per node, as labelled.
const NODE_OPS: [&str; 12] = [
    "acquire",
    "raise_fence",
    "release",
    "extend",
    "remaining",
    "server_time",
    "join_queue",
    "batch",
    "scan",
    "inspect",
    "health",
    "force_release",
];

/// One node's metric handles.
pub(crate) struct NodeMetrics {
    /// The node's address, as labelled.
    node: Arc<str>,
    durations: [Cached<Histogram>; NODE_OPS.len()],
}

impl NodeMetrics {
    pub(crate) fn new(node: &str) -> Self {
        Self {
            node: Arc::from(node),
            durations: [const { Cached::new() }; NODE_OPS.len()],
        }
    }

    /// The node's address, as labelled.
    pub(crate) fn node(&self) -> &Arc<str> {
        &self.node
    }

    /// One command to the node ended after `elapsed`; `op` is one of [`NODE_OPS`].
    pub(crate) fn command<T>(
        &self,
        op: &'static str,
        elapsed: Duration,
        result: &Result<T, NodeError>,
    ) {
        let seconds = elapsed.as_secs_f64();
        match NODE_OPS.iter().position(|known| *known == op) {
            Some(index) => self.durations[index].with(
                || histogram!(NODE_DURATION, "node" => Arc::clone(&self.node), "op" => op),
                |h| h.record(seconds),
            ),
            None => histogram!(NODE_DURATION, "node" => Arc::clone(&self.node), "op" => op)
                .record(seconds),
        }
        if let Err(err) = result {
            let kind = match err {
                NodeError::Timeout(_) => "timeout",
                NodeError::Quarantined(_) => "quarantined",
                NodeError::Redis(err) if crate::protocol::breaks_connection(err) => "connection",
                NodeError::Redis(_) => "redis",
                err if err.is_permanent() => "refused",
                _ => "connection",
            };
            counter!(NODE_ERRORS, "node" => Arc::clone(&self.node), "kind" => kind).increment(1);
        }
    }
}

/// `node` entered (`true`) or left restart quarantine.
pub(crate) fn quarantined(node: &Arc<str>, quarantined: bool) {
    gauge!(NODE_QUARANTINED, "node" => Arc::clone(node)).set(if quarantined { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use metrics::{Key, KeyName, Metadata, Recorder, SharedString};

    use super::*;

    static REGISTERED: AtomicUsize = AtomicUsize::new(0);

    /// A recorder with no state of its own (it counts registrations in a static).
    struct Stateless;

    impl Recorder for Stateless {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            REGISTERED.fetch_add(1, Ordering::Relaxed);
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn a_stateless_recorder_gets_every_measurement_and_nothing_is_kept() {
        let cached: Cached<Counter> = Cached::new();
        let measured = AtomicUsize::new(0);
        metrics::with_local_recorder(&Stateless, || {
            for _ in 0..3 {
                cached.with(
                    || counter!("test_total"),
                    |_| {
                        measured.fetch_add(1, Ordering::Relaxed);
                    },
                );
            }
        });
        assert_eq!(measured.load(Ordering::Relaxed), 3);
        assert_eq!(REGISTERED.load(Ordering::Relaxed), 3);
        assert!(
            cached.0.get().is_none(),
            "a later recorder must still be asked"
        );
    }
}
