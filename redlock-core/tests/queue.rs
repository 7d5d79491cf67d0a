//! The wait queue: a released lock goes to the client that has waited longest, against
//! real redis-server nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::{Error, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, require};

/// A client whose fallback retry delay is long (1 s): only a wake-up or a hand-over can
/// make it quick.
fn slow_retry_client(cluster: &Cluster) -> Redlock {
    slow_retry_client_for(cluster.urls())
}

fn slow_retry_client_for(urls: Vec<String>) -> Redlock {
    redlock_testkit::builder_for(urls)
        .ttl(Duration::from_secs(5))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(20))
                .with_delay(Duration::from_secs(1), Duration::ZERO),
        )
        .build()
        .unwrap()
}

/// Three queued clients that keep `resource` busy (5 ms holds) until `stop`; each
/// answers how many times it held it.
fn keep_busy(
    cluster: &Cluster,
    resource: &'static str,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<usize>> {
    (0..3)
        .map(|_| {
            let (redlock, stop) = (slow_retry_client(cluster), Arc::clone(stop));
            tokio::spawn(async move {
                let mut holds = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let lock = redlock.lock(resource).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    lock.release().await.unwrap();
                    holds += 1;
                }
                holds
            })
        })
        .collect()
}

/// Waiters get the lock in the order they began waiting, each right after the previous
/// holder's release (not after its 1 s retry delay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_in_arrival_order() {
    let cluster = Cluster::start(5).await;
    let holder = slow_retry_client(&cluster);
    let lock = holder.lock("fifo").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (redlock, order) = (slow_retry_client(&cluster), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let lock = redlock.lock("fifo").await.unwrap();
            order.lock().unwrap().push((i, Instant::now()));
            tokio::time::sleep(Duration::from_millis(30)).await;
            lock.release().await.unwrap();
        }));
        // Each one waits (is queued) before the next one comes.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let released_at = Instant::now();
    lock.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let ids: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, vec![0, 1, 2, 3], "acquisition order");
    // Four hand-overs, each after a 30 ms hold: far below one 1 s retry delay.
    let last = order.last().unwrap().1 - released_at;
    assert!(last < Duration::from_millis(800), "took {last:?}");
    cluster.settle_keys("redlock:*", 0).await;
}

/// A release hands the lock over to the queued waiter: a newcomer asking right after the
/// release does not get it, the waiter does. (Without the hand-over the newcomer, asking
/// at once, would beat the waiter, which first has to hear of the release.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_overtake_the_queue() {
    let cluster = Cluster::start(3).await;
    let (holder, waiter, newcomer) = (
        slow_retry_client(&cluster),
        slow_retry_client(&cluster),
        slow_retry_client(&cluster),
    );
    let lock = holder.lock("queue").await.unwrap();
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("queue").await.unwrap();
        let attempts = lock.attempts();
        tokio::time::sleep(Duration::from_millis(300)).await;
        lock.release().await.unwrap();
        attempts
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = lock.release().await.unwrap();
    assert!(released.was_held());
    // A newcomer willing to wait a little (`try_lock`, which does not wait, may take a
    // lock being handed over: see its docs).
    let newcomer = newcomer
        .lock("queue")
        .retry(RetryPolicy::deadline(Duration::from_millis(50)))
        .await;
    match newcomer {
        Err(Error::Taken { .. }) => {}
        other => panic!("the newcomer overtook the queued waiter: {other:?}"),
    }
    // The waiter: a first attempt that found it busy (then it took its place in the
    // queue without an attempt), one that took the hand-over (not a fallback retry:
    // that would come after 1 s and count more attempts).
    assert_eq!(waiting.await.unwrap(), 2);
}

/// A waiter that gives up, or whose request is dropped, leaves the queue: the next
/// release frees the lock for anyone at once instead of reserving it for the gone
/// waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_is_not_handed_the_lock() {
    let cluster = Cluster::start(3).await;
    let (holder, waiter, newcomer) = (
        slow_retry_client(&cluster),
        slow_retry_client(&cluster),
        slow_retry_client(&cluster),
    );
    let lock = holder.lock("leave").await.unwrap();

    // Gives up after its deadline.
    let err = waiter
        .lock("leave")
        .retry(RetryPolicy::deadline(Duration::from_millis(150)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Taken { .. }), "{err}");
    // Dropped while waiting.
    let dropped = tokio::time::timeout(Duration::from_millis(150), waiter.lock("leave")).await;
    assert!(dropped.is_err(), "should still be waiting");

    // Both left the queues on every node: only the lock key is left.
    cluster.settle_keys("redlock:{leave}:*", 0).await;
    lock.release().await.unwrap();
    let free = newcomer.try_lock("leave").await.unwrap();
    free.release().await.unwrap();
}

/// Multi-resource waiters wait in the same queues and get their turn while
/// single-resource clients keep the resource busy, instead of starving; so does a
/// single-resource waiter arriving while others keep it busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_resource_waiters_are_not_starved() {
    let cluster = Cluster::start(3).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = keep_busy(&cluster, "hot", &stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let started = Instant::now();
        let many = slow_retry_client(&cluster)
            .lock_many(["hot", "cold"])
            .retry(RetryPolicy::deadline(Duration::from_secs(3)))
            .await
            .expect("multi-resource waiter starved");
        many.release().await.unwrap();
        let one = slow_retry_client(&cluster)
            .lock("hot")
            .retry(RetryPolicy::deadline(Duration::from_secs(3)))
            .await
            .expect("newcomer starved");
        one.release().await.unwrap();
        // Its turn came after the 3 queued holders' (5 ms each), not after a retry delay.
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in busy {
        assert!(task.await.unwrap() > 0, "every busy client held the lock");
    }
}

/// Clients that cannot hear releases (wake on release off) queue too: against queued
/// clients that keep the resource busy, each gets its turn within a bounded wait (a few
/// retry delays), instead of starving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_only_clients_are_not_starved() {
    let cluster = Cluster::start(3).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = keep_busy(&cluster, "busy", &stop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let deaf = redlock_testkit::builder(&cluster)
        .wake_on_release(false)
        .ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        // 20 ms + up to 20 ms between attempts; 2 s is fifty of them.
        let lock = deaf
            .lock("busy")
            .retry(
                RetryPolicy::deadline(Duration::from_secs(2))
                    .with_delay(Duration::from_millis(20), Duration::from_millis(20)),
            )
            .await
            .expect("a client without wake-ups starved");
        lock.release().await.unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(600),
            "waited {:?}",
            started.elapsed()
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in busy {
        assert!(task.await.unwrap() > 0, "every busy client held the lock");
    }
}

/// The skewed client of `a_skewed_client_clock_does_not_jump_the_queue`: the same test,
/// run again by it in a child process under `faketime` with `REDLOCK_CHILD_URLS` set.
/// It waits for the lock, says so on stdout, releases.
async fn skewed_clock_child(urls: &str) {
    let redlock = slow_retry_client_for(urls.split(',').map(str::to_owned).collect());
    let lock = redlock.lock("skew").await.unwrap();
    println!("ACQUIRED");
    tokio::time::sleep(Duration::from_millis(50)).await;
    lock.release().await.unwrap();
}

/// A client whose wall clock is a minute behind (run under `faketime`, Debian's package
/// of that name) starts waiting after another: it gets the lock after it. The queue's
/// order comes from the nodes' clocks, not from each client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_client_clock_does_not_jump_the_queue() {
    if let Ok(urls) = std::env::var("REDLOCK_CHILD_URLS") {
        return skewed_clock_child(&urls).await;
    }
    let Some(faketime) = require::program("faketime", "faketime") else {
        return;
    };
    let cluster = Cluster::start(3).await;
    let holder = slow_retry_client(&cluster);
    let lock = holder.lock("skew").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let in_time = {
        let (redlock, order) = (slow_retry_client(&cluster), Arc::clone(&order));
        tokio::spawn(async move {
            let lock = redlock.lock("skew").await.unwrap();
            order.lock().unwrap().push("in time");
            tokio::time::sleep(Duration::from_millis(100)).await;
            lock.release().await.unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut child = std::process::Command::new(faketime)
        .arg("-f")
        .arg("-60s")
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_skewed_client_clock_does_not_jump_the_queue",
            "--nocapture",
        ])
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("REDLOCK_CHILD_URLS", cluster.urls().join(","))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run `faketime` (Debian: apt-get install faketime) for the skewed client");
    let stdout = child.stdout.take().unwrap();
    let skewed = {
        let order = Arc::clone(&order);
        tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut acquired = false;
            // Read to the end: the child's test harness writes more after.
            for line in std::io::BufReader::new(stdout).lines() {
                if !acquired && line.unwrap().contains("ACQUIRED") {
                    order.lock().unwrap().push("skewed");
                    acquired = true;
                }
            }
            assert!(acquired, "the skewed client never got the lock");
        })
    };
    // Let it start and take its place in the queue.
    tokio::time::sleep(Duration::from_millis(800)).await;
    lock.release().await.unwrap();
    in_time.await.unwrap();
    skewed.await.unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(*order.lock().unwrap(), ["in time", "skewed"]);
}
