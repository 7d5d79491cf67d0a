//! An actix-web extractor (and middleware) that holds a cluster-wide distributed lock
//! (Redlock over Redis, through [`redlock_core`]) for a handler's duration.
//!
//! ```no_run
//! use std::time::Duration;
//! use actix_web::{App, HttpResponse, HttpServer, web};
//! use redlock_actix::{DistributedLock, DistributedLockConfig, LockOptions};
//! use redlock_core::Redlock;
//!
//! async fn pay(order: DistributedLock<web::Path<u64>>) -> HttpResponse {
//!     // No other replica is in here for this order until the handler returns.
//!     HttpResponse::Ok().body(format!("paid order {}", *order))
//! }
//!
//! #[actix_web::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let redlock = Redlock::builder()
//!         .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!         .build()?;
//!     let config = DistributedLockConfig::new(redlock)
//!         .options(LockOptions::new().ttl(Duration::from_secs(5)));
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
//! # Feature flags
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `idempotency` | on | `IdempotencyMiddleware`, on `redlock-idempotency` |
//!
//! Supported version: actix-web 4 (with its `actix-rt` 2 runtime).
//!
//! # Where things are
//!
//! The root holds the extractor ([`DistributedLock`], [`LockKey`], [`FencingToken`]),
//! the middleware ([`LockMiddleware`], [`ClusterLimitMiddleware`],
//! `IdempotencyMiddleware`), the configuration and options
//! ([`DistributedLockConfig`], [`LockOptions`], [`LimitOptions`], [`Hold`]) and the
//! refusals ([`Refusal`], [`RefusalKind`]). Each middleware's service is in its module
//! ([`lock`], [`limit`], `idempotency`); [`LockGuard`](guard::LockGuard),
//! [`LockBody`](guard::LockBody) and [`LockLost`](guard::LockLost) in [`guard`]; the
//! error and its answer ([`DistributedLockError`](error::DistributedLockError),
//! [`problem_response`](error::problem_response)) in [`error`]; [`LockHeader`](key::LockHeader)
//! and [`BadKey`](key::BadKey) in [`key`]; the token's future and
//! [`MissingToken`](fencing::MissingToken) in [`fencing`]. The client
//! ([`Redlock`](redlock_core::Redlock), [`LockHandle`](redlock_core::LockHandle)) is
//! `redlock-core`'s.
//!
//! # How it works
//!
//! `pay` above runs only while this replica holds the lock for its order; every other
//! replica (and every other request of this one) gets `409 Conflict` meanwhile, or
//! waits for it ([`LockOptions::wait`](crate::LockOptions::wait)).
//!
//! - [`DistributedLock<T>`] wraps an existing extractor `T` whose value implements
//!   [`LockKey`] (strings, integers, tuples; `web::Path`, `web::Query`, `web::Json`,
//!   `web::Form`, `web::Header`, `web::ReqData` of those; [`LockHeader`](key::LockHeader) for a raw
//!   header; your own types in three lines). It dereferences to `T`; its
//!   [`guard`](DistributedLock::guard) tells whether the lock is still held and when it
//!   is lost. The lock is auto-extended while held and released when the handler
//!   returns, or explicitly with [`release`](DistributedLock::release);
//!   [`into_parts`](DistributedLock::into_parts) moves it into a streaming body
//!   ([`LockGuard::hold_during`](guard::LockGuard::hold_during)).
//! - [`LockMiddleware`] locks a whole scope by a key taken from each request; it takes
//!   its [`DistributedLockConfig`] directly.
//! - [`FencingToken`], an extractor, hands the handler the lock's fencing token (with
//!   [`fencing`](crate::LockOptions::fencing) on), under the middleware or with a
//!   `DistributedLock<T>` in the same handler: pass it with the handler's writes so that
//!   the storage refuses a writer whose lock has expired meanwhile (`redlock-fence`).
//! - `IdempotencyMiddleware` (feature `idempotency`, on by default) runs each request with an `Idempotency-Key` once
//!   across the replicas and replays its stored response to retries (over the engine,
//!   `redlock_idempotency::Idempotency`, the options type `redlock-tower`'s
//!   `IdempotencyLayer` takes too; the guide: `docs/IDEMPOTENCY.md`).
//! - [`ClusterLimitMiddleware`] lets at most `k` requests per key (per tenant, per
//!   route) run at once across every replica, on a cluster-wide semaphore
//!   ([`redlock_core::semaphore::Semaphore`]); a full limit answers `429` with `Retry-After` (the
//!   counterpart of `redlock-tower`'s `ClusterLimitLayer`, over the same
//!   [`LimitOptions`]).
//! - [`LockMiddleware`]'s keys come from a [`KeyExtractor`](extract::KeyExtractor)
//!   ([`extract`]: `Header`, `PathParam`, `PathPrefix`, `Global`, `from_fn`, closures).
//! - [`DistributedLockConfig`] (the [`Redlock`](redlock_core::Redlock) client, the engine's [`LockOptions`]
//!   shared with `redlock-tower`, the refusal hook, the runtime) is what the extractors
//!   find in `app_data`, innermost first: a resource's or scope's configuration
//!   overrides the app's. A route whose extractor finds none answers 500 naming the
//!   type to register; nothing panics.
//! - Refusals ([`Refusal`], [`RefusalKind`]: one vocabulary for the lock, the limit and
//!   idempotency, in both web crates) are answered as `application/problem+json`
//!   by [`redlock_http`] (the same answers as `redlock-tower`): busy → 409 with
//!   `Retry-After` (the holder's remaining TTL), no quorum → 503 with `Retry-After`,
//!   bad key → 400, misconfiguration (a `FencingToken` without a lock, or without
//!   fencing, included) → 500. The inner extractor's own errors (a bad path
//!   segment → 404, a bad query → 400) keep their own responses.
//!
//! # One contract with redlock-tower
//!
//! Keys, answers, option names and defaults, and type names are those of
//! `redlock-tower`, decided in [`redlock_http`] (see [its
//! contract](redlock_http#the-web-crates-contract) for the option table):
//! `Idempotency-Key: a:b` locks `a%3Ab` in both, so an actix service and a tower service
//! on one resource exclude each other. `tests/parity.rs` sends the same requests to both
//! over one set of nodes and compares the keys on the nodes and the answers.
//!
//! # Against real nodes
//!
//! ```
//! use std::time::Duration;
//! use actix_web::{App, HttpResponse, HttpServer, web};
//! use redlock_actix::{DistributedLock, DistributedLockConfig, LockKey, LockOptions, key::BadKey};
//! use redlock_core::Redlock;
//!
//! #[derive(serde::Deserialize)]
//! struct OrderId(u64);
//!
//! impl LockKey for OrderId {
//!     fn lock_key(&self) -> Result<String, BadKey> {
//!         self.0.lock_key()
//!     }
//! }
//!
//! async fn pay(order: DistributedLock<web::Path<OrderId>>) -> HttpResponse {
//!     // ... charge the order exactly once: no other replica is in here for it ...
//!     HttpResponse::Ok().body(format!("paid order {}", order.0))
//! }
//!
//! #[actix_web::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! # let urls = cluster.urls();
//!     // `urls`: three independent Redis masters, e.g. "redis://10.0.0.1:6379".
//!     let redlock = Redlock::builder()
//!         .nodes(urls)
//! #       .restart_quarantine(false) // the test nodes were started a moment ago
//!         .build()?;
//!     // Built once, cloned into every worker's App.
//!     let config = DistributedLockConfig::new(redlock).options(
//!         LockOptions::new()
//!             .ttl(Duration::from_secs(5))
//!             .resource_prefix("order:"),
//!     );
//!     let server = HttpServer::new(move || {
//!         App::new()
//!             .app_data(config.clone())
//!             .route("/orders/{id}/pay", web::post().to(pay))
//!     })
//!     .workers(2)
//!     .bind(("127.0.0.1", 0))?;
//!     let addr = server.addrs()[0];
//!     let server = server.run();
//!     let handle = server.handle();
//!     actix_web::rt::spawn(server);
//!
//!     // A plain HTTP/1.1 request, to keep the example free of a client library.
//!     let reply = post(addr, "/orders/42/pay").await?;
//!     assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
//!     assert!(reply.ends_with("paid order 42"), "{reply}");
//!
//!     handle.stop(true).await;
//!     Ok(())
//! }
//! # async fn post(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
//! #     use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! #     let mut stream = tokio::net::TcpStream::connect(addr).await?;
//! #     stream.write_all(format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").as_bytes()).await?;
//! #     let mut reply = String::new();
//! #     stream.read_to_string(&mut reply).await?;
//! #     Ok(reply)
//! # }
//! ```
//!
//! # Workers and runtimes
//!
//! actix-web runs each worker on a single-threaded tokio runtime of its own, while
//! `redlock-core` runs background tasks (releasing a dropped lock, the auto-extension
//! watchdog, wake-ups for waiters, the node connections) on the runtime where they are
//! first needed. Tasks bound to one worker's runtime would die with it (a server stopped
//! and started again in the same process, a restarted worker): the next lock would meet
//! broken connections (a spurious 503) and watched locks would stop being extended. This
//! crate therefore makes every call into the client on one long-lived runtime: its own
//! thread by default, or yours ([`DistributedLockConfig::runtime`]). Build one
//! [`Redlock`](redlock_core::Redlock) per process, anywhere, and clone the configuration into every worker's
//! `App`.
//!
//! # Observability
//!
//! `tracing` events carry the lock's `key`: `lock acquired` (debug: attempts, wait,
//! validity), `lock busy` (debug: contention, the holder's remaining time), `lock
//! unavailable` (warn: no quorum), `lock released` (debug), and warnings when a lock was
//! lost before its request finished (the client's watchdog also warns at the loss).

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
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
pub mod key;
pub mod limit;
pub mod lock;
mod serve;

pub use config::DistributedLockConfig;
pub use distributed_lock::DistributedLock;
pub use fencing::FencingToken;
#[cfg(feature = "idempotency")]
pub use idempotency::IdempotencyMiddleware;
pub use key::LockKey;
pub use limit::ClusterLimitMiddleware;
pub use lock::LockMiddleware;
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
