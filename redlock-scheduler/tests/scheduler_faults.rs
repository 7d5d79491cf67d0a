//! The scheduler when Redis misbehaves, and with its defaults: split votes on claims,
//! long jobs, runs left behind by a crash, ticks missed in a fail-over, health in
//! `status()`, connect errors, and no overlap across replicas. Real redis-server nodes
//! and SQLite files; replicas in sandboxes, so a "kill" is a crash.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use redlock_scheduler::error::HistoryError;
use redlock_scheduler::history::{DEFAULT_TABLE_PREFIX, Outcome};
use redlock_scheduler::{History, Job, JobContext};
use redlock_testkit::Cluster;

mod common;
use common::*;

const SCHEDULER: &str = "scheduler";

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
        // Once a year: only the trigger runs it (a scheduled tick before the trigger
        // would still be running, and the trigger would be refused).
        vec![counting_job(
            &job,
            "0 0 0 1 1 *",
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
        .run(async move { tick_run(trigger.trigger(&job_name).await.unwrap()) })
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

/// The new leader's own run of the job holds the job's run lock: the dead replica's row
/// is closed all the same (its run cannot hold the lock the new run holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_run_is_closed_while_the_job_runs_again() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let job = unique("busy");
    let ticks = Arc::new(Ticks::default());
    let jobs = || {
        vec![counting_job(
            &job,
            "* * * * * *",
            &ticks,
            Duration::from_secs(60),
        )]
    };
    let mut first = Replica::start(&cluster, "a", Some(url.clone()), jobs(), |b| b).await;
    let history = History::connect(&url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let crashed = loop {
        let rows = history.runs(SCHEDULER, &job, 10).await.unwrap();
        if let Some(row) = rows.into_iter().find(|r| r.outcome == Outcome::Running) {
            break row;
        }
        assert!(Instant::now() < deadline, "replica a never ran the job");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let second = Replica::start(&cluster, "b", Some(url.clone()), jobs(), |b| b).await;
    first.sandbox.crash();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (row, others) = loop {
        let rows = history.runs(SCHEDULER, &job, 50).await.unwrap();
        let row = rows
            .iter()
            .find(|r| r.tick == crashed.tick)
            .unwrap()
            .clone();
        let others: Vec<_> = rows
            .into_iter()
            .filter(|r| r.instance == "b" && r.outcome == Outcome::Running)
            .collect();
        let done = row.outcome != Outcome::Running && !others.is_empty();
        if done || Instant::now() > deadline {
            break (row, others);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(others.len(), 1, "replica b runs the job again: {others:?}");
    assert_eq!(row.outcome, Outcome::Abandoned, "{row:?}");
    assert_eq!(row.closed_by.as_deref(), Some("b"));
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_over_delays_ticks_and_records_the_rest_by_default() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let (every_second, every_five) = (unique("per-second"), unique("per-five"));
    let (ticks, fives) = (Arc::new(Ticks::default()), Arc::new(Ticks::default()));
    let work = Duration::from_millis(10);
    // On the leader: a tick the dying leader would have handed to the other replica
    // ahead of its time is run on time there, not missed.
    let jobs = || {
        vec![
            counting_job(&every_second, "* * * * * *", &ticks, work).run_on_leader(),
            counting_job(&every_five, "*/5 * * * * *", &fives, work).run_on_leader(),
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
        matches!(err, HistoryError::Connect { .. }) && err.to_string().contains("no answer within"),
        "{err}"
    );
    // No scheme, and an unknown one.
    let err = History::connect("localhost/db").await.unwrap_err();
    assert!(
        matches!(err, HistoryError::InvalidUrl { .. }) && err.to_string().contains("no scheme"),
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
        .run(async move { tick_run(scheduler.trigger(&job_name).await.unwrap()) })
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
    let redlock = redlock_testkit::builder(&cluster)
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

/// Whether `key` is on a majority of the cluster's nodes.
async fn on_a_majority(cluster: &Cluster, key: &str) -> bool {
    let mut found = 0;
    for i in 0..cluster.len() {
        let Ok(mut conn) = cluster
            .node(i)
            .client()
            .get_multiplexed_async_connection()
            .await
        else {
            continue;
        };
        let exists: bool = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap_or(false);
        found += usize::from(exists);
    }
    found > cluster.len() / 2
}

/// A leader that claimed a tick and waits for its job's run lock steps down: the claim
/// goes back with the leadership, and the next leader runs the tick (once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_claimed_before_a_step_down_runs_on_the_next_leader() {
    let cluster = Cluster::start(3).await;
    let job = unique("handed-back");
    let ticks = Arc::new(Ticks::default());
    // Once a minute, last 3 s ago: missed at the election, so run late (misfire policy
    // run once), and a late run waits for the job's run lock, held here by someone else.
    let now = Utc::now().timestamp();
    let tick_s = now - 3;
    let tick = tick_s * 1000;
    let expression = format!("{} * * * * *", tick_s.rem_euclid(60));
    let claim_key = format!("redlock:{{{SCHEDULER}:job:{job}:{tick}}}");
    let run_lock = hold_run_lock(&cluster, &job).await;
    let make = || {
        vec![counting_job(
            &job,
            &expression,
            &ticks,
            Duration::from_millis(10),
        )]
    };
    let first = Replica::start(&cluster, "a", None, make(), |b| b).await;
    leader_of(std::slice::from_ref(&first), Duration::from_secs(5)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !on_a_majority(&cluster, &claim_key).await {
        assert!(Instant::now() < deadline, "the leader never claimed {tick}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = Replica::start(&cluster, "b", None, make(), |b| b).await;
    let ran = step_down_then_run(first, second, run_lock, &ticks, tick).await;
    assert_eq!(ran, ["b"], "tick {tick} ran once, on the new leader");
}

/// `job`'s run lock, taken by a client other than the replicas.
async fn hold_run_lock(cluster: &Cluster, job: &str) -> redlock_core::Lock {
    let someone_else = redlock_testkit::builder_for(cluster.urls())
        .build()
        .unwrap();
    someone_else
        .lock(format!("{SCHEDULER}:job:{job}:run"))
        .ttl(Duration::from_secs(60))
        .await
        .unwrap()
}

/// `leader` steps down and `next` takes over; then the job's run lock, held elsewhere,
/// goes, so that whoever has `tick` runs it now. The replicas that ran it, once it ran
/// (both replicas shut down).
async fn step_down_then_run(
    leader: Replica,
    next: Replica,
    run_lock: redlock_core::Lock,
    ticks: &Ticks,
    tick: i64,
) -> Vec<String> {
    let scheduler = leader.scheduler.clone();
    let stepped = leader
        .sandbox
        .run(async move { scheduler.step_down().await.is_ok() })
        .await;
    assert!(stepped, "the leader stepped down");
    let replicas = [leader, next];
    assert_eq!(leader_of(&replicas, Duration::from_secs(10)).await, 1);
    run_lock.release().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ticks.snapshot().contains_key(&tick) {
        assert!(
            Instant::now() < deadline,
            "tick {tick} never ran after the step-down: {:?}",
            ticks.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for replica in &replicas {
        replica.shutdown().await;
    }
    ticks.snapshot().remove(&tick).unwrap_or_default()
}

/// The replica a tick is handed to now (`None` once taken, or dropped).
async fn handed_to(history: &History, job: &str, tick_ms: i64) -> Option<String> {
    sqlx::query_scalar::<_, String>(&format!(
        "SELECT replica FROM {DEFAULT_TABLE_PREFIX}scheduler_dispatch
         WHERE job = $1 AND tick_ms = $2"
    ))
    .bind(job)
    .bind(tick_ms)
    .fetch_optional(history.pool())
    .await
    .unwrap()
}

/// A tick handed to a replica that dies before taking it is moved by the leader to its
/// own replica; the leader steps down before the run starts (the run waits for the
/// job's run lock, held elsewhere): the tick still runs, once, where it was moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_moved_to_the_leader_runs_after_a_step_down() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let job = unique("moved-here");
    let ticks = Arc::new(Ticks::default());
    // Two ticks: the first goes to the leader (ties go to it), the second to the other
    // replica, which has had none.
    let now = Utc::now().timestamp();
    let (first_s, second_s) = (now + 6, now + 9);
    let second_tick = second_s * 1000;
    let expression = format!(
        "{},{} * * * * *",
        first_s.rem_euclid(60),
        second_s.rem_euclid(60)
    );
    let make = || {
        vec![counting_job(
            &job,
            &expression,
            &ticks,
            Duration::from_millis(10),
        )]
    };
    // Someone else holds the job's run lock: the first tick is skipped (overlap), and
    // the second, once moved (so late), waits for it.
    let run_lock = hold_run_lock(&cluster, &job).await;
    let leader = Replica::start(&cluster, "a", Some(url.clone()), make(), |b| b).await;
    leader_of(std::slice::from_ref(&leader), Duration::from_secs(5)).await;
    let mut doomed = Replica::start(&cluster, "g", Some(url.clone()), make(), |b| b).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while handed_to(&history, &job, second_tick).await.as_deref() != Some("g") {
        assert!(
            Instant::now() < deadline,
            "tick {second_tick} never handed to g"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Dies before the tick's time, without taking it.
    doomed.sandbox.crash();
    // Once g stops beating, the leader moves the tick to itself.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let to = handed_to(&history, &job, second_tick).await;
        if to.as_deref() != Some("g") {
            break;
        }
        assert!(Instant::now() < deadline, "tick {second_tick} never moved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let next = Replica::start(&cluster, "b", Some(url.clone()), make(), |b| b).await;
    let ran = step_down_then_run(leader, next, run_lock, &ticks, second_tick).await;
    assert_eq!(
        ran,
        ["a"],
        "tick {second_tick} ran once, where it was moved"
    );
    let row = history
        .runs(SCHEDULER, &job, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.tick.timestamp() == second_s);
    assert_eq!(row.map(|r| r.outcome), Some(Outcome::Succeeded));
}
