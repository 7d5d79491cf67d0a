//! [`ClusterLimitService`]: one request through the limit, by the engine's decision.

use std::rc::Rc;
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, forward_ready};
use futures_util::future::LocalBoxFuture;
use redlock_core::LockHandle;
use redlock_core::semaphore::Permit;
use redlock_http::LimitOptions;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::config::{Failure, Setup};
use crate::extract::KeyExtractor;
use crate::guard::BodyHold;
use crate::serve::{Guarding, serve};

/// The service made by [`ClusterLimitMiddleware`](super::ClusterLimitMiddleware).
pub struct ClusterLimitService<S, K> {
    pub(super) service: Rc<S>,
    pub(super) key: Rc<K>,
    pub(super) setup: Rc<(Setup, LimitOptions)>,
}

impl<S, K> std::fmt::Debug for ClusterLimitService<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterLimitService")
            .field("setup", &self.setup)
            .finish_non_exhaustive()
    }
}

impl<S, B, K> Service<ServiceRequest> for ClusterLimitService<S, K>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let key = self.key.extract(&req);
        let setup = Rc::clone(&self.setup);
        Box::pin(async move {
            let (setup, options) = &*setup;
            let response = serve(&*service, setup, options, key, req).await?;
            Ok(response.map_into_boxed_body())
        })
    }
}

impl Guarding for LimitOptions {
    type Held = HeldPermit;

    fn take(
        &self,
        setup: &Setup,
        resource: String,
    ) -> LocalBoxFuture<'static, Result<HeldPermit, Failure>> {
        let task = self.acquire(&setup.redlock, resource);
        let setup = setup.clone();
        Box::pin(async move {
            let (permit, runtime) = setup.run(task).await?;
            Ok(HeldPermit {
                handle: permit.handle(),
                permit: Some(permit),
                acquired: Instant::now(),
                runtime,
            })
        })
    }

    // No `LockHandle` for the handler: a permit is no lock on the key.
    fn expose(&self, _req: &ServiceRequest, _held: Option<&HeldPermit>) {}
}

/// A held permit, given back on the background runtime when dropped (never on the
/// worker's, whose tasks may die with it).
pub(crate) struct HeldPermit {
    permit: Option<Permit>,
    /// Its slot lock's handle: validity, loss.
    handle: LockHandle,
    acquired: Instant,
    runtime: Handle,
}

impl Drop for HeldPermit {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let slot = self.handle.resource().to_owned();
        let held_ms = self.acquired.elapsed().as_millis() as u64;
        if !self.handle.is_held() {
            tracing::warn!(key = %slot, held_ms, "concurrency permit lost before the request finished: another request may have run past the limit");
        }
        self.runtime.spawn(async move {
            match permit.release().await {
                Ok(released) => {
                    tracing::debug!(key = %slot, held_ms, was_held = released.was_held(), "concurrency permit released");
                }
                Err(err) => {
                    tracing::warn!(key = %slot, held_ms, error = %err, "concurrency permit release failed: it ends at its TTL");
                }
            }
        });
    }
}

impl BodyHold for HeldPermit {
    fn resource(&self) -> &str {
        self.handle.resource()
    }

    fn cancellation_token(&self) -> CancellationToken {
        self.handle.cancellation_token()
    }

    fn cut_off(slot: String) -> Box<dyn std::error::Error> {
        tracing::warn!(key = %slot, "concurrency permit lost while the response body was sent: body cut off");
        Box::new(redlock_http::LockLost::new(slot))
    }
}
