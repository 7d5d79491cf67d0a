//! The scheduler and its database: names sharing a database, many replicas migrating a
//! fresh PostgreSQL at once, a black-holed database, a history unreadable at election.
//! Real redis-server nodes, SQLite files and the PostgreSQL at `DATABASE_URL`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use redlock_core::BoxError;
use redlock_scheduler::history::{HistoryBuilder, Outcome};
use redlock_scheduler::job::Misfire;
use redlock_scheduler::{History, Job, JobContext};
use redlock_testkit::{Cluster, Proxy, require};

mod common;
use common::*;

const SCHEDULER: &str = "scheduler";

/// PostgreSQL's URL and address from `DATABASE_URL` (`None` when unset: the test then
/// says it is skipped, or fails under `REDLOCK_REQUIRE_ALL_TESTS`; see
/// `redlock_testkit::require`).
fn postgres() -> Option<(String, std::net::SocketAddr)> {
    let url = require::database_url()?;
    let parsed = url::Url::parse(&url).expect("DATABASE_URL is a URL");
    let host = parsed
        .host_str()
        .unwrap_or("127.0.0.1")
        .replace("localhost", "127.0.0.1");
    let addr = format!("{host}:{}", parsed.port().unwrap_or(5432))
        .parse()
        .expect("DATABASE_URL's host is an IP address or localhost");
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
async fn a_run_transaction_through_an_outage_records_each_tick_once_without_a_false_alarm() {
    let Some((url, addr)) = postgres() else {
        return;
    };
    redlock_testkit::logs::capture("redlock_scheduler=debug");
    let cluster = Cluster::start(3).await;
    let proxy = Proxy::start(addr).await;
    let job = unique("through-outage-tx");
    let effects = format!("{}_effects", job.replace('-', "_"));
    let admin = History::connect(&url).await.unwrap();
    sqlx::query(&format!("CREATE TABLE {effects} (tick_ms BIGINT NOT NULL)"))
        .execute(admin.pool())
        .await
        .unwrap();
    let table = effects.clone();
    // The run writes its effect through its transaction, retrying while the database
    // is away: its commit then races the queued insert of its own row.
    let handler = Job::new(job.clone(), "* * * * * *", move |ctx: JobContext| {
        let table = table.clone();
        async move {
            let give_up = std::time::Instant::now() + Duration::from_secs(15);
            loop {
                let attempt = async {
                    let mut tx = ctx.transaction().await?;
                    sqlx::query(&format!("INSERT INTO {table} (tick_ms) VALUES ($1)"))
                        .bind(ctx.tick().timestamp_millis())
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok::<_, BoxError>(())
                };
                match attempt.await {
                    Ok(()) => return Ok::<_, BoxError>(()),
                    Err(err) if std::time::Instant::now() > give_up => return Err(err),
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
    });
    let history = History::builder(via(&url, proxy.addr()))
        .statement_timeout(Duration::from_millis(500))
        .acquire_timeout(Duration::from_millis(300));
    let replica = Replica::start_with(&cluster, "a", Some(history), vec![handler], |b| b).await;
    leader_of(std::slice::from_ref(&replica), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.blackhole();
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.restore();
    redlock_testkit::until("the history caught up", Duration::from_secs(15), || async {
        let health = replica.scheduler.health().history?;
        (health.ok && health.pending_writes == 0).then_some(())
    })
    .await;
    replica.shutdown().await;

    let rows = admin.runs(SCHEDULER, &job, 200).await.unwrap();
    let effects: Vec<i64> = sqlx::query_scalar(&format!("SELECT tick_ms FROM {effects}"))
        .fetch_all(admin.pool())
        .await
        .unwrap();
    let succeeded: Vec<i64> = rows
        .iter()
        .filter(|r| r.outcome == Outcome::Succeeded)
        .map(|r| r.tick.timestamp_millis())
        .collect();
    let mut sorted = effects.clone();
    sorted.sort_unstable();
    let mut expected = succeeded.clone();
    expected.sort_unstable();
    assert_eq!(sorted, expected, "one effect per succeeded run: {rows:?}");
    assert!(succeeded.len() >= 3, "{rows:?}");
    let logs = redlock_testkit::logs::text();
    let alarms: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains(&job) && l.contains("may have run twice"))
        .collect();
    assert!(alarms.is_empty(), "false alarms: {alarms:#?}");
    eprintln!(
        "{} runs succeeded; rows its own transaction wrote first: {}",
        succeeded.len(),
        logs.lines()
            .filter(|l| l.contains(&job) && l.contains("written by its run's own transaction"))
            .count()
    );
}

/// Nobody leads for about 4 s (the leader shut down, the other replica cut off from
/// Redis); the other replica is then elected while every connection to the history
/// fails, and the database comes back 2.5 s later. With `CatchUp { max: 5 }`, each of
/// the ticks nobody ran is run once, late, when the history can be read again: none
/// is lost to the ticks that came due while the new leader waited for it (together
/// they are more than 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_elected_while_the_history_fails_catches_up_every_missed_tick() {
    let Some((url, addr)) = postgres() else {
        return;
    };
    let cluster = Cluster::start(3).await;
    let job = unique("catch-up-cut");
    let ticks = Arc::new(Ticks::default());
    let jobs = || {
        vec![
            counting_job(&job, "* * * * * *", &ticks, Duration::from_millis(10))
                .misfire(Misfire::CatchUp { max: 5 }),
        ]
    };
    let first = Replica::start(&cluster, "a", Some(url.clone()), jobs(), |b| b).await;
    leader_of(std::slice::from_ref(&first), Duration::from_secs(5)).await;
    let proxy = Proxy::start(addr).await;
    let history = History::builder(via(&url, proxy.addr()));
    let second = Replica::start_with(&cluster, "b", Some(history), jobs(), |b| b).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // b cannot take part in the election; a hands over to nobody.
    for i in 0..3 {
        second.sandbox.proxy(i).cut();
    }
    first.shutdown().await;
    let stopped = Utc::now();
    tokio::time::sleep(Duration::from_millis(4000)).await;
    // b comes back to Redis while every connection to the history fails.
    proxy.cut();
    for i in 0..3 {
        second.sandbox.proxy(i).restore();
    }
    redlock_testkit::until("b leads", Duration::from_secs(10), || async {
        second.leads().then_some(())
    })
    .await;
    let elected = Utc::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    proxy.restore();
    tokio::time::sleep(Duration::from_secs(8)).await;
    second.shutdown().await;
    let record = ticks.snapshot();
    let mut seconds: Vec<i64> = record.keys().copied().collect();
    seconds.sort_unstable();
    let missed: Vec<i64> = seconds
        .iter()
        .copied()
        .filter(|t| *t > stopped.timestamp_millis() && *t <= elected.timestamp_millis())
        .collect();
    eprintln!(
        "a stopped at {stopped}, b elected at {elected}; ticks run during the fail-over: {missed:?}"
    );
    assert!(
        (elected - stopped).num_milliseconds() < 6000,
        "the fail-over took {} ms",
        (elected - stopped).num_milliseconds()
    );
    // No gap from the first tick to the last: each tick nobody ran was caught up.
    let gaps: Vec<_> = seconds.windows(2).filter(|w| w[1] - w[0] != 1000).collect();
    assert!(gaps.is_empty(), "ticks never run: {gaps:?} in {seconds:?}");
    assert!(
        record.values().all(|i| i.len() == 1),
        "a tick ran twice: {record:?}"
    );
    assert!(missed.len() >= 3, "{missed:?}");
}

/// A manual run after the latest scheduled tick, then the history pruned (to one row per
/// job, or of every row but the latest): the latest scheduled row stays, so the next
/// leader catches up from it. The leader shuts down with nobody to hand over to; a
/// scheduled tick comes due while nobody leads; the next leader runs it late (the
/// default policy, run once).
async fn pruning_keeps_what_a_new_leader_catches_up_from(
    url: &str,
    retention: fn(HistoryBuilder) -> HistoryBuilder,
) {
    let cluster = Cluster::start(3).await;
    let prefix = format!("{}_", unique("pr").replace('-', "_"));
    let job = unique("pruned");
    let ticks = Arc::new(Ticks::default());
    let jobs = || {
        vec![counting_job(
            &job,
            "*/5 * * * * *",
            &ticks,
            Duration::from_millis(10),
        )]
    };
    let builder = || retention(History::builder(url).table_prefix(&prefix));
    let history = builder().connect().await.unwrap();
    let first = Replica::start_with(&cluster, "a", Some(builder()), jobs(), |b| b).await;
    leader_of(std::slice::from_ref(&first), Duration::from_secs(5)).await;
    // A scheduled tick ran; a manual run follows it at once.
    let scheduled = redlock_testkit::until("a scheduled run", Duration::from_secs(10), || async {
        let rows = history.runs(SCHEDULER, &job, 10).await.unwrap();
        rows.iter()
            .find(|r| !r.manual && r.outcome == Outcome::Succeeded)
            .map(|r| r.tick)
    })
    .await;
    let (scheduler, name) = (first.scheduler.clone(), job.clone());
    let manual = first
        .sandbox
        .run(async move { tick_run(scheduler.trigger(&name).await.unwrap()) })
        .await;
    redlock_testkit::until("the manual run", Duration::from_secs(5), || async {
        let rows = history.runs(SCHEDULER, &job, 10).await.unwrap();
        rows.iter()
            .any(|r| r.tick == manual && r.outcome == Outcome::Succeeded)
            .then_some(())
    })
    .await;
    first.shutdown().await;
    let next = scheduled + chrono::Duration::seconds(5);
    assert!(Utc::now() < next, "a shut down before the next tick");
    // The leader's retention, as it prunes at its election and every 10 minutes.
    history.prune(SCHEDULER, Utc::now()).await.unwrap();
    assert_eq!(
        history.last_tick(SCHEDULER, &job).await.unwrap(),
        Some(scheduled),
        "the latest scheduled row survives the pruning: {:?}",
        history.runs(SCHEDULER, &job, 10).await.unwrap()
    );
    // Nobody leads when the next tick comes due; b is elected 1.5 s after it.
    let wait = next - Utc::now() + chrono::Duration::milliseconds(1500);
    tokio::time::sleep(wait.to_std().unwrap()).await;
    let second = Replica::start_with(&cluster, "b", Some(builder()), jobs(), |b| b).await;
    leader_of(std::slice::from_ref(&second), Duration::from_secs(5)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let caught_up = loop {
        let rows = history.runs(SCHEDULER, &job, 10).await.unwrap();
        let row = rows
            .into_iter()
            .find(|r| r.tick == next && r.outcome.is_terminal());
        if row.is_some() || std::time::Instant::now() > deadline {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    second.shutdown().await;
    let row = caught_up.unwrap_or_else(|| {
        panic!(
            "the tick due while nobody led ({next}) was never run: {:?}",
            ticks.snapshot()
        )
    });
    assert_eq!(row.outcome, Outcome::Succeeded, "{row:?}");
    assert_eq!(row.instance, "b", "{row:?}");
    assert!(
        row.started
            .is_some_and(|s| (s - next).num_milliseconds() >= 1000),
        "run late: {row:?}"
    );
    assert_eq!(
        ticks.snapshot().get(&next.timestamp_millis()).map(Vec::len),
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_by_count_keeps_the_latest_scheduled_tick_sqlite() {
    let (_dir, url) = sqlite_url();
    pruning_keeps_what_a_new_leader_catches_up_from(&url, |b| b.keep_runs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_by_age_keeps_the_latest_scheduled_tick_postgres() {
    let Some((url, _)) = postgres() else {
        return;
    };
    pruning_keeps_what_a_new_leader_catches_up_from(&url, |b| b.keep_for(Duration::from_millis(1)))
        .await;
}
