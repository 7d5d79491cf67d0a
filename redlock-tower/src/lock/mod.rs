//! The lock: [`LockLayer`] (its options are the engine's
//! [`LockOptions`](crate::LockOptions)), [`LockService`] and [`ResponseFuture`]. The
//! request decision is `redlock-http`'s; this module reads the request, builds the
//! response and wraps the body. See the [crate docs](crate) for the behaviour.

pub(crate) mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::LockLayer;
pub use service::LockService;
