//! Wake on release against a black-holed node: one subscriber connection per node per
//! client whatever the number of waiters, and nothing left behind by waiters. (A file of
//! its own: it loads both cores for seconds, which would disturb timing elsewhere.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

/// Connections node `i` has open from clients (`CLIENT LIST`), the asking one excluded.
async fn node_connections(cluster: &Cluster, i: usize) -> usize {
    let list: String = cluster
        .node(i)
        .query(redis::cmd("CLIENT").arg("LIST"))
        .await
        .unwrap();
    list.lines().count().saturating_sub(1)
}

/// 1,000 contended acquisitions by 4 clients while one of 3 nodes accepts connections
/// and never answers: the runtime's task count and every node's connection count stay
/// flat (a waiter used to spawn a subscription task per node, which piled up behind the
/// black hole's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_node_leaks_no_task_and_no_connection() {
    // The proxies run on a runtime of their own: their relay tasks (a black-holed link
    // keeps a closed connection's until the link is restored) are not the client's.
    let (cluster, proxies) = std::thread::spawn(|| {
        let proxies = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let cluster = proxies.block_on(Cluster::start_proxied(3));
        (cluster, proxies)
    })
    .join()
    .unwrap();
    cluster.proxy(2).blackhole();
    let clients: Vec<Redlock> = (0..4)
        .map(|_| {
            redlock_testkit::builder(&cluster)
                .node_timeout(Duration::from_millis(20))
                .ttl(Duration::from_secs(2))
                .retry(
                    RetryPolicy::deadline(Duration::from_secs(30))
                        .with_delay(Duration::from_millis(10), Duration::from_millis(10)),
                )
                .build()
                .unwrap()
        })
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    let run = |target: usize| {
        let workers: Vec<_> = clients
            .iter()
            .map(|redlock| {
                let (redlock, done) = (redlock.clone(), Arc::clone(&done));
                tokio::spawn(async move {
                    while done.load(Ordering::Relaxed) < target {
                        let lock = redlock.lock("leak").await.unwrap();
                        done.fetch_add(1, Ordering::Relaxed);
                        // With a 20 ms node timeout on a loaded machine a release can
                        // time out on every node; the lock then expires at its TTL,
                        // which only slows the next acquisitions (leaks are the point).
                        if let Err(err) = lock.release().await {
                            eprintln!("release failed, the lock expires at its TTL: {err}");
                        }
                    }
                })
            })
            .collect();
        async move {
            for worker in workers {
                worker.await.unwrap();
            }
        }
    };
    let metrics = tokio::runtime::Handle::current().metrics();
    let settle = || tokio::time::sleep(Duration::from_millis(300));
    run(100).await;
    settle().await;
    let tasks_before = metrics.num_alive_tasks();
    let black_hole_before = cluster.proxy(2).open_connections();
    let node_before = node_connections(&cluster, 0).await;
    let started = Instant::now();
    let mut samples = Vec::new();
    for target in (200..=1_100).step_by(100) {
        run(target).await;
        samples.push(metrics.num_alive_tasks());
    }
    let took = started.elapsed();
    settle().await;
    eprintln!("tasks every 100 acquisitions: {samples:?}");
    let tasks_after = metrics.num_alive_tasks();
    let black_hole_after = cluster.proxy(2).open_connections();
    let node_after = node_connections(&cluster, 0).await;
    eprintln!(
        "1,000 acquisitions in {took:?}: tasks {tasks_before} -> {tasks_after}, \
         black-holed node's connections {black_hole_before} -> {black_hole_after}, \
         node 0's {node_before} -> {node_after}"
    );
    // Flat: a few in-flight operations' tasks may differ from one moment to the next.
    assert!(
        tasks_after <= tasks_before + 16,
        "tasks grew from {tasks_before} to {tasks_after}"
    );
    // Per client at most a command connection and a subscriber connection (one of each
    // may be a new one replacing one that timed out).
    assert!(
        black_hole_after <= 4 * 4,
        "{black_hole_after} connections open to the black-holed node"
    );
    assert!(
        node_after <= node_before + 4,
        "node 0: {node_before} -> {node_after} connections"
    );
    drop(cluster);
    proxies.shutdown_background();
}
