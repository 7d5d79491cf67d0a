//! The cluster-wide concurrency limit (`ClusterLimitLayer`) against real nodes: axum
//! replicas, each with its own lock client, sharing the limit through the nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;
use redlock_tower::ClusterLimitLayer;
use redlock_tower::LimitOptions;

const LIMIT: u32 = 3;
const REQUESTS: usize = 50;
const WORK: Duration = Duration::from_millis(150);

/// Handlers running now, and the most seen at once.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    calls: AtomicUsize,
}

impl Gauge {
    async fn run(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(WORK).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `POST /export/{tenant}`, at most `limit` at once per tenant; the handler runs for
/// `WORK` under the gauge of its tenant (`"a"` or any other).
fn export_app(
    redlock: Redlock,
    limit: u32,
    gauges: Arc<(Gauge, Gauge)>,
    configure: impl FnOnce(LimitOptions) -> LimitOptions,
) -> Router {
    let options = configure(LimitOptions::new(limit).resource_prefix("export:"));
    let layer = ClusterLimitLayer::new(redlock, PathParam::new("tenant"), options);
    Router::new()
        .route(
            "/export/{tenant}",
            post(
                move |axum::extract::Path(tenant): axum::extract::Path<String>| async move {
                    let gauge = if tenant == "a" { &gauges.0 } else { &gauges.1 };
                    gauge.run().await;
                    format!("exported {tenant}")
                },
            ),
        )
        .route_layer(layer)
}

/// Four replicas of the export app, each with its own lock client; their base URLs.
async fn replicas(
    cluster: &Cluster,
    limit: u32,
    gauges: &Arc<(Gauge, Gauge)>,
    configure: impl Fn(LimitOptions) -> LimitOptions,
) -> Vec<String> {
    let mut bases = Vec::new();
    for _ in 0..4 {
        let redlock = replica(cluster, Duration::from_millis(500));
        bases.push(serve(export_app(redlock, limit, Arc::clone(gauges), &configure)).await);
    }
    bases
}

/// `REQUESTS` concurrent exports of `tenant`, spread over `bases`.
async fn flood(bases: &[String], tenant: &str) -> Vec<reqwest::Response> {
    let client = http();
    let requests = (0..REQUESTS).map(|i| {
        let url = format!("{}/export/{tenant}", bases[i % bases.len()]);
        let client = client.clone();
        tokio::spawn(async move { client.post(url).send().await.unwrap() })
    });
    let mut responses = Vec::new();
    for request in requests.collect::<Vec<_>>() {
        responses.push(request.await.unwrap());
    }
    responses
}

/// Sends an export to `url` until it runs as the `running`-th at once, and returns the
/// running request. The flood's permits are given back in the background as its bodies
/// end (and a permit whose release a node has not seen yet lasts until its TTL), so a
/// request sent right after it may be refused: it is sent again.
async fn start_export(
    client: &reqwest::Client,
    url: String,
    gauge: &Gauge,
    running: usize,
) -> tokio::task::JoinHandle<StatusCode> {
    let started = Instant::now();
    loop {
        let (client, url) = (client.clone(), url.clone());
        let request = tokio::spawn(async move { client.post(url).send().await.unwrap().status() });
        loop {
            if gauge.now.load(Ordering::SeqCst) >= running {
                return request;
            }
            if request.is_finished() {
                // Refused, or (on a machine slow enough) run and ended unseen.
                let status = request.await.unwrap();
                assert!(
                    [StatusCode::TOO_MANY_REQUESTS, StatusCode::OK].contains(&status),
                    "export {running}: {status}"
                );
                break;
            }
            assert!(
                // Past the permits' 5 s TTL: any permit left over has expired by then.
                started.elapsed() < Duration::from_secs(10),
                "export {running} not started"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fail_fast_admits_at_most_the_limit_across_replicas_and_answers_429() {
    let cluster = Cluster::start(3).await;
    let gauges = Arc::new((Gauge::default(), Gauge::default()));
    let bases = replicas(&cluster, LIMIT, &gauges, |options| options).await;

    let responses = flood(&bases, "a").await;
    let mut served = 0;
    let mut refused = 0;
    for response in responses {
        if response.status() == StatusCode::OK {
            assert_eq!(response.text().await.unwrap(), "exported a");
            served += 1;
        } else {
            // The busy status, Retry-After (at most the permits' 5 s TTL), problem+json.
            let body = assert_problem(response, StatusCode::TOO_MANY_REQUESTS, 5).await;
            assert!(body.contains("urn:redlock:busy"), "{body}");
            refused += 1;
        }
    }
    let max = gauges.0.max.load(Ordering::SeqCst);
    assert!(max <= LIMIT as usize, "{max} exports of one tenant at once");
    assert!(
        served >= 1 && refused >= 1,
        "{served} served, {refused} refused"
    );
    assert_eq!(served, gauges.0.calls.load(Ordering::SeqCst));
    assert_eq!(served + refused, REQUESTS);

    // While three slow exports hold every permit (started one after another, each once
    // the previous one runs), a fourth is refused on any replica.
    let client = http();
    let mut slow = Vec::new();
    for (i, base) in bases.iter().take(LIMIT as usize).enumerate() {
        let url = format!("{base}/export/a");
        slow.push(start_export(&client, url, &gauges.0, i + 1).await);
    }
    let fourth = client
        .post(format!("{}/export/a", bases[3]))
        .send()
        .await
        .unwrap()
        .status();
    for request in slow {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(gauges.0.max.load(Ordering::SeqCst), LIMIT as usize);
    assert_eq!(fourth, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_requests_all_succeed_never_more_than_the_limit_at_once() {
    let cluster = Cluster::start(3).await;
    let gauges = Arc::new((Gauge::default(), Gauge::default()));
    let bases = replicas(&cluster, LIMIT, &gauges, |options| {
        options.wait(Duration::from_secs(10))
    })
    .await;

    let started = Instant::now();
    let responses = flood(&bases, "a").await;
    for response in responses {
        assert_eq!(response.status(), StatusCode::OK);
    }
    let elapsed = started.elapsed();
    assert_eq!(gauges.0.calls.load(Ordering::SeqCst), REQUESTS);
    let max = gauges.0.max.load(Ordering::SeqCst);
    assert_eq!(max, LIMIT as usize, "most exports of one tenant at once");
    // 50 exports of 150 ms, 3 at a time: at least 17 rounds.
    assert!(elapsed >= WORK * 16, "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_tenant_is_not_limited_by_the_first() {
    let cluster = Cluster::start(3).await;
    let gauges = Arc::new((Gauge::default(), Gauge::default()));
    let bases = replicas(&cluster, LIMIT, &gauges, |options| options).await;
    let client = http();

    // Elsewhere, tenant a's three exports hold every permit of its semaphore.
    let redlock = replica(&cluster, Duration::from_millis(500));
    let resource = redlock_http::key::resource_name("export:", "a").unwrap();
    let semaphore = redlock.semaphore(resource, LIMIT).unwrap();
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        held.push(semaphore.try_acquire().await.unwrap());
    }

    for base in &bases {
        let refused = client
            .post(format!("{base}/export/a"))
            .send()
            .await
            .unwrap();
        assert_problem(refused, StatusCode::TOO_MANY_REQUESTS, 5).await;
        let served = client
            .post(format!("{base}/export/b"))
            .send()
            .await
            .unwrap();
        assert_eq!(served.status(), StatusCode::OK);
        assert_eq!(served.text().await.unwrap(), "exported b");
    }
    assert_eq!(gauges.0.calls.load(Ordering::SeqCst), 0);
    assert_eq!(gauges.1.calls.load(Ordering::SeqCst), bases.len());

    // Tenant b is limited on its own: a flood of b is capped at 3 while a stays full.
    let responses = flood(&bases, "b").await;
    let served = responses
        .iter()
        .filter(|r| r.status() == StatusCode::OK)
        .count();
    assert!(served >= 1);
    assert!(gauges.1.max.load(Ordering::SeqCst) <= LIMIT as usize);

    // A permit given back: tenant a is served again.
    if let Some(permit) = held.pop() {
        permit.release().await.unwrap();
    }
    let served = client
        .post(format!("{}/export/a", bases[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    for permit in held {
        permit.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_of_zero_answers_500_without_calling_the_handler() {
    let cluster = Cluster::start(3).await;
    let gauges = Arc::new((Gauge::default(), Gauge::default()));
    let redlock = replica(&cluster, Duration::from_millis(500));
    let base = serve(export_app(redlock, 0, Arc::clone(&gauges), |options| {
        options
    }))
    .await;

    let response = http()
        .post(format!("{base}/export/a"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body = response.text().await.unwrap();
    assert!(body.contains("\"status\":500"), "{body}");
    assert_eq!(gauges.0.calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------------
// The options shared with redlock-actix's `ConcurrencyLimit`.

use redlock_tower::RefusalKind;

/// A handler for the option tests: `POST /slow/{tenant}/{ms}` runs for `ms` in the
/// gauge of its tenant, setting `dropped` if its future is dropped before it ends.
fn slow_app(
    layer: ClusterLimitLayer<PathParam>,
    gauge: Arc<Gauge>,
    dropped: Arc<AtomicBool>,
) -> Router {
    Router::new()
        .route(
            "/slow/{tenant}/{ms}",
            post(
                move |axum::extract::Path((_, ms)): axum::extract::Path<(String, u64)>| async move {
                    let finished = Arc::new(AtomicBool::new(false));
                    let _drop = DropUnlessFinished(Arc::clone(&finished), dropped);
                    gauge.calls.fetch_add(1, Ordering::SeqCst);
                    let now = gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
                    gauge.max.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    gauge.now.fetch_sub(1, Ordering::SeqCst);
                    finished.store(true, Ordering::SeqCst);
                    "finished"
                },
            ),
        )
        .route_layer(layer)
}

/// Sets its second flag when dropped before its first was set: a handler cancelled.
struct DropUnlessFinished(Arc<AtomicBool>, Arc<AtomicBool>);

impl Drop for DropUnlessFinished {
    fn drop(&mut self) {
        if !self.0.load(Ordering::SeqCst) {
            self.1.store(true, Ordering::SeqCst);
        }
    }
}

fn slow_layer(cluster: &Cluster, limit: u32, ttl: Duration) -> ClusterLimitLayer<PathParam> {
    slow_layer_with(cluster, limit, ttl, |options| options)
}

fn slow_layer_with(
    cluster: &Cluster,
    limit: u32,
    ttl: Duration,
    configure: impl FnOnce(LimitOptions) -> LimitOptions,
) -> ClusterLimitLayer<PathParam> {
    ClusterLimitLayer::new(
        replica(cluster, Duration::from_millis(100)),
        PathParam::new("tenant"),
        configure(LimitOptions::new(limit).resource_prefix("slow:").ttl(ttl)),
    )
}

/// [`post_status`] in a task of its own.
fn spawn_post(
    client: &reqwest::Client,
    url: String,
) -> tokio::task::JoinHandle<(StatusCode, String)> {
    let client = client.clone();
    tokio::spawn(async move { post_status(&client, url).await })
}

async fn post_status(client: &reqwest::Client, url: String) -> (StatusCode, String) {
    let response = client.post(url).send().await.unwrap();
    (response.status(), response.text().await.unwrap())
}

/// `on_rejection` is called once per rejected request, with the busy kind and the
/// semaphore's name, and its response is the answer; a served request does not call
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rejection_is_called_once_per_429() {
    let cluster = Cluster::start(3).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let layer = slow_layer(&cluster, 1, Duration::from_secs(2)).on_refusal(move |rejection| {
        seen.fetch_add(1, Ordering::SeqCst);
        assert_eq!(rejection.kind, RefusalKind::Busy);
        assert_eq!(rejection.resource(), Some("slow:a"));
        http::Response::builder()
            .status(rejection.status())
            .body(Bytes::from("custom busy"))
            .unwrap()
    });
    let gauge = Arc::new(Gauge::default());
    let base = serve(slow_app(layer, gauge, Arc::default())).await;
    let client = http();

    // Elsewhere, the only permit of tenant a is held.
    let semaphore = replica(&cluster, Duration::from_millis(250))
        .semaphore("slow:a", 1)
        .unwrap();
    let held = semaphore.try_acquire().await.unwrap();
    for i in 1..=5 {
        let (status, body) = post_status(&client, format!("{base}/slow/a/0")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(body, "custom busy");
        assert_eq!(calls.load(Ordering::SeqCst), i);
    }
    held.release().await.unwrap();
    let (status, _) = post_status(&client, format!("{base}/slow/a/0")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

/// A handler running 5x the permits' TTL keeps its permit all along (the watchdog
/// extends it): with both permits held by such handlers on two replicas, every other
/// request is refused the whole time, and never more than 2 handlers run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_longer_than_the_ttl_keeps_its_permit() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(500);
    let gauge = Arc::new(Gauge::default());
    let mut bases = Vec::new();
    for _ in 0..2 {
        let layer = slow_layer(&cluster, 2, ttl);
        bases.push(serve(slow_app(layer, Arc::clone(&gauge), Arc::default())).await);
    }
    let client = http();
    // One after another (each once the previous one runs): two requests racing for
    // the same free slot may both lose it, and fail fast.
    let started = Instant::now();
    let mut long = Vec::new();
    for (i, base) in bases.iter().enumerate() {
        long.push(spawn_post(&client, format!("{base}/slow/a/2500")));
        while gauge.now.load(Ordering::SeqCst) <= i {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{i} not started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut refused = 0;
    while started.elapsed() < Duration::from_millis(2200) {
        for base in &bases {
            let (status, _) = post_status(&client, format!("{base}/slow/a/0")).await;
            assert_eq!(
                status,
                StatusCode::TOO_MANY_REQUESTS,
                "a third request got in after {:?}",
                started.elapsed()
            );
            refused += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for request in long {
        assert_eq!(request.await.unwrap(), (StatusCode::OK, "finished".into()));
    }
    assert!(refused >= 10, "{refused}");
    assert_eq!(gauge.max.load(Ordering::SeqCst), 2);
    // Given back with the bodies: served again.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = post_status(&client, format!("{}/slow/a/0", bases[0])).await;
    assert_eq!(status, StatusCode::OK);
}

/// By default (`Hold::UntilBodyEnd`) the permit is kept while the body streams;
/// with `Hold::UntilHead` it is given back once the head is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_keeps_the_permit_until_the_body_ends_or_only_until_the_head() {
    let cluster = Cluster::start(3).await;
    let outside = replica(&cluster, Duration::from_millis(250));
    for (prefix, hold, held_while_streaming) in [
        ("body:", Hold::UntilBodyEnd, true),
        ("head:", Hold::UntilHead, false),
    ] {
        let layer = slow_layer_with(&cluster, 1, Duration::from_secs(2), |options| {
            options.resource_prefix(prefix).hold(hold)
        });
        let body_may_end = Arc::new(tokio::sync::Notify::new());
        let signal = Arc::clone(&body_may_end);
        let app = Router::new()
            .route(
                "/stream/{tenant}",
                post(move || {
                    let signal = Arc::clone(&signal);
                    async move {
                        let rows = futures_util::stream::once(async move {
                            signal.notified().await;
                            Ok::<_, std::convert::Infallible>(Bytes::from("rows"))
                        });
                        Body::from_stream(rows)
                    }
                }),
            )
            .route_layer(layer);
        let base = serve(app).await;
        let response = http()
            .post(format!("{base}/stream/a"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // The head is here, the body is not.
        let semaphore = outside.semaphore(format!("{prefix}a"), 1).unwrap();
        let mut free = false;
        for _ in 0..25 {
            if let Ok(permit) = semaphore.try_acquire().await {
                permit.release().await.unwrap();
                free = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(free, !held_while_streaming, "{hold:?}");
        body_may_end.notify_one();
        assert_eq!(response.text().await.unwrap(), "rows");
    }
}

/// `max_hold` ends a permit however long the handler runs: past it (and the TTL)
/// another request gets in while the first still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_ends_the_permit() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(300);
    let gauge = Arc::new(Gauge::default());
    let layer = slow_layer_with(&cluster, 1, ttl, |options| {
        options.max_hold(Duration::from_millis(400))
    });
    let base = serve(slow_app(layer, Arc::clone(&gauge), Arc::default())).await;
    let client = http();
    let long = spawn_post(&client, format!("{base}/slow/a/3000"));
    let started = Instant::now();
    while gauge.now.load(Ordering::SeqCst) < 1 {
        assert!(started.elapsed() < Duration::from_secs(5), "not started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, _) = post_status(&client, format!("{base}/slow/a/0")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    loop {
        let (status, _) = post_status(&client, format!("{base}/slow/a/0")).await;
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            started.elapsed() < Duration::from_millis(2000),
            "still held after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got_in = started.elapsed();
    assert!(got_in >= Duration::from_millis(400), "{got_in:?}");
    assert_eq!(
        gauge.now.load(Ordering::SeqCst),
        1,
        "the first one still runs"
    );
    // Without `abort_on_loss` the first request carries on to its end.
    assert_eq!(long.await.unwrap(), (StatusCode::OK, "finished".into()));
}

/// A majority of the nodes paused while two handlers run loses their permits: by
/// default the handler carries on and answers; with `abort_on_loss` it is dropped and
/// the client gets a 503 problem (through `on_rejection`, once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_on_loss_answers_503_when_the_nodes_are_paused() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(600);
    let (carry_gauge, abort_gauge) = (Arc::new(Gauge::default()), Arc::new(Gauge::default()));
    let (carry_dropped, abort_dropped) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let lost = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&lost);
    let carry = serve(slow_app(
        slow_layer_with(&cluster, 2, ttl, |options| {
            options.resource_prefix("carry:")
        }),
        Arc::clone(&carry_gauge),
        Arc::clone(&carry_dropped),
    ))
    .await;
    let abort = serve(slow_app(
        slow_layer_with(&cluster, 2, ttl, |options| {
            options.resource_prefix("abort:").abort_on_loss(true)
        })
        .on_refusal(move |rejection| {
            if rejection.kind == RefusalKind::Lost {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            redlock_tower::response::problem_response(&rejection.problem)
        }),
        Arc::clone(&abort_gauge),
        Arc::clone(&abort_dropped),
    ))
    .await;
    let client = http();
    let carried = spawn_post(&client, format!("{carry}/slow/a/3000"));
    let aborted = {
        let (client, url) = (client.clone(), format!("{abort}/slow/a/3000"));
        tokio::spawn(async move {
            let response = client.post(url).send().await.unwrap();
            let retry_after = response.headers().get("retry-after").cloned();
            (
                response.status(),
                retry_after,
                response.text().await.unwrap(),
                Instant::now(),
            )
        })
    };
    let started = Instant::now();
    while carry_gauge.now.load(Ordering::SeqCst) + abort_gauge.now.load(Ordering::SeqCst) < 2 {
        assert!(started.elapsed() < Duration::from_secs(5), "not started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(ttl).await; // extended once or more
    cluster.node(0).pause();
    cluster.node(1).pause();
    let paused_at = Instant::now();
    let (status, retry_after, body, at) = aborted.await.unwrap();
    let carried = carried.await.unwrap();
    cluster.node(0).resume();
    cluster.node(1).resume();

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(retry_after.is_some());
    assert!(body.contains("was lost"), "{body}");
    assert!(
        at - paused_at < Duration::from_secs(2),
        "{:?}",
        at - paused_at
    );
    assert!(
        abort_dropped.load(Ordering::SeqCst),
        "the handler was not dropped"
    );
    assert_eq!(lost.load(Ordering::SeqCst), 1);

    assert_eq!(carried, (StatusCode::OK, "finished".into()));
    assert!(!carry_dropped.load(Ordering::SeqCst));
}
