//! The lock middleware: [`LockMiddleware`] (it takes a
//! [`DistributedLockConfig`](crate::DistributedLockConfig): the engine's
//! [`LockOptions`](crate::LockOptions)) and [`LockMiddlewareService`]. The request
//! decision is `redlock-http`'s; this module reads the request, builds the response and
//! wraps the body.

mod middleware;
mod service;

pub use middleware::LockMiddleware;
pub use service::LockMiddlewareService;
