//! Key bounds: an idempotency key with its scope, or a concurrency limit key, whose
//! escaped form does not fit the resource-name bound (512 bytes, less the prefix and
//! what is derived after the key) is refused with `400` naming the bound, before
//! anything runs; a configured prefix that leaves no room is a typed error where the
//! layer is built. redlock-actix's `tests/bounds.rs` checks the same answers, word for
//! word.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;
use redlock_http::key::KeyBoundError;
use redlock_idempotency::store::RedisStore;
use redlock_tower::ClusterLimitLayer;
use redlock_tower::LimitOptions;
use redlock_tower::idempotency::IdempotencyLayer;
use tower::ServiceExt;

/// The answers redlock-actix gives too.
const KEY_TOO_LONG: &str = "The request's idempotency key with its scope is too long: 600 bytes once escaped (`%` as `%25`, `:` as `%3A`); at most 500 bytes are taken.";
const SCOPE_TOO_LONG: &str = "The request's idempotency key with its scope is too long: 501 bytes once escaped (`%` as `%25`, `:` as `%3A`); at most 500 bytes are taken.";
const LIMIT_KEY_TOO_LONG: &str = "The request's concurrency limit key is too long: 500 bytes once escaped (`%` as `%25`, `:` as `%3A`); at most 499 bytes are taken.";

async fn send(app: &Router, request: http::Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn detail(body: &str) -> String {
    let start = body.find(r#""detail":""#).expect("a problem body") + 10;
    body[start..][..body[start..].find('"').unwrap()].to_owned()
}

/// A route counting its runs.
fn counted(runs: &Arc<AtomicUsize>) -> axum::routing::MethodRouter {
    let runs = Arc::clone(runs);
    post(move || async move {
        runs.fetch_add(1, Ordering::SeqCst);
        (StatusCode::CREATED, "ran")
    })
}

fn keyed(key: &str, tenant: Option<&str>) -> http::Request<Body> {
    let mut request = http::Request::post("/r").header("idempotency-key", key);
    if let Some(tenant) = tenant {
        request = request.header("x-tenant", tenant);
    }
    request.body(Body::empty()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_and_scopes_too_long_once_escaped_are_refused_with_the_bound() {
    let (locks, data) = tokio::join!(Cluster::start(3), Cluster::start(1));
    let redlock = redlock_testkit::builder(&locks).build().unwrap();
    let store = RedisStore::open(&data.urls()[0]).await.unwrap();
    let layer = IdempotencyLayer::new(redlock_idempotency::Idempotency::new(redlock, store));
    assert_eq!(layer.core().room().unwrap().bytes(), 500);
    let runs = Arc::new(AtomicUsize::new(0));
    let unscoped = Router::new()
        .route("/r", counted(&runs))
        .layer(layer.clone());
    let scoped = Router::new()
        .route("/r", counted(&runs))
        .layer(layer.scope_header("x-tenant"));

    // 200 bytes, under `max_key_len`; 600 once escaped.
    let (status, body) = send(&unscoped, keyed(&":".repeat(200), None)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(detail(&body), KEY_TOO_LONG);
    // The scope counts: 499 + `:` + 1.
    let (status, body) = send(&scoped, keyed("k", Some(&"t".repeat(499)))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(detail(&body), SCOPE_TOO_LONG);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // At the bound, it runs.
    let (status, body) = send(&scoped, keyed("k", Some(&"t".repeat(498)))).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "ran"));
    let (status, _) = send(&unscoped, keyed(&":".repeat(166), None)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A prefix that leaves no room for the longest key: a typed error where it is
    // built, and `500` (never the handler) at request time.
    let misconfigured = IdempotencyLayer::new(
        redlock_idempotency::Idempotency::new(
            redlock_testkit::builder(&locks).build().unwrap(),
            RedisStore::open(&data.urls()[0]).await.unwrap(),
        )
        .resource_prefix("p".repeat(300)),
    );
    assert_eq!(
        misconfigured.core().room(),
        Err(KeyBoundError::KeyLimitAboveRoom {
            max_key_len: 255,
            room: 212
        })
    );
    let app = Router::new()
        .route("/r", counted(&runs))
        .layer(misconfigured);
    let (status, _) = send(&app, keyed("k", None)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_keys_leave_room_for_the_slot_suffix_or_are_refused_with_the_bound() {
    let locks = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&locks).build().unwrap();
    let layer = ClusterLimitLayer::new(
        redlock.clone(),
        Header::new("x-tenant").required(),
        LimitOptions::new(1).resource_prefix("lim:"),
    );
    // 512 - `lim:` - `/permit/0`.
    assert_eq!(layer.room().unwrap().bytes(), 499);
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route("/r", counted(&runs)).layer(layer);
    let tenant = |t: String| {
        http::Request::post("/r")
            .header("x-tenant", t)
            .body(Body::empty())
            .unwrap()
    };

    let (status, body) = send(&app, tenant("t".repeat(500))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(detail(&body), LIMIT_KEY_TOO_LONG);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let (status, body) = send(&app, tenant("t".repeat(499))).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "ran"));

    // A prefix that leaves no room: a typed error, and `500` at request time.
    let layer = ClusterLimitLayer::new(
        redlock,
        Header::new("x-tenant").required(),
        LimitOptions::new(10).resource_prefix("p".repeat(503)),
    );
    assert_eq!(
        layer.room(),
        Err(KeyBoundError::NoRoom {
            prefix_len: 503,
            suffix_len: 9,
            max_resource_len: 512
        })
    );
    let app = Router::new().route("/r", counted(&runs)).layer(layer);
    let (status, _) = send(&app, tenant("t".to_owned())).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The room follows the client's own resource-name bound: under a client that takes
/// names of at most 64 bytes, a limit key is refused with `400` naming what that bound
/// leaves (64 - `lim:` - `/permit/0` = 51), and a key of that length runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_room_follows_the_clients_resource_name_bound() {
    let locks = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&locks)
        .max_resource_len(64)
        .build()
        .unwrap();
    let layer = ClusterLimitLayer::new(
        redlock,
        Header::new("x-tenant").required(),
        LimitOptions::new(1).resource_prefix("lim:"),
    );
    assert_eq!(layer.room().unwrap().bytes(), 51);
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route("/r", counted(&runs)).layer(layer);
    let tenant = |t: String| {
        http::Request::post("/r")
            .header("x-tenant", t)
            .body(Body::empty())
            .unwrap()
    };
    let (status, body) = send(&app, tenant("t".repeat(52))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        detail(&body).contains("at most 51 bytes are taken"),
        "{body}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let (status, body) = send(&app, tenant("t".repeat(51))).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "ran"));
}
