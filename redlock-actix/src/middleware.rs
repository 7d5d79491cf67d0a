//! The guarding middleware: [`LockMiddleware`] (the engine's
//! [`LockOptions`]) and [`ClusterLimitMiddleware`] (its
//! [`LimitOptions`]), both a [`GuardMiddleware`] making a
//! [`GuardService`]. The request decision is `redlock-http`'s.

use std::future::{Ready, ready};
use std::rc::Rc;
use std::sync::Arc;

use actix_web::HttpResponse;
use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use futures_util::future::LocalBoxFuture;
use redlock_core::Redlock;
use redlock_http::key::{KeyBoundError, KeyRoom};
use redlock_http::{LimitOptions, LockOptions, Refusal};
use tokio::runtime::Handle;

use crate::config::{DistributedLockConfig, Setup};
use crate::extract::{Header, KeyExtractor, PathParam};
use crate::serve::{Guarding, serve};

/// A `wrap()`-able middleware guarding each request by a key from a [`KeyExtractor`],
/// with the options `G` ([`LockOptions`] or [`LimitOptions`]).
pub struct GuardMiddleware<K, G> {
    key: Rc<K>,
    guard: Rc<(Setup, G)>,
}

/// Locks every request through it by a key taken from the request (see
/// [`LockOptions`]): busy → 409, no quorum → 503, bad key → 400. Handlers see the lock
/// as `web::ReqData<redlock_core::LockHandle>` and its token as a
/// [`FencingToken`](crate::FencingToken).
///
/// ```
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::{DistributedLockConfig, LockMiddleware, LockOptions};
/// use redlock_core::{LockHandle, Redlock};
///
/// async fn deposit(lock: web::ReqData<LockHandle>) -> HttpResponse {
///     HttpResponse::Ok().body(format!("deposit under {}", lock.resource()))
/// }
///
/// # let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build().unwrap();
/// let config = DistributedLockConfig::new(redlock)
///     .options(LockOptions::new().resource_prefix("account:"));
/// let app = App::new().service(
///     web::scope("/accounts/{id}")
///         .wrap(LockMiddleware::path_param(config, "id")) // holds "account:{id}"
///         .route("/deposit", web::post().to(deposit)),
/// );
/// # let _ = app;
/// ```
pub type LockMiddleware<K> = GuardMiddleware<K, LockOptions>;

/// At most `limit` requests per key at once across every replica, on a cluster-wide
/// semaphore (see [`LimitOptions`]): a full limit answers `busy_status` (429) with
/// `Retry-After`. Responses come out boxed.
///
/// ```
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::{ClusterLimitMiddleware, LimitOptions};
/// use redlock_core::Redlock;
///
/// async fn report(tenant: web::Path<String>) -> HttpResponse {
///     HttpResponse::Ok().body(format!("report for {tenant}"))
/// }
///
/// # let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build().unwrap();
/// let per_tenant = LimitOptions::new(3).resource_prefix("reports:");
/// let app = App::new().service(
///     web::scope("/tenants/{tenant}")
///         .wrap(ClusterLimitMiddleware::path_param(redlock, "tenant", per_tenant))
///         .route("/report", web::get().to(report)),
/// );
/// # let _ = app;
/// ```
pub type ClusterLimitMiddleware<K> = GuardMiddleware<K, LimitOptions>;

/// The service made by [`LockMiddleware`].
pub type LockMiddlewareService<S, K> = GuardService<S, K, LockOptions>;

/// The service made by [`ClusterLimitMiddleware`].
pub type ClusterLimitService<S, K> = GuardService<S, K, LimitOptions>;

impl<K, G> Clone for GuardMiddleware<K, G> {
    fn clone(&self) -> Self {
        Self {
            key: Rc::clone(&self.key),
            guard: Rc::clone(&self.guard),
        }
    }
}

impl<K, G: std::fmt::Debug> std::fmt::Debug for GuardMiddleware<K, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardMiddleware")
            .field("setup", &self.guard.0)
            .field("options", &self.guard.1)
            .finish_non_exhaustive()
    }
}

impl<K, G: Clone> GuardMiddleware<K, G> {
    fn with(mut self, change: impl FnOnce(&mut Setup)) -> Self {
        change(&mut Rc::make_mut(&mut self.guard).0);
        self
    }

    /// Build refusal responses yourself (default: the problem+json answer), as
    /// [`DistributedLockConfig::on_refusal`].
    #[must_use]
    pub fn on_refusal<F>(self, hook: F) -> Self
    where
        F: Fn(&Refusal) -> HttpResponse + Send + Sync + 'static,
    {
        self.with(|s| s.on_refusal = Some(Arc::new(hook)))
    }

    /// Runs the client's calls on this runtime instead of the crate's own thread.
    #[must_use]
    pub fn runtime(self, handle: Handle) -> Self {
        self.with(|s| s.runtime = Some(handle))
    }

    /// The options.
    pub fn options(&self) -> &G {
        &self.guard.1
    }
}

impl<K: KeyExtractor> LockMiddleware<K> {
    /// Locks each request by `key` (a [`KeyExtractor`], e.g. a closure
    /// `|req: &ServiceRequest| -> Result<Option<impl LockKey>, BadKey>`) with `config`.
    pub fn new(config: DistributedLockConfig, key: K) -> Self {
        Self {
            key: Rc::new(key),
            guard: Rc::new((config.setup, config.options)),
        }
    }
}

impl LockMiddleware<PathParam> {
    /// Locks each request by the scope's path parameter `name` (400 without it).
    pub fn path_param(config: DistributedLockConfig, name: impl Into<String>) -> Self {
        Self::new(config, PathParam::new(name))
    }
}

impl LockMiddleware<Header> {
    /// Locks each request by the header `name`; without it, the request passes unlocked.
    pub fn header(config: DistributedLockConfig, name: &'static str) -> Self {
        Self::new(config, Header::new(name))
    }
}

impl<K: KeyExtractor> ClusterLimitMiddleware<K> {
    /// Limits each request by `key`, counted through `redlock`, by `options`. A limit
    /// of `0`, or a prefix that leaves no room for a key, is logged here and answered
    /// `500` at request time.
    pub fn new(redlock: Redlock, key: K, options: LimitOptions) -> Self {
        options.check(&redlock);
        Self {
            key: Rc::new(key),
            guard: Rc::new((Setup::new(redlock), options)),
        }
    }

    /// The longest key taken under the prefix and limit ([`LimitOptions::room`]).
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`] when the prefix leaves none.
    pub fn room(&self) -> Result<KeyRoom, KeyBoundError> {
        self.guard.1.room(&self.guard.0.redlock)
    }
}

impl ClusterLimitMiddleware<PathParam> {
    /// Limits each request by the path parameter `name`.
    pub fn path_param(redlock: Redlock, name: impl Into<String>, options: LimitOptions) -> Self {
        Self::new(redlock, PathParam::new(name), options)
    }
}

impl ClusterLimitMiddleware<Header> {
    /// Limits each request by the header `name`; without it, the request goes unlimited.
    pub fn header(redlock: Redlock, name: &'static str, options: LimitOptions) -> Self {
        Self::new(redlock, Header::new(name), options)
    }
}

impl<S, B, K, G> Transform<S, ServiceRequest> for GuardMiddleware<K, G>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor,
    G: Guarding,
{
    type Response = ServiceResponse<G::Body<B>>;
    type Error = actix_web::Error;
    type Transform = GuardService<S, K, G>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(GuardService {
            service: Rc::new(service),
            key: Rc::clone(&self.key),
            guard: Rc::clone(&self.guard),
        }))
    }
}

/// The service made by a [`GuardMiddleware`]: one request through the engine's
/// decision.
pub struct GuardService<S, K, G> {
    service: Rc<S>,
    key: Rc<K>,
    guard: Rc<(Setup, G)>,
}

impl<S, K, G: std::fmt::Debug> std::fmt::Debug for GuardService<S, K, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardService")
            .field("options", &self.guard.1)
            .finish_non_exhaustive()
    }
}

impl<S, B, K, G> Service<ServiceRequest> for GuardService<S, K, G>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor,
    G: Guarding,
{
    type Response = ServiceResponse<G::Body<B>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let key = self.key.extract(&req);
        let guard = Rc::clone(&self.guard);
        Box::pin(async move {
            let (setup, options) = &*guard;
            let response = serve(&*service, setup, options, key, req).await?;
            Ok(response.map_body(|_, body| G::body(body)))
        })
    }
}
