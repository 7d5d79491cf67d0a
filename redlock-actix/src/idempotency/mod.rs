//! Idempotent requests: [`IdempotencyMiddleware`] (it takes the engine,
//! `redlock_idempotency::Idempotency`) and [`IdempotencyService`].

mod middleware;
mod service;

pub use middleware::IdempotencyMiddleware;
pub use service::IdempotencyService;
