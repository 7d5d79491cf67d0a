//! The middleware's options that redlock-tower's layer has too, against real
//! redis-server nodes: `abort_on_loss` (a lock lost while the handler runs stops it
//! with 503) and `hold(Hold::UntilHead)` (the lock is released once the response head is
//! ready, while the body still streams).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::convert::Infallible;

use common::*;
use redlock_actix::Hold;
use redlock_actix::LockOptions;
use tokio::sync::Notify;

/// Polls `check` until it holds; panics after 20 s (a loaded machine is slow, never
/// that slow).
async fn wait_for<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within 20 s");
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A majority of nodes cut off while the handler runs: the lock is lost, and with
/// `abort_on_loss` the handler is dropped and the client gets a 503 problem long before
/// the handler would have answered.
#[actix_rt::test]
async fn a_lock_lost_while_the_handler_runs_stops_it_with_503() {
    let cluster = Arc::new(Cluster::start_proxied(3).await);
    let redlock = redlock_testkit::builder(&cluster)
        .node_timeout(Duration::from_millis(100))
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let config = DistributedLockConfig::new(redlock).options(
        LockOptions::new()
            .resource_prefix("abort:")
            .abort_on_loss(true),
    );
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::clone(&finished);
    let server = Server::start(1, move |cfg| {
        let done = Arc::clone(&done);
        cfg.service(
            web::scope("/slow/{id}")
                .app_data(config.clone())
                .wrap(LockMiddleware::path_param(config.clone(), "id"))
                .route(
                    "",
                    web::post().to(move || {
                        let done = Arc::clone(&done);
                        async move {
                            // Far longer than the test waits.
                            actix_rt::time::sleep(Duration::from_secs(120)).await;
                            done.store(true, std::sync::atomic::Ordering::SeqCst);
                            HttpResponse::Ok().finish()
                        }
                    }),
                ),
        );
    })
    .await;
    let url = server.url("/slow/1");
    let request = actix_rt::spawn(async move { send(&http(), "POST", url).await });
    // The lock is held once its key is on a majority of the nodes (the last node's `SET`
    // may land later, or never); then a majority goes away.
    wait_for("the lock on a majority of the nodes", || {
        let cluster = Arc::clone(&cluster);
        async move { cluster.count_keys("redlock:{abort:*").await >= cluster.majority() }
    })
    .await;
    cluster.proxy(1).cut();
    cluster.proxy(2).cut();
    let reply = request.await.unwrap();
    assert!(reply.is_problem(503), "{reply:?}");
    assert_eq!(reply.retry_after, Some(1));
    assert!(reply.body.contains("lost"), "{reply:?}");
    assert!(!finished.load(std::sync::atomic::Ordering::SeqCst));
    server.stop().await;
}

/// With `Hold::UntilHead` the lock is released as soon as the handler's response is
/// ready: its key leaves the nodes while the body is still being produced.
#[actix_rt::test]
async fn until_head_releases_before_the_body_ends() {
    let cluster = Arc::new(Cluster::start(3).await);
    let config = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(200))).options(
        LockOptions::new()
            .resource_prefix("head:")
            .hold(Hold::UntilHead),
    );
    let body_may_end = Arc::new(Notify::new());
    let signal = Arc::clone(&body_may_end);
    let server = Server::start(1, move |cfg| {
        let signal = Arc::clone(&signal);
        cfg.service(
            web::scope("/export/{id}")
                .app_data(config.clone())
                .wrap(LockMiddleware::path_param(config.clone(), "id"))
                .route(
                    "",
                    web::post().to(move || {
                        let signal = Arc::clone(&signal);
                        async move {
                            let rows = futures_util::stream::once(async move {
                                signal.notified().await;
                                Ok::<_, Infallible>(web::Bytes::from("rows"))
                            });
                            HttpResponse::Ok().body(BodyStream::new(rows))
                        }
                    }),
                ),
        );
    })
    .await;
    let client = http();
    let mut response = client.post(server.url("/export/1")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    // The head is here, the body is not: the lock is gone already.
    wait_for("the lock released", || {
        let cluster = Arc::clone(&cluster);
        async move { cluster.count_keys("redlock:{head:*").await == 0 }
    })
    .await;
    body_may_end.notify_one();
    let body = response.body().await.unwrap();
    assert_eq!(body, "rows");
    server.stop().await;
}
