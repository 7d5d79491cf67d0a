//! A tower middleware that serializes HTTP requests per key across every replica of a
//! service, with a Redlock distributed lock ([`redlock_core`]).
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
//! // axum::serve(listener, app).await?;
//! # Ok::<(), redlock_core::BoxError>(())
//! ```
//!
//! `PathParam` needs the `axum` feature; without it, any tower service works the same
//! way (see [the example below](#any-tower-service-against-real-nodes)).
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `axum` | off | `extract::PathParam`: the key from an axum path parameter (`/orders/{id}/pay`); [`FencingToken`] as an axum extractor |
//! | `idempotency` | on | `IdempotencyLayer` (module `idempotency`), on `redlock-idempotency` (its stores are behind that crate's own features) |
//!
//! Supported versions: tower 0.5 and http 1 (any framework built on them: axum, hyper,
//! tonic); with the `axum` feature, axum 0.8. An axum 0.7 `Router` accepts the layer but
//! sets other extension types, so `PathParam` answers 500 there, and the log names the
//! version mismatch.
//!
//! # Where things are
//!
//! The root holds the layers ([`LockLayer`], [`ClusterLimitLayer`], `IdempotencyLayer`),
//! their options ([`LockOptions`], [`LimitOptions`], [`Hold`]), the refusals
//! ([`Refusal`], [`RefusalKind`]), [`FencingToken`] and [`LockBody`]. Each middleware's
//! service and future are in its module ([`lock`], [`limit`], `idempotency`); the key
//! extractors and [`BadKey`](extract::BadKey) in [`extract`]; the problem answers in
//! [`response`]; [`LockLost`](body::LockLost) in [`body`]; the token's rejection in
//! [`fencing`]. The client ([`Redlock`](redlock_core::Redlock),
//! [`LockHandle`](redlock_core::LockHandle), [`BoxError`](redlock_core::BoxError)) is
//! `redlock-core`'s.
//!
//! # How it works
//!
//! Add one [`LockLayer`] to an axum, hyper or tonic service, and requests for the same
//! key (`POST /orders/42/pay`, an `Idempotency-Key` header, a tenant id) never run at
//! the same time anywhere in the cluster:
//!
//! 1. a [`KeyExtractor`](extract::KeyExtractor) names the request's key, or lets it
//!    through unlocked, or refuses it (`400`);
//! 2. the layer takes the cluster-wide lock on the key (failing fast by default, or
//!    waiting up to a deadline, woken as soon as the holder releases);
//! 3. the inner service runs while the lock is held and auto-extended; the handler finds
//!    a [`LockHandle`](redlock_core::LockHandle) (key, validity, `lost()`, fencing token) in the request's
//!    extensions, and takes the lock's [`FencingToken`] as an axum extractor;
//! 4. the lock is released when the response body has been sent, or dropped (by
//!    default), or as soon as the response head is ready ([`Hold`]).
//!
//! Busy: **409 Conflict** with `Retry-After` (the holder's remaining TTL). No quorum of
//! Redis nodes: **503** with `Retry-After` (fail-closed;
//! [`fail_open`](LockOptions::fail_open) is an explicit opt-in). Bodies are `application/problem+json`
//! ([`redlock_http`]); see [`response`] for the table and the hook. The inner
//! service's error type is unchanged (axum's `Infallible` works), and its response
//! body is wrapped in a [`LockBody`].
//!
//! # One contract with redlock-actix
//!
//! Keys, answers, option names and defaults, and type names are those of
//! `redlock-actix`, decided in [`redlock_http`] (see [its
//! contract](redlock_http#the-web-crates-contract) for the option table):
//! `Idempotency-Key: a:b` locks `a%3Ab` in both (a value's `%` and `:` are escaped), so
//! a tower service and an actix service on one resource exclude each other.
//!
//! # Any tower service, against real nodes
//!
//! Here a plain `service_fn`, with the layer applied by `tower::ServiceBuilder`:
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use http::{Request, Response, StatusCode};
//! use http_body_util::BodyExt;
//! use redlock_core::{LockHandle, Redlock};
//! use redlock_tower::{LockLayer, LockOptions, extract::PathPrefix};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlock_core::BoxError> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! # let urls = cluster.urls();
//! // `urls`: three independent Redis masters, e.g. "redis://10.0.0.1:6379".
//! let redlock = Redlock::builder()
//!     .nodes(urls)
//! #   .restart_quarantine(false) // the test nodes were started a moment ago
//!     .build()?;
//!
//! // Requests under /orders/{id} are serialized per order, cluster-wide.
//! let layer = LockLayer::new(redlock.clone(), PathPrefix::new("/orders")).options(
//!     LockOptions::new()
//!         .resource_prefix("http:")
//!         .ttl(Duration::from_secs(5)),
//! );
//! let service = ServiceBuilder::new().layer(layer).service(service_fn(
//!     |request: Request<String>| async move {
//!         let lock = request.extensions().get::<LockHandle>().cloned();
//!         let answer = match lock {
//!             Some(lock) => format!("paid under {}", lock.resource()),
//!             None => "no lock needed".to_owned(),
//!         };
//!         Ok::<_, Infallible>(Response::new(answer))
//!     },
//! ));
//!
//! let pay = || Request::post("/orders/42/pay").body(String::new()).unwrap();
//! let response = service.clone().oneshot(pay()).await?;
//! assert_eq!(response.status(), StatusCode::OK);
//! // The lock is held until the body has been sent (here: read) or dropped.
//! let body = response.into_body().collect().await?.to_bytes();
//! assert_eq!(body, "paid under http:/orders/42");
//!
//! // While another replica holds the order's lock, the request is refused.
//! let elsewhere = redlock.lock("http:/orders/42").await?;
//! let busy = service.clone().oneshot(pay()).await?;
//! assert_eq!(busy.status(), StatusCode::CONFLICT);
//! assert!(busy.headers().contains_key("retry-after"));
//! assert_eq!(busy.headers()["content-type"], "application/problem+json");
//! elsewhere.release().await?;
//!
//! // Other paths take no lock.
//! let health = Request::get("/health").body(String::new()).unwrap();
//! assert_eq!(service.oneshot(health).await?.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```
//!
//! # Idempotent requests
//!
//! `IdempotencyLayer` (module `idempotency`, feature `idempotency`, built on `redlock-idempotency`) runs
//! each request with an `Idempotency-Key` once across the replicas and replays its
//! stored response to retries; concurrent requests with the key get `409` (or, with
//! `wait`, the replay). Its handlers take the run's [`FencingToken`] as under a
//! [`LockLayer`].
//!
//! # Concurrency limits
//!
//! [`ClusterLimitLayer`] (module [`limit`]) lets at most `k` requests per key run at
//! once across the replicas (per tenant, per route), with a cluster-wide semaphore of
//! `k` permits; past the limit: `429 Too Many Requests` with `Retry-After`. It takes
//! the same key extractors and answers the same way as a [`LockLayer`].
//!
//! # Fencing tokens
//!
//! A lock cannot stop a handler that was paused past its lock's validity (a long GC
//! pause, a stalled VM) from writing afterwards, while another replica holds the lock.
//! With [`fencing`](LockOptions::fencing) on, each lock carries a fencing token, strictly
//! greater for every new holder of the key; the handler passes it with its write and
//! the storage refuses a token lower than one it has seen (`redlock-fence` does this in
//! the write's own SQL transaction). An axum handler takes it as an argument:
//!
//! ```
//! use axum::{Router, routing::post};
//! use redlock_core::Redlock;
//! use redlock_tower::{FencingToken, LockLayer, LockOptions, extract::PathParam};
//!
//! async fn pay(FencingToken(token): FencingToken) -> String {
//!     // BEGIN; fence.check(&mut *tx, "order:42", token); UPDATE ...; COMMIT
//!     format!("charged under token {token}")
//! }
//!
//! let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build()?;
//! let per_order = LockLayer::new(redlock, PathParam::new("id"))
//!     .options(LockOptions::new().resource_prefix("order:").fencing(true));
//! let app: Router = Router::new().route("/orders/{id}/pay", post(pay).route_layer(per_order));
//! # Ok::<(), redlock_core::BoxError>(())
//! ```
//!
//! A route the layer does not cover, or a layer without fencing, is a configuration
//! mistake: the handler is not called, the client gets a `500` problem saying which
//! (and nothing of the server's insides), and the log names the setting to change
//! ([`FencingTokenRejection`](fencing::FencingTokenRejection)). Hyper and tonic services read it with
//! [`FencingToken::from_request`].
//!
//! # Lock loss
//!
//! The lock is extended by redlock-core's watchdog about every `ttl / 3` while the
//! request runs, up to [`max_hold`](LockOptions::max_hold). If a majority of nodes cannot
//! extend it in time, the lock is **lost**: another request for the key may run meanwhile.
//! By default the layer logs a warning and signals it through the request's
//! [`LockHandle`](redlock_core::LockHandle) (`lost()`, `is_held()`, `cancellation_token()`), and the handler
//! decides; with [`abort_on_loss`](LockOptions::abort_on_loss) the layer drops the
//! handler's future and answers `503` (or, once the body streams, cuts the body off).
//!
//! # Cancellation
//!
//! A request whose client goes away is dropped by the server, with its
//! [`ResponseFuture`](lock::ResponseFuture) or [`LockBody`]: an acquisition in flight releases what it had
//! set, and a held lock is released at once (in the background), not at its TTL.
//!
//! # Tracing
//!
//! Events with the lock's `key`: `lock acquired` (debug: wait, attempts), `lock busy`
//! (debug), `lock service unavailable` (warn; `fail-open` when the request goes
//! through), `lock lost while serving the request` (warn), `lock released` (debug:
//! hold time).

#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

pub mod body;
#[macro_use]
mod config;
pub mod extract;
pub mod fencing;
mod guard;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
pub mod limit;
pub mod lock;
pub mod response;
mod target;

pub use body::LockBody;
pub use fencing::FencingToken;
#[cfg(feature = "idempotency")]
pub use idempotency::IdempotencyLayer;
pub use limit::ClusterLimitLayer;
pub use lock::LockLayer;
pub use redlock_http::{Hold, LimitOptions, LockOptions, Refusal, RefusalKind};

#[doc = include_str!("../guides/TOWER.md")]
pub mod _guide {}

// The README's examples, compiled (and run unless `no_run`) as doctests so that they
// stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
