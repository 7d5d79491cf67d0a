//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod replicas;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redlock_core::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

/// A client over `cluster` with a per-node timeout and a patient retry policy.
pub fn client(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    client_for(cluster.urls(), node_timeout)
}

pub fn client_for(urls: Vec<String>, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        // The kit's nodes are seconds old: with the restart quarantine on, none would
        // vote for the first TTL. These tests are about other things; the quarantine
        // has its own (tests/tests/safety.rs).
        .restart_quarantine(false)
        .node_timeout(node_timeout)
        .ttl(Duration::from_secs(5))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(20))
                .with_delay(Duration::from_millis(1), Duration::from_millis(5)),
        )
        .build()
        .expect("valid configuration")
}

/// One hold: start, end (monotonic clock), holder id.
pub type Hold = (Instant, Instant, usize);

/// One uncontended lock + release of `resource`, which must succeed.
pub async fn cycle(redlock: &Redlock, resource: &str) {
    let lock = redlock.try_lock(resource).await.expect("lock");
    assert!(lock.release().await.expect("release").was_held());
}

/// Hold intervals on one monotonic clock; `overlaps` finds any two that intersect.
#[derive(Default)]
pub struct Intervals(Mutex<Vec<Hold>>);

impl Intervals {
    pub fn record(&self, start: Instant, end: Instant, who: usize) {
        self.0.lock().unwrap().push((start, end, who));
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Pairs of overlapping intervals (sorted by start, each compared with the next).
    pub fn overlaps(&self) -> Vec<(Hold, Hold)> {
        let mut all = self.0.lock().unwrap().clone();
        all.sort_by_key(|i| i.0);
        all.windows(2)
            .filter(|w| w[1].0 < w[0].1)
            .map(|w| (w[0], w[1]))
            .collect()
    }
}

/// Waits (up to 2 s) until `pattern` matches `expected` keys over the cluster: commands to
/// the slower nodes complete after an operation returns at its quorum.
pub async fn settle_keys(cluster: &Cluster, pattern: &str, expected: usize) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let found = cluster.count_keys(pattern).await;
        if found == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pattern}: {found} keys, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sets `key` on node `node` to a value no client holds (a stray lock) for a minute, so
/// that node says no to acquisitions of it.
pub async fn set_stray(cluster: &Cluster, node: usize, key: &str) {
    let _: () = cluster
        .node(node)
        .query(
            redis::cmd("SET")
                .arg(key)
                .arg("stray")
                .arg("PX")
                .arg(60_000),
        )
        .await
        .expect("node answers");
}
