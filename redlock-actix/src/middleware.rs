//! [`LockMiddleware`]: a `wrap()`-able middleware locking every request of a scope.

use std::future::{Ready, ready};
use std::rc::Rc;

use actix_web::HttpMessage;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use futures_util::future::{Either, LocalBoxFuture, select};
use redlock_http::{Hold, Key, RejectionKind};

use crate::config::DistributedLockConfig;
use crate::error::DistributedLockError;
use crate::extract::{Header, KeyExtractor, PathParam};
use crate::guard::LockBody;
use crate::token::FailedOpen;

/// Locks every request through it by a key taken from the request: `wrap()` it around a
/// scope (or a resource, or the whole app), and each request holds the cluster-wide lock
/// on `resource_prefix + key` while its handler runs and, by default
/// ([`hold`](DistributedLockConfig::hold)), while its response body is sent. Keys come
/// from a [`KeyExtractor`] ([`extract`](crate::extract)).
///
/// Same behaviour as the [`DistributedLock`](crate::DistributedLock) extractor: the
/// innermost [`DistributedLockConfig`] (the scope's, else the app's; or the one given
/// with [`with_config`](Self::with_config)), auto-extension, and the same rejections
/// (busy → 409, no quorum → 503, bad key → 400, no configuration → 500); and the
/// options of `redlock-tower`'s layer that only a middleware can have:
/// [`hold`](DistributedLockConfig::hold), [`fail_open`](DistributedLockConfig::fail_open),
/// [`abort_on_loss`](DistributedLockConfig::abort_on_loss). Handlers see the
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
/// let app = App::new().app_data(DistributedLockConfig::new(redlock).resource_prefix("account:")).service(
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

impl<K: KeyExtractor> LockMiddleware<K> {
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
    K: KeyExtractor,
{
    type Response = ServiceResponse<EitherBody<LockBody<B>>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let key = self.key.extract(&req);
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
                Key::Lock(key) => key,
                // No key: the request goes through unlocked.
                Key::Pass => {
                    let response = service.call(req).await?;
                    return Ok(response.map_into_boxed_body().map_into_right_body());
                }
                Key::Reject(problem) => {
                    let err =
                        config.reject(DistributedLockError::Refused(problem), None, req.request());
                    return Ok(req.error_response(err).map_into_right_body());
                }
                // A decision this version does not know: the server's mistake.
                _ => {
                    let err =
                        config.reject(DistributedLockError::MissingConfig, None, req.request());
                    return Ok(req.error_response(err).map_into_right_body());
                }
            };
            let resource = match config.resource(&key) {
                Ok(resource) => resource,
                Err(bad) => {
                    let err = config.reject(bad.into(), None, req.request());
                    return Ok(req.error_response(err).map_into_right_body());
                }
            };
            let guard = match config.acquire(resource.clone()).await {
                Ok(guard) => guard,
                Err(err) if config.fails_open() && err.kind() == RejectionKind::Unavailable => {
                    tracing::warn!(key = %resource, error = %err, "lock service unavailable: fail-open, serving the request WITHOUT a lock");
                    // Tells `FencingToken` why there is no lock.
                    req.extensions_mut().insert(FailedOpen);
                    let response = service.call(req).await?;
                    return Ok(response.map_into_boxed_body().map_into_right_body());
                }
                Err(err) => {
                    let err = config.reject(err, Some(&resource), req.request());
                    return Ok(req.error_response(err).map_into_right_body());
                }
            };
            req.extensions_mut().insert(guard.handle());
            let abort = config.aborts_on_loss();
            let response = if abort {
                // The request cannot be kept (actix routes it further by `Rc::get_mut`):
                // what the answer needs is taken now.
                let path = req.path().to_owned();
                let id = crate::error::request_id(req.request());
                let lost = Box::pin(guard.cancellation_token().cancelled_owned());
                let handler = Box::pin(service.call(req));
                match select(handler, lost).await {
                    Either::Left((response, _)) => response?,
                    Either::Right(((), handler)) => {
                        // The handler's future is dropped where it stands, then the lock.
                        drop(handler);
                        drop(guard);
                        // Answered as the error of this service (the request went with the
                        // handler): actix renders it with the response built here.
                        return Err(config.reject_request(
                            DistributedLockError::Lost(resource.clone()),
                            Some(&resource),
                            &path,
                            id,
                        ));
                    }
                }
            } else {
                service.call(req).await?
            };
            let guard = match config.hold_setting() {
                // Dropping the guard releases the lock.
                Hold::UntilHead => {
                    drop(guard);
                    None
                }
                _ => Some(guard),
            };
            Ok(response
                .map_body(move |_, body| LockBody::held(body, guard, abort))
                .map_into_left_body())
        })
    }
}
