//! [`Idempotency`]: a `wrap()`-able middleware that runs each request carrying an
//! `Idempotency-Key` once, cluster-wide, and replays its response to retries.

use std::fmt;
use std::future::{Ready, ready};
use std::rc::Rc;
use std::sync::Arc;

use actix_web::HttpRequest;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::HeaderMap;
use redlock_idempotency::Idempotency as Core;
use tokio::runtime::Handle;

use crate::config::background;

use super::IdempotencyService;

type ScopeFn = dyn Fn(&HttpRequest) -> Option<String> + Send + Sync;

/// Runs each request with an idempotency key once, cluster-wide, and replays its
/// response to retries: `wrap()` it around an `App`, a scope or a resource. Built on
/// [`redlock_idempotency`] (its docs say the semantics and the guarantees): it takes
/// the engine, [`Idempotency`](redlock_idempotency::Idempotency), with its options (the
/// same type as `redlock-tower`'s `IdempotencyLayer` takes; the table is there), and
/// adds what reads an actix request or runs on actix: [`scope`](Self::scope),
/// [`scope_header`](Self::scope_header) (whose key it is: the subject, the tenant; a
/// configured scope that names none: `400`) and [`runtime`](Self::runtime) (where the
/// lock client's and the store's calls run; default: the crate's own thread).
///
/// A request with a key is read whole (to fingerprint its body), then handed to the
/// handler with the same body. The first one runs under the key's lock; its response
/// is stored (status, headers without hop-by-hop ones, body) before it is sent. A retry
/// gets the stored response, marked `Idempotent-Replayed: true`, without the handler
/// running. The handler sees the run's lock as `web::ReqData<redlock_core::LockHandle>`,
/// and its fencing token as a [`FencingToken`](crate::FencingToken) argument.
///
/// Refusals are `application/problem+json` responses (with the request's id, as the
/// lock middleware's): `400` no usable key or scope, `409` in flight (with
/// `Retry-After`) or not replayable, `413` a request body over the limit, `422` the key
/// reused for another request, `503` the lock service or the store unavailable.
///
/// # Runtimes
///
/// As with [`DistributedLockConfig`](crate::DistributedLockConfig#runtimes), every call
/// into the lock client and the store (the decision, the final write, the lock's
/// release) runs on one long-lived runtime, not on an actix worker's: the crate's own
/// thread by default, or the one given with [`runtime`](Self::runtime). Open the store
/// on a runtime that outlives the server as well (`RedisStore::open` starts its
/// connection's task where it is called).
///
/// ```
/// use std::time::Duration;
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::IdempotencyMiddleware;
/// use redlock_core::Redlock;
/// use redlock_idempotency::{Idempotency, store::RedisStore};
///
/// async fn refund(body: web::Bytes) -> HttpResponse {
///     // ... refunds once per key and tenant, whatever the client's retries ...
///     HttpResponse::Created().body(body)
/// }
///
/// fn app(
///     redlock: Redlock,
///     store: RedisStore,
/// ) -> App<
///     impl actix_web::dev::ServiceFactory<
///         actix_web::dev::ServiceRequest,
///         Config = (),
///         Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
///         Error = actix_web::Error,
///         InitError = (),
///     >,
/// > {
///     let idempotency =
///         IdempotencyMiddleware::new(Idempotency::new(redlock, store).wait(Duration::from_secs(5)))
///             .scope_header("x-tenant");
///     App::new().service(
///         web::resource("/refunds")
///             .wrap(idempotency)
///             .route(web::post().to(refund)),
///     )
/// }
/// ```
#[derive(Clone)]
pub struct IdempotencyMiddleware {
    pub(super) core: Core,
    pub(super) scope: Option<Arc<ScopeFn>>,
    pub(super) runtime: Option<Handle>,
}

impl fmt::Debug for IdempotencyMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyMiddleware")
            .field("core", &self.core)
            .field("scope", &self.scope.is_some())
            .field("runtime", &self.runtime.is_some())
            .finish()
    }
}

impl IdempotencyMiddleware {
    /// The middleware of `idempotency` (the engine: its options, its store, its lock
    /// client; e.g. one shared with `redlock-tower`'s layer).
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

    /// Whose key it is: the request's scope (the authenticated subject, the tenant, the
    /// API key), so that two clients sending the same key never share a record. A
    /// request with a key whose scope is `None` is refused (`400`).
    ///
    /// **Without a scope, any client that sends the same key gets the other client's
    /// stored response.**
    ///
    /// ```
    /// use actix_web::HttpMessage;
    /// use redlock_actix::IdempotencyMiddleware;
    /// use redlock_core::Redlock;
    /// use redlock_idempotency::{Idempotency, store::RedisStore};
    ///
    /// #[derive(Clone)]
    /// struct Subject(String); // put in the extensions by the authentication middleware
    ///
    /// fn middleware(redlock: Redlock, store: RedisStore) -> IdempotencyMiddleware {
    ///     IdempotencyMiddleware::new(Idempotency::new(redlock, store))
    ///         .scope(|req| req.extensions().get::<Subject>().map(|s| s.0.clone()))
    /// }
    /// ```
    #[must_use]
    pub fn scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&HttpRequest) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// [`scope`](Self::scope) from a request header (a tenant id): its value, trimmed,
    /// when it is one header of visible ASCII; else the request has no scope (`400`).
    #[must_use]
    pub fn scope_header(self, name: impl Into<String>) -> Self {
        let name = name.into().to_ascii_lowercase();
        self.scope(move |req| header_scope(req.headers(), &name))
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

/// The scope in header `name`, by the core's rule (`scope_from_header`).
fn header_scope(headers: &HeaderMap, name: &str) -> Option<String> {
    redlock_idempotency::scope_from_header(headers.get_all(name).map(|value| value.as_bytes()))
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
        // Checked where the service is built, once every option is set.
        if let Err(error) = self.core.room() {
            tracing::error!(%error, "idempotency misconfigured: every request with a key will be answered 500");
        }
        ready(Ok(IdempotencyService {
            service: Rc::new(service),
            config: Rc::new(self.clone()),
        }))
    }
}
