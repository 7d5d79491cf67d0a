//! Waiting for a busy lock under faults, against real redis-server nodes: waiters honour
//! the retry delay whatever the nodes say, a dead heir is skipped, every client gets a
//! bounded wait, and a free resource can always be try-locked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::{Error, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, Sandbox};

/// Scripts clients ran on node `i` since its last statistics reset (`EVALSHA`: queued
/// attempts, releases, leaving the queue).
async fn lock_commands(cluster: &Cluster, i: usize) -> u64 {
    let calls = cluster.node(i).command_calls().await;
    ["evalsha", "eval"]
        .iter()
        .filter_map(|name| calls.get(*name))
        .sum()
}

async fn reset_stats(cluster: &Cluster) {
    for i in 0..cluster.len() {
        assert!(
            cluster.node(i).reset_stats().await,
            "node {i} did not answer"
        );
    }
}

fn client(cluster: &Cluster, retry: RetryPolicy) -> Redlock {
    client_for(cluster.urls(), retry)
}

fn client_for(urls: Vec<String>, retry: RetryPolicy) -> Redlock {
    redlock_testkit::builder_for(urls)
        .ttl(Duration::from_secs(30))
        .fencing(true)
        .retry(retry)
        .build()
        .unwrap()
}

/// The holder's keys cover a bare majority (3 of 5: two nodes lost them, as after a
/// restart without persistence). Waiters win the two empty nodes on every attempt and
/// miss the quorum; neither the cleanup of such a lost attempt nor its hand-over to the
/// next queued waiter may make anyone retry before its retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_do_not_spin_on_a_bare_majority() {
    let cluster = Cluster::start(5).await;
    let delay = Duration::from_millis(100);
    let retry = RetryPolicy::deadline(Duration::from_secs(5)).with_delay(delay, delay / 2);
    // A node timeout a loaded machine keeps: the holder's SET is to reach every node.
    let holder = redlock_testkit::builder(&cluster)
        .ttl(Duration::from_secs(30))
        .fencing(true)
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let lock = holder.lock("spin").await.unwrap();
    let key = holder.key_for("spin");
    // On every node before two lose it: the last node's SET may land after the lock
    // returned (on node 3 or 4 after the deletion, the holder would keep 4 nodes; on
    // node 0 to 2 later, waiters could win).
    cluster.settle_keys(&key, 5).await;
    for i in [3, 4] {
        let () = cluster
            .node(i)
            .query(redis::cmd("DEL").arg(&key))
            .await
            .unwrap();
    }
    reset_stats(&cluster).await;
    let started = Instant::now();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let redlock = client(&cluster, retry);
            tokio::spawn(async move { redlock.lock("spin").await.map(drop) })
        })
        .collect();
    for waiter in waiters {
        let outcome = waiter.await.unwrap();
        assert!(
            matches!(outcome, Err(Error::Taken { .. })),
            "a bare majority still holds the lock: {outcome:?}"
        );
    }
    let waited = started.elapsed();
    // Per waiter and retry interval: one attempt and its cleanup on each node, plus
    // leaving the queue once (`intervals` counts the shortest delay: no jitter).
    let intervals = (waited.as_millis() / delay.as_millis()) as u64 + 1;
    let bound = 4 * intervals * 2 + 4 * 4;
    for i in 0..cluster.len() {
        let calls = lock_commands(&cluster, i).await;
        eprintln!("node {i}: {calls} lock commands in {waited:?} (bound {bound})");
        assert!(
            calls <= bound,
            "node {i}: {calls} lock commands in {waited:?} from 4 waiters (at most {bound})"
        );
    }
    // Each attempt that won an empty node raised its counter by one, above the holder's
    // token, or above the node's clock floor (its clock rounded down to half the max TTL,
    // 15 s) if that passed the token meanwhile.
    let fence = holder.fence_key_for("spin");
    let token = lock.fencing_token().unwrap();
    for i in [3, 4] {
        let counter: Option<u64> = cluster
            .node(i)
            .query(redis::cmd("GET").arg(&fence))
            .await
            .unwrap();
        let (secs, micros): (u64, u64) = cluster.node(i).query(&redis::cmd("TIME")).await.unwrap();
        let now_us = secs * 1_000_000 + micros;
        let floor = now_us - now_us % 15_000_000;
        let raised = counter.unwrap_or(0).saturating_sub(token.max(floor));
        assert!(
            raised <= 4 * intervals + 2,
            "node {i}: fencing counter {counter:?} raised {raised} times above {} after {waited:?}",
            token.max(floor)
        );
    }
    lock.release().await.unwrap();
}

/// Waits until `n` waiters are queued for `resource` on a majority of nodes (a loaded
/// machine may take longer than any fixed sleep to get a waiter's first attempt out).
async fn queued_on_a_majority(cluster: &Cluster, resource: &str, n: u64) {
    let queue = format!("redlock:{{{resource}}}:queue");
    cluster
        .settle_each(
            &format!("{n} waiters queued for {resource}"),
            redis::cmd("ZCARD").arg(&queue),
            Duration::from_secs(10),
            |sizes: &[Option<u64>]| {
                sizes.iter().filter(|s| s.unwrap_or(0) >= n).count() >= cluster.majority()
            },
        )
        .await;
}

/// Only a wake-up or a hand-over makes a waiter with this policy quick: its timer says 1 s.
fn slow_retry() -> RetryPolicy {
    RetryPolicy::deadline(Duration::from_secs(20))
        .with_delay(Duration::from_secs(1), Duration::ZERO)
}

/// The head of the queue died while waiting (its process crashed: it left no word): the
/// release hands the lock over to it, and once that hand-over's time is over, on to the
/// next live waiter, which gets it within tens of milliseconds, not its retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_heir_is_skipped() {
    let cluster = Cluster::start(3).await;
    let holder = client(&cluster, slow_retry());
    let lock = holder.lock("heir").await.unwrap();
    let mut doomed = Sandbox::start(&cluster).await;
    let urls = doomed.urls();
    doomed
        .run(async move {
            tokio::spawn(async move {
                let redlock = client_for(urls, slow_retry());
                let _never = redlock.lock("heir").await;
            });
        })
        .await;
    // The doomed waiter heads the queue (on a majority) before the live one joins it.
    queued_on_a_majority(&cluster, "heir", 1).await;
    // Its timer says 3 s: far from what a hand-over takes, also on a loaded machine.
    // It listens for wake-ups if a node's subscriber answers within the node timeout:
    // 1 s here, since a waiter that cannot listen (a subscriber slower than 100 ms on a
    // loaded machine) is, by design, handed the lock only at its timed attempt.
    let live = redlock_testkit::builder_for(cluster.urls())
        .ttl(Duration::from_secs(30))
        .fencing(true)
        .node_timeout(Duration::from_secs(1))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(20))
                .with_delay(Duration::from_secs(3), Duration::ZERO),
        )
        .build()
        .unwrap();
    let waiting = tokio::spawn(async move {
        let lock = live.lock("heir").await.unwrap();
        let at = Instant::now();
        lock.release().await.unwrap();
        at
    });
    queued_on_a_majority(&cluster, "heir", 2).await;
    doomed.crash();
    let released = Instant::now();
    lock.release().await.unwrap();
    let took = waiting.await.unwrap() - released;
    // The hand-over time (25 ms) and a follow-up round trip, with room for a loaded
    // machine; before, the live waiter slept until its timer (about 2.8 s from here).
    assert!(
        took < Duration::from_secs(1),
        "the live waiter got the lock {took:?} after the release"
    );
}

/// Waiters whose process died left their places in the queue; the holder's release hands
/// the lock over to the first of them. The resource is free all the same: `try_lock`
/// takes it at once (it does not wait its turn, so a stale place cannot make it fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_resource_can_always_be_try_locked() {
    let cluster = Cluster::start(3).await;
    let holder = client(&cluster, slow_retry());
    let lock = holder.lock("stale").await.unwrap();
    let mut doomed = Sandbox::start(&cluster).await;
    let urls = doomed.urls();
    doomed
        .run(async move {
            for _ in 0..3 {
                let redlock = client_for(urls.clone(), slow_retry());
                tokio::spawn(async move {
                    let _never = redlock.lock("stale").await;
                });
            }
        })
        .await;
    queued_on_a_majority(&cluster, "stale", 3).await;
    doomed.crash();
    lock.release().await.unwrap();
    let newcomer = client(&cluster, slow_retry());
    let lock = newcomer
        .try_lock("stale")
        .await
        .expect("nobody holds the resource");
    lock.release().await.unwrap();
}
