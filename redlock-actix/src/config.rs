//! [`DistributedLockConfig`]: the client, the engine's [`LockOptions`], the refusal
//! hook, and the runtime where the lock's background work runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use actix_web::{HttpRequest, HttpResponse, web};
use redlock_core::Redlock;
use redlock_http::key::BadKey;
use redlock_http::{LockOptions, Refusal, RefusalKind};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::error::{DistributedLockError, problem_response, request_id};
use crate::guard::LockGuard;

/// How [`LockMiddleware`](crate::LockMiddleware) and the
/// [`DistributedLock`](crate::DistributedLock) extractor take their locks: the client,
/// the engine's [`LockOptions`] ([`options`](Self::options): the same type as
/// `redlock-tower`'s `LockLayer` takes; one table for both in [`redlock_http`'s
/// contract](redlock_http#the-web-crates-contract)), the refusal hook
/// ([`on_refusal`](Self::on_refusal)) and the [runtime](Self#runtimes).
///
/// [`LockMiddleware::new`](crate::LockMiddleware::new) takes it directly. The
/// extractors (`DistributedLock<T>`, `FencingToken`) find it in `app_data`: register it
/// with `.app_data(config)` on the `App`, a scope or a resource; the innermost one
/// applies (resource over scope over app), as with actix's own `PathConfig`. It is
/// looked up as a plain value first, then as `web::Data<DistributedLockConfig>`. A
/// route whose extractor finds none answers 500 with
/// [`DistributedLockError::MissingConfig`]'s message.
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
/// use redlock_actix::{DistributedLock, DistributedLockConfig, LockOptions};
/// use redlock_core::Redlock;
///
/// async fn pay(order: DistributedLock<web::Path<u64>>) -> HttpResponse {
///     HttpResponse::Ok().body(format!("paid order {}", *order))
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redlock = Redlock::builder()
///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .build()?;
/// let options = LockOptions::new()
///     .ttl(Duration::from_secs(5))
///     .resource_prefix("order:");
/// let config = DistributedLockConfig::new(redlock).options(options.clone());
/// let app = App::new()
///     .app_data(config.clone())
///     .service(
///         web::scope("/orders")
///             // here: wait up to 2 s for a busy order instead of answering 409 at once
///             .app_data(config.options(options.wait(Duration::from_secs(2))))
///             .route("/{id}/pay", web::post().to(pay)),
///     );
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DistributedLockConfig {
    pub(crate) setup: Setup,
    pub(crate) options: LockOptions,
}

impl std::fmt::Debug for DistributedLockConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedLockConfig")
            .field("setup", &self.setup)
            .field("options", &self.options)
            .finish()
    }
}

impl DistributedLockConfig {
    /// A configuration taking its locks through `redlock` (cheap to clone: share one per
    /// process), with the default [`LockOptions`] (see the table in
    /// [`redlock_http`](redlock_http#the-web-crates-contract)).
    pub fn new(redlock: Redlock) -> Self {
        Self {
            setup: Setup::new(redlock),
            options: LockOptions::new(),
        }
    }

    /// Takes its locks by `options` (resource prefix, TTL, wait policy, hold, fencing,
    /// fail-open, busy status, abort on loss: the engine's, the same type as
    /// `redlock-tower`'s `LockLayer` takes).
    ///
    /// The [`DistributedLock`](crate::DistributedLock) extractor has no hold on the
    /// response nor on the handler's future: it holds its lock for as long as the
    /// handler keeps it ([`LockGuard::hold_during`] keeps it until a body is sent),
    /// answers `503` where the middleware would fail open (its value is the held lock),
    /// and leaves a loss to the handler ([`LockGuard::lost`]); `hold`, `fail_open` and
    /// `abort_on_loss` are the middleware's.
    #[must_use]
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// Runs the client's calls (and so its background tasks) on this runtime instead of
    /// the crate's own thread (see [Runtimes](Self#runtimes)). It must outlive every
    /// request using this configuration, and have its time and I/O drivers enabled.
    #[must_use]
    pub fn runtime(mut self, handle: Handle) -> Self {
        self.setup.runtime = Some(handle);
        self
    }

    /// Build refusal responses yourself (default: [`problem_response`] of the refusal's
    /// problem, an `application/problem+json` document), as `redlock-tower`'s
    /// `on_refusal`. Not used for a route without configuration, nor for the inner
    /// extractor's own errors.
    ///
    /// ```
    /// use actix_web::HttpResponse;
    /// use redlock_actix::{DistributedLockConfig, RefusalKind, error::problem_response};
    /// # let redlock = redlock_core::Redlock::builder().node("redis://127.0.0.1:6379").build().unwrap();
    /// let config = DistributedLockConfig::new(redlock).on_refusal(|refusal| match refusal.kind {
    ///     RefusalKind::Busy => HttpResponse::Conflict().body("try again later"),
    ///     _ => problem_response(&refusal.problem),
    /// });
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn on_refusal<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Refusal) -> HttpResponse + Send + Sync + 'static,
    {
        self.setup.on_refusal = Some(Arc::new(hook));
        self
    }

    /// The client.
    pub fn redlock(&self) -> &Redlock {
        &self.setup.redlock
    }

    /// The lock options.
    pub fn lock_options(&self) -> &LockOptions {
        &self.options
    }

    /// The innermost configuration for `req` (resource, then scope, then app), as a plain
    /// value or in `web::Data`: what the [`DistributedLock`](crate::DistributedLock)
    /// and [`FencingToken`](crate::FencingToken) extractors use.
    pub fn from_req(req: &HttpRequest) -> Option<&Self> {
        req.app_data::<Self>()
            .or_else(|| req.app_data::<web::Data<Self>>().map(|data| &***data))
    }

    /// `err` as an actix error, logged, carrying the `on_refusal` hook's response if
    /// one is set, else a generic problem with the request's id (and the configured
    /// `busy_status` for a busy key).
    pub(crate) fn reject(
        &self,
        err: DistributedLockError,
        key: Option<&str>,
        req: &HttpRequest,
    ) -> actix_web::Error {
        let id = request_id(req);
        err.log(req.path(), id.as_deref());
        let mut refusal = Refusal::new(err.kind(), err.problem()).with_request_id(id);
        if refusal.kind == RefusalKind::Busy {
            refusal.problem.status = self.options.busy_code();
        }
        if let Some(key) = key {
            refusal = refusal.with_resource(key);
        }
        let response = self.setup.render(&refusal);
        actix_web::error::InternalError::from_response(err, response).into()
    }

    /// `resource_prefix + key` ([`redlock_http::key::resource_name`]); an empty key is
    /// refused here, one too long by the client
    /// ([`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len)), before
    /// anything is sent.
    pub(crate) fn resource(&self, key: &str) -> Result<String, BadKey> {
        redlock_http::key::resource_name(self.options.prefix(), key)
    }

    /// Takes the lock on `resource` by this configuration, watched by the client's
    /// watchdog; the acquisition runs on the background runtime. Dropping the returned
    /// future (the client went away) cancels it, and whatever it had set is released.
    pub(crate) async fn acquire(
        &self,
        resource: String,
    ) -> Result<LockGuard, DistributedLockError> {
        self.take(resource).await.map_err(Failure::into_error)
    }

    /// [`acquire`](Self::acquire), with the lock client's error as it is.
    pub(crate) async fn take(&self, resource: String) -> Result<LockGuard, Failure> {
        take_lock(&self.setup, &self.options, resource).await
    }
}

/// Takes the lock on `resource` by `options`, on `setup`'s runtime.
pub(crate) fn take_lock(
    setup: &Setup,
    options: &LockOptions,
    resource: String,
) -> impl Future<Output = Result<LockGuard, Failure>> + 'static {
    let task = options.acquire(&setup.redlock, resource);
    let setup = setup.clone();
    async move {
        let (lock, runtime) = setup.run(task).await?;
        Ok(LockGuard::new(lock, runtime))
    }
}

/// Why an acquisition on the background runtime failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The lock client's answer.
    Lock(redlock_core::Error),
    /// The background task did not run to its end.
    Background(String),
}

impl Failure {
    pub(crate) fn into_error(self) -> DistributedLockError {
        match self {
            Self::Lock(err) => DistributedLockError::from(err),
            Self::Background(err) => DistributedLockError::Background(err),
        }
    }
}

/// The refusal hook of a middleware or a configuration.
pub(crate) type OnRefusal = dyn Fn(&Refusal) -> HttpResponse + Send + Sync;

/// What a lock or a limit needs besides its options: the client, the runtime its calls
/// run on, the refusal hook.
#[derive(Clone)]
pub(crate) struct Setup {
    pub(crate) redlock: Redlock,
    pub(crate) runtime: Option<Handle>,
    pub(crate) on_refusal: Option<Arc<OnRefusal>>,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("redlock", &self.redlock)
            .field("runtime", &self.runtime.is_some())
            .field("on_refusal", &self.on_refusal.is_some())
            .finish()
    }
}

impl Setup {
    pub(crate) fn new(redlock: Redlock) -> Self {
        Self {
            redlock,
            runtime: None,
            on_refusal: None,
        }
    }

    /// The runtime the client's calls run on.
    pub(crate) fn handle(&self) -> Result<Handle, String> {
        match &self.runtime {
            Some(handle) => Ok(handle.clone()),
            None => background().cloned(),
        }
    }

    /// Runs `task` (an acquisition) on the background runtime; dropping the returned
    /// future cancels it, and whatever it had set is released.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        task: impl Future<Output = Result<T, redlock_core::Error>> + Send + 'static,
    ) -> Result<(T, Handle), Failure> {
        let runtime = self.handle().map_err(Failure::Background)?;
        match AbortOnDrop::spawn(&runtime, task.in_current_span()).await {
            Ok(Ok(value)) => Ok((value, runtime)),
            Ok(Err(err)) => Err(Failure::Lock(err)),
            Err(join) => {
                tracing::error!(error = %join, "lock task failed");
                Err(Failure::Background(join.to_string()))
            }
        }
    }

    /// The response to `refusal`: the hook's, or the problem+json default.
    pub(crate) fn render(&self, refusal: &Refusal) -> HttpResponse {
        match &self.on_refusal {
            Some(hook) => hook(refusal),
            None => problem_response(&refusal.problem),
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
