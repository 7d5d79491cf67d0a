//! Node health as `node_status()` and `ready()` report it, against real redis-server
//! nodes that go away and come back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::Redlock;
use redlock_testkit::Cluster;

/// Polls `node_status()` every 50 ms until node `i` votes again; how long it took.
async fn until_votes(redlock: &Redlock, i: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let status = redlock.node_status().await;
        if status[i].votes() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "node {i} still not healthy after {limit:?}: {:?}",
            status[i]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A node whose connection broke (killed, then restarted on its port) is reported
/// reachable again by the next status call, and healthy once its restart quarantine is
/// over; `ready()` follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_recovers_after_the_node_comes_back() {
    let mut cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster)
        .restart_quarantine(true) // the test waits the fresh nodes' quarantine out
        .ttl(Duration::from_millis(500))
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    // Fresh nodes are in quarantine for the TTL (plus a second of rounding).
    until_votes(&redlock, 0, Duration::from_secs(5)).await;
    assert!(redlock.ready().await);

    cluster.node_mut(0).kill();
    let status = redlock.node_status().await;
    assert!(status[0].reachable.is_err(), "{:?}", status[0]);

    cluster.node_mut(0).restart().await;
    // Reachable at the first call: the broken connection is replaced there and then.
    let status = redlock.node_status().await;
    assert!(status[0].reachable.is_ok(), "{:?}", status[0]);
    assert!(
        status[0].quarantined.is_some(),
        "restarted: {:?}",
        status[0]
    );
    // Healthy once the quarantine (500 ms + 1 s) is over.
    let took = until_votes(&redlock, 0, Duration::from_secs(4)).await;
    assert!(
        took <= Duration::from_millis(1_700),
        "healthy after {took:?}"
    );
    assert!(redlock.ready().await);
    redlock
        .try_lock("back")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
