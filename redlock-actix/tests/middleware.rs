//! redlock-actix's middleware and bodies that hold the lock, and actix's per-worker
//! runtimes, against real actix-web servers and redis-server nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;
use redlock_actix::LockOptions;

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
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(100))).options(
        LockOptions::new()
            .ttl(Duration::from_secs(2))
            .resource_prefix("account:"),
    );
    let server = Server::start(2, move |cfg| {
        cfg.app_data(config.clone())
            .service(
                web::scope("/accounts/{id}")
                    .wrap(LockMiddleware::path_param(config.clone(), "id"))
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
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(50)))
        .options(LockOptions::new().ttl(ttl));
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
