//! [`LockService`]: the middleware around one inner service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use redlock_core::Redlock;
use redlock_http::Problem;
use tower_service::Service;

use crate::body::LockBody;
use crate::config::Config;
use crate::extract::{Key, KeyExtractor};
use crate::future::ResponseFuture;
use crate::layer::LockLayer;
use crate::response::RejectionKind;

/// The middleware made by [`LockLayer`]: extracts each request's key, takes the lock,
/// calls the inner service, and keeps the lock until the response (by default its
/// body) is done.
///
/// `poll_ready` is the inner service's. `call` takes the inner service that was polled
/// ready and leaves a clone in its place, so the request is handed to a ready service
/// once the lock is held (a waiting request keeps that readiness reserved).
pub struct LockService<S, E> {
    pub(crate) inner: S,
    pub(crate) redlock: Redlock,
    pub(crate) extractor: Arc<E>,
    pub(crate) config: Arc<Config>,
}

impl<S, E> LockService<S, E> {
    /// A layer making this service (the same as [`LockLayer::new`]).
    pub fn layer(redlock: Redlock, extractor: E) -> LockLayer<E> {
        LockLayer::new(redlock, extractor)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, E> Clone for LockService<S, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, E: fmt::Debug> fmt::Debug for LockService<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .field("redlock", &self.redlock)
            .field("extractor", &self.extractor)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for LockService<S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    E: KeyExtractor<ReqBody>,
{
    type Response = Response<LockBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The ready service goes with this request; the clone waits for its own
        // `poll_ready`.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        match route(&*self.extractor, &config.resource_prefix, &request) {
            Route::Pass => ResponseFuture::unlocked(inner.call(request), config),
            Route::Refuse(kind, problem, id) => {
                ResponseFuture::rejected(kind, None, problem, id, config)
            }
            Route::Lock(resource, id) => ResponseFuture::acquiring(
                self.redlock.clone(),
                resource,
                inner,
                request,
                id,
                config,
            ),
        }
    }
}

/// What the key extractor decided for a request, with the request's id.
pub(crate) enum Route {
    /// No key: through as it is.
    Pass,
    /// Refused, with this problem.
    Refuse(RejectionKind, Problem, Option<String>),
    /// The resource: the prefix and the key ([`redlock_http::resource_name`]).
    Lock(String, Option<String>),
}

/// Asks `extractor` for `request`'s key, and names its resource under `prefix`; a
/// refusal's problem is ready to send (a 5xx detail goes to the log only).
pub(crate) fn route<E, B>(extractor: &E, prefix: &str, request: &Request<B>) -> Route
where
    E: KeyExtractor<B> + ?Sized,
{
    match extractor.extract(request) {
        Key::Pass => Route::Pass,
        Key::Reject(mut problem) => {
            let id = request_id(request);
            if problem.status >= 500 {
                // The server's own mistake: the details go to the log only.
                tracing::error!(status = problem.status, detail = %problem.detail, request_id = id.as_deref(), "request refused by the key extractor");
                problem.detail = redlock_http::MISCONFIGURED_DETAIL.to_owned();
            } else {
                tracing::debug!(status = problem.status, detail = %problem.detail, request_id = id.as_deref(), "request refused by the key extractor");
            }
            Route::Refuse(RejectionKind::Key, problem, id)
        }
        Key::Lock(key) => match redlock_http::resource_name(prefix, &key) {
            Ok(resource) => Route::Lock(resource, request_id(request)),
            Err(bad) => Route::Refuse(RejectionKind::Key, bad.problem(), request_id(request)),
        },
        // A decision this version does not know: refused as the server's mistake.
        _ => {
            let problem = Problem::misconfigured(redlock_http::MISCONFIGURED_DETAIL.to_owned());
            Route::Refuse(RejectionKind::Misconfigured, problem, request_id(request))
        }
    }
}

/// The request's id, from its `x-request-id` (or `x-correlation-id`) header.
fn request_id<B>(request: &Request<B>) -> Option<String> {
    redlock_http::request_id(|name| request.headers().get(name)?.to_str().ok())
}
