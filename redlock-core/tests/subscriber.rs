//! Wake on release under faults, against real redis-server nodes: no release message
//! lost to a channel being unsubscribed. (The black-holed node: `leak.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::RetryPolicy;
use redlock_testkit::Cluster;

/// A channel being unsubscribed (its last waiter left a linger time ago) while a new
/// waiter subscribes it again: the new waiter still hears the release on every node.
/// One node's link is slow (100 ms each way), so dropping a channel takes a while there
/// (and, before, the fast nodes' unsubscriptions came after the new waiter had
/// subscribed them again); many rounds, each coming back within that while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_heard_while_the_channel_is_being_unsubscribed() {
    let cluster = Cluster::start_proxied(3).await;
    cluster.proxy(0).delay(Duration::from_millis(100));
    let build = || {
        redlock_testkit::builder(&cluster)
            .ttl(Duration::from_secs(5))
            .node_timeout(Duration::from_millis(500))
            .subscription_linger(Duration::from_millis(40))
            // Only a wake-up makes a waiter quick: its timer says 2 s.
            .retry(
                RetryPolicy::deadline(Duration::from_secs(20))
                    .with_delay(Duration::from_secs(2), Duration::ZERO),
            )
            .build()
            .unwrap()
    };
    let (holder, waiter) = (build(), build());
    // Connections opened (the slow node's takes a few of its round trips).
    for redlock in [&holder, &waiter] {
        assert!(redlock.ready().await);
    }
    let mut slow = Vec::new();
    for round in 0..30u64 {
        let lock = holder.lock("linger").await.unwrap();
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let lock = waiter.lock("linger").await.unwrap();
                let at = Instant::now();
                lock.release().await.unwrap();
                at
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = Instant::now();
        lock.release().await.unwrap();
        let took = waiting.await.unwrap() - released;
        // Heard on a fast node: a few ms. Deaf there, the waiter hears only the slow
        // node (about 200 ms), or nothing (its 2 s timer).
        if took > Duration::from_millis(100) {
            slow.push((round, took));
        }
        // Come back while the channel is being dropped: 45 to 135 ms after it fell idle.
        tokio::time::sleep(Duration::from_millis(45 + (round % 10) * 10)).await;
    }
    // The race this guards against (fast nodes unsubscribing after the new waiter had
    // subscribed them again) makes several rounds slow. One slow round alone is also
    // seen on a loaded machine with the race fixed, about one run in ten under full CPU
    // load: the waiter's vote then waits for the slow node; it is tolerated.
    assert!(
        slow.len() <= 1,
        "rounds where the fast nodes' release messages were lost: {slow:?}"
    );
}
