//! Idempotent requests: a request carrying an `Idempotency-Key` runs once across every
//! replica of the service, and its retries get the first run's response, replayed byte
//! for byte (marked `Idempotent-Replayed: true`).
//!
//! The semantics, the guarantees and the [flow](redlock_idempotency::middleware) of a
//! request are [`redlock_idempotency`]'s (the guide: `docs/IDEMPOTENCY.md`); this module
//! is its tower middleware, over the engine's [`Idempotency`]. The handler finds its run's
//! [`LockHandle`](redlock_core::LockHandle) in the request's extensions, and its
//! [`FencingToken`](crate::FencingToken) works as under a [`LockLayer`](crate::LockLayer).

mod body;
mod service;

pub use body::IdempotentBody;
pub use redlock_idempotency::{Idempotency, REPLAYED_HEADER, Refusal, RefusalKind};
pub use service::{IdempotencyLayer, IdempotencyService, ResponseFuture};
