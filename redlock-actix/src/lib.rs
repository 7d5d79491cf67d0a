//! An actix-web extractor ([`DistributedLock`]) and middleware ([`LockMiddleware`],
//! [`ClusterLimitMiddleware`], `IdempotencyMiddleware`) that hold a cluster-wide
//! Redlock (through [`redlock_core`]) while a handler runs; the guide is [`_guide`].
//!
//! ```no_run
//! use actix_web::{App, HttpResponse, HttpServer, web};
//! use redlock_actix::{DistributedLock, DistributedLockConfig};
//! use redlock_core::Redlock;
//!
//! async fn pay(order: DistributedLock<web::Path<u64>>) -> HttpResponse {
//!     // No other replica is in here for this order until the handler returns.
//!     HttpResponse::Ok().body(format!("paid order {}", *order))
//! }
//!
//! #[actix_web::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let redlock = Redlock::builder().nodes(["redis://10.0.0.1:6379"]).build()?;
//!     let config = DistributedLockConfig::new(redlock);
//!     HttpServer::new(move || {
//!         App::new().app_data(config.clone()).route("/orders/{id}/pay", web::post().to(pay))
//!     })
//!     .bind(("0.0.0.0", 8080))?
//!     .run()
//!     .await?;
//!     Ok(())
//! }
//! ```
//!
//! The request decision, the options ([`LockOptions`], [`LimitOptions`]), the keys and
//! the answers ([`Refusal`], [`RefusalKind`]) are [`redlock_http`]'s, shared with
//! `redlock-tower` ([its contract](redlock_http#the-web-crates-contract)); this crate
//! reads actix requests, builds responses and wraps bodies. Feature `idempotency` (on by
//! default): `IdempotencyMiddleware` ([`_idempotency`]).

#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod config;
mod distributed_lock;
pub mod error;
pub mod extract;
pub mod fencing;
pub mod guard;
mod hold;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
pub mod key;
pub mod limit;
pub mod lock;
mod middleware;
mod serve;

pub use self::{
    config::DistributedLockConfig, distributed_lock::DistributedLock, fencing::FencingToken,
    key::LockKey, limit::ClusterLimitMiddleware, lock::LockMiddleware,
};
#[cfg(feature = "idempotency")]
pub use idempotency::IdempotencyMiddleware;
pub use redlock_http::{Hold, LimitOptions, LockOptions, Refusal, RefusalKind};

#[doc = include_str!("../guides/ACTIX.md")]
pub mod _guide {}
#[doc = include_str!("../guides/IDEMPOTENCY.md")]
pub mod _idempotency {}

// The README's examples, compiled (and run unless `no_run`) as doctests so that they
// stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
