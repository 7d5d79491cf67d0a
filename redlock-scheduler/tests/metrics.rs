//! The scheduler's metrics against real redis-server nodes and a SQLite history, read
//! back through the Prometheus exporter (installed as the process's recorder: this test
//! binary holds one test for that).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_scheduler::telemetry;
use redlock_testkit::Cluster;
use redlock_testkit::metrics::sample;

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_skips_lag_and_leadership_are_counted() {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    telemetry::describe();
    redlock_core::telemetry::describe();
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let job = unique("metered");
    let ticks = Arc::new(Ticks::default());
    let jobs = vec![counting_job(
        &job,
        "* * * * * *",
        &ticks,
        Duration::from_millis(20),
    )];
    let replica = Replica::start(&cluster, "a", Some(url), jobs, |b| b).await;
    let runs = format!(r#"job="{job}",outcome="succeeded""#);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&prometheus.render(), telemetry::RUNS, &runs).unwrap_or(0.0) < 2.0 {
        assert!(Instant::now() < deadline, "{}", prometheus.render());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Paused: the next ticks are skipped, counted by reason.
    let scheduler = replica.scheduler.clone();
    let name = job.clone();
    replica
        .sandbox
        .run(async move { scheduler.pause(&name).await.unwrap() })
        .await;
    let paused = format!(r#"job="{job}",reason="paused""#);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&prometheus.render(), telemetry::SKIPPED, &paused).unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline, "{}", prometheus.render());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let page = prometheus.render();
    assert_eq!(sample(&page, telemetry::LEADER, ""), Some(1.0), "{page}");
    assert_eq!(sample(&page, telemetry::LEADER_CHANGES, ""), Some(1.0));
    let lag = format!(r#"{}_count{{job="{job}"}}"#, telemetry::TICK_LAG);
    assert!(page.lines().any(|l| l.starts_with(&lag)), "{page}");
    let duration = format!(r#"{}_count{{job="{job}"}}"#, telemetry::RUN_DURATION);
    assert!(page.lines().any(|l| l.starts_with(&duration)), "{page}");
    assert!(
        page.contains("# HELP redlock_scheduler_runs_total"),
        "{page}"
    );
    // The scheduler's locks report through the core's metrics too.
    assert!(page.contains("redlock_acquisitions_total"), "{page}");
    // No label carries a tick, an instance or an error text.
    for line in page.lines().filter(|l| l.starts_with("redlock_scheduler_")) {
        assert!(!line.contains("instance="), "{line}");
        assert!(!line.contains("tick="), "{line}");
    }
    replica.shutdown().await;
    let page = prometheus.render();
    assert_eq!(sample(&page, telemetry::LEADER, ""), Some(0.0), "{page}");
}
