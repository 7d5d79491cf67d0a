//! A tower `LockLayer` that serializes requests per key across service replicas.
//!
//! **Not built yet.** This crate will hold `LockLayer` / `LockService` / `ResponseFuture`
//! for any tower `Service` (axum, hyper, tonic): for each request a key extractor names a
//! resource, the layer takes the cluster-wide lock for it through [`redlock_core`], keeps
//! it auto-extended while the response (and by default its body) is produced, and answers
//! `409 Conflict` when busy or `503` when no quorum of Redis nodes is reachable.
//!
//! It never talks to Redis itself: every lock goes through [`redlock_core::Redlock`],
//! re-exported here; the layer will take one:
//!
//! ```
//! let redlock = redlock_tower::Redlock::builder()
//!     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!     .build()?;
//! assert_eq!(redlock.quorum(), 2);
//! # Ok::<(), redlock_core::ConfigError>(())
//! ```

pub use redlock_core::Redlock;
