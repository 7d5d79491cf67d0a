//! The cluster-wide concurrency limit: [`ClusterLimitMiddleware`] and its
//! [`ClusterLimitService`], taking the engine's
//! [`LimitOptions`](redlock_http::LimitOptions): the lock's
//! [`GuardMiddleware`](crate::lock::GuardMiddleware) with other options. See the
//! [guide](crate::_guide).

pub use crate::middleware::{ClusterLimitMiddleware, ClusterLimitService};
