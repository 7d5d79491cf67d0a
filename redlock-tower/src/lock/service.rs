//! [`LockService`]: the middleware around one inner service.

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
}

guarded_service!(LockService);

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
