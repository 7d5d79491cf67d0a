//! The scheduler's controls and records against real redis-server nodes and SQLite:
//! trigger, pause, resume and status; timeouts and failures in the history.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redlock_scheduler::admin::{Dispatched, RequestState};
use redlock_scheduler::history::{Outcome, Run};
use redlock_scheduler::{History, Job, JobContext};
use redlock_testkit::Cluster;

mod common;
use common::*;

/// Waits until `replica` names `leader` as the leader (from the history's record).
async fn wait_until_named(replica: &Replica, leader: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while replica.scheduler.status().await.leader.as_deref() != Some(leader) {
        assert!(
            Instant::now() < deadline,
            "`{leader}` was not recorded as the leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the latest run of `job` has succeeded; its tick.
async fn succeeded(history: &History, job: &str) -> DateTime<Utc> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let latest = history.runs("scheduler", job, 1).await.unwrap();
        if let Some(run) = latest.first().filter(|r| r.outcome == Outcome::Succeeded) {
            return run.tick;
        }
        assert!(Instant::now() < deadline, "no run recorded: {latest:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `trigger` runs a job now through the claim path (on the leader only), `pause` skips
/// its ticks (recorded as skipped) until `resume`, and `status` serializes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_pause_resume_and_status() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let yearly = unique("yearly");
    let secondly = unique("secondly");
    let ticks = Arc::new(Ticks::default());
    let manual = Arc::new(Mutex::new(Vec::new()));
    let jobs = |manual: &Arc<Mutex<Vec<bool>>>| {
        let manual = Arc::clone(manual);
        vec![
            Job::new(&yearly, "0 0 0 1 1 *", move |ctx: JobContext| {
                let manual = Arc::clone(&manual);
                async move {
                    manual.lock().unwrap().push(ctx.is_manual());
                    Ok::<_, std::io::Error>(())
                }
            }),
            counting_job(&secondly, "* * * * * *", &ticks, Duration::ZERO),
        ]
    };
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        replicas
            .push(Replica::start(&cluster, name, Some(url.clone()), jobs(&manual), |b| b).await);
    }
    let leader = leader_of(&replicas, Duration::from_secs(5)).await;
    let follower = 1 - leader;

    // Trigger: on the leader it runs once, now, and answers the tick it ran.
    let tick = tick_run(replicas[leader].scheduler.trigger(&yearly).await.unwrap());
    assert!(matches!(
        replicas[leader].scheduler.trigger("nope").await,
        Err(redlock_scheduler::error::RequestError::UnknownJob { .. })
    ));
    assert_eq!(succeeded(&history, &yearly).await, tick);
    assert_eq!(*manual.lock().unwrap(), vec![true]);

    // On a follower it is passed on to the leader as a request, as an admin's trigger
    // is: the follower need not know which replica leads (right after an election, the
    // leader may not have recorded itself in the history yet).
    let requested = replicas[follower].scheduler.trigger(&yearly).await.unwrap();
    let admin = replicas[follower].scheduler.admin().unwrap();
    let id = requested
        .request_id()
        .expect("a follower's trigger is a request");
    let request = admin.wait(id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(request.state, RequestState::Succeeded, "{request:?}");
    assert_eq!(
        request.done_by.as_deref(),
        Some(replicas[leader].scheduler.instance())
    );
    let second = succeeded(&history, &yearly).await;
    assert_eq!(
        request.result.as_deref(),
        Some(format!("ok: tick {}", second.to_rfc3339()).as_str())
    );
    assert_eq!(*manual.lock().unwrap(), vec![true, true]);

    // Pause (asked of the follower: cluster-wide through the history): ticks are skipped.
    replicas[follower].scheduler.pause(&secondly).await.unwrap();
    let paused_at = Utc::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    replicas[follower]
        .scheduler
        .resume(&secondly)
        .await
        .unwrap();
    let resumed_at = Utc::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let rows = rows(
        &history,
        &secondly,
        paused_at + chrono::Duration::milliseconds(1100),
        resumed_at - chrono::Duration::milliseconds(100),
    )
    .await;
    assert!(!rows.is_empty());
    for row in &rows {
        assert_eq!(row.outcome, Outcome::Skipped, "{row:?}");
        assert_eq!(row.error.as_deref(), Some("paused"));
    }
    let after = rows_after(
        &history,
        &secondly,
        resumed_at + chrono::Duration::milliseconds(1100),
    )
    .await;
    assert!(
        after.iter().any(|r| r.outcome == Outcome::Succeeded),
        "{after:?}"
    );

    // Status: leader, jobs, next fire, last run; serializable.
    let status = replicas[follower].scheduler.status().await;
    assert!(!status.is_leader);
    assert_eq!(
        status.leader.as_deref(),
        Some(replicas[leader].scheduler.instance())
    );
    let job = status.jobs.iter().find(|j| j.name == yearly).unwrap();
    assert_eq!(
        job.next_fire
            .map(|t| t.format("%m-%d %H:%M:%S").to_string()),
        Some("01-01 00:00:00".to_owned())
    );
    assert_eq!(
        job.last_run.as_ref().map(|r| r.outcome),
        Some(Outcome::Succeeded)
    );
    let json = serde_json::to_string(&status).unwrap();
    assert!(
        json.contains(r#""is_leader":false"#) && json.contains(&yearly),
        "{json}"
    );
    for replica in &replicas {
        replica.shutdown().await;
    }
}

async fn rows_after(history: &History, job: &str, from: DateTime<Utc>) -> Vec<Run> {
    rows(
        history,
        job,
        from,
        Utc::now() + chrono::Duration::seconds(5),
    )
    .await
}

/// A run past its job's timeout gets its token fired and is recorded as timed out; a
/// failing handler is recorded as failed with its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_failures_are_recorded() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let (slow, failing) = (unique("slow"), unique("failing"));
    let jobs = vec![
        Job::new(&slow, "*/2 * * * * *", |ctx: JobContext| async move {
            ctx.cancelled().await; // stops only when told to
            Ok::<_, std::io::Error>(())
        })
        .timeout(Duration::from_millis(300)),
        Job::new(&failing, "*/2 * * * * *", |_ctx: JobContext| async move {
            Err::<(), _>(std::io::Error::other("disk full"))
        }),
    ];
    let replica = Replica::start(&cluster, "solo", Some(url.clone()), jobs, |b| b).await;
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let slow_runs = history.runs("scheduler", &slow, 5).await.unwrap();
        let failing_runs = history.runs("scheduler", &failing, 5).await.unwrap();
        let timed_out = slow_runs.iter().find(|r| r.outcome == Outcome::TimedOut);
        let failed = failing_runs.iter().find(|r| r.outcome == Outcome::Failed);
        if let (Some(timed_out), Some(failed)) = (timed_out, failed) {
            let took = timed_out.finished.unwrap() - timed_out.started.unwrap();
            assert!(took < chrono::Duration::milliseconds(1000), "{took:?}");
            assert_eq!(failed.error.as_deref(), Some("disk full"));
            break;
        }
        assert!(Instant::now() < deadline, "{slow_runs:?} {failing_runs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replica.shutdown().await;
}

/// A leadership term, a job's timeout and misfire grace, and the shutdown deadline too
/// long to count (`Duration::MAX`) bound nothing: the replica is elected, the job is
/// triggered and runs, and the shutdown waits for the run to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_too_long_to_count_bound_nothing() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let name = unique("unbounded");
    let job = Job::new(&name, "0 0 0 1 1 *", |_ctx: JobContext| async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok::<_, std::io::Error>(())
    })
    .timeout(Duration::MAX)
    .misfire_grace(Duration::MAX);
    let replicas = [Replica::start(&cluster, "a", Some(url), vec![job], |b| {
        b.leadership_term(Duration::MAX)
    })
    .await];
    leader_of(&replicas, Duration::from_secs(5)).await;
    let tick = tick_run(replicas[0].scheduler.trigger(&name).await.unwrap());
    let scheduler = replicas[0].scheduler.clone();
    tokio::time::timeout(
        Duration::from_secs(10),
        replicas[0]
            .sandbox
            .run(async move { scheduler.shutdown(Duration::MAX).await }),
    )
    .await
    .expect("the shutdown waits for the run, then returns");
    let runs = history.runs("scheduler", &name, 5).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!((runs[0].tick, runs[0].outcome), (tick, Outcome::Succeeded));
}

/// A replica whose leadership ended is not named as the leader by the record it wrote
/// while it led, though the history still says so (the end and the next leader's record
/// are held up here by a transaction that keeps SQLite's write lock): it names no
/// leader until the next one has recorded itself, then that one; a trigger asked of it
/// goes to that one as a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_leader_does_not_name_itself() {
    use sqlx::Connection;

    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let name = unique("yearly");
    let job = || {
        Job::new(&name, "0 0 0 1 1 *", |_ctx: JobContext| async {
            Ok::<_, std::io::Error>(())
        })
    };
    let mut replicas = Vec::new();
    for instance in ["a", "b"] {
        replicas
            .push(Replica::start(&cluster, instance, Some(url.clone()), vec![job()], |b| b).await);
    }
    let leader = leader_of(&replicas, Duration::from_secs(5)).await;
    let follower = 1 - leader;
    let (former, next) = (&replicas[leader].scheduler, &replicas[follower].scheduler);
    wait_until_named(&replicas[follower], former.instance()).await;

    let mut writer = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut writer)
        .await
        .unwrap();
    assert!(matches!(
        former.step_down().await.unwrap(),
        Dispatched::Done { tick: None, .. }
    ));
    assert_eq!(former.status().await.leader, None);
    sqlx::query("ROLLBACK").execute(&mut writer).await.unwrap();

    leader_of(&replicas[follower..=follower], Duration::from_secs(5)).await;
    wait_until_named(&replicas[leader], next.instance()).await;
    // A trigger on the former leader is passed on to the one that leads now.
    let requested = former.trigger(&name).await.unwrap();
    let admin = former.admin().unwrap();
    let id = requested
        .request_id()
        .expect("a follower's trigger is a request");
    let request = admin.wait(id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(request.state, RequestState::Succeeded, "{request:?}");
    assert_eq!(request.done_by.as_deref(), Some(next.instance()));
}
