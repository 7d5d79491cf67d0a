//! The idempotency layer's metrics (through the `metrics` facade: the application
//! installs the exporter).
//!
//! | metric | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `redlock_idempotency_requests_total` | counter | `outcome` | requests with a key (or without one where it is optional), by what happened |
//! | `redlock_idempotency_stored_bytes_total` | counter | | body bytes of the responses stored |
//!
//! `outcome`: `first_run` (ran, response stored), `not_stored` (ran, response not
//! stored: its status, its size, or a store failure), `replayed`, `conflict` (in
//! flight elsewhere, or finished without a stored response), `mismatch` (the key was
//! used for another request), `rejected` (no usable key, a request body over the limit),
//! `unavailable` (the lock service or the store did not answer), `no_key` (optional key
//! absent: passed through).

/// What happened to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    FirstRun,
    NotStored,
    Replayed,
    Conflict,
    Mismatch,
    Rejected,
    Unavailable,
    NoKey,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::FirstRun => "first_run",
            Self::NotStored => "not_stored",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Rejected => "rejected",
            Self::Unavailable => "unavailable",
            Self::NoKey => "no_key",
        }
    }
}

pub(crate) fn record_outcome(outcome: Outcome) {
    metrics::counter!("redlock_idempotency_requests_total", "outcome" => outcome.as_str())
        .increment(1);
}

pub(crate) fn record_stored_bytes(bytes: usize) {
    metrics::counter!("redlock_idempotency_stored_bytes_total").increment(bytes as u64);
}
