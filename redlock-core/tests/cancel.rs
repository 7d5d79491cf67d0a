//! Cancelling a lock call or a release at any point leaves no key behind: the cleanup of
//! a failed attempt and the release are driven by tasks of their own, not by the future
//! the caller dropped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::future::{Future, IntoFuture};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use redlock_testkit::Cluster;
use redlock_testkit::client;

/// Polls `fut` until it is ready or has been polled `polls` times, letting the runtime
/// run between polls (so replies arrive), then drops it right after the last poll,
/// before the connections' tasks run again. True if it completed.
async fn poll_then_drop<F: Future>(fut: F, polls: usize) -> bool {
    let mut fut = pin!(fut);
    for poll in 1..=polls {
        let ready = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await;
        if ready {
            return true;
        }
        if poll < polls {
            tokio::task::yield_now().await;
        }
    }
    false
}

/// The nodes among `nodes` where `key` is left.
async fn keys_left(cluster: &Cluster, nodes: std::ops::Range<usize>, key: &str) -> usize {
    let mut left = 0;
    for i in nodes {
        let exists: i64 = cluster
            .node(i)
            .query(redis::cmd("EXISTS").arg(key))
            .await
            .unwrap_or(0);
        left += exists as usize;
    }
    left
}

/// Whether `key` is gone from nodes `nodes` within `within` (a release returns, or is
/// dropped, before its last node's command lands; far below the 30 s TTL the tests use,
/// so a key left behind is still told apart).
async fn gone(
    cluster: &Cluster,
    nodes: std::ops::Range<usize>,
    key: &str,
    within: Duration,
) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if keys_left(cluster, nodes.clone(), key).await == 0 {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A failed attempt (two of three nodes hold a stray key) is cancelled at every point
/// of its cleanup in turn: its own key on the third node is always removed, long before
/// its TTL.
#[tokio::test(flavor = "current_thread")]
async fn cancelled_cleanup_still_releases() {
    let cluster = Cluster::start(3).await;
    let redlock = client(&cluster, Duration::from_millis(200));
    let mut leaked = Vec::new();
    for polls in 1..40 {
        let resource = format!("cancel-cleanup-{polls}");
        let key = redlock.key_for(&resource);
        for i in 0..2 {
            cluster.set_stray(i, &key).await;
        }
        let acquire = redlock
            .try_lock(resource.as_str())
            .ttl(Duration::from_secs(30))
            .into_future();
        let completed = poll_then_drop(acquire, polls).await;
        // Gone long before its TTL (30 s): within 2 s (the cleanup's command may land
        // after a loaded machine's pause).
        if !gone(&cluster, 2..3, &key, Duration::from_secs(2)).await {
            leaked.push((polls, completed));
        }
    }
    assert!(
        leaked.is_empty(),
        "cancelled after n polls (n, completed): the attempt's key stayed on node 2: {leaked:?}"
    );
}

/// A release dropped right after its first poll still releases on every node.
#[tokio::test(flavor = "current_thread")]
async fn dropped_release_still_releases() {
    let cluster = Cluster::start(3).await;
    let redlock = client(&cluster, Duration::from_millis(200));
    for polls in 1..6 {
        let resource = format!("cancel-release-{polls}");
        let lock = redlock
            .lock(resource.as_str())
            .ttl(Duration::from_secs(30))
            .await
            .unwrap();
        poll_then_drop(lock.release(), polls).await;
        let key = redlock.key_for(&resource);
        assert!(
            gone(&cluster, 0..3, &key, Duration::from_secs(2)).await,
            "release dropped after {polls} poll(s) left the key: {} nodes hold it",
            keys_left(&cluster, 0..cluster.len(), &key).await
        );
    }
}

/// Acquisitions cancelled by a timeout at random points while they contend (split
/// votes, cleanups, hand-overs) leave nothing behind; the ones that won drop their lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_cancelled_under_contention_leave_nothing() {
    let cluster = Cluster::start(5).await;
    let clients: Vec<_> = (0..4)
        .map(|_| client(&cluster, Duration::from_millis(100)))
        .collect();
    let resource = "cancel-contended";
    let mut tasks = Vec::new();
    for i in 0..48u64 {
        let redlock = clients[(i % 4) as usize].clone();
        tasks.push(tokio::spawn(async move {
            let wait = Duration::from_micros(150 * (i % 16) + 50);
            let acquire = redlock
                .lock(resource)
                .ttl(Duration::from_secs(30))
                .into_future();
            // A lock that was won in time is dropped here: released in the background.
            let _ = tokio::time::timeout(wait, acquire).await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let key = clients[0].key_for(resource);
    assert!(
        gone(&cluster, 0..5, &key, Duration::from_secs(5)).await,
        "a cancelled acquisition left its key: {} nodes hold it",
        keys_left(&cluster, 0..cluster.len(), &key).await
    );
}
