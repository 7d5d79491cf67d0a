//! Fencing tokens: [`FencingToken`], the fencing token of the request's lock, for the handler;
//! [`FencingTokenRejection`] and [`MissingToken`], why a request has none.

use std::fmt;

use http::request::Parts;
use http::{Extensions, Request};
use redlock_core::LockHandle;
use redlock_http::Problem;

use crate::response::{RefusalResponse, problem_response};

/// The fencing token of the request's lock (under a [`LockLayer`](crate::LockLayer) with
/// [`fencing`](crate::LockOptions::fencing) on), to pass with each write so that the
/// storage refuses a writer whose lock has expired and been taken since.
///
/// An axum 0.8 handler (feature `axum`) takes it as an argument; hyper and tonic call
/// [`from_request`](Self::from_request). See the [guide](crate::_guide#fencing-tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token's value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The token of the lock the layer holds for `request`; a rejection carries the
    /// request's id (`x-request-id`).
    ///
    /// ```
    /// use http::Request;
    /// use redlock_tower::{FencingToken, fencing::MissingToken};
    ///
    /// let request = Request::post("/orders/42/pay").body(())?; // through no lock layer
    /// let rejection = FencingToken::from_request(&request).unwrap_err();
    /// assert_eq!(rejection.reason(), MissingToken::NoLock);
    /// assert_eq!(rejection.to_response().status(), 500);
    /// # Ok::<(), http::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`FencingTokenRejection`] when the request holds no lock or its lock has no
    /// token ([`MissingToken`]).
    pub fn from_request<B>(request: &Request<B>) -> Result<Self, FencingTokenRejection> {
        Self::from_extensions(request.extensions())
            .map_err(|rejection| rejection.with_request_id(request_id(request.headers())))
    }

    /// [`from_request`](Self::from_request) from the request's extensions (tonic's); the
    /// rejection carries no request id.
    ///
    /// # Errors
    ///
    /// As [`from_request`](Self::from_request).
    pub fn from_extensions(extensions: &Extensions) -> Result<Self, FencingTokenRejection> {
        let reason = match extensions.get::<LockHandle>() {
            Some(lock) => match lock.fencing_token() {
                Some(token) => return Ok(Self(token)),
                None => MissingToken::FencingOff,
            },
            None if extensions.get::<FailedOpen>().is_some() => MissingToken::FailedOpen,
            None => MissingToken::NoLock,
        };
        Err(FencingTokenRejection {
            reason,
            request_id: None,
        })
    }

    /// [`from_request`](Self::from_request) for a request taken apart.
    ///
    /// # Errors
    ///
    /// As [`from_request`](Self::from_request).
    pub fn from_parts(parts: &Parts) -> Result<Self, FencingTokenRejection> {
        Self::from_extensions(&parts.extensions)
            .map_err(|rejection| rejection.with_request_id(request_id(&parts.headers)))
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

/// Put into the request's extensions by a layer that let it through without a lock
/// ([`fail_open`](crate::LockOptions::fail_open)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FailedOpen;

pub use redlock_http::MissingToken;

/// A request without a [`FencingToken`]: why ([`reason`](Self::reason)), the client's
/// answer ([`problem`](Self::problem), [`to_response`](Self::to_response); with the
/// `axum` feature, `IntoResponse`), naming no internals, and the cause with its fix for
/// the log (`Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencingTokenRejection {
    reason: MissingToken,
    request_id: Option<String>,
}

impl FencingTokenRejection {
    /// Why the request has no token.
    pub fn reason(&self) -> MissingToken {
        self.reason
    }

    /// The request's id (`x-request-id` or `x-correlation-id`), when known.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// Sets the request's id, echoed in the [`problem`](Self::problem).
    pub fn with_request_id(mut self, request_id: Option<String>) -> Self {
        self.request_id = request_id;
        self
    }

    /// The answer for the client ([`MissingToken::problem`]), with the request's id.
    pub fn problem(&self) -> Problem {
        let problem = self.reason.problem();
        problem.with_request_id(self.request_id.clone())
    }

    /// [`problem`](Self::problem) as a response ([`problem_response`]).
    pub fn to_response(&self) -> RefusalResponse {
        problem_response(&self.problem())
    }
}

impl fmt::Display for FencingTokenRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.reason {
            MissingToken::NoLock => {
                "the handler takes a `redlock_tower::FencingToken`, but the request holds no lock (no `LockHandle` in its extensions): no `LockLayer` covers this route (with axum, add it with `Router::route_layer` or `Router::layer` after the routes it is to cover: both wrap only the routes added before them), or the layer's key extractor let this request through unlocked (`Key::Pass`, e.g. an optional header that is missing)"
            }
            MissingToken::FencingOff => {
                "the handler takes a `redlock_tower::FencingToken`, but the request's lock was taken without one: turn fencing on for the layer with `LockOptions::fencing(true)` (or for the client with `RedlockBuilder::fencing(true)`)"
            }
            MissingToken::FailedOpen => {
                "the handler takes a `redlock_tower::FencingToken`, but the layer let the request through without a lock because the lock service was unavailable (`LockOptions::fail_open`): answered 503 instead"
            }
            _ => "the handler takes a `redlock_tower::FencingToken`, but the request has none",
        })
    }
}

impl std::error::Error for FencingTokenRejection {}

/// The request's id, from its `x-request-id` (or `x-correlation-id`) header.
fn request_id(headers: &http::HeaderMap) -> Option<String> {
    redlock_http::problem::request_id(|name| headers.get(name)?.to_str().ok())
}

#[cfg(feature = "axum")]
mod axum_impls {
    use axum::extract::FromRequestParts;
    use axum::response::{IntoResponse, Response};
    use http::request::Parts;

    use super::{FencingToken, FencingTokenRejection, MissingToken};

    /// Feature `axum`: the token of the request's lock, or a [`FencingTokenRejection`]
    /// (logged, with the cause and its fix).
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    impl<S: Send + Sync> FromRequestParts<S> for FencingToken {
        type Rejection = FencingTokenRejection;

        async fn from_request_parts(
            parts: &mut Parts,
            _state: &S,
        ) -> Result<Self, Self::Rejection> {
            Self::from_parts(parts).inspect_err(|rejection| log(rejection, parts.uri.path()))
        }
    }

    /// Logs the cause and its fix: at error level for a misconfiguration, at warn level
    /// when the layer failed open (it has logged the unavailability already).
    fn log(rejection: &FencingTokenRejection, path: &str) {
        let request_id = rejection.request_id.as_deref();
        match rejection.reason {
            MissingToken::FailedOpen => {
                tracing::warn!(path, request_id, cause = %rejection, "no fencing token: request refused");
            }
            _ => {
                tracing::error!(path, request_id, cause = %rejection, "no fencing token: request refused");
            }
        }
    }

    /// Feature `axum`: the [`problem`](FencingTokenRejection::problem) as an
    /// `application/problem+json` response.
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    impl IntoResponse for FencingTokenRejection {
        fn into_response(self) -> Response {
            self.to_response().map(axum::body::Body::from)
        }
    }
}
