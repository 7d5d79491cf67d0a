//! A cluster-wide concurrency limit: at most `k` requests per key (per tenant, per
//! route) at once, across every replica of a service.
//!
//! ```
//! use axum::{Router, routing::post};
//! use redlock_core::Redlock;
//! use redlock_tower::{ClusterLimitLayer, LimitOptions, extract::PathParam};
//!
//! async fn export() -> &'static str {
//!     "exported" // at most 3 exports of this tenant run at once, cluster-wide
//! }
//!
//! let redlock = Redlock::builder()
//!     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!     .build()?; // checks the options; contacts no node
//! // A fourth concurrent export of one tenant: 429 Too Many Requests at once.
//! let per_tenant = ClusterLimitLayer::new(
//!     redlock,
//!     PathParam::new("tenant"),
//!     LimitOptions::new(3).resource_prefix("export:"),
//! );
//! let app: Router = Router::new().route("/export/{tenant}", post(export).route_layer(per_tenant));
//! # Ok::<(), redlock_core::BoxError>(())
//! ```
//!
//! # How it works
//!
//! 1. a [`KeyExtractor`](crate::extract::KeyExtractor) names the request's key (the
//!    same extractors as [`LockLayer`](crate::LockLayer)'s), or lets it through
//!    unlimited, or refuses it (`400`);
//! 2. the layer takes a permit of the key's semaphore,
//!    [`redlock.semaphore(resource, limit)`](redlock_core::Redlock::semaphore), whose
//!    name is the [resource prefix](redlock_http::LimitOptions::resource_prefix) and the key
//!    ([`redlock_http::key::resource_name`]). A semaphore of `k` permits is `k` slot locks,
//!    so at most `k` requests hold one, whichever replica they run on (see
//!    [`redlock_core::semaphore`]);
//! 3. the inner service runs while the permit is held and auto-extended by the
//!    watchdog (a handler may run far longer than the [TTL](redlock_http::LimitOptions::ttl)),
//!    up to [`max_hold`](redlock_http::LimitOptions::max_hold) after its acquisition;
//! 4. the permit is released when the response body has been sent, or dropped (by
//!    default), or as soon as the response head is ready
//!    ([`hold`](redlock_http::LimitOptions::hold)), as a [`LockLayer`](crate::LockLayer)
//!    releases its lock: the response body is a [`LockBody`](crate::LockBody) that
//!    holds the permit.
//!
//! Every permit taken: **429 Too Many Requests** (or
//! [`busy_status`](redlock_http::LimitOptions::busy_status)) with `Retry-After` (the
//! soonest a held permit expires if not extended, or
//! [`FALLBACK_RETRY_AFTER`](redlock_http::problem::FALLBACK_RETRY_AFTER)), at once by default or
//! after [`wait`](redlock_http::LimitOptions::wait). No quorum of Redis nodes: **503** with
//! `Retry-After` (fail-closed; [`fail_open`](redlock_http::LimitOptions::fail_open) is an
//! explicit opt-in). A limit of `0` is a misconfiguration: **500**, at request time
//! (see [`ClusterLimitLayer::new`]). Bodies are `application/problem+json`, as
//! [`crate::response`] renders them.
//!
//! A permit lost while the request runs (a majority of the nodes unreachable past its
//! validity, or `max_hold` ran out) is logged and the request carries on by default;
//! with [`abort_on_loss`](redlock_http::LimitOptions::abort_on_loss) the handler is dropped
//! and the client gets **503** (or the streaming body is cut off). Every rejection goes
//! through [`on_refusal`](ClusterLimitLayer::on_refusal) when set, once per
//! request.
//!
//! The options are the engine's [`LimitOptions`](crate::LimitOptions), the type that
//! `redlock-actix`'s `ClusterLimitMiddleware` takes too (the table:
//! [`redlock_http`'s contract](redlock_http#the-web-crates-contract)).
//!
//! ```
//! use std::time::Duration;
//!
//! use http::StatusCode;
//! use redlock_core::Redlock;
//! use redlock_tower::{ClusterLimitLayer, Hold, LimitOptions, extract::Header};
//! use redlock_tower::response::problem_response;
//!
//! let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build()?;
//! let options = LimitOptions::new(2)
//!     .resource_prefix("report:")
//!     .ttl(Duration::from_secs(5)) // extended while the request runs
//!     .wait(Duration::from_secs(1)) // then 429
//!     .hold(Hold::UntilHead) // the body is sent without the permit
//!     .max_hold(Duration::from_secs(60))
//!     .abort_on_loss(true) // a lost permit: 503, not a request past the limit
//!     .busy_status(StatusCode::SERVICE_UNAVAILABLE);
//! let layer = ClusterLimitLayer::new(redlock, Header::new("x-tenant").required(), options)
//!     .on_refusal(|refusal| {
//!         tracing::info!(kind = ?refusal.kind, "report refused");
//!         problem_response(&refusal.problem)
//!     });
//! # let _ = layer;
//! # Ok::<(), redlock_core::BoxError>(())
//! ```
//!
//! The handler finds no [`LockHandle`](redlock_core::LockHandle) from this layer (a permit is
//! no lock on the key, and would hide the handle of a [`LockLayer`](crate::LockLayer)
//! on the same route), and permits carry no fencing token.
//!
//! # Any tower service, against real nodes
//!
//! ```
//! use std::convert::Infallible;
//!
//! use http::{Request, Response, StatusCode};
//! use redlock_core::Redlock;
//! use redlock_tower::{ClusterLimitLayer, LimitOptions, extract::Header};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlock_core::BoxError> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! # let urls = cluster.urls();
//! let redlock = Redlock::builder()
//!     .nodes(urls)
//! #   .restart_quarantine(false) // the test nodes were started a moment ago
//!     .build()?;
//!
//! // Two requests per tenant at once.
//! let layer = ClusterLimitLayer::new(
//!     redlock.clone(),
//!     Header::new("x-tenant").required(),
//!     LimitOptions::new(2).resource_prefix("report:"),
//! );
//! let service = ServiceBuilder::new().layer(layer).service(service_fn(
//!     |_: Request<String>| async { Ok::<_, Infallible>(Response::new("report".to_owned())) },
//! ));
//! let report = |tenant: &str| {
//!     Request::get("/report").header("x-tenant", tenant).body(String::new()).unwrap()
//! };
//! assert_eq!(service.clone().oneshot(report("acme")).await?.status(), StatusCode::OK);
//!
//! // Elsewhere, two requests of tenant acme hold both permits.
//! let acme = redlock.semaphore("report:acme", 2)?;
//! let (first, second) = (acme.acquire().await?, acme.acquire().await?);
//! let busy = service.clone().oneshot(report("acme")).await?;
//! assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(busy.headers().contains_key("retry-after"));
//! assert_eq!(busy.headers()["content-type"], "application/problem+json");
//! // Other tenants have their own permits.
//! assert_eq!(service.clone().oneshot(report("globex")).await?.status(), StatusCode::OK);
//! first.release().await?;
//! second.release().await?;
//! # Ok(())
//! # }
//! ```

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::ClusterLimitLayer;
pub use service::ClusterLimitService;
