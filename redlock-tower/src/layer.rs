//! [`LockLayer`]: the middleware's configuration, applied to a service with
//! [`Layer::layer`] (or axum's `Router::layer` / `route_layer`, tower's
//! `ServiceBuilder::layer`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use redlock_core::{Redlock, RetryPolicy};
use tower_layer::Layer;

use crate::config::{Config, Hold};
use crate::response::{OnRejection, Rejection, RejectionResponse};
use crate::service::LockService;

/// Serializes requests per key across every replica of a service, with a Redlock
/// distributed lock. See the [crate documentation](crate) for the behaviour and an
/// example.
///
/// Built with [`new`](Self::new) from a [`Redlock`] client and a
/// [`KeyExtractor`](crate::extract::KeyExtractor); the other settings have defaults,
/// the same as `redlock-actix`'s (the table of both: [`redlock_http`'s
/// contract](redlock_http#the-web-crates-contract)):
///
/// | setting | default |
/// | --- | --- |
/// | [`resource_prefix`](Self::resource_prefix) | none |
/// | [`ttl`](Self::ttl) | the client's default TTL, auto-extended while the request runs |
/// | [`wait`](Self::wait) / [`retry`](Self::retry) | fail fast: one attempt, `409` when busy |
/// | [`hold`](Self::hold) | [`Hold::UntilBodyEnd`] |
/// | [`max_hold`](Self::max_hold) | the client's `max_hold` |
/// | [`fencing`](Self::fencing) | the client's `fencing` |
/// | [`fail_open`](Self::fail_open) | off: `503` when no quorum is reachable |
/// | [`busy_status`](Self::busy_status) | `409 Conflict` |
/// | [`abort_on_loss`](Self::abort_on_loss) | off: a loss is signalled and logged |
/// | [`on_rejection`](Self::on_rejection) | `application/problem+json` responses |
///
/// Cloning is cheap; every service made by the layer shares the client (its
/// connections and its watchdog) and the settings.
pub struct LockLayer<E> {
    pub(crate) redlock: Redlock,
    pub(crate) extractor: Arc<E>,
    pub(crate) config: Arc<Config>,
}

impl<E> Clone for LockLayer<E> {
    fn clone(&self) -> Self {
        Self {
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            config: Arc::clone(&self.config),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for LockLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("redlock", &self.redlock)
            .field("extractor", &self.extractor)
            .field("config", &self.config)
            .finish()
    }
}

impl<E> LockLayer<E> {
    /// A layer locking, for each request, the key `extractor` names, through `redlock`.
    pub fn new(redlock: Redlock, extractor: E) -> Self {
        let config = Config {
            resource_prefix: String::new(),
            ttl: redlock.default_ttl(),
            retry: RetryPolicy::once(),
            hold: Hold::default(),
            max_hold: None,
            fencing: None,
            fail_open: false,
            busy_status: StatusCode::CONFLICT,
            abort_on_loss: false,
            on_rejection: None,
        };
        Self {
            redlock,
            extractor: Arc::new(extractor),
            config: Arc::new(config),
        }
    }

    fn config(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Put `prefix` in front of every extracted key (e.g. `"pay:"`): the lock's
    /// resource name is `prefix` followed by the key
    /// ([`redlock_http::resource_name`]), so that layers on different routes with the
    /// same kind of key (an order id) do not share locks. Not to be confused with the
    /// client's [`key_prefix`](redlock_core::RedlockBuilder::key_prefix), the Redis key
    /// namespace in front of every resource on the nodes.
    pub fn resource_prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.config(|c| c.resource_prefix = prefix)
    }

    /// The lock's TTL (default: the client's). The lock is extended about every
    /// `ttl / 3` for as long as the request runs, so this is not a limit on the
    /// request's duration ([`max_hold`](Self::max_hold) is): it is how long the key
    /// stays locked after a replica dies mid-request.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.config(|c| c.ttl = ttl)
    }

    /// On a busy key, wait up to `deadline` for it (woken as soon as the holder
    /// releases), then answer `409`. The default is to answer `409` at once.
    ///
    /// Waiting requests hold a connection and a slot of the inner service (tower's
    /// `poll_ready` reservation) meanwhile. An unreachable quorum is retried until the
    /// deadline too.
    pub fn wait(self, deadline: Duration) -> Self {
        self.retry(RetryPolicy::deadline(deadline))
    }

    /// Answer `409` at once when the key is busy (the default).
    pub fn fail_fast(self) -> Self {
        self.retry(RetryPolicy::once())
    }

    /// The full retry policy of lock attempts (see [`RetryPolicy`]); [`wait`](Self::wait)
    /// and [`fail_fast`](Self::fail_fast) are shorthands.
    pub fn retry(self, retry: RetryPolicy) -> Self {
        self.config(|c| c.retry = retry)
    }

    /// How long a request keeps its lock (default: [`Hold::UntilBodyEnd`]).
    pub fn hold(self, hold: Hold) -> Self {
        self.config(|c| c.hold = hold)
    }

    /// The longest a request may keep its lock, counted from its acquisition (default:
    /// the client's [`max_hold`](redlock_core::RedlockBuilder::max_hold)). The lock is
    /// not extended past it: it expires, and the request is treated as having lost it.
    pub fn max_hold(self, max_hold: Duration) -> Self {
        self.config(|c| c.max_hold = Some(max_hold))
    }

    /// Take each lock with a fencing token (default: the client's
    /// [`fencing`](redlock_core::RedlockBuilder::fencing) setting); the handler takes it
    /// as a [`FencingToken`](crate::FencingToken) (an axum extractor), or reads it from
    /// the [`LockHandle`](crate::LockHandle) in the request's extensions.
    pub fn fencing(self, on: bool) -> Self {
        self.config(|c| c.fencing = Some(on))
    }

    /// When no quorum of Redis nodes can be reached (or another backend failure), let
    /// the request through without a lock, logging a warning, instead of answering
    /// `503` (fail-closed, the default). Only for work where running unserialized is
    /// better than not running. A busy key is still refused. A handler taking a
    /// [`FencingToken`](crate::FencingToken) is not called for a request let through
    /// unlocked: it is answered `503`.
    pub fn fail_open(self, on: bool) -> Self {
        self.config(|c| c.fail_open = on)
    }

    /// The status answered when the key is busy (default `409 Conflict`; `423 Locked`
    /// or `429 Too Many Requests` are other common choices).
    pub fn busy_status(self, status: StatusCode) -> Self {
        self.config(|c| c.busy_status = status)
    }

    /// When the lock is lost while the request runs (a majority of Redis nodes could
    /// not extend it in time), drop the inner service's future (cancelling the handler
    /// at its current `.await`) and answer `503`; while the body streams, end the body
    /// with a [`LockLost`](crate::LockLost) error so that the client sees an
    /// incomplete response.
    ///
    /// Off by default: the loss is logged and signalled through the
    /// [`LockHandle`](crate::LockHandle) in the request's extensions
    /// ([`lost()`](crate::LockHandle::lost), `is_held()`, a cancellation token), and the
    /// handler decides.
    pub fn abort_on_loss(self, on: bool) -> Self {
        self.config(|c| c.abort_on_loss = on)
    }

    /// Build rejection responses yourself (default:
    /// [`Rejection::to_response`], an `application/problem+json` document). A gRPC
    /// service (tonic) wants this: its clients expect `200` with a `grpc-status`
    /// header (e.g. `10`, aborted, for [`RejectionKind::Busy`](crate::response::RejectionKind::Busy)),
    /// not an HTTP error status.
    ///
    /// ```
    /// use http::Response;
    /// use redlock_tower::{LockLayer, extract::Global, response::RejectionKind};
    ///
    /// # fn layer(redlock: redlock_tower::Redlock) -> LockLayer<Global> {
    /// let layer = LockLayer::new(redlock, Global::new("import")).on_rejection(|rejection| {
    ///     match rejection.kind {
    ///         RejectionKind::Busy => Response::builder()
    ///             .status(rejection.status())
    ///             .body("an import is already running\n".into())
    ///             .unwrap_or_else(|_| rejection.to_response()),
    ///         _ => rejection.to_response(),
    ///     }
    /// });
    /// # layer
    /// # }
    /// ```
    pub fn on_rejection<F>(self, hook: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> RejectionResponse + Send + Sync + 'static,
    {
        let hook: OnRejection = Arc::new(hook);
        self.config(|c| c.on_rejection = Some(hook))
    }

    /// The lock client.
    pub fn redlock(&self) -> &Redlock {
        &self.redlock
    }

    /// The key extractor.
    pub fn extractor(&self) -> &E {
        &self.extractor
    }
}

impl<S, E> Layer<S> for LockLayer<E> {
    type Service = LockService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService {
            inner,
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            config: Arc::clone(&self.config),
        }
    }
}
