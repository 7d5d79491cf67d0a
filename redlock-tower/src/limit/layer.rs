//! [`ClusterLimitLayer`]: the concurrency limit's configuration.

use std::fmt;
use std::sync::Arc;

use redlock_core::Redlock;
use redlock_http::{LimitOptions, Refusal};
use tower_layer::Layer;

use super::ClusterLimitService;
use crate::config::{Config, Options};
use crate::response::RefusalResponse;

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

impl<E> Clone for ClusterLimitLayer<E> {
    fn clone(&self) -> Self {
        Self {
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            config: Arc::clone(&self.config),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for ClusterLimitLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterLimitLayer")
            .field("redlock", &self.redlock)
            .field("extractor", &self.extractor)
            .field("config", &self.config)
            .finish()
    }
}

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

    /// Build refusal responses yourself (default: an `application/problem+json`
    /// document); a full limit is [`RefusalKind::Busy`](crate::RefusalKind::Busy), with
    /// the busy status; a permit lost with `abort_on_loss` is
    /// [`RefusalKind::Lost`](crate::RefusalKind::Lost). The hook is called once per
    /// refused request. As [`LockLayer::on_refusal`](crate::LockLayer::on_refusal).
    #[must_use]
    pub fn on_refusal<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Refusal) -> RefusalResponse + Send + Sync + 'static,
    {
        crate::config::with_hook(&mut self.config, hook);
        self
    }

    /// The longest key (after escaping) taken under the options' prefix and limit
    /// ([`LimitOptions::room`]): check it where the layer is built.
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`](redlock_http::KeyBoundError::NoRoom) when the prefix
    /// leaves none.
    pub fn room(&self) -> Result<redlock_http::KeyRoom, redlock_http::KeyBoundError> {
        self.config.room(&self.redlock)
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
