//! [`ClusterLimitLayer`]: the concurrency limit's configuration.

use std::sync::Arc;

use redlock_core::Redlock;
use redlock_http::LimitOptions;
use tower_layer::Layer;

use super::ClusterLimitService;
use crate::config::{Config, Options};

/// At most `limit` concurrent requests per key, across every replica of a service. See
/// the [module documentation](crate::limit) for the behaviour and an example.
///
/// Built with [`new`](Self::new) from a [`Redlock`] client, a
/// [`KeyExtractor`](crate::extract::KeyExtractor) and the engine's [`LimitOptions`]
/// (the limit, and the options named and defaulted as the lock's, `429` when every
/// permit is taken; the same type as `redlock-actix`'s `ClusterLimitMiddleware`
/// takes). [`on_refusal`](Self::on_refusal) renders refusals yourself.
///
/// Cloning is cheap; every service made by the layer shares the client and the
/// settings.
pub struct ClusterLimitLayer<E> {
    pub(crate) redlock: Redlock,
    pub(crate) extractor: Arc<E>,
    pub(crate) config: Arc<Config>,
}

guarded_layer!(ClusterLimitLayer);

impl<E> ClusterLimitLayer<E> {
    /// A layer letting at most [`options.limit()`](LimitOptions::limit) requests with
    /// the same key (the one `extractor` names) run at once, cluster-wide, through
    /// `redlock`.
    ///
    /// A limit of `0`, or a resource prefix that leaves no room for a key under the
    /// client's resource-name bound, is not refused here: it is logged, and every
    /// request with a key is answered `500` (an `application/problem+json` document
    /// that says nothing of the server's insides). Requests the extractor lets through
    /// without a key are served as usual.
    pub fn new(redlock: Redlock, extractor: E, options: LimitOptions) -> Self {
        options.check(&redlock);
        Self {
            redlock,
            extractor: Arc::new(extractor),
            config: Arc::new(Config::new(Options::Limit(options))),
        }
    }

    /// The longest key (after escaping) taken under the options' prefix and limit
    /// ([`LimitOptions::room`]): check it where the layer is built.
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`](redlock_http::key::KeyBoundError::NoRoom) when the prefix
    /// leaves none.
    pub fn room(&self) -> Result<redlock_http::key::KeyRoom, redlock_http::key::KeyBoundError> {
        self.config.room(&self.redlock)
    }
}

impl<S, E> Layer<S> for ClusterLimitLayer<E> {
    type Service = ClusterLimitService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        ClusterLimitService {
            inner,
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            config: Arc::clone(&self.config),
        }
    }
}
