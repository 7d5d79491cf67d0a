//! The cluster-wide concurrency limit (`ConcurrencyLimitLayer`) against real nodes: axum
//! replicas, each with its own lock client, sharing the limit through the nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;
use redlock_tower::ConcurrencyLimitLayer;

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
    configure: impl FnOnce(ConcurrencyLimitLayer<PathParam>) -> ConcurrencyLimitLayer<PathParam>,
) -> Router {
    let layer = configure(
        ConcurrencyLimitLayer::new(redlock, PathParam::new("tenant"), limit)
            .resource_prefix("export:"),
    );
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
    configure: impl Fn(ConcurrencyLimitLayer<PathParam>) -> ConcurrencyLimitLayer<PathParam>,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fail_fast_admits_at_most_the_limit_across_replicas_and_answers_429() {
    let cluster = Cluster::start(3).await;
    let gauges = Arc::new((Gauge::default(), Gauge::default()));
    let bases = replicas(&cluster, LIMIT, &gauges, |layer| layer).await;

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
    // The flood's permits are released in the background as its bodies end.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = http();
    let mut slow = Vec::new();
    for (i, base) in bases.iter().take(LIMIT as usize).enumerate() {
        let (client, url) = (client.clone(), format!("{base}/export/a"));
        slow.push(tokio::spawn(async move {
            client.post(url).send().await.unwrap().status()
        }));
        let started = Instant::now();
        while gauges.0.now.load(Ordering::SeqCst) <= i {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "export {i} not started"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
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
    let bases = replicas(&cluster, LIMIT, &gauges, |layer| {
        layer.wait(Duration::from_secs(10))
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
    let bases = replicas(&cluster, LIMIT, &gauges, |layer| layer).await;
    let client = http();

    // Elsewhere, tenant a's three exports hold every permit of its semaphore.
    let redlock = replica(&cluster, Duration::from_millis(500));
    let resource = redlock_http::resource_name("export:", "a").unwrap();
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
    let base = serve(export_app(redlock, 0, Arc::clone(&gauges), |layer| layer)).await;

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
