//! The lock: [`LockLayer`], its [`LockService`] and [`ResponseFuture`], taking the
//! engine's [`LockOptions`]: the [`GuardLayer`] and [`GuardService`] that the
//! concurrency limit ([`crate::limit`]) shares. See the [guide](crate::_guide).

use redlock_core::Redlock;
use redlock_http::LockOptions;

use crate::middleware::Options;
pub use crate::middleware::{GuardLayer, GuardService, ResponseFuture};

/// Serializes requests per key across every replica of a service, with a Redlock
/// distributed lock: one key per request, named by a
/// [`KeyExtractor`](crate::extract::KeyExtractor); busy: `409` at once by default.
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
pub type LockLayer<E> = GuardLayer<LockOptions, E>;

/// The service made by a [`LockLayer`]: the request runs while holding its key's lock,
/// released when the response (by default its body) is done.
pub type LockService<S, E> = GuardService<LockOptions, S, E>;

impl<E> LockLayer<E> {
    /// A layer locking, for each request, the key `extractor` names, through `redlock`,
    /// with the default [`LockOptions`].
    pub fn new(redlock: Redlock, extractor: E) -> Self {
        Self::with_options(redlock, extractor, Options::Lock(LockOptions::new()))
    }

    /// Takes its locks by `options` (see [`LockOptions`] for each and its default).
    #[must_use]
    pub fn options(self, options: LockOptions) -> Self {
        self.set_options(Options::Lock(options))
    }
}

impl<S, E> LockService<S, E> {
    /// A layer making this service (the same as [`LockLayer::new`]).
    pub fn layer(redlock: Redlock, extractor: E) -> LockLayer<E> {
        LockLayer::new(redlock, extractor)
    }
}
