//! Node faults: killed, paused (SIGSTOP), restarted, cut off or slowed by a proxy.
//! The lock must keep working with a majority, fail fast and clearly without one, and
//! never leave keys behind after a failed or abandoned attempt.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::Error;
use redlock_core::error::NodeError;
use redlock_testkit::Cluster;
use redlock_testkit::{client, client_for, cycle};

const TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_killed_still_locks() {
    let mut cluster = Cluster::start(5).await;
    let redlock = client(&cluster, TIMEOUT);
    cluster.node_mut(1).kill();
    cluster.node_mut(3).kill();
    let mut lock = redlock.try_lock("r").await.expect("3 of 5 are a majority");
    lock.extend(Duration::from_secs(5))
        .await
        .expect("extend with 3 of 5");
    let report = lock.release().await.unwrap();
    assert!(report.was_held());
    assert_eq!(report.released, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_killed_is_no_quorum_at_once() {
    let mut cluster = Cluster::start(5).await;
    let redlock = client(&cluster, TIMEOUT);
    for i in [0, 2, 4] {
        cluster.node_mut(i).kill();
    }
    let started = Instant::now();
    let err = redlock.try_lock("r").await.unwrap_err();
    assert!(
        started.elapsed() < TIMEOUT + SLACK,
        "{:?}",
        started.elapsed()
    );
    match &err {
        Error::NoQuorum {
            needed,
            total,
            failures,
            ..
        } => {
            assert_eq!((*needed, *total), (3, 5));
            assert_eq!(failures.len(), 3, "{err}");
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // The two live nodes may still have been answering when the three refusals
    // decided: their SETs are released right after they complete.
    cluster.settle_keys("redlock:*", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_paused_is_no_quorum_within_the_timeout() {
    let cluster = Cluster::start(5).await;
    let redlock = client(&cluster, TIMEOUT);
    for i in [0, 1, 2] {
        cluster.node(i).pause();
    }
    let started = Instant::now();
    let err = redlock.try_lock("r").await.unwrap_err();
    let elapsed = started.elapsed();
    for i in [0, 1, 2] {
        cluster.node(i).resume();
    }
    assert!(
        elapsed >= TIMEOUT && elapsed < TIMEOUT + SLACK,
        "{elapsed:?}"
    );
    match &err {
        Error::NoQuorum { failures, .. } => {
            assert_eq!(failures.len(), 3);
            assert!(
                failures
                    .iter()
                    .all(|f| matches!(f.cause, NodeError::Timeout(t) if t == TIMEOUT)),
                "{err}"
            );
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // Once resumed, the paused nodes got our SET late; the background release follows
    // it on the same connection, so no key survives.
    let deadline = Instant::now() + Duration::from_secs(3);
    while cluster.count_keys("redlock:*").await != 0 {
        assert!(Instant::now() < deadline, "late SETs were not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_minority_does_not_stall_any_operation() {
    let cluster = Cluster::start(5).await;
    let slow = Duration::from_secs(2);
    let redlock = client(&cluster, slow);
    cluster.node(1).pause();
    cluster.node(4).pause();
    let fast = Duration::from_millis(300);

    let started = Instant::now();
    let mut lock = redlock.try_lock("r").await.expect("3 of 5 answer");
    assert!(
        started.elapsed() < fast,
        "acquire waited for a paused node: {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    lock.extend(Duration::from_secs(5)).await.expect("extend");
    assert!(
        started.elapsed() < fast,
        "extend waited: {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    assert!(lock.release().await.unwrap().was_held());
    assert!(
        started.elapsed() < fast,
        "release waited: {:?}",
        started.elapsed()
    );

    cluster.node(1).resume();
    cluster.node(4).resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_down_or_paused_fails_fast() {
    let mut cluster = Cluster::start(1).await;
    let redlock = client(&cluster, TIMEOUT);
    cycle(&redlock, "r").await;

    cluster.node(0).pause();
    let started = Instant::now();
    let err = redlock.try_lock("r").await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    assert!(started.elapsed() < TIMEOUT + SLACK);
    cluster.node(0).resume();

    cluster.node_mut(0).kill();
    let started = Instant::now();
    let err = redlock.try_lock("r").await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    assert!(started.elapsed() < TIMEOUT + SLACK);
}

/// A failed attempt releases what it got: here it wins 2 nodes of 5 (the holder's key
/// was removed there) and deletes its value from both: before returning where they
/// answered before the refusals decided, right after its SET lands where they answer
/// later (as a node slower than the others does), long before its TTL either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempt_leaves_no_keys() {
    let cluster = Cluster::start(5).await;
    // A node timeout a loaded machine keeps: a command that timed out would land after
    // the call returned (and be released in the background), not before.
    let patient = Duration::from_secs(2);
    let holder = client(&cluster, patient);
    let other = client(&cluster, patient);
    let lock = holder.lock("r").await.unwrap();
    let key = holder.key_for("r");
    // The holder's key on every node first: the last node's SET may land after the lock
    // returned (on node 3 or 4 after the deletion below, the holder would keep 4 nodes).
    cluster.settle_keys(&key, 5).await;
    let holder_value: String = cluster
        .node(0)
        .query(redis::cmd("GET").arg(&key))
        .await
        .unwrap();
    for i in [3, 4] {
        let _: Option<i64> = cluster.node(i).query(redis::cmd("DEL").arg(&key)).await;
    }
    let err = other.try_lock("r").await.unwrap_err();
    match &err {
        Error::Taken { nodes, .. } => assert_eq!(nodes.len(), 3, "{err}"),
        other => panic!("expected Taken, got {other:?}"),
    }
    let get = redis::cmd("GET").arg(&key).clone();
    let values = cluster
        .settle_each(
            "the failed attempt's keys deleted",
            &get,
            Duration::from_secs(2),
            |values: &[Option<String>]| values[3..].iter().all(Option::is_none),
        )
        .await;
    for (i, value) in values.iter().enumerate().take(3) {
        assert_eq!(value.as_deref(), Some(holder_value.as_str()), "node {i}");
    }
    lock.release().await.unwrap();
}

/// An acquire future dropped mid-flight (caller timed out) leaves no partial lock: the
/// nodes that already answered are released at once, the others right after their
/// in-flight SET lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquire_leaves_no_keys() {
    let cluster = Cluster::start_proxied(5).await;
    let redlock = client(&cluster, Duration::from_secs(3));
    // Warm up connections, so the SETs are really sent before the drop.
    cycle(&redlock, "warm").await;
    for i in [0, 1, 2] {
        cluster.proxy(i).blackhole();
    }
    let abandoned = tokio::time::timeout(Duration::from_millis(150), redlock.try_lock("r")).await;
    assert!(
        abandoned.is_err(),
        "acquire should still be waiting for a majority"
    );

    // The two answering nodes had the key; it is gone promptly, long before TTL (5 s).
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let on_answering = cluster.node(3).keys("redlock:{r}").await.unwrap().len()
            + cluster.node(4).keys("redlock:{r}").await.unwrap().len();
        if on_answering == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "answered nodes not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The black-holed SETs land when the link comes back; their release follows them.
    for i in [0, 1, 2] {
        cluster.proxy(i).restore();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while cluster.count_keys("redlock:*").await != 0 {
        assert!(
            Instant::now() < deadline,
            "in-flight SETs were not released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_is_reconnected() {
    let mut cluster = Cluster::start(3).await;
    let redlock = client(&cluster, TIMEOUT);
    // (Another resource: this release's last node may still be in flight below.)
    cycle(&redlock, "warm").await;
    cluster.node_mut(0).restart().await;
    // The old connection to node 0 is broken; the first call may lose node 0's vote, but
    // the client reconnects. Make node 0 necessary: kill node 1.
    cluster.node_mut(1).kill();
    let mut ok = false;
    for _ in 0..3 {
        match redlock.try_lock("r").await {
            Ok(lock) => {
                assert!(lock.release().await.unwrap().was_held());
                ok = true;
                break;
            }
            // A failed attempt's SET to a slow node is released right after it lands,
            // in the background: an immediate retry may still find it.
            Err(Error::NoQuorum { .. } | Error::Taken { .. }) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert!(ok, "node 0 was never reconnected after its restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_and_delayed_links() {
    let cluster = Cluster::start_proxied(5).await;
    let redlock = client_for(cluster.urls(), TIMEOUT);
    cycle(&redlock, "warm").await;

    // Two links cut: a majority remains.
    cluster.proxy(0).cut();
    cluster.proxy(1).cut();
    let lock = redlock.try_lock("r").await.expect("3 of 5 reachable");
    lock.release().await.unwrap();

    // A third link much slower than the timeout: no majority, fast error.
    cluster.proxy(2).delay(Duration::from_millis(600));
    let started = Instant::now();
    let err = redlock.try_lock("r").await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    assert!(
        started.elapsed() < TIMEOUT + SLACK,
        "{:?}",
        started.elapsed()
    );

    // A slow link within the timeout still counts (once the chunks queued behind the
    // 600 ms delay have drained).
    cluster.proxy(2).delay(Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lock = redlock.try_lock("r2").await.expect("slow but in time");
    lock.release().await.unwrap();

    // Links back: every node votes again (the client reconnects through the proxy).
    for i in 0..3 {
        cluster.proxy(i).restore();
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let lock = redlock.try_lock("r3").await.unwrap();
        // The lock returned at a majority: wait (up to 1 s) for the slower nodes' SETs.
        let deadline = Instant::now() + Duration::from_secs(1);
        let holding = loop {
            let holding = cluster.keys("redlock:{r3}").await;
            if holding.iter().all(|keys| keys.len() == 1) || Instant::now() >= deadline {
                break holding;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let report = lock.release().await.unwrap();
        if report.was_held() && holding.iter().all(|keys| keys.len() == 1) {
            return;
        }
        seen.push(holding);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("some node never voted again: {seen:?}");
}

/// A link so slow that connecting plus one command does not fit in the per-node timeout:
/// the connection is still established (in the background, across operations), and
/// then each command alone fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handshake_still_connects() {
    let cluster = Cluster::start_proxied(3).await;
    for i in 0..3 {
        cluster.proxy(i).delay(Duration::from_millis(70));
    }
    let redlock = client_for(cluster.urls(), TIMEOUT);
    let mut outcomes = Vec::new();
    for _ in 0..10 {
        match redlock.try_lock("slow").await {
            Ok(lock) => {
                lock.release().await.unwrap();
                return;
            }
            Err(err) => outcomes.push(err.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never connected over a slow link: {outcomes:#?}");
}

/// A split vote kept undecided by unreachable nodes (5 nodes: 2 free, 1 held by someone
/// else, 2 cut off) is `NoQuorum`, naming the failed nodes, not `Taken`: nobody holds
/// the lock on a majority, and the fix is the unreachable nodes (a scheduler reading
/// `Taken` as "claimed elsewhere" would drop its tick). A lock really held on a majority
/// while some nodes are down is still `Taken`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_with_failed_nodes_is_no_quorum() {
    let cluster = Cluster::start_proxied(5).await;
    let redlock = client(&cluster, TIMEOUT);
    cluster.set_stray(0, &redlock.key_for("split")).await;
    cluster.proxy(3).cut();
    cluster.proxy(4).cut();
    let err = redlock.try_lock("split").await.unwrap_err();
    match &err {
        Error::NoQuorum { failures, .. } => assert_eq!(failures.len(), 2, "{err}"),
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // Held on 3 of 5 (nodes 0 to 2), 2 down: taken.
    for i in [1, 2] {
        cluster.set_stray(i, &redlock.key_for("held")).await;
    }
    cluster.set_stray(0, &redlock.key_for("held")).await;
    let err = redlock.try_lock("held").await.unwrap_err();
    assert!(matches!(err, Error::Taken { .. }), "{err}");
}

/// On every node an extension comes before the release that follows it. Node 2's link
/// is slow and its connection was just closed, so the acquisition's SET there waits for
/// a new connection; the extension (issued once a majority granted) and the release
/// both wait behind that SET there: the release must still go after the extension, or
/// the extension would find the key gone (and, with a waiter handed the key meanwhile,
/// act on a lock that is no longer the holder's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_precedes_the_release_on_every_node() {
    // An extension's TTL that nothing else sends, to tell its command apart.
    const EXTEND_TTL: Duration = Duration::from_millis(43_210);
    let cluster = Cluster::start_proxied(3).await;
    let redlock = client_for(cluster.urls(), Duration::from_millis(1500));
    let mut rx = cluster.node(2).monitor().await;
    let rounds = 4;
    let mut checked = 0;
    for round in 0..rounds {
        let resource = format!("extend-order-{round}");
        // Warm the connections, then close node 2's: the next commands reconnect, slowly.
        cycle(&redlock, "warm").await;
        cluster.proxy(2).cut();
        tokio::time::sleep(Duration::from_millis(20)).await;
        cluster.proxy(2).delay(Duration::from_millis(30));
        let mut lock = redlock.lock(resource.as_str()).await.unwrap();
        lock.extend(EXTEND_TTL).await.unwrap();
        lock.release().await.unwrap();
        // What node 2 runs of this lock, until its release (a majority answered
        // earlier; the next round's cut must not drop node 2's commands).
        let tag = format!("{{{resource}}}");
        let mut order = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !order.contains(&"release") {
            let Ok(Some(line)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await
            else {
                continue;
            };
            if !line.contains("\"EVALSHA\"") || !line.contains(&tag) {
                continue;
            }
            order.push(if line.contains(":queue") {
                "release"
            } else if line.contains(&format!("\"{}\"", EXTEND_TTL.as_millis())) {
                "extend"
            } else {
                "other"
            });
        }
        let extend = order.iter().position(|k| *k == "extend");
        let release = order.iter().position(|k| *k == "release");
        if let (Some(extend), Some(release)) = (extend, release) {
            checked += 1;
            assert!(
                extend < release,
                "{resource}: node 2 ran the release before the extension: {order:?}"
            );
        }
    }
    assert!(
        checked >= rounds / 2,
        "node 2 ran both commands in only {checked} of {rounds} rounds"
    );
}
