//! A cluster-wide concurrency limit: [`ClusterLimitLayer`], its [`ClusterLimitService`]
//! and [`ResponseFuture`] (the lock's [`GuardLayer`](crate::lock::GuardLayer) and
//! [`GuardService`](crate::lock::GuardService), with the engine's
//! [`LimitOptions`](redlock_http::LimitOptions)). At most `k` requests per key (per tenant, per route) run
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

pub use crate::middleware::{ClusterLimitLayer, ClusterLimitService, ResponseFuture};
