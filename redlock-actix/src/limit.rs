//! [`ConcurrencyLimit`]: at most `limit` concurrent requests per key, across every
//! replica.

use std::future::{Ready, ready};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::HttpRequest;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::StatusCode;
use futures_util::future::LocalBoxFuture;
use redlock_core::Permit;
use redlock_core::{Redlock, RetryPolicy};
use redlock_http::{Key, RejectionKind};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::config::{AbortOnDrop, background};
use crate::error::{DistributedLockError, problem_response, request_id};
use crate::extract::{Header, KeyExtractor, PathParam};

/// At most `limit` requests per key at once, across every replica: a cluster-wide
/// counterpart of a local concurrency limit, and the actix counterpart of
/// `redlock-tower`'s `ConcurrencyLimitLayer` (same options, defaults and answers).
///
/// `wrap()` it around a scope, a resource or the whole app. Each request takes a key
/// from a [`KeyExtractor`] ([`extract`](crate::extract): a path parameter, a header such
/// as the tenant's, a closure), and a permit of the cluster-wide semaphore
/// ([`Redlock::semaphore`]) named `resource_prefix + key` with `limit` permits. The
/// permit is auto-extended while the handler runs and given back as soon as the
/// handler's response is ready (the response body is sent without it). Requests of
/// other keys are not limited by it; a request whose key extractor answers
/// [`Key::Pass`] goes through unlimited.
///
/// Answers, as `application/problem+json` ([`DistributedLockError`]'s problems):
///
/// - the limit is reached (every permit held for as long as the wait policy waits):
///   [`busy_status`](Self::busy_status) (default `429 Too Many Requests`), with
///   `Retry-After` (when the soonest permit frees, else
///   [`redlock_http::FALLBACK_RETRY_AFTER`]);
/// - no quorum of Redis nodes: `503` with `Retry-After`, or the request goes through
///   unlimited with [`fail_open`](Self::fail_open);
/// - a bad key: `400`; a limit of 0, or a TTL the client refuses: `500` (at request
///   time; nothing panics).
///
/// As with the crate's other middleware, every call into the client runs on one
/// long-lived runtime (the crate's own thread, or [`runtime`](Self::runtime)), never on
/// an actix worker's (see [Runtimes](crate::DistributedLockConfig#runtimes)).
///
/// ```
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::{ConcurrencyLimit, Redlock};
///
/// async fn report(tenant: web::Path<String>) -> HttpResponse {
///     HttpResponse::Ok().body(format!("report for {tenant}"))
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build()?;
/// let app = App::new().service(
///     web::scope("/tenants/{tenant}")
///         // at most 3 reports per tenant at once, across every replica
///         .wrap(ConcurrencyLimit::path_param(redlock.clone(), "tenant", 3).resource_prefix("reports:"))
///         .route("/report", web::get().to(report)),
/// );
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
pub struct ConcurrencyLimit<K> {
    key: Rc<K>,
    settings: Arc<Settings>,
}

impl<K> Clone for ConcurrencyLimit<K> {
    fn clone(&self) -> Self {
        Self {
            key: Rc::clone(&self.key),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<K> std::fmt::Debug for ConcurrencyLimit<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The options of a [`ConcurrencyLimit`], shared by its services.
#[derive(Clone)]
struct Settings {
    redlock: Redlock,
    limit: u32,
    resource_prefix: Arc<str>,
    ttl: Option<Duration>,
    retry: RetryPolicy,
    busy_status: StatusCode,
    fail_open: bool,
    runtime: Option<Handle>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("redlock", &self.redlock)
            .field("limit", &self.limit)
            .field("resource_prefix", &self.resource_prefix)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("busy_status", &self.busy_status)
            .field("fail_open", &self.fail_open)
            .field("runtime", &self.runtime.is_some())
            .finish()
    }
}

impl<K: KeyExtractor> ConcurrencyLimit<K> {
    /// At most `limit` concurrent requests per key taken by `key` (typically a closure
    /// `|req: &ServiceRequest| -> Result<impl LockKey, BadKey>`), counted through
    /// `redlock` across every replica: the client's TTL, fail fast, no resource prefix,
    /// busy answered `429`, fail-closed.
    ///
    /// A `limit` of 0 is accepted here and answered `500` at request time.
    pub fn new(redlock: Redlock, key: K, limit: u32) -> Self {
        Self {
            key: Rc::new(key),
            settings: Arc::new(Settings {
                redlock,
                limit,
                resource_prefix: Arc::from(""),
                ttl: None,
                retry: RetryPolicy::once(),
                busy_status: StatusCode::TOO_MANY_REQUESTS,
                fail_open: false,
                runtime: None,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(Arc::make_mut(&mut self.settings));
        self
    }

    /// The semaphore's name is `prefix` followed by the key (default: empty;
    /// [`redlock_http::resource_name`]); its permits are the resources
    /// `<name>/permit/<i>`. Use it to keep different routes' limits apart.
    pub fn resource_prefix(self, prefix: impl Into<String>) -> Self {
        let prefix: Arc<str> = Arc::from(prefix.into());
        self.with(|s| s.resource_prefix = prefix)
    }

    /// The permits' TTL (default: the client's): how long the permit of a replica that
    /// died mid-request stays taken. Permits are auto-extended while their request runs.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|s| s.ttl = Some(ttl))
    }

    /// One scan of the permits: a full limit is answered at once (the default).
    pub fn fail_fast(self) -> Self {
        self.with(|s| s.retry = RetryPolicy::once())
    }

    /// Waits up to `deadline` for a permit when the limit is reached (woken as soon as
    /// one is given back); past the deadline, the busy status.
    pub fn wait(self, deadline: Duration) -> Self {
        self.with(|s| s.retry = RetryPolicy::deadline(deadline))
    }

    /// Any retry policy for a full limit (attempts, deadline, delays).
    pub fn retry(self, retry: RetryPolicy) -> Self {
        self.with(|s| s.retry = retry)
    }

    /// The status answered when the limit is reached (default `429 Too Many
    /// Requests`).
    pub fn busy_status(self, status: StatusCode) -> Self {
        self.with(|s| s.busy_status = status)
    }

    /// When no quorum of Redis nodes can be reached (or another backend failure), let
    /// the request through without a permit, logging a warning, instead of answering
    /// `503` (fail-closed, the default). A full limit is still refused.
    pub fn fail_open(self, on: bool) -> Self {
        self.with(|s| s.fail_open = on)
    }

    /// Runs the client's calls on this runtime instead of the crate's own thread (see
    /// [Runtimes](crate::DistributedLockConfig#runtimes)). It must outlive every
    /// request through this middleware, and have its time and I/O drivers enabled.
    pub fn runtime(self, handle: Handle) -> Self {
        self.with(|s| s.runtime = Some(handle))
    }

    /// How many concurrent requests per key it lets through.
    pub fn limit(&self) -> u32 {
        self.settings.limit
    }
}

impl ConcurrencyLimit<PathParam> {
    /// Limits each key given by the path parameter `name` of the scope (e.g. `"tenant"`
    /// in `web::scope("/tenants/{tenant}")`); a request without it is a bad key (400).
    /// Shorthand for `ConcurrencyLimit::new(redlock, PathParam::new(name), limit)`.
    pub fn path_param(redlock: Redlock, name: impl Into<String>, limit: u32) -> Self {
        Self::new(redlock, PathParam::new(name), limit)
    }
}

impl ConcurrencyLimit<Header> {
    /// Limits each key given by the value of the header `name` (e.g. a tenant header);
    /// a request without it passes through unlimited (see [`Header::required`]).
    /// Shorthand for `ConcurrencyLimit::new(redlock, Header::new(name), limit)`.
    pub fn header(redlock: Redlock, name: &'static str, limit: u32) -> Self {
        Self::new(redlock, Header::new(name), limit)
    }
}

impl<S, B, K> Transform<S, ServiceRequest> for ConcurrencyLimit<K>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = ConcurrencyLimitService<S, K>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(ConcurrencyLimitService {
            service: Rc::new(service),
            key: Rc::clone(&self.key),
            settings: Arc::clone(&self.settings),
        }))
    }
}

/// The service made by [`ConcurrencyLimit`].
pub struct ConcurrencyLimitService<S, K> {
    service: Rc<S>,
    key: Rc<K>,
    settings: Arc<Settings>,
}

impl<S, K> std::fmt::Debug for ConcurrencyLimitService<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyLimitService")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S, B, K> Service<ServiceRequest> for ConcurrencyLimitService<S, K>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let key = self.key.extract(&req);
        let settings = Arc::clone(&self.settings);
        Box::pin(async move {
            // Rejections are answered here, as responses: outer middleware sees an
            // ordinary response.
            let key = match key {
                Key::Lock(key) => key,
                // No key: the request goes through unlimited.
                Key::Pass => return Ok(service.call(req).await?.map_into_left_body()),
                Key::Reject(problem) => {
                    let err = DistributedLockError::Refused(problem);
                    return Ok(settings.reject(req, err));
                }
                // A decision this version does not know: the server's mistake.
                _ => return Ok(settings.reject(req, DistributedLockError::MissingConfig)),
            };
            let resource = match redlock_http::resource_name(&settings.resource_prefix, &key) {
                Ok(resource) => resource,
                Err(bad) => return Ok(settings.reject(req, bad.into())),
            };
            let permit = match settings.acquire(&resource).await {
                Ok(permit) => permit,
                Err(err) if settings.fail_open && err.kind() == RejectionKind::Unavailable => {
                    tracing::warn!(key = %resource, error = %err, "lock service unavailable: fail-open, serving the request WITHOUT a concurrency limit");
                    return Ok(service.call(req).await?.map_into_left_body());
                }
                Err(err) => return Ok(settings.reject(req, err)),
            };
            // The permit is given back when the handler's response is ready, or when
            // this future is dropped (the client went away): `HeldPermit`'s drop.
            let response = service.call(req).await;
            drop(permit);
            Ok(response?.map_into_left_body())
        })
    }
}

impl Settings {
    /// The runtime the client's calls run on.
    fn handle(&self) -> Result<Handle, DistributedLockError> {
        match &self.runtime {
            Some(handle) => Ok(handle.clone()),
            None => background()
                .cloned()
                .map_err(DistributedLockError::Background),
        }
    }

    /// A permit of the semaphore `resource` (of `limit` permits), auto-extended; taken
    /// on the background runtime. Dropping this future cancels the acquisition
    /// (whatever it had set is released).
    async fn acquire(&self, resource: &str) -> Result<HeldPermit, DistributedLockError> {
        let runtime = self.handle()?;
        let semaphore = self
            .redlock
            .semaphore(resource, self.limit)
            .map_err(redlock_core::Error::from)?
            .retry(self.retry);
        let semaphore = match self.ttl {
            Some(ttl) => semaphore.ttl(ttl),
            None => semaphore,
        };
        let started = Instant::now();
        let task = async move {
            let mut permit = semaphore.acquire().await?;
            // Still on the background runtime: the watchdog task starts there.
            permit.auto_extend();
            Ok::<_, redlock_core::Error>(permit)
        };
        let joined = AbortOnDrop::spawn(&runtime, task.in_current_span()).await;
        let waited_ms = started.elapsed().as_millis() as u64;
        match joined {
            Ok(Ok(permit)) => {
                tracing::debug!(key = %resource, slot = permit.slot(), waited_ms, "concurrency permit acquired");
                Ok(HeldPermit {
                    permit: Some(permit),
                    resource: resource.to_owned(),
                    runtime,
                })
            }
            Ok(Err(err)) => Err(DistributedLockError::from(err)),
            Err(join) => {
                tracing::error!(key = %resource, error = %join, "concurrency permit task failed");
                Err(DistributedLockError::Background(join.to_string()))
            }
        }
    }

    /// The answer to a refused request: logged, then its problem (with the busy status
    /// for a full limit), carrying the request's id.
    fn reject<B>(
        &self,
        req: ServiceRequest,
        err: DistributedLockError,
    ) -> ServiceResponse<EitherBody<B>> {
        let (req, _) = req.into_parts();
        let response = problem_response(&self.problem(&req, &err));
        ServiceResponse::new(req, response).map_into_right_body()
    }

    fn problem(&self, req: &HttpRequest, err: &DistributedLockError) -> redlock_http::Problem {
        let id = request_id(req);
        err.log(req.path(), id.as_deref());
        let mut problem = err.problem().with_request_id(id);
        if err.kind() == RejectionKind::Busy {
            problem.status = self.busy_status.as_u16();
        }
        problem
    }
}

/// A held permit, given back on the background runtime when dropped (never on the
/// worker's, whose tasks may die with it).
struct HeldPermit {
    permit: Option<Permit>,
    resource: String,
    runtime: Handle,
}

impl Drop for HeldPermit {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let resource = std::mem::take(&mut self.resource);
        self.runtime.spawn(async move {
            match permit.release().await {
                Ok(released) => {
                    tracing::debug!(key = %resource, was_held = released.was_held(), "concurrency permit released");
                }
                Err(err) => {
                    tracing::warn!(key = %resource, error = %err, "concurrency permit release failed: it ends at its TTL");
                }
            }
        });
    }
}
