//! redlock-tower with streaming bodies over real axum servers and redis-server nodes:
//! the lock lives as long as the body, and a client that leaves (mid-stream, or while
//! waiting) leaves no lock behind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;

/// `GET /stream/{id}`: a body of `chunks` chunks, `gap` apart (endless with
/// `u32::MAX`); `dropped` is set when the server drops the stream.
fn stream_app(
    redlock: Redlock,
    chunks: u32,
    gap: Duration,
    dropped: Arc<AtomicBool>,
    hold: Hold,
) -> Router {
    let layer = LockLayer::new(redlock, PathParam::new("id")).options(
        LockOptions::new()
            .resource_prefix("stream:")
            .ttl(Duration::from_secs(10))
            .hold(hold),
    );
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
    // The acquisition returned at a majority: the last node's `SET` may land later, or
    // never.
    assert!(
        cluster.count_keys("*stream:9*").await >= cluster.majority(),
        "the lock is on a majority of the nodes"
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
