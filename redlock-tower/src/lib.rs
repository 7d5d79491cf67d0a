//! A tower middleware (axum, hyper, tonic) that serializes HTTP requests per key across
//! every replica of a service with a Redlock distributed lock ([`redlock_core`]), limits
//! their concurrency per key cluster-wide, and runs idempotent requests once. The
//! decisions are [`redlock_http`]'s engine, shared with `redlock-actix`; this crate
//! reads the request, builds the response and wraps the body. The [guide](_guide)
//! describes the behaviour, the answers and the options.
//!
//! ```
//! use axum::{Router, routing::post};
//! use redlock_core::Redlock;
//! use redlock_tower::{LockLayer, LockOptions, extract::PathParam};
//!
//! async fn pay() -> &'static str {
//!     "paid" // no other replica is charging this order meanwhile
//! }
//!
//! let redlock = Redlock::builder()
//!     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!     .build()?; // checks the options; contacts no node
//! // One payment per order at a time, cluster-wide; busy: 409 Conflict at once.
//! let per_order = LockLayer::new(redlock, PathParam::new("id"))
//!     .options(LockOptions::new().resource_prefix("order:"));
//! let app: Router = Router::new().route("/orders/{id}/pay", post(pay).route_layer(per_order));
//! # Ok::<(), redlock_core::BoxError>(())
//! ```
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `axum` | off | `extract::PathParam` (the key from an axum 0.8 route's path parameter); [`FencingToken`] as an axum extractor |
//! | `idempotency` | on | `IdempotencyLayer` (module `idempotency`), on `redlock-idempotency` |
//!
//! The root holds the layers ([`LockLayer`], [`ClusterLimitLayer`], `IdempotencyLayer`),
//! their options, the refusals, [`FencingToken`] and [`LockBody`]. Each middleware's
//! service and future are in its module ([`lock`], [`limit`], `idempotency`); the key
//! extractors in [`extract`], the refusal responses in [`response`].

#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

pub mod body;
pub mod extract;
pub mod fencing;
mod guard;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
pub mod limit;
pub mod lock;
mod middleware;
pub mod response;
mod target;

pub use self::{body::LockBody, fencing::FencingToken, limit::ClusterLimitLayer, lock::LockLayer};
#[cfg(feature = "idempotency")]
pub use idempotency::IdempotencyLayer;
pub use redlock_http::{Hold, LimitOptions, LockOptions, Refusal, RefusalKind};

#[doc = include_str!("../guides/TOWER.md")]
pub mod _guide {}

// The README's examples, compiled (and run unless `no_run`) as doctests so that they
// stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
