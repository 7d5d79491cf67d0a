//! [`IdempotencyService`]: the middleware around one inner service.

use std::fmt;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use redlock_core::BoxError;
use redlock_idempotency::Idempotency;
use tower_service::Service;

use super::body::IdempotentBody;
use super::future::{self, ResponseFuture};
use super::layer::Scope;

/// The middleware made by [`IdempotencyLayer`](super::IdempotencyLayer): reads each
/// request's key and body, then replays the key's stored response, refuses the request,
/// or runs the inner service under the key's lock and stores its response.
///
/// `poll_ready` is the inner service's. `call` takes the inner service that was polled
/// ready and leaves a clone in its place.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    pub(crate) inner: S,
    pub(crate) core: Idempotency,
    pub(crate) scope: Option<Scope>,
}

impl<S> IdempotencyService<S> {
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

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("core", &self.core)
            .field("scoped", &self.scope.is_some())
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<IdempotentBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The ready service goes with this request; the clone waits for its own
        // `poll_ready`.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        future::respond(inner, self.core.clone(), self.scope.clone(), request)
    }
}
