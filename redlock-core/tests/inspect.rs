//! Inspection against real nodes: the listing of held locks (holders, per-node views,
//! agreement, fencing counters, pages, limits, nodes down), node health, and a forced
//! release that wakes waiters and makes the old holder's token stale.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redlock_core::inspect::Agreement;
use redlock_core::{Error, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn client(cluster: &Cluster, holder: &str) -> Redlock {
    redlock_testkit::builder(cluster)
        .holder(holder)
        .fencing(true)
        // Generous: these tests check what is listed and released, not node timeouts
        // (a node slower than the default 100 ms on a loaded machine would miss a key).
        .node_timeout(Duration::from_secs(1))
        .ttl(Duration::from_secs(5))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(10))
                .with_delay(Duration::from_millis(5), Duration::from_millis(20)),
        )
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_held_locks_with_holder_validity_and_fence() {
    let cluster = Cluster::start(3).await;
    let api = client(&cluster, "orders-api-1");
    let worker = client(&cluster, "worker-2");
    let a = api.lock("orders:1").await.unwrap();
    let b = worker
        .lock("orders:2")
        .ttl(Duration::from_secs(3))
        .await
        .unwrap();
    let many = api.lock_many(["orders:3", "orders:4"]).await.unwrap();
    let _outside = worker.lock("users:1").await.unwrap();
    // Glob characters in names and prefixes are taken literally.
    let _star = api.lock("a*b").await.unwrap();
    let _other = api.lock("axb").await.unwrap();
    // Each lock returned at its quorum: the last node's SET may still be on its way.
    cluster.settle_keys("redlock:{orders:*}", 4 * 3).await;

    let listing = api.locks("orders:").await.unwrap();
    assert!(listing.failures.is_empty() && !listing.truncated);
    let names: Vec<&str> = listing.locks.iter().map(|l| l.resource.as_str()).collect();
    assert_eq!(names, ["orders:1", "orders:2", "orders:3", "orders:4"]);
    let first = &listing.locks[0];
    assert_eq!(first.holder.as_deref(), Some("orders-api-1"));
    assert_eq!(first.agreement, Agreement::Majority);
    assert_eq!(first.holding, 3);
    // At least the holder's token (a node may have counted an attempt that lost).
    assert!(first.fencing_token >= a.fencing_token(), "{first:#?}");
    let validity = first.validity.unwrap();
    assert!(validity <= Duration::from_secs(5) && validity > Duration::from_secs(3));
    assert!(first.nodes.iter().all(|n| n.answered && n.held));
    assert_eq!(first.nodes.len(), 3);
    let second = &listing.locks[1];
    assert_eq!(second.holder.as_deref(), Some("worker-2"));
    assert!(second.validity.unwrap() <= Duration::from_secs(3));
    assert!(second.fencing_token >= b.fencing_token());
    assert_ne!(first.acquisition, listing.locks[2].acquisition);
    assert_eq!(
        listing.locks[2].acquisition, listing.locks[3].acquisition,
        "one acquisition holds both"
    );
    assert!(listing.locks[3].fencing_token >= many.fencing_token());

    let starred = api.locks("a*").await.unwrap();
    let names: Vec<&str> = starred.locks.iter().map(|l| l.resource.as_str()).collect();
    assert_eq!(names, ["a*b"]);
    assert_eq!(api.locks("").await.unwrap().locks.len(), 7);

    // A stray value on one node beside a held lock: conflicting; a value on one node
    // only: a minority, held by nobody.
    cluster.set_stray(2, &api.key_for("orders:1")).await;
    cluster.set_stray(0, &api.key_for("orders:9")).await;
    let listing = api.locks("orders:").await.unwrap();
    let first = &listing.locks[0];
    assert_eq!(first.agreement, Agreement::Conflicting);
    assert_eq!(
        (first.holding, first.holder.as_deref()),
        (2, Some("orders-api-1"))
    );
    assert!(first.validity.is_some(), "a majority still holds it");
    let stray = listing
        .locks
        .iter()
        .find(|l| l.resource == "orders:9")
        .unwrap();
    assert_eq!((stray.agreement, stray.holding), (Agreement::Minority, 1));
    assert_eq!(stray.validity, None);
    assert!(stray.nodes[0].held && !stray.nodes[1].held && !stray.nodes[2].held);

    // Released locks disappear: a release returns once a majority deleted the key, so
    // at most a minority may still show it for a moment.
    b.release().await.unwrap();
    let listing = api.locks("orders:").await.unwrap();
    assert!(
        listing
            .locks
            .iter()
            .all(|l| l.resource != "orders:2" || l.agreement == Agreement::Minority),
        "{listing:?}"
    );
    redlock_testkit::until("the released lock gone", Duration::from_secs(2), || async {
        let listing = api.locks("orders:").await.unwrap();
        listing
            .locks
            .iter()
            .all(|l| l.resource != "orders:2")
            .then_some(())
    })
    .await;
    drop((a, many));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_thousands_over_pages_and_honours_the_limit() {
    let cluster = Cluster::start(3).await;
    let redlock = client(&cluster, "bulk");
    let locks: Vec<_> = futures_util::stream::iter(0..2500)
        .map(|i| {
            let redlock = redlock.clone();
            async move {
                redlock
                    .try_lock(format!("job:{i:05}"))
                    .ttl(Duration::from_secs(30))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    // Each lock returned at its quorum: the last node's SET may still be on its way.
    cluster.settle_keys("redlock:{job:*}", 2500 * 3).await;
    let listing = redlock.locks("job:").await.unwrap();
    assert_eq!(listing.locks.len(), 2500);
    assert!(!listing.truncated);
    assert!(
        listing
            .locks
            .windows(2)
            .all(|w| w[0].resource < w[1].resource)
    );
    assert!(
        listing
            .locks
            .iter()
            .all(|l| l.agreement == Agreement::Majority && l.holding == 3)
    );
    let limited = redlock.locks("job:").limit(100).await.unwrap();
    assert_eq!(limited.locks.len(), 100);
    assert!(limited.truncated);
    assert_eq!(limited.locks[0].resource, "job:00000");
    drop(locks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_needs_a_majority_and_names_the_nodes_missing() {
    let mut cluster = Cluster::start(3).await;
    let redlock = client(&cluster, "svc");
    let _lock = redlock.lock("pay:1").await.unwrap();
    cluster.settle_keys("redlock:{pay:1}", 3).await;
    cluster.node_mut(1).kill();
    let listing = redlock.locks("pay:").await.unwrap();
    assert_eq!(listing.failures.len(), 1);
    assert_eq!(listing.failures[0].node, redlock.node_names()[1]);
    assert_eq!(
        listing.locks.len(),
        1,
        "{listing:?}; keys per node: {:?}",
        cluster.keys("*").await
    );
    let lock = &listing.locks[0];
    assert!(!lock.nodes[1].answered && lock.nodes[0].held && lock.nodes[2].held);
    assert_eq!(lock.agreement, Agreement::Majority);
    // A hung node is bounded by the timeout, and with two of three away there is no
    // majority to list from.
    cluster.node(2).pause();
    let started = Instant::now();
    let err = redlock
        .locks("pay:")
        .timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    cluster.node(2).resume();
    assert!(
        matches!(&err, Error::NoQuorum { failures, .. } if failures.len() == 2),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_health_reports_settings_and_failures() {
    let mut cluster = Cluster::start(3).await;
    let _: () = cluster
        .node(1)
        .query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg("100mb"),
        )
        .await
        .unwrap();
    let _: () = cluster
        .node(1)
        .query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg("allkeys-lru"),
        )
        .await
        .unwrap();
    // The restart quarantine on: the fresh nodes are in it.
    let redlock = redlock_testkit::builder(&cluster)
        .restart_quarantine(true)
        .max_ttl(Duration::from_secs(30))
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    let health = redlock.node_health().await;
    assert_eq!(health.len(), 3);
    for node in &health {
        assert!(node.reachable(), "{node:?}");
        assert!(node.latency.is_some() && node.version.is_some() && node.run_id.is_some());
        assert!(
            node.quarantined.is_some() && !node.votes,
            "fresh nodes: {node:?}"
        );
        assert_eq!(node.role.as_deref(), Some("master"));
        assert_eq!(node.appendonly, Some(false));
    }
    assert_eq!(health[0].eviction_safe(), Some(true));
    assert!(health[0].warnings.is_empty(), "{:?}", health[0].warnings);
    assert_eq!(health[1].maxmemory, Some(100 * 1024 * 1024));
    assert_eq!(health[1].eviction_safe(), Some(false));
    assert!(health[1].warnings[0].contains("noeviction"));

    cluster.node_mut(2).kill();
    let health = redlock.node_health().await;
    assert!(health[2].error.is_some() && !health[2].votes && health[2].latency.is_none());
    assert!(health[0].reachable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_frees_wakes_and_makes_the_old_token_stale() {
    let cluster = Cluster::start(3).await;
    let stuck = client(&cluster, "stuck");
    let admin = client(&cluster, "admin");
    let waiter = client(&cluster, "waiter");
    let mut old = stuck
        .lock("acct:1")
        .ttl(Duration::from_secs(6))
        .await
        .unwrap();
    old.auto_extend();
    let old_token = old.fencing_token().unwrap();
    // The lock returned at its quorum; the last node's write may still be on its way.
    cluster.settle_keys("redlock:{acct:1}", 3).await;

    // A waiter queued behind the stuck holder is woken by the forced release, long
    // before the lock would have expired.
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("acct:1").await.unwrap();
        (Instant::now(), lock.fencing_token().unwrap(), lock)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let forced_at = Instant::now();
    let forced = admin.force_release("acct:1").await.unwrap();
    assert_eq!(
        forced.deleted,
        3,
        "{forced:?}; keys per node: {:?}",
        cluster.keys("*").await
    );
    assert!(forced.failures.is_empty());
    assert!(forced.fencing_token > old_token);
    let (woke, new_token, new_lock) = waiting.await.unwrap();
    assert!(
        woke - forced_at < Duration::from_secs(2),
        "woken after {:?}",
        woke - forced_at
    );
    assert!(
        new_token > forced.fencing_token,
        "{new_token} vs {}",
        forced.fencing_token
    );

    // The stuck holder learns it lost the lock at its next extension (due 2 s after it
    // was taken), when every node answers that it no longer holds it: not at the end
    // of its validity, 6 s after.
    tokio::time::timeout(Duration::from_secs(3), old.lost())
        .await
        .expect("the forced-out holder learns it at its next extension");
    assert!(!old.is_held());
    let listing = admin.locks("acct:").await.unwrap();
    assert_eq!(listing.locks.len(), 1, "{listing:?}");
    assert_eq!(listing.locks[0].holder.as_deref(), Some("waiter"));
    assert!(listing.locks[0].fencing_token >= Some(new_token));
    new_lock.release().await.unwrap();
    // The release returned at its quorum: the last node's deletion may still be on its
    // way (a forced release would find the key there).
    cluster.settle_keys("redlock:{acct:1}", 0).await;

    // Nothing held: the counter still goes up.
    let again = admin.force_release("acct:1").await.unwrap();
    assert_eq!(again.deleted, 0);
    assert!(again.fencing_token > new_token);
    assert!(matches!(
        admin.force_release("").await,
        Err(Error::Argument(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_needs_a_majority() {
    let mut cluster = Cluster::start(3).await;
    let admin = client(&cluster, "admin");
    let lock = admin.lock("acct:2").await.unwrap();
    let token = lock.fencing_token().unwrap();
    // The lock returned at its quorum: the last node's SET may still be on its way.
    cluster.settle_keys("redlock:{acct:2}", 3).await;
    cluster.node_mut(0).kill();
    let forced = admin.force_release("acct:2").await.unwrap();
    assert_eq!((forced.deleted, forced.failures.len()), (2, 1));
    assert!(forced.fencing_token > token);
    cluster.node_mut(1).kill();
    let err = admin.force_release("acct:2").await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
}
