//! [`Refusal`]: a request answered by the layer itself, and why.

use std::time::Duration;

use redlock_http::Problem;

use crate::telemetry::{Outcome, record_outcome};

/// Why a request with an idempotency key was answered without running the handler (and
/// without a replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalKind {
    /// No usable key: missing where required, given twice, empty, too long, not
    /// visible ASCII; or no scope where a scope is configured. `400`.
    BadKey,
    /// The request's body is larger than `max_request_body`: it cannot be fingerprinted.
    /// `413`.
    BodyTooLarge,
    /// A request with the key runs now (on this replica or another). `409` with
    /// `Retry-After`.
    InFlight,
    /// The key was used for a different request (method, target, configured headers or
    /// body differ). `422`.
    Mismatch,
    /// The request ran, but its response was not stored (larger than `max_body`): it
    /// cannot be replayed. `409`, without `Retry-After`.
    NotReplayable,
    /// The lock service or the store did not answer. `503` with `Retry-After`.
    Unavailable,
    /// The server's configuration is wrong (a lock without fencing tokens, a resource
    /// name the lock refuses). `500`; the cause is in the log.
    Misconfigured,
}

/// A request the layer answers itself: the kind, and the problem to answer with
/// (status, `Retry-After`, `application/problem+json` body, through `redlock-http`).
/// Bodies say what the client can do, and nothing of the server's insides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub kind: RefusalKind,
    /// The answer.
    pub problem: Problem,
}

impl Refusal {
    pub(crate) fn new(kind: RefusalKind, problem: Problem) -> Self {
        record_outcome(match kind {
            RefusalKind::BadKey | RefusalKind::BodyTooLarge | RefusalKind::Misconfigured => {
                Outcome::Rejected
            }
            RefusalKind::InFlight | RefusalKind::NotReplayable => Outcome::Conflict,
            RefusalKind::Mismatch => Outcome::Mismatch,
            RefusalKind::Unavailable => Outcome::Unavailable,
        });
        Self { kind, problem }
    }

    /// A request whose key (or scope) is unusable: `400`, with `detail`.
    pub fn bad_key(detail: String) -> Self {
        Self::new(RefusalKind::BadKey, Problem::bad_key(detail))
    }

    /// A request body over `limit` bytes: `413`.
    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            RefusalKind::BodyTooLarge,
            Problem::new(
                413,
                "urn:redlock:idempotency:body-too-large",
                "Request body too large",
                format!(
                    "Requests with an idempotency key may carry at most {limit} bytes of body."
                ),
            ),
        )
    }

    pub(crate) fn in_flight(retry_after: Option<Duration>) -> Self {
        Self::new(
            RefusalKind::InFlight,
            Problem::new(
                409,
                "urn:redlock:idempotency:in-flight",
                "Request in progress",
                "A request with this idempotency key is being processed; retry after the delay in Retry-After to get its response.".to_owned(),
            )
            .with_retry_after(Some(retry_after.unwrap_or(redlock_http::FALLBACK_RETRY_AFTER))),
        )
    }

    pub(crate) fn mismatch() -> Self {
        Self::new(
            RefusalKind::Mismatch,
            Problem::new(
                422,
                "urn:redlock:idempotency:mismatch",
                "Idempotency key reused",
                "This idempotency key was used for a different request (method, path, body or headers differ). Use a new key for a new request.".to_owned(),
            ),
        )
    }

    pub(crate) fn not_replayable() -> Self {
        Self::new(
            RefusalKind::NotReplayable,
            Problem::new(
                409,
                "urn:redlock:idempotency:not-replayable",
                "Response not available",
                "The request with this idempotency key was processed, but its response was too large to keep and cannot be sent again. Use a new key to run the request again.".to_owned(),
            ),
        )
    }

    pub(crate) fn unavailable(retry_after: Option<Duration>) -> Self {
        Self::new(
            RefusalKind::Unavailable,
            Problem::unavailable(
                "The idempotency service is temporarily unavailable; retry after the delay in Retry-After.".to_owned(),
                retry_after,
            ),
        )
    }

    pub(crate) fn misconfigured() -> Self {
        Self::new(
            RefusalKind::Misconfigured,
            Problem::misconfigured(redlock_http::MISCONFIGURED_DETAIL.to_owned()),
        )
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.problem.status, self.problem.title, self.problem.detail
        )
    }
}

impl std::error::Error for Refusal {}
