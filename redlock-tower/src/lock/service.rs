//! [`LockService`]: the middleware around one inner service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use redlock_core::Redlock;
use tower_service::Service;

use crate::body::LockBody;
use crate::config::Config;
use crate::extract::KeyExtractor;
use crate::lock::LockLayer;
use crate::lock::future::ResponseFuture;

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
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = self.extractor.extract(&request);
        ResponseFuture::start(&self.redlock, Arc::clone(&self.config), key, inner, request)
    }
}
