//! What the admin service's tests share: clients, a running scheduler with a SQLite
//! history, the service served by axum, waiting for a condition.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)] // each test file uses a part; tests fail loudly

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redlock_admin::{Admin, AdminService};
use redlock_core::Redlock;
use redlock_scheduler::admin::SchedulerAdmin;
use redlock_scheduler::history::{Outcome, RunFilter};
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use redlock_testkit::Cluster;

/// A fenced client over `cluster` named `holder` (the kit's nodes are seconds old: no
/// restart quarantine).
pub fn redlock(cluster: &Cluster, holder: &str) -> Redlock {
    redlock_testkit::builder(cluster)
        .holder(holder)
        .fencing(true)
        .build()
        .unwrap()
}

/// A started scheduler running `ticker` every second and the `more` jobs, with its
/// history in a SQLite file in `dir`; and the history's URL.
pub async fn scheduler(
    cluster: &Cluster,
    dir: &std::path::Path,
    more: Vec<Job>,
) -> (Scheduler, String) {
    let url = format!("sqlite://{}?mode=rwc", dir.join("history.db").display());
    let mut builder = Scheduler::builder(redlock(cluster, "replica-1"))
        .job(Job::new(
            "ticker",
            "* * * * * *",
            |_ctx: JobContext| async { Ok::<_, std::convert::Infallible>(()) },
        ))
        .history(History::connect(&url).await.unwrap())
        .instance("replica-1");
    for job in more {
        builder = builder.job(job);
    }
    let scheduler = builder.build().unwrap();
    scheduler.wait_ready(Duration::from_secs(5)).await.unwrap();
    scheduler.start();
    (scheduler, url)
}

/// Polls `check` every 100 ms until it holds; fails after 15 s.
pub async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until a tick of `ticker` after `since` is recorded as skipped because paused.
pub async fn until_skipped_as_paused(history: &SchedulerAdmin, since: DateTime<Utc>) {
    let skipped = RunFilter::new()
        .job("ticker")
        .outcome(Outcome::Skipped)
        .since(since);
    until("a tick of ticker skipped as paused", async || {
        history.runs(&skipped).await.is_ok_and(|runs| {
            runs.iter()
                .any(|r| r.error.as_deref().is_some_and(|e| e.contains("paused")))
        })
    })
    .await;
}

/// Serves `admin` under `/admin` with axum on a free port; its base URL.
pub async fn serve_axum(admin: Admin) -> String {
    let app = axum::Router::new().nest_service("/admin", AdminService::new(admin));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/admin")
}
