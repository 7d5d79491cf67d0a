//! [`LockLayer`]: the middleware's configuration, applied to a service with
//! [`Layer::layer`] (or axum's `Router::layer` / `route_layer`, tower's
//! `ServiceBuilder::layer`).

use std::sync::Arc;

use redlock_core::Redlock;
use redlock_http::LockOptions;
use tower_layer::Layer;

use crate::config::{Config, Options};
use crate::lock::LockService;

/// Serializes requests per key across every replica of a service, with a Redlock
/// distributed lock. See the [crate documentation](crate) for the behaviour and an
/// example.
///
/// Built with [`new`](Self::new) from a [`Redlock`] client and a
/// [`KeyExtractor`](crate::extract::KeyExtractor); its options are the engine's
/// [`LockOptions`] ([`options`](Self::options); the table of both web crates:
/// [`redlock_http`'s contract](redlock_http#the-web-crates-contract)), and
/// [`on_refusal`](Self::on_refusal) renders refusals yourself.
///
/// ```
/// use std::time::Duration;
/// use redlock_core::Redlock;
/// use redlock_tower::{LockLayer, LockOptions, extract::Header};
///
/// # fn layer(redlock: Redlock) -> LockLayer<Header> {
/// LockLayer::new(redlock, Header::new("x-tenant").required()).options(
///     LockOptions::new()
///         .resource_prefix("tenant:")
///         .ttl(Duration::from_secs(5))
///         .wait(Duration::from_secs(1)),
/// )
/// # }
/// ```
///
/// Cloning is cheap; every service made by the layer shares the client (its
/// connections and its watchdog) and the settings.
pub struct LockLayer<E> {
    pub(crate) redlock: Redlock,
    pub(crate) extractor: Arc<E>,
    pub(crate) config: Arc<Config>,
}

guarded_layer!(LockLayer);

impl<E> LockLayer<E> {
    /// A layer locking, for each request, the key `extractor` names, through `redlock`,
    /// with the default [`LockOptions`].
    pub fn new(redlock: Redlock, extractor: E) -> Self {
        Self {
            redlock,
            extractor: Arc::new(extractor),
            config: Arc::new(Config::new(Options::Lock(LockOptions::new()))),
        }
    }

    /// Takes its locks by `options` (resource prefix, TTL, wait policy, hold, fencing,
    /// fail-open, busy status, abort on loss).
    #[must_use]
    pub fn options(mut self, options: LockOptions) -> Self {
        Arc::make_mut(&mut self.config).options = Options::Lock(options);
        self
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
