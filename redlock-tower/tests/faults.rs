//! redlock-tower under faults, over real axum servers and redis-server nodes: long
//! handlers kept by auto-extension, a majority paused mid-request, every node hung or
//! down (503 fast, or fail-open).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;

/// A handler running 5x the TTL keeps its lock all along (auto-extension): the other
/// instance is refused the whole time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_handler_keeps_its_lock_by_auto_extension() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(400);
    let layer = LockLayer::new(
        replica(&cluster, Duration::from_millis(50)),
        PathParam::new("id"),
    )
    .options(LockOptions::new().resource_prefix("job:").ttl(ttl));
    let app = Router::new()
        .route(
            "/jobs/{id}",
            post(move |Extension(lock): Extension<LockHandle>| async move {
                let started = Instant::now();
                while started.elapsed() < ttl * 5 {
                    if !lock.is_held() {
                        return format!("lost after {:?}", started.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                format!("held for {:?}", started.elapsed())
            }),
        )
        .route_layer(layer);
    let holder = serve(app.clone()).await;
    let other_layer = LockLayer::new(
        replica(&cluster, Duration::from_millis(50)),
        PathParam::new("id"),
    )
    .options(LockOptions::new().resource_prefix("job:").ttl(ttl));
    let other = serve(
        Router::new()
            .route("/jobs/{id}", post(|| async { "other ran" }))
            .route_layer(other_layer),
    )
    .await;
    let client = http();
    let running = {
        let (client, holder) = (client.clone(), holder.clone());
        tokio::spawn(async move {
            let r = client
                .post(format!("{holder}/jobs/1"))
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = 0;
    while !running.is_finished() {
        let r = client.post(format!("{other}/jobs/1")).send().await.unwrap();
        if running.is_finished() {
            break;
        }
        assert_eq!(
            r.status(),
            StatusCode::CONFLICT,
            "got the lock while it was held"
        );
        refused += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, text) = running.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(text.starts_with("held for"), "{text}");
    assert!(refused >= 10, "only {refused} attempts while it ran");
}

/// Pausing a majority of nodes mid-request loses the lock: by default the handler is
/// told (`LockHandle::lost`) and decides; with `abort_on_loss` the handler is dropped
/// and the client gets a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_paused_mid_request_signals_loss_or_aborts() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(600);
    let handler_dropped = Arc::new(AtomicBool::new(false));
    let handler_finished = Arc::new(AtomicBool::new(false));
    let signal = LockLayer::new(
        replica(&cluster, Duration::from_millis(50)),
        PathParam::new("id"),
    )
    .options(LockOptions::new().resource_prefix("signal:").ttl(ttl));
    let abort = LockLayer::new(
        replica(&cluster, Duration::from_millis(50)),
        PathParam::new("id"),
    )
    .options(
        LockOptions::new()
            .resource_prefix("abort:")
            .ttl(ttl)
            .abort_on_loss(true),
    );
    let (dropped, finished) = (Arc::clone(&handler_dropped), Arc::clone(&handler_finished));
    let app = Router::new()
        .route(
            "/signal/{id}",
            post(|Extension(lock): Extension<LockHandle>| async move {
                let started = Instant::now();
                tokio::select! {
                    () = lock.lost() => format!("lost after {} ms", started.elapsed().as_millis()),
                    () = tokio::time::sleep(Duration::from_secs(8)) => "never lost".to_owned(),
                }
            })
            .route_layer(signal),
        )
        .route(
            "/abort/{id}",
            post(move || async move {
                let _guard = SetOnDrop(dropped);
                tokio::time::sleep(Duration::from_secs(8)).await;
                finished.store(true, Ordering::SeqCst);
                "finished"
            })
            .route_layer(abort),
        );
    let base = serve(app).await;
    let client = http();
    let signalled = {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move {
            let r = client
                .post(format!("{base}/signal/1"))
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap(), Instant::now())
        })
    };
    let aborted = {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move {
            let r = client.post(format!("{base}/abort/1")).send().await.unwrap();
            let at = Instant::now();
            (
                r.status(),
                r.headers().get("retry-after").cloned(),
                r.text().await.unwrap(),
                at,
            )
        })
    };
    tokio::time::sleep(ttl).await; // both hold their lock, extended once or more
    // Held on a majority (an acquisition returns there: the last node's `SET` may land
    // later, or never); pausing two nodes leaves a majority of none.
    assert!(cluster.count_keys("*signal:1*").await >= cluster.majority());
    assert!(cluster.count_keys("*abort:1*").await >= cluster.majority());
    cluster.node(0).pause();
    cluster.node(1).pause();
    let paused_at = Instant::now();
    let (status, text, at) = signalled.await.unwrap();
    let (abort_status, retry_after, abort_body, abort_at) = aborted.await.unwrap();
    cluster.node(0).resume();
    cluster.node(1).resume();

    assert_eq!(status, StatusCode::OK);
    assert!(text.starts_with("lost after"), "{text}");
    assert!(
        at - paused_at < Duration::from_secs(2),
        "{:?}",
        at - paused_at
    );

    assert_eq!(
        abort_status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{abort_body}"
    );
    assert!(retry_after.is_some());
    assert!(abort_body.contains("was lost"), "{abort_body}");
    assert!(
        abort_at - paused_at < Duration::from_secs(2),
        "{:?}",
        abort_at - paused_at
    );
    assert!(
        handler_dropped.load(Ordering::SeqCst),
        "the handler was not dropped"
    );
    assert!(!handler_finished.load(Ordering::SeqCst));
}

/// With every node hung (paused), a request gets a 503 within about the per-node
/// timeout, never hangs; with every node down, fail-open lets it through (unlocked,
/// logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_down_answer_503_fast_or_fail_open() {
    let mut cluster = Cluster::start(3).await;
    let node_timeout = Duration::from_millis(100);
    let handled = Arc::new(AtomicUsize::new(0));
    let handler = {
        let handled = Arc::clone(&handled);
        move |lock: Option<Extension<LockHandle>>| async move {
            handled.fetch_add(1, Ordering::SeqCst);
            if lock.is_some() { "locked" } else { "unlocked" }
        }
    };
    let closed = LockLayer::new(replica(&cluster, node_timeout), PathParam::new("id"))
        .options(LockOptions::new().resource_prefix("closed:"));
    let open = LockLayer::new(replica(&cluster, node_timeout), PathParam::new("id")).options(
        LockOptions::new()
            .resource_prefix("fail-open-test:")
            .fail_open(true),
    );
    let app = Router::new()
        .route("/closed/{id}", post(handler.clone()).route_layer(closed))
        .route("/open/{id}", post(handler).route_layer(open));
    let base = serve(app).await;
    let client = http();
    for path in ["closed", "open"] {
        let r = client
            .post(format!("{base}/{path}/1"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.text().await.unwrap(), "locked"); // nodes up: locked
    }
    let before = handled.load(Ordering::SeqCst);

    for i in 0..3 {
        cluster.node(i).pause();
    }
    let asked = Instant::now();
    let r = client
        .post(format!("{base}/closed/2"))
        .send()
        .await
        .unwrap();
    let took = asked.elapsed();
    let body = assert_problem(r, StatusCode::SERVICE_UNAVAILABLE, 5).await;
    assert!(body.contains("urn:redlock:unavailable"), "{body}");
    assert!(took < node_timeout * 10, "503 after {took:?}");
    let asked = Instant::now();
    let r = client.post(format!("{base}/open/2")).send().await.unwrap();
    assert!(asked.elapsed() < node_timeout * 10, "{:?}", asked.elapsed());
    assert_eq!(r.text().await.unwrap(), "unlocked");
    for i in 0..3 {
        cluster.node(i).resume();
    }

    for i in 0..3 {
        cluster.node_mut(i).kill();
    }
    let asked = Instant::now();
    let r = client
        .post(format!("{base}/closed/3"))
        .send()
        .await
        .unwrap();
    assert_problem(r, StatusCode::SERVICE_UNAVAILABLE, 5).await;
    assert!(asked.elapsed() < node_timeout * 10, "{:?}", asked.elapsed());
    let r = client.post(format!("{base}/open/3")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), "unlocked");
    assert_eq!(
        handled.load(Ordering::SeqCst) - before,
        2,
        "fail-closed ran a handler"
    );
    let logs = redlock_testkit::logs::text();
    assert!(
        logs.lines().any(|l| l.contains("fail-open")
            && l.contains("WARN")
            && l.contains("fail-open-test:3")),
        "no fail-open warning in:\n{logs}"
    );
}
