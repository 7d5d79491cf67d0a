//! The scheduler against real redis-server nodes and real databases (SQLite files;
//! PostgreSQL at `DATABASE_URL`): exactly once per tick with several replicas, leader
//! crashes, graceful hand-over, clock skew, lock loss, DST, and build errors.
//!
//! Each replica runs in a [`Sandbox`] (its own runtime and links), so "killing" one is a
//! crash: its links are cut and its tasks dropped, nothing is released.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use redlock_scheduler::error::BuildError;
use redlock_scheduler::history::{Outcome, Run};
use redlock_scheduler::job::Misfire;
use redlock_scheduler::time::{BoxFuture, Clock, ManualClock};
use redlock_scheduler::{History, Job, JobContext, Scheduler, SchedulerBuilder};
use redlock_testkit::{Cluster, require};

mod common;
use common::*;

async fn exactly_once(url: String) {
    let cluster = Cluster::start(3).await;
    let job = unique("every-second");
    let ticks = Arc::new(Ticks::default());
    let history = History::connect(&url).await.unwrap();
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        let jobs = vec![counting_job(
            &job,
            "* * * * * *",
            &ticks,
            Duration::from_millis(200),
        )];
        replicas.push(Replica::start(&cluster, name, Some(url.clone()), jobs, |b| b).await);
    }
    let started = Utc::now();
    leader_of(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    for replica in &replicas {
        replica.shutdown().await;
    }
    let ended = Utc::now();
    let rows = rows(
        &history,
        &job,
        started - chrono::Duration::seconds(60),
        ended,
    )
    .await;
    let record = ticks.snapshot();
    assert_no_double_run(&record, &rows);
    // Every tick from shortly after the start to shortly before the end: one run.
    let window = seconds(
        started + chrono::Duration::seconds(2),
        ended - chrono::Duration::seconds(2),
    );
    assert!(window.len() >= 25, "{} ticks in the window", window.len());
    let by_tick: HashMap<i64, &Run> = rows
        .iter()
        .map(|r| (r.tick.timestamp_millis(), r))
        .collect();
    for tick in &window {
        let row = by_tick
            .get(tick)
            .unwrap_or_else(|| panic!("no row for tick {tick}"));
        assert_eq!(row.outcome, Outcome::Succeeded, "{row:?}");
        assert_eq!(record.get(tick).map(Vec::len), Some(1), "tick {tick}");
    }
    eprintln!("{url}: {} ticks, each ran exactly once", window.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_run_each_tick_once_with_sqlite() {
    let (_dir, url) = sqlite_url();
    exactly_once(url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_run_each_tick_once_with_postgres() {
    let Some(url) = require::database_url() else {
        return;
    };
    exactly_once(url).await;
}

/// The leader is crashed 5 times: no tick runs twice, missed ticks are caught up
/// (policy `CatchUp`), and a follower takes over within the leadership TTL plus one
/// retry interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_crashes_never_run_a_tick_twice() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let job = unique("crash");
    let ticks = Arc::new(Ticks::default());
    let make_job = || {
        counting_job(&job, "* * * * * *", &ticks, Duration::from_millis(100))
            .misfire(Misfire::CatchUp { max: 10 })
    };
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        replicas
            .push(Replica::start(&cluster, name, Some(url.clone()), vec![make_job()], |b| b).await);
    }
    let started = Utc::now();
    let mut takeovers = Vec::new();
    for round in 0..5 {
        let leader = leader_of(&replicas, Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let leader = if replicas[leader].leads() {
            leader
        } else {
            leader_of(&replicas, Duration::from_secs(5)).await
        };
        replicas[leader].sandbox.crash();
        let crashed = Instant::now();
        let next = leader_of(&replicas, Duration::from_secs(10)).await;
        let took = crashed.elapsed();
        assert_ne!(next, leader);
        takeovers.push(took);
        // A replacement keeps three replicas.
        let name = format!("r{round}");
        replicas.push(
            Replica::start(&cluster, &name, Some(url.clone()), vec![make_job()], |b| b).await,
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for replica in replicas.iter().filter(|r| !r.sandbox.is_crashed()) {
        replica.shutdown().await;
    }
    let ended = Utc::now();
    let bound = LEADER_TTL + RETRY;
    eprintln!("take-over after a crash: {takeovers:?} (bound {bound:?})");
    for took in &takeovers {
        // The bound, plus scheduling slack on a loaded 2-core machine.
        assert!(
            *took <= bound + Duration::from_millis(500),
            "take-over took {took:?}"
        );
    }
    let rows = rows(
        &history,
        &job,
        started - chrono::Duration::seconds(60),
        ended,
    )
    .await;
    let record = ticks.snapshot();
    assert_no_double_run(&record, &rows);
    // Missed ticks were caught up: every tick has a row, except at most one per crash
    // (claimed by the crashed leader an instant before it died, never recorded).
    let window = seconds(
        started + chrono::Duration::seconds(2),
        ended - chrono::Duration::seconds(2),
    );
    let recorded: std::collections::HashSet<i64> =
        rows.iter().map(|r| r.tick.timestamp_millis()).collect();
    let missing: Vec<&i64> = window.iter().filter(|t| !recorded.contains(t)).collect();
    assert!(
        missing.len() <= 5,
        "ticks never run: {missing:?} of {}",
        window.len()
    );
}

/// A leader that shuts down hands over at once (within 500 ms) while its running job
/// finishes, and that run is recorded as succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_hands_over_at_once_and_finishes_the_run() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let job = unique("graceful");
    let ticks = Arc::new(Ticks::default());
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        let jobs = vec![counting_job(
            &job,
            "*/3 * * * * *",
            &ticks,
            Duration::from_millis(1500),
        )];
        replicas.push(Replica::start(&cluster, name, Some(url.clone()), jobs, |b| b).await);
    }
    let leader = leader_of(&replicas, Duration::from_secs(5)).await;
    // Wait until the leader runs the job.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ticks.snapshot().is_empty() {
        assert!(Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (tick, instances) = ticks.snapshot().into_iter().next().unwrap();
    assert_eq!(
        instances,
        vec![replicas[leader].scheduler.instance().to_owned()]
    );
    let stopping = Instant::now();
    let scheduler = replicas[leader].scheduler.clone();
    let shutdown = replicas[leader]
        .sandbox
        .run(async move { scheduler.shutdown(Duration::from_secs(10)).await });
    let other = 1 - leader;
    let took = async {
        while !replicas[other].leads() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stopping.elapsed()
    };
    let (took, ()) = tokio::join!(took, shutdown);
    eprintln!("graceful hand-over: {took:?}");
    assert!(took < Duration::from_millis(500), "hand-over took {took:?}");
    let run = history
        .runs("scheduler", &job, 100)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.tick.timestamp_millis() == tick)
        .unwrap();
    assert_eq!(run.outcome, Outcome::Succeeded, "{run:?}");
    replicas[other].shutdown().await;
}

/// A wall clock off by a fixed amount.
struct Skewed(chrono::Duration);

impl Clock for Skewed {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.0
    }

    fn sleep_until(&self, deadline: DateTime<Utc>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let left = (deadline - self.now()).to_std().unwrap_or_default();
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left).await;
            }
        })
    }
}

/// Two replicas whose clocks are 4 s apart (+2 s and -2 s) trade leadership every 6 s:
/// still each tick runs exactly once. (A replica whose clock is behind waits, on taking
/// over, for ticks the other already ran: ticks come late then, never twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_clocks_still_run_each_tick_once() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let job = unique("skew");
    let ticks = Arc::new(Ticks::default());
    let mut replicas = Vec::new();
    for (name, skew) in [("ahead", 2), ("behind", -2)] {
        let jobs = vec![
            counting_job(&job, "* * * * * *", &ticks, Duration::from_millis(100))
                .misfire(Misfire::CatchUp { max: 10 }),
        ];
        replicas.push(
            Replica::start(&cluster, name, Some(url.clone()), jobs, move |b| {
                b.clock(Skewed(chrono::Duration::seconds(skew)))
                    .leadership_term(Duration::from_secs(6))
            })
            .await,
        );
    }
    let started = Utc::now();
    leader_of(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    for replica in &replicas {
        replica.shutdown().await;
    }
    let ended = Utc::now();
    let rows = rows(
        &history,
        &job,
        started - chrono::Duration::seconds(60),
        ended + chrono::Duration::seconds(5),
    )
    .await;
    let record = ticks.snapshot();
    assert_no_double_run(&record, &rows);
    let leaders: std::collections::HashSet<&str> =
        rows.iter().map(|r| r.instance.as_str()).collect();
    assert_eq!(leaders.len(), 2, "both replicas led: {leaders:?}");
    let window = seconds(
        started + chrono::Duration::seconds(4),
        ended - chrono::Duration::seconds(4),
    );
    let by_tick: HashMap<i64, &Run> = rows
        .iter()
        .map(|r| (r.tick.timestamp_millis(), r))
        .collect();
    for tick in &window {
        let row = by_tick
            .get(tick)
            .unwrap_or_else(|| panic!("no row for tick {tick}"));
        assert_eq!(row.outcome, Outcome::Succeeded, "{row:?}");
    }
}

/// Pausing the Redis majority mid-run fires the run's cancellation token; the run is
/// recorded as cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_loss_mid_run_cancels_the_job() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let job = unique("loss");
    let started_tx = Arc::new(tokio::sync::Notify::new());
    let cancelled_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handler_job = {
        let (started_tx, cancelled_at) = (Arc::clone(&started_tx), Arc::clone(&cancelled_at));
        Job::new(&job, "*/2 * * * * *", move |ctx: JobContext| {
            let (started_tx, cancelled_at) = (Arc::clone(&started_tx), Arc::clone(&cancelled_at));
            async move {
                started_tx.notify_one();
                ctx.cancelled().await;
                *cancelled_at.lock().unwrap() = Some(Instant::now());
                Err::<(), _>("stopped on cancellation".to_owned())
            }
        })
    };
    let replica = Replica::start(
        &cluster,
        "solo",
        Some(url.clone()),
        vec![handler_job],
        |b| b,
    )
    .await;
    tokio::time::timeout(Duration::from_secs(10), started_tx.notified())
        .await
        .expect("the job started");
    let paused = Instant::now();
    cluster.node(0).pause();
    cluster.node(1).pause();
    let deadline = Instant::now() + LEADER_TTL * 3;
    let fired = loop {
        if let Some(at) = *cancelled_at.lock().unwrap() {
            break at;
        }
        assert!(
            Instant::now() < deadline,
            "the cancellation token never fired"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let after = fired - paused;
    eprintln!("cancelled {after:?} after the majority was paused");
    assert!(
        after <= LEADER_TTL + Duration::from_millis(500),
        "{after:?}"
    );
    cluster.node(0).resume();
    cluster.node(1).resume();
    // The outcome is recorded once the run has stopped.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let runs = history.runs("scheduler", &job, 10).await.unwrap();
        if let Some(run) = runs.iter().find(|r| r.outcome != Outcome::Running) {
            assert_eq!(run.outcome, Outcome::Cancelled, "{run:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no outcome recorded: {runs:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replica.shutdown().await;
}

/// On the fall-back night, a job at 01:30 New York time runs once: at 01:30 EDT, not
/// again at 01:30 EST an hour later. The clock is injected and moved by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dst_fall_back_does_not_run_a_fixed_time_job_twice() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let job = unique("dst");
    let ticks = Arc::new(Ticks::default());
    let at = |h, m, s| Utc.with_ymd_and_hms(2026, 11, 1, h, m, s).unwrap();
    let clock = ManualClock::new(at(5, 29, 59));
    let jobs = vec![
        counting_job(&job, "0 30 1 * * *", &ticks, Duration::ZERO).time_zone("America/New_York"),
    ];
    let replica = {
        let clock = clock.clone();
        Replica::start(&cluster, "dst", Some(url.clone()), jobs, move |b| {
            b.clock(clock)
        })
        .await
    };
    leader_of(std::slice::from_ref(&replica), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 01:30 EDT (05:30Z) comes: it runs.
    clock.set(at(5, 30, 0));
    let deadline = Instant::now() + Duration::from_secs(5);
    while ticks.snapshot().is_empty() {
        assert!(Instant::now() < deadline, "01:30 EDT did not run");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // 01:30 EST (06:30Z), the same wall time an hour later: nothing.
    clock.set(at(6, 29, 59));
    tokio::time::sleep(Duration::from_millis(300)).await;
    clock.set(at(6, 30, 0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    clock.set(at(6, 31, 0));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let record = ticks.snapshot();
    assert_eq!(record.len(), 1, "{record:?}");
    assert!(record.contains_key(&at(5, 30, 0).timestamp_millis()));
    let runs = history.runs("scheduler", &job, 10).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        replica.scheduler.status().await.jobs[0].next_fire,
        Some(Utc.with_ymd_and_hms(2026, 11, 2, 6, 30, 0).unwrap())
    );
    replica.shutdown().await;
}

/// Every invalid job definition is refused at build time, naming the input.
#[test]
fn invalid_definitions_are_build_errors() {
    let redlock = redlock_testkit::builder_for(["redis://127.0.0.1:1"])
        .build()
        .unwrap();
    let ok = |name: &str, expr: &str| {
        Job::new(name, expr, |_ctx: JobContext| async {
            Ok::<_, std::io::Error>(())
        })
    };
    let build = |jobs: Vec<Job>| {
        jobs.into_iter()
            .fold(Scheduler::builder(redlock.clone()), SchedulerBuilder::job)
            .build()
            .map(|_| ())
    };
    assert_eq!(
        build(vec![ok("  ", "* * * * *")]),
        Err(BuildError::EmptyName)
    );
    let err = build(vec![ok("a", "* * * * *"), ok("a", "0 * * * *")]).unwrap_err();
    assert_eq!(err, BuildError::DuplicateJob { name: "a".into() });
    assert!(err.to_string().contains("`a`"), "{err}");
    let err = build(vec![ok("bad", "61 * * * *")]).unwrap_err();
    assert!(
        matches!(err, BuildError::InvalidSchedule { ref job, .. } if job == "bad"),
        "{err:?}"
    );
    assert!(err.to_string().contains("61 * * * *"), "{err}");
    let err = build(vec![ok("zone", "* * * * *").time_zone("Mars/Olympus")]).unwrap_err();
    assert!(err.to_string().contains("Mars/Olympus"), "{err}");
    let err = build(vec![ok("never", "0 0 31 2 *")]).unwrap_err();
    assert!(err.to_string().contains("never"), "{err}");
    let err = build(vec![ok("t", "* * * * *").timeout(Duration::ZERO)]).unwrap_err();
    assert!(err.to_string().contains("timeout"), "{err}");
    assert!(build(vec![ok("fine", "*/5 * * * * *")]).is_ok());
}

/// With a history the leader hands on-time runs to the replicas (all of them get some),
/// except a job marked `run_on_leader`, which runs on the leader only; each tick once,
/// on the replica its row names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_spread_over_the_replicas_and_pinned_jobs_stay_on_the_leader() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let (spread, pinned) = (unique("spread"), unique("pinned"));
    let spread_ticks: Vec<Arc<Ticks>> = (0..6).map(|_| Arc::new(Ticks::default())).collect();
    let pinned_ticks = Arc::new(Ticks::default());
    let jobs = || {
        let mut jobs: Vec<Job> = spread_ticks
            .iter()
            .enumerate()
            .map(|(i, ticks)| {
                let name = format!("{spread}-{i}");
                counting_job(&name, "* * * * * *", ticks, Duration::from_millis(20))
            })
            .collect();
        jobs.push(
            counting_job(
                &pinned,
                "* * * * * *",
                &pinned_ticks,
                Duration::from_millis(20),
            )
            .run_on_leader(),
        );
        jobs
    };
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        replicas.push(Replica::start(&cluster, name, Some(url.clone()), jobs(), |b| b).await);
    }
    leader_of(&replicas, Duration::from_secs(5)).await;
    // Who led meanwhile: on a loaded machine the leadership may change hands, and the
    // pinned job follows it.
    let mut leaders = std::collections::HashSet::new();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        for (replica, name) in replicas.iter().zip(["a", "b", "c"]) {
            if replica.leads() {
                leaders.insert(name.to_owned());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for replica in &replicas {
        replica.shutdown().await;
    }
    let history = History::connect(&url).await.unwrap();
    let mut per_replica: HashMap<String, usize> = HashMap::new();
    for (i, ticks) in spread_ticks.iter().enumerate() {
        let job = format!("{spread}-{i}");
        let record = ticks.snapshot();
        let rows = history.runs("scheduler", &job, 100).await.unwrap();
        for (tick, instances) in &record {
            assert_eq!(
                instances.len(),
                1,
                "{job}: tick {tick} ran twice: {record:?}"
            );
            let row = rows.iter().find(|r| r.tick.timestamp_millis() == *tick);
            assert_eq!(
                row.map(|r| r.instance.as_str()),
                Some(instances[0].as_str()),
                "{job}: tick {tick}"
            );
            *per_replica.entry(instances[0].clone()).or_default() += 1;
        }
    }
    assert_eq!(per_replica.len(), 3, "runs per replica: {per_replica:?}");
    let pinned_runs = pinned_ticks.snapshot();
    assert!(pinned_runs.len() >= 3, "{pinned_runs:?}");
    for instances in pinned_runs.values() {
        assert!(
            instances.len() == 1 && leaders.contains(&instances[0]),
            "pinned runs {pinned_runs:?}, leaders {leaders:?}"
        );
    }
}
