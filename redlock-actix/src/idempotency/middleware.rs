//! [`IdempotencyMiddleware`]: the options, and the `Transform` that wraps a service.

use std::future::{Ready, ready};
use std::rc::Rc;

use actix_web::HttpRequest;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use redlock_idempotency::Idempotency as Core;
use redlock_idempotency::middleware::ScopeHook;
use tokio::runtime::Handle;

use crate::config::background;

use super::IdempotencyService;

/// Runs each request with an idempotency key once, cluster-wide, and replays its
/// response to retries: `wrap()` it around an `App`, a scope or a resource. Its options,
/// semantics and [flow](redlock_idempotency::middleware) are the engine's
/// ([`Idempotency`](redlock_idempotency::Idempotency); the guide: `docs/IDEMPOTENCY.md`);
/// it adds the request's [`scope`](Self::scope) and the [`runtime`](Self::runtime). The
/// handler sees the run's lock as `web::ReqData<redlock_core::LockHandle>`, and its
/// fencing token as a [`FencingToken`](crate::FencingToken) argument.
///
/// # Runtimes
///
/// As with [`DistributedLockConfig`](crate::DistributedLockConfig#runtimes), every call
/// into the lock client and the store (the decision, the final write, the lock's
/// release) runs on one long-lived runtime, not on an actix worker's: the crate's own
/// thread by default, or the one given with [`runtime`](Self::runtime). Open the store
/// on a runtime that outlives the server as well (`RedisStore::open` starts its
/// connection's task where it is called).
#[derive(Clone, Debug)]
pub struct IdempotencyMiddleware {
    pub(super) core: Core,
    pub(super) scope: Option<ScopeHook<HttpRequest>>,
    pub(super) runtime: Option<Handle>,
}

impl IdempotencyMiddleware {
    /// The middleware of `idempotency`: its options, its store, its lock client.
    pub fn new(idempotency: Core) -> Self {
        Self {
            core: idempotency,
            scope: None,
            runtime: None,
        }
    }

    /// The framework-free engine, with its options.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Whose key a request's is (the authenticated subject from the extensions, a
    /// tenant): two scopes never share a record; `None` refuses the request (`400`).
    #[must_use]
    pub fn scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&HttpRequest) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Some(ScopeHook::new(scope));
        self
    }

    /// [`scope`](Self::scope) from a request header, by the engine's
    /// [`scope_from_header`](redlock_idempotency::scope_from_header).
    #[must_use]
    pub fn scope_header(self, name: impl Into<String>) -> Self {
        let name = name.into().to_ascii_lowercase();
        self.scope(move |req| {
            let values = req.headers().get_all(&name).map(|value| value.as_bytes());
            redlock_idempotency::scope_from_header(values)
        })
    }

    /// Runs the lock client's and the store's calls on this runtime instead of the
    /// crate's own thread (see [Runtimes](Self#runtimes)). It must outlive every request
    /// through this middleware, and have its time and I/O drivers enabled.
    #[must_use]
    pub fn runtime(mut self, handle: Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// The runtime the client's and the store's calls run on.
    pub(super) fn handle(&self) -> Result<Handle, String> {
        self.runtime
            .clone()
            .map_or_else(|| background().cloned(), Ok)
    }
}

impl<S, B> Transform<S, ServiceRequest> for IdempotencyMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = IdempotencyService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        self.core.check();
        ready(Ok(IdempotencyService {
            service: Rc::new(service),
            config: Rc::new(self.clone()),
        }))
    }
}
