//! [`ClusterLimitService`]: the concurrency limit around one inner service.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use redlock_core::Redlock;
use tower_service::Service;

use redlock_http::LimitOptions;

use super::{ClusterLimitLayer, ResponseFuture};
use crate::body::LockBody;
use crate::config::Config;
use crate::extract::KeyExtractor;
use crate::lock::future;

/// The middleware made by [`ClusterLimitLayer`]: extracts each request's key,
/// takes a permit of the key's cluster-wide semaphore, calls the inner service, and
/// keeps the permit until the response (by default its body) is done.
///
/// `poll_ready` is the inner service's. `call` takes the inner service that was polled
/// ready and leaves a clone in its place, so the request is handed to a ready service
/// once it holds a permit.
pub struct ClusterLimitService<S, E> {
    pub(crate) inner: S,
    pub(crate) redlock: Redlock,
    pub(crate) extractor: Arc<E>,
    pub(crate) config: Arc<Config>,
}

impl<S, E> ClusterLimitService<S, E> {
    /// A layer making this service (the same as [`ClusterLimitLayer::new`]).
    pub fn layer(redlock: Redlock, extractor: E, options: LimitOptions) -> ClusterLimitLayer<E> {
        ClusterLimitLayer::new(redlock, extractor, options)
    }
}

guarded_service!(ClusterLimitService);

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for ClusterLimitService<S, E>
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
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = self.extractor.extract(&request);
        let config = Arc::clone(&self.config);
        ResponseFuture {
            inner: future::ResponseFuture::start(&self.redlock, config, key, inner, request),
        }
    }
}
