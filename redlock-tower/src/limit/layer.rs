//! [`ConcurrencyLimitLayer`]: the concurrency limit's configuration.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use redlock_core::{Redlock, RetryPolicy};
use tower_layer::Layer;

use super::ConcurrencyLimitService;
use crate::config::{Config, Hold};
use crate::response::{OnRejection, Rejection, RejectionResponse};

/// At most `limit` concurrent requests per key, across every replica of a service. See
/// the [module documentation](crate::limit) for the behaviour and an example.
///
/// Built with [`new`](Self::new) from a [`Redlock`] client, a
/// [`KeyExtractor`](crate::extract::KeyExtractor) and the limit; the other settings
/// have defaults, named as [`LockLayer`](crate::LockLayer)'s, and the same names and
/// defaults as `redlock-actix`'s `ConcurrencyLimit` (which has `runtime` too, for
/// actix's per-worker runtimes):
///
/// | setting | default |
/// | --- | --- |
/// | [`resource_prefix`](Self::resource_prefix) | none |
/// | [`ttl`](Self::ttl) | the client's default TTL, auto-extended while the request runs |
/// | [`wait`](Self::wait) / [`retry`](Self::retry) | fail fast: one attempt per permit, `429` when all are taken |
/// | [`hold`](Self::hold) | [`Hold::UntilBodyEnd`] |
/// | [`max_hold`](Self::max_hold) | the client's `max_hold` |
/// | [`fail_open`](Self::fail_open) | off: `503` when no quorum is reachable |
/// | [`busy_status`](Self::busy_status) | `429 Too Many Requests` |
/// | [`abort_on_loss`](Self::abort_on_loss) | off: a lost permit is logged, the request carries on |
/// | [`on_rejection`](Self::on_rejection) | `application/problem+json` responses |
///
/// Cloning is cheap; every service made by the layer shares the client and the
/// settings.
pub struct ConcurrencyLimitLayer<E> {
    pub(crate) redlock: Redlock,
    pub(crate) extractor: Arc<E>,
    pub(crate) limit: u32,
    pub(crate) config: Arc<Config>,
}

impl<E> Clone for ConcurrencyLimitLayer<E> {
    fn clone(&self) -> Self {
        Self {
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            limit: self.limit,
            config: Arc::clone(&self.config),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for ConcurrencyLimitLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("redlock", &self.redlock)
            .field("extractor", &self.extractor)
            .field("limit", &self.limit)
            .field("config", &self.config)
            .finish()
    }
}

impl<E> ConcurrencyLimitLayer<E> {
    /// A layer letting at most `limit` requests with the same key (the one `extractor`
    /// names) run at once, cluster-wide, through `redlock`.
    ///
    /// A `limit` of `0` is not refused here: it is a misconfiguration reported at
    /// request time, where every request with a key is answered `500` (an
    /// `application/problem+json` document that says nothing of the server's insides)
    /// and the log names the error. Requests the extractor lets through without a key
    /// are served as usual.
    pub fn new(redlock: Redlock, extractor: E, limit: u32) -> Self {
        if limit == 0 {
            tracing::error!(
                "concurrency limit of 0: every request with a key will be answered 500"
            );
        }
        let config = Config {
            resource_prefix: String::new(),
            ttl: redlock.default_ttl(),
            retry: RetryPolicy::once(),
            hold: Hold::default(),
            max_hold: None,
            // A permit's fencing token is per slot, not per key: of no use to a handler.
            fencing: Some(false),
            fail_open: false,
            busy_status: StatusCode::TOO_MANY_REQUESTS,
            abort_on_loss: false,
            on_rejection: None,
        };
        Self {
            redlock,
            extractor: Arc::new(extractor),
            limit,
            config: Arc::new(config),
        }
    }

    fn config(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Put `prefix` in front of every extracted key (e.g. `"export:"`): the
    /// semaphore's name is `prefix` followed by the key
    /// ([`redlock_http::resource_name`]), and its permits are the resources
    /// `<name>/permit/<i>`. Give each limited route its own prefix, and do not lock those
    /// resources with a [`LockLayer`](crate::LockLayer).
    ///
    /// The prefix, a key and the longest slot suffix (`/permit/<limit - 1>`) must fit
    /// the client's resource-name bound ([`Redlock::max_resource_len`](redlock_core::Redlock::max_resource_len), 512 bytes by default): a key
    /// longer than the room left ([`room`](Self::room)) is refused with `400`, naming
    /// the bound. A prefix that leaves no room is logged here and every request with a
    /// key is answered `500`; [`room`](Self::room) says so as a typed error.
    pub fn resource_prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        let layer = self.config(|c| c.resource_prefix = prefix);
        if let Err(error) = layer.room() {
            tracing::error!(%error, "concurrency limit misconfigured: every request with a key will be answered 500");
        }
        layer
    }

    /// The longest key (after escaping) taken under this prefix and limit: what the
    /// resource-name bound leaves once the prefix and the longest slot suffix
    /// (`/permit/<limit - 1>`) are counted. Check it where the layer is built.
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`](redlock_http::KeyBoundError::NoRoom) when the prefix
    /// leaves none.
    pub fn room(&self) -> Result<redlock_http::KeyRoom, redlock_http::KeyBoundError> {
        redlock_http::KeyRoom::new(
            &self.redlock,
            &self.config.resource_prefix,
            redlock_http::permit_suffix_len(self.limit),
        )
    }

    /// The permits' TTL (default: the client's). A permit is extended about every
    /// `ttl / 3` while the request runs, so this is how long a permit stays taken after
    /// a replica dies mid-request, not a limit on the request's duration.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.config(|c| c.ttl = ttl)
    }

    /// When every permit is taken, wait up to `deadline` for one (woken when a holder
    /// releases), then answer `429`. The default is to answer `429` at once.
    ///
    /// Waiting requests hold a connection and a slot of the inner service meanwhile.
    pub fn wait(self, deadline: Duration) -> Self {
        self.retry(RetryPolicy::deadline(deadline))
    }

    /// Answer `429` at once when every permit is taken (the default).
    pub fn fail_fast(self) -> Self {
        self.retry(RetryPolicy::once())
    }

    /// The full retry policy of a request waiting for a permit (see [`RetryPolicy`]);
    /// [`wait`](Self::wait) and [`fail_fast`](Self::fail_fast) are shorthands.
    pub fn retry(self, retry: RetryPolicy) -> Self {
        self.config(|c| c.retry = retry)
    }

    /// How long a request keeps its permit (default: [`Hold::UntilBodyEnd`], until its
    /// response body has been sent or dropped; [`Hold::UntilHead`] gives it back once
    /// the response head is ready).
    pub fn hold(self, hold: Hold) -> Self {
        self.config(|c| c.hold = hold)
    }

    /// The longest a request may keep its permit, counted from its acquisition
    /// (default: the client's [`max_hold`](redlock_core::RedlockBuilder::max_hold)).
    /// The permit is not extended past it: it expires at its TTL, another request may
    /// take it, and the request is treated as having lost it (see
    /// [`abort_on_loss`](Self::abort_on_loss)).
    pub fn max_hold(self, max_hold: Duration) -> Self {
        self.config(|c| c.max_hold = Some(max_hold))
    }

    /// When no quorum of Redis nodes can be reached (or another backend failure), let
    /// the request through without a permit, logging a warning, instead of answering
    /// `503` (fail-closed, the default). A full limit is still refused.
    pub fn fail_open(self, on: bool) -> Self {
        self.config(|c| c.fail_open = on)
    }

    /// The status answered when every permit is taken (default
    /// `429 Too Many Requests`; `503 Service Unavailable` is another choice).
    pub fn busy_status(self, status: StatusCode) -> Self {
        self.config(|c| c.busy_status = status)
    }

    /// When the permit is lost while the request runs (a majority of Redis nodes could
    /// not extend it in time, or [`max_hold`](Self::max_hold) ran out), drop the inner
    /// service's future (cancelling the handler at its current `.await`) and answer
    /// `503` ([`RejectionKind::Lost`](crate::response::RejectionKind::Lost), through
    /// [`on_rejection`](Self::on_rejection) if set); while the body streams, end the
    /// body with a [`LockLost`](crate::LockLost) error so that the client sees an
    /// incomplete response. As [`LockLayer::abort_on_loss`](crate::LockLayer::abort_on_loss).
    ///
    /// Off by default, as the lock's: the loss is logged and the request carries on,
    /// beyond the limit (another request may take the permit meanwhile). The handler
    /// finds no handle of a permit to watch: turn this on where running past the limit
    /// is worse than not finishing.
    pub fn abort_on_loss(self, on: bool) -> Self {
        self.config(|c| c.abort_on_loss = on)
    }

    /// Build rejection responses yourself (default: [`Rejection::to_response`], an
    /// `application/problem+json` document); a full limit is
    /// [`RejectionKind::Busy`](crate::response::RejectionKind::Busy), with the busy
    /// status; a permit lost with [`abort_on_loss`](Self::abort_on_loss) is
    /// [`RejectionKind::Lost`](crate::response::RejectionKind::Lost). The hook is
    /// called once per rejected request. As
    /// [`LockLayer::on_rejection`](crate::LockLayer::on_rejection).
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

    /// The most requests per key at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }
}

impl<S, E> Layer<S> for ConcurrencyLimitLayer<E> {
    type Service = ConcurrencyLimitService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimitService {
            inner,
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            limit: self.limit,
            config: Arc::clone(&self.config),
        }
    }
}
