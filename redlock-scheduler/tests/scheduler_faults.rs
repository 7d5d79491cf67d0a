//! The scheduler when its database or Redis misbehaves, and with its defaults: names
//! sharing a database, many replicas migrating at once, a black-holed database, a
//! history unreadable at election, split votes on claims, long jobs, runs left behind by
//! a crash, ticks missed in a fail-over, health in `status()`, connect errors, and no
//! overlap across replicas. Real redis-server nodes, SQLite files and the PostgreSQL at
//! `DATABASE_URL`; replicas in sandboxes, so a "kill" is a crash.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use redlock_scheduler::{Error, History, Job, JobContext, Misfire, Outcome};
use redlock_testkit::{Cluster, Proxy};

mod common;
use common::*;

const SCHEDULER: &str = "scheduler";

/// PostgreSQL's address from `DATABASE_URL` (`None` when unset: CI sets it).
fn postgres() -> Option<(String, std::net::SocketAddr)> {
    let url = std::env::var("DATABASE_URL").ok()?;
    let parsed = url::Url::parse(&url).ok()?;
    let host = parsed
        .host_str()
        .unwrap_or("127.0.0.1")
        .replace("localhost", "127.0.0.1");
    let addr = format!("{host}:{}", parsed.port().unwrap_or(5432))
        .parse()
        .ok()?;
    Some((url, addr))
}

/// `url` with its host and port replaced by `addr`.
fn via(url: &str, addr: std::net::SocketAddr) -> String {
    let mut parsed = url::Url::parse(url).unwrap();
    parsed.set_host(Some(&addr.ip().to_string())).unwrap();
    parsed.set_port(Some(addr.port())).unwrap();
    parsed.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_of_different_names_share_a_database() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let job = unique("report");
    let (billing, reports) = (Arc::new(Ticks::default()), Arc::new(Ticks::default()));
    let work = Duration::from_millis(50);
    let a = Replica::start(
        &cluster,
        "a",
        Some(url.clone()),
        vec![counting_job(&job, "* * * * * *", &billing, work)],
        |b| b.name("billing"),
    )
    .await;
    let b = Replica::start(
        &cluster,
        "b",
        Some(url.clone()),
        vec![counting_job(&job, "* * * * * *", &reports, work)],
        |b| b.name("reports"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.shutdown().await;
    b.shutdown().await;
    let both: HashSet<i64> = billing
        .snapshot()
        .keys()
        .copied()
        .collect::<HashSet<_>>()
        .intersection(&reports.snapshot().keys().copied().collect())
        .copied()
        .collect();
    assert!(both.len() >= 3, "ticks both schedulers ran: {both:?}");
    let history = History::connect(&url).await.unwrap();
    for name in ["billing", "reports"] {
        let rows = history.runs(name, &job, 100).await.unwrap();
        let ran = rows
            .iter()
            .filter(|r| {
                r.outcome == Outcome::Succeeded && both.contains(&r.tick.timestamp_millis())
            })
            .count();
        assert_eq!(ran, both.len(), "{name}: {rows:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_replicas_migrate_a_fresh_postgres_database_at_once() {
    let Some((url, _)) = postgres() else {
        eprintln!("DATABASE_URL is not set: skipping (CI sets it)");
        return;
    };
    let admin = History::connect(&url).await.unwrap();
    let db = format!(
        "redlock_fresh_{}_{}",
        std::process::id(),
        rand::random::<u16>()
    );
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(admin.pool())
        .await
        .unwrap();
    let mut fresh = url::Url::parse(&url).unwrap();
    fresh.set_path(&db);
    let fresh = fresh.to_string();
    let connects = (0..12).map(|_| {
        let fresh = fresh.clone();
        tokio::spawn(async move {
            History::connect(&fresh)
                .await
                .map(|h| h.runs_table().to_owned())
        })
    });
    let results = futures_util::future::join_all(connects).await;
    let failures: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.unwrap().err().map(|e| e.to_string()))
        .collect();
    // Every connection closed before the database goes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = sqlx::query(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .execute(admin.pool())
        .await;
    assert!(
        failures.is_empty(),
        "{} of 12 replicas failed: {failures:?}",
        failures.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_database_delays_no_tick_and_loses_no_row() {
    let Some((url, addr)) = postgres() else {
        eprintln!("DATABASE_URL is not set: skipping (CI sets it)");
        return;
    };
    let cluster = Cluster::start(3).await;
    let proxy = Proxy::start(addr).await;
    let job = unique("through-outage");
    let lags = Arc::new(Mutex::new(Vec::<(i64, i64)>::new()));
    let recorded = Arc::clone(&lags);
    let handler = Job::new(job.clone(), "* * * * * *", move |ctx: JobContext| {
        let lags = Arc::clone(&recorded);
        async move {
            let lag = (Utc::now() - ctx.tick()).num_milliseconds();
            lags.lock()
                .unwrap()
                .push((ctx.tick().timestamp_millis(), lag));
            Ok::<_, std::convert::Infallible>(())
        }
    });
    let history = History::builder(via(&url, proxy.addr()))
        .statement_timeout(Duration::from_millis(500))
        .acquire_timeout(Duration::from_millis(300));
    let replica = Replica::start_with(&cluster, "a", Some(history), vec![handler], |b| b).await;
    leader_of(std::slice::from_ref(&replica), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cut_at = Utc::now();
    proxy.blackhole();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let status = replica.scheduler.status().await;
    let health = status.health.history.clone().unwrap();
    assert!(!health.ok, "the history is failing: {health:?}");
    assert!(health.pending_writes > 0, "{health:?}");
    assert!(
        !status.jobs[0].last_run.as_ref().unwrap().recorded,
        "{:?}",
        status.jobs[0]
    );
    proxy.restore();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let health = replica.scheduler.health().history.unwrap();
    assert!(health.ok && health.pending_writes == 0, "{health:?}");
    replica.shutdown().await;
    let lags = lags.lock().unwrap().clone();
    // Every tick of the outage ran on time (the first after the cut may wait one
    // statement timeout for its row).
    let outage: Vec<&(i64, i64)> = lags
        .iter()
        .filter(|(t, _)| *t > cut_at.timestamp_millis())
        .collect();
    assert!(outage.len() >= 9, "{lags:?}");
    let late: Vec<_> = outage.iter().filter(|(_, lag)| *lag > 250).collect();
    assert!(
        late.len() <= 1,
        "ticks run late during the outage: {late:?}"
    );
    // Every run has its row, succeeded, once the database is back.
    let history = History::connect(&url).await.unwrap();
    let rows = history.runs(SCHEDULER, &job, 200).await.unwrap();
    for (tick, _) in &lags {
        let row = rows.iter().find(|r| r.tick.timestamp_millis() == *tick);
        assert_eq!(
            row.map(|r| r.outcome),
            Some(Outcome::Succeeded),
            "tick {tick}: {row:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_waits_for_the_history_then_catches_up() {
    let Some((url, addr)) = postgres() else {
        eprintln!("DATABASE_URL is not set: skipping (CI sets it)");
        return;
    };
    let cluster = Cluster::start(3).await;
    let job = unique("catch-up");
    let ticks = Arc::new(Ticks::default());
    let jobs = || {
        vec![
            counting_job(&job, "* * * * * *", &ticks, Duration::from_millis(10))
                .misfire(Misfire::CatchUp { max: 100 }),
        ]
    };
    let mut first = Replica::start(&cluster, "a", Some(url.clone()), jobs(), |b| b).await;
    leader_of(std::slice::from_ref(&first), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let proxy = Proxy::start(addr).await;
    let history =
        History::builder(via(&url, proxy.addr())).statement_timeout(Duration::from_millis(500));
    let second = Replica::start_with(&cluster, "b", Some(history), jobs(), |b| b).await;
    // The leader dies; the follower takes over while it cannot read the history.
    proxy.blackhole();
    first.sandbox.crash();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(second.leads());
    proxy.restore();
    tokio::time::sleep(Duration::from_secs(4)).await;
    second.shutdown().await;
    let record = ticks.snapshot();
    let mut seconds: Vec<i64> = record.keys().copied().collect();
    seconds.sort_unstable();
    // No gap from the first tick to the last: the missed ones were caught up.
    let gaps: Vec<_> = seconds.windows(2).filter(|w| w[1] - w[0] != 1000).collect();
    assert!(gaps.is_empty(), "ticks never run: {gaps:?}");
    assert!(
        record.values().all(|i| i.len() == 1),
        "a tick ran twice: {record:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_on_a_claim_is_retried() {
    let cluster = Cluster::start_proxied(5).await;
    let job = unique("split");
    let ticks = Arc::new(Ticks::default());
    let replica = Replica::start(
        &cluster,
        "a",
        None,
        vec![counting_job(
            &job,
            "* * * * * *",
            &ticks,
            Duration::from_millis(10),
        )],
        |b| b,
    )
    .await;
    leader_of(std::slice::from_ref(&replica), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The next tick: someone else's keys on two nodes for 400 ms, a fifth node away:
    // the first claim gets 2 yes, 2 no, 1 failed.
    let now = Utc::now();
    let tick = (now.timestamp_millis() / 1000 + 2) * 1000;
    let key = format!("redlock:{{{SCHEDULER}:job:{job}:{tick}}}");
    let wait = tick - Utc::now().timestamp_millis() - 150;
    tokio::time::sleep(Duration::from_millis(wait.try_into().unwrap())).await;
    for i in [0, 1] {
        let mut conn = cluster
            .node(i)
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("someone-else")
            .arg("PX")
            .arg(400)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    replica.sandbox.proxy(4).blackhole();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    replica.sandbox.proxy(4).restore();
    tokio::time::sleep(Duration::from_millis(500)).await;
    replica.shutdown().await;
    let record = ticks.snapshot();
    assert_eq!(
        record.get(&tick).map(Vec::len),
        Some(1),
        "tick {tick} not run: {record:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_run_is_closed_as_abandoned() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let job = unique("long");
    let ticks = Arc::new(Ticks::default());
    let jobs = || {
        vec![counting_job(
            &job,
            "*/30 * * * * *",
            &ticks,
            Duration::from_secs(60),
        )]
    };
    let mut first = Replica::start(&cluster, "a", Some(url.clone()), jobs(), |b| b).await;
    leader_of(std::slice::from_ref(&first), Duration::from_secs(5)).await;
    let job_name = job.clone();
    let trigger = first.scheduler.clone();
    let tick = first
        .sandbox
        .run(async move { trigger.trigger(&job_name).await.unwrap() })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = Replica::start(&cluster, "b", Some(url.clone()), jobs(), |b| b).await;
    first.sandbox.crash();
    let history = History::connect(&url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let row = loop {
        let rows = history.runs(SCHEDULER, &job, 10).await.unwrap();
        let row = rows.into_iter().find(|r| r.tick == tick).unwrap();
        if row.outcome != Outcome::Running || Instant::now() > deadline {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(row.outcome, Outcome::Abandoned, "{row:?}");
    assert_eq!(row.closed_by.as_deref(), Some("b"));
    assert!(row.finished.is_some());
    let status = second.scheduler.status().await;
    assert_eq!(status.jobs[0].abandoned, 1, "{:?}", status.jobs[0]);
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_over_delays_ticks_and_records_the_rest_by_default() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let (every_second, every_five) = (unique("per-second"), unique("per-five"));
    let (ticks, fives) = (Arc::new(Ticks::default()), Arc::new(Ticks::default()));
    let work = Duration::from_millis(10);
    let jobs = || {
        vec![
            counting_job(&every_second, "* * * * * *", &ticks, work),
            counting_job(&every_five, "*/5 * * * * *", &fives, work),
        ]
    };
    let mut first = Replica::start(&cluster, "a", Some(url.clone()), jobs(), |b| b).await;
    leader_of(std::slice::from_ref(&first), Duration::from_secs(5)).await;
    let second = Replica::start(&cluster, "b", Some(url.clone()), jobs(), |b| b).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The leader dies 300 ms before a five-second tick: it falls in the fail-over window.
    let now = Utc::now().timestamp_millis();
    let five = (now / 5000 + 2) * 5000;
    tokio::time::sleep(Duration::from_millis(
        (five - now - 300).try_into().unwrap(),
    ))
    .await;
    first.sandbox.crash();
    tokio::time::sleep(Duration::from_secs(7)).await;
    second.shutdown().await;
    let history = History::connect(&url).await.unwrap();
    // The five-second tick ran, late, on the new leader: delayed, not lost.
    let rows = history.runs(SCHEDULER, &every_five, 100).await.unwrap();
    let tick = rows.iter().find(|r| r.tick.timestamp_millis() == five);
    assert!(
        tick.is_some_and(|r| r.outcome == Outcome::Succeeded
            && r.instance == "b"
            && r.started
                .is_some_and(|s| (s - r.tick).num_milliseconds() > 300)),
        "{tick:?}"
    );
    // Every per-second tick has a row: run, or skipped saying why.
    let rows = history.runs(SCHEDULER, &every_second, 100).await.unwrap();
    let mut seconds: Vec<i64> = rows.iter().map(|r| r.tick.timestamp_millis()).collect();
    seconds.sort_unstable();
    let gaps: Vec<_> = seconds.windows(2).filter(|w| w[1] - w[0] != 1000).collect();
    assert!(
        gaps.is_empty(),
        "ticks with no row: {gaps:?} in {seconds:?}"
    );
    let skipped: Vec<_> = rows
        .iter()
        .filter(|r| r.outcome == Outcome::Skipped)
        .collect();
    assert!(
        !skipped.is_empty()
            && skipped
                .iter()
                .all(|r| r.error.as_deref().unwrap_or("").contains("missed")),
        "{skipped:?}"
    );
    for record in [ticks.snapshot(), fives.snapshot()] {
        assert!(record.values().all(|i| i.len() == 1), "{record:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_shows_redis_and_history_failures() {
    let cluster = Cluster::start_proxied(3).await;
    let (_dir, url) = sqlite_url();
    let job = unique("health");
    let ticks = Arc::new(Ticks::default());
    let replica = Replica::start(
        &cluster,
        "a",
        Some(url.clone()),
        vec![counting_job(
            &job,
            "* * * * * *",
            &ticks,
            Duration::from_millis(10),
        )],
        |b| b,
    )
    .await;
    replica
        .scheduler
        .wait_ready(Duration::from_secs(5))
        .await
        .unwrap();
    leader_of(std::slice::from_ref(&replica), Duration::from_secs(5)).await;
    // The history stops taking writes.
    let history = History::connect(&url).await.unwrap();
    for event in ["INSERT", "UPDATE"] {
        sqlx::query(&format!(
            "CREATE TRIGGER refuse_{event} BEFORE {event} ON redlock_job_runs BEGIN SELECT RAISE(FAIL, 'read-only history'); END"
        ))
        .execute(history.pool())
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let status = replica.scheduler.status().await;
    let failing = status.health.history.clone().unwrap();
    assert!(!failing.ok, "{failing:?}");
    assert!(
        failing
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("read-only history"),
        "{failing:?}"
    );
    let last = status.jobs[0].last_run.clone().unwrap();
    assert_eq!(last.outcome, Outcome::Succeeded);
    assert!(
        !last.recorded,
        "a run without its row is not a clean success: {last:?}"
    );
    // Redis: every node away.
    for i in 0..3 {
        replica.sandbox.proxy(i).blackhole();
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let health = replica.scheduler.health();
    assert!(!health.redis.ok && !health.ready, "{health:?}");
    assert!(
        health
            .redis
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("0 of 3"),
        "{health:?}"
    );
    for i in 0..3 {
        replica.sandbox.proxy(i).restore();
    }
    replica
        .scheduler
        .wait_ready(Duration::from_secs(5))
        .await
        .unwrap();
    replica.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_connect_errors_name_the_place_and_cause() {
    // A refused port: the cause, at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let err = History::connect(&format!("postgres://root@127.0.0.1:{port}/test"))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{port}")) && text.to_lowercase().contains("refused"),
        "{text}"
    );
    // A black hole: within the connect timeout, saying so.
    // (a listener that never accepts: the handshake is never answered)
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let started = Instant::now();
    let err = History::builder(format!(
        "postgres://root@{}/test",
        hole.local_addr().unwrap()
    ))
    .connect_timeout(Duration::from_millis(800))
    .connect()
    .await
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, Error::Connect { .. }) && err.to_string().contains("no answer within"),
        "{err}"
    );
    // No scheme, and an unknown one.
    let err = History::connect("localhost/db").await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidUrl { .. }) && err.to_string().contains("no scheme"),
        "{err}"
    );
    // A file whose path says "memory" is a file: its rows outlive the pool.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("memory.db").display());
    let history = History::connect(&url).await.unwrap();
    history.pool().close().await;
    assert!(dir.path().join("memory.db").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_run_overlaps_another_across_a_hand_over() {
    let cluster = Cluster::start(3).await;
    let job = unique("no-overlap");
    let intervals = Arc::new(Mutex::new(Vec::<(Instant, Instant, String)>::new()));
    let make = |intervals: Arc<Mutex<Vec<(Instant, Instant, String)>>>| {
        vec![Job::new(
            job.clone(),
            "* * * * * *",
            move |ctx: JobContext| {
                let intervals = Arc::clone(&intervals);
                async move {
                    let start = Instant::now();
                    tokio::time::sleep(Duration::from_millis(3500)).await;
                    intervals.lock().unwrap().push((
                        start,
                        Instant::now(),
                        ctx.instance().to_owned(),
                    ));
                    Ok::<_, std::convert::Infallible>(())
                }
            },
        )]
    };
    let first = Replica::start(&cluster, "a", None, make(Arc::clone(&intervals)), |b| b).await;
    leader_of(std::slice::from_ref(&first), Duration::from_secs(5)).await;
    let second = Replica::start(&cluster, "b", None, make(Arc::clone(&intervals)), |b| b).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A graceful shutdown hands leadership over at once; the run goes on meanwhile.
    let scheduler = first.scheduler.clone();
    let stopping = first
        .sandbox
        .run(async move {
            let handle =
                tokio::spawn(async move { scheduler.shutdown(Duration::from_secs(10)).await });
            Ok::<_, ()>(handle)
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let _ = stopping.await;
    second.shutdown().await;
    let mut all = intervals.lock().unwrap().clone();
    all.sort_by_key(|i| i.0);
    assert!(all.len() >= 2, "{all:?}");
    for pair in all.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "runs overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    assert!(
        all.iter().any(|i| i.2 == "b"),
        "the new leader ran: {all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_pools_retention_and_manual_ticks() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("h.db").display());
    let cluster = Cluster::start(3).await;
    let job = unique("kept");
    let ticks = Arc::new(Ticks::default());
    let history = History::builder(url.clone())
        .table_prefix("ops_")
        .keep_runs(3);
    let replica = Replica::start_with(
        &cluster,
        "a",
        Some(history),
        vec![counting_job(
            &job,
            "* * * * * *",
            &ticks,
            Duration::from_millis(10),
        )],
        |b| b,
    )
    .await;
    leader_of(std::slice::from_ref(&replica), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let scheduler = replica.scheduler.clone();
    let job_name = job.clone();
    let manual = replica
        .sandbox
        .run(async move { scheduler.trigger(&job_name).await.unwrap() })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    replica.shutdown().await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let history = History::from_pool(pool)
        .table_prefix("ops_")
        .keep_runs(3)
        .connect()
        .await
        .unwrap();
    assert_eq!(history.runs_table(), "ops_job_runs");
    // The manual run is recorded as such, and is not the latest scheduled tick.
    let rows = history.runs(SCHEDULER, &job, 100).await.unwrap();
    assert!(
        rows.iter().any(|r| r.tick == manual && r.manual),
        "{rows:?}"
    );
    let last = history.last_tick(SCHEDULER, &job).await.unwrap().unwrap();
    let latest_scheduled = rows.iter().filter(|r| !r.manual).map(|r| r.tick).max();
    assert_eq!(Some(last), latest_scheduled, "manual tick {manual}");
    assert_eq!(last.timestamp_subsec_millis(), 0);
    // Retention: 3 rows per job stay.
    history.prune(SCHEDULER, Utc::now()).await.unwrap();
    assert_eq!(history.runs(SCHEDULER, &job, 100).await.unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_timeout_outlives_the_clients_max_hold() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_core::Redlock::builder()
        .nodes(cluster.urls())
        .restart_quarantine(false) // fresh nodes: see common/mod.rs
        .ttl(Duration::from_secs(1))
        .max_hold(Duration::from_secs(2))
        .build()
        .unwrap();
    let job = unique("long-run");
    let scheduler = redlock_scheduler::Scheduler::builder(redlock)
        .leader_ttl(Duration::from_secs(1))
        .job(Job::new(
            job.clone(),
            "0 0 0 1 1 *",
            |ctx: JobContext| async move {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(5)) => Ok(()),
                    () = ctx.cancelled() => Err("cancelled"),
                }
            },
        ))
        .build()
        .unwrap();
    scheduler.start();
    let deadline = Instant::now() + Duration::from_secs(5);
    while scheduler.leadership().is_none() {
        assert!(Instant::now() < deadline, "no leadership");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    scheduler.trigger(&job).await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let status = scheduler.status().await;
    let last = status.jobs[0].last_run.clone().unwrap();
    assert_eq!(last.outcome, Outcome::Succeeded, "{last:?}");
    scheduler.shutdown(Duration::from_secs(2)).await;
}
