//! [`ConcurrencyLimit`]: at most `limit` concurrent requests per key, across every
//! replica.

use std::future::{Ready, ready};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::HttpResponse;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::StatusCode;
use futures_util::future::{Either, LocalBoxFuture, select};
use redlock_core::{CancellationToken, LockHandle, Permit, Redlock, RetryPolicy};
use redlock_http::{Hold, Key, RejectionKind};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::config::{AbortOnDrop, background};
use crate::error::{DistributedLockError, Rejection, problem_response, request_id};
use crate::extract::{Header, KeyExtractor, PathParam};
use crate::guard::{BodyHold, HoldingBody};

type OnRejection = dyn Fn(&Rejection<'_>) -> HttpResponse + Send + Sync;

/// At most `limit` requests per key at once, across every replica: a cluster-wide
/// counterpart of a local concurrency limit, and the actix counterpart of
/// `redlock-tower`'s `ConcurrencyLimitLayer` (same options, defaults and answers).
///
/// `wrap()` it around a scope, a resource or the whole app. Each request takes a key
/// from a [`KeyExtractor`] ([`extract`](crate::extract): a path parameter, a header such
/// as the tenant's, a closure), and a permit of the cluster-wide semaphore
/// ([`Redlock::semaphore`]) named `resource_prefix + key` with `limit` permits. The
/// permit is auto-extended while the handler runs (a handler may run far longer than
/// the TTL), up to [`max_hold`](Self::max_hold), and kept until the response body has
/// been sent or dropped ([`hold`](Self::hold)). Requests of other keys are not limited
/// by it; a request whose key extractor answers [`Key::Pass`] goes through unlimited.
///
/// The options, with the names and defaults of `redlock-tower`'s
/// `ConcurrencyLimitLayer`:
///
/// | option | default |
/// | --- | --- |
/// | [`resource_prefix`](Self::resource_prefix) | none |
/// | [`ttl`](Self::ttl) | the client's default TTL, auto-extended while the request runs |
/// | [`wait`](Self::wait) / [`fail_fast`](Self::fail_fast) / [`retry`](Self::retry) | fail fast: one attempt per permit, `429` when all are taken |
/// | [`hold`](Self::hold) | [`Hold::UntilBodyEnd`] |
/// | [`max_hold`](Self::max_hold) | the client's `max_hold` |
/// | [`fail_open`](Self::fail_open) | off: `503` when no quorum is reachable |
/// | [`busy_status`](Self::busy_status) | `429 Too Many Requests` |
/// | [`abort_on_loss`](Self::abort_on_loss) | off: a lost permit is logged, the request carries on |
/// | [`on_rejection`](Self::on_rejection) | `application/problem+json` responses |
/// | [`runtime`](Self::runtime) | a thread of the crate's (actix only: tower needs none) |
///
/// Answers, as `application/problem+json` ([`DistributedLockError`]'s problems, or
/// [`on_rejection`](Self::on_rejection)'s responses):
///
/// - the limit is reached (every permit held for as long as the wait policy waits):
///   [`busy_status`](Self::busy_status) (default `429 Too Many Requests`), with
///   `Retry-After` (when the soonest permit frees, else
///   [`redlock_http::FALLBACK_RETRY_AFTER`]);
/// - no quorum of Redis nodes: `503` with `Retry-After`, or the request goes through
///   unlimited with [`fail_open`](Self::fail_open);
/// - the permit lost while the handler runs, with [`abort_on_loss`](Self::abort_on_loss):
///   `503`;
/// - a bad key: `400`; a limit of 0, or a TTL the client refuses: `500` (at request
///   time; nothing panics).
///
/// Responses come out boxed ([`BoxBody`]): the body of a request holding a permit
/// keeps it until it ends.
///
/// As with the crate's other middleware, every call into the client runs on one
/// long-lived runtime (the crate's own thread, or [`runtime`](Self::runtime)), never on
/// an actix worker's (see [Runtimes](crate::DistributedLockConfig#runtimes)).
///
/// ```
/// use std::time::Duration;
///
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::{ConcurrencyLimit, Hold, Redlock};
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
///
/// // Every option, as redlock-tower's `ConcurrencyLimitLayer` takes them.
/// let limit = ConcurrencyLimit::header(redlock, "x-tenant", 2)
///     .resource_prefix("export:")
///     .ttl(Duration::from_secs(5)) // extended while the request runs
///     .wait(Duration::from_secs(1)) // then 429
///     .hold(Hold::UntilHead) // the body is sent without the permit
///     .max_hold(Duration::from_secs(60))
///     .abort_on_loss(true) // a lost permit: 503, not a request past the limit
///     .on_rejection(|rejection| {
///         tracing::info!(kind = ?rejection.kind, "export refused");
///         rejection.to_response()
///     });
/// # let _ = limit;
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
    hold: Hold,
    max_hold: Option<Duration>,
    fail_open: bool,
    busy_status: StatusCode,
    abort_on_loss: bool,
    on_rejection: Option<Arc<OnRejection>>,
    runtime: Option<Handle>,
}

impl std::fmt::Debug for Settings {
    // The options' names as in redlock-tower's layer (its `Config`): the parity test
    // compares them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("redlock", &self.redlock)
            .field("limit", &self.limit)
            .field("resource_prefix", &self.resource_prefix)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("hold", &self.hold)
            .field("max_hold", &self.max_hold)
            .field("fail_open", &self.fail_open)
            .field("busy_status", &self.busy_status)
            .field("abort_on_loss", &self.abort_on_loss)
            .field(
                "on_rejection",
                &self.on_rejection.as_ref().map(|_| "custom"),
            )
            .field("runtime", &self.runtime.is_some())
            .finish()
    }
}

impl<K: KeyExtractor> ConcurrencyLimit<K> {
    /// At most `limit` concurrent requests per key taken by `key` (typically a closure
    /// `|req: &ServiceRequest| -> Result<impl LockKey, BadKey>`), counted through
    /// `redlock` across every replica, with the options' defaults (the table above):
    /// the client's TTL, fail fast, no resource prefix, the permit held until the body
    /// ends, busy answered `429`, fail-closed, no abort on loss.
    ///
    /// A `limit` of 0 is accepted here and answered `500` at request time (with an
    /// error in the log now), as `redlock-tower`'s `ConcurrencyLimitLayer::new`.
    pub fn new(redlock: Redlock, key: K, limit: u32) -> Self {
        if limit == 0 {
            tracing::error!(
                "concurrency limit of 0: every request with a key will be answered 500"
            );
        }
        Self {
            key: Rc::new(key),
            settings: Arc::new(Settings {
                redlock,
                limit,
                resource_prefix: Arc::from(""),
                ttl: None,
                retry: RetryPolicy::once(),
                hold: Hold::default(),
                max_hold: None,
                fail_open: false,
                busy_status: StatusCode::TOO_MANY_REQUESTS,
                abort_on_loss: false,
                on_rejection: None,
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
    /// `<name>/permit/<i>`. Give each limited route its own prefix, and do not lock
    /// those resources with a [`LockMiddleware`](crate::LockMiddleware).
    ///
    /// The prefix, a key and the longest slot suffix (`/permit/<limit - 1>`) must fit
    /// the client's resource-name bound ([`Redlock::max_resource_len`](redlock_core::Redlock::max_resource_len), 512 bytes by default): a key
    /// longer than the room left ([`room`](Self::room)) is refused with `400`, naming
    /// the bound, as in `redlock-tower`. A prefix that leaves no room is logged here and
    /// every request with a key is answered `500`; [`room`](Self::room) says so as a
    /// typed error.
    pub fn resource_prefix(self, prefix: impl Into<String>) -> Self {
        let prefix: Arc<str> = Arc::from(prefix.into());
        let limit = self.with(|s| s.resource_prefix = prefix);
        if let Err(error) = limit.room() {
            tracing::error!(%error, "concurrency limit misconfigured: every request with a key will be answered 500");
        }
        limit
    }

    /// The longest key (after escaping) taken under this prefix and limit: what the
    /// resource-name bound leaves once the prefix and the longest slot suffix
    /// (`/permit/<limit - 1>`) are counted. Check it where the middleware is built.
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`](redlock_http::KeyBoundError::NoRoom) when the prefix
    /// leaves none.
    pub fn room(&self) -> Result<redlock_http::KeyRoom, redlock_http::KeyBoundError> {
        self.settings.room()
    }

    /// The permits' TTL (default: the client's). A permit is extended about every
    /// `ttl / 3` while the request runs, so this is how long a permit stays taken after
    /// a replica dies mid-request, not a limit on the request's duration
    /// ([`max_hold`](Self::max_hold) is).
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|s| s.ttl = Some(ttl))
    }

    /// Answer at once when every permit is taken (the default).
    pub fn fail_fast(self) -> Self {
        self.retry(RetryPolicy::once())
    }

    /// When every permit is taken, wait up to `deadline` for one (woken as soon as a
    /// holder gives it back), then answer the busy status. The default is to answer at
    /// once.
    pub fn wait(self, deadline: Duration) -> Self {
        self.retry(RetryPolicy::deadline(deadline))
    }

    /// The full retry policy of a request waiting for a permit (see [`RetryPolicy`]);
    /// [`wait`](Self::wait) and [`fail_fast`](Self::fail_fast) are shorthands.
    pub fn retry(self, retry: RetryPolicy) -> Self {
        self.with(|s| s.retry = retry)
    }

    /// How long a request keeps its permit (default: [`Hold::UntilBodyEnd`], until its
    /// response body has been sent or dropped; [`Hold::UntilHead`] gives it back once
    /// the handler's response is ready, and the body is sent without it).
    pub fn hold(self, hold: Hold) -> Self {
        self.with(|s| s.hold = hold)
    }

    /// The longest a request may keep its permit, counted from its acquisition
    /// (default: the client's [`max_hold`](redlock_core::RedlockBuilder::max_hold)).
    /// The permit is not extended past it: it expires at its TTL, another request may
    /// take it, and the request is treated as having lost it (see
    /// [`abort_on_loss`](Self::abort_on_loss)).
    pub fn max_hold(self, max_hold: Duration) -> Self {
        self.with(|s| s.max_hold = Some(max_hold))
    }

    /// When no quorum of Redis nodes can be reached (or another backend failure), let
    /// the request through without a permit, logging a warning, instead of answering
    /// `503` (fail-closed, the default). A full limit is still refused.
    pub fn fail_open(self, on: bool) -> Self {
        self.with(|s| s.fail_open = on)
    }

    /// The status answered when every permit is taken (default
    /// `429 Too Many Requests`; `503 Service Unavailable` is another choice).
    pub fn busy_status(self, status: StatusCode) -> Self {
        self.with(|s| s.busy_status = status)
    }

    /// When the permit is lost while the handler runs (a majority of Redis nodes could
    /// not extend it in time, or [`max_hold`](Self::max_hold) ran out), drop the
    /// handler's future and answer `503` ([`RejectionKind::Lost`], through
    /// [`on_rejection`](Self::on_rejection) if set); while the body streams, end the
    /// body with an error so that the client sees an incomplete response. As
    /// [`DistributedLockConfig::abort_on_loss`](crate::DistributedLockConfig::abort_on_loss)
    /// for a lock: the `503` is this middleware's error (an `actix_web::Error` carrying
    /// the response), since the request went with the handler's future.
    ///
    /// Off by default, as the lock's: the loss is logged and the request carries on,
    /// beyond the limit (another request may take the permit meanwhile). The handler
    /// finds no handle of a permit to watch: turn this on where running past the limit
    /// is worse than not finishing.
    pub fn abort_on_loss(self, on: bool) -> Self {
        self.with(|s| s.abort_on_loss = on)
    }

    /// Build rejection responses yourself (default: [`Rejection::to_response`], an
    /// `application/problem+json` document); a full limit is [`RejectionKind::Busy`],
    /// with the busy status; a permit lost with [`abort_on_loss`](Self::abort_on_loss)
    /// is [`RejectionKind::Lost`]. The hook is called once per rejected request. As
    /// [`DistributedLockConfig::on_rejection`](crate::DistributedLockConfig::on_rejection).
    pub fn on_rejection<F>(self, hook: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> HttpResponse + Send + Sync + 'static,
    {
        let hook: Arc<OnRejection> = Arc::new(hook);
        self.with(|s| s.on_rejection = Some(hook))
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
    type Response = ServiceResponse<BoxBody>;
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
    type Response = ServiceResponse<BoxBody>;
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
                Key::Pass => return Ok(service.call(req).await?.map_into_boxed_body()),
                Key::Reject(problem) => {
                    let err = DistributedLockError::Refused(problem);
                    return Ok(settings.reject(req, err, None));
                }
                // A decision this version does not know: the server's mistake.
                _ => return Ok(settings.reject(req, DistributedLockError::MissingConfig, None)),
            };
            // The key must leave room for the slots' suffix (`/permit/<i>`): 400 naming
            // the bound, as in redlock-tower; a prefix that leaves none: 500 (logged).
            let room = settings.room();
            if let Err(error) = room.and_then(|room| room.check("concurrency limit key", key.len()))
            {
                let problem = match error {
                    redlock_http::KeyBoundError::TooLong { .. } => error.problem(),
                    _ => redlock_http::Problem::misconfigured(error.to_string()),
                };
                return Ok(settings.reject(req, DistributedLockError::Refused(problem), None));
            }
            let resource = match redlock_http::resource_name(&settings.resource_prefix, &key) {
                Ok(resource) => resource,
                Err(bad) => return Ok(settings.reject(req, bad.into(), None)),
            };
            let permit = match settings.acquire(&resource).await {
                Ok(permit) => permit,
                Err(err) if settings.fail_open && err.kind() == RejectionKind::Unavailable => {
                    tracing::warn!(key = %resource, error = %err, "lock service unavailable: fail-open, serving the request WITHOUT a concurrency limit");
                    return Ok(service.call(req).await?.map_into_boxed_body());
                }
                Err(err) => return Ok(settings.reject(req, err, Some(&resource))),
            };
            // The permit is given back when it is dropped (`HeldPermit`'s drop): with
            // the response body, or before when the client went away.
            let abort = settings.abort_on_loss;
            let response = if abort {
                // The request cannot be kept (actix routes it further by `Rc::get_mut`):
                // what the answer needs is taken now.
                let path = req.path().to_owned();
                let id = request_id(req.request());
                let lost = Box::pin(permit.handle.cancellation_token().cancelled_owned());
                let handler = Box::pin(service.call(req));
                match select(handler, lost).await {
                    Either::Left((response, _)) => response?,
                    Either::Right(((), handler)) => {
                        // The handler's future is dropped where it stands, then the permit.
                        drop(handler);
                        let slot = permit.handle.resource().to_owned();
                        drop(permit);
                        tracing::warn!(key = %slot, request_id = id.as_deref(), "concurrency permit lost while the request ran (a majority of lock nodes could not extend it in time): request stopped");
                        // Answered as the error of this service (the request went with
                        // the handler): actix renders it with the response built here.
                        let err = DistributedLockError::Lost(slot.clone());
                        let response = settings.respond(&err, Some(&slot), &path, id);
                        return Err(
                            actix_web::error::InternalError::from_response(err, response).into(),
                        );
                    }
                }
            } else {
                service.call(req).await?
            };
            let permit = match settings.hold {
                Hold::UntilHead => {
                    drop(permit);
                    None
                }
                _ => Some(permit),
            };
            Ok(response
                .map_body(move |_, body| BoxBody::new(HoldingBody::new(body, permit, abort))))
        })
    }
}

impl Settings {
    /// The room a key has under the prefix and the longest slot suffix.
    fn room(&self) -> Result<redlock_http::KeyRoom, redlock_http::KeyBoundError> {
        redlock_http::KeyRoom::new(
            &self.redlock,
            &self.resource_prefix,
            redlock_http::permit_suffix_len(self.limit),
        )
    }

    /// The runtime the client's calls run on.
    fn handle(&self) -> Result<Handle, DistributedLockError> {
        match &self.runtime {
            Some(handle) => Ok(handle.clone()),
            None => background()
                .cloned()
                .map_err(DistributedLockError::Background),
        }
    }

    /// A permit of the semaphore `resource` (of `limit` permits), auto-extended (up to
    /// `max_hold`); taken on the background runtime. Dropping this future cancels the
    /// acquisition (whatever it had set is released).
    async fn acquire(&self, resource: &str) -> Result<HeldPermit, DistributedLockError> {
        let runtime = self.handle()?;
        let semaphore = self
            .redlock
            .semaphore(resource, self.limit)
            .map_err(redlock_core::Error::from)?
            .retry(self.retry)
            // A permit's fencing token is per slot, not per key: of no use to a handler.
            .fencing(false);
        let semaphore = match self.ttl {
            Some(ttl) => semaphore.ttl(ttl),
            None => semaphore,
        };
        let max_hold = self.max_hold;
        let started = Instant::now();
        let task = async move {
            let mut permit = semaphore.acquire().await?;
            // Still on the background runtime: the watchdog task starts there.
            match max_hold {
                Some(max_hold) => permit.auto_extend_for(max_hold),
                None => permit.auto_extend(),
            }
            Ok::<_, redlock_core::Error>(permit)
        };
        let joined = AbortOnDrop::spawn(&runtime, task.in_current_span()).await;
        let waited_ms = started.elapsed().as_millis() as u64;
        match joined {
            Ok(Ok(permit)) => {
                tracing::debug!(key = %resource, slot = permit.slot(), waited_ms, "concurrency permit acquired");
                Ok(HeldPermit {
                    handle: permit.handle(),
                    permit: Some(permit),
                    acquired: Instant::now(),
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
    /// for a full limit, carrying the request's id), or the `on_rejection` hook's
    /// response.
    fn reject(
        &self,
        req: ServiceRequest,
        err: DistributedLockError,
        key: Option<&str>,
    ) -> ServiceResponse<BoxBody> {
        let (req, _) = req.into_parts();
        let response = self.respond(&err, key, req.path(), request_id(&req));
        ServiceResponse::new(req, response)
    }

    /// The response for `err` (logged) to the request at `path` with id `id`.
    fn respond(
        &self,
        err: &DistributedLockError,
        key: Option<&str>,
        path: &str,
        id: Option<String>,
    ) -> HttpResponse {
        err.log(path, id.as_deref());
        let kind = err.kind();
        let mut problem = err.problem().with_request_id(id);
        if kind == RejectionKind::Busy {
            problem.status = self.busy_status.as_u16();
        }
        let rejection = Rejection {
            kind,
            key,
            problem,
            error: err.lock_error(),
        };
        match &self.on_rejection {
            Some(hook) => hook(&rejection),
            None => problem_response(&rejection.problem),
        }
    }
}

/// A held permit, given back on the background runtime when dropped (never on the
/// worker's, whose tasks may die with it).
struct HeldPermit {
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

/// The error a response body ends with when its permit is lost while it streams and the
/// middleware aborts on loss: the server cuts the response off.
#[derive(Debug)]
struct PermitLost {
    slot: String,
}

impl std::fmt::Display for PermitLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the concurrency permit `{}` was lost while the response body was being sent",
            self.slot
        )
    }
}

impl std::error::Error for PermitLost {}

impl BodyHold for HeldPermit {
    fn resource(&self) -> &str {
        self.handle.resource()
    }

    fn cancellation_token(&self) -> CancellationToken {
        self.handle.cancellation_token()
    }

    fn cut_off(slot: String) -> Box<dyn std::error::Error> {
        tracing::warn!(key = %slot, "concurrency permit lost while the response body was sent: body cut off");
        Box::new(PermitLost { slot })
    }
}
