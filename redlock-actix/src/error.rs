//! [`DistributedLockError`]: why a request did not get its lock, and its HTTP answer.

use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use actix_web::{HttpRequest, HttpResponse, ResponseError};

use redlock_http::key::BadKey;
use redlock_http::problem;
use redlock_http::{MissingToken, Problem, RefusalKind};

/// Why a request could not get (or release) its lock.
///
/// It implements [`ResponseError`]: the answer is an
/// [RFC 9457](https://www.rfc-editor.org/rfc/rfc9457) `application/problem+json` body
/// built by [`redlock_http::Problem`] (the same answer as `redlock-tower`'s),
/// with a `Retry-After` header when the client may retry:
///
/// | variant | status | `Retry-After` |
/// | --- | --- | --- |
/// | [`Busy`](Self::Busy) | 409 | the holder's remaining validity (whole seconds, rounded up), 1 s when no node said |
/// | [`Unavailable`](Self::Unavailable) | 503 | 1 s |
/// | [`BadKey`](Self::BadKey) | 400 | none |
/// | [`MissingConfig`](Self::MissingConfig), [`Misconfigured`](Self::Misconfigured), [`Background`](Self::Background) | 500 | none |
/// | [`NoLock`](Self::NoLock), [`NoFencingToken`](Self::NoFencingToken) | 500 | none |
/// | [`FailedOpen`](Self::FailedOpen), [`Lost`](Self::Lost) | 503 | 1 s |
///
/// Bodies carry a generic detail (see [`Problem::from_error`]) and, when the request
/// has an `x-request-id` or `x-correlation-id` header, its id; node addresses and error
/// texts go to the server's log only. `NoLock` and `NoFencingToken` say which of the
/// two mistakes it is (no lock for the route, a lock without fencing), and the log (the
/// error's `Display`) names the setting to change.
///
/// ```
/// use actix_web::ResponseError;
/// use redlock_actix::{error::DistributedLockError, key::BadKey};
///
/// let err = DistributedLockError::BadKey(BadKey::new("the order id is empty"));
/// let response = err.error_response();
/// assert_eq!(response.status(), 400);
/// assert_eq!(response.headers().get("content-type").unwrap(), "application/problem+json");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistributedLockError {
    /// Another holder has the lock ([`redlock_core::Error::Taken`]): 409 Conflict.
    #[error(transparent)]
    Busy(redlock_core::Error),

    /// The lock service cannot decide: no quorum of nodes answered, or the lock was lost
    /// or expired ([`redlock_core::Error::NoQuorum`], `Lost`, `Expired`): 503.
    #[error(transparent)]
    Unavailable(redlock_core::Error),

    /// The request names no usable lock key (empty, longer than the client's
    /// [`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len), a missing
    /// header): 400.
    #[error(transparent)]
    BadKey(BadKey),

    /// No [`DistributedLockConfig`](crate::DistributedLockConfig) is registered in
    /// `app_data` for this route: 500.
    #[error(
        "no `redlock_actix::DistributedLockConfig` is registered for this route: add one with `.app_data(DistributedLockConfig::new(redlock))` on the App, scope or resource (as a plain value, not wrapped in `web::Data`)"
    )]
    MissingConfig,

    /// The lock call was rejected as invalid ([`redlock_core::Error::Argument`], e.g. a TTL
    /// the client does not accept): 500.
    #[error(transparent)]
    Misconfigured(redlock_core::Error),

    /// The background task taking or releasing the lock did not finish (the runtime given
    /// with [`DistributedLockConfig::runtime`](crate::DistributedLockConfig::runtime) was
    /// shut down, or the task panicked): 500.
    #[error("the lock's background task failed: {0}")]
    Background(String),

    /// A handler takes a [`FencingToken`](crate::FencingToken), but the request holds no
    /// lock: no [`LockMiddleware`](crate::LockMiddleware) wraps the route and the handler
    /// takes no [`DistributedLock`](crate::DistributedLock), or the middleware's key let
    /// the request through unlocked: 500.
    #[error(
        "the handler takes a `redlock_actix::FencingToken`, but the request holds no lock (no `LockHandle` in its extensions): wrap the route's scope or resource in `LockMiddleware`, or take a `DistributedLock<T>` in the same handler; or the middleware's key let this request through unlocked (e.g. `LockMiddleware::header` without `Header::required`)"
    )]
    NoLock,

    /// A handler takes a [`FencingToken`](crate::FencingToken), but the request's lock
    /// was taken without one (fencing is off): 500.
    #[error(
        "the handler takes a `redlock_actix::FencingToken`, but the request's lock was taken without one: turn fencing on with `LockOptions::fencing(true)` (or for the client with `RedlockBuilder::fencing(true)`)"
    )]
    NoFencingToken,

    /// A handler takes a [`FencingToken`](crate::FencingToken), but
    /// [`LockMiddleware`](crate::LockMiddleware) let the request through without a lock
    /// because the lock service was unavailable
    /// ([`fail_open`](crate::LockOptions::fail_open)): 503.
    #[error(
        "the handler takes a `redlock_actix::FencingToken`, but the middleware let the request through without a lock because the lock service was unavailable (`LockOptions::fail_open`): answered 503 instead"
    )]
    FailedOpen,

    /// The middleware's [`KeyExtractor`](crate::extract::KeyExtractor) refused the
    /// request ([`Key::Reject`](redlock_http::key::Key::Reject)), with this problem (its
    /// status; a `5xx` detail goes to the log only, the body says the server is
    /// misconfigured).
    #[error("the key extractor refused the request ({}): {}", .0.status, .0.detail)]
    Refused(Problem),

    /// The lock was lost while the request ran, and the middleware
    /// [aborts on loss](crate::LockOptions::abort_on_loss): 503.
    #[error("the lock on `{0}` was lost while the request ran: request stopped")]
    Lost(String),
}

impl From<redlock_core::Error> for DistributedLockError {
    /// Sorts a core error by the answer it gets: `Taken` is busy, an unusable resource
    /// name a bad key, another `Config` error a misconfiguration, anything else (no
    /// quorum, lost, expired) unavailable.
    fn from(err: redlock_core::Error) -> Self {
        match err.class() {
            redlock_core::ErrorClass::Contended { .. } => Self::Busy(err),
            redlock_core::ErrorClass::InvalidResource => {
                Self::BadKey(BadKey::new(Problem::from_error(&err).detail))
            }
            redlock_core::ErrorClass::InvalidInput => Self::Misconfigured(err),
            _ => Self::Unavailable(err),
        }
    }
}

impl From<BadKey> for DistributedLockError {
    fn from(err: BadKey) -> Self {
        Self::BadKey(err)
    }
}

impl DistributedLockError {
    /// Why the request was refused, in the words of both web crates (the `kind` of
    /// the [`Refusal`](crate::Refusal) handed to
    /// [`on_refusal`](crate::DistributedLockConfig::on_refusal)).
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Busy(_) => RefusalKind::Busy,
            Self::Unavailable(_) | Self::FailedOpen => RefusalKind::Unavailable,
            Self::BadKey(_) => RefusalKind::BadKey,
            Self::Refused(problem) if problem.status < 500 => RefusalKind::BadKey,
            Self::Lost(_) => RefusalKind::Lost,
            _ => RefusalKind::Misconfigured,
        }
    }

    /// The lock error behind it, for `Busy`, `Unavailable` and `Misconfigured`.
    pub fn lock_error(&self) -> Option<&redlock_core::Error> {
        match self {
            Self::Busy(err) | Self::Unavailable(err) | Self::Misconfigured(err) => Some(err),
            _ => None,
        }
    }

    /// The HTTP description of this error (status, `Retry-After`, body), from
    /// [`redlock_http`], so that every integration answers alike. The detail is
    /// generic for everything but a bad key (which is about the request itself).
    pub fn problem(&self) -> Problem {
        match self {
            Self::Busy(err) | Self::Unavailable(err) | Self::Misconfigured(err) => {
                Problem::from_error(err)
            }
            Self::BadKey(err) => err.problem(),
            Self::MissingConfig | Self::Background(_) => {
                Problem::misconfigured(problem::MISCONFIGURED_DETAIL.to_owned())
            }
            Self::NoLock => MissingToken::NoLock.problem(),
            Self::NoFencingToken => MissingToken::FencingOff.problem(),
            Self::FailedOpen => MissingToken::FailedOpen.problem(),
            Self::Lost(_) => Problem::lost_while_running(),
            Self::Refused(problem) => {
                redlock_http::Refusal::from_key_problem(problem.clone()).problem
            }
        }
    }

    /// [`problem`](Self::problem), carrying `req`'s request id.
    pub fn problem_for(&self, req: &HttpRequest) -> Problem {
        self.problem().with_request_id(request_id(req))
    }

    /// The default answer to `req`: logged with the request's id (the full error, node
    /// addresses included, goes to the log only), then the problem response.
    pub(crate) fn respond(self, req: &HttpRequest) -> actix_web::Error {
        let id = request_id(req);
        self.log(req.path(), id.as_deref());
        let response = problem_response(&self.problem().with_request_id(id));
        actix_web::error::InternalError::from_response(self, response).into()
    }

    /// Logs the refusal, with the full error (node addresses included).
    pub(crate) fn log(&self, path: &str, id: Option<&str>) {
        match self {
            Self::Busy(err) => {
                tracing::debug!(path, request_id = id, error = %err, "lock busy: request refused");
            }
            Self::BadKey(bad) => {
                tracing::debug!(path, request_id = id, detail = %bad, "no usable lock key in the request");
            }
            Self::Unavailable(err) => {
                tracing::warn!(path, request_id = id, error = %err, "lock service unavailable: request refused");
            }
            Self::Refused(problem) if problem.status >= 500 => {
                tracing::error!(path, request_id = id, status = problem.status, detail = %problem.detail, "request refused by the key extractor");
            }
            Self::Refused(problem) => {
                tracing::debug!(path, request_id = id, status = problem.status, detail = %problem.detail, "request refused by the key extractor");
            }
            Self::FailedOpen | Self::Lost(_) => {
                tracing::warn!(path, request_id = id, error = %self, "request refused");
            }
            Self::MissingConfig
            | Self::Misconfigured(_)
            | Self::Background(_)
            | Self::NoLock
            | Self::NoFencingToken => {
                tracing::error!(path, request_id = id, error = %self, "lock misconfigured: request refused");
            }
        }
    }
}

/// The request's id, from its `x-request-id` (or `x-correlation-id`) header.
pub(crate) fn request_id(req: &HttpRequest) -> Option<String> {
    redlock_http::problem::request_id(|name| req.headers().get(name)?.to_str().ok())
}

impl ResponseError for DistributedLockError {
    fn status_code(&self) -> StatusCode {
        status_of(&self.problem())
    }

    fn error_response(&self) -> HttpResponse {
        problem_response(&self.problem())
    }
}

/// An `application/problem+json` response for `problem`, with `Retry-After` when it
/// has one.
pub fn problem_response(problem: &Problem) -> HttpResponse {
    let mut response = HttpResponse::build(status_of(problem));
    response.insert_header((
        CONTENT_TYPE,
        HeaderValue::from_static(problem::CONTENT_TYPE),
    ));
    if let Some(secs) = problem.retry_after_secs() {
        response.insert_header((RETRY_AFTER, HeaderValue::from(secs)));
    }
    response.body(problem.to_json())
}

/// The status of `problem` ([`Problem::http_status`]).
pub(crate) fn status_of(problem: &Problem) -> StatusCode {
    StatusCode::from_u16(problem.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use actix_web::body::MessageBody;

    use super::*;

    fn parts(err: &DistributedLockError) -> (u16, Option<String>, String, String) {
        let response = err.error_response();
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|v: &HeaderValue| v.to_str().unwrap_or_default().to_owned())
        };
        let (retry_after, content_type) = (header(RETRY_AFTER), header(CONTENT_TYPE));
        let status = response.status().as_u16();
        let body = response.into_body().try_into_bytes().unwrap_or_default();
        (
            status,
            retry_after,
            content_type.unwrap_or_default(),
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    #[test]
    fn busy_is_409_with_the_holders_remaining_time() {
        let err = DistributedLockError::from(redlock_core::Error::Taken {
            resource: "order:42".into(),
            nodes: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            total: 3,
            attempts: 1,
            retry_after: Some(Duration::from_millis(1200)),
        });
        assert!(matches!(err, DistributedLockError::Busy(_)));
        let (status, retry_after, content_type, body) = parts(&err);
        assert_eq!(status, 409);
        assert_eq!(retry_after.as_deref(), Some("2"));
        assert_eq!(content_type, "application/problem+json");
        assert!(body.contains(r#""status":409"#), "{body}");
        assert!(!body.contains("order:42"), "{body}");
        assert!(!body.contains("127.0.0.1"), "{body}");
    }

    #[test]
    fn no_quorum_is_503_with_a_retry_after() {
        let err = DistributedLockError::from(redlock_core::Error::NoQuorum {
            resource: "order:42".into(),
            needed: 2,
            total: 3,
            failures: Vec::new(),
        });
        assert!(matches!(err, DistributedLockError::Unavailable(_)));
        let (status, retry_after, _, body) = parts(&err);
        assert_eq!(status, 503);
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert!(body.contains(r#""status":503"#), "{body}");
    }

    #[test]
    fn missing_config_is_500_with_a_generic_body() {
        let (status, retry_after, content_type, body) = parts(&DistributedLockError::MissingConfig);
        assert_eq!(status, 500);
        assert_eq!(retry_after, None);
        assert_eq!(content_type, "application/problem+json");
        assert!(!body.contains("DistributedLockConfig"), "{body}");
        assert!(
            DistributedLockError::MissingConfig
                .to_string()
                .contains("DistributedLockConfig")
        );
    }

    #[test]
    fn bad_key_is_400() {
        let (status, retry_after, _, body) = parts(&DistributedLockError::BadKey(BadKey::new(
            "the id is empty",
        )));
        assert_eq!(status, 400);
        assert_eq!(retry_after, None);
        assert!(body.contains("the id is empty"), "{body}");
    }
}
