//! redlock-actix against real actix-web servers (bound on loopback, several workers) and
//! real redis-server nodes: the extractor, the middleware, configuration lookup,
//! rejections, auto-extension and loss, and the per-worker runtimes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::body::BodyStream;
use actix_web::dev::{ServerHandle, ServiceRequest};
use actix_web::{App, HttpResponse, HttpServer, test as actix_test, web};
use redlock_actix::{
    BadKey, DistributedLock, DistributedLockConfig, LockHandle, LockHeader, LockHeaderName,
    LockMiddleware, Redlock,
};
use redlock_testkit::Cluster;
use redlock_testkit::Intervals;

// ---------------------------------------------------------------------------------------
// Plumbing: servers, a client, handlers.

/// An actix-web server on a free loopback port, running in the test's actix system.
struct Server {
    base: String,
    handle: ServerHandle,
}

impl Server {
    async fn start<F>(workers: usize, configure: F) -> Self
    where
        F: Fn(&mut web::ServiceConfig) + Send + Clone + 'static,
    {
        let server = HttpServer::new(move || App::new().configure(configure.clone()))
            .workers(workers)
            .disable_signals()
            .shutdown_timeout(1)
            .bind(("127.0.0.1", 0))
            .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Self {
            base: format!("http://{addr}"),
            handle,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn stop(self) {
        self.handle.stop(true).await;
    }
}

/// What a request got.
#[derive(Debug)]
struct Reply {
    status: u16,
    retry_after: Option<u64>,
    content_type: String,
    body: String,
    /// When the whole reply had arrived.
    at: Instant,
}

impl Reply {
    fn is_problem(&self, status: u16) -> bool {
        self.status == status
            && self.content_type == "application/problem+json"
            && self.body.contains(&format!("\"status\":{status}"))
    }
}

fn http() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish()
}

async fn send(client: &awc::Client, method: &str, url: String) -> Reply {
    let request = match method {
        "POST" => client.post(url),
        _ => client.get(url),
    };
    let mut response = request.send().await.expect("send");
    let text = |name| {
        response
            .headers()
            .get(name)
            .map(|v: &actix_web::http::header::HeaderValue| v.to_str().unwrap().to_owned())
    };
    let retry_after = text("retry-after").map(|v| v.parse().unwrap());
    let content_type = text("content-type").unwrap_or_default();
    let status = response.status().as_u16();
    let body = response.body().limit(1 << 20).await.expect("body");
    Reply {
        status,
        retry_after,
        content_type,
        body: String::from_utf8_lossy(&body).into_owned(),
        at: Instant::now(),
    }
}

async fn get(client: &awc::Client, url: String) -> Reply {
    send(client, "GET", url).await
}

/// Runs `f` for every item at once (on this thread) and collects the replies.
async fn all<I, F, Fut>(items: I, f: F) -> Vec<Reply>
where
    I: IntoIterator,
    F: Fn(I::Item) -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    futures_util::future::join_all(items.into_iter().map(f)).await
}

fn redlock(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    redlock_testkit::client(cluster, node_timeout)
}

#[derive(serde::Deserialize)]
struct Ms {
    ms: u64,
}

/// Which server a reply came from.
#[derive(Clone, Copy)]
struct Instance(usize);

/// Holds the order's lock for `ms`, recording the interval.
async fn hold(
    order: DistributedLock<web::Path<String>>,
    ms: web::Query<Ms>,
    log: web::Data<Intervals>,
    instance: web::Data<Instance>,
) -> HttpResponse {
    let start = Instant::now();
    actix_rt::time::sleep(Duration::from_millis(ms.ms)).await;
    let held = order.guard().is_held();
    let end = Instant::now();
    log.record(start, end, instance.0);
    HttpResponse::Ok().body(format!(
        "{} held={held} on {}",
        order.guard().resource(),
        std::thread::current().name().unwrap_or("?")
    ))
}

/// Runs for `ms`, checking every 20 ms that the lock is still held.
async fn long(order: DistributedLock<web::Path<String>>, ms: web::Query<Ms>) -> HttpResponse {
    let started = Instant::now();
    let mut checks = 0;
    while started.elapsed() < Duration::from_millis(ms.ms) {
        if !order.guard().is_held() {
            return HttpResponse::Ok().body(format!("lost after {:?}", started.elapsed()));
        }
        checks += 1;
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    HttpResponse::Ok().body(format!(
        "held throughout: {checks} checks, validity left {:?}",
        order.guard().validity()
    ))
}

/// Waits (up to 10 s) for the lock to be lost, and says what the guard shows then.
async fn until_lost(order: DistributedLock<web::Path<String>>) -> HttpResponse {
    let lost = tokio::time::timeout(Duration::from_secs(10), order.guard().lost())
        .await
        .is_ok();
    HttpResponse::Ok().body(format!(
        "lost={lost} held={} token_cancelled={}",
        order.guard().is_held(),
        order.guard().cancellation_token().is_cancelled()
    ))
}

/// The resource the middleware locked.
async fn handle_resource(lock: web::ReqData<LockHandle>) -> HttpResponse {
    HttpResponse::Ok().body(lock.resource().to_owned())
}

/// The resource the extractor locked.
async fn resource(order: DistributedLock<web::Path<String>>) -> HttpResponse {
    HttpResponse::Ok().body(order.guard().resource().to_owned())
}

fn holding_routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/orders/{id}/hold", web::post().to(hold))
        .route("/orders/{id}/long", web::post().to(long))
        .route("/orders/{id}/until-lost", web::post().to(until_lost));
}

/// A server with the hold routes, `config`, `log`, and `instance`.
async fn holding_server(
    workers: usize,
    config: DistributedLockConfig,
    log: &Arc<Intervals>,
    instance: usize,
) -> Server {
    let log = web::Data::from(Arc::clone(log));
    Server::start(workers, move |cfg| {
        cfg.app_data(config.clone())
            .app_data(log.clone())
            .app_data(web::Data::new(Instance(instance)))
            .configure(holding_routes);
    })
    .await
}

// ---------------------------------------------------------------------------------------
// Two replicas sharing the nodes.

/// Two app instances (each its own client, like two replicas) on the same nodes: the same
/// key never runs twice at once; a busy key is 409 with `Retry-After`; different keys run
/// in parallel.
#[actix_rt::test]
async fn two_instances_serialize_a_key_answer_409_and_run_other_keys_in_parallel() {
    let cluster = Cluster::start(3).await;
    let log = Arc::new(Intervals::default());
    let config = |cluster: &Cluster| {
        DistributedLockConfig::new(redlock(cluster, Duration::from_millis(100)))
            .ttl(Duration::from_secs(2))
            .key_prefix("order:")
    };
    let a = holding_server(2, config(&cluster), &log, 0).await;
    let b = holding_server(2, config(&cluster), &log, 1).await;
    let client = http();

    // Same key: waves of 8 concurrent requests, half to each instance.
    let mut replies = Vec::new();
    for _ in 0..5 {
        let wave = all(0..8, |i| {
            let server = if i % 2 == 0 { &a } else { &b };
            let url = server.url("/orders/42/hold?ms=150");
            let client = &client;
            async move { send(client, "POST", url).await }
        })
        .await;
        replies.extend(wave);
    }
    let ok: Vec<&Reply> = replies.iter().filter(|r| r.status == 200).collect();
    let busy: Vec<&Reply> = replies.iter().filter(|r| r.status == 409).collect();
    assert_eq!(ok.len() + busy.len(), replies.len(), "{replies:#?}");
    assert!(ok.len() >= 2, "too few holders to compare: {replies:#?}");
    assert!(
        busy.len() >= 5 * 4,
        "waves of 8 must mostly be refused: {replies:#?}"
    );
    assert!(ok.iter().all(|r| r.body.contains("order:42 held=true")));
    for reply in &busy {
        assert!(reply.is_problem(409), "{reply:?}");
        let secs = reply.retry_after.expect("409 carries Retry-After");
        assert!((1..=2).contains(&secs), "Retry-After {secs} for a 2 s TTL");
    }
    assert_eq!(log.len(), ok.len());
    assert!(
        log.overlaps().is_empty(),
        "overlapping holds: {:?}",
        log.overlaps()
    );

    // Different keys: 8 holds of 600 ms at once, all granted, together.
    let started = Instant::now();
    let parallel = all(0..8, |i| {
        let server = if i % 2 == 0 { &a } else { &b };
        let url = server.url(&format!("/orders/{i}/hold?ms=600"));
        let client = &client;
        async move { send(client, "POST", url).await }
    })
    .await;
    let elapsed = started.elapsed();
    assert!(parallel.iter().all(|r| r.status == 200), "{parallel:#?}");
    assert!(
        elapsed < Duration::from_millis(8 * 600 / 2),
        "8 different keys took {elapsed:?}: not run in parallel"
    );
    a.stop().await;
    b.stop().await;
}

/// Wait mode: queued requests for one key (on two instances) all succeed, one after the
/// other; a request still waiting at the deadline gets 409.
#[actix_rt::test]
async fn wait_mode_serializes_queued_requests_and_gives_up_at_the_deadline() {
    let cluster = Cluster::start(3).await;
    let log = Arc::new(Intervals::default());
    let config = |cluster: &Cluster| {
        DistributedLockConfig::new(redlock(cluster, Duration::from_millis(100)))
            .ttl(Duration::from_secs(2))
            .wait(Duration::from_secs(15))
    };
    let a = holding_server(2, config(&cluster), &log, 0).await;
    let b = holding_server(2, config(&cluster), &log, 1).await;
    let client = http();

    let started = Instant::now();
    let replies = all(0..10, |i| {
        let server = if i % 2 == 0 { &a } else { &b };
        let url = server.url("/orders/7/hold?ms=100");
        let client = &client;
        async move { send(client, "POST", url).await }
    })
    .await;
    let elapsed = started.elapsed();
    assert!(replies.iter().all(|r| r.status == 200), "{replies:#?}");
    assert_eq!(log.len(), 10);
    assert!(
        log.overlaps().is_empty(),
        "overlapping holds: {:?}",
        log.overlaps()
    );
    assert!(
        elapsed >= Duration::from_millis(10 * 100),
        "{elapsed:?}: not serialized"
    );

    // Past the deadline: another replica holds the key for longer than we wait.
    let short = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(100)))
        .wait(Duration::from_millis(400));
    let c = holding_server(1, short, &log, 2).await;
    let other = redlock(&cluster, Duration::from_millis(100));
    let held = other.lock("7").ttl(Duration::from_secs(3)).await.unwrap();
    let started = Instant::now();
    let reply = post(&client, c.url("/orders/7/hold?ms=1")).await;
    let waited = started.elapsed();
    assert!(reply.is_problem(409), "{reply:?}");
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_millis(2500),
        "gave up after {waited:?}, the deadline is 400 ms"
    );
    let secs = reply.retry_after.unwrap();
    assert!(
        (1..=3).contains(&secs),
        "Retry-After {secs}: the holder has under 3 s left"
    );
    held.release().await.unwrap();
    assert_eq!(
        post(&client, c.url("/orders/7/hold?ms=1")).await.status,
        200
    );
    for server in [a, b, c] {
        server.stop().await;
    }
}

async fn post(client: &awc::Client, url: String) -> Reply {
    send(client, "POST", url).await
}

// ---------------------------------------------------------------------------------------
// Auto-extension and loss.

/// A handler running 5x the TTL keeps its lock all along (the other instance gets 409
/// throughout); when a majority of nodes is paused, the handler sees the loss through
/// its guard.
#[actix_rt::test]
async fn a_handler_keeps_its_lock_for_five_ttls_and_sees_its_loss() {
    let cluster = Cluster::start(5).await;
    let ttl = Duration::from_millis(400);
    let log = Arc::new(Intervals::default());
    let config = |cluster: &Cluster| {
        DistributedLockConfig::new(redlock(cluster, Duration::from_millis(50))).ttl(ttl)
    };
    let a = holding_server(2, config(&cluster), &log, 0).await;
    let b = holding_server(2, config(&cluster), &log, 1).await;
    let client = http();

    let long_url = a.url(&format!("/orders/9/long?ms={}", (ttl * 5).as_millis()));
    let (held, refused) = tokio::join!(post(&client, long_url.clone()), async {
        actix_rt::time::sleep(Duration::from_millis(100)).await;
        let mut refused = Vec::new();
        for _ in 0..8 {
            refused.push(post(&client, b.url("/orders/9/hold?ms=1")).await);
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
        refused
    });
    assert_eq!(held.status, 200);
    assert!(held.body.starts_with("held throughout"), "{}", held.body);
    for reply in &refused {
        assert!(
            reply.is_problem(409) || reply.at > held.at,
            "another instance got the lock while it was held: {reply:?}"
        );
    }
    assert!(
        refused.iter().filter(|r| r.status == 409).count() >= 6,
        "{refused:#?}"
    );
    assert_eq!(
        post(&client, b.url("/orders/9/hold?ms=1")).await.status,
        200
    );

    // Loss: the handler waits on `lost()`; pause 3 of the 5 nodes.
    let (lost, paused_at) = tokio::join!(post(&client, a.url("/orders/10/until-lost")), async {
        actix_rt::time::sleep(ttl).await;
        for i in 0..3 {
            cluster.node(i).pause();
        }
        Instant::now()
    });
    for i in 0..3 {
        cluster.node(i).resume();
    }
    assert_eq!(lost.status, 200);
    assert_eq!(lost.body, "lost=true held=false token_cancelled=true");
    let noticed = lost.at - paused_at;
    assert!(
        noticed < ttl * 3,
        "the loss reached the handler {noticed:?} after the pause"
    );
    a.stop().await;
    b.stop().await;
}

// ---------------------------------------------------------------------------------------
// Faults.

/// Every node down: 503 (problem+json, Retry-After) within the per-node timeout, for
/// hung nodes (paused, also on a client that never connected) and dead ones.
#[actix_rt::test]
async fn all_nodes_down_is_503_within_the_node_timeout() {
    let mut cluster = Cluster::start(3).await;
    let node_timeout = Duration::from_millis(200);
    let log = Arc::new(Intervals::default());
    let config = |cluster: &Cluster| {
        DistributedLockConfig::new(redlock(cluster, node_timeout)).ttl(Duration::from_secs(2))
    };
    let warm = holding_server(1, config(&cluster), &log, 0).await;
    let client = http();
    assert_eq!(
        post(&client, warm.url("/orders/1/hold?ms=1")).await.status,
        200
    );

    for i in 0..3 {
        cluster.node(i).pause();
    }
    let cold = holding_server(1, config(&cluster), &log, 1).await;
    for server in [&warm, &cold] {
        let started = Instant::now();
        let reply = post(&client, server.url("/orders/1/hold?ms=1")).await;
        let took = started.elapsed();
        assert!(reply.is_problem(503), "{reply:?}");
        assert!(reply.body.contains("no quorum"), "{}", reply.body);
        assert_eq!(reply.retry_after, Some(1));
        assert!(
            took < node_timeout + Duration::from_millis(800),
            "503 after {took:?}"
        );
    }
    for i in 0..3 {
        cluster.node(i).resume();
    }

    for i in 0..3 {
        cluster.node_mut(i).kill();
    }
    let started = Instant::now();
    let reply = post(&client, warm.url("/orders/1/hold?ms=1")).await;
    assert!(reply.is_problem(503), "{reply:?}");
    assert!(started.elapsed() < node_timeout + Duration::from_millis(800));
    warm.stop().await;
    cold.stop().await;
}

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
/// configuration, and a custom error handler.
#[actix_rt::test]
async fn missing_config_is_500_and_inner_extractor_errors_keep_their_responses() {
    let cluster = Cluster::start(1).await;
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(100)))
        .key_prefix("o:")
        .max_key_len(8);
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
                    .app_data(config.clone().error_handler(|err, _req| {
                        let teapot = HttpResponse::ImATeapot().body(format!("custom: {err}"));
                        actix_web::error::InternalError::from_response(err, teapot).into()
                    }))
                    .route("/named/{id}", web::get().to(resource)),
            )
            .service(
                // No app_data: the middleware's own configuration.
                web::scope("/explicit/{id}")
                    .wrap(LockMiddleware::path_param("id").with_config(config.clone()))
                    .route("", web::get().to(handle_resource)),
            )
            .service(
                web::scope("/closure/{id}")
                    .app_data(config.clone())
                    .wrap(LockMiddleware::new(|req: &ServiceRequest| {
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
                        Ok((tenant, id))
                    }))
                    .route("", web::get().to(handle_resource)),
            )
            .service(
                web::scope("/by-header")
                    .app_data(web::Data::new(config.clone())) // found in web::Data too
                    .wrap(LockMiddleware::header("idempotency-key"))
                    .route("", web::post().to(handle_resource)),
            )
            .route("/bare/{id}", web::get().to(by_number))
            .service(
                web::scope("/wrapped/{id}")
                    .wrap(LockMiddleware::path_param("id"))
                    .route("", web::get().to(HttpResponse::Ok)),
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

    // Missing configuration: 500, with the type to register.
    for uri in ["/bare/1", "/wrapped/1"] {
        let (status, content_type, body) = call(actix_test::TestRequest::get().uri(uri)).await;
        assert_eq!(status, 500, "{uri}: {body}");
        assert_eq!(content_type, problem);
        assert!(body.contains("DistributedLockConfig"), "{body}");
        assert!(body.contains("app_data"), "{body}");
    }

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

    // A custom error handler decides the answer.
    let (status, _, body) =
        call(actix_test::TestRequest::get().uri("/custom/named/toolongkey")).await;
    assert_eq!(status, 418, "{body}");
    assert!(
        body.starts_with("custom: the lock key is 10 bytes long"),
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
    assert!(body.contains("more than the 8 allowed"), "{body}");
}

/// A scope's configuration overrides the app's, and a resource's the scope's: the
/// prefix and the wait policy both change.
#[actix_rt::test]
async fn scope_and_resource_configs_override_the_apps() {
    let cluster = Cluster::start(3).await;
    let shared = redlock(&cluster, Duration::from_millis(100));
    let app_config = DistributedLockConfig::new(shared.clone()).key_prefix("app:");
    let scope_config = DistributedLockConfig::new(shared.clone())
        .key_prefix("scope:")
        .wait(Duration::from_secs(5));
    let resource_config = DistributedLockConfig::new(shared.clone()).key_prefix("res:");
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
    let releaser = async {
        actix_rt::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap();
        Instant::now()
    };
    let started = Instant::now();
    let (reply, released_at) = tokio::join!(get(&client, server.url("/scoped/7")), releaser);
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (200, "scope:7"),
        "{reply:?}"
    );
    assert!(
        reply.at >= released_at,
        "answered before the holder released"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    server.stop().await;
}

// ---------------------------------------------------------------------------------------
// The middleware, and bodies that hold the lock.

async fn scoped(lock: web::ReqData<LockHandle>, ms: web::Query<Ms>) -> HttpResponse {
    actix_rt::time::sleep(Duration::from_millis(ms.ms)).await;
    HttpResponse::Ok().body(format!("{} held={}", lock.resource(), lock.is_held()))
}

/// A body of `n` chunks, one every `every`.
fn slow_body(
    n: u64,
    every: Duration,
) -> BodyStream<impl futures_util::Stream<Item = Result<web::Bytes, std::convert::Infallible>>> {
    BodyStream::new(futures_util::stream::unfold(0, move |i| async move {
        if i == n {
            return None;
        }
        actix_rt::time::sleep(every).await;
        Some((Ok(web::Bytes::from(format!("chunk {i}\n"))), i + 1))
    }))
}

async fn streamed(ms: web::Query<Ms>) -> HttpResponse {
    HttpResponse::Ok().body(slow_body(4, Duration::from_millis(ms.ms)))
}

/// The extractor's guard moved into a streaming body.
async fn export(lock: DistributedLock<web::Path<String>>) -> HttpResponse {
    let (_, guard) = lock.into_parts();
    HttpResponse::Ok().body(guard.hold_during(slow_body(4, Duration::from_millis(150))))
}

/// Issues a GET and returns as soon as the headers are in, with the body still to read.
async fn headers_only(
    client: &awc::Client,
    url: String,
) -> awc::ClientResponse<
    impl futures_util::Stream<Item = Result<web::Bytes, awc::error::PayloadError>>,
> {
    client.get(url).send().await.expect("send")
}

/// `wrap(LockMiddleware)` locks a whole scope by its path parameter: same key → 409
/// while a request (and its streaming body) runs, other keys free; handlers see the
/// lock. The extractor's guard moved into a streaming body holds the lock likewise.
#[actix_rt::test]
async fn middleware_locks_a_scope_and_bodies_keep_the_lock_until_sent() {
    let cluster = Cluster::start(3).await;
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(100)))
        .ttl(Duration::from_secs(2))
        .key_prefix("account:");
    let server = Server::start(2, move |cfg| {
        cfg.app_data(config.clone())
            .service(
                web::scope("/accounts/{id}")
                    .wrap(LockMiddleware::path_param("id"))
                    .route("/slow", web::get().to(scoped))
                    .route("/fast", web::get().to(scoped))
                    .route("/stream", web::get().to(streamed)),
            )
            .route("/export/{id}", web::get().to(export));
    })
    .await;
    let client = http();

    // Two routes of one scope share the lock; another account does not.
    let (slow, (same, other)) =
        tokio::join!(get(&client, server.url("/accounts/1/slow?ms=600")), async {
            actix_rt::time::sleep(Duration::from_millis(150)).await;
            tokio::join!(
                get(&client, server.url("/accounts/1/fast?ms=0")),
                get(&client, server.url("/accounts/2/fast?ms=0"))
            )
        });
    assert_eq!(
        (slow.status, slow.body.as_str()),
        (200, "account:1 held=true")
    );
    assert!(same.is_problem(409), "{same:?}");
    assert!(same.retry_after.is_some());
    assert_eq!(
        (other.status, other.body.as_str()),
        (200, "account:2 held=true")
    );
    let after = get(&client, server.url("/accounts/1/fast?ms=0")).await;
    assert_eq!(after.status, 200, "released after the response: {after:?}");

    // A streaming body keeps the lock until its last chunk: middleware, then extractor.
    for (stream, probe) in [
        ("/accounts/3/stream?ms=150", "/accounts/3/fast?ms=0"),
        ("/export/3", "/accounts/3/fast?ms=0"),
    ] {
        // Both lock "account:3" (the same prefix, key "3").
        let mut response = headers_only(&client, server.url(stream)).await;
        assert_eq!(response.status(), 200);
        actix_rt::time::sleep(Duration::from_millis(100)).await;
        let during = get(&client, server.url(probe)).await;
        assert!(
            during.is_problem(409),
            "{stream}: free while streaming: {during:?}"
        );
        let body = response.body().await.unwrap();
        assert_eq!(body.iter().filter(|b| **b == b'\n').count(), 4);
        // The release follows the last chunk in the background: allow it a moment.
        let mut free = get(&client, server.url(probe)).await;
        for _ in 0..20 {
            if free.status == 200 {
                break;
            }
            actix_rt::time::sleep(Duration::from_millis(25)).await;
            free = get(&client, server.url(probe)).await;
        }
        assert_eq!(
            free.status, 200,
            "{stream}: still locked after the body: {free:?}"
        );
    }
    server.stop().await;
}

// ---------------------------------------------------------------------------------------
// actix's per-worker runtimes.

/// One `Redlock` shared by every worker of a multi-worker server: requests on several
/// workers lock and release; a handler holds its lock for 5 TTLs. Then the server stops
/// (its workers' runtimes end) and a new one starts with the same configuration: its
/// first request gets the lock (not a 503 from connections that died with the old
/// workers) and auto-extension still runs.
#[actix_rt::test]
async fn one_client_serves_every_worker_and_survives_a_server_restart() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(400);
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(50))).ttl(ttl);
    let log = Arc::new(Intervals::default());
    let client = http();
    let five_ttls = format!("ms={}", (ttl * 5).as_millis());

    let first = holding_server(2, config.clone(), &log, 0).await;
    let replies = all(0..8, |i| {
        let url = first.url(&format!("/orders/w{i}/hold?ms=200"));
        let client = &client;
        async move { post(client, url).await }
    })
    .await;
    assert!(replies.iter().all(|r| r.status == 200), "{replies:#?}");
    let workers: std::collections::HashSet<&str> = replies
        .iter()
        .filter_map(|r| r.body.split(" on ").nth(1))
        .collect();
    assert!(
        workers.len() >= 2,
        "all requests ran on one worker: {workers:?}"
    );
    let long = post(&client, first.url(&format!("/orders/x/long?{five_ttls}"))).await;
    assert!(long.body.starts_with("held throughout"), "{}", long.body);
    first.stop().await;

    let second = holding_server(2, config.clone(), &log, 1).await;
    let reply = post(&client, second.url("/orders/y/hold?ms=1")).await;
    assert_eq!(
        reply.status, 200,
        "first request after the restart: {reply:?}"
    );
    let long = post(&client, second.url(&format!("/orders/x/long?{five_ttls}"))).await;
    assert!(long.body.starts_with("held throughout"), "{}", long.body);
    // And the lock taken there is released: another client gets it at once.
    let other = redlock(&cluster, Duration::from_millis(50));
    let mut free = other.try_lock("x").await;
    for _ in 0..20 {
        if free.is_ok() {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(25)).await;
        free = other.try_lock("x").await;
    }
    assert!(free.is_ok(), "not released: {free:?}");
    second.stop().await;
}
