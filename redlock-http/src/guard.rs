//! The request decision of the lock middleware and of the cluster-wide concurrency
//! limit, with their options ([`LockOptions`], [`LimitOptions`]): one engine, driven by
//! `redlock-tower`'s layers and `redlock-actix`'s middleware alike.
//!
//! For each request: the key extractor's [`Key`] → [`route`](Guard::route) (pass,
//! refuse, or the resource to take) → [`acquire`](LockOptions::acquire) → on an error,
//! [`refuse`](Guard::refuse) (a [`Refusal`], or `None` to serve the request
//! without a lock when `fail_open` is on) → run the handler → release (dropping the
//! held lock or permit, when the response ends by [`Hold`]).

use std::future::Future;
use std::time::{Duration, Instant};

use redlock_core::semaphore::Permit;
use redlock_core::{Error, ErrorClass, Lock, Redlock, RetryPolicy};

use crate::key::{Key, KeyBoundError, KeyRoom, permit_suffix_len};
use crate::{Hold, Refusal, RefusalKind};

/// What an extractor's decision and the options make of a request.
#[derive(Debug)]
#[non_exhaustive]
pub enum Route {
    /// No key: the request goes through as it is (unlocked, unlimited).
    Pass,
    /// Refused before anything is sent to the nodes.
    Refuse(Refusal),
    /// Take this resource (the resource prefix and the key), then run the request.
    Take(String),
}

/// The options of a guarding middleware, one type for the lock ([`LockOptions`]) and the
/// cluster-wide concurrency limit ([`LimitOptions`]): the fields, defaults and setters
/// they share, and `K`, what is the lock's or the limit's own. See the table in the
/// [crate docs](crate#the-web-crates-contract).
#[derive(Debug, Clone)]
pub struct GuardOptions<K> {
    resource_prefix: String,
    ttl: Option<Duration>,
    retry: RetryPolicy,
    hold: Hold,
    max_hold: Option<Duration>,
    fail_open: bool,
    busy_status: u16,
    abort_on_loss: bool,
    kind: K,
}

/// What is [`LockOptions`]' own: fencing.
#[derive(Debug, Clone)]
pub struct LockKind {
    fencing: Option<bool>,
}

/// What is [`LimitOptions`]' own: the limit.
#[derive(Debug, Clone)]
pub struct LimitKind {
    limit: u32,
}

/// The lock's or the limit's part of the request decision.
pub trait Kind {
    /// What a request takes, for the log: `lock` or `permit`.
    const WHAT: &'static str;

    /// What is derived after the key under the resource-name bound (a semaphore's slot
    /// suffix), if anything.
    fn suffix(&self) -> Option<usize>;
}

impl Kind for LockKind {
    const WHAT: &'static str = "lock";

    fn suffix(&self) -> Option<usize> {
        None
    }
}

impl Kind for LimitKind {
    const WHAT: &'static str = "permit";

    fn suffix(&self) -> Option<usize> {
        Some(permit_suffix_len(self.limit))
    }
}

impl<K> GuardOptions<K> {
    fn with_kind(busy_status: u16, kind: K) -> Self {
        Self {
            resource_prefix: String::new(),
            ttl: None,
            retry: RetryPolicy::once(),
            hold: Hold::default(),
            max_hold: None,
            fail_open: false,
            busy_status,
            abort_on_loss: false,
            kind,
        }
    }

    /// Put `prefix` in front of every extracted key (e.g. `"order:"`): the resource name
    /// is `prefix` followed by the key ([`resource_name`](crate::key::resource_name)), so
    /// that middleware on different routes with the same kind of key do not share locks
    /// (or permits). Default: empty. Not the client's `key_prefix` (the Redis key
    /// namespace in front of every resource on the nodes).
    #[must_use]
    pub fn resource_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.resource_prefix = prefix.into();
        self
    }

    /// The lock's (a permit's) TTL (default: the client's `default_ttl`). It is extended
    /// about every `ttl / 3` while the request runs, so it is how long a replica that
    /// died mid-request keeps the key taken, not a limit on the request
    /// ([`max_hold`](Self::max_hold) is).
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        Self {
            ttl: Some(ttl),
            ..self
        }
    }

    /// Answer the busy status at once when the key is taken (the default).
    #[must_use]
    pub fn fail_fast(self) -> Self {
        self.retry(RetryPolicy::once())
    }

    /// When the key is taken, wait up to `deadline` (woken as soon as a holder
    /// releases), then answer the busy status. Waiting requests hold a connection (and,
    /// in tower, a slot of the inner service) meanwhile; an unreachable quorum is
    /// retried until the deadline too.
    #[must_use]
    pub fn wait(self, deadline: Duration) -> Self {
        self.retry(RetryPolicy::deadline(deadline))
    }

    /// The full retry policy of the acquisition (see [`RetryPolicy`]);
    /// [`wait`](Self::wait) and [`fail_fast`](Self::fail_fast) are shorthands.
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// How long a request keeps its lock (permit): default [`Hold::UntilBodyEnd`], until
    /// the response body has been sent or dropped; [`Hold::UntilHead`]: until the
    /// response head is ready.
    #[must_use]
    pub fn hold(self, hold: Hold) -> Self {
        Self { hold, ..self }
    }

    /// The longest a request may keep its lock (permit), counted from its acquisition
    /// (default: the client's `max_hold`). It is not extended past that: it expires at
    /// its TTL, and the request is treated as having lost it.
    #[must_use]
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// When no quorum of Redis nodes can be reached (or another backend failure), serve
    /// the request unguarded, logging a warning, instead of answering `503`
    /// (fail-closed, the default). A taken key is still refused.
    #[must_use]
    pub fn fail_open(self, on: bool) -> Self {
        Self {
            fail_open: on,
            ..self
        }
    }

    /// The status answered when the key is taken (default `409 Conflict` for the lock,
    /// `429 Too Many Requests` for the limit). Takes a `u16` or an `http::StatusCode`;
    /// a number that is no HTTP status is answered `500`.
    #[must_use]
    pub fn busy_status(mut self, status: impl Into<u16>) -> Self {
        self.busy_status = status.into();
        self
    }

    /// When the lock (permit) is lost while the request runs (a majority of nodes could
    /// not extend it in time, or `max_hold` ran out), drop the handler's future and
    /// answer `503` ([`RefusalKind::Lost`]); while the body streams, cut the body off
    /// with an error so that the client sees an incomplete response. Off by default: the
    /// loss is logged (and, for a lock, signalled through its `LockHandle`), and the
    /// request carries on.
    #[must_use]
    pub fn abort_on_loss(self, on: bool) -> Self {
        Self {
            abort_on_loss: on,
            ..self
        }
    }

    /// The resource prefix.
    pub fn prefix(&self) -> &str {
        &self.resource_prefix
    }

    /// The status of a busy answer.
    pub fn busy_code(&self) -> u16 {
        self.busy_status
    }

    /// Whether a request is served unguarded when the lock service is unavailable.
    pub fn fails_open(&self) -> bool {
        self.fail_open
    }
}

impl<K: Kind> Guard for GuardOptions<K> {
    fn route(&self, redlock: &Redlock, key: Key, request_id: Option<&str>) -> Route {
        self.route_key(redlock, key, self.kind.suffix(), request_id)
    }

    fn refuse(
        &self,
        resource: &str,
        error: Error,
        request_id: Option<&str>,
        waited: Duration,
    ) -> Option<Refusal> {
        self.refuse_error(K::WHAT, resource, error, request_id, waited)
    }

    fn held_until(&self) -> Hold {
        self.hold
    }

    fn aborts_on_loss(&self) -> bool {
        self.abort_on_loss
    }
}

/// The request decision of [`LockOptions`] and [`LimitOptions`], the part both web
/// crates' middleware drive the same way.
pub trait Guard {
    /// The route of a request whose key extractor decided `key` (the request's id for
    /// the log): pass, refuse, or the resource to take.
    fn route(&self, redlock: &Redlock, key: Key, request_id: Option<&str>) -> Route;

    /// The answer to a failed acquisition of `resource`, logged: `None` serves the
    /// request without it (`fail_open` and a backend failure). `waited`: since the
    /// acquisition began.
    fn refuse(
        &self,
        resource: &str,
        error: Error,
        request_id: Option<&str>,
        waited: Duration,
    ) -> Option<Refusal>;

    /// How long a request keeps what it took.
    fn held_until(&self) -> Hold;

    /// Whether a loss stops the request.
    fn aborts_on_loss(&self) -> bool;
}

impl<K> GuardOptions<K> {
    fn refuse_error(
        &self,
        what: &str,
        resource: &str,
        error: Error,
        request_id: Option<&str>,
        waited: Duration,
    ) -> Option<Refusal> {
        let waited_ms = waited.as_millis() as u64;
        // The body is generic (see `Problem::from_error`); the details go to the log.
        match error.class() {
            ErrorClass::Contended { .. } => {
                tracing::debug!(key = %resource, request_id, waited_ms, error = %error, "{what} busy: request refused");
            }
            ErrorClass::InvalidResource => {
                tracing::debug!(key = %resource, request_id, error = %error, "{what} key refused");
            }
            ErrorClass::InvalidInput => {
                tracing::error!(key = %resource, request_id, error = %error, "{what} refused as misconfigured");
            }
            _ if self.fail_open => {
                tracing::warn!(key = %resource, request_id, waited_ms, error = %error, "lock service unavailable: fail-open, serving the request WITHOUT a {what}");
                return None;
            }
            _ => {
                tracing::warn!(key = %resource, request_id, waited_ms, error = %error, "lock service unavailable: request refused (fail-closed)");
            }
        }
        let mut refusal = Refusal::from_error(error).with_resource(resource);
        if refusal.kind == RefusalKind::Busy {
            refusal.problem.status = self.busy_status;
        }
        Some(refusal)
    }

    /// The route of `key`, logged when refused; `suffix`: what is derived after the key
    /// (a semaphore's slot suffix) under the resource-name bound.
    fn route_key(
        &self,
        redlock: &Redlock,
        key: Key,
        suffix: Option<usize>,
        request_id: Option<&str>,
    ) -> Route {
        match key {
            Key::Pass => Route::Pass,
            Key::Reject(problem) => {
                if problem.status >= 500 {
                    // The server's own mistake: the details go to the log only.
                    tracing::error!(status = problem.status, detail = %problem.detail, request_id, "request refused by the key extractor");
                } else {
                    tracing::debug!(status = problem.status, detail = %problem.detail, request_id, "request refused by the key extractor");
                }
                Route::Refuse(Refusal::from_key_problem(problem))
            }
            Key::Lock(key) => {
                if let Some(suffix) = suffix {
                    let checked = KeyRoom::new(redlock, &self.resource_prefix, suffix)
                        .and_then(|room| room.check("concurrency limit key", key.len()));
                    match checked {
                        Ok(()) => {}
                        Err(error @ KeyBoundError::TooLong { .. }) => {
                            tracing::debug!(%error, request_id, "concurrency limit key too long: request refused");
                            return Route::Refuse(error.into());
                        }
                        Err(error) => {
                            tracing::error!(%error, request_id, "concurrency limit misconfigured: request refused");
                            return Route::Refuse(error.into());
                        }
                    }
                }
                match crate::key::resource_name(&self.resource_prefix, &key) {
                    Ok(resource) => Route::Take(resource),
                    Err(bad) => Route::Refuse(bad.into()),
                }
            }
        }
    }
}

/// The options of the lock middleware (`redlock_tower::LockLayer`,
/// `redlock_actix::LockMiddleware` and the `DistributedLock` extractor's
/// `DistributedLockConfig`): one type, the same defaults in both web crates. See the
/// table in the [crate docs](crate#the-web-crates-contract).
///
/// ```
/// use std::time::Duration;
/// use redlock_http::{Hold, LockOptions};
///
/// let options = LockOptions::new()
///     .resource_prefix("order:")
///     .ttl(Duration::from_secs(5))
///     .wait(Duration::from_secs(2))
///     .hold(Hold::UntilHead)
///     .fencing(true)
///     .busy_status(423u16);
/// assert_eq!(options.prefix(), "order:");
/// assert_eq!(LockOptions::default().prefix(), "");
/// ```
pub type LockOptions = GuardOptions<LockKind>;

impl Default for LockOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl LockOptions {
    /// The defaults: no resource prefix, the client's TTL, `max_hold` and `fencing`,
    /// fail fast, hold until the body ends, fail closed, `409`, no abort on loss.
    pub fn new() -> Self {
        Self::with_kind(409, LockKind { fencing: None })
    }

    /// Take each lock with a fencing token (default: the client's `fencing` setting);
    /// the handler takes it as a `FencingToken` (both web crates), or reads it from the
    /// `LockHandle` in the request.
    #[must_use]
    pub fn fencing(mut self, on: bool) -> Self {
        self.kind.fencing = Some(on);
        self
    }

    /// Takes the lock on `resource` by these options, watched by the client's watchdog
    /// (up to `max_hold`). Dropping the future cancels the acquisition, and whatever it
    /// had set is released.
    pub fn acquire(
        &self,
        redlock: &Redlock,
        resource: String,
    ) -> impl Future<Output = Result<Lock, Error>> + Send + 'static {
        let redlock = redlock.clone();
        let (ttl, retry, fencing, max_hold) =
            (self.ttl, self.retry, self.kind.fencing, self.max_hold);
        async move {
            let started = Instant::now();
            let mut acquire = redlock.lock(resource).retry(retry);
            if let Some(ttl) = ttl {
                acquire = acquire.ttl(ttl);
            }
            if let Some(on) = fencing {
                acquire = acquire.fencing(on);
            }
            let mut lock = acquire.await?;
            match max_hold {
                Some(max_hold) => lock.auto_extend_for(max_hold),
                None => lock.auto_extend(),
            }
            tracing::debug!(
                key = %lock.resource(),
                waited_ms = started.elapsed().as_millis() as u64,
                attempts = lock.attempts(),
                validity_ms = lock.validity().as_millis() as u64,
                "lock acquired"
            );
            Ok(lock)
        }
    }
}

/// The options of the cluster-wide concurrency limit (`redlock_tower::ClusterLimitLayer`,
/// `redlock_actix::ClusterLimitMiddleware`): at most [`limit`](Self::limit) requests per
/// key at once, across the replicas, on a semaphore of that many permits. The same
/// names and meanings as [`LockOptions`] (no fencing: a permit's token is per slot),
/// `429 Too Many Requests` when every permit is taken.
///
/// ```
/// use redlock_http::LimitOptions;
///
/// let options = LimitOptions::new(3).resource_prefix("export:");
/// assert_eq!(options.limit(), 3);
/// ```
pub type LimitOptions = GuardOptions<LimitKind>;

impl LimitOptions {
    /// At most `limit` requests per key at once; the other options' defaults are
    /// [`LockOptions`]'s but `busy_status` (`429`). A limit of `0` is a
    /// misconfiguration: every request with a key is answered `500`.
    pub fn new(limit: u32) -> Self {
        Self::with_kind(429, LimitKind { limit })
    }

    /// The most requests per key at once.
    pub fn limit(&self) -> u32 {
        self.kind.limit
    }

    /// Logs a limit of `0`, or a resource prefix that leaves no room for a key under
    /// `redlock`'s resource-name bound: where the middleware is built, for mistakes
    /// that make every request with a key answered `500`.
    pub fn check(&self, redlock: &Redlock) {
        if self.kind.limit == 0 {
            tracing::error!(
                "concurrency limit of 0: every request with a key will be answered 500"
            );
        }
        if let Err(error) = self.room(redlock) {
            tracing::error!(%error, "concurrency limit misconfigured: every request with a key will be answered 500");
        }
    }

    /// The longest key (after escaping) taken under this prefix and limit: what the
    /// client's resource-name bound leaves once the prefix and the longest slot suffix
    /// (`/permit/<limit - 1>`) are counted. Check it where the middleware is built.
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`] when the prefix leaves none.
    pub fn room(&self, redlock: &Redlock) -> Result<KeyRoom, KeyBoundError> {
        KeyRoom::new(
            redlock,
            &self.resource_prefix,
            permit_suffix_len(self.kind.limit),
        )
    }

    /// Takes a permit of the semaphore `resource`, watched by the client's watchdog (up
    /// to `max_hold`). A limit of `0` fails here (`ZeroPermits`: misconfigured).
    pub fn acquire(
        &self,
        redlock: &Redlock,
        resource: String,
    ) -> impl Future<Output = Result<Permit, Error>> + Send + 'static {
        let redlock = redlock.clone();
        let (ttl, retry, max_hold, limit) = (self.ttl, self.retry, self.max_hold, self.kind.limit);
        async move {
            let started = Instant::now();
            // A permit's fencing token is per slot, not per key: of no use to a handler.
            let semaphore = redlock
                .semaphore(resource, limit)?
                .retry(retry)
                .fencing(false);
            let semaphore = match ttl {
                Some(ttl) => semaphore.ttl(ttl),
                None => semaphore,
            };
            let mut permit = semaphore.acquire().await?;
            match max_hold {
                Some(max_hold) => permit.auto_extend_for(max_hold),
                None => permit.auto_extend(),
            }
            tracing::debug!(key = %permit.lock().resource(), slot = permit.slot(), waited_ms = started.elapsed().as_millis() as u64, "concurrency permit acquired");
            Ok(permit)
        }
    }
}
