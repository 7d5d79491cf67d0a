//! A cluster-wide concurrency limit: [`ClusterLimitLayer`], its [`ClusterLimitService`]
//! and [`ResponseFuture`] (the lock's [`GuardLayer`] and [`GuardService`], with the
//! engine's [`LimitOptions`]). At most `k` requests per key (per tenant, per route) run
//! at once across the replicas, each holding a permit of the key's semaphore
//! ([`redlock_core::semaphore`]) as a [`LockLayer`](crate::LockLayer) holds its lock;
//! past the limit: `429` with `Retry-After`. See the
//! [guide](crate::_guide#concurrency-limits).
//!
//! ```
//! use axum::{Router, routing::post};
//! use redlock_core::Redlock;
//! use redlock_tower::{ClusterLimitLayer, LimitOptions, extract::PathParam};
//!
//! async fn export() -> &'static str {
//!     "exported" // at most 3 exports of this tenant run at once, cluster-wide
//! }
//!
//! let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build()?;
//! let per_tenant = ClusterLimitLayer::new(
//!     redlock,
//!     PathParam::new("tenant"),
//!     LimitOptions::new(3).resource_prefix("export:"),
//! );
//! let app: Router = Router::new().route("/export/{tenant}", post(export).route_layer(per_tenant));
//! # Ok::<(), redlock_core::BoxError>(())
//! ```
//!
//! The handler finds no [`LockHandle`](redlock_core::LockHandle) from this layer (a
//! permit is no lock on the key), and permits carry no fencing token.

use redlock_core::Redlock;
use redlock_http::LimitOptions;
use redlock_http::key::{KeyBoundError, KeyRoom};

pub use crate::middleware::ResponseFuture;
use crate::middleware::{GuardLayer, GuardService, Options};

/// At most [`limit`](LimitOptions::limit) concurrent requests per key, across every
/// replica of a service. See the [module documentation](self).
pub type ClusterLimitLayer<E> = GuardLayer<LimitOptions, E>;

/// The service made by a [`ClusterLimitLayer`]: the request runs while holding a
/// permit of its key's semaphore, released when the response (by default its body) is
/// done.
pub type ClusterLimitService<S, E> = GuardService<LimitOptions, S, E>;

impl<E> ClusterLimitLayer<E> {
    /// A layer letting at most `options.limit()` requests with the key `extractor`
    /// names run at once, cluster-wide, through `redlock`. A limit of `0`, or a prefix
    /// that leaves no room for a key, is logged here ([`LimitOptions::check`]) and
    /// answers `500` to every request with a key.
    pub fn new(redlock: Redlock, extractor: E, options: LimitOptions) -> Self {
        options.check(&redlock);
        Self::with_options(redlock, extractor, Options::Limit(options))
    }

    /// The longest key (after escaping) taken under the options' prefix and limit
    /// ([`LimitOptions::room`]).
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`] when the prefix leaves none.
    pub fn room(&self) -> Result<KeyRoom, KeyBoundError> {
        self.key_room()
    }
}

impl<S, E> ClusterLimitService<S, E> {
    /// A layer making this service (the same as [`ClusterLimitLayer::new`]).
    pub fn layer(redlock: Redlock, extractor: E, options: LimitOptions) -> ClusterLimitLayer<E> {
        ClusterLimitLayer::new(redlock, extractor, options)
    }
}
