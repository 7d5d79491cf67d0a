//! [`DistributedLockConfig`]: the client, TTL, wait policy, prefix and error handler, and
//! the runtime where the lock's background work runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use actix_web::{HttpRequest, web};
use redlock_core::{Redlock, RetryPolicy};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::error::BadKey;
use crate::error::DistributedLockError;
use crate::guard::LockGuard;

type ErrorHandler = dyn Fn(DistributedLockError, &HttpRequest) -> actix_web::Error + Send + Sync;

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
/// - **Key prefix**: the lock's resource is `key_prefix + key` (default: empty).
/// - **Error handler**: turns a [`DistributedLockError`] into the response you want.
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
///     .key_prefix("order:");
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
    prefix: Arc<str>,
    max_hold: Option<Duration>,
    fencing: Option<bool>,
    runtime: Option<Handle>,
    error_handler: Option<Arc<ErrorHandler>>,
}

impl std::fmt::Debug for DistributedLockConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedLockConfig")
            .field("redlock", &self.redlock)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("prefix", &self.prefix)
            .field("max_hold", &self.max_hold)
            .field("fencing", &self.fencing)
            .field("runtime", &self.runtime.is_some())
            .field("error_handler", &self.error_handler.is_some())
            .finish()
    }
}

impl DistributedLockConfig {
    /// A configuration taking its locks through `redlock` (cheap to clone: share one per
    /// process): the client's TTL, fail fast, no prefix, no error handler.
    pub fn new(redlock: Redlock) -> Self {
        Self {
            redlock,
            ttl: None,
            retry: RetryPolicy::once(),
            prefix: Arc::from(""),
            max_hold: None,
            fencing: None,
            runtime: None,
            error_handler: None,
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

    /// The lock's resource is `prefix` followed by the key (default: empty). Use it to
    /// keep different routes' keys apart, e.g. `"order:"`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
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

    /// Turns a rejection into the response of your choice (like actix's
    /// `PathConfig::error_handler`). Not used for a route without configuration, nor for
    /// the inner extractor's own errors.
    ///
    /// ```
    /// use actix_web::{HttpResponse, error::InternalError};
    /// # let redlock = redlock_actix::Redlock::builder().node("redis://127.0.0.1:6379").build().unwrap();
    /// let config = redlock_actix::DistributedLockConfig::new(redlock).error_handler(|err, _req| {
    ///     let response = HttpResponse::Locked().body("try again later");
    ///     InternalError::from_response(err, response).into()
    /// });
    /// # let _ = config;
    /// ```
    pub fn error_handler<F>(mut self, handler: F) -> Self
    where
        F: Fn(DistributedLockError, &HttpRequest) -> actix_web::Error + Send + Sync + 'static,
    {
        self.error_handler = Some(Arc::new(handler));
        self
    }

    /// The innermost configuration for `req` (resource, then scope, then app), as a plain
    /// value or in `web::Data`.
    pub fn from_req(req: &HttpRequest) -> Option<&Self> {
        req.app_data::<Self>()
            .or_else(|| req.app_data::<web::Data<Self>>().map(|data| &***data))
    }

    /// `err` as an actix error: through the error handler if one is set, else logged
    /// and answered with a generic problem carrying the request's id.
    pub(crate) fn reject(&self, err: DistributedLockError, req: &HttpRequest) -> actix_web::Error {
        match &self.error_handler {
            Some(handler) => handler(err, req),
            None => err.respond(req),
        }
    }

    /// `prefix + key`; an empty key is refused here, one too long by the client
    /// ([`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len)), before
    /// anything is sent.
    pub(crate) fn resource(&self, key: Result<String, BadKey>) -> Result<String, BadKey> {
        let key = key?;
        if key.is_empty() {
            return Err(BadKey::new("the lock key is empty"));
        }
        Ok(format!("{}{key}", self.prefix))
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
struct AbortOnDrop<T> {
    task: Option<tokio::task::JoinHandle<T>>,
    runtime: Handle,
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
fn background() -> Result<&'static Handle, String> {
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
