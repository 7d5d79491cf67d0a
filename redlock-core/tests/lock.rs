//! The lock's semantics against real redis-server nodes: exclusivity, ownership,
//! strict extension, multi-resource all-or-nothing, both connection back-ends.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{Error, Redlock, RetryPolicy};
use redlock_testkit::Cluster;
use redlock_testkit::{Intervals, client, cycle};

const TIMEOUT: Duration = Duration::from_millis(200);

/// `clients` independent clients (own connections, like separate processes), each
/// running `tasks` tasks that take the same resource `rounds` times.
async fn exclusivity(nodes: usize, clients: usize, tasks: usize, rounds: usize) {
    let cluster = Cluster::start(nodes).await;
    let intervals = Arc::new(Intervals::default());
    let inside = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for c in 0..clients {
        let redlock = client(&cluster, TIMEOUT);
        for t in 0..tasks {
            let (redlock, intervals, inside) =
                (redlock.clone(), Arc::clone(&intervals), Arc::clone(&inside));
            handles.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let lock = redlock.lock("shared").await.expect("lock");
                    let start = Instant::now();
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let end = Instant::now();
                    assert!(lock.valid_until() > end, "held past validity");
                    intervals.record(start, end, c * 100 + t);
                    let released = lock.release().await.expect("release");
                    assert!(released.was_held());
                }
            }));
        }
    }
    for handle in handles {
        handle.await.expect("task");
    }
    assert_eq!(intervals.len(), clients * tasks * rounds);
    assert!(intervals.overlaps().is_empty(), "overlapping holds");
    cluster.settle_keys("redlock:*", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_on_one_node() {
    exclusivity(1, 3, 4, 15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_on_five_nodes() {
    exclusivity(5, 3, 4, 15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taken_lock_reports_the_nodes_holding_it() {
    let cluster = Cluster::start(5).await;
    let a = client(&cluster, TIMEOUT);
    let b = client(&cluster, TIMEOUT);
    let lock = a.lock("order:1").await.unwrap();
    assert_eq!(lock.resource(), "order:1");
    assert!(lock.validity() > Duration::from_secs(4));
    match b.try_lock("order:1").await {
        Err(Error::Taken {
            nodes,
            total,
            attempts,
            retry_after,
            ..
        }) => {
            assert!(nodes.len() >= 3, "{nodes:?}");
            assert_eq!(total, 5);
            assert_eq!(attempts, 1);
            // The holder's lock has most of its TTL left on a majority. (Its keys can
            // outlive its validity, which counts from before its first command, by as
            // long as its acquisition took: bounded by the TTL, not by the validity.)
            let retry_after = retry_after.expect("a majority answered");
            assert!(
                retry_after <= Duration::from_secs(5) && retry_after >= Duration::from_secs(3),
                "{retry_after:?}"
            );
        }
        other => panic!("expected Taken, got {other:?}"),
    }
    // Retrying with a deadline gives up after it, with the attempt count.
    let started = Instant::now();
    let err = b
        .lock("order:1")
        .retry(RetryPolicy::deadline(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Taken { attempts, .. } if attempts > 1),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    lock.release().await.unwrap();
    cycle(&b, "order:1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_client_gets_the_lock_after_release() {
    let cluster = Cluster::start(3).await;
    let a = client(&cluster, TIMEOUT);
    let b = client(&cluster, TIMEOUT);
    let lock = a.lock("job").await.unwrap();
    let waiter = tokio::spawn(async move { b.lock("job").await.map(|l| l.resources().to_vec()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    lock.release().await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), vec!["job".to_owned()]);
}

/// A stale guard (its lock expired and someone else took the resource) can neither
/// release nor extend the new holder's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_can_release_or_extend() {
    let cluster = Cluster::start(5).await;
    let a = client(&cluster, TIMEOUT);
    let b = client(&cluster, TIMEOUT);
    let mut stale = a.lock("res").ttl(Duration::from_millis(300)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Expired on every node: a node whose SET landed late keeps the key that much longer.
    let key = b.key_for("res");
    cluster.settle_keys(&key, 0).await;
    let current = b.try_lock("res").await.expect("expired lock is free");
    // Where b's value is now: a majority at least (the last node's SET may land later,
    // or never if it timed out).
    let get = redis::cmd("GET").arg(&key).clone();
    let before: Vec<Option<String>> = cluster.query_each(&get).await;
    let holding = before.iter().filter(|v| v.is_some()).count();
    assert!(holding >= cluster.majority(), "{before:?}");

    let err = stale.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err}");
    let report = stale.release().await.unwrap();
    assert_eq!(report.released, 0);
    assert!(report.expired && !report.was_held());

    // b's value is intact on every node that had it.
    let after: Vec<Option<String>> = cluster.query_each(&get).await;
    for (i, (before, after)) in before.iter().zip(&after).enumerate() {
        if before.is_some() {
            assert_eq!(after, before, "node {i} lost the current holder's key");
        }
    }
    assert!(a.try_lock("res").await.is_err());
    assert!(current.release().await.unwrap().was_held());
}

/// While our validity is still running, a node that no longer holds our value (deleted
/// or overwritten by someone) must not be extended, and release must not delete the
/// other value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_and_release_compare_the_value() {
    let cluster = Cluster::start(3).await;
    let a = client(&cluster, TIMEOUT);
    let mut lock = a.lock("res").await.unwrap();
    let key = a.key_for("res");
    // (A SET of the lock still in flight finds the key taken when it lands.)
    for i in 0..3 {
        let set: Option<String> = cluster
            .node(i)
            .query(redis::cmd("SET").arg(&key).arg("someone-else"))
            .await;
        assert_eq!(set.as_deref(), Some("OK"), "node {i}");
    }
    let err = lock.extend(Duration::from_secs(30)).await.unwrap_err();
    assert!(matches!(err, Error::Lost { held: 0, .. }), "{err}");
    let ttl: i64 = cluster
        .node(0)
        .query(redis::cmd("PTTL").arg(&key))
        .await
        .unwrap();
    assert_eq!(ttl, -1, "someone else's key must not get our TTL");
    let report = lock.release().await.unwrap();
    assert_eq!(report.released, 0);
    for i in 0..3 {
        let value: Option<String> = cluster.node(i).query(redis::cmd("GET").arg(&key)).await;
        assert_eq!(value.as_deref(), Some("someone-else"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_prolongs_and_never_recreates_an_expired_key() {
    let cluster = Cluster::start(5).await;
    let a = client(&cluster, TIMEOUT);
    let mut lock = a
        .lock("long")
        .ttl(Duration::from_millis(400))
        .await
        .unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        lock.extend(Duration::from_millis(400))
            .await
            .expect("extend in time");
        assert!(lock.validity() > Duration::from_millis(300));
    }
    // Held for 800 ms on a 400 ms TTL: nobody else got it.
    assert!(a.try_lock("long").await.is_err());

    // Now let it expire, then try to extend.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!lock.is_valid());
    let err = lock.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err}");
    // Gone from every node within 2 s (a node whose last extension landed late keeps the
    // key that much longer), while a re-created key would live 10 s.
    cluster.settle_keys("redlock:*", 0).await;

    // The nodes refuse too, not only the local validity check: delete the keys under a
    // still-valid guard and extend. (Every node's SET first: one landing after the
    // deletion would hold the key again.)
    let mut lock = a.lock("long").await.unwrap();
    cluster.settle_keys(&a.key_for("long"), 5).await;
    for i in 0..5 {
        let _: Option<i64> = cluster
            .node(i)
            .query(redis::cmd("DEL").arg(a.key_for("long")))
            .await;
    }
    let err = lock.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(matches!(err, Error::Lost { .. }), "{err}");
    assert_eq!(
        cluster.count_keys("redlock:*").await,
        0,
        "deleted key re-created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_resource_lock_is_all_or_nothing() {
    let cluster = Cluster::start(5).await;
    let a = client(&cluster, TIMEOUT);
    let b = client(&cluster, TIMEOUT);
    let single = a.lock("acct:1").await.unwrap();

    let err = b
        .lock_many(["acct:2", "acct:1"])
        .retry(RetryPolicy::once())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Taken { .. }), "{err}");
    // Nothing of the failed attempt is left: acct:2 exists on no node (a node's SET
    // still in flight when the attempt failed is deleted right after it lands).
    cluster.settle_keys("redlock:{acct:2}", 0).await;

    single.release().await.unwrap();
    let both = b.lock_many(["acct:2", "acct:1"]).await.unwrap();
    assert_eq!(both.resources(), ["acct:2".to_owned(), "acct:1".to_owned()]);
    // Held on a majority at least when it returns: a node that had not yet applied the
    // release of acct:1 refused both (all or nothing on each node).
    let held: Vec<Option<i64>> = cluster
        .query_each(
            redis::cmd("EXISTS")
                .arg("redlock:{acct:1}")
                .arg("redlock:{acct:2}"),
        )
        .await;
    let both_held = held.iter().filter(|n| **n == Some(2)).count();
    assert!(both_held >= cluster.majority(), "{held:?}");
    assert!(a.try_lock("acct:1").await.is_err());
    assert!(a.try_lock("acct:2").await.is_err());
    let mut both = both;
    both.extend(Duration::from_secs(20)).await.unwrap();
    // Extended on a majority at least when it returns (the last node's may land later).
    let ttls: Vec<Option<i64>> = cluster
        .query_each(redis::cmd("PTTL").arg("redlock:{acct:1}"))
        .await;
    let extended = ttls
        .iter()
        .filter(|t| t.is_some_and(|t| t > 10_000))
        .count();
    assert!(extended >= cluster.majority(), "{ttls:?}");
    let report = both.release().await.unwrap();
    assert!(report.was_held());
    cluster.settle_keys("redlock:*", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_lock_is_released_in_the_background() {
    let cluster = Cluster::start(3).await;
    let a = client(&cluster, TIMEOUT);
    {
        let _lock = a.lock("dropped").await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while cluster.count_keys("redlock:*").await != 0 {
        assert!(Instant::now() < deadline, "drop did not release");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cycle(&a, "dropped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadpool_pools_work_as_nodes() {
    let cluster = Cluster::start(3).await;
    let pools: Vec<_> = cluster
        .urls()
        .into_iter()
        .map(|url| {
            deadpool_redis::Config::from_url(url)
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .unwrap()
        })
        .collect();
    let mut builder = Redlock::builder()
        .restart_quarantine(false)
        .node_timeout(TIMEOUT);
    for pool in pools {
        builder = builder.pool(pool);
    }
    let pooled = builder.build().unwrap();
    let direct = client(&cluster, TIMEOUT);
    let lock = pooled.lock("p").await.unwrap();
    assert!(matches!(
        direct.try_lock("p").await,
        Err(Error::Taken { .. })
    ));
    let mut lock = lock;
    lock.extend(Duration::from_secs(3)).await.unwrap();
    assert!(lock.release().await.unwrap().was_held());
    direct.try_lock("p").await.unwrap().release().await.unwrap();
    assert_eq!(pooled.node_names(), vec!["pool#0", "pool#1", "pool#2"]);
}

/// `SCRIPT FLUSH` on every node.
async fn flush_scripts(cluster: &Cluster) {
    for i in 0..cluster.len() {
        let mut conn = cluster
            .node(i)
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// Nodes that lose their script cache (`SCRIPT FLUSH`, a failover to a replica) answer
/// NOSCRIPT: the client loads the scripts again, so extend, release and the watchdog's
/// pipelined extension rounds keep working on the same connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_loaded_again() {
    let cluster = Cluster::start(3).await;
    let redlock = client(&cluster, TIMEOUT);
    cycle(&redlock, "warm-up").await; // connections open, scripts loaded
    let ttl = Duration::from_millis(400);

    flush_scripts(&cluster).await;
    let mut lock = redlock.lock("flushed").ttl(ttl).await.unwrap();
    lock.extend(ttl).await.expect("extend after SCRIPT FLUSH");
    flush_scripts(&cluster).await;
    assert!(lock.release().await.unwrap().was_held());
    cluster.settle_keys("redlock:flushed", 0).await;

    let mut watched = redlock.lock("watched").ttl(ttl).await.unwrap();
    watched.auto_extend();
    flush_scripts(&cluster).await;
    tokio::time::sleep(ttl * 3).await;
    assert!(
        watched.is_held(),
        "the watchdog lost the lock after SCRIPT FLUSH"
    );
    flush_scripts(&cluster).await;
    assert!(watched.release().await.unwrap().was_held());
    cluster.settle_keys("redlock:watched", 0).await;
}
