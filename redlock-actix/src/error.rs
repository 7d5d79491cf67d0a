//! [`DistributedLockError`]: why a request did not get its lock, and its HTTP answer.

use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use actix_web::{HttpRequest, HttpResponse, ResponseError};

use redlock_http::key::BadKey;
use redlock_http::problem;
use redlock_http::{MissingToken, Problem, Refusal, RefusalKind};

use crate::DistributedLockConfig;

/// Why a request could not get (or release) its lock. As a [`ResponseError`] it answers
/// [`problem`](Self::problem) as `application/problem+json` (the same answer as
/// `redlock-tower`'s); details go to the log only.
///
/// ```
/// use actix_web::ResponseError;
/// use redlock_actix::{error::DistributedLockError, key::BadKey};
///
/// let err = DistributedLockError::BadKey(BadKey::new("the order id is empty"));
/// assert_eq!(err.error_response().status(), 400);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistributedLockError {
    /// Another holder has the lock: 409.
    #[error(transparent)]
    Busy(redlock_core::Error),

    /// No quorum of nodes answered, or the lock was lost or expired: 503.
    #[error(transparent)]
    Unavailable(redlock_core::Error),

    /// The request names no usable lock key: 400.
    #[error(transparent)]
    BadKey(BadKey),

    /// No [`DistributedLockConfig`] in `app_data`: 500.
    #[error(
        "no `redlock_actix::DistributedLockConfig` is registered for this route: add one with `.app_data(DistributedLockConfig::new(redlock))` on the App, scope or resource (as a plain value, not wrapped in `web::Data`)"
    )]
    MissingConfig,

    /// The lock call was rejected as invalid (e.g. a TTL): 500.
    #[error(transparent)]
    Misconfigured(redlock_core::Error),

    /// The background task taking or releasing the lock did not finish: 500.
    #[error("the lock's background task failed: {0}")]
    Background(String),

    /// A handler takes a [`FencingToken`](crate::FencingToken), but the request holds no
    /// lock: 500.
    #[error(
        "the handler takes a `redlock_actix::FencingToken`, but the request holds no lock (no `LockHandle` in its extensions): wrap the route's scope or resource in `LockMiddleware`, or take a `DistributedLock<T>` in the same handler; or the middleware's key let this request through unlocked (e.g. `LockMiddleware::header` without `Header::required`)"
    )]
    NoLock,

    /// A handler takes a [`FencingToken`](crate::FencingToken), but fencing is off: 500.
    #[error(
        "the handler takes a `redlock_actix::FencingToken`, but the request's lock was taken without one: turn fencing on with `LockOptions::fencing(true)` (or for the client with `RedlockBuilder::fencing(true)`)"
    )]
    NoFencingToken,

    /// A handler takes a [`FencingToken`](crate::FencingToken), but the request went
    /// through unlocked by [`fail_open`](crate::LockOptions::fail_open): 503.
    #[error(
        "the handler takes a `redlock_actix::FencingToken`, but the middleware let the request through without a lock because the lock service was unavailable (`LockOptions::fail_open`): answered 503 instead"
    )]
    FailedOpen,

    /// The key extractor refused the request with this problem (a `5xx` detail goes to
    /// the log only).
    #[error("the key extractor refused the request ({}): {}", .0.status, .0.detail)]
    Refused(Problem),

    /// The lock was lost while the request ran, with
    /// [`abort_on_loss`](crate::LockOptions::abort_on_loss): 503.
    #[error("the lock on `{0}` was lost while the request ran: request stopped")]
    Lost(String),
}

impl From<redlock_core::Error> for DistributedLockError {
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
    /// Why the request was refused, in the words of both web crates.
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

    /// The answer (status, `Retry-After`, body), by [`redlock_http`]: generic but for a
    /// bad key.
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

    /// `self` as the answer to `req`, logged with the request's id: the `on_refusal`
    /// hook's response of the request's configuration, or the problem.
    pub(crate) fn reject(self, req: &HttpRequest, resource: Option<&str>) -> actix_web::Error {
        let config = DistributedLockConfig::from_req(req);
        let mut refusal =
            Refusal::new(self.kind(), self.problem()).with_request_id(request_id(req));
        if let Some(resource) = resource {
            refusal = refusal.with_resource(resource);
        }
        if let Some(config) = config
            && refusal.kind == RefusalKind::Busy
        {
            refusal.problem.status = config.options.busy_code();
        }
        refusal.log(req.path(), &self);
        let response = match config {
            Some(config) => config.setup.render(&refusal),
            None => problem_response(&refusal.problem),
        };
        actix_web::error::InternalError::from_response(self, response).into()
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

/// The `application/problem+json` response for `problem` (with `Retry-After`).
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
