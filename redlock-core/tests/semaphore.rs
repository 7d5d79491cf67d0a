//! Semaphores against real redis-server nodes: never more than `k` holders, counted
//! outside the library; permits of a dead holder come back at their TTL; a release
//! wakes a waiter; fencing tokens per slot only go up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{ArgumentError, Error, RetryPolicy};
use redlock_testkit::Cluster;

/// A client holding every permit of the semaphore `name` (the client and its permits).
async fn holding_every_permit(
    cluster: &Cluster,
    name: &str,
    permits: u32,
) -> (redlock_core::Redlock, Vec<redlock_core::semaphore::Permit>) {
    let holder = redlock_testkit::builder(cluster).build().unwrap();
    let held = holder
        .semaphore(name, permits)
        .unwrap()
        .acquire_many(permits)
        .await
        .unwrap();
    (holder, held)
}

/// Eight clients (each its own connections, as replicas) share a 2-permit semaphore on
/// 3 nodes for 40 acquisitions: an observer outside the library never sees more than
/// 2 holders, and sees 2 at some point (both slots are used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_k_holders() {
    let cluster = Cluster::start(3).await;
    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let redlock = redlock_testkit::builder(&cluster).build().unwrap();
        let (holders, most) = (holders.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let semaphore = redlock
                .semaphore("exports", 2)
                .unwrap()
                .retry(RetryPolicy::deadline(Duration::from_secs(30)));
            for _ in 0..5 {
                let permit = semaphore.acquire().await.unwrap();
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(15)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "at most 2, and both permits used"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_semaphore_refuses_try_acquire_until_a_permit_comes_back() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = redlock.semaphore("partner", 2).unwrap();
    let a = semaphore.try_acquire().await.unwrap();
    let b = semaphore.try_acquire().await.unwrap();
    assert_ne!(a.slot(), b.slot());
    match semaphore.try_acquire().await {
        Err(Error::Taken { retry_after, .. }) => assert!(retry_after.is_some()),
        other => panic!("a third permit: {other:?}"),
    }
    let freed = a.slot();
    a.release().await.unwrap();
    let c = semaphore.try_acquire().await.unwrap();
    assert_eq!(c.slot(), freed);
    // The slots are ordinary locks: the listing shows them.
    let held = redlock.locks("partner/permit/").await.unwrap();
    assert_eq!(held.locks.len(), 2, "{held:?}");
    drop((b, c));
}

/// A holder that dies (its permit neither released nor extended) gives the permit back
/// at its TTL: a waiter gets it then, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_permit_comes_back_at_its_ttl() {
    let cluster = Cluster::start(3).await;
    let dead = redlock_testkit::builder(&cluster).build().unwrap();
    let permit = dead
        .semaphore("jobs", 1)
        .unwrap()
        .ttl(Duration::from_millis(1500))
        .try_acquire()
        .await
        .unwrap();
    let taken = Instant::now();
    std::mem::forget(permit); // the process died: no release, no watchdog
    let waiter = redlock_testkit::builder(&cluster).build().unwrap();
    let permit = waiter
        .semaphore("jobs", 1)
        .unwrap()
        .retry(RetryPolicy::deadline(Duration::from_secs(10)))
        .acquire()
        .await
        .unwrap();
    let waited = taken.elapsed();
    assert!(waited >= Duration::from_millis(1300), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    permit.release().await.unwrap();
}

/// A holder process killed with SIGKILL while it holds both permits of a semaphore, kept
/// by its watchdog past their TTL: they stay held while it lives, come back at most a
/// TTL after it dies, and a waiter already waiting gets one then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_processes_permits_come_back_at_their_ttl() {
    const TTL: Duration = Duration::from_millis(1000);
    if let Ok(urls) = std::env::var("REDLOCK_HOLDER_URLS") {
        // The holder: both permits, extended by the watchdog, until it is killed.
        let redlock = redlock_testkit::builder_for(urls.split(','))
            .build()
            .unwrap();
        let semaphore = redlock.semaphore("reports", 2).unwrap().ttl(TTL);
        let mut permits = semaphore.acquire_many(2).await.unwrap();
        for permit in &mut permits {
            permit.auto_extend();
        }
        println!("HOLDING");
        std::future::pending::<()>().await;
    }
    let cluster = Cluster::start(3).await;
    let mut holder = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_killed_holder_processes_permits_come_back_at_their_ttl",
            "--nocapture",
        ])
        .env("REDLOCK_HOLDER_URLS", cluster.urls().join(","))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = holder.stdout.take().unwrap();
    let held = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .any(|line| line.is_ok_and(|l| l.contains("HOLDING")))
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(20), held)
            .await
            .expect("the holder took its permits")
            .unwrap(),
        "the holder process ended without its permits"
    );
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = redlock
        .semaphore("reports", 2)
        .unwrap()
        .retry(RetryPolicy::deadline(Duration::from_secs(15)));
    let waiter = tokio::spawn({
        let semaphore = semaphore.clone();
        async move {
            let permit = semaphore.acquire().await.unwrap();
            (Instant::now(), permit)
        }
    });
    // Alive, the holder keeps both past their TTL.
    tokio::time::sleep(TTL * 2).await;
    assert!(
        !waiter.is_finished(),
        "a permit came back while its holder lived"
    );
    assert!(matches!(
        semaphore.try_acquire().await,
        Err(Error::Taken { .. })
    ));
    holder.kill().unwrap();
    let killed = Instant::now();
    holder.wait().unwrap();
    let (got, permit) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter got a permit")
        .unwrap();
    let waited = got.duration_since(killed);
    // At most one TTL of validity was left at the kill; the waiter is told when it ends.
    assert!(
        waited <= TTL + Duration::from_millis(600),
        "{waited:?} after the kill"
    );
    // The other permit is back too.
    let other = semaphore.try_acquire().await.unwrap();
    assert_ne!(other.slot(), permit.slot());
}

/// A waiter queued on a full one-permit semaphore is woken by the release, well before
/// its policy's next scan (1 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter() {
    let cluster = Cluster::start(3).await;
    let holder = redlock_testkit::builder(&cluster).build().unwrap();
    let permit = holder
        .semaphore("one", 1)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let waiter = redlock_testkit::builder(&cluster).build().unwrap();
    let waiting = tokio::spawn(async move {
        let permit = waiter
            .semaphore("one", 1)
            .unwrap()
            .retry(
                RetryPolicy::deadline(Duration::from_secs(20))
                    .with_delay(Duration::from_secs(1), Duration::ZERO),
            )
            .acquire()
            .await
            .unwrap();
        let got = Instant::now();
        permit.release().await.unwrap();
        got
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    permit.release().await.unwrap();
    let got = waiting.await.unwrap();
    let after = got.duration_since(released);
    assert!(
        after < Duration::from_millis(500),
        "woken {after:?} after the release"
    );
}

/// The release of any slot wakes a waiter, not only of the slot it queued on: with 4
/// permits held, four rounds of one waiter (its retry delay 2 s) and one release each,
/// the waiter gets the freed permit at once every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_any_slot_wakes_a_waiter() {
    const PERMITS: u32 = 4;
    let cluster = Cluster::start(3).await;
    let (_holder, mut held) = holding_every_permit(&cluster, "four", PERMITS).await;
    let waiter = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = waiter.semaphore("four", PERMITS).unwrap().retry(
        RetryPolicy::deadline(Duration::from_secs(20))
            .with_delay(Duration::from_secs(2), Duration::ZERO),
    );
    for round in 0..PERMITS as usize {
        let waiting = tokio::spawn({
            let semaphore = semaphore.clone();
            async move {
                let permit = semaphore.acquire().await.unwrap();
                (Instant::now(), permit)
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let freed = held.remove(round % held.len());
        let slot = freed.slot();
        let released = Instant::now();
        freed.release().await.unwrap();
        let (got, permit) = waiting.await.unwrap();
        let after = got.duration_since(released);
        assert!(
            after < Duration::from_millis(700),
            "round {round}: woken {after:?} after the release of slot {slot}"
        );
        assert_eq!(permit.slot(), slot);
        held.push(permit);
    }
}

/// Each slot's fencing tokens only go up, holder after holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_of_a_slot_go_up() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = redlock.semaphore("fenced", 1).unwrap().fencing(true);
    let mut last = 0;
    for _ in 0..5 {
        let permit = semaphore.try_acquire().await.unwrap();
        let token = permit.fencing_token().unwrap();
        assert!(token > last, "{token} after {last}");
        last = token;
        permit.release().await.unwrap();
    }
}

#[tokio::test]
async fn bad_semaphores_are_refused() {
    let cluster = Cluster::start(1).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    assert!(matches!(
        redlock.semaphore("s", 0),
        Err(ArgumentError::ZeroPermits)
    ));
    assert!(matches!(
        redlock.semaphore("", 2),
        Err(ArgumentError::EmptyResource)
    ));
}

/// The negative control of the design: a semaphore that counts holders on each node and
/// grants by majority admits more than `k` holders. Three contenders of a 2-permit
/// semaphore on 3 nodes, their requests reaching the nodes in this order (as a network
/// may deliver them): node 0 grants A and B, node 1 grants B and C, node 2 grants C and
/// A; each node stays within 2, and each contender has a majority (2 of 3): 3 holders.
/// The same three contenders on the slot semaphore: at most 2 hold a permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_counter_semaphore_admits_more_than_k_the_slots_do_not() {
    let cluster = Cluster::start(3).await;
    let grant = redis::Script::new(
        "if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) then \
           return redis.call('SADD', KEYS[1], ARGV[1]) end return 0",
    );
    let mut conns = Vec::new();
    for url in cluster.urls() {
        let client = redis::Client::open(url).unwrap();
        conns.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    let order = [(0, "A"), (0, "B"), (1, "B"), (1, "C"), (2, "C"), (2, "A")];
    let mut votes = std::collections::BTreeMap::<&str, usize>::new();
    for (node, contender) in order {
        let granted: i64 = grant
            .key("counter-semaphore")
            .arg(contender)
            .arg(2)
            .invoke_async(&mut conns[node])
            .await
            .unwrap();
        *votes.entry(contender).or_default() += granted as usize;
    }
    let holders = votes.values().filter(|&&v| v >= 2).count();
    assert_eq!(
        holders, 3,
        "the counter design admits 3 holders of 2 permits: {votes:?}"
    );

    let mut permits = Vec::new();
    for _ in 0..3 {
        let redlock = redlock_testkit::builder(&cluster).build().unwrap();
        if let Ok(permit) = redlock.semaphore("slots", 2).unwrap().try_acquire().await {
            permits.push(permit);
        }
    }
    assert_eq!(permits.len(), 2);
}

/// `acquire_many` takes `n` distinct slots at once, or none: a caller that cannot get all
/// of them holds none meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_many_takes_all_or_none() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = redlock
        .semaphore("batch", 3)
        .unwrap()
        .retry(RetryPolicy::once());
    let two = semaphore.acquire_many(2).await.unwrap();
    assert_eq!(two.len(), 2);
    assert_ne!(two[0].slot(), two[1].slot());
    // Two more are not free: refused, and the one it could take is given back.
    assert!(matches!(
        semaphore.acquire_many(2).await,
        Err(Error::Taken { .. })
    ));
    let one = semaphore.try_acquire().await.unwrap();
    assert!(!two.iter().any(|p| p.slot() == one.slot()));
    for bad in [0, 4] {
        assert!(matches!(
            semaphore.acquire_many(bad).await,
            Err(Error::Argument(ArgumentError::TooManyPermits { .. }))
        ));
    }
}

/// A caller of `acquire_many` waiting for 2 permits is woken by releases: the first
/// release frees one permit, too few, and it goes on waiting without using up its
/// policy (2 attempts, 3 s apart); the second frees two, and it takes them at once,
/// not at the policy's next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_many_is_woken_by_releases_without_using_up_its_attempts() {
    const PERMITS: u32 = 4;
    let cluster = Cluster::start(3).await;
    let (_holder, mut held) = holding_every_permit(&cluster, "woken", PERMITS).await;
    let waiter = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = waiter
        .semaphore("woken", PERMITS)
        .unwrap()
        .retry(RetryPolicy::attempts(2).with_delay(Duration::from_secs(3), Duration::ZERO));
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        let permits = semaphore.acquire_many(2).await;
        (Instant::now(), permits)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.pop().unwrap().release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "took 2 permits with one free");
    let released = Instant::now();
    held.pop().unwrap().release().await.unwrap();
    let (got, permits) = waiting.await.unwrap();
    let permits = permits.unwrap();
    assert_eq!(permits.len(), 2);
    let after = got.duration_since(released);
    assert!(
        after < Duration::from_millis(700),
        "took the permits {after:?} after the second release ({:?} after the start)",
        got.duration_since(started)
    );
}

/// A full semaphore is not scanned slot by slot: a request costs one attempt on one
/// slot and one look at all of them (a `PTTL` per slot, in one round trip per node),
/// whatever the number of permits, and still says when the first permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_semaphore_costs_one_attempt_and_one_look() {
    const PERMITS: u32 = 32;
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = redlock.semaphore("wide", PERMITS).unwrap();
    let held = semaphore.acquire_many(PERMITS).await.unwrap();
    assert_eq!(held.len(), PERMITS as usize);
    // The acquisitions returned at a majority, and the size record is written in the
    // background: let every node's writes land before counting.
    cluster
        .settle_keys("redlock:{wide/permit/*}", 3 * PERMITS as usize)
        .await;
    cluster.settle_keys("redlock:{wide/permit}:size", 3).await;
    for i in 0..3 {
        assert!(cluster.node(i).reset_stats().await);
    }
    match semaphore.try_acquire().await {
        Err(Error::Taken { retry_after, .. }) => assert!(retry_after.is_some()),
        other => panic!("a permit of a full semaphore: {other:?}"),
    }
    let calls = cluster.node(0).command_calls().await;
    let count = |name: &str| calls.get(name).copied().unwrap_or(0);
    // The look, and the refused attempt asking when its slot frees.
    assert_eq!(count("pttl"), u64::from(PERMITS) + 1, "{calls:?}");
    // One attempt (`SET .. NX GET`); the scripts: that question, and the attempt's
    // quiet clean-up.
    assert_eq!(count("set"), 1, "{calls:?}");
    assert!(count("evalsha") <= 2, "{calls:?}");
    // One slot given back: the next request finds it by the look, at once.
    let mut held = held;
    let freed = held.pop().unwrap();
    let slot = freed.slot();
    freed.release().await.unwrap();
    let permit = semaphore.try_acquire().await.unwrap();
    assert_eq!(permit.slot(), slot);
}

/// The commands every node ran since `reset_stats`, but the test's own (`INFO`, `CONFIG
/// RESETSTAT`, a connection's handshake).
async fn calls_since_reset(cluster: &Cluster) -> Vec<std::collections::BTreeMap<String, u64>> {
    let mut all = Vec::new();
    for i in 0..cluster.len() {
        let mut calls = cluster.node(i).command_calls().await;
        calls.retain(|name, _| {
            !["info", "config", "client", "hello"]
                .iter()
                .any(|own| name.starts_with(own))
        });
        all.push(calls);
    }
    all
}

/// A waiter on a full semaphore costs the nodes nothing between releases: once it has
/// looked, marked the slots and queued, it sends no command for 2 s (its policy's delay
/// is 50 to 100 ms: a waiter that scanned at each delay would send hundreds), counted by
/// the nodes themselves (`INFO commandstats`); the next release still wakes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_semaphores_waiter_sends_nothing_between_releases() {
    const PERMITS: u32 = 4;
    /// Commands per node allowed in the 2 s (none are expected).
    const MOST: u64 = 6;
    let cluster = Cluster::start(3).await;
    let (_holder, mut held) = holding_every_permit(&cluster, "quiet", PERMITS).await;
    cluster
        .settle_keys("redlock:{quiet/permit/*}", 3 * PERMITS as usize)
        .await;
    let waiter = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = waiter
        .semaphore("quiet", PERMITS)
        .unwrap()
        .retry(RetryPolicy::deadline(Duration::from_secs(20)));
    let waiting = tokio::spawn(async move {
        let permit = semaphore.acquire().await.unwrap();
        (Instant::now(), permit)
    });
    // Its first scan, the marks, its place in a slot's queue.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        assert!(cluster.node(i).reset_stats().await);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = calls_since_reset(&cluster).await;
    for (node, calls) in calls.iter().enumerate() {
        let total: u64 = calls.values().sum();
        println!("node {node}: {total} commands in 2 s of waiting: {calls:?}");
        assert!(
            total <= MOST,
            "node {node} ran {total} commands in 2 s of waiting: {calls:?}"
        );
    }
    assert!(!waiting.is_finished(), "a permit of a full semaphore");
    let freed = held.pop().unwrap();
    let slot = freed.slot();
    let released = Instant::now();
    freed.release().await.unwrap();
    let (got, permit) = waiting.await.unwrap();
    let after = got.duration_since(released);
    assert!(
        after < Duration::from_millis(700),
        "woken {after:?} after the release"
    );
    assert_eq!(permit.slot(), slot);
}
