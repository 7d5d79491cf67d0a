//! The lock: [`LockMiddleware`] and its [`LockMiddlewareService`], taking the engine's
//! [`LockOptions`](redlock_http::LockOptions): a [`GuardMiddleware`] making a
//! [`GuardService`], which the concurrency limit ([`crate::limit`]) shares. See the
//! [guide](crate::_guide).

pub use crate::middleware::{GuardMiddleware, GuardService, LockMiddleware, LockMiddlewareService};
