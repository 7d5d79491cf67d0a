//! An actix-web extractor (and middleware) that holds a distributed lock for a handler.
//!
//! **Not built yet.** This crate will hold `DistributedLock<T>`, an extractor wrapping an
//! existing one (`web::Path<OrderId>`, a header, a query) whose value names the resource;
//! the handler body runs only while this replica holds the cluster-wide lock, taken
//! through [`redlock_core`]. Busy answers `409`, no quorum `503`, both as
//! `application/problem+json`.
//!
//! It never talks to Redis itself: every lock goes through [`redlock_core::Redlock`],
//! re-exported here; the extractor will take one:
//!
//! ```
//! let redlock = redlock_actix::Redlock::builder()
//!     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!     .build()?;
//! assert_eq!(redlock.quorum(), 2);
//! # Ok::<(), redlock_core::ConfigError>(())
//! ```

pub use redlock_core::Redlock;
