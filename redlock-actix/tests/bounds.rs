//! Key bounds, as redlock-tower's `tests/bounds.rs` checks them, with the same answers
//! word for word: an idempotency key with its scope, or a concurrency limit key, whose
//! escaped form does not fit the resource-name bound is refused with `400` naming the
//! bound, before anything runs; a configured prefix that leaves no room is a typed
//! error where the middleware is built.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use actix_web::dev::Service;
use common::*;
use redlock_actix::LimitOptions;
use redlock_actix::{ClusterLimitMiddleware, IdempotencyMiddleware};
use redlock_http::key::KeyBoundError;
use redlock_idempotency::store::RedisStore;

/// The answers redlock-tower gives too.
const KEY_TOO_LONG: &str = "The request's idempotency key with its scope is too long: 600 bytes once escaped (`%` as `%25`, `:` as `%3A`); at most 500 bytes are taken.";
const SCOPE_TOO_LONG: &str = "The request's idempotency key with its scope is too long: 501 bytes once escaped (`%` as `%25`, `:` as `%3A`); at most 500 bytes are taken.";
const LIMIT_KEY_TOO_LONG: &str = "The request's concurrency limit key is too long: 500 bytes once escaped (`%` as `%25`, `:` as `%3A`); at most 499 bytes are taken.";

type Runs = web::Data<AtomicUsize>;

async fn counted(runs: Runs) -> HttpResponse {
    runs.fetch_add(1, Ordering::SeqCst);
    HttpResponse::Created().body("ran")
}

async fn send<S, R, B>(app: &S, request: R) -> (u16, String)
where
    S: Service<R, Response = actix_web::dev::ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let response = actix_test::call_service(app, request).await;
    let status = response.status().as_u16();
    let body = actix_test::read_body(response).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn detail(body: &str) -> String {
    let start = body.find(r#""detail":""#).expect("a problem body") + 10;
    body[start..][..body[start..].find('"').unwrap()].to_owned()
}

fn keyed(path: &str, key: &str, tenant: Option<&str>) -> actix_test::TestRequest {
    let mut request = actix_test::TestRequest::post()
        .uri(path)
        .insert_header(("idempotency-key", key));
    if let Some(tenant) = tenant {
        request = request.insert_header(("x-tenant", tenant));
    }
    request
}

#[actix_rt::test]
async fn idempotency_keys_and_scopes_too_long_once_escaped_are_refused_with_the_bound() {
    let (locks, data) = tokio::join!(Cluster::start(3), Cluster::start(1));
    let redlock = redlock_testkit::builder(&locks).build().unwrap();
    let store = RedisStore::open(&data.urls()[0]).await.unwrap();
    let idempotency =
        IdempotencyMiddleware::new(redlock_idempotency::Idempotency::new(redlock, store));
    assert_eq!(idempotency.core().room().unwrap().bytes(), 500);
    let misconfigured = IdempotencyMiddleware::new(
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
    let runs: Runs = web::Data::new(AtomicUsize::new(0));
    let app = actix_test::init_service(
        App::new()
            .app_data(runs.clone())
            .service(
                web::resource("/unscoped")
                    .wrap(idempotency.clone())
                    .route(web::post().to(counted)),
            )
            .service(
                web::resource("/scoped")
                    .wrap(idempotency.scope_header("x-tenant"))
                    .route(web::post().to(counted)),
            )
            .service(
                web::resource("/misconfigured")
                    .wrap(misconfigured)
                    .route(web::post().to(counted)),
            ),
    )
    .await;

    let (status, body) = send(
        &app,
        keyed("/unscoped", &":".repeat(200), None).to_request(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(detail(&body), KEY_TOO_LONG);
    let (status, body) = send(
        &app,
        keyed("/scoped", "k", Some(&"t".repeat(499))).to_request(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(detail(&body), SCOPE_TOO_LONG);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let (status, body) = send(
        &app,
        keyed("/scoped", "k", Some(&"t".repeat(498))).to_request(),
    )
    .await;
    assert_eq!((status, body.as_str()), (201, "ran"));
    let (status, _) = send(
        &app,
        keyed("/unscoped", &":".repeat(166), None).to_request(),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let (status, _) = send(&app, keyed("/misconfigured", "k", None).to_request()).await;
    assert_eq!(status, 500);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[actix_rt::test]
async fn limit_keys_leave_room_for_the_slot_suffix_or_are_refused_with_the_bound() {
    let locks = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&locks).build().unwrap();
    let limit = ClusterLimitMiddleware::new(
        redlock.clone(),
        Header::new("x-tenant").required(),
        LimitOptions::new(1).resource_prefix("lim:"),
    );
    assert_eq!(limit.room().unwrap().bytes(), 499);
    let misconfigured = ClusterLimitMiddleware::new(
        redlock,
        Header::new("x-tenant").required(),
        LimitOptions::new(10).resource_prefix("p".repeat(503)),
    );
    assert_eq!(
        misconfigured.room(),
        Err(KeyBoundError::NoRoom {
            prefix_len: 503,
            suffix_len: 9,
            max_resource_len: 512
        })
    );
    let runs: Runs = web::Data::new(AtomicUsize::new(0));
    let app = actix_test::init_service(
        App::new()
            .app_data(runs.clone())
            .service(
                web::resource("/r")
                    .wrap(limit)
                    .route(web::post().to(counted)),
            )
            .service(
                web::resource("/misconfigured")
                    .wrap(misconfigured)
                    .route(web::post().to(counted)),
            ),
    )
    .await;
    let tenant = |path: &str, t: String| {
        actix_test::TestRequest::post()
            .uri(path)
            .insert_header(("x-tenant", t))
    };

    let (status, body) = send(&app, tenant("/r", "t".repeat(500)).to_request()).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(detail(&body), LIMIT_KEY_TOO_LONG);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let (status, body) = send(&app, tenant("/r", "t".repeat(499)).to_request()).await;
    assert_eq!((status, body.as_str()), (201, "ran"));

    let (status, _) = send(&app, tenant("/misconfigured", "t".to_owned()).to_request()).await;
    assert_eq!(status, 500);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
