//! The watchdog (auto-extension, loss detection, `with_lock`) and wake-on-release,
//! against real redis-server nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::future::IntoFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{Error, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn client(cluster: &Cluster, ttl: Duration, node_timeout: Duration) -> Redlock {
    redlock_testkit::builder(cluster)
        .ttl(ttl)
        .node_timeout(node_timeout)
        .build()
        .unwrap()
}

/// (c) A holder keeps its lock for 10x the TTL; nobody else gets it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_extend_keeps_the_lock_for_ten_ttls() {
    let cluster = Cluster::start(5).await;
    // A node timeout a loaded machine keeps (with 50 ms, a round could time out on a
    // majority and lose the lock: the watchdog is not what would be at fault).
    let ttl = Duration::from_millis(600);
    let holder = client(&cluster, ttl, Duration::from_millis(150));
    let other = client(&cluster, ttl, Duration::from_millis(150));
    let mut lock = holder.lock("long-job").await.unwrap();
    lock.auto_extend();
    let started = Instant::now();
    while started.elapsed() < ttl * 10 {
        assert!(lock.is_held(), "lost after {:?}", started.elapsed());
        // Refused: `Taken`, or `NoQuorum` where the other client's own timeouts ran out
        // on a loaded machine; never granted.
        let asked = Instant::now();
        match other.try_lock("long-job").await {
            Err(Error::Taken { .. } | Error::NoQuorum { .. }) => {}
            result => panic!(
                "someone else got a watched lock: {result:?} (asked {:?} before the holder's validity ends)",
                lock.valid_until().saturating_duration_since(asked)
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(lock.validity() > ttl / 2);
    assert!(lock.release().await.unwrap().was_held());
    let _free = other.try_lock("long-job").await.unwrap();
}

/// (c) Pausing a majority makes `lost()` fire before the validity ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_majority_fires_lost_before_the_validity_ends() {
    let cluster = Cluster::start(5).await;
    let ttl = Duration::from_millis(900);
    let holder = client(&cluster, ttl, Duration::from_millis(60));
    let mut lock = holder.lock("job").await.unwrap();
    lock.auto_extend();
    let token = lock.cancellation_token();
    tokio::time::sleep(ttl).await;
    assert!(lock.is_held());
    for i in 0..3 {
        cluster.node(i).pause();
    }
    let paused_at = Instant::now();
    tokio::time::timeout(ttl * 2, lock.lost())
        .await
        .expect("lost() must fire");
    let fired_at = Instant::now();
    for i in 0..3 {
        cluster.node(i).resume();
    }
    // `fired_at` is when this task ran again after `lost()` fired: on a loaded machine
    // up to tens of milliseconds later.
    const WAKE_UP: Duration = Duration::from_millis(50);
    assert!(
        fired_at < lock.valid_until() + WAKE_UP,
        "declared lost {:?} after the validity ended",
        fired_at - lock.valid_until()
    );
    assert!(fired_at - paused_at < ttl, "{:?}", fired_at - paused_at);
    assert!(token.is_cancelled());
    assert!(!lock.is_held());
    let err = lock.extend(ttl).await.unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err}");
}

/// (c) `with_lock` drops the work the moment the lock is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_cancels_the_work_on_loss() {
    let cluster = Cluster::start(5).await;
    let ttl = Duration::from_millis(600);
    let redlock = client(&cluster, ttl, Duration::from_millis(50));
    let finished = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicBool::new(false));

    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let pauser = {
        let nodes: Vec<_> = (0..3).map(|i| cluster.node(i).pid().unwrap()).collect();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            for pid in &nodes {
                let _ = std::process::Command::new("kill")
                    .arg("-STOP")
                    .arg(pid.to_string())
                    .status();
            }
            nodes
        })
    };
    let started = Instant::now();
    let result = redlock
        .with_lock("report", ttl, |lock| {
            let (finished, dropped) = (finished.clone(), dropped.clone());
            async move {
                let _guard = SetOnDrop(dropped);
                assert!(lock.is_held());
                tokio::time::sleep(Duration::from_secs(30)).await;
                finished.store(true, Ordering::SeqCst);
            }
        })
        .await;
    let elapsed = started.elapsed();
    for pid in pauser.await.unwrap() {
        let _ = std::process::Command::new("kill")
            .arg("-CONT")
            .arg(pid.to_string())
            .status();
    }
    assert!(matches!(result, Err(Error::Lost { .. })), "{result:?}");
    assert!(dropped.load(Ordering::SeqCst), "the work was not dropped");
    assert!(!finished.load(Ordering::SeqCst));
    assert!(
        elapsed < Duration::from_millis(1500) + ttl * 2,
        "{elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_returns_the_output_and_releases() {
    let cluster = Cluster::start(3).await;
    // A node timeout a loaded machine keeps.
    let ttl = Duration::from_millis(600);
    let redlock = client(&cluster, ttl, Duration::from_millis(150));
    let out = redlock
        .with_lock("job", ttl, |lock| async move {
            // Three TTLs of work: the watchdog keeps the lock.
            tokio::time::sleep(ttl * 3).await;
            assert!(lock.is_held());
            42
        })
        .await
        .unwrap();
    assert_eq!(out.output, 42);
    assert!(out.released.unwrap().was_held());
    let _free = redlock
        .try_lock("job")
        .await
        .expect("released after the work");
}

/// Locks falling due together are extended with one round trip per node per round,
/// whatever their number (counted by the servers' read events).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_node_per_extension_round() {
    let cluster = Cluster::start(3).await;
    // A node timeout a loaded machine keeps: 200 locks' rounds are to stay held.
    let ttl = Duration::from_millis(600);
    let redlock = client(&cluster, ttl, Duration::from_millis(250));
    let locks: Vec<_> = futures_util::future::join_all(
        (0..200).map(|i| redlock.lock(format!("many:{i}")).into_future()),
    )
    .await
    .into_iter()
    .map(|lock| {
        let mut lock = lock.unwrap();
        lock.auto_extend();
        lock
    })
    .collect();
    let reads = |stats: Vec<Option<String>>| -> Vec<u64> {
        stats
            .into_iter()
            .map(|info| {
                info.unwrap()
                    .lines()
                    .find_map(|l| l.strip_prefix("total_reads_processed:"))
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap()
            })
            .collect()
    };
    let info = || async {
        let mut all = Vec::new();
        for i in 0..3 {
            all.push(
                cluster
                    .node(i)
                    .query::<String>(redis::cmd("INFO").arg("stats"))
                    .await,
            );
        }
        all
    };
    tokio::time::sleep(ttl).await;
    let before = reads(info().await);
    let window = ttl * 4; // about 12 extension rounds (every ttl/3)
    tokio::time::sleep(window).await;
    let after = reads(info().await);
    for node in 0..3 {
        // Per node: ~12 rounds (+ the INFO connections); 200 locks each round would be
        // thousands of reads without batching.
        let delta = after[node] - before[node];
        assert!(
            delta <= 40,
            "node {node}: {delta} reads for ~12 rounds of 200 locks"
        );
    }
    assert!(locks.iter().all(|l| l.is_held()));
}

/// A waiter retries as soon as the holder releases, not after its retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_a_waiter_at_once() {
    let cluster = Cluster::start(3).await;
    let holder = client(&cluster, Duration::from_secs(5), Duration::from_millis(100));
    let waiter = redlock_testkit::builder(&cluster)
        // A long fallback delay: only a wake-up can make the waiter quick.
        .retry(
            RetryPolicy::deadline(Duration::from_secs(20))
                .with_delay(Duration::from_secs(3), Duration::ZERO),
        )
        .build()
        .unwrap();
    let lock = holder.lock("busy").await.unwrap();
    let wait = tokio::spawn(async move {
        let lock = waiter.lock("busy").await.unwrap();
        (Instant::now(), lock.attempts())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    lock.release().await.unwrap();
    let (acquired_at, attempts) = wait.await.unwrap();
    let latency = acquired_at - released_at;
    assert!(
        latency < Duration::from_millis(200),
        "woke after {latency:?}"
    );
    assert!(attempts >= 2);
}

/// A watched lock whose watchdog's runtime shuts down is no longer extended: it is
/// declared lost at once (its token fires), instead of looking held until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_dropped_with_its_runtime_declares_its_locks_lost() {
    let cluster = Cluster::start(3).await;
    let urls = cluster.urls();
    let other = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let token = other
        .spawn(async move {
            let redlock = redlock_testkit::builder_for(urls)
                .ttl(Duration::from_secs(10))
                .build()
                .unwrap();
            let mut lock = redlock.lock("runtime-bound").await.unwrap();
            lock.auto_extend();
            let token = lock.cancellation_token();
            std::mem::forget(lock); // the holder lives on; the runtime does not
            token
        })
        .await
        .unwrap();
    assert!(!token.is_cancelled());
    other.shutdown_background();
    tokio::time::timeout(Duration::from_secs(2), token.cancelled())
        .await
        .expect("the lock is declared lost when its watchdog goes");
}

/// One node of three accepts connections and never answers: each extension round is
/// decided by the other two as soon as they answer, so the validity the holder sees
/// stays about two thirds of the TTL or more; it used to wait for the dead node's
/// timeout (a third of the TTL) each round, down to a third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_does_not_delay_extensions() {
    let cluster = Cluster::start_proxied(3).await;
    cluster.proxy(2).blackhole();
    let ttl = Duration::from_millis(1_500);
    let holder = redlock_testkit::builder(&cluster)
        .ttl(ttl)
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let mut lock = holder.lock("steady").await.unwrap();
    lock.auto_extend();
    let started = Instant::now();
    let mut lowest = ttl;
    while started.elapsed() < ttl * 3 {
        lowest = lowest.min(lock.validity());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(lock.is_held());
    assert!(
        lowest > ttl / 2,
        "the validity fell to {lowest:?} of a {ttl:?} TTL"
    );
    lock.release().await.unwrap();
}

/// Locks released while an extension round is on its way are not reported lost: the
/// nodes' refusals in that round are their own release's doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_an_extension_round_is_not_a_loss() {
    redlock_testkit::logs::capture("redlock_core=warn");
    let cluster = Cluster::start(3).await;
    let redlock = client(
        &cluster,
        Duration::from_millis(900),
        Duration::from_millis(500),
    );
    let locks = futures_util::future::join_all(
        (0..500).map(|i| redlock.try_lock(format!("in-round:{i}")).into_future()),
    )
    .await;
    let mut held = Vec::new();
    for lock in locks {
        let mut lock = lock.unwrap();
        lock.auto_extend();
        held.push(lock);
    }
    // Right after a round is sent: the releases reach the nodes before its commands.
    let rounds = redlock.watchdog_rounds();
    let deadline = Instant::now() + Duration::from_secs(5);
    while redlock.watchdog_rounds() == rounds {
        assert!(Instant::now() < deadline, "no extension round");
        tokio::task::yield_now().await;
    }
    for released in
        futures_util::future::join_all(held.into_iter().map(redlock_core::Lock::release)).await
    {
        released.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let logs = redlock_testkit::logs::text();
    let lost: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("lock lost") && line.contains("in-round:"))
        .collect();
    assert!(
        lost.is_empty(),
        "{} released locks reported lost, e.g. {:?}",
        lost.len(),
        lost.first()
    );
}
