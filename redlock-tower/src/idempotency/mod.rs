//! Idempotent requests: a request carrying an `Idempotency-Key` runs once across every
//! replica of the service, and its retries get the first run's response, replayed byte
//! for byte (marked `Idempotent-Replayed: true`).
//!
//! The decision, the records and their stores are [`redlock_idempotency`]'s (see its
//! docs for the semantics table and the guarantees); this module is its tower
//! middleware: [`IdempotencyLayer`] (over the engine's [`Idempotency`], the options type `redlock-actix` takes too),
//! [`IdempotencyService`], [`ResponseFuture`] and [`IdempotentBody`].
//!
//! For each request with a key, the service:
//!
//! 1. reads the key (`400` when it is missing and required, or unusable; passes the
//!    request through when it is missing and optional) and the [scope](IdempotencyLayer::scope);
//! 2. reads the body whole (at most [`max_request_body`](Idempotency::max_request_body),
//!    else `413`) and fingerprints the request;
//! 3. replays the key's stored response, or refuses the request (`409` while the key's
//!    first request runs, `422` for a different request under the same key), or runs
//!    the inner service under the key's lock: the handler finds the lock's
//!    [`LockHandle`](redlock_core::LockHandle) in the request's extensions, and its
//!    [`FencingToken`](crate::FencingToken) works as under a [`LockLayer`](crate::LockLayer);
//! 4. stores the response (status, headers but hop-by-hop ones, body up to
//!    [`max_body`](Idempotency::max_body)) before answering it. A response not
//!    stored is still answered whole.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//!
//! use axum::{Router, body::Body, routing::post};
//! use http::{Request, StatusCode};
//! use redlock_idempotency::store::RedisStore;
//! use redlock_core::Redlock;
//! use redlock_tower::{IdempotencyLayer, idempotency::Idempotency};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlock_core::BoxError> {
//! # let cluster = redlock_testkit::Cluster::start(1).await;
//! # let data = redlock_testkit::Cluster::start(1).await;
//! let redlock = Redlock::builder()
//!     .nodes(cluster.urls())
//! #   .restart_quarantine(false) // the test node was started a moment ago
//!     .build()?;
//! let store = RedisStore::open(&data.urls()[0]).await?;
//!
//! let refunds = Arc::new(AtomicUsize::new(0));
//! let counter = refunds.clone();
//! let app: Router = Router::new()
//!     .route(
//!         "/refunds",
//!         post(move || async move {
//!             let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
//!             (StatusCode::CREATED, format!("refund {n}"))
//!         }),
//!     )
//!     .layer(IdempotencyLayer::new(Idempotency::new(redlock, store)).scope_header("x-tenant"));
//!
//! let refund = || {
//!     Request::post("/refunds")
//!         .header("idempotency-key", "refund-7")
//!         .header("x-tenant", "acme")
//!         .body(Body::from("{\"order\":7}"))
//! };
//! let first = app.clone().oneshot(refund()?).await?;
//! assert_eq!(first.status(), StatusCode::CREATED);
//!
//! // The retry gets the first response; the refund is not made twice.
//! let retry = app.clone().oneshot(refund()?).await?;
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! let body = axum::body::to_bytes(retry.into_body(), 1024).await?;
//! assert_eq!(body, "refund 1");
//! assert_eq!(refunds.load(Ordering::SeqCst), 1);
//!
//! // Without a key: 400.
//! let keyless = Request::post("/refunds").header("x-tenant", "acme").body(Body::empty())?;
//! assert_eq!(app.oneshot(keyless).await?.status(), StatusCode::BAD_REQUEST);
//! # Ok(())
//! # }
//! ```

mod body;
mod future;
mod layer;
mod service;

pub use body::IdempotentBody;
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use redlock_idempotency::{Idempotency, REPLAYED_HEADER, Refusal, RefusalKind};
pub use service::IdempotencyService;
