//! [`ResponseFuture`]: one request through the
//! [`ClusterLimitService`](super::ClusterLimitService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::LockBody;
use crate::lock::future;

pin_project! {
    /// The response future of
    /// [`ClusterLimitService`](super::ClusterLimitService): taking a permit,
    /// then running the inner service's future while holding it.
    ///
    /// Dropping it (the client went away, a timeout) is safe at any point: an
    /// acquisition in flight gives back whatever it had set on the nodes, and a held
    /// permit is released at once in the background, not left to expire at its TTL.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        pub(crate) inner: future::ResponseFuture<S, ReqBody>,
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<LockBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}
