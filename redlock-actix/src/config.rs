//! [`DistributedLockConfig`]: the client, the engine's [`LockOptions`], the refusal
//! hook, and the runtime where the lock's background work runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use actix_web::{HttpRequest, HttpResponse, web};
use redlock_core::Redlock;
use redlock_http::key::BadKey;
use redlock_http::{LockOptions, Refusal};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::error::{DistributedLockError, problem_response};
use crate::guard::LockGuard;

/// How [`LockMiddleware`](crate::LockMiddleware) and the
/// [`DistributedLock`](crate::DistributedLock) extractor take their locks: the client,
/// the engine's [`LockOptions`], the [`on_refusal`](Self::on_refusal) hook and the
/// [runtime](Self#runtimes). The extractors find the innermost one in `app_data` (as a
/// plain value, or in `web::Data`); a route without one answers 500.
///
/// # Runtimes
///
/// Every call into the client runs on one long-lived runtime, never on an actix worker's
/// (whose tasks die with it): a thread of this crate's own by default, or
/// [`runtime`](Self::runtime). The guide ([`_guide`](crate::_guide)) says more.
#[derive(Clone, Debug)]
pub struct DistributedLockConfig {
    pub(crate) setup: Setup,
    pub(crate) options: LockOptions,
}

impl DistributedLockConfig {
    /// Locks through `redlock` with the default [`LockOptions`].
    pub fn new(redlock: Redlock) -> Self {
        Self {
            setup: Setup::new(redlock),
            options: LockOptions::new(),
        }
    }

    /// Takes its locks by `options` (`hold`, `fail_open` and `abort_on_loss` are the
    /// middleware's only: the extractor's value is the held lock).
    #[must_use]
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// Runs the client's calls on this runtime (time and I/O enabled, outliving the
    /// requests) instead of the crate's own thread.
    #[must_use]
    pub fn runtime(mut self, handle: Handle) -> Self {
        self.setup.runtime = Some(handle);
        self
    }

    /// Build refusal responses yourself (default: [`problem_response`]), as
    /// `redlock-tower`'s `on_refusal`.
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

    /// The innermost configuration for `req`, as a plain value or in `web::Data`.
    pub fn from_req(req: &HttpRequest) -> Option<&Self> {
        req.app_data::<Self>()
            .or_else(|| req.app_data::<web::Data<Self>>().map(|data| &***data))
    }

    /// `resource_prefix + key` ([`redlock_http::key::resource_name`]).
    pub(crate) fn resource(&self, key: &str) -> Result<String, BadKey> {
        redlock_http::key::resource_name(self.options.prefix(), key)
    }

    /// Takes the lock on `resource` on the background runtime (cancelled when dropped).
    pub(crate) async fn acquire(
        &self,
        resource: String,
    ) -> Result<LockGuard, DistributedLockError> {
        take_lock(&self.setup, &self.options, resource)
            .await
            .map_err(Failure::into_error)
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
pub enum Failure {
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
pub struct Setup {
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
