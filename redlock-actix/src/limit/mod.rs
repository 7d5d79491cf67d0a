//! The cluster-wide concurrency limit: [`ClusterLimitMiddleware`] (it takes the
//! engine's [`LimitOptions`](crate::LimitOptions)) and [`ClusterLimitService`].

mod middleware;
mod service;

pub use middleware::ClusterLimitMiddleware;
pub use service::ClusterLimitService;
