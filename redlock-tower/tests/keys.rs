//! redlock-tower's key extractors over real axum servers and redis-server nodes: a
//! missing required key, and requests that take no lock.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;

/// A required header that is missing is a 400 (the handler does not run); a request for
/// which the extractor says "no lock" runs without one, in parallel with others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_required_key_is_400_and_no_key_takes_no_lock() {
    let cluster = Cluster::start(3).await;
    let redlock = replica(&cluster, Duration::from_millis(100));
    let handled = Arc::new(AtomicUsize::new(0));
    let intervals = Arc::new(Intervals::default());
    let idempotent = LockLayer::new(redlock.clone(), Header::new("Idempotency-Key").required())
        .options(LockOptions::new().resource_prefix("idem:"));
    // Only POSTs are serialized per tenant; GETs pass.
    let by_tenant = LockLayer::new(redlock, |request: &Request| {
        Ok::<_, redlock_tower::extract::BadKey>(
            (request.method() == axum::http::Method::POST)
                .then(|| {
                    request
                        .headers()
                        .get("x-tenant")?
                        .to_str()
                        .ok()
                        .map(str::to_owned)
                })
                .flatten(),
        )
    })
    .options(LockOptions::new().resource_prefix("tenant:"));
    let (h, i) = (Arc::clone(&handled), Arc::clone(&intervals));
    let app = Router::new()
        .route(
            "/payments",
            post(move |lock: Option<Extension<LockHandle>>| async move {
                h.fetch_add(1, Ordering::SeqCst);
                lock.map_or_else(|| "none".to_owned(), |l| l.resource().to_owned())
            })
            .route_layer(idempotent),
        )
        .route(
            "/report",
            get(move |lock: Option<Extension<LockHandle>>| async move {
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(300)).await;
                i.record(start, Instant::now(), 0);
                if lock.is_some() { "locked" } else { "unlocked" }
            })
            .route_layer(by_tenant),
        );
    let base = serve(app).await;
    let client = http();

    let r = client
        .post(format!("{base}/payments"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body = r.text().await.unwrap();
    assert!(
        body.contains("idempotency-key") && body.contains("\"status\":400"),
        "{body}"
    );
    assert_eq!(handled.load(Ordering::SeqCst), 0);
    let r = client
        .post(format!("{base}/payments"))
        .header("Idempotency-Key", "abc")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "idem:abc");

    // Two GETs for one tenant: no lock, so they overlap, and no key is written.
    let gets: Vec<_> = (0..2)
        .map(|_| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let r = client
                    .get(format!("{base}/report"))
                    .header("x-tenant", "acme")
                    .send()
                    .await
                    .unwrap();
                (r.status(), r.text().await.unwrap())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(cluster.count_keys("*tenant:*").await, 0, "a lock was taken");
    for get in gets {
        assert_eq!(get.await.unwrap(), (StatusCode::OK, "unlocked".to_owned()));
    }
    assert_eq!(
        intervals.overlaps().len(),
        1,
        "the unlocked requests did not overlap"
    );
}
