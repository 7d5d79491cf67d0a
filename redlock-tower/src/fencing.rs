//! Fencing tokens: [`FencingToken`], the fencing token of the request's lock, for the handler;
//! [`FencingTokenRejection`] and [`MissingToken`], why a request has none.

use std::fmt;

use http::request::Parts;
use http::{Extensions, Request};
use redlock_core::LockHandle;
use redlock_http::Problem;

use crate::response::{RefusalResponse, problem_response};

/// The fencing token of the lock the [`LockLayer`](crate::LockLayer) holds for the
/// request: strictly greater for every new holder of the lock's key, to pass to the
/// storage with each write so that it can refuse a writer whose lock has expired and
/// been taken since (see `redlock-fence`).
///
/// It is read from the [`LockHandle`] that the layer puts into the request's
/// extensions, so it exists only under a layer taking its locks with
/// [`fencing`](crate::LockOptions::fencing) (or the client's
/// [`fencing`](redlock_core::RedlockBuilder::fencing) setting).
///
/// - In an axum 0.8 handler (feature `axum`), take it as an argument: it implements
///   `FromRequestParts`. Without a token the handler is not called, and the client gets
///   a [`FencingTokenRejection`] (see [`MissingToken`] for the statuses); its cause,
///   with the fix, goes to the log (`tracing`, at error level for a misconfiguration).
/// - Anywhere else (hyper, tonic, a plain tower service), call
///   [`from_request`](Self::from_request) or [`from_extensions`](Self::from_extensions).
///
/// ```
/// use axum::{Router, body::Body, routing::post};
/// use http::{Request, StatusCode};
/// use redlock_tower::{FencingToken, LockLayer, LockOptions, extract::PathParam};
/// use tower::ServiceExt;
///
/// async fn pay(FencingToken(token): FencingToken) -> String {
///     // e.g. `SqlFence::check(&mut *tx, "order:42", token)` before the write
///     format!("paid with token {token}")
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock_core::BoxError> {
/// # let cluster = redlock_testkit::Cluster::start(1).await;
/// # let redlock = redlock_core::Redlock::builder()
/// #     .nodes(cluster.urls())
/// #     .restart_quarantine(false) // the test node was started a moment ago
/// #     .build()?;
/// let per_order = LockLayer::new(redlock, PathParam::new("id"))
///     .options(LockOptions::new().resource_prefix("order:").fencing(true));
/// let app: Router = Router::new()
///     .route("/orders/{id}/pay", post(pay).route_layer(per_order))
///     // Not under the layer: no lock, so no token.
///     .route("/orders/{id}/quote", post(pay));
///
/// let request = |path: &str| Request::post(path).body(Body::empty());
/// let paid = app.clone().oneshot(request("/orders/42/pay")?).await?;
/// assert_eq!(paid.status(), StatusCode::OK);
/// let body = axum::body::to_bytes(paid.into_body(), 1024).await?;
/// assert!(body.starts_with(b"paid with token "));
///
/// let unlocked = app.oneshot(request("/orders/42/quote")?).await?;
/// assert_eq!(unlocked.status(), StatusCode::INTERNAL_SERVER_ERROR);
/// assert_eq!(unlocked.headers()["content-type"], "application/problem+json");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token's value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The token of the lock the layer holds for `request`: for hyper, tonic or any
    /// tower service under the [`LockLayer`](crate::LockLayer). The rejection carries
    /// the request's id (`x-request-id`), for its [problem](FencingTokenRejection::problem).
    ///
    /// ```
    /// use http::Request;
    /// use redlock_tower::{FencingToken, fencing::MissingToken};
    ///
    /// // A request that went through no lock layer.
    /// let request = Request::post("/orders/42/pay").header("x-request-id", "req-1").body(())?;
    /// let rejection = FencingToken::from_request(&request).unwrap_err();
    /// assert_eq!(rejection.reason(), MissingToken::NoLock);
    /// // The client's answer: a 500 that names no internals, with the request's id.
    /// let response = rejection.to_response();
    /// assert_eq!(response.status(), 500);
    /// assert!(String::from_utf8_lossy(response.body()).contains("req-1"));
    /// // The log's: the cause and the fix.
    /// assert!(rejection.to_string().contains("route_layer"));
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

    /// The token of the lock the layer holds for the request whose extensions these are
    /// (tonic: `request.extensions()`; axum or hyper: the request's
    /// [`Parts`]). The rejection carries no request id.
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

/// Put into the request's extensions by the layer when it lets a request through
/// without a lock because the lock service was unavailable
/// ([`fail_open`](crate::LockOptions::fail_open)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FailedOpen;

pub use redlock_http::MissingToken;

/// A request without a [`FencingToken`]: why ([`reason`](Self::reason)), the answer
/// for the client ([`problem`](Self::problem), [`to_response`](Self::to_response); with
/// the `axum` feature, `IntoResponse`), and the cause with its fix for the log
/// (`Display`).
///
/// The client's answer names no internals, only what kind of mistake it is (the lock or
/// its fencing is not configured for the route) and the request's id; `Display` names
/// the settings to change.
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

    /// The answer for the client: `500` (`urn:redlock:misconfigured`) for
    /// [`MissingToken::NoLock`] and [`MissingToken::FencingOff`], `503` with
    /// `Retry-After` for [`MissingToken::FailedOpen`]; a detail that says which, and the
    /// request's id.
    pub fn problem(&self) -> Problem {
        let problem = self.reason.problem();
        problem.with_request_id(self.request_id.clone())
    }

    /// [`problem`](Self::problem) as an `application/problem+json` response
    /// ([`problem_response`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_lock_and_failed_open_are_told_apart() {
        let plain = Request::new(());
        let rejection = FencingToken::from_request(&plain).err();
        assert_eq!(
            rejection.as_ref().map(FencingTokenRejection::reason),
            Some(MissingToken::NoLock)
        );

        let mut failed_open = Request::new(());
        failed_open.extensions_mut().insert(FailedOpen);
        let rejection = FencingToken::from_request(&failed_open).err();
        let problem = rejection.as_ref().map(FencingTokenRejection::problem);
        assert_eq!(problem.as_ref().map(|p| p.status), Some(503));
        assert!(problem.is_some_and(|p| p.retry_after.is_some()));
    }

    #[test]
    fn problems_name_no_settings_and_echo_the_request_id() {
        for reason in [MissingToken::NoLock, MissingToken::FencingOff] {
            let rejection = FencingTokenRejection {
                reason,
                request_id: Some("req-9".to_owned()),
            };
            let json = rejection.problem().to_json();
            assert!(json.contains(r#""status":500"#), "{json}");
            assert!(json.contains(r#""request_id":"req-9""#), "{json}");
            assert!(!json.contains("LockLayer"), "{json}");
            assert!(!json.contains("route_layer"), "{json}");
        }
    }
}
