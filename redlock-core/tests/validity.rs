//! What a holder believes about its lock matches the keys on the nodes: validity counts
//! from the moment before the first command of an acquisition or extension, moves back
//! with an extension to a shorter TTL, and an extension never overtakes the commands
//! that created the lock.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_testkit::Cluster;
use redlock_testkit::{client, client_for};

/// An extension to a shorter TTL shortens the holder's validity too: once the keys have
/// expired, the holder no longer believes it holds the lock, its `lost()` has fired, and
/// another client can take the resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shortening_extend_moves_the_validity_back() {
    let cluster = Cluster::start(3).await;
    let holder = client(&cluster, Duration::from_millis(50));
    let other = client(&cluster, Duration::from_millis(50));
    let mut lock = holder
        .lock("shortened")
        .ttl(Duration::from_secs(3))
        .await
        .unwrap();
    let short = Duration::from_millis(300);
    let before = Instant::now();
    lock.extend(short).await.unwrap();
    assert_eq!(lock.ttl(), short);
    // Counted from the extension's start, which is before it returned.
    let bound = Instant::now() + short - holder.drift_for(short);
    assert!(
        lock.valid_until() <= bound,
        "validity ends {:?} after the shorter extension's bound",
        lock.valid_until() - bound
    );
    tokio::time::timeout(Duration::from_secs(1), lock.lost())
        .await
        .expect("lost() follows the shorter validity");
    assert!(Instant::now() < before + Duration::from_secs(1));
    // The keys expire by the shorter TTL: someone else takes the resource, and the
    // first holder does not believe it still holds it. (A node whose extension landed
    // late keeps the key that much longer: try until well before the first TTL, 3 s.)
    tokio::time::sleep_until((before + short + Duration::from_millis(20)).into()).await;
    let taken = redlock_testkit::until(
        "the keys expired by the shorter TTL",
        Duration::from_secs(1),
        || async { other.try_lock("shortened").await.ok() },
    )
    .await;
    assert!(!lock.is_valid() && !lock.is_held());
    drop(taken);
}

/// A watched lock extended by hand to a shorter TTL is then kept alive at the pace of
/// that TTL (the watchdog reschedules), not lost at the old pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_follows_a_shorter_manual_extension() {
    let cluster = Cluster::start(3).await;
    let holder = client(&cluster, Duration::from_millis(50));
    let mut lock = holder
        .lock("watched-shortened")
        .ttl(Duration::from_secs(3))
        .await
        .unwrap();
    lock.auto_extend();
    lock.extend(Duration::from_millis(300)).await.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        assert!(lock.is_held(), "lost after {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(lock.validity() <= Duration::from_millis(300));
    assert!(lock.release().await.unwrap().was_held());
}

/// Validity is anchored to the start of the attempt (the Redlock rule), also when the
/// replies are slow, and extensions to the start of the extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_counts_from_before_the_first_command() {
    let cluster = Cluster::start_proxied(3).await;
    for i in 0..3 {
        cluster.proxy(i).delay(Duration::from_millis(30));
    }
    let redlock = client(&cluster, Duration::from_millis(500));
    let ttl = Duration::from_secs(2);
    let drift = redlock.drift_for(ttl);
    for round in 0..5 {
        let before = Instant::now();
        let mut lock = redlock
            .lock(format!("anchored-{round}"))
            .ttl(ttl)
            .await
            .unwrap();
        assert!(lock.acquired_at() >= before);
        assert!(
            lock.valid_until() <= lock.acquired_at() + ttl - drift,
            "validity ends {:?} past acquired_at + ttl - drift",
            lock.valid_until() - (lock.acquired_at() + ttl - drift)
        );
        // A round trip takes at least 60 ms (30 ms each way): anchored to the start of
        // the extension, the validity ends at least that much before `ttl - drift`
        // from its return.
        lock.extend(ttl).await.unwrap();
        let returned = Instant::now();
        assert!(
            lock.valid_until() + Duration::from_millis(55) <= returned + ttl - drift,
            "extension's validity anchored {:?} after its start",
            (lock.valid_until() + Duration::from_millis(60))
                .saturating_duration_since(returned + ttl - drift)
        );
        lock.release().await.unwrap();
    }
}

/// An extension right after the grant does not reach a slow node before that node's
/// SET: the node ends with the extension's TTL, not the acquisition's. The slow node's
/// connection is still being opened when the lock is granted (a delayed link), which
/// is when a later command could overtake the SET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_is_ordered_after_the_acquisition_on_every_node() {
    let cluster = Cluster::start_proxied(3).await;
    cluster.proxy(2).delay(Duration::from_millis(40));
    let short = Duration::from_millis(1000);
    for round in 0..6 {
        // A fresh client: its connection to node 2 opens with the first lock.
        let redlock = client_for(cluster.urls(), Duration::from_millis(800));
        let resource = format!("ordered-{round}");
        let mut lock = redlock
            .lock(resource.as_str())
            .ttl(Duration::from_secs(4))
            .await
            .unwrap();
        lock.extend(short).await.unwrap();
        let extended = Instant::now();
        // Node 2 sees both commands, the extension last: the key lives less than `short`
        // there, then is gone once `short` has passed. Had the extension overtaken the
        // SET (and found no key), the SET's 4 s would show above `short` for 3 s.
        let key = redlock.key_for(&resource);
        let deadline = extended + Duration::from_millis(1500);
        loop {
            let pttl: i64 = cluster
                .node(2)
                .query(redis::cmd("PTTL").arg(&key))
                .await
                .unwrap();
            let expired = pttl == -2 && extended.elapsed() > short;
            if (pttl > 0 && pttl < short.as_millis() as i64) || expired {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: node 2 keeps the key for {pttl} ms after extend({short:?})"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(lock);
    }
}
