//! redlock-actix against real actix-web servers (bound on loopback, several workers) and
//! real redis-server nodes: two replicas sharing the nodes, wait mode, auto-extension and
//! loss, every node down.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;
use redlock_actix::LockOptions;

// ---------------------------------------------------------------------------------------
// Two replicas sharing the nodes.

/// Two app instances (each its own client, like two replicas) on the same nodes: the same
/// key never runs twice at once; a busy key is 409 with `Retry-After`; different keys run
/// in parallel.
#[actix_rt::test]
async fn two_instances_serialize_a_key_answer_409_and_run_other_keys_in_parallel() {
    let cluster = Cluster::start(3).await;
    let log = Arc::new(Intervals::default());
    let config = |cluster: &Cluster| {
        DistributedLockConfig::new(redlock(cluster, Duration::from_millis(100))).options(
            LockOptions::new()
                .ttl(Duration::from_secs(2))
                .resource_prefix("order:"),
        )
    };
    let a = holding_server(2, config(&cluster), &log, 0).await;
    let b = holding_server(2, config(&cluster), &log, 1).await;
    let client = http();

    // Same key: waves of 8 concurrent requests, half to each instance.
    let mut replies = Vec::new();
    for _ in 0..5 {
        let wave = all(0..8, |i| {
            let server = if i % 2 == 0 { &a } else { &b };
            let url = server.url("/orders/42/hold?ms=150");
            let client = &client;
            async move { send(client, "POST", url).await }
        })
        .await;
        replies.extend(wave);
    }
    let ok: Vec<&Reply> = replies.iter().filter(|r| r.status == 200).collect();
    let busy: Vec<&Reply> = replies.iter().filter(|r| r.status == 409).collect();
    assert_eq!(ok.len() + busy.len(), replies.len(), "{replies:#?}");
    assert!(ok.len() >= 2, "too few holders to compare: {replies:#?}");
    assert!(
        busy.len() >= 5 * 4,
        "waves of 8 must mostly be refused: {replies:#?}"
    );
    assert!(ok.iter().all(|r| r.body.contains("order:42 held=true")));
    for reply in &busy {
        assert!(reply.is_problem(409), "{reply:?}");
        let secs = reply.retry_after.expect("409 carries Retry-After");
        assert!((1..=2).contains(&secs), "Retry-After {secs} for a 2 s TTL");
    }
    assert_eq!(log.len(), ok.len());
    assert!(
        log.overlaps().is_empty(),
        "overlapping holds: {:?}",
        log.overlaps()
    );

    // Different keys: 8 holds of 600 ms at once, all granted, together.
    let started = Instant::now();
    let parallel = all(0..8, |i| {
        let server = if i % 2 == 0 { &a } else { &b };
        let url = server.url(&format!("/orders/{i}/hold?ms=600"));
        let client = &client;
        async move { send(client, "POST", url).await }
    })
    .await;
    let elapsed = started.elapsed();
    assert!(parallel.iter().all(|r| r.status == 200), "{parallel:#?}");
    assert!(
        elapsed < Duration::from_millis(8 * 600 / 2),
        "8 different keys took {elapsed:?}: not run in parallel"
    );
    a.stop().await;
    b.stop().await;
}

/// Wait mode: queued requests for one key (on two instances) all succeed, one after the
/// other; a request still waiting at the deadline gets 409.
#[actix_rt::test]
async fn wait_mode_serializes_queued_requests_and_gives_up_at_the_deadline() {
    let cluster = Cluster::start(3).await;
    let log = Arc::new(Intervals::default());
    let config = |cluster: &Cluster| {
        DistributedLockConfig::new(redlock(cluster, Duration::from_millis(100))).options(
            LockOptions::new()
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(15)),
        )
    };
    let a = holding_server(2, config(&cluster), &log, 0).await;
    let b = holding_server(2, config(&cluster), &log, 1).await;
    let client = http();

    let started = Instant::now();
    let replies = all(0..10, |i| {
        let server = if i % 2 == 0 { &a } else { &b };
        let url = server.url("/orders/7/hold?ms=100");
        let client = &client;
        async move { send(client, "POST", url).await }
    })
    .await;
    let elapsed = started.elapsed();
    assert!(replies.iter().all(|r| r.status == 200), "{replies:#?}");
    assert_eq!(log.len(), 10);
    assert!(
        log.overlaps().is_empty(),
        "overlapping holds: {:?}",
        log.overlaps()
    );
    assert!(
        elapsed >= Duration::from_millis(10 * 100),
        "{elapsed:?}: not serialized"
    );

    // Past the deadline: another replica holds the key for longer than we wait.
    let short = DistributedLockConfig::new(redlock(&cluster, Duration::from_millis(100)))
        .options(LockOptions::new().wait(Duration::from_millis(400)));
    let c = holding_server(1, short, &log, 2).await;
    let other = redlock(&cluster, Duration::from_millis(100));
    let held = other.lock("7").ttl(Duration::from_secs(3)).await.unwrap();
    let started = Instant::now();
    let reply = post(&client, c.url("/orders/7/hold?ms=1")).await;
    let waited = started.elapsed();
    assert!(reply.is_problem(409), "{reply:?}");
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_millis(2500),
        "gave up after {waited:?}, the deadline is 400 ms"
    );
    let secs = reply.retry_after.unwrap();
    assert!(
        (1..=3).contains(&secs),
        "Retry-After {secs}: the holder has under 3 s left"
    );
    held.release().await.unwrap();
    assert_eq!(
        post(&client, c.url("/orders/7/hold?ms=1")).await.status,
        200
    );
    for server in [a, b, c] {
        server.stop().await;
    }
}

// ---------------------------------------------------------------------------------------
// Auto-extension and loss.

/// A handler running 5x the TTL keeps its lock all along (the other instance gets 409
/// throughout); when a majority of nodes is paused, the handler sees the loss through
/// its guard.
#[actix_rt::test]
async fn a_handler_keeps_its_lock_for_five_ttls_and_sees_its_loss() {
    let cluster = Cluster::start(5).await;
    let ttl = Duration::from_millis(400);
    let log = Arc::new(Intervals::default());
    let config = |cluster: &Cluster| {
        DistributedLockConfig::new(redlock(cluster, Duration::from_millis(50)))
            .options(LockOptions::new().ttl(ttl))
    };
    let a = holding_server(2, config(&cluster), &log, 0).await;
    let b = holding_server(2, config(&cluster), &log, 1).await;
    let client = http();

    let long_url = a.url(&format!("/orders/9/long?ms={}", (ttl * 5).as_millis()));
    let (held, refused) = tokio::join!(post(&client, long_url.clone()), async {
        actix_rt::time::sleep(Duration::from_millis(100)).await;
        let mut refused = Vec::new();
        for _ in 0..8 {
            refused.push(post(&client, b.url("/orders/9/hold?ms=1")).await);
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
        refused
    });
    assert_eq!(held.status, 200);
    assert!(held.body.starts_with("held throughout"), "{}", held.body);
    for reply in &refused {
        assert!(
            reply.is_problem(409) || reply.at > held.at,
            "another instance got the lock while it was held: {reply:?}"
        );
    }
    assert!(
        refused.iter().filter(|r| r.status == 409).count() >= 6,
        "{refused:#?}"
    );
    assert_eq!(
        post(&client, b.url("/orders/9/hold?ms=1")).await.status,
        200
    );

    // Loss: the handler waits on `lost()`; pause 3 of the 5 nodes.
    let (lost, paused_at) = tokio::join!(post(&client, a.url("/orders/10/until-lost")), async {
        actix_rt::time::sleep(ttl).await;
        for i in 0..3 {
            cluster.node(i).pause();
        }
        Instant::now()
    });
    for i in 0..3 {
        cluster.node(i).resume();
    }
    assert_eq!(lost.status, 200);
    assert_eq!(lost.body, "lost=true held=false token_cancelled=true");
    let noticed = lost.at - paused_at;
    assert!(
        noticed < ttl * 3,
        "the loss reached the handler {noticed:?} after the pause"
    );
    a.stop().await;
    b.stop().await;
}

// ---------------------------------------------------------------------------------------
// Faults.

/// Every node down: 503 (problem+json, Retry-After) within the per-node timeout, for
/// hung nodes (paused, also on a client that never connected) and dead ones.
#[actix_rt::test]
async fn all_nodes_down_is_503_within_the_node_timeout() {
    let mut cluster = Cluster::start(3).await;
    let node_timeout = Duration::from_millis(200);
    let log = Arc::new(Intervals::default());
    let config = |cluster: &Cluster| {
        DistributedLockConfig::new(redlock(cluster, node_timeout))
            .options(LockOptions::new().ttl(Duration::from_secs(2)))
    };
    let warm = holding_server(1, config(&cluster), &log, 0).await;
    let client = http();
    assert_eq!(
        post(&client, warm.url("/orders/1/hold?ms=1")).await.status,
        200
    );

    for i in 0..3 {
        cluster.node(i).pause();
    }
    let cold = holding_server(1, config(&cluster), &log, 1).await;
    for server in [&warm, &cold] {
        let started = Instant::now();
        let reply = post(&client, server.url("/orders/1/hold?ms=1")).await;
        let took = started.elapsed();
        assert!(reply.is_problem(503), "{reply:?}");
        assert!(reply.body.contains("unavailable"), "{}", reply.body);
        assert!(!reply.body.contains("no quorum"), "{}", reply.body);
        assert_eq!(reply.retry_after, Some(1));
        assert!(
            took < node_timeout + Duration::from_millis(800),
            "503 after {took:?}"
        );
    }
    for i in 0..3 {
        cluster.node(i).resume();
    }

    for i in 0..3 {
        cluster.node_mut(i).kill();
    }
    let started = Instant::now();
    let reply = post(&client, warm.url("/orders/1/hold?ms=1")).await;
    assert!(reply.is_problem(503), "{reply:?}");
    assert!(started.elapsed() < node_timeout + Duration::from_millis(800));
    warm.stop().await;
    cold.stop().await;
}
