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

/// Every key of `resource` left on any node (the lock key; not its queue).
async fn keys_left(cluster: &Cluster, key: &str) -> usize {
    let mut left = 0;
    for i in 0..cluster.len() {
        let exists: i64 = cluster
            .node(i)
            .query(redis::cmd("EXISTS").arg(key))
            .await
            .unwrap_or(0);
        left += exists as usize;
    }
    left
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
        tokio::time::sleep(Duration::from_millis(150)).await;
        let exists: i64 = cluster
            .node(2)
            .query(redis::cmd("EXISTS").arg(&key))
            .await
            .unwrap();
        if exists != 0 {
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
        tokio::time::sleep(Duration::from_millis(150)).await;
        let key = redlock.key_for(&resource);
        assert_eq!(
            keys_left(&cluster, &key).await,
            0,
            "release dropped after {polls} poll(s) left the key"
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    let key = clients[0].key_for(resource);
    assert_eq!(
        keys_left(&cluster, &key).await,
        0,
        "a cancelled acquisition left its key"
    );
}
