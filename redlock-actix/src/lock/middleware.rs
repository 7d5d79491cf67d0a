//! [`LockMiddleware`]: a `wrap()`-able middleware locking every request of a scope.

use std::future::{Ready, ready};
use std::rc::Rc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};

use crate::config::DistributedLockConfig;
use crate::extract::{Header, KeyExtractor, PathParam};
use crate::guard::LockBody;

use super::LockMiddlewareService;

/// Locks every request through it by a key taken from the request: `wrap()` it around a
/// scope (or a resource, or the whole app), and each request holds the cluster-wide lock
/// on `resource_prefix + key` while its handler runs and, by default
/// ([`hold`](redlock_http::LockOptions::hold)), while its response body is sent. Keys
/// come from a [`KeyExtractor`] ([`extract`](crate::extract)).
///
/// It takes its [`DistributedLockConfig`] (the client, the engine's
/// [`LockOptions`](crate::LockOptions), the refusal hook, the runtime) directly, as
/// [`ClusterLimitMiddleware`](crate::ClusterLimitMiddleware) and
/// `IdempotencyMiddleware` take theirs; only the
/// extractors read `app_data`. Refusals: busy → 409, no quorum → 503, bad key → 400.
/// Handlers see the lock as `web::ReqData<redlock_core::LockHandle>` (is it still
/// held, its loss, its fencing token), and its fencing token as a
/// [`FencingToken`](crate::FencingToken) argument.
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
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build()?;
/// let config = DistributedLockConfig::new(redlock)
///     .options(LockOptions::new().resource_prefix("account:"));
/// let app = App::new().service(
///     web::scope("/accounts/{id}")
///         // every request under /accounts/{id} holds the lock "account:{id}"
///         .wrap(LockMiddleware::path_param(config, "id"))
///         .route("/deposit", web::post().to(deposit))
///         .route("/withdraw", web::post().to(deposit)),
/// );
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
pub struct LockMiddleware<K> {
    key: Rc<K>,
    config: Rc<DistributedLockConfig>,
}

impl<K> std::fmt::Debug for LockMiddleware<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockMiddleware")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor> LockMiddleware<K> {
    /// Locks each request by `key` (typically a closure
    /// `|req: &ServiceRequest| -> Result<Option<impl LockKey>, BadKey>`) with `config`.
    ///
    /// ```
    /// use actix_web::dev::ServiceRequest;
    /// use redlock_actix::{DistributedLockConfig, LockMiddleware, key::BadKey};
    /// use redlock_core::Redlock;
    ///
    /// # let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build().unwrap();
    /// // One lock per (tenant header, scope path parameter); no tenant: unlocked.
    /// let middleware = LockMiddleware::new(DistributedLockConfig::new(redlock), |req: &ServiceRequest| {
    ///     let Some(tenant) = req.headers().get("x-tenant") else {
    ///         return Ok(None);
    ///     };
    ///     let tenant = tenant.to_str().map_err(|_| BadKey::new("x-tenant must be text"))?;
    ///     let id: u64 = req.match_info().get("id").and_then(|v| v.parse().ok())
    ///         .ok_or_else(|| BadKey::new("the id must be a number"))?;
    ///     Ok(Some((tenant.to_owned(), id)))
    /// });
    /// # let _ = middleware;
    /// ```
    pub fn new(config: DistributedLockConfig, key: K) -> Self {
        Self {
            key: Rc::new(key),
            config: Rc::new(config),
        }
    }
}

impl LockMiddleware<PathParam> {
    /// Locks each request by the path parameter `name` of the scope (e.g. `"id"` in
    /// `web::scope("/accounts/{id}")`); a request without it is a bad key (400).
    /// Shorthand for `LockMiddleware::new(config, PathParam::new(name))`.
    pub fn path_param(config: DistributedLockConfig, name: impl Into<String>) -> Self {
        Self::new(config, PathParam::new(name))
    }
}

impl LockMiddleware<Header> {
    /// Locks each request by the value of the header `name`; a request without it
    /// passes through unlocked (see [`Header::required`]). Shorthand for
    /// `LockMiddleware::new(config, Header::new(name))`.
    pub fn header(config: DistributedLockConfig, name: &'static str) -> Self {
        Self::new(config, Header::new(name))
    }
}

impl<S, B, K> Transform<S, ServiceRequest> for LockMiddleware<K>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor,
{
    type Response = ServiceResponse<EitherBody<LockBody<B>>>;
    type Error = actix_web::Error;
    type Transform = LockMiddlewareService<S, K>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(LockMiddlewareService {
            service: Rc::new(service),
            key: Rc::clone(&self.key),
            config: Rc::clone(&self.config),
        }))
    }
}
