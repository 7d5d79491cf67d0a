//! The lock: [`LockLayer`], its [`LockService`] and [`ResponseFuture`], taking the
//! engine's [`LockOptions`](redlock_http::LockOptions): the [`GuardLayer`] and
//! [`GuardService`] that the concurrency limit ([`crate::limit`]) shares. See the
//! [guide](crate::_guide).

pub use crate::middleware::{GuardLayer, GuardService, LockLayer, LockService, ResponseFuture};
