//! Metrics against real redis-server nodes, read back through the Prometheus exporter
//! (installed as the process's recorder: this test binary holds one test for that).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redlock_core::{RetryPolicy, telemetry};
use redlock_testkit::Cluster;
use redlock_testkit::metrics::sample;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_activity_is_counted_with_bounded_labels() {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    telemetry::describe();
    let cluster = Cluster::start(3).await;
    let node = |i: usize| cluster.node(i).addr().to_string();
    let ttl = Duration::from_millis(600);
    let client = || {
        redlock_testkit::builder(&cluster)
            .ttl(ttl)
            .node_timeout(Duration::from_millis(50))
            .build()
            .unwrap()
    };
    let (a, b) = (client(), client());

    // Granted, then contended (one attempt), then released.
    let mut lock = a.lock("metrics:order-42").await.unwrap();
    let err = b.try_lock("metrics:order-42").await.unwrap_err();
    assert!(matches!(err, redlock_core::Error::Taken { .. }), "{err}");
    // The watchdog extends it a few times (about every ttl/3).
    lock.auto_extend();
    tokio::time::sleep(ttl).await;
    lock.release().await.unwrap();
    // A waiter queues behind a holder, and gets the lock handed over.
    let held = a.lock("metrics:queue").await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.lock("metrics:queue")
                .retry(RetryPolicy::deadline(Duration::from_secs(5)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
    // A hung node: its commands time out, the lock is still granted by the others.
    cluster.node(2).pause();
    a.lock("metrics:hung")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Past the node timeout before it answers again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.node(2).resume();
    // An invalid request never reaches a node.
    assert!(a.try_lock("").await.is_err());

    let page = prometheus.render();
    let count = |name: &str, labels: &str| sample(&page, name, labels).unwrap_or(0.0);
    assert!(
        count("redlock_acquisitions_total", r#"outcome="granted""#) >= 4.0,
        "{page}"
    );
    assert_eq!(
        count("redlock_acquisitions_total", r#"outcome="contended""#),
        1.0,
        "{page}"
    );
    assert_eq!(
        count("redlock_acquisitions_total", r#"outcome="invalid""#),
        1.0,
        "{page}"
    );
    assert!(
        count(
            "redlock_acquire_duration_seconds_count",
            r#"outcome="granted""#
        ) >= 4.0
    );
    assert!(
        count("redlock_releases_total", r#"outcome="released""#) >= 4.0,
        "{page}"
    );
    assert!(
        count("redlock_extensions_total", r#"outcome="extended""#) >= 2.0,
        "{page}"
    );
    assert!(count("redlock_handovers_total", "") >= 1.0, "{page}");
    assert_eq!(count("redlock_queue_waiters", ""), 0.0, "{page}");
    let acquires_on_0 = format!(r#"node="{}",op="acquire""#, node(0));
    assert!(
        count("redlock_node_duration_seconds_count", &acquires_on_0) >= 4.0,
        "{page}"
    );
    let timeouts_on_2 = format!(r#"node="{}",kind="timeout""#, node(2));
    assert!(
        count("redlock_node_errors_total", &timeouts_on_2) >= 1.0,
        "{page}"
    );
    assert!(page.contains("# HELP redlock_acquisitions_total"), "{page}");
    // No resource name is a label anywhere.
    assert!(
        !page.contains("order-42") && !page.contains("metrics:"),
        "{page}"
    );

    // Nodes in restart quarantine show as 1; their refused votes count as errors.
    let quarantined = redlock_testkit::builder(&cluster)
        .restart_quarantine(true)
        .max_ttl(Duration::from_secs(600))
        .ttl(ttl)
        .build()
        .unwrap();
    assert!(quarantined.try_lock("metrics:q").await.is_err());
    // The refusals of a majority decided the request; the last node's answer may come
    // after it (its command finishes in the background, its gauge may flip before its
    // refusal is counted), so at least two nodes show as quarantined, each with a
    // refused vote.
    let refusing = |page: &str| -> Vec<String> {
        (0..3)
            .map(node)
            .filter(|n| {
                let refused = format!(r#"node="{n}",kind="quarantined""#);
                sample(page, "redlock_node_quarantined", &format!(r#"node="{n}""#)) == Some(1.0)
                    && sample(page, "redlock_node_errors_total", &refused) >= Some(1.0)
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut page = prometheus.render();
    while refusing(&page).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        page = prometheus.render();
    }
    assert!(refusing(&page).len() >= 2, "{page}");

    // Read-write locks and permits: requests by side and outcome, and the gauges of
    // what this process holds, back to zero once released.
    let rw = a.rw_lock("metrics:index").unwrap();
    let reading = rw.try_read().await.unwrap();
    assert!(rw.try_write().await.is_err());
    let pool = a.semaphore("metrics:pool", 1).unwrap();
    let permit = pool.try_acquire().await.unwrap();
    assert!(pool.try_acquire().await.is_err());
    let page = prometheus.render();
    let count = |name: &str, labels: &str| sample(&page, name, labels).unwrap_or(0.0);
    assert_eq!(
        count(
            "redlock_rw_acquisitions_total",
            r#"side="read",outcome="granted""#
        ),
        1.0,
        "{page}"
    );
    assert_eq!(
        count(
            "redlock_rw_acquisitions_total",
            r#"side="write",outcome="contended""#
        ),
        1.0,
        "{page}"
    );
    assert_eq!(
        count("redlock_rw_locks_held", r#"side="read""#),
        1.0,
        "{page}"
    );
    assert_eq!(
        count("redlock_permit_acquisitions_total", r#"outcome="granted""#),
        1.0,
        "{page}"
    );
    assert_eq!(
        count(
            "redlock_permit_acquisitions_total",
            r#"outcome="contended""#
        ),
        1.0,
        "{page}"
    );
    assert_eq!(count("redlock_permits_held", ""), 1.0, "{page}");
    // A writer and a permit request that wait count as waiting until they are granted
    // (the read lock and the permit kept past their TTL meanwhile).
    let (mut reading, mut permit) = (reading, permit);
    reading.auto_extend();
    permit.auto_extend();
    let patient = RetryPolicy::deadline(Duration::from_secs(10));
    let writer = tokio::spawn({
        let rw = rw.clone().retry(patient);
        async move { rw.write().await }
    });
    let asking = tokio::spawn({
        let pool = pool.clone().retry(patient);
        async move { pool.acquire().await }
    });
    let waiting = |page: &str| {
        (
            sample(page, "redlock_rw_waiters", r#"side="write""#),
            sample(page, "redlock_permit_waiters", ""),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut page = prometheus.render();
    while waiting(&page) != (Some(1.0), Some(1.0)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        page = prometheus.render();
    }
    assert_eq!(waiting(&page), (Some(1.0), Some(1.0)), "{page}");
    reading.release().await.unwrap();
    permit.release().await.unwrap();
    writer.await.unwrap().unwrap().release().await.unwrap();
    asking.await.unwrap().unwrap().release().await.unwrap();
    let page = prometheus.render();
    assert_eq!(waiting(&page), (Some(0.0), Some(0.0)), "{page}");
    assert_eq!(
        sample(&page, "redlock_rw_locks_held", r#"side="read""#),
        Some(0.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "redlock_permits_held", ""),
        Some(0.0),
        "{page}"
    );
    assert!(!page.contains("metrics:"), "{page}");
}
