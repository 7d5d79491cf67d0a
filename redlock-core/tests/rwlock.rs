//! Read-write locks against real redis-server nodes: readers share, a writer excludes
//! everyone (counted outside the library), a waiting writer stops new readers, releases
//! wake waiters, dead holders' locks come back at their TTL, the writer's fencing tokens
//! go up, a downgrade lets no writer in between.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{ArgumentError, Error, Redlock, RetryPolicy};
use redlock_testkit::Cluster;

/// A client whose node timeout a loaded machine keeps (the default, 100 ms, is missed
/// now and then on 2 busy cores, and a release has no retry to cover it), below the
/// shortest TTL the tests use (400 ms).
fn client(cluster: &Cluster) -> Redlock {
    redlock_testkit::builder(cluster)
        .node_timeout(Duration::from_millis(250))
        .build()
        .unwrap()
}

/// A retry policy that would keep a waiter asleep for seconds between attempts: only a
/// wake-up gets it in quickly.
fn slow_retry() -> RetryPolicy {
    RetryPolicy::deadline(Duration::from_secs(20))
        .with_delay(Duration::from_secs(3), Duration::from_millis(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_everyone() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (client(&cluster), client(&cluster));
    let rw_a = a.rw_lock("index").unwrap();
    let rw_b = b.rw_lock("index").unwrap();
    let r1 = rw_a.try_read().await.unwrap();
    let r2 = rw_b.try_read().await.unwrap();
    let r3 = rw_b.try_read().await.unwrap();
    assert!(r1.is_held() && r2.is_held() && r3.is_held());
    assert_eq!(r1.fencing_token(), None, "readers get no token");
    for node in (0..cluster.len()).map(|i| cluster.node(i)) {
        node.reset_stats().await;
    }
    assert!(matches!(rw_a.try_write().await, Err(Error::Taken { .. })));
    // The refused try_write took no place in the writers' queue (not even for a moment,
    // to be cleaned up after): readers still come in, at once.
    let r4 = rw_a.try_read().await.unwrap();
    for node in (0..cluster.len()).map(|i| cluster.node(i)) {
        let calls = node.command_calls().await;
        assert_eq!(calls.get("zadd"), None, "a place was taken: {calls:?}");
    }
    for r in [r1, r2, r3, r4] {
        r.release().await.unwrap();
    }
    let w = rw_b.try_write().await.unwrap();
    match rw_a.try_read().await {
        Err(Error::Taken { retry_after, .. }) => {
            assert!(
                retry_after.is_some(),
                "a reader is told when the writer's lock ends"
            );
        }
        other => panic!("a read next to a write: {other:?}"),
    }
    assert!(matches!(rw_a.try_write().await, Err(Error::Taken { .. })));
    w.release().await.unwrap();
    rw_a.try_write().await.unwrap().release().await.unwrap();
    // The read-write lock is not the mutex of the same name.
    let _mutex = a.try_lock("index").await.unwrap();
    rw_b.try_read().await.unwrap();
}

/// Each node's command counts (`INFO commandstats`) once every node has run `name` at
/// least `n` times, or when `within` has passed (a node's command may land after the
/// call that sent it returned at a majority, or, if it timed out, never).
async fn calls_once_settled(
    cluster: &Cluster,
    name: &str,
    n: u64,
    within: Duration,
) -> Vec<std::collections::BTreeMap<String, u64>> {
    let deadline = Instant::now() + within;
    loop {
        let mut all = Vec::new();
        for i in 0..cluster.len() {
            all.push(cluster.node(i).command_calls().await);
        }
        let settled = all
            .iter()
            .all(|calls| calls.get(name).copied().unwrap_or(0) >= n);
        if settled || Instant::now() >= deadline {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What an uncontended read cycle costs a node: one script (the acquisition's: one
/// `EXISTS` of the writer's key and the waiting writers, the reader's `SET`, its
/// `SADD`) and a release of three plain commands in one write (`DEL`, `SREM`,
/// `PUBLISH`): no second script, no `GET`, no other `EXISTS`. A mutex cycle is a `SET`
/// and a script of two commands; the read cycle was two scripts of nine commands,
/// 1.4-1.9 times the mutex's time (docs/BENCHMARKS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_read_cycle_costs_a_node_one_script() {
    const CYCLES: u64 = 32;
    let cluster = Cluster::start(3).await;
    let redlock = client(&cluster);
    let rw = redlock.rw_lock("cheap").unwrap();
    // Connections made and checked, scripts loaded, before counting.
    rw.try_read().await.unwrap().release().await.unwrap();
    calls_once_settled(&cluster, "srem", 1, Duration::from_secs(2)).await;
    for i in 0..cluster.len() {
        assert!(cluster.node(i).reset_stats().await);
    }
    for _ in 0..CYCLES {
        rw.read().await.unwrap().release().await.unwrap();
    }
    let all = calls_once_settled(&cluster, "srem", CYCLES, Duration::from_secs(2)).await;
    // The nodes that ran every cycle's release (all of them, unless one was late).
    let complete: Vec<_> = all
        .iter()
        .filter(|calls| calls.get("srem") == Some(&CYCLES))
        .collect();
    assert!(
        complete.len() >= cluster.majority(),
        "the releases did not land on a majority: {all:?}"
    );
    for calls in complete {
        let count = |name: &str| calls.get(name).copied().unwrap_or(0);
        assert_eq!(
            count("evalsha"),
            CYCLES,
            "one script per cycle, the acquisition's: {calls:?}"
        );
        for name in ["exists", "set", "sadd", "del", "srem", "publish"] {
            assert_eq!(count(name), CYCLES, "one {name} per cycle: {calls:?}");
        }
        assert_eq!(count("get"), 0, "a release compares nothing: {calls:?}");
        // One acquisition in 16 may look at the readers' set's size (no pruning: it
        // holds one name at most).
        assert!(count("scard") <= CYCLES / 2, "{calls:?}");
        assert_eq!(count("srandmember"), 0, "{calls:?}");
    }
}

/// Readers that die leave their names in the readers' set; with no writer to prune it,
/// later readers drop the dead names (one acquisition in 16 looks), so the set stays
/// about as large as the readers alive (at most 64 names then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_readers_names_do_not_pile_up() {
    let cluster = Cluster::start(3).await;
    let redlock = client(&cluster);
    let dying = redlock
        .rw_lock("crowd")
        .unwrap()
        .ttl(Duration::from_millis(400));
    for _ in 0..100 {
        dying.try_read().await.unwrap().into_lock().detach();
    }
    let sets = cluster.keys("*crowd/rw}:readers").await;
    let set = sets
        .iter()
        .flatten()
        .next()
        .expect("a readers' set")
        .clone();
    let scard = redis::cmd("SCARD").arg(&set).clone();
    let on_a_majority = |answers: &[Option<u64>], holds: &dyn Fn(u64) -> bool| {
        answers.iter().filter(|n| n.is_some_and(holds)).count() >= cluster.majority()
    };
    cluster
        .settle_each("100 names", &scard, Duration::from_secs(2), |answers| {
            on_a_majority(answers, &|n| n == 100)
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // all 100 dead
    let live = redlock.rw_lock("crowd").unwrap();
    for _ in 0..200 {
        live.try_read().await.unwrap().release().await.unwrap();
    }
    cluster
        .settle_each(
            "the dead names dropped",
            &scard,
            Duration::from_secs(2),
            |answers| on_a_majority(answers, &|n| n <= 64),
        )
        .await;
}

/// Four clients, each with reader and writer tasks, for a few seconds: an observer
/// outside the library never sees a writer with anyone else, sees readers together, and
/// every writer gets its turn although readers keep coming (no starvation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_a_writer_with_anyone_else() {
    let cluster = Cluster::start(3).await;
    let readers = Arc::new(AtomicI64::new(0));
    let writers = Arc::new(AtomicI64::new(0));
    let most_readers = Arc::new(AtomicI64::new(0));
    let writes = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(AtomicBool::new(false));
    let until = Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for c in 0..4 {
        let rw = client(&cluster)
            .rw_lock("catalog")
            .unwrap()
            .retry(RetryPolicy::deadline(Duration::from_secs(20)));
        for task in 0..3 {
            let (rw, readers, writers, most_readers, writes, bad) = (
                rw.clone(),
                readers.clone(),
                writers.clone(),
                most_readers.clone(),
                writes.clone(),
                bad.clone(),
            );
            let writer = task == 0 && c % 2 == 0;
            tasks.push(tokio::spawn(async move {
                while Instant::now() < until {
                    if writer {
                        let w = rw.write().await.unwrap();
                        if writers.fetch_add(1, Ordering::SeqCst) != 0
                            || readers.load(Ordering::SeqCst) != 0
                        {
                            bad.store(true, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        writers.fetch_sub(1, Ordering::SeqCst);
                        writes.fetch_add(1, Ordering::SeqCst);
                        w.release().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    } else {
                        let r = rw.read().await.unwrap();
                        let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        most_readers.fetch_max(now, Ordering::SeqCst);
                        if writers.load(Ordering::SeqCst) != 0 {
                            bad.store(true, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        readers.fetch_sub(1, Ordering::SeqCst);
                        r.release().await.unwrap();
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        !bad.load(Ordering::SeqCst),
        "a writer held it with someone else"
    );
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "readers never shared"
    );
    // Two writer tasks for 4 s of readers that never pause all at once.
    assert!(
        writes.load(Ordering::SeqCst) >= 10,
        "writers starved: {} writes",
        writes.load(Ordering::SeqCst)
    );
}

/// A waiting writer stops new readers: with a reader holding the lock, a writer waits;
/// meanwhile a new reader is refused; the reader's release wakes the writer at once
/// (its retry delay is 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_stops_new_readers_and_is_woken_by_the_last_reader() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (client(&cluster), client(&cluster));
    let reader = a.rw_lock("report").unwrap().try_read().await.unwrap();
    let rw_b = b.rw_lock("report").unwrap().retry(slow_retry());
    let writer = tokio::spawn(async move {
        let w = rw_b.write().await.unwrap();
        (Instant::now(), w)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = a.rw_lock("report").unwrap().try_read().await;
    assert!(
        matches!(refused, Err(Error::Taken { .. })),
        "a new reader while a writer waits: {refused:?}"
    );
    let released = Instant::now();
    reader.release().await.unwrap();
    let (got, w) = writer.await.unwrap();
    let waited = got.duration_since(released);
    assert!(
        waited < Duration::from_millis(1000),
        "the writer came {waited:?} after the last reader left"
    );
    w.release().await.unwrap();
}

/// Readers waiting for a writer are woken by its release, long before their retry delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_wakes_the_readers() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (client(&cluster), client(&cluster));
    let w = a.rw_lock("prices").unwrap().try_write().await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let rw = b.rw_lock("prices").unwrap().retry(slow_retry());
        waiting.push(tokio::spawn(async move {
            let r = rw.read().await.unwrap();
            (Instant::now(), r)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    w.release().await.unwrap();
    let mut held = Vec::new();
    for task in waiting {
        let (got, r) = task.await.unwrap();
        assert!(
            got.duration_since(released) < Duration::from_millis(1000),
            "a reader came {:?} after the writer left",
            got.duration_since(released)
        );
        held.push(r);
    }
    assert!(held.iter().all(|r| r.is_held()), "all three read at once");
}

/// A writer that gives up (its deadline passed) takes its place out of the writers'
/// queue: readers come in at once, not when the place would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_lets_readers_in() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (client(&cluster), client(&cluster));
    let reader = a.rw_lock("feed").unwrap().try_read().await.unwrap();
    // Its place would be kept for twice its 5 s retry delay.
    let impatient = b.rw_lock("feed").unwrap().retry(
        RetryPolicy::deadline(Duration::from_millis(300))
            .with_delay(Duration::from_secs(5), Duration::ZERO),
    );
    assert!(matches!(impatient.write().await, Err(Error::Taken { .. })));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = a.rw_lock("feed").unwrap().try_read().await;
    assert!(second.is_ok(), "readers are still kept out: {second:?}");
    drop((reader, second));
}

/// Dead holders (neither released nor extended): a dead reader's lock and a dead
/// writer's lock each come back at their TTL, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_holders_locks_come_back_at_their_ttl() {
    let cluster = Cluster::start(3).await;
    let (dead, live) = (client(&cluster), client(&cluster));
    let ttl = Duration::from_millis(800);
    let taken = Instant::now();
    let ended = dead
        .rw_lock("cache")
        .unwrap()
        .ttl(ttl)
        .try_read()
        .await
        .unwrap()
        .into_lock()
        .detach();
    let rw = live
        .rw_lock("cache")
        .unwrap()
        .ttl(ttl)
        .retry(RetryPolicy::deadline(Duration::from_secs(5)));
    let w = rw.write().await.unwrap();
    let waited = taken.elapsed();
    assert!(
        Instant::now() >= ended && waited <= ttl + Duration::from_millis(600),
        "the writer came after {waited:?} (TTL {ttl:?})"
    );
    w.into_lock().detach();
    let taken = Instant::now();
    let r = rw.read().await.unwrap();
    assert!(taken.elapsed() >= ttl - Duration::from_millis(100));
    drop(r);
}

/// The writer's fencing tokens go up with every writer; a downgraded lock keeps
/// readers company and keeps writers out until it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_tokens_go_up_and_a_downgrade_lets_no_writer_in_between() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (client(&cluster), client(&cluster));
    let rw_a = a.rw_lock("ledger").unwrap().fencing(true);
    let rw_b = b.rw_lock("ledger").unwrap().fencing(true);
    let mut last = 0;
    for i in 0..6 {
        let rw = if i % 2 == 0 { &rw_a } else { &rw_b };
        let w = rw.try_write().await.unwrap();
        let token = w.fencing_token().unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
        w.release().await.unwrap();
    }

    let mut w = rw_a.try_write().await.unwrap();
    w.auto_extend();
    let downgraded = w.downgrade().await.unwrap();
    assert!(downgraded.is_held());
    assert_eq!(downgraded.fencing_token(), None);
    // Readers join it; writers stay out.
    let other = rw_b.try_read().await.unwrap();
    assert!(matches!(rw_b.try_write().await, Err(Error::Taken { .. })));
    other.release().await.unwrap();
    // The watchdog came with it: it outlives its TTL (the client's default, 30 s here
    // too long to wait for), so extend by hand to a short one and see it kept.
    let mut downgraded = downgraded;
    downgraded.extend(Duration::from_millis(400)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(downgraded.is_held(), "the watchdog no longer keeps it");
    assert!(matches!(rw_b.try_write().await, Err(Error::Taken { .. })));
    downgraded.release().await.unwrap();
    let w = rw_b.try_write().await.unwrap();
    assert!(w.fencing_token().unwrap() > last);
}

/// A watched write lock is lost when a majority of nodes stops answering, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_is_lost_when_a_majority_is_gone() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster)
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let mut w = redlock
        .rw_lock("books")
        .unwrap()
        .ttl(Duration::from_millis(600))
        .try_write()
        .await
        .unwrap();
    w.auto_extend();
    cluster.node(0).pause();
    cluster.node(1).pause();
    let noticed = tokio::time::timeout(Duration::from_secs(3), w.lost()).await;
    cluster.node(0).resume();
    cluster.node(1).resume();
    assert!(noticed.is_ok(), "the loss was never reported");
    assert!(!w.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_read_write_locks_are_refused() {
    let cluster = Cluster::start(1).await;
    let redlock = client(&cluster);
    assert!(matches!(
        redlock.rw_lock(""),
        Err(ArgumentError::EmptyResource)
    ));
    let long = "x".repeat(10_000);
    assert!(redlock.rw_lock(long).is_err());
    let rw = redlock.rw_lock("ok").unwrap().ttl(Duration::ZERO);
    assert!(matches!(rw.try_read().await, Err(Error::Argument(_))));
    assert!(matches!(rw.try_write().await, Err(Error::Argument(_))));
}
