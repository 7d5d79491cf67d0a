//! [`LockMiddlewareService`]: one request through the lock, by the engine's decision.

use std::rc::Rc;

use actix_web::HttpMessage;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, forward_ready};
use futures_util::future::LocalBoxFuture;
use redlock_http::LockOptions;

use crate::config::{DistributedLockConfig, Failure, Setup, take_lock};
use crate::extract::KeyExtractor;
use crate::fencing::FailedOpen;
use crate::guard::{LockBody, LockGuard};
use crate::serve::{Guarding, serve};

/// The service made by [`LockMiddleware`](super::LockMiddleware).
pub struct LockMiddlewareService<S, K> {
    pub(super) service: Rc<S>,
    pub(super) key: Rc<K>,
    pub(super) config: Rc<DistributedLockConfig>,
}

impl<S, K> std::fmt::Debug for LockMiddlewareService<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockMiddlewareService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, B, K> Service<ServiceRequest> for LockMiddlewareService<S, K>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor,
{
    type Response = ServiceResponse<EitherBody<LockBody<B>>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let key = self.key.extract(&req);
        let config = Rc::clone(&self.config);
        Box::pin(async move {
            let response = serve(&*service, &config.setup, &config.options, key, req).await?;
            Ok(response.map_body(|_, body| match body {
                EitherBody::Left { body } => EitherBody::left(LockBody::holding(body)),
                EitherBody::Right { body } => EitherBody::right(body),
            }))
        })
    }
}

impl Guarding for LockOptions {
    type Held = LockGuard;

    fn take(
        &self,
        setup: &Setup,
        resource: String,
    ) -> LocalBoxFuture<'static, Result<LockGuard, Failure>> {
        Box::pin(take_lock(setup, self, resource))
    }

    fn expose(&self, req: &ServiceRequest, held: Option<&LockGuard>) {
        match held {
            // For `web::ReqData<LockHandle>` and `FencingToken`.
            Some(guard) => {
                req.extensions_mut().insert(guard.handle());
            }
            // Tells `FencingToken` why there is no lock (fail-open).
            None => {
                req.extensions_mut().insert(FailedOpen);
            }
        }
    }
}
