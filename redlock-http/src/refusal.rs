//! [`Refusal`]: a request answered by the integration itself instead of its handler, and
//! why ([`RefusalKind`]). One vocabulary for the three web capabilities (the lock, the
//! cluster-wide concurrency limit, idempotency) in both web crates.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redlock_core::{Error, ErrorClass};

use crate::Problem;
use crate::problem::{FALLBACK_RETRY_AFTER, MISCONFIGURED_DETAIL};

/// Why a request was answered without running its handler.
///
/// | kind | status | where |
/// | --- | --- | --- |
/// | [`BadKey`](Self::BadKey) | 400 | no usable key (or idempotency scope): missing where required, empty, too long, given twice; or the key extractor refused the request |
/// | [`Busy`](Self::Busy) | 409 (lock), 429 (limit): the `busy_status` option | the key's lock is held, or every permit is taken |
/// | [`InFlight`](Self::InFlight) | 409 | a request with the idempotency key runs now |
/// | [`Unavailable`](Self::Unavailable) | 503 | no quorum of Redis nodes (or the idempotency store) answered in time |
/// | [`Lost`](Self::Lost) | 503 | the lock (or permit) was lost while the request ran, with `abort_on_loss` |
/// | [`Misconfigured`](Self::Misconfigured) | 500 | the server's own configuration is wrong; the cause is in the log |
/// | [`BodyTooLarge`](Self::BodyTooLarge) | 413 | a request body over idempotency's `max_request_body` |
/// | [`Mismatch`](Self::Mismatch) | 422 | the idempotency key was used for another request |
/// | [`NotReplayable`](Self::NotReplayable) | 409 | the idempotency key's request ran, but its response was not kept |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalKind {
    /// The request names no usable key (a missing required header, an empty or too long
    /// key, no scope where one is configured), or the key extractor refused it.
    BadKey,
    /// Another request holds the key's lock, or every permit of the key's limit is
    /// taken (fail fast, or the wait deadline passed).
    Busy,
    /// A request with the idempotency key runs now (on this replica or another).
    InFlight,
    /// The lock service (or the idempotency store) could not decide: no quorum of Redis
    /// nodes reachable in time.
    Unavailable,
    /// The lock was lost while the request ran, and the integration aborts on loss.
    Lost,
    /// The server's own configuration is wrong (an invalid TTL, a prefix that leaves no
    /// room for keys, a fencing token asked for where the lock has none).
    Misconfigured,
    /// The request's body is larger than idempotency's `max_request_body`: it cannot be
    /// fingerprinted.
    BodyTooLarge,
    /// The idempotency key was used for a different request (method, target, configured
    /// headers or body differ).
    Mismatch,
    /// The idempotency key's request ran, but its response was not stored (larger than
    /// `max_body`): it cannot be replayed.
    NotReplayable,
}

impl RefusalKind {
    /// The kind of a lock error, by its class (see [`Problem::from_error`]).
    pub fn of(error: &Error) -> Self {
        match error.class() {
            ErrorClass::Contended { .. } => Self::Busy,
            ErrorClass::InvalidResource => Self::BadKey,
            ErrorClass::InvalidInput => Self::Misconfigured,
            ErrorClass::Lost => Self::Lost,
            _ => Self::Unavailable,
        }
    }
}

/// A request the integration answers itself: why ([`RefusalKind`]), the answer
/// ([`Problem`]: status, `Retry-After`, `application/problem+json` body), and, where
/// there is one, the resource it was about and the lock error behind it.
///
/// Handed to the `on_refusal` hook of the web crates' middleware; bodies say what the
/// client can do and nothing of the server's insides.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Refusal {
    /// Why.
    pub kind: RefusalKind,
    /// The answer. For [`RefusalKind::Busy`], its status is already the middleware's
    /// `busy_status`.
    pub problem: Problem,
    /// The resource and the lock error, where there are some (kept apart so that a
    /// refusal stays small in a `Result`).
    origin: Option<Arc<Origin>>,
}

#[derive(Debug, Default)]
struct Origin {
    resource: Option<String>,
    error: Option<Error>,
}

impl Refusal {
    /// A refusal of `kind`, answered with `problem`.
    pub fn new(kind: RefusalKind, problem: Problem) -> Self {
        Self {
            kind,
            problem,
            origin: None,
        }
    }

    /// Names the resource the refusal is about.
    #[must_use]
    pub fn with_resource(mut self, resource: impl Into<String>) -> Self {
        let error = self
            .origin
            .take()
            .and_then(|origin| Arc::try_unwrap(origin).ok())
            .and_then(|origin| origin.error);
        self.origin = Some(Arc::new(Origin {
            resource: Some(resource.into()),
            error,
        }));
        self
    }

    /// The lock's resource name (the resource prefix and the request's key), when a key
    /// was derived.
    pub fn resource(&self) -> Option<&str> {
        self.origin.as_ref()?.resource.as_deref()
    }

    /// The lock error behind it (busy, unavailable, misconfigured), for the log.
    pub fn error(&self) -> Option<&Error> {
        self.origin.as_ref()?.error.as_ref()
    }

    /// Sets the request's id in the problem body ([`Problem::with_request_id`]).
    #[must_use]
    pub fn with_request_id(mut self, request_id: Option<String>) -> Self {
        self.problem.request_id = request_id;
        self
    }

    /// The answer to a lock error, by its class ([`Problem::from_error`],
    /// [`RefusalKind::of`]), carrying the error.
    pub fn from_error(error: Error) -> Self {
        let mut refusal = Self::new(RefusalKind::of(&error), Problem::from_error(&error));
        refusal.origin = Some(Arc::new(Origin {
            resource: None,
            error: Some(error),
        }));
        refusal
    }

    /// A request whose key (or scope) is unusable: `400`, with `detail`.
    pub fn bad_key(detail: String) -> Self {
        Self::new(RefusalKind::BadKey, Problem::bad_key(detail))
    }

    /// The server's configuration is wrong: `500`, with a generic detail (the cause
    /// goes to the log).
    pub fn misconfigured() -> Self {
        Self::new(
            RefusalKind::Misconfigured,
            Problem::misconfigured(MISCONFIGURED_DETAIL.to_owned()),
        )
    }

    /// The lock was lost while the request ran, and the request was stopped: `503`.
    pub fn lost_while_running() -> Self {
        Self::new(RefusalKind::Lost, Problem::lost_while_running())
    }

    /// A request refused by a key extractor with `problem`: a `5xx` is the server's
    /// own mistake ([`RefusalKind::Misconfigured`], its detail replaced by a generic
    /// one: log the original first), anything else a [`RefusalKind::BadKey`].
    pub fn from_key_problem(mut problem: Problem) -> Self {
        if problem.status >= 500 {
            problem.detail = MISCONFIGURED_DETAIL.to_owned();
            Self::new(RefusalKind::Misconfigured, problem)
        } else {
            Self::new(RefusalKind::BadKey, problem)
        }
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

    /// A request whose body could not be read: `400`.
    pub fn unreadable_body() -> Self {
        Self::new(
            RefusalKind::BadKey,
            Problem::new(
                400,
                "urn:redlock:idempotency:unreadable-body",
                "Request body unreadable",
                "The request's body could not be read; send the request again.".to_owned(),
            ),
        )
    }

    /// A response whose body failed before it could be stored: `500`; a retry with the
    /// same idempotency key runs again.
    pub fn response_failed() -> Self {
        Self::new(
            RefusalKind::Misconfigured,
            Problem::new(
                500,
                "urn:redlock:idempotency:response-failed",
                "Response failed",
                "The response could not be produced; retry the request with the same idempotency key.".to_owned(),
            ),
        )
    }

    /// A request with the idempotency key runs now: `409` with `Retry-After`.
    pub fn in_flight(retry_after: Option<Duration>) -> Self {
        Self::new(
            RefusalKind::InFlight,
            Problem::new(
                409,
                "urn:redlock:idempotency:in-flight",
                "Request in progress",
                "A request with this idempotency key is being processed; retry after the delay in Retry-After to get its response.".to_owned(),
            )
            .with_retry_after(Some(retry_after.unwrap_or(FALLBACK_RETRY_AFTER))),
        )
    }

    /// The idempotency key was used for another request: `422`.
    pub fn mismatch() -> Self {
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

    /// The idempotency key's response was not kept: `409`, without `Retry-After`.
    pub fn not_replayable() -> Self {
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

    /// The idempotency service (its lock or its store) did not answer: `503` with
    /// `Retry-After`.
    pub fn unavailable(retry_after: Option<Duration>) -> Self {
        Self::new(
            RefusalKind::Unavailable,
            Problem::unavailable(
                "The idempotency service is temporarily unavailable; retry after the delay in Retry-After.".to_owned(),
                retry_after,
            ),
        )
    }

    /// Logs this refusal of a request to `path`, with its `cause` (the full error, node
    /// addresses included: for the log, never the body) and the request's id: a busy or
    /// bad key at debug, an unavailable service or a loss at warn, a misconfiguration at
    /// error.
    pub fn log(&self, path: &str, cause: &dyn fmt::Display) {
        let id = self.problem.request_id.as_deref();
        match self.kind {
            RefusalKind::Busy | RefusalKind::InFlight => {
                tracing::debug!(path, request_id = id, error = %cause, "lock busy: request refused");
            }
            RefusalKind::Unavailable => {
                tracing::warn!(path, request_id = id, error = %cause, "lock service unavailable: request refused");
            }
            RefusalKind::Lost => {
                tracing::warn!(path, request_id = id, error = %cause, "lock lost: request refused");
            }
            RefusalKind::Misconfigured => {
                tracing::error!(path, request_id = id, error = %cause, "lock misconfigured: request refused");
            }
            _ => {
                tracing::debug!(path, request_id = id, detail = %cause, "no usable lock key in the request");
            }
        }
    }

    /// The HTTP status to answer with ([`Problem::http_status`]).
    pub fn status(&self) -> u16 {
        self.problem.http_status()
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.problem.status, self.problem.title, self.problem.detail
        )
    }
}

impl std::error::Error for Refusal {}

impl From<crate::key::BadKey> for Refusal {
    fn from(bad: crate::key::BadKey) -> Self {
        Self::new(RefusalKind::BadKey, bad.problem())
    }
}

impl From<crate::key::KeyBoundError> for Refusal {
    fn from(error: crate::key::KeyBoundError) -> Self {
        match error {
            crate::key::KeyBoundError::TooLong { .. } => {
                Self::new(RefusalKind::BadKey, error.problem())
            }
            _ => Self::misconfigured(),
        }
    }
}
