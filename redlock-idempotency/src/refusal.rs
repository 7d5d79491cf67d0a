//! Refusals: the vocabulary of `redlock-http` ([`Refusal`], [`RefusalKind`]), the same
//! for the lock, the concurrency limit and idempotency, counted here by outcome.

pub use redlock_http::{Refusal, RefusalKind};

use crate::telemetry::{Outcome, record_outcome};

/// `refusal`, counted in the requests-by-outcome metric.
pub(crate) fn counted(refusal: Refusal) -> Refusal {
    record_outcome(match refusal.kind {
        RefusalKind::InFlight | RefusalKind::NotReplayable | RefusalKind::Busy => Outcome::Conflict,
        RefusalKind::Mismatch => Outcome::Mismatch,
        RefusalKind::Unavailable => Outcome::Unavailable,
        _ => Outcome::Rejected,
    });
    refusal
}
