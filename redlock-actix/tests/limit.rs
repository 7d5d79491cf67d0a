//! redlock-actix's `ConcurrencyLimit`: at most `k` concurrent requests per key across
//! replicas, against real actix-web servers (each with its own lock client) and
//! redis-server nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::*;
use redlock_actix::ConcurrencyLimit;
use redlock_actix::extract::KeyExtractor;

/// How many handlers run at once, across every replica of the process.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    ran: AtomicUsize,
}

impl Gauge {
    fn max(&self) -> usize {
        self.max.load(SeqCst)
    }

    fn ran(&self) -> usize {
        self.ran.load(SeqCst)
    }
}

/// Counts itself in the gauge for `ms`.
async fn work(gauge: web::Data<Gauge>, ms: web::Query<Ms>) -> HttpResponse {
    let now = gauge.now.fetch_add(1, SeqCst) + 1;
    gauge.max.fetch_max(now, SeqCst);
    actix_rt::time::sleep(Duration::from_millis(ms.ms)).await;
    gauge.now.fetch_sub(1, SeqCst);
    gauge.ran.fetch_add(1, SeqCst);
    HttpResponse::Ok().body("done")
}

/// `n` replicas, each a server with a lock client of its own, routing
/// `/work/{key}/run?ms=` through `limit(its client)` to [`work`].
async fn replicas<K: KeyExtractor>(
    cluster: &Cluster,
    n: usize,
    gauge: &web::Data<Gauge>,
    limit: fn(Redlock) -> ConcurrencyLimit<K>,
) -> Vec<Server> {
    let mut servers = Vec::new();
    for _ in 0..n {
        let redlock = redlock(cluster, Duration::from_millis(200));
        let gauge = gauge.clone();
        servers.push(
            Server::start(1, move |cfg| {
                cfg.app_data(gauge.clone()).service(
                    web::scope("/work/{key}")
                        .wrap(limit(redlock.clone()))
                        .route("/run", web::get().to(work)),
                );
            })
            .await,
        );
    }
    servers
}

async fn stop(servers: Vec<Server>) {
    for server in servers {
        server.stop().await;
    }
}

fn limit_3_fail_fast(redlock: Redlock) -> ConcurrencyLimit<redlock_actix::extract::PathParam> {
    ConcurrencyLimit::path_param(redlock, "key", 3)
        .resource_prefix("limit:")
        .ttl(Duration::from_secs(2))
}

fn limit_3_waiting(redlock: Redlock) -> ConcurrencyLimit<redlock_actix::extract::PathParam> {
    limit_3_fail_fast(redlock).wait(Duration::from_secs(10))
}

/// 50 requests for one key over 4 replicas with a limit of 3 (fail fast): never more
/// than 3 handlers at once, 3 reached; every other request is answered 429 with
/// `Retry-After` and a problem body, without running the handler. The permits are given
/// back afterwards.
#[actix_rt::test]
async fn fifty_requests_over_four_replicas_run_at_most_three_at_once() {
    let cluster = Cluster::start(3).await;
    let gauge = web::Data::new(Gauge::default());
    let servers = replicas(&cluster, 4, &gauge, limit_3_fail_fast).await;
    let client = http();

    // Spread over 200 ms, while the first three hold for 400 ms: whatever happens to
    // the first racers, three permits are held before the last requests arrive.
    let replies = all(0..50u64, |i| {
        let url = servers[i as usize % 4].url("/work/a/run?ms=400");
        let client = &client;
        async move {
            actix_rt::time::sleep(Duration::from_millis(i * 4)).await;
            get(client, url).await
        }
    })
    .await;

    let ok = replies.iter().filter(|r| r.status == 200).count();
    let busy: Vec<_> = replies.iter().filter(|r| r.status == 429).collect();
    assert_eq!(ok + busy.len(), 50, "{replies:?}");
    assert!(gauge.max() <= 3, "{} handlers at once", gauge.max());
    assert_eq!(gauge.max(), 3, "the limit was never reached");
    assert_eq!(gauge.ran(), ok);
    assert!(
        ok >= 3 && busy.len() >= 40,
        "{ok} ran, {} refused",
        busy.len()
    );
    for reply in &busy {
        assert!(reply.is_problem(429), "{reply:?}");
        assert!(
            matches!(reply.retry_after, Some(1..=2)),
            "{:?}",
            reply.retry_after
        );
        assert!(!reply.body.contains("limit:a"), "{}", reply.body);
    }

    // The permits were given back: three at once run again.
    let replies = all(0..3usize, |i| {
        get(&client, servers[i].url("/work/a/run?ms=50"))
    })
    .await;
    assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    stop(servers).await;
}

/// The same 50 requests with `wait(10 s)`: every one runs, never more than 3 at once.
#[actix_rt::test]
async fn waiting_requests_all_run_and_never_more_than_three_at_once() {
    let cluster = Cluster::start(3).await;
    let gauge = web::Data::new(Gauge::default());
    let servers = replicas(&cluster, 4, &gauge, limit_3_waiting).await;
    let client = http();

    let started = Instant::now();
    let replies = all(0..50usize, |i| {
        get(&client, servers[i % 4].url("/work/a/run?ms=150"))
    })
    .await;
    let took = started.elapsed();

    assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    assert_eq!(gauge.ran(), 50);
    assert!(gauge.max() <= 3, "{} handlers at once", gauge.max());
    assert_eq!(gauge.max(), 3, "the limit was never reached");
    // 50 requests of 150 ms, 3 at a time: at least 17 rounds.
    assert!(took >= Duration::from_millis(16 * 150), "{took:?}");
    stop(servers).await;
}

/// Keys are limited apart: with tenant `a`'s limit full, tenant `b` (a header key)
/// still gets its 3, and a fourth request of `a` is refused.
#[actix_rt::test]
async fn another_key_is_not_limited_by_the_first() {
    let cluster = Cluster::start(3).await;
    let gauge = web::Data::new(Gauge::default());
    let servers = replicas(&cluster, 2, &gauge, |redlock| {
        ConcurrencyLimit::header(redlock, "x-tenant", 3).resource_prefix("tenant:")
    })
    .await;
    let client = http();
    let tenant = |tenant: &'static str, i: usize, ms: u64| {
        let request = client
            .get(servers[i % 2].url(&format!("/work/x/run?ms={ms}")))
            .insert_header(("x-tenant", tenant));
        async move {
            let mut response = request.send().await.expect("send");
            let body = response.body().await.expect("body");
            (response.status().as_u16(), body)
        }
    };

    let (a, (b, extra_a)) = tokio::join!(
        futures_util::future::join_all((0..3).map(|i| tenant("a", i, 800))),
        async {
            actix_rt::time::sleep(Duration::from_millis(250)).await;
            tokio::join!(
                futures_util::future::join_all((0..3).map(|i| tenant("b", i, 0))),
                tenant("a", 1, 0),
            )
        }
    );
    assert!(a.iter().all(|(status, _)| *status == 200), "{a:?}");
    assert!(b.iter().all(|(status, _)| *status == 200), "{b:?}");
    assert_eq!(extra_a.0, 429, "{extra_a:?}");
    assert_eq!(gauge.ran(), 6);
    stop(servers).await;
}

/// A limit of 0 is a misconfiguration, answered 500 (problem+json) at request time;
/// the handler does not run.
#[actix_rt::test]
async fn a_limit_of_zero_answers_500() {
    let cluster = Cluster::start(3).await;
    let gauge = web::Data::new(Gauge::default());
    let servers = replicas(&cluster, 1, &gauge, |redlock| {
        ConcurrencyLimit::path_param(redlock, "key", 0)
    })
    .await;
    let reply = get(&http(), servers[0].url("/work/a/run?ms=0")).await;
    assert!(reply.is_problem(500), "{reply:?}");
    assert_eq!(reply.retry_after, None);
    assert_eq!(gauge.ran(), 0);
    stop(servers).await;
}

/// No quorum: 503 with `Retry-After` (fail-closed, the default), or the request runs
/// unlimited with `fail_open(true)`.
#[actix_rt::test]
async fn no_quorum_is_503_unless_failing_open() {
    let cluster = Cluster::start(3).await;
    let gauge = web::Data::new(Gauge::default());
    let closed = replicas(&cluster, 1, &gauge, limit_3_fail_fast).await;
    let open = replicas(&cluster, 1, &gauge, |redlock| {
        limit_3_fail_fast(redlock).fail_open(true)
    })
    .await;
    let client = http();
    for i in 0..3 {
        cluster.node(i).pause();
    }
    let reply = get(&client, closed[0].url("/work/a/run?ms=0")).await;
    assert!(reply.is_problem(503), "{reply:?}");
    assert_eq!(reply.retry_after, Some(1));
    assert_eq!(gauge.ran(), 0);
    let reply = get(&client, open[0].url("/work/a/run?ms=0")).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(gauge.ran(), 1);
    for i in 0..3 {
        cluster.node(i).resume();
    }
    stop(closed).await;
    stop(open).await;
}
