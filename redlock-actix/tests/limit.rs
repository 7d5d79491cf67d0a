//! redlock-actix's `ClusterLimitMiddleware`: at most `k` concurrent requests per key across
//! replicas, against real actix-web servers (each with its own lock client) and
//! redis-server nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::*;
use redlock_actix::ClusterLimitMiddleware;
use redlock_actix::extract::KeyExtractor;

/// How many handlers run at once, across every replica of the process.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    ran: AtomicUsize,
    /// Handlers whose future was dropped before they answered.
    dropped: AtomicUsize,
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
    let mut running = Running(gauge.clone(), false);
    actix_rt::time::sleep(Duration::from_millis(ms.ms)).await;
    running.1 = true;
    gauge.now.fetch_sub(1, SeqCst);
    gauge.ran.fetch_add(1, SeqCst);
    HttpResponse::Ok().body("done")
}

/// A handler in the gauge (and whether it is done): counted as dropped if it goes
/// before it is done.
struct Running(web::Data<Gauge>, bool);

impl Drop for Running {
    fn drop(&mut self) {
        if !self.1 {
            self.0.now.fetch_sub(1, SeqCst);
            self.0.dropped.fetch_add(1, SeqCst);
        }
    }
}

/// `n` replicas, each a server with a lock client of its own, routing
/// `/work/{key}/run?ms=` through `limit(its client)` to [`work`].
async fn replicas<K: KeyExtractor>(
    cluster: &Cluster,
    n: usize,
    gauge: &web::Data<Gauge>,
    limit: fn(Redlock) -> ClusterLimitMiddleware<K>,
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

fn limit_3(
    redlock: Redlock,
    configure: impl FnOnce(LimitOptions) -> LimitOptions,
) -> ClusterLimitMiddleware<redlock_actix::extract::PathParam> {
    let options = LimitOptions::new(3)
        .resource_prefix("limit:")
        .ttl(Duration::from_secs(2));
    ClusterLimitMiddleware::path_param(redlock, "key", configure(options))
}

fn limit_3_fail_fast(
    redlock: Redlock,
) -> ClusterLimitMiddleware<redlock_actix::extract::PathParam> {
    limit_3(redlock, |options| options)
}

fn limit_3_waiting(redlock: Redlock) -> ClusterLimitMiddleware<redlock_actix::extract::PathParam> {
    limit_3(redlock, |options| options.wait(Duration::from_secs(10)))
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

    // The permits were given back (in the background, as the bodies ended): three
    // at once run again.
    actix_rt::time::sleep(Duration::from_millis(300)).await;
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
        ClusterLimitMiddleware::header(
            redlock,
            "x-tenant",
            LimitOptions::new(3).resource_prefix("tenant:"),
        )
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
        ClusterLimitMiddleware::path_param(redlock, "key", LimitOptions::new(0))
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
        limit_3(redlock, |options| options.fail_open(true))
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

// ---------------------------------------------------------------------------------
// The options shared with redlock-tower's `ConcurrencyLimitLayer`.

use redlock_actix::LimitOptions;
use redlock_actix::extract::PathParam;
use redlock_actix::{Hold, RefusalKind};

/// A server of one replica (its own lock client, built by `limit`) routing
/// `/work/{key}/run?ms=` through the limit to [`work`].
async fn serve<F>(gauge: &web::Data<Gauge>, limit: F) -> Server
where
    F: Fn() -> ClusterLimitMiddleware<PathParam> + Send + Clone + 'static,
{
    let gauge = gauge.clone();
    Server::start(1, move |cfg| {
        cfg.app_data(gauge.clone()).service(
            web::scope("/work/{key}")
                .wrap(limit())
                .route("/run", web::get().to(work)),
        );
    })
    .await
}

fn slow_limit(redlock: Redlock, limit: u32, ttl: Duration) -> ClusterLimitMiddleware<PathParam> {
    slow_limit_with(redlock, limit, ttl, |options| options)
}

fn slow_limit_with(
    redlock: Redlock,
    limit: u32,
    ttl: Duration,
    configure: impl FnOnce(LimitOptions) -> LimitOptions,
) -> ClusterLimitMiddleware<PathParam> {
    let options = LimitOptions::new(limit).resource_prefix("slow:").ttl(ttl);
    ClusterLimitMiddleware::path_param(redlock, "key", configure(options))
}

/// Waits (up to 5 s) until `n` handlers run.
async fn running(gauge: &Gauge, n: usize) {
    let started = Instant::now();
    while gauge.now.load(SeqCst) < n {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{n} not running"
        );
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `on_rejection` is called once per rejected request, with the busy kind and the
/// semaphore's name, and its response is the answer; a served request does not call
/// it.
#[actix_rt::test]
async fn on_rejection_is_called_once_per_429() {
    let cluster = Cluster::start(3).await;
    let gauge = web::Data::new(Gauge::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let redlock = redlock(&cluster, Duration::from_millis(250));
    let (seen, client) = (Arc::clone(&calls), redlock.clone());
    let server = serve(&gauge, move || {
        let seen = Arc::clone(&seen);
        slow_limit(client.clone(), 1, Duration::from_secs(2)).on_refusal(move |rejection| {
            seen.fetch_add(1, SeqCst);
            assert_eq!(rejection.kind, RefusalKind::Busy);
            assert_eq!(rejection.resource(), Some("slow:a"));
            HttpResponse::build(actix_web::http::StatusCode::from_u16(rejection.status()).unwrap())
                .body("custom busy")
        })
    })
    .await;
    let http = http();

    // Elsewhere, the only permit of key a is held.
    let held = redlock
        .semaphore("slow:a", 1)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    for i in 1..=5 {
        let reply = get(&http, server.url("/work/a/run?ms=0")).await;
        assert_eq!((reply.status, reply.body.as_str()), (429, "custom busy"));
        assert_eq!(calls.load(SeqCst), i);
    }
    held.release().await.unwrap();
    let reply = get(&http, server.url("/work/a/run?ms=0")).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(calls.load(SeqCst), 5);
    server.stop().await;
}

/// A handler running 5x the permits' TTL keeps its permit all along (the watchdog
/// extends it): with both permits held by such handlers on two replicas, every other
/// request is refused the whole time, and never more than 2 handlers run.
#[actix_rt::test]
async fn a_handler_longer_than_the_ttl_keeps_its_permit() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(500);
    let gauge = web::Data::new(Gauge::default());
    let mut servers = Vec::new();
    for _ in 0..2 {
        let redlock = redlock(&cluster, Duration::from_millis(100));
        servers.push(serve(&gauge, move || slow_limit(redlock.clone(), 2, ttl)).await);
    }
    let http = http();
    // One after another (each once the previous one runs): two requests racing for
    // the same free slot may both lose it, and fail fast.
    let started = Instant::now();
    let mut long = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let (http, url) = (http.clone(), server.url("/work/a/run?ms=2500"));
        long.push(actix_rt::spawn(async move { get(&http, url).await }));
        running(&gauge, i + 1).await;
    }
    let mut refused = 0;
    while started.elapsed() < Duration::from_millis(2200) {
        for server in &servers {
            let reply = get(&http, server.url("/work/a/run?ms=0")).await;
            assert_eq!(
                reply.status,
                429,
                "a third request got in after {:?}",
                started.elapsed()
            );
            refused += 1;
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    for request in long {
        let reply = request.await.unwrap();
        assert_eq!((reply.status, reply.body.as_str()), (200, "done"));
    }
    assert!(refused >= 10, "{refused}");
    assert_eq!(gauge.max(), 2);
    // Given back with the bodies: served again.
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        get(&http, servers[0].url("/work/a/run?ms=0")).await.status,
        200
    );
    stop(servers).await;
}

/// By default (`Hold::UntilBodyEnd`) the permit is kept while the body streams;
/// with `Hold::UntilHead` it is given back once the handler's response is ready.
#[actix_rt::test]
async fn hold_keeps_the_permit_until_the_body_ends_or_only_until_the_head() {
    let cluster = Cluster::start(3).await;
    let outside = redlock(&cluster, Duration::from_millis(250));
    for (prefix, hold, held_while_streaming) in [
        ("body:", Hold::UntilBodyEnd, true),
        ("head:", Hold::UntilHead, false),
    ] {
        let body_may_end = Arc::new(tokio::sync::Notify::new());
        let signal = Arc::clone(&body_may_end);
        let redlock = redlock(&cluster, Duration::from_millis(250));
        let server = Server::start(1, move |cfg| {
            let signal = Arc::clone(&signal);
            cfg.service(
                web::scope("/stream/{key}")
                    .wrap(ClusterLimitMiddleware::path_param(
                        redlock.clone(),
                        "key",
                        LimitOptions::new(1).resource_prefix(prefix).hold(hold),
                    ))
                    .route(
                        "",
                        web::post().to(move || {
                            let signal = Arc::clone(&signal);
                            async move {
                                let rows = futures_util::stream::once(async move {
                                    signal.notified().await;
                                    Ok::<_, std::convert::Infallible>(web::Bytes::from("rows"))
                                });
                                HttpResponse::Ok().body(BodyStream::new(rows))
                            }
                        }),
                    ),
            );
        })
        .await;
        let mut response = http().post(server.url("/stream/a")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        // The head is here, the body is not.
        let semaphore = outside.semaphore(format!("{prefix}a"), 1).unwrap();
        let mut free = false;
        for _ in 0..25 {
            if let Ok(permit) = semaphore.try_acquire().await {
                permit.release().await.unwrap();
                free = true;
                break;
            }
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(free, !held_while_streaming, "{hold:?}");
        body_may_end.notify_one();
        assert_eq!(response.body().await.unwrap(), "rows");
        server.stop().await;
    }
}

/// `max_hold` ends a permit however long the handler runs: past it (and the TTL)
/// another request gets in while the first still runs, which carries on (no abort on
/// loss).
#[actix_rt::test]
async fn max_hold_ends_the_permit() {
    let cluster = Cluster::start(3).await;
    let gauge = web::Data::new(Gauge::default());
    let redlock = redlock(&cluster, Duration::from_millis(100));
    let server = serve(&gauge, move || {
        slow_limit_with(redlock.clone(), 1, Duration::from_millis(300), |options| {
            options.max_hold(Duration::from_millis(400))
        })
    })
    .await;
    let http = http();
    let long = {
        let (http, url) = (http.clone(), server.url("/work/a/run?ms=3000"));
        actix_rt::spawn(async move { get(&http, url).await })
    };
    let started = Instant::now();
    running(&gauge, 1).await;
    assert_eq!(get(&http, server.url("/work/a/run?ms=0")).await.status, 429);
    loop {
        let reply = get(&http, server.url("/work/a/run?ms=0")).await;
        if reply.status == 200 {
            break;
        }
        assert_eq!(reply.status, 429, "{reply:?}");
        assert!(
            started.elapsed() < Duration::from_millis(2000),
            "still held after {:?}",
            started.elapsed()
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    let got_in = started.elapsed();
    assert!(got_in >= Duration::from_millis(400), "{got_in:?}");
    assert_eq!(gauge.now.load(SeqCst), 1, "the first one still runs");
    let reply = long.await.unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "done"));
    server.stop().await;
}

/// A majority of the nodes paused while two handlers run loses their permits: by
/// default the handler carries on and answers; with `abort_on_loss` it is dropped and
/// the client gets a 503 problem (through `on_rejection`, once).
#[actix_rt::test]
async fn abort_on_loss_answers_503_when_the_nodes_are_paused() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(600);
    let (carry_gauge, abort_gauge) = (
        web::Data::new(Gauge::default()),
        web::Data::new(Gauge::default()),
    );
    let lost = Arc::new(AtomicUsize::new(0));
    let carry = {
        let redlock = redlock(&cluster, Duration::from_millis(50));
        serve(&carry_gauge, move || {
            slow_limit_with(redlock.clone(), 2, ttl, |options| {
                options.resource_prefix("carry:")
            })
        })
        .await
    };
    let abort = {
        let redlock = redlock(&cluster, Duration::from_millis(50));
        let seen = Arc::clone(&lost);
        serve(&abort_gauge, move || {
            let seen = Arc::clone(&seen);
            slow_limit_with(redlock.clone(), 2, ttl, |options| {
                options.resource_prefix("abort:").abort_on_loss(true)
            })
            .on_refusal(move |rejection| {
                if rejection.kind == RefusalKind::Lost {
                    seen.fetch_add(1, SeqCst);
                }
                redlock_actix::error::problem_response(&rejection.problem)
            })
        })
        .await
    };
    let http = http();
    let carried = {
        let (http, url) = (http.clone(), carry.url("/work/a/run?ms=3000"));
        actix_rt::spawn(async move { get(&http, url).await })
    };
    let aborted = {
        let (http, url) = (http.clone(), abort.url("/work/a/run?ms=3000"));
        actix_rt::spawn(async move { get(&http, url).await })
    };
    running(&carry_gauge, 1).await;
    running(&abort_gauge, 1).await;
    actix_rt::time::sleep(ttl).await; // extended once or more
    cluster.node(0).pause();
    cluster.node(1).pause();
    let paused_at = Instant::now();
    let aborted = aborted.await.unwrap();
    let carried = carried.await.unwrap();
    cluster.node(0).resume();
    cluster.node(1).resume();

    assert!(aborted.is_problem(503), "{aborted:?}");
    assert_eq!(aborted.retry_after, Some(1));
    assert!(aborted.body.contains("lost"), "{aborted:?}");
    assert!(
        aborted.at - paused_at < Duration::from_secs(2),
        "{:?}",
        aborted.at - paused_at
    );
    assert_eq!(
        abort_gauge.dropped.load(SeqCst),
        1,
        "the handler was not dropped"
    );
    assert_eq!(abort_gauge.ran(), 0);
    assert_eq!(lost.load(SeqCst), 1);

    assert_eq!((carried.status, carried.body.as_str()), (200, "done"));
    assert_eq!(carry_gauge.dropped.load(SeqCst), 0);
    stop(vec![carry, abort]).await;
}
