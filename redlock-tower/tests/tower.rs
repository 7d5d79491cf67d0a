//! redlock-tower over HTTP: real axum servers on loopback ports (two app instances
//! sharing the Redis nodes stand for two replicas), real redis-server nodes, and a real
//! HTTP client (reqwest).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use redlock_core::{LockHandle, Redlock};
use redlock_testkit::Cluster;
use redlock_testkit::Intervals;
use redlock_tower::extract::{Header, PathParam};
use redlock_tower::{Hold, LockLayer};
use reqwest::StatusCode;

/// Serves `app` on a free loopback port until the test's runtime ends; its base URL.
async fn serve(app: Router) -> String {
    capture_logs();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// One replica's lock client: its own connections to the shared nodes.
fn replica(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    redlock_testkit::client(cluster, node_timeout)
}

/// Sets a flag when dropped (to see a handler or a body stream cancelled).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `POST /orders/{id}/pay`, locked per order: the handler works for `work` and records
/// its interval, tagged with the instance.
fn orders_app(
    redlock: Redlock,
    instance: usize,
    work: Duration,
    intervals: Arc<Intervals>,
    configure: impl FnOnce(LockLayer<PathParam>) -> LockLayer<PathParam>,
) -> Router {
    let layer = configure(LockLayer::new(redlock, PathParam::new("id")).key_prefix("order:"));
    Router::new()
        .route(
            "/orders/{id}/pay",
            post(move |Extension(lock): Extension<LockHandle>| async move {
                let start = Instant::now();
                assert!(lock.is_held());
                tokio::time::sleep(work).await;
                intervals.record(start, Instant::now(), instance);
                format!("paid under {}", lock.resource())
            }),
        )
        .route_layer(layer)
}

async fn pay(client: &reqwest::Client, base: &str, order: u32) -> reqwest::Response {
    client
        .post(format!("{base}/orders/{order}/pay"))
        .send()
        .await
        .unwrap()
}

/// A 409 or 503 as the layer renders it: problem+json with a `Retry-After` of 1 s or
/// more and at most `max_secs`; returns the body.
async fn assert_problem(response: reqwest::Response, status: StatusCode, max_secs: u64) -> String {
    assert_eq!(response.status(), status);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=max_secs).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body = response.text().await.unwrap();
    assert!(
        body.contains(&format!("\"status\":{}", status.as_u16())),
        "{body}"
    );
    body
}

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
    assert!(body.contains("order:7"), "{body}");
    assert!(body.contains("urn:redlock:busy"), "{body}");

    // Another order is not affected.
    assert_eq!(pay(&client, &other, 8).await.status(), StatusCode::OK);

    assert_eq!(first.await.unwrap(), StatusCode::OK);
    // Released when the holder's response was done: free at once, not at its TTL.
    assert_eq!(pay(&client, &other, 7).await.status(), StatusCode::OK);
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

/// `GET /stream/{id}`: a body of `chunks` chunks, `gap` apart (endless with
/// `u32::MAX`); `dropped` is set when the server drops the stream.
fn stream_app(
    redlock: Redlock,
    chunks: u32,
    gap: Duration,
    dropped: Arc<AtomicBool>,
    hold: Hold,
) -> Router {
    let layer = LockLayer::new(redlock, PathParam::new("id"))
        .key_prefix("stream:")
        .ttl(Duration::from_secs(10)) // long: a lock left behind would show
        .hold(hold);
    Router::new()
        .route(
            "/stream/{id}",
            get(move || async move {
                let guard = SetOnDrop(dropped);
                let stream =
                    futures_util::stream::unfold((0u32, guard), move |(i, guard)| async move {
                        if i >= chunks {
                            return None;
                        }
                        if i > 0 {
                            tokio::time::sleep(gap).await;
                        }
                        let chunk = Bytes::from(format!("chunk {i}\n"));
                        Some((Ok::<_, std::io::Error>(chunk), (i + 1, guard)))
                    });
                Body::from_stream(stream)
            }),
        )
        .route_layer(layer)
}

/// The lock lives until the last chunk has been sent: meanwhile the key is busy; right
/// after, it is free. With `Hold::UntilHead` it is free as soon as the head is out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_body_keeps_the_lock_until_its_last_chunk() {
    let cluster = Cluster::start(3).await;
    let gap = Duration::from_millis(150);
    let dropped = Arc::new(AtomicBool::new(false));
    let base = serve(stream_app(
        replica(&cluster, Duration::from_millis(100)),
        5,
        gap,
        Arc::clone(&dropped),
        Hold::UntilBodyEnd,
    ))
    .await;
    let client = http();
    let mut streaming = client.get(format!("{base}/stream/1")).send().await.unwrap();
    assert_eq!(streaming.status(), StatusCode::OK);
    let mut received = String::new();
    let first = streaming.chunk().await.unwrap().unwrap();
    received.push_str(std::str::from_utf8(&first).unwrap());
    // The handler has returned; its body is still being produced: the key is busy.
    let busy = client.get(format!("{base}/stream/1")).send().await.unwrap();
    assert_problem(busy, StatusCode::CONFLICT, 10).await;
    while let Some(chunk) = streaming.chunk().await.unwrap() {
        received.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert_eq!(received.lines().count(), 5, "{received}");
    let done = Instant::now();
    // Free right after the last chunk (the release runs in the background).
    let free = get_until_ok(&client, &format!("{base}/stream/1"), Duration::from_secs(2)).await;
    assert!(free < Duration::from_secs(2), "{free:?}");
    assert!(done.elapsed() < Duration::from_secs(3));

    // Hold::UntilHead: the body streams without the lock.
    let head_only = serve(stream_app(
        replica(&cluster, Duration::from_millis(100)),
        5,
        gap,
        Arc::new(AtomicBool::new(false)),
        Hold::UntilHead,
    ))
    .await;
    let mut streaming = client
        .get(format!("{head_only}/stream/2"))
        .send()
        .await
        .unwrap();
    streaming.chunk().await.unwrap().unwrap();
    let free = get_until_ok(
        &client,
        &format!("{head_only}/stream/2"),
        Duration::from_secs(1),
    )
    .await;
    assert!(free < Duration::from_secs(1));
    assert!(
        streaming.chunk().await.unwrap().is_some(),
        "the first body was still streaming"
    );
}

/// GETs `url` until a 200 (whose body it does not wait for), up to `limit`; how long
/// it took.
async fn get_until_ok(client: &reqwest::Client, url: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let response = client.get(url).send().await.unwrap();
        if response.status() == StatusCode::OK {
            return started.elapsed();
        }
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert!(
            started.elapsed() < limit,
            "still locked after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that disconnects mid-stream releases the lock at once (TTL 10 s: a lock
/// left to expire would keep the key busy for seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnecting_mid_stream_releases_the_lock_at_once() {
    let cluster = Cluster::start(3).await;
    let dropped = Arc::new(AtomicBool::new(false));
    let base = serve(stream_app(
        replica(&cluster, Duration::from_millis(100)),
        u32::MAX, // endless
        Duration::from_millis(50),
        Arc::clone(&dropped),
        Hold::UntilBodyEnd,
    ))
    .await;
    let client = http();
    let mut streaming = client.get(format!("{base}/stream/9")).send().await.unwrap();
    streaming.chunk().await.unwrap().unwrap();
    streaming.chunk().await.unwrap().unwrap();
    assert_eq!(
        cluster.count_keys("*stream:9*").await,
        3,
        "the lock is on every node"
    );
    drop(streaming); // the client goes away mid-body
    drop(client);

    let other = http();
    let took = get_until_ok(&other, &format!("{base}/stream/9"), Duration::from_secs(3)).await;
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(dropped.load(Ordering::SeqCst), "the server kept streaming");
}

/// A request that is still waiting for the lock when its client goes away leaves
/// nothing behind: its handler never runs, and the key is free once the holder is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_while_waiting_leaves_no_lock_behind() {
    let cluster = Cluster::start(3).await;
    let intervals = Arc::new(Intervals::default());
    let base = serve(orders_app(
        replica(&cluster, Duration::from_millis(100)),
        0,
        Duration::from_millis(1200),
        Arc::clone(&intervals),
        |layer| {
            layer
                .wait(Duration::from_secs(10))
                .ttl(Duration::from_secs(10))
        },
    ))
    .await;
    let client = http();
    let holder = {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move { pay(&client, &base, 5).await.status() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // This client gives up after 300 ms, while its request waits for the lock.
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gave_up = impatient.post(format!("{base}/orders/5/pay")).send().await;
    assert!(gave_up.unwrap_err().is_timeout());
    drop(impatient);
    assert_eq!(holder.await.unwrap(), StatusCode::OK);
    // The holder is done: the key must be free at once (fail fast proves it), and only
    // the holder's handler ran.
    let check = serve(orders_app(
        replica(&cluster, Duration::from_millis(100)),
        1,
        Duration::from_millis(10),
        Arc::clone(&intervals),
        |layer| layer,
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await; // the holder's background release
    assert_eq!(pay(&client, &check, 5).await.status(), StatusCode::OK);
    assert_eq!(intervals.len(), 2, "the abandoned request ran its handler");
    assert!(intervals.overlaps().is_empty());
}

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
    .key_prefix("job:")
    .ttl(ttl);
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
    .key_prefix("job:")
    .ttl(ttl);
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
    .key_prefix("signal:")
    .ttl(ttl);
    let abort = LockLayer::new(
        replica(&cluster, Duration::from_millis(50)),
        PathParam::new("id"),
    )
    .key_prefix("abort:")
    .ttl(ttl)
    .abort_on_loss(true);
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
    assert_eq!(cluster.count_keys("*signal:1*").await, 3);
    assert_eq!(cluster.count_keys("*abort:1*").await, 3);
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
    let closed =
        LockLayer::new(replica(&cluster, node_timeout), PathParam::new("id")).key_prefix("closed:");
    let open = LockLayer::new(replica(&cluster, node_timeout), PathParam::new("id"))
        .key_prefix("fail-open-test:")
        .fail_open(true);
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
    let logs = logs();
    assert!(
        logs.lines().any(|l| l.contains("fail-open")
            && l.contains("WARN")
            && l.contains("fail-open-test:3")),
        "no fail-open warning in:\n{logs}"
    );
}

/// A required header that is missing is a 400 (the handler does not run); a request for
/// which the extractor says "no lock" runs without one, in parallel with others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_required_key_is_400_and_no_key_takes_no_lock() {
    let cluster = Cluster::start(3).await;
    let redlock = replica(&cluster, Duration::from_millis(100));
    let handled = Arc::new(AtomicUsize::new(0));
    let intervals = Arc::new(Intervals::default());
    let idempotent = LockLayer::new(redlock.clone(), Header::new("Idempotency-Key").required())
        .key_prefix("idem:");
    // Only POSTs are serialized per tenant; GETs pass.
    let by_tenant = LockLayer::new(redlock, |request: &Request| {
        (request.method() == axum::http::Method::POST)
            .then(|| {
                request
                    .headers()
                    .get("x-tenant")?
                    .to_str()
                    .ok()
                    .map(str::to_owned)
            })
            .flatten()
    })
    .key_prefix("tenant:");
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

/// Everything logged by this test binary, captured once for all its tests.
fn logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned()
}

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber before any test runs (a constructor would need a
/// crate; every test calls `serve`, so it is done there).
fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        tracing_subscriber::fmt()
            .with_env_filter("redlock_tower=debug,redlock_core=warn")
            .with_ansi(false)
            .with_writer(|| Capture)
            .init();
    });
}
