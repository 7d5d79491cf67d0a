//! Nested routes, across both web crates: axum's `Router::nest("/api", ..)` shows its
//! layers the target without the prefix, actix-web's `web::scope("/api")` shows it whole.
//! Both fingerprint (idempotency) and key (path prefixes: locks, limits) the target as
//! the client sent it, so a retry that lands on the other framework's replica gets the
//! stored response, and one axum router nested at two prefixes gives two targets.
//!
//! Real servers on loopback ports, real redis-server nodes (three for the locks, one for
//! the records).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};
use redlock_actix::LockOptions;
use redlock_actix::{DistributedLockConfig, LockMiddleware};
use redlock_core::{LockHandle, Redlock};
use redlock_idempotency::store::RedisStore;
use redlock_testkit::Cluster;

/// The lock nodes and the data Redis, alive as long as the test.
struct Backends {
    nodes: Cluster,
    data: Cluster,
}

impl Backends {
    async fn start() -> Self {
        let (nodes, data) = tokio::join!(Cluster::start(3), Cluster::start(1));
        Self { nodes, data }
    }

    fn redlock(&self) -> Redlock {
        redlock_testkit::builder(&self.nodes)
            .node_timeout(Duration::from_millis(250))
            .build()
            .unwrap()
    }

    /// One idempotency core for both servers (the same options, the same store).
    async fn core(&self) -> redlock_idempotency::Idempotency {
        let store = RedisStore::open(&self.data.urls()[0]).await.unwrap();
        redlock_idempotency::Idempotency::new(self.redlock(), store)
    }
}

/// The handler's answer on both servers: `201` with the run's number and the body.
fn answer(runs: &AtomicUsize, body: &[u8]) -> String {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    format!("run {n}: {}", String::from_utf8_lossy(body))
}

/// The axum server: `/api/refunds` (and `/v1/refunds`, `/v2/refunds`: one router nested
/// twice) behind the idempotency layer inside the nested router; `/api/orders/{id}`
/// behind a lock layer keyed by `PathPrefix("/api/orders")` inside it, answering the
/// lock's resource; `/api/limited/{id}` behind a limit of one by
/// `PathPrefix("/api/limited")`.
async fn start_axum(
    core: redlock_idempotency::Idempotency,
    redlock: Redlock,
    runs: Arc<AtomicUsize>,
) -> SocketAddr {
    use axum::routing::post;
    use axum::{Extension, Router};
    use redlock_tower::extract::PathPrefix;
    use redlock_tower::{
        ClusterLimitLayer, IdempotencyLayer, LimitOptions, LockLayer, LockOptions,
    };

    let refunds = Router::new()
        .route(
            "/refunds",
            post(move |body: axum::body::Bytes| async move {
                (axum::http::StatusCode::CREATED, answer(&runs, &body))
            }),
        )
        .layer(IdempotencyLayer::new(core));
    let orders = Router::new()
        .route(
            "/orders/{id}",
            post(
                |Extension(lock): Extension<redlock_core::LockHandle>| async move {
                    lock.resource().to_owned()
                },
            ),
        )
        .layer(
            LockLayer::new(redlock.clone(), PathPrefix::new("/api/orders"))
                .options(LockOptions::new().resource_prefix("n:")),
        )
        .route(
            "/limited/{id}",
            post(|| async { "limited" }).layer(ClusterLimitLayer::new(
                redlock,
                PathPrefix::new("/api/limited"),
                LimitOptions::new(1).resource_prefix("lim:"),
            )),
        );
    let app = Router::new()
        .nest("/api", refunds.clone().merge(orders))
        .nest("/v1", refunds.clone())
        .nest("/v2", refunds);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The actix server: the same routes under `web::scope("/api")`.
fn start_actix(
    core: redlock_idempotency::Idempotency,
    redlock: Redlock,
    runs: Arc<AtomicUsize>,
) -> (SocketAddr, actix_web::dev::ServerHandle) {
    use redlock_actix::extract::PathPrefix;

    async fn refund(runs: web::Data<Arc<AtomicUsize>>, body: web::Bytes) -> HttpResponse {
        HttpResponse::Created().body(answer(&runs, &body))
    }
    async fn order(lock: web::ReqData<LockHandle>) -> HttpResponse {
        HttpResponse::Ok().body(lock.resource().to_owned())
    }

    let config =
        DistributedLockConfig::new(redlock).options(LockOptions::new().resource_prefix("n:"));
    let idempotency = redlock_actix::IdempotencyMiddleware::new(core);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(config.clone())
            .app_data(web::Data::new(Arc::clone(&runs)))
            .service(
                web::scope("/api")
                    .service(
                        web::resource("/refunds")
                            .wrap(idempotency.clone())
                            .route(web::post().to(refund)),
                    )
                    .service(
                        web::resource("/orders/{id}")
                            .wrap(LockMiddleware::new(
                                config.clone(),
                                PathPrefix::new("/api/orders"),
                            ))
                            .route(web::post().to(order)),
                    ),
            )
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (addr, handle)
}

/// `POST http://addr{path}` with `key` (if any) and `body`: status, whether replayed,
/// body.
async fn post(addr: SocketAddr, path: &str, key: Option<&str>, body: &str) -> (u16, bool, String) {
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let mut request = client.post(format!("http://{addr}{path}"));
    if let Some(key) = key {
        request = request.insert_header(("idempotency-key", key));
    }
    let mut response = request.send_body(body.to_owned()).await.expect("send");
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = response.body().await.expect("body");
    (
        response.status().as_u16(),
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[actix_rt::test]
async fn a_retry_on_the_other_frameworks_replica_is_replayed_under_nesting() {
    let backends = Backends::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let core = backends.core().await;
    let axum = start_axum(core.clone(), backends.redlock(), Arc::clone(&runs)).await;
    let (actix, handle) = start_actix(core, backends.redlock(), Arc::clone(&runs));

    // Stored through tower under `nest("/api")`, replayed by actix under `scope("/api")`.
    let first = post(axum, "/api/refunds", Some("r-1"), "one").await;
    assert_eq!(first, (201, false, "run 1: one".to_owned()));
    let retry = post(actix, "/api/refunds", Some("r-1"), "one").await;
    assert_eq!(retry, (201, true, "run 1: one".to_owned()), "actix's retry");

    // And the other way round.
    let first = post(actix, "/api/refunds", Some("r-2"), "two").await;
    assert_eq!(first, (201, false, "run 2: two".to_owned()));
    let retry = post(axum, "/api/refunds", Some("r-2"), "two").await;
    assert_eq!(retry, (201, true, "run 2: two".to_owned()), "axum's retry");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    handle.stop(true).await;
}

#[actix_rt::test]
async fn one_axum_router_nested_at_two_prefixes_gives_two_targets() {
    let backends = Backends::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let axum = start_axum(backends.core().await, backends.redlock(), Arc::clone(&runs)).await;

    let first = post(axum, "/v1/refunds", Some("k"), "same").await;
    assert_eq!(first, (201, false, "run 1: same".to_owned()));
    // The same key and body to the other mount is another request: refused, not replayed.
    let (status, replayed, body) = post(axum, "/v2/refunds", Some("k"), "same").await;
    assert_eq!((status, replayed), (422, false), "{body}");
    assert!(body.contains("urn:redlock:idempotency:mismatch"), "{body}");
    // Its own retry is still replayed.
    let retry = post(axum, "/v1/refunds", Some("k"), "same").await;
    assert_eq!(retry, (201, true, "run 1: same".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[actix_rt::test]
async fn path_prefix_keys_are_the_sent_path_under_nesting() {
    let backends = Backends::start().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let redlock = backends.redlock();
    let core = backends.core().await;
    let axum = start_axum(core.clone(), redlock.clone(), Arc::clone(&runs)).await;
    let (actix, handle) = start_actix(core, redlock.clone(), runs);

    // The lock layer: the same resource in both, from the path as sent.
    let tower = post(axum, "/api/orders/42", None, "").await;
    assert_eq!(tower, (200, false, "n:/api/orders/42".to_owned()));
    let actix_answer = post(actix, "/api/orders/42", None, "").await;
    assert_eq!(actix_answer, (200, false, "n:/api/orders/42".to_owned()));

    // The limit layer: the one permit of `/api/limited/7`, held elsewhere, limits it.
    let semaphore = redlock.semaphore("lim:/api/limited/7", 1).unwrap();
    let permit = semaphore.acquire().await.unwrap();
    let (status, _, body) = post(axum, "/api/limited/7", None, "").await;
    assert_eq!(status, 429, "{body}");
    permit.release().await.unwrap();
    let (status, _, body) = post(axum, "/api/limited/7", None, "").await;
    assert_eq!((status, body.as_str()), (200, "limited"));
    handle.stop(true).await;
}
