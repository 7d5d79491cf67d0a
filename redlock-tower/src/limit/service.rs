//! [`ConcurrencyLimitService`]: the concurrency limit around one inner service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use redlock_core::Redlock;
use tower_service::Service;

use super::{ConcurrencyLimitLayer, ResponseFuture};
use crate::body::LockBody;
use crate::config::Config;
use crate::extract::KeyExtractor;
use crate::future::{self, AcquireFuture};
use crate::guard::Held;
use crate::response::RejectionKind;
use crate::service::{Route, route};

/// The middleware made by [`ConcurrencyLimitLayer`]: extracts each request's key,
/// takes a permit of the key's cluster-wide semaphore, calls the inner service, and
/// keeps the permit until the response (by default its body) is done.
///
/// `poll_ready` is the inner service's. `call` takes the inner service that was polled
/// ready and leaves a clone in its place, so the request is handed to a ready service
/// once it holds a permit.
pub struct ConcurrencyLimitService<S, E> {
    pub(crate) inner: S,
    pub(crate) redlock: Redlock,
    pub(crate) extractor: Arc<E>,
    pub(crate) limit: u32,
    pub(crate) config: Arc<Config>,
}

impl<S, E> ConcurrencyLimitService<S, E> {
    /// A layer making this service (the same as [`ConcurrencyLimitLayer::new`]).
    pub fn layer(redlock: Redlock, extractor: E, limit: u32) -> ConcurrencyLimitLayer<E> {
        ConcurrencyLimitLayer::new(redlock, extractor, limit)
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

impl<S: Clone, E> Clone for ConcurrencyLimitService<S, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            limit: self.limit,
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, E: fmt::Debug> fmt::Debug for ConcurrencyLimitService<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitService")
            .field("inner", &self.inner)
            .field("redlock", &self.redlock)
            .field("extractor", &self.extractor)
            .field("limit", &self.limit)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimitService<S, E>
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
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        let route = match route(&*self.extractor, &config.resource_prefix, &request) {
            // The key must leave room for the slots' suffix (`/permit/<i>`).
            Route::Lock(resource, id) => bounded(
                &self.redlock,
                resource,
                id,
                &config.resource_prefix,
                self.limit,
            ),
            other => other,
        };
        let future = match route {
            Route::Pass => future::ResponseFuture::unlocked(inner.call(request), config),
            Route::Refuse(kind, problem, id) => {
                future::ResponseFuture::rejected(kind, None, problem, id, config)
            }
            Route::Lock(resource, id) => {
                let (redlock, name, limit) = (self.redlock.clone(), resource.clone(), self.limit);
                let (ttl, retry) = (config.ttl, config.retry);
                let acquire: AcquireFuture = Box::pin(async move {
                    // A limit of 0 fails here (`ZeroPermits`): a 500, as misconfigured.
                    let semaphore = redlock
                        .semaphore(name, limit)?
                        .ttl(ttl)
                        .retry(retry)
                        .fencing(false);
                    semaphore.acquire().await.map(Held::Permit)
                });
                // No `LockHandle` for the handler: a permit is no lock on the key, and
                // would hide the one of a `LockLayer` on the same route.
                future::ResponseFuture::holding(
                    acquire, resource, inner, request, id, config, false,
                )
            }
        };
        ResponseFuture { inner: future }
    }
}

/// The route of a semaphore named `resource` (`prefix` and the key), refused when the
/// key leaves no room for the longest slot suffix under the resource-name bound
/// ([`redlock_http::KeyRoom`]): `400` naming the bound, or `500` for a prefix that
/// leaves none.
fn bounded(
    redlock: &Redlock,
    resource: String,
    id: Option<String>,
    prefix: &str,
    limit: u32,
) -> Route {
    let key_len = resource.len().saturating_sub(prefix.len());
    let checked =
        redlock_http::KeyRoom::new(redlock, prefix, redlock_http::permit_suffix_len(limit))
            .and_then(|room| room.check("concurrency limit key", key_len));
    match checked {
        Ok(()) => Route::Lock(resource, id),
        Err(error @ redlock_http::KeyBoundError::TooLong { .. }) => {
            tracing::debug!(%error, request_id = id.as_deref(), "concurrency limit key too long: request refused");
            Route::Refuse(RejectionKind::Key, error.problem(), id)
        }
        Err(error) => {
            tracing::error!(%error, request_id = id.as_deref(), "concurrency limit misconfigured: request refused");
            Route::Refuse(RejectionKind::Misconfigured, error.problem(), id)
        }
    }
}
