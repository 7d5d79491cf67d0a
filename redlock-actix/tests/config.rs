//! redlock-actix's configuration and the rejections that never reach a lock, against
//! real actix-web servers and redis-server nodes: missing configuration, the inner
//! extractors' own errors, bad keys, rejection hooks, scope and resource overrides.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;
use redlock_actix::LockOptions;

// ---------------------------------------------------------------------------------------
// Configuration and rejections that never reach a lock.

struct IdempotencyKey;

impl LockHeaderName for IdempotencyKey {
    const NAME: &'static str = "idempotency-key";
}

#[derive(serde::Deserialize)]
struct Search {
    order: u64,
}

impl redlock_actix::LockKey for Search {
    fn lock_key(&self) -> Result<String, BadKey> {
        self.order.lock_key()
    }
}

async fn by_number(order: DistributedLock<web::Path<u64>>) -> HttpResponse {
    HttpResponse::Ok().body(order.guard().resource().to_owned())
}

async fn by_query(search: DistributedLock<web::Query<Search>>) -> HttpResponse {
    HttpResponse::Ok().body(search.guard().resource().to_owned())
}

async fn by_header(key: DistributedLock<LockHeader<IdempotencyKey>>) -> HttpResponse {
    HttpResponse::Ok().body(key.guard().resource().to_owned())
}

/// Missing configuration is a 500 naming the type to register (extractor and
/// middleware); the inner extractor's own errors keep their responses; a key that is
/// missing, empty or too long is a 400 problem; the middleware's key functions and own
/// configuration, and a rejection hook.
#[actix_rt::test]
async fn missing_config_is_500_and_inner_extractor_errors_keep_their_responses() {
    let cluster = Cluster::start(1).await;
    // Resource names (prefix included) of at most 10 bytes: keys of at most 8.
    let short_names = redlock_testkit::builder(&cluster)
        .max_resource_len(10)
        .build()
        .unwrap();
    let config =
        DistributedLockConfig::new(short_names).options(LockOptions::new().resource_prefix("o:"));
    let app = actix_test::init_service(
        App::new()
            .service(
                web::scope("/configured")
                    .app_data(config.clone())
                    .route("/orders/{id}", web::get().to(by_number))
                    .route("/named/{id}", web::get().to(resource))
                    .route("/search", web::get().to(by_query))
                    .route("/payments", web::post().to(by_header)),
            )
            .service(
                web::scope("/custom")
                    .app_data(config.clone().on_refusal(|rejection| {
                        HttpResponse::ImATeapot()
                            .body(format!("custom: {}", rejection.problem.detail))
                    }))
                    .route("/named/{id}", web::get().to(resource)),
            )
            .service(
                // No app_data: the middleware's own configuration.
                web::scope("/explicit/{id}")
                    .wrap(LockMiddleware::path_param(config.clone(), "id"))
                    .route("", web::get().to(handle_resource)),
            )
            .service(
                web::scope("/closure/{id}")
                    .wrap(LockMiddleware::new(
                        config.clone(),
                        |req: &ServiceRequest| {
                            let tenant = req
                                .headers()
                                .get("x-tenant")
                                .and_then(|v| v.to_str().ok())
                                .ok_or_else(|| BadKey::new("no x-tenant header"))?
                                .to_owned();
                            let id: u64 = req
                                .match_info()
                                .get("id")
                                .and_then(|v| v.parse().ok())
                                .ok_or_else(|| BadKey::new("the id must be a number"))?;
                            Ok(Some((tenant, id)))
                        },
                    ))
                    .route("", web::get().to(handle_resource)),
            )
            .service(
                web::scope("/by-header")
                    .wrap(LockMiddleware::new(
                        config.clone(),
                        Header::new("idempotency-key").required(),
                    ))
                    .route("", web::post().to(handle_resource)),
            )
            .service(
                web::scope("/optional-header")
                    .wrap(LockMiddleware::header(config.clone(), "idempotency-key"))
                    .route(
                        "",
                        web::post().to(|lock: Option<web::ReqData<LockHandle>>| async move {
                            HttpResponse::Ok().body(match lock {
                                Some(lock) => lock.resource().to_owned(),
                                None => "unlocked".to_owned(),
                            })
                        }),
                    ),
            )
            .route("/bare/{id}", web::get().to(by_number))
            .service(
                web::scope("/data")
                    .app_data(web::Data::new(config.clone())) // found in web::Data too
                    .route("/named/{id}", web::get().to(resource)),
            ),
    )
    .await;
    let call = |req: actix_test::TestRequest| {
        let app = &app;
        async move {
            let response = actix_test::call_service(app, req.to_request()).await;
            let status = response.status().as_u16();
            let content_type = response
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let body = actix_test::read_body(response).await;
            (
                status,
                content_type,
                String::from_utf8_lossy(&body).into_owned(),
            )
        }
    };
    let problem = "application/problem+json";

    // Missing configuration (an extractor's: the middleware takes its own): 500, the
    // type to register in the log, not in the body.
    let (status, content_type, body) = call(actix_test::TestRequest::get().uri("/bare/1")).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(content_type, problem);
    assert!(!body.contains("DistributedLockConfig"), "{body}");
    // The configuration is found in `web::Data` too.
    let ok = call(actix_test::TestRequest::get().uri("/data/named/7")).await;
    assert_eq!((ok.0, ok.2.as_str()), (200, "o:7"));

    // The configured routes work.
    let ok = call(actix_test::TestRequest::get().uri("/configured/orders/5")).await;
    assert_eq!((ok.0, ok.2.as_str()), (200, "o:5"));
    let ok = call(actix_test::TestRequest::get().uri("/configured/search?order=6")).await;
    assert_eq!((ok.0, ok.2.as_str()), (200, "o:6"));
    let ok = call(
        actix_test::TestRequest::post()
            .uri("/configured/payments")
            .insert_header(("idempotency-key", "abc")),
    )
    .await;
    assert_eq!((ok.0, ok.2.as_str()), (200, "o:abc"));

    // The middleware with its own configuration, a closure key, a header key.
    let ok = call(actix_test::TestRequest::get().uri("/explicit/8")).await;
    assert_eq!((ok.0, ok.2.as_str()), (200, "o:8"));
    let ok = call(
        actix_test::TestRequest::get()
            .uri("/closure/9")
            .insert_header(("x-tenant", "acme")),
    )
    .await;
    assert_eq!((ok.0, ok.2.as_str()), (200, "o:acme:9"));
    let (status, content_type, body) = call(actix_test::TestRequest::get().uri("/closure/9")).await;
    assert_eq!((status, content_type.as_str()), (400, problem), "{body}");
    assert!(body.contains("no x-tenant header"), "{body}");
    let ok = call(
        actix_test::TestRequest::post()
            .uri("/by-header")
            .insert_header(("idempotency-key", "k1")),
    )
    .await;
    assert_eq!((ok.0, ok.2.as_str()), (200, "o:k1"));
    let (status, _, body) = call(actix_test::TestRequest::post().uri("/by-header")).await;
    assert_eq!(status, 400, "{body}");
    // An optional header (the default, as in redlock-tower): without it, no lock; given
    // twice or empty, 400.
    let (status, _, body) = call(actix_test::TestRequest::post().uri("/optional-header")).await;
    assert_eq!((status, body.as_str()), (200, "unlocked"));
    let (status, _, body) = call(
        actix_test::TestRequest::post()
            .uri("/optional-header")
            .insert_header(("idempotency-key", "k2")),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "o:k2"));
    for values in [&["a", "b"][..], &[" "][..]] {
        let mut req = actix_test::TestRequest::post().uri("/optional-header");
        for value in values {
            req = req.append_header(("idempotency-key", *value));
        }
        let (status, _, body) = call(req).await;
        assert_eq!(status, 400, "{values:?}: {body}");
    }

    // A rejection hook decides the answer.
    let (status, _, body) =
        call(actix_test::TestRequest::get().uri("/custom/named/toolongkey")).await;
    assert_eq!(status, 418, "{body}");
    assert!(
        body.starts_with("custom: The request's lock key is too long"),
        "{body}"
    );

    // The inner extractors' own errors: Path → 404, Query → 400, not problem+json.
    let (status, content_type, _) =
        call(actix_test::TestRequest::get().uri("/configured/orders/abc")).await;
    assert_eq!(status, 404);
    assert_ne!(content_type, problem);
    let (status, content_type, _) =
        call(actix_test::TestRequest::get().uri("/configured/search?order=x")).await;
    assert_eq!(status, 400);
    assert_ne!(content_type, problem);

    // No usable key: 400 problems.
    let (status, content_type, body) =
        call(actix_test::TestRequest::post().uri("/configured/payments")).await;
    assert_eq!((status, content_type.as_str()), (400, problem), "{body}");
    assert!(body.contains("idempotency-key"), "{body}");
    let too_long = "x".repeat(9);
    let (status, content_type, body) =
        call(actix_test::TestRequest::get().uri(&format!("/configured/named/{too_long}"))).await;
    assert_eq!((status, content_type.as_str()), (400, problem), "{body}");
    assert!(body.contains("at most 10 bytes"), "{body}");
}

/// A scope's configuration overrides the app's, and a resource's the scope's: the
/// prefix and the wait policy both change.
#[actix_rt::test]
async fn scope_and_resource_configs_override_the_apps() {
    let cluster = Cluster::start(3).await;
    let shared = redlock(&cluster, Duration::from_millis(100));
    let app_config = DistributedLockConfig::new(shared.clone())
        .options(LockOptions::new().resource_prefix("app:"));
    let scope_config = DistributedLockConfig::new(shared.clone()).options(
        LockOptions::new()
            .resource_prefix("scope:")
            .wait(Duration::from_secs(5)),
    );
    let resource_config = DistributedLockConfig::new(shared.clone())
        .options(LockOptions::new().resource_prefix("res:"));
    let server = Server::start(1, move |cfg| {
        cfg.app_data(app_config.clone())
            .route("/plain/{id}", web::get().to(resource))
            .service(
                web::scope("/scoped")
                    .app_data(scope_config.clone())
                    .route("/{id}", web::get().to(resource))
                    .service(
                        web::resource("/inner/{id}")
                            .app_data(resource_config.clone())
                            .route(web::get().to(resource)),
                    ),
            );
    })
    .await;
    let client = http();
    for (path, expected) in [
        ("/plain/1", "app:1"),
        ("/scoped/1", "scope:1"),
        ("/scoped/inner/1", "res:1"),
    ] {
        let reply = get(&client, server.url(path)).await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (200, expected),
            "{path}"
        );
    }

    // The app fails fast; the scope waits for the holder.
    let other = redlock(&cluster, Duration::from_millis(100));
    let held = other.lock("app:7").await.unwrap();
    let reply = get(&client, server.url("/plain/7")).await;
    assert!(reply.is_problem(409), "{reply:?}");
    held.release().await.unwrap();

    let held = other.lock("scope:7").await.unwrap();
    // The release frees the lock at a majority of nodes, which may be before its call
    // returns: the answer must come after the release began, not after it returned.
    let releaser = async {
        actix_rt::time::sleep(Duration::from_millis(300)).await;
        let releasing = Instant::now();
        held.release().await.unwrap();
        releasing
    };
    let started = Instant::now();
    let (reply, releasing) = tokio::join!(get(&client, server.url("/scoped/7")), releaser);
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (200, "scope:7"),
        "{reply:?}"
    );
    assert!(reply.at >= releasing, "answered before the holder released");
    assert!(started.elapsed() >= Duration::from_millis(300));
    server.stop().await;
}
