//! redlock-tower over HTTP: real axum servers on loopback ports (two app instances
//! sharing the Redis nodes stand for two replicas), real redis-server nodes, and a real
//! HTTP client (reqwest): one key at a time across replicas, busy keys, wait mode.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;

/// Two instances (two routers on two ports, each with its own lock client) take turns
/// on one order: 8 concurrent requests all succeed, one at a time; 8 requests for 8
/// different orders run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_serialize_one_key_and_run_different_keys_in_parallel() {
    let cluster = Cluster::start(3).await;
    let work = Duration::from_millis(150);
    let intervals = Arc::new(Intervals::default());
    let mut bases = Vec::new();
    for instance in 0..2 {
        let redlock = replica(&cluster, Duration::from_millis(100));
        bases.push(
            serve(orders_app(
                redlock,
                instance,
                work,
                Arc::clone(&intervals),
                |layer| layer.wait(Duration::from_secs(20)),
            ))
            .await,
        );
    }
    let client = http();
    for base in &bases {
        assert_eq!(pay(&client, base, 999).await.status(), StatusCode::OK); // warm up
    }

    let intervals_before = intervals.len();
    let started = Instant::now();
    let same: Vec<_> = (0..8)
        .map(|i| {
            let (client, base) = (client.clone(), bases[i % 2].clone());
            tokio::spawn(async move { pay(&client, &base, 1).await })
        })
        .collect();
    for request in same {
        let response = request.await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.text().await.unwrap(), "paid under order:1");
    }
    let serial = started.elapsed();
    assert_eq!(intervals.len() - intervals_before, 8);
    assert!(
        intervals.overlaps().is_empty(),
        "overlapping requests: {:?}",
        intervals.overlaps()
    );
    assert!(serial >= work * 8, "8 serialized requests took {serial:?}");

    // Different orders: nothing to wait for.
    let parallel = Arc::new(Intervals::default());
    let mut bases_parallel = Vec::new();
    for instance in 0..2 {
        let redlock = replica(&cluster, Duration::from_millis(100));
        bases_parallel.push(
            serve(orders_app(
                redlock,
                instance,
                work,
                Arc::clone(&parallel),
                |layer| layer, // fail fast: any contention would show as a 409
            ))
            .await,
        );
    }
    for base in &bases_parallel {
        assert_eq!(pay(&client, base, 998).await.status(), StatusCode::OK); // warm up
    }
    let started = Instant::now();
    let distinct: Vec<_> = (0..8)
        .map(|i| {
            let (client, base) = (client.clone(), bases_parallel[i % 2].clone());
            tokio::spawn(async move { pay(&client, &base, 100 + i as u32).await.status() })
        })
        .collect();
    for request in distinct {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < work * 4,
        "8 requests on 8 keys took {elapsed:?}: they did not run in parallel"
    );
    assert!(
        !parallel.overlaps().is_empty(),
        "requests on different keys never overlapped"
    );
}

/// While one instance serves an order, the other answers 409 at once, with the
/// holder's remaining TTL as `Retry-After` and a problem+json body; other orders are
/// served meanwhile, and the order is free again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_key_answers_409_with_retry_after() {
    let cluster = Cluster::start(3).await;
    let intervals = Arc::new(Intervals::default());
    let ttl = Duration::from_secs(3);
    let holder = serve(orders_app(
        replica(&cluster, Duration::from_millis(100)),
        0,
        Duration::from_millis(1500),
        Arc::clone(&intervals),
        |layer| layer.ttl(ttl),
    ))
    .await;
    let other = serve(orders_app(
        replica(&cluster, Duration::from_millis(100)),
        1,
        Duration::from_millis(10),
        Arc::clone(&intervals),
        |layer| layer.ttl(ttl),
    ))
    .await;
    let client = http();
    let first = {
        let (client, holder) = (client.clone(), holder.clone());
        tokio::spawn(async move { pay(&client, &holder, 7).await.status() })
    };
    tokio::time::sleep(Duration::from_millis(500)).await; // the holder is in its handler

    let asked = Instant::now();
    let busy = pay(&client, &other, 7).await;
    let body = assert_problem(busy, StatusCode::CONFLICT, ttl.as_secs()).await;
    assert!(
        asked.elapsed() < Duration::from_millis(1000),
        "{:?}",
        asked.elapsed()
    );
    assert!(
        !body.contains("order:7"),
        "the resource name is the server's: {body}"
    );
    assert!(body.contains("urn:redlock:busy"), "{body}");

    // Another order is not affected.
    assert_eq!(pay(&client, &other, 8).await.status(), StatusCode::OK);

    assert_eq!(first.await.unwrap(), StatusCode::OK);
    // Released when the holder's response was done (the release's round trip may end
    // just after the client read the response): free at once, not at its TTL (3 s).
    let done = Instant::now();
    loop {
        let status = pay(&client, &other, 7).await.status();
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(status, StatusCode::CONFLICT);
        assert!(
            done.elapsed() < Duration::from_secs(1),
            "held past its release"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait mode: queued requests all complete, one at a time, within the deadline; a
/// request still waiting at its deadline gets a 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_queues_until_the_deadline() {
    let cluster = Cluster::start(3).await;
    let intervals = Arc::new(Intervals::default());
    let work = Duration::from_millis(200);
    let base = serve(orders_app(
        replica(&cluster, Duration::from_millis(100)),
        0,
        work,
        Arc::clone(&intervals),
        |layer| layer.wait(Duration::from_secs(10)),
    ))
    .await;
    let client = http();
    assert_eq!(pay(&client, &base, 999).await.status(), StatusCode::OK); // warm up
    let before = intervals.len();
    let started = Instant::now();
    let queued: Vec<_> = (0..5)
        .map(|_| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move { pay(&client, &base, 3).await.status() })
        })
        .collect();
    for request in queued {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    let elapsed = started.elapsed();
    assert_eq!(intervals.len() - before, 5);
    assert!(
        intervals.overlaps().is_empty(),
        "{:?}",
        intervals.overlaps()
    );
    assert!(
        elapsed >= work * 5,
        "5 queued requests took only {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");

    // Past the deadline: a 409.
    let short = serve(orders_app(
        replica(&cluster, Duration::from_millis(100)),
        1,
        Duration::from_millis(10),
        Arc::clone(&intervals),
        |layer| layer.wait(Duration::from_millis(400)),
    ))
    .await;
    let slow = serve(orders_app(
        replica(&cluster, Duration::from_millis(100)),
        2,
        Duration::from_millis(2500),
        Arc::clone(&intervals),
        |layer| layer,
    ))
    .await;
    let holder = {
        let (client, slow) = (client.clone(), slow.clone());
        tokio::spawn(async move { pay(&client, &slow, 4).await.status() })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let handled = intervals.len();
    let asked = Instant::now();
    let late = pay(&client, &short, 4).await;
    let waited = asked.elapsed();
    assert_problem(late, StatusCode::CONFLICT, 5).await;
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_millis(2000),
        "gave up after {waited:?} (deadline 400 ms, holder busy for 2.5 s)"
    );
    assert_eq!(
        intervals.len(),
        handled,
        "the refused request ran its handler"
    );
    assert_eq!(holder.await.unwrap(), StatusCode::OK);
}
