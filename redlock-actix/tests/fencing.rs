//! `FencingToken` as a handler's argument, against real actix-web servers and
//! redis-server nodes: with a `DistributedLock` in the same handler (either order) or
//! under `LockMiddleware`, with fencing on, the handler gets the lock's token, rising
//! from one request to the next; the lock's own refusal wins over the token's; a route
//! without a lock and a lock without fencing are refused before the handler runs, with a
//! problem body that names no settings and a log line that does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use redlock_actix::FencingToken;
use redlock_actix::LockOptions;

/// The token after the lock.
async fn after(order: DistributedLock<web::Path<String>>, token: FencingToken) -> HttpResponse {
    HttpResponse::Ok().body(format!("{} {}", order.guard().resource(), token.0))
}

/// The token before the lock: it waits for the lock all the same.
async fn before(token: FencingToken, order: DistributedLock<web::Path<String>>) -> HttpResponse {
    assert_eq!(order.guard().fencing_token(), Some(token.0));
    HttpResponse::Ok().body(format!("{} {}", order.guard().resource(), token.0))
}

/// The token alone: under the middleware, or under no lock at all.
async fn alone(token: FencingToken, calls: web::Data<AtomicUsize>) -> HttpResponse {
    calls.fetch_add(1, Ordering::SeqCst);
    HttpResponse::Ok().body(format!("token {}", token.0))
}

fn routes(config: DistributedLockConfig) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| routes_with(cfg, config)
}

fn routes_with(cfg: &mut web::ServiceConfig, config: DistributedLockConfig) {
    cfg.app_data(web::Data::new(AtomicUsize::new(0)))
        .route("/after/{id}", web::post().to(after))
        .route("/before/{id}", web::post().to(before))
        .route("/bare", web::post().to(alone))
        .service(
            web::scope("/accounts/{id}")
                .wrap(LockMiddleware::path_param(config, "id"))
                .route("/deposit", web::post().to(alone)),
        );
}

/// `POST` with a request id.
async fn call(client: &awc::Client, url: String, id: &str) -> Reply {
    let mut response = client
        .post(url)
        .insert_header(("x-request-id", id))
        .send()
        .await
        .expect("send");
    let header = |name| {
        response
            .headers()
            .get(name)
            .map(|v: &actix_web::http::header::HeaderValue| v.to_str().unwrap().to_owned())
    };
    let retry_after = header("retry-after").map(|v| v.parse().unwrap());
    let content_type = header("content-type").unwrap_or_default();
    let body = response.body().await.expect("body");
    Reply {
        status: response.status().as_u16(),
        retry_after,
        content_type,
        body: String::from_utf8_lossy(&body).into_owned(),
        at: Instant::now(),
    }
}

/// The token in a `"{resource} {token}"` body, checking the resource.
fn token_of(reply: &Reply, resource: &str) -> u64 {
    assert_eq!(reply.status, 200, "{}", reply.body);
    let (got, token) = reply.body.rsplit_once(' ').unwrap();
    assert_eq!(got, resource);
    token.parse().unwrap()
}

/// The captured log line of the refusal of request `id`.
fn log_line(id: &str) -> String {
    let logs = redlock_testkit::logs::text();
    logs.lines()
        .find(|line| line.contains(id))
        .unwrap_or_else(|| panic!("no log line for {id} in:\n{logs}"))
        .to_owned()
}

/// A 500 problem for request `id` whose body says `says` and names none of the
/// settings, with the log line naming `hint`.
fn assert_misconfigured(reply: &Reply, id: &str, says: &str, hint: &str) {
    assert!(reply.is_problem(500), "{reply:?}");
    assert_eq!(reply.retry_after, None);
    let body = &reply.body;
    assert!(
        body.contains(r#""type":"urn:redlock:misconfigured""#),
        "{body}"
    );
    assert!(body.contains(says), "{body}");
    assert!(body.contains(&format!(r#""request_id":"{id}""#)), "{body}");
    for internal in [
        "LockMiddleware",
        "DistributedLock",
        "fencing(true)",
        "order:",
        "127.0.0.1",
    ] {
        assert!(!body.contains(internal), "{internal} in the body: {body}");
    }
    let line = log_line(id);
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(hint), "{line}");
}

#[actix_rt::test]
async fn handlers_get_the_locks_rising_tokens_from_the_extractor_and_the_middleware() {
    redlock_testkit::logs::capture("redlock_actix=debug,redlock_http=debug,redlock_core=warn");
    let cluster = Cluster::start(3).await;
    // A request may come before the previous one's lock is released (just after its
    // handler returned): it waits for the lock.
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(200))).options(
        LockOptions::new()
            .resource_prefix("order:")
            .fencing(true)
            .wait(Duration::from_secs(2)),
    );
    let server = Server::start(2, move |cfg| {
        cfg.app_data(config.clone())
            .configure(routes(config.clone()));
    })
    .await;
    let client = http();

    // The extractor's lock, the token listed after it or before it: one counter per
    // resource, rising with every acquisition.
    let mut last = 0;
    for path in ["/after/42", "/before/42", "/after/42", "/before/42"] {
        let reply = call(&client, server.url(path), "rise").await;
        let token = token_of(&reply, "order:42");
        assert!(token > last, "{path}: token {token} after {last}");
        last = token;
    }

    // The middleware's lock.
    let first = call(&client, server.url("/accounts/7/deposit"), "mw-1").await;
    let second = call(&client, server.url("/accounts/7/deposit"), "mw-2").await;
    let token = |reply: &Reply| -> u64 {
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.body.strip_prefix("token ").unwrap().parse().unwrap()
    };
    assert!(token(&second) > token(&first), "{first:?} then {second:?}");
    server.stop().await;
}

/// The token listed before a lock that is busy: the client gets the lock's 409, not a
/// 500 for a missing token (the token waited for the lock's outcome).
#[actix_rt::test]
async fn a_busy_lock_is_a_409_whatever_the_arguments_order() {
    let cluster = Cluster::start(1).await;
    let redlock = redlock(&cluster, Duration::from_millis(200));
    let config = DistributedLockConfig::new(redlock.clone())
        .options(LockOptions::new().resource_prefix("order:").fencing(true));
    let server = Server::start(1, move |cfg| {
        cfg.app_data(config.clone())
            .configure(routes(config.clone()));
    })
    .await;
    let client = http();

    let held = redlock.lock("order:9").await.unwrap();
    for path in ["/before/9", "/after/9"] {
        let reply = call(&client, server.url(path), "busy").await;
        assert!(reply.is_problem(409), "{path}: {reply:?}");
        assert!(reply.retry_after.is_some(), "{path}: {reply:?}");
    }
    held.release().await.unwrap();
    let reply = call(&client, server.url("/before/9"), "free").await;
    token_of(&reply, "order:9");
    server.stop().await;
}

#[actix_rt::test]
async fn a_route_without_a_lock_is_a_500_naming_the_middleware_in_the_log() {
    redlock_testkit::logs::capture("redlock_actix=debug,redlock_http=debug,redlock_core=warn");
    let cluster = Cluster::start(1).await;
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(200)))
        .options(LockOptions::new().resource_prefix("order:").fencing(true));
    let calls = web::Data::new(AtomicUsize::new(0));
    let server = {
        let calls = calls.clone();
        Server::start(1, move |cfg| {
            cfg.app_data(config.clone())
                .app_data(calls.clone())
                .route("/bare", web::post().to(alone));
        })
        .await
    };

    let id = "no-lock-1";
    let reply = call(&http(), server.url("/bare"), id).await;
    assert_misconfigured(
        &reply,
        id,
        "no lock was taken for this request",
        "LockMiddleware",
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler ran");
    server.stop().await;
}

#[actix_rt::test]
async fn a_lock_without_fencing_is_a_500_naming_the_fencing_switch_in_the_log() {
    redlock_testkit::logs::capture("redlock_actix=debug,redlock_http=debug,redlock_core=warn");
    let cluster = Cluster::start(1).await;
    // The test kit's client has fencing off; so does the configuration, explicitly.
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(200)))
        .options(LockOptions::new().resource_prefix("order:").fencing(false));
    let server = Server::start(1, move |cfg| {
        cfg.app_data(config.clone())
            .configure(routes(config.clone()));
    })
    .await;
    let client = http();

    for (path, id) in [
        ("/after/5", "fencing-off-extractor"),
        ("/accounts/5/deposit", "fencing-off-middleware"),
    ] {
        let reply = call(&client, server.url(path), id).await;
        assert_misconfigured(
            &reply,
            id,
            "configured without fencing tokens",
            "LockOptions::fencing(true)",
        );
    }
    server.stop().await;
}
