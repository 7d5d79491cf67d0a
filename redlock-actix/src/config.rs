//! [`DistributedLockConfig`]: the client, TTL, wait policy, resource prefix, the
//! options shared with redlock-tower's layer, the rejection hook, and
//! the runtime where the lock's background work runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use redlock_core::{Redlock, RetryPolicy};
use redlock_http::{BadKey, Hold, RejectionKind};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::error::{DistributedLockError, Rejection, problem_response, request_id};
use crate::guard::LockGuard;

type OnRejection = dyn Fn(&Rejection<'_>) -> HttpResponse + Send + Sync;

/// How [`DistributedLock`](crate::DistributedLock) and
/// [`LockMiddleware`](crate::LockMiddleware) take their locks.
///
/// Register it with `.app_data(config)` on the `App`, a scope or a resource; the
/// innermost one applies (resource over scope over app), as with actix's own
/// `PathConfig`. It is looked up as a plain value first, then as
/// `web::Data<DistributedLockConfig>`. A route without one answers 500 with
/// [`DistributedLockError::MissingConfig`]'s message.
///
/// - **TTL**: the lock's TTL (default: the client's). The lock is auto-extended by the
///   client's watchdog while held, up to [`max_hold`](Self::max_hold).
/// - **Wait policy**: [`fail_fast`](Self::fail_fast) (default: one attempt, 409 when
///   busy) or [`wait`](Self::wait) a deadline (woken as soon as the holder
///   releases; 409 past the deadline); any [`RetryPolicy`] with [`retry`](Self::retry).
/// - **Resource prefix**: the lock's resource is `resource_prefix + key` (default:
///   empty).
/// - **Hold**, **fail open**, **busy status**, **abort on loss**: as `redlock-tower`'s
///   options of the same names (for [`LockMiddleware`](crate::LockMiddleware); the
///   extractor's differences are said at each).
/// - **On rejection**: turns a [`Rejection`] into the response you want.
///
/// The options, their defaults and meanings are those of `redlock-tower`'s
/// `LockLayer`: one table for both, in [`redlock_http`'s
/// contract](redlock_http#the-web-crates-contract).
///
/// # Runtimes
///
/// `redlock-core` runs background tasks (releasing a dropped lock, the auto-extension
/// watchdog, wake-ups of waiters, the connections to the nodes) on the tokio runtime
/// where they are first needed. actix-web runs every worker on a runtime of its own, and
/// a task bound to a worker's runtime dies with it (a server stopped and started again
/// in the same process, a worker restarted): the next lock would then meet broken
/// connections, and watched locks would stop being extended. So every call into the
/// client (acquire, watch, release) runs on one long-lived runtime instead: by default a
/// current-thread runtime on a thread of this crate's own (`redlock-actix`), started on
/// first use and shared by every configuration of the process; or the runtime given with
/// [`runtime`](Self::runtime). The handler just awaits the result. One `Redlock` (built
/// anywhere) can thus serve every worker: build it once and clone it into the
/// configuration. The default runtime is a single thread doing the client's work for
/// the whole process (a few microseconds per lock); for very high lock rates, give it
/// a multi-threaded runtime of yours.
///
/// ```
/// use std::time::Duration;
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::{DistributedLock, DistributedLockConfig, Redlock};
///
/// async fn pay(order: DistributedLock<web::Path<u64>>) -> HttpResponse {
///     HttpResponse::Ok().body(format!("paid order {}", *order))
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redlock = Redlock::builder()
///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .build()?;
/// let config = DistributedLockConfig::new(redlock)
///     .ttl(Duration::from_secs(5))
///     .resource_prefix("order:");
/// let app = App::new()
///     .app_data(config.clone())
///     .service(
///         web::scope("/orders")
///             // here: wait up to 2 s for a busy order instead of answering 409 at once
///             .app_data(config.wait(Duration::from_secs(2)))
///             .route("/{id}/pay", web::post().to(pay)),
///     );
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DistributedLockConfig {
    redlock: Redlock,
    ttl: Option<Duration>,
    retry: RetryPolicy,
    resource_prefix: Arc<str>,
    max_hold: Option<Duration>,
    fencing: Option<bool>,
    hold: Hold,
    fail_open: bool,
    busy_status: StatusCode,
    abort_on_loss: bool,
    runtime: Option<Handle>,
    on_rejection: Option<Arc<OnRejection>>,
}

impl std::fmt::Debug for DistributedLockConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedLockConfig")
            .field("redlock", &self.redlock)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("resource_prefix", &self.resource_prefix)
            .field("max_hold", &self.max_hold)
            .field("fencing", &self.fencing)
            .field("hold", &self.hold)
            .field("fail_open", &self.fail_open)
            .field("busy_status", &self.busy_status)
            .field("abort_on_loss", &self.abort_on_loss)
            .field("runtime", &self.runtime.is_some())
            .field("on_rejection", &self.on_rejection.is_some())
            .finish()
    }
}

impl DistributedLockConfig {
    /// A configuration taking its locks through `redlock` (cheap to clone: share one per
    /// process): the client's TTL, fail fast, no resource prefix, the other options'
    /// defaults (see the table in [`redlock_http`](redlock_http#the-web-crates-contract)).
    pub fn new(redlock: Redlock) -> Self {
        Self {
            redlock,
            ttl: None,
            retry: RetryPolicy::once(),
            resource_prefix: Arc::from(""),
            max_hold: None,
            fencing: None,
            hold: Hold::default(),
            fail_open: false,
            busy_status: StatusCode::CONFLICT,
            abort_on_loss: false,
            runtime: None,
            on_rejection: None,
        }
    }

    /// The client.
    pub fn redlock(&self) -> &Redlock {
        &self.redlock
    }

    /// The lock's TTL (default: the client's). The watchdog extends the lock about every
    /// `ttl / 3` while it is held; a shorter TTL means another replica can take over
    /// sooner after this one dies, at the cost of more extension traffic.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// One attempt: a busy lock answers 409 at once (the default).
    pub fn fail_fast(mut self) -> Self {
        self.retry = RetryPolicy::once();
        self
    }

    /// Waits up to `deadline` for a busy lock (retrying as soon as the holder releases
    /// it); past the deadline, 409.
    pub fn wait(mut self, deadline: Duration) -> Self {
        self.retry = RetryPolicy::deadline(deadline);
        self
    }

    /// Any retry policy (attempts, deadline, delays).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The lock's resource is `prefix` followed by the key (default: empty;
    /// [`redlock_http::resource_name`]). Use it to keep different routes' keys apart,
    /// e.g. `"order:"`. Not to be confused with the client's
    /// [`key_prefix`](redlock_core::RedlockBuilder::key_prefix), the Redis key namespace
    /// in front of every resource on the nodes.
    pub fn resource_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.resource_prefix = Arc::from(prefix.into());
        self
    }

    /// How long a request under [`LockMiddleware`](crate::LockMiddleware) keeps its
    /// lock (default: [`Hold::UntilBodyEnd`], until the response body has been sent or
    /// dropped; [`Hold::UntilHead`]: until the handler's response is ready). The
    /// [`DistributedLock`](crate::DistributedLock) extractor holds its lock for as long
    /// as the handler keeps it (its argument is dropped when the handler returns;
    /// [`LockGuard::hold_during`] keeps it until a body is sent): an extractor has no
    /// hold on the response.
    pub fn hold(mut self, hold: Hold) -> Self {
        self.hold = hold;
        self
    }

    /// When no quorum of Redis nodes can be reached (or another backend failure), let
    /// the request through [`LockMiddleware`](crate::LockMiddleware) without a lock,
    /// logging a warning, instead of answering `503` (fail-closed, the default). A busy
    /// key is still refused. A handler taking a [`FencingToken`](crate::FencingToken)
    /// is not called for a request let through unlocked: it is answered `503`.
    ///
    /// The [`DistributedLock`](crate::DistributedLock) extractor still answers `503`:
    /// its value is the held lock, which it cannot be without one.
    pub fn fail_open(mut self, on: bool) -> Self {
        self.fail_open = on;
        self
    }

    /// The status answered when the key is busy (default `409 Conflict`; `423 Locked`
    /// or `429 Too Many Requests` are other common choices).
    pub fn busy_status(mut self, status: StatusCode) -> Self {
        self.busy_status = status;
        self
    }

    /// When the lock is lost while a request under
    /// [`LockMiddleware`](crate::LockMiddleware) runs (a majority of Redis nodes could
    /// not extend it in time), drop the handler's future and answer `503`; while the
    /// body streams, end the body with a [`LockLost`](crate::LockLost) error so that the
    /// client sees an incomplete response. Off by default: the loss is logged and
    /// signalled through the [`LockHandle`](crate::LockHandle) (`lost()`, `is_held()`).
    /// The `503` is the middleware's error (an `actix_web::Error` carrying the response,
    /// [`on_rejection`](Self::on_rejection)'s if set): the request went with the
    /// handler's future, so outer middleware sees an error where other rejections are
    /// responses.
    ///
    /// The [`DistributedLock`](crate::DistributedLock) extractor cannot stop the
    /// handler it is an argument of (actix gives an extractor no hold on the handler's
    /// future): the handler watches [`LockGuard::lost`] itself.
    pub fn abort_on_loss(mut self, on: bool) -> Self {
        self.abort_on_loss = on;
        self
    }

    /// How long a lock is auto-extended at most, counted from its acquisition (default:
    /// the client's [`max_hold`](redlock_core::RedlockBuilder::max_hold)). Past it the
    /// lock expires at its TTL and the guard reports it lost.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Take the lock with a fencing token (default: the client's setting); read it with
    /// [`LockGuard::fencing_token`].
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = Some(on);
        self
    }

    /// Runs the client's calls (and so its background tasks) on this runtime instead of
    /// the crate's own thread (see [Runtimes](Self#runtimes)). It must outlive every
    /// request using this configuration, and have its time and I/O drivers enabled.
    pub fn runtime(mut self, handle: Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Build rejection responses yourself (default: [`Rejection::to_response`], an
    /// `application/problem+json` document), as `redlock-tower`'s `on_rejection`. Not
    /// used for a route without configuration, nor for the inner extractor's own
    /// errors.
    ///
    /// ```
    /// use actix_web::HttpResponse;
    /// use redlock_actix::{DistributedLockConfig, RejectionKind};
    /// # let redlock = redlock_actix::Redlock::builder().node("redis://127.0.0.1:6379").build().unwrap();
    /// let config = DistributedLockConfig::new(redlock).on_rejection(|rejection| {
    ///     match rejection.kind {
    ///         RejectionKind::Busy => HttpResponse::build(rejection.status()).body("try again later"),
    ///         _ => rejection.to_response(),
    ///     }
    /// });
    /// # let _ = config;
    /// ```
    pub fn on_rejection<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> HttpResponse + Send + Sync + 'static,
    {
        self.on_rejection = Some(Arc::new(hook));
        self
    }

    pub(crate) fn hold_setting(&self) -> Hold {
        self.hold
    }

    pub(crate) fn fails_open(&self) -> bool {
        self.fail_open
    }

    pub(crate) fn aborts_on_loss(&self) -> bool {
        self.abort_on_loss
    }

    /// The innermost configuration for `req` (resource, then scope, then app), as a plain
    /// value or in `web::Data`.
    pub fn from_req(req: &HttpRequest) -> Option<&Self> {
        req.app_data::<Self>()
            .or_else(|| req.app_data::<web::Data<Self>>().map(|data| &***data))
    }

    /// `err` as an actix error, logged, carrying the `on_rejection` hook's response if
    /// one is set, else a generic problem with the request's id (and the configured
    /// `busy_status` for a busy key).
    pub(crate) fn reject(
        &self,
        err: DistributedLockError,
        key: Option<&str>,
        req: &HttpRequest,
    ) -> actix_web::Error {
        self.reject_request(err, key, req.path(), request_id(req))
    }

    /// [`reject`](Self::reject), for the request at `path` with id `id` (when the
    /// request itself is gone with the handler's future).
    pub(crate) fn reject_request(
        &self,
        err: DistributedLockError,
        key: Option<&str>,
        path: &str,
        id: Option<String>,
    ) -> actix_web::Error {
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
        let response = match &self.on_rejection {
            Some(hook) => hook(&rejection),
            None => problem_response(&rejection.problem),
        };
        actix_web::error::InternalError::from_response(err, response).into()
    }

    /// `resource_prefix + key` ([`redlock_http::resource_name`]); an empty key is
    /// refused here, one too long by the client
    /// ([`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len)), before
    /// anything is sent.
    pub(crate) fn resource(&self, key: &str) -> Result<String, BadKey> {
        redlock_http::resource_name(&self.resource_prefix, key)
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

    /// Takes the lock on `resource` by this configuration, watched by the client's
    /// watchdog; the acquisition runs on the background runtime. Dropping the returned
    /// future (the client went away) cancels it, and whatever it had set is released.
    pub(crate) async fn acquire(
        &self,
        resource: String,
    ) -> Result<LockGuard, DistributedLockError> {
        let handle = self.handle()?;
        let redlock = self.redlock.clone();
        let (ttl, retry, fencing, max_hold) = (self.ttl, self.retry, self.fencing, self.max_hold);
        let started = Instant::now();
        let task = {
            let resource = resource.clone();
            async move {
                let mut acquire = redlock.lock(resource).retry(retry);
                if let Some(ttl) = ttl {
                    acquire = acquire.ttl(ttl);
                }
                if let Some(fencing) = fencing {
                    acquire = acquire.fencing(fencing);
                }
                let mut lock = acquire.await?;
                // Still on the background runtime: the watchdog task starts there.
                match max_hold {
                    Some(max_hold) => lock.auto_extend_for(max_hold),
                    None => lock.auto_extend(),
                }
                Ok::<_, redlock_core::Error>(lock)
            }
        };
        let joined = AbortOnDrop {
            task: Some(handle.spawn(task.in_current_span())),
            runtime: handle.clone(),
        }
        .await;
        let waited_ms = started.elapsed().as_millis() as u64;
        match joined {
            Ok(Ok(lock)) => {
                tracing::debug!(
                    key = %resource,
                    attempts = lock.attempts(),
                    waited_ms,
                    validity_ms = lock.validity().as_millis() as u64,
                    "lock acquired"
                );
                Ok(LockGuard::new(lock, handle))
            }
            Ok(Err(err)) => Err(DistributedLockError::from(err)),
            Err(join) => {
                tracing::error!(key = %resource, error = %join, "lock task failed");
                Err(DistributedLockError::Background(join.to_string()))
            }
        }
    }
}

/// A task on the background runtime, aborted if the waiter goes away first (the
/// acquisition is then cancelled, and core releases whatever it had set).
pub(crate) struct AbortOnDrop<T> {
    task: Option<tokio::task::JoinHandle<T>>,
    runtime: Handle,
}

impl<T: Send + 'static> AbortOnDrop<T> {
    /// `task`, spawned on `runtime`.
    pub(crate) fn spawn(runtime: &Handle, task: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            task: Some(runtime.spawn(task)),
            runtime: runtime.clone(),
        }
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(task) = self.task.as_mut() else {
            return Poll::Pending; // already returned its output: never polled again
        };
        let out = ready!(Pin::new(task).poll(cx));
        self.task = None;
        Poll::Ready(out)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            // A lock acquired just before is dropped with the handle: release it from the
            // background runtime too.
            let _in_background = self.runtime.enter();
            drop(task);
        }
    }
}

/// The crate's own runtime: a current-thread runtime on a thread that runs for the rest
/// of the process, started on first use.
pub(crate) fn background() -> Result<&'static Handle, String> {
    static RUNTIME: OnceLock<Result<Handle, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("redlock-actix")
                .build()
                .map_err(|err| format!("cannot build the redlock-actix runtime: {err}"))?;
            let handle = runtime.handle().clone();
            std::thread::Builder::new()
                .name("redlock-actix".into())
                .spawn(move || runtime.block_on(std::future::pending::<()>()))
                .map_err(|err| format!("cannot start the redlock-actix thread: {err}"))?;
            Ok(handle)
        })
        .as_ref()
        .map_err(Clone::clone)
}
