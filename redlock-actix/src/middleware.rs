//! [`LockMiddleware`]: a `wrap()`-able middleware locking every request of a scope.

use std::future::{Ready, ready};
use std::rc::Rc;

use actix_web::HttpMessage;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use futures_util::future::LocalBoxFuture;

use crate::config::DistributedLockConfig;
use crate::error::BadKey;
use crate::error::DistributedLockError;
use crate::guard::LockedBody;
use crate::key::LockKey;

/// Names the lock a request takes in [`LockMiddleware`].
///
/// Implemented for closures `Fn(&ServiceRequest) -> Result<K, BadKey>` where `K:`
/// [`LockKey`], and for [`PathParam`] and [`Header`].
pub trait RequestKey: 'static {
    /// The key (without the configuration's prefix); `None` lets the request through
    /// unlocked; an error is why the request names no usable key (400).
    ///
    /// # Errors
    ///
    /// [`BadKey`] when the request names no usable key.
    fn request_key(&self, req: &ServiceRequest) -> Result<Option<String>, BadKey>;
}

impl<F, K> RequestKey for F
where
    F: Fn(&ServiceRequest) -> Result<K, BadKey> + 'static,
    K: LockKey,
{
    fn request_key(&self, req: &ServiceRequest) -> Result<Option<String>, BadKey> {
        self(req)?.lock_key().map(Some)
    }
}

/// The key is a path parameter of the scope, e.g. `id` in `web::scope("/accounts/{id}")`
/// (as `redlock_tower::extract::PathParam` for axum). A request without it is a bad key
/// (400).
#[derive(Debug, Clone)]
pub struct PathParam {
    name: String,
}

impl PathParam {
    /// The key from the path parameter `name` (without braces).
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

impl RequestKey for PathParam {
    fn request_key(&self, req: &ServiceRequest) -> Result<Option<String>, BadKey> {
        req.match_info()
            .get(&self.name)
            .ok_or_else(|| BadKey::new(format!("the path has no `{}` parameter", self.name)))?
            .lock_key()
            .map(Some)
    }
}

/// The key is a request header's value, e.g. `Idempotency-Key` or a tenant id (as
/// `redlock_tower::extract::Header`, by the same rule: [`redlock_http::header_key`]).
///
/// Without the header the request passes through unlocked, or, once
/// [`required`](Self::required), is refused with `400`. A value given twice, empty, or
/// not visible ASCII is always refused with `400`.
#[derive(Debug, Clone)]
pub struct Header {
    name: &'static str,
    required: bool,
}

impl Header {
    /// The key from header `name` (any case).
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            required: false,
        }
    }

    /// Refuse requests without the header (`400`) instead of letting them through.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }
}

impl RequestKey for Header {
    fn request_key(&self, req: &ServiceRequest) -> Result<Option<String>, BadKey> {
        let values = req
            .headers()
            .get_all(self.name)
            .map(actix_web::http::header::HeaderValue::as_bytes);
        match redlock_http::header_key(self.name, values, self.required) {
            Ok(Some(text)) => text.lock_key().map(Some),
            Ok(None) => Ok(None),
            Err(reason) => Err(BadKey::new(reason)),
        }
    }
}

/// Locks every request through it by a key taken from the request: `wrap()` it around a
/// scope (or a resource, or the whole app), and each request holds the cluster-wide lock
/// on `prefix + key` while its handler runs and its response body is sent.
///
/// Same behaviour as the [`DistributedLock`](crate::DistributedLock) extractor: the
/// innermost [`DistributedLockConfig`] (the scope's, else the app's; or the one given
/// with [`with_config`](Self::with_config)), auto-extension, and the same rejections
/// (busy → 409, no quorum → 503, bad key → 400, no configuration → 500). Handlers see the
/// lock as `web::ReqData<redlock_actix::LockHandle>` (is it still held, its loss, its
/// fencing token), and its fencing token as a [`FencingToken`](crate::FencingToken)
/// argument.
///
/// ```
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::{DistributedLockConfig, LockHandle, LockMiddleware, Redlock};
///
/// async fn deposit(lock: web::ReqData<LockHandle>) -> HttpResponse {
///     HttpResponse::Ok().body(format!("deposit under {}", lock.resource()))
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build()?;
/// let app = App::new().app_data(DistributedLockConfig::new(redlock).key_prefix("account:")).service(
///     web::scope("/accounts/{id}")
///         // every request under /accounts/{id} holds the lock "account:{id}"
///         .wrap(LockMiddleware::path_param("id"))
///         .route("/deposit", web::post().to(deposit))
///         .route("/withdraw", web::post().to(deposit)),
/// );
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
pub struct LockMiddleware<K> {
    key: Rc<K>,
    config: Option<DistributedLockConfig>,
}

impl<K> std::fmt::Debug for LockMiddleware<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockMiddleware")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<K: RequestKey> LockMiddleware<K> {
    /// Locks each request by `key`, typically a closure
    /// `|req: &ServiceRequest| -> Result<impl LockKey, BadKey>`.
    ///
    /// ```
    /// use actix_web::dev::ServiceRequest;
    /// use redlock_actix::{BadKey, LockMiddleware};
    ///
    /// // One lock per (tenant header, scope path parameter).
    /// let middleware = LockMiddleware::new(|req: &ServiceRequest| {
    ///     let tenant = req.headers().get("x-tenant").and_then(|v| v.to_str().ok())
    ///         .ok_or_else(|| BadKey::new("no x-tenant header"))?.to_owned();
    ///     let id: u64 = req.match_info().get("id").and_then(|v| v.parse().ok())
    ///         .ok_or_else(|| BadKey::new("the id must be a number"))?;
    ///     Ok((tenant, id))
    /// });
    /// # let _ = middleware;
    /// ```
    pub fn new(key: K) -> Self {
        Self {
            key: Rc::new(key),
            config: None,
        }
    }

    /// Uses `config` instead of looking one up in `app_data`.
    pub fn with_config(mut self, config: DistributedLockConfig) -> Self {
        self.config = Some(config);
        self
    }
}

impl LockMiddleware<PathParam> {
    /// Locks each request by the path parameter `name` of the scope (e.g. `"id"` in
    /// `web::scope("/accounts/{id}")`); a request without it is a bad key (400).
    /// Shorthand for `LockMiddleware::new(PathParam::new(name))`.
    pub fn path_param(name: impl Into<String>) -> Self {
        Self::new(PathParam::new(name))
    }
}

impl LockMiddleware<Header> {
    /// Locks each request by the value of the header `name`; a request without it
    /// passes through unlocked (see [`Header::required`]). Shorthand for
    /// `LockMiddleware::new(Header::new(name))`.
    pub fn header(name: &'static str) -> Self {
        Self::new(Header::new(name))
    }
}

impl<S, B, K> Transform<S, ServiceRequest> for LockMiddleware<K>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: RequestKey,
{
    type Response = ServiceResponse<EitherBody<LockedBody<B>>>;
    type Error = actix_web::Error;
    type Transform = LockMiddlewareService<S, K>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(LockMiddlewareService {
            service: Rc::new(service),
            key: Rc::clone(&self.key),
            config: self.config.clone(),
        }))
    }
}

/// The service made by [`LockMiddleware`].
pub struct LockMiddlewareService<S, K> {
    service: Rc<S>,
    key: Rc<K>,
    config: Option<DistributedLockConfig>,
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
    K: RequestKey,
{
    type Response = ServiceResponse<EitherBody<LockedBody<B>>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let key = self.key.request_key(&req);
        let config = self
            .config
            .clone()
            .or_else(|| DistributedLockConfig::from_req(req.request()).cloned());
        Box::pin(async move {
            // Rejections are answered here (as responses, not errors), like the
            // extractor's: outer middleware sees an ordinary response.
            let Some(config) = config else {
                let err = DistributedLockError::MissingConfig.respond(req.request());
                return Ok(req.error_response(err).map_into_right_body());
            };
            let key = match key {
                Ok(Some(key)) => Ok(key),
                // No key: the request goes through unlocked.
                Ok(None) => {
                    let response = service.call(req).await?;
                    return Ok(response.map_into_boxed_body().map_into_right_body());
                }
                Err(bad) => Err(bad),
            };
            let resource = match config.resource(key) {
                Ok(resource) => resource,
                Err(bad) => {
                    let err = config.reject(bad.into(), req.request());
                    return Ok(req.error_response(err).map_into_right_body());
                }
            };
            let guard = match config.acquire(resource).await {
                Ok(guard) => guard,
                Err(err) => {
                    let err = config.reject(err, req.request());
                    return Ok(req.error_response(err).map_into_right_body());
                }
            };
            req.extensions_mut().insert(guard.handle());
            let response = service.call(req).await?;
            Ok(response
                .map_body(move |_, body| LockedBody::new(body, guard))
                .map_into_left_body())
        })
    }
}
