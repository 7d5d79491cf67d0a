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
//! | `redlock_node_duration_seconds` | histogram | `node`, `op` | one command to one node, answered or failed |
//! | `redlock_node_errors_total` | counter | `node`, `kind`: `timeout`, `connection`, `quarantined`, `refused`, `redis` | failed node commands |
//! | `redlock_node_quarantined` | gauge | `node` | 1 while the node sits in restart quarantine, else 0 |
//!
//! `op` is one of `acquire`, `release`, `extend`, `raise_fence`, `remaining`,
//! `server_time`, `join_queue`, `batch` (the watchdog's pipelined extensions). Call
//! [`describe`] once after installing a recorder to give exporters the descriptions and
//! units.

use std::sync::Arc;
use std::time::Duration;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
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

/// A lock request ended after `attempts` attempts and `elapsed`.
pub(crate) fn acquisition(result: Result<(), &Error>, attempts: u32, elapsed: Duration) {
    let outcome = match result {
        Ok(()) => "granted",
        Err(err) => match err.class() {
            ErrorClass::Contended { .. } => "contended",
            ErrorClass::InvalidInput | ErrorClass::InvalidResource => "invalid",
            _ => "unavailable",
        },
    };
    counter!(ACQUISITIONS, "outcome" => outcome).increment(1);
    histogram!(ACQUIRE_DURATION, "outcome" => outcome).record(elapsed.as_secs_f64());
    histogram!(ACQUIRE_ATTEMPTS, "outcome" => outcome).record(f64::from(attempts));
}

/// A release ended: a majority answered (`true`) or not.
pub(crate) fn release(answered: bool) {
    let outcome = if answered { "released" } else { "failed" };
    counter!(RELEASES, "outcome" => outcome).increment(1);
}

/// `nodes` nodes handed a released lock over to a queued waiter.
pub(crate) fn handovers(nodes: usize) {
    if nodes > 0 {
        counter!(HANDOVERS).increment(u64::try_from(nodes).unwrap_or(u64::MAX));
    }
}

/// The watchdog extended a lock on a majority (`true`) or failed to.
pub(crate) fn extension(extended: bool) {
    let outcome = if extended { "extended" } else { "failed" };
    counter!(EXTENSIONS, "outcome" => outcome).increment(1);
}

/// The watchdog declared a lock lost.
pub(crate) fn lock_lost() {
    counter!(LOCKS_LOST).increment(1);
}

/// A request joined (`+1`) or left (`-1`) a lock's wait queue.
pub(crate) fn queue_waiters(delta: f64) {
    gauge!(QUEUE_WAITERS).increment(delta);
}

/// One command to `node` ended after `elapsed`.
pub(crate) fn node_command<T>(
    node: &Arc<str>,
    op: &'static str,
    elapsed: Duration,
    result: &Result<T, NodeError>,
) {
    histogram!(NODE_DURATION, "node" => Arc::clone(node), "op" => op).record(elapsed.as_secs_f64());
    if let Err(err) = result {
        let kind = match err {
            NodeError::Timeout(_) => "timeout",
            NodeError::Quarantined(_) => "quarantined",
            NodeError::Redis(err) if crate::protocol::breaks_connection(err) => "connection",
            NodeError::Redis(_) => "redis",
            err if err.is_permanent() => "refused",
            _ => "connection",
        };
        counter!(NODE_ERRORS, "node" => Arc::clone(node), "kind" => kind).increment(1);
    }
}

/// `node` entered (`true`) or left restart quarantine.
pub(crate) fn quarantined(node: &Arc<str>, quarantined: bool) {
    gauge!(NODE_QUARANTINED, "node" => Arc::clone(node)).set(if quarantined { 1.0 } else { 0.0 });
}
