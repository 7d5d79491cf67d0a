//! What a lock cycle asks of each node, counted by real redis-server nodes
//! (`INFO commandstats`): an uncontended cycle is one `SET` and one compare-and-delete,
//! as in the bare Redlock algorithm; the queue costs only when someone waits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redlock_core::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

async fn reset_stats(cluster: &Cluster) {
    for i in 0..cluster.len() {
        assert!(
            cluster.node(i).reset_stats().await,
            "node {i} did not answer"
        );
    }
}

/// `try_lock` and `lock` on free resources, then `release`, with the defaults (wake on
/// release, the queue, the restart checks): each node runs, per cycle, one `SET` and one
/// script that reads the key and deletes it. No `EXISTS` of a queue, no `PUBLISH`, no
/// read of anything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_a_set_and_a_compare_and_delete() {
    const CYCLES: u64 = 20;
    let cluster = Cluster::start(3).await;
    // The defaults, but a short maximum TTL: the restart quarantine of nodes seen for
    // the first time lasts that long; and a node timeout a loaded machine keeps (a
    // command that timed out on a node may never run there, and be missing from its
    // count).
    let redlock = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(1))
        .max_ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redlock.ready().await {
        assert!(
            Instant::now() < deadline,
            "the nodes never came out of quarantine"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Connections, their checks and the scripts' loading, before counting.
    redlock
        .try_lock("warm-up")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // The release returned at a majority: the last node may run the warm-up's commands
    // after the statistics are reset, and count them (or never run its `SET`, if the
    // acquisition was decided before its connection was up). Wait until the nodes are
    // quiet: no lock command for longer than the node timeout.
    let lock_calls = || async {
        let mut all = Vec::new();
        for node in 0..cluster.len() {
            let mut calls = cluster.node(node).command_calls().await;
            calls.retain(|name, _| ["set", "evalsha", "get", "del"].contains(&name.as_str()));
            all.push(calls);
        }
        all
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = lock_calls().await;
    loop {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = lock_calls().await;
        if now == last {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes never went quiet: {now:?}"
        );
        last = now;
    }
    for one_shot in [true, false] {
        reset_stats(&cluster).await;
        for i in 0..CYCLES {
            let resource = format!("cycle:{one_shot}:{i}");
            let lock = if one_shot {
                redlock.try_lock(resource).await.unwrap()
            } else {
                redlock.lock(resource).await.unwrap()
            };
            lock.release().await.unwrap();
        }
        // A release completes once a majority answered: wait for the last to reach
        // every node (more commands than expected fail at the deadline all the same).
        let expected: BTreeMap<String, u64> = ["set", "evalsha", "get", "del"]
            .into_iter()
            .map(|name| (name.to_owned(), CYCLES))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        for node in 0..cluster.len() {
            loop {
                let mut calls = cluster.node(node).command_calls().await;
                // This test's own `INFO` and `CONFIG RESETSTAT`, and the handshake of its
                // connections (`CLIENT SETINFO`, which Valkey and Redis 7.2 count).
                calls.retain(|name, _| {
                    !["info", "config", "client", "hello"]
                        .iter()
                        .any(|own| name.starts_with(own))
                });
                if calls == expected {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {node}, {}: the commands of {CYCLES} uncontended cycles: {calls:?}, expected {expected:?}",
                    if one_shot { "try_lock" } else { "lock" }
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// A waiter marks the key it queues for; the holder still extends its lock and, on its
/// release, hands it over to the waiter, which gets it at once rather than at its retry
/// delay (1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_marks_the_key_and_gets_the_lock_on_release() {
    let cluster = Cluster::start(3).await;
    // A node timeout a loaded machine keeps (an acquisition, like a waiter's mark,
    // returns at a majority: a node slower than the timeout would hold no key).
    let client = || {
        redlock_testkit::builder(&cluster)
            .ttl(Duration::from_secs(10))
            .node_timeout(Duration::from_millis(500))
            .retry(
                RetryPolicy::deadline(Duration::from_secs(20))
                    .with_delay(Duration::from_secs(1), Duration::ZERO),
            )
            .build()
            .unwrap()
    };
    let (holder, waiter) = (client(), client());
    let mut lock = holder.lock("marked").await.unwrap();
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("marked").await.unwrap();
        let at = Instant::now();
        lock.release().await.unwrap();
        at
    });
    // The waiter queues (and marks the key) on its first attempt's refusal: on a
    // majority of the nodes at least (it goes on once a majority took its place).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut values: Vec<Option<String>> = Vec::new();
        for node in 0..cluster.len() {
            values.push(
                cluster
                    .node(node)
                    .query(redis::cmd("GET").arg("redlock:{marked}"))
                    .await
                    .unwrap(),
            );
        }
        let marked = values
            .iter()
            .filter(|v| v.as_deref().is_some_and(|v| v.ends_with('+')))
            .count();
        if marked > cluster.len() / 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never marked the key on a majority: {values:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lock.extend(Duration::from_secs(5))
        .await
        .expect("a marked key is still the holder's");
    // The listing counts one acquisition on every node that has the key, marked or not.
    // The holder's SET to the last node may land after the values above were read (or
    // never, if it timed out): compare the listing with the nodes read right after it,
    // until both agree (a key only ever lands, so they do once it has).
    let get = redis::cmd("GET").arg("redlock:{marked}").clone();
    redlock_testkit::until(
        "the listing counts every node with the key",
        Duration::from_secs(5),
        || {
            let (holder, cluster, get) = (&holder, &cluster, &get);
            async move {
                let listed = holder.locks("marked").await.unwrap().locks;
                let values: Vec<Option<String>> = cluster.query_each(get).await;
                assert_eq!(listed.len(), 1, "{listed:?}");
                let holding = values.iter().filter(|v| v.is_some()).count();
                assert!(holding >= cluster.majority(), "{values:?}");
                (listed[0].holding == holding).then_some(())
            }
        },
    )
    .await;
    let released = Instant::now();
    lock.release().await.unwrap();
    let took = waiting.await.unwrap() - released;
    assert!(
        took < Duration::from_millis(500),
        "the waiter got the lock {took:?} after the release"
    );
}
