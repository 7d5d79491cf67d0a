//! Jobs added, rescheduled and removed at run time, against real Redis nodes and a
//! shared history: a change made on one replica (or by an admin tool) reaches every
//! replica, is recorded, and switches the job without a double or a lost tick.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Timelike, Utc};
use redlock_scheduler::admin::SchedulerAdmin;
use redlock_scheduler::changes::JobChangeAction;
use redlock_scheduler::error::RequestError;
use redlock_scheduler::history::{Outcome, Run};
use redlock_scheduler::job::Misfire;
use redlock_scheduler::{History, JobContext, JobSpec, Scheduler};
use redlock_testkit::Cluster;

mod common;
use common::*;

/// Three replicas of one scheduler, each with the handler `count` (which records its
/// tick, job and replica, and works for `work`) and no job declared in code.
async fn replicas(
    cluster: &Cluster,
    url: &str,
    ticks: &Arc<Ticks>,
    work: Duration,
) -> Vec<Replica> {
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        replicas.push(counting_replica(cluster, name, url, ticks, work).await);
    }
    replicas
}

/// One replica with the handler `count` (see [`replicas`]).
async fn counting_replica(
    cluster: &Cluster,
    name: &str,
    url: &str,
    ticks: &Arc<Ticks>,
    work: Duration,
) -> Replica {
    let ticks = Arc::clone(ticks);
    Replica::start(cluster, name, Some(url.to_owned()), Vec::new(), move |b| {
        b.handler("count", move |ctx: JobContext| {
            let ticks = Arc::clone(&ticks);
            async move {
                // Which job ran the tick where: `job@instance`.
                ticks
                    .0
                    .lock()
                    .unwrap()
                    .entry(ctx.tick().timestamp_millis())
                    .or_default()
                    .push(format!("{}@{}", ctx.job(), ctx.instance()));
                tokio::select! {
                    () = tokio::time::sleep(work) => Ok(()),
                    () = ctx.cancelled() => Err("cancelled".to_owned()),
                }
            }
        })
    })
    .await
}

/// Waits until every replica lists `job` among its jobs (`true`) or none does.
async fn until_every_replica(replicas: &[Replica], job: &str, present: bool, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let mut all = true;
        for replica in replicas {
            let status = replica.scheduler.status().await;
            all &= status.jobs.iter().any(|j| j.name == job) == present;
        }
        if all {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the change of {job} did not reach every replica within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sleeps until `at` (wall clock).
async fn sleep_until(at: DateTime<Utc>) {
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}

/// The rows of `job`, by tick (Unix ms), in the history.
async fn rows_by_tick(history: &History, job: &str) -> HashMap<i64, Outcome> {
    runs_by_tick(history, job)
        .await
        .into_iter()
        .map(|(tick, run)| (tick, run.outcome))
        .collect()
}

/// The rows of `job`, by tick (Unix ms), whole.
async fn runs_by_tick(history: &History, job: &str) -> HashMap<i64, Run> {
    history
        .runs(Scheduler::DEFAULT_NAME, job, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|run| (run.tick.timestamp_millis(), run))
        .collect()
}

/// A job added through a follower reaches every replica within the poll, runs every
/// tick after the change once (spread over the replicas), none before it; the change
/// is recorded with its author; a replica started afterwards has the job too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_added_on_a_follower_runs_on_every_replica_from_the_change() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let ticks = Arc::new(Ticks::default());
    let mut replicas = replicas(&cluster, &url, &ticks, Duration::from_millis(100)).await;
    let leader = leader_of(&replicas, Duration::from_secs(5)).await;
    let follower = (leader + 1) % replicas.len();
    // Let every replica beat once (the handler is looked up among the live replicas').
    tokio::time::sleep(Duration::from_millis(500)).await;
    let change = replicas[follower]
        .scheduler
        .add_job(JobSpec::new("added", "* * * * * *").handler("count"))
        .await
        .unwrap();
    assert_eq!(change.action, JobChangeAction::Add);
    assert_eq!(change.changed_by, replicas[follower].scheduler.instance());
    assert!(change.previous.is_none());
    until_every_replica(&replicas, "added", true, Duration::from_secs(2)).await;
    // Adding it again, anywhere, is refused.
    let admin = SchedulerAdmin::new(history.clone(), Scheduler::DEFAULT_NAME).operator("ops");
    match admin
        .add_job(JobSpec::new("added", "*/5 * * * * *").handler("count"))
        .await
    {
        Err(RequestError::JobExists { name }) => assert_eq!(name, "added"),
        other => panic!("a second add: {other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    // A replica that starts now applies the recorded change.
    let late = Replica::start(&cluster, "d", Some(url.clone()), Vec::new(), |b| {
        b.handler("count", |_ctx: JobContext| async {
            Ok::<_, std::io::Error>(())
        })
    })
    .await;
    until_every_replica(
        std::slice::from_ref(&late),
        "added",
        true,
        Duration::from_secs(3),
    )
    .await;
    let ended = Utc::now();
    late.shutdown().await;
    for replica in &replicas {
        replica.shutdown().await;
    }
    let rows = rows_by_tick(&history, "added").await;
    let record = ticks.snapshot();
    for (tick, instances) in &record {
        assert_eq!(instances.len(), 1, "tick {tick} ran on {instances:?}");
    }
    // Nothing before the change; every tick from a poll after it, once.
    let changed = change.changed.timestamp_millis();
    assert!(rows.keys().all(|tick| *tick > changed), "{rows:?}");
    let from = change.changed + chrono::Duration::milliseconds(1500);
    for tick in seconds(from, ended - chrono::Duration::seconds(2)) {
        assert_eq!(
            rows.get(&tick),
            Some(&Outcome::Succeeded),
            "tick {tick}: {rows:?}"
        );
    }
    let ran_on: std::collections::HashSet<&String> = record.values().flatten().collect();
    assert!(ran_on.len() >= 2, "runs spread: {ran_on:?}");
    // The record: who, when, what.
    let changes = admin.job_changes(Some("added"), 10).await.unwrap();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(
        changes[0].definition.as_ref().unwrap().expression(),
        "* * * * * *"
    );
    assert_eq!(changes[0].changed_by, change.changed_by);
    assert!(
        admin
            .jobs()
            .await
            .unwrap()
            .iter()
            .any(|j| j.name == "added")
    );
    drop(replicas.drain(..));
}

/// A schedule changed 50 ms before a tick, by an admin tool: the old schedule's ticks
/// run up to the switch and the new one's from it, each once; none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_changed_just_before_a_tick_switches_without_a_double_or_a_lost_tick() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let ticks = Arc::new(Ticks::default());
    let replicas = replicas(&cluster, &url, &ticks, Duration::from_millis(100)).await;
    leader_of(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let admin = SchedulerAdmin::new(history.clone(), Scheduler::DEFAULT_NAME).operator("ops");
    let even = JobSpec::new("switch", "*/2 * * * * *").handler("count");
    admin.add_job(even.clone()).await.unwrap();
    until_every_replica(&replicas, "switch", true, Duration::from_secs(2)).await;
    // Let a few even ticks run, then switch to odd seconds 50 ms before an even one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = Utc::now();
    let next_even = {
        let s = now.timestamp() + 1;
        s + s % 2
    };
    let tick = DateTime::from_timestamp(next_even, 0).unwrap();
    sleep_until(tick - chrono::Duration::milliseconds(50)).await;
    let current = admin.job_spec("switch").await.unwrap().unwrap();
    assert_eq!(current, even);
    let change = admin
        .reschedule_job(current.schedule("1/2 * * * * *"))
        .await
        .unwrap();
    assert_eq!(change.action, JobChangeAction::Reschedule);
    assert_eq!(change.previous.as_ref(), Some(&even));
    assert!(change.changed < tick, "changed at {}", change.changed);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let ended = Utc::now();
    for replica in &replicas {
        replica.shutdown().await;
    }
    let rows = runs_by_tick(&history, "switch").await;
    let record = ticks.snapshot();
    for (t, instances) in &record {
        assert_eq!(instances.len(), 1, "tick {t} ran on {instances:?}");
    }
    let at = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap();
    for (t, run) in &rows {
        let second = at(*t).second();
        if at(*t) < tick {
            // Before the switch: even ticks only, each run.
            assert_eq!(second % 2, 0, "an odd tick {} before the switch", at(*t));
            assert_eq!(run.outcome, Outcome::Succeeded, "{run:?}");
        } else if second % 2 == 0 {
            // The tick just after the change was claimed under the old schedule (runs
            // handed out are claimed ahead of their time): it is dropped, recorded so,
            // where the replica that has it knows of the change, and run otherwise.
            assert_eq!(at(*t), tick, "an even tick {} after the switch", at(*t));
            assert!(
                run.outcome == Outcome::Succeeded
                    || (run.outcome == Outcome::Skipped
                        && run
                            .error
                            .as_deref()
                            .is_some_and(|e| e.contains("rescheduled"))),
                "{run:?}"
            );
        } else {
            assert_eq!(run.outcome, Outcome::Succeeded, "{run:?}");
        }
    }
    eprintln!(
        "the even tick at the switch: {:?}",
        rows.get(&tick.timestamp_millis())
            .map(|r| (r.outcome, r.error.clone()))
    );
    // Not one tick lost on either side.
    for t in seconds(
        change.changed - chrono::Duration::seconds(3),
        ended - chrono::Duration::seconds(1),
    ) {
        let when = at(t);
        let due = if when < tick {
            when.second() % 2 == 0
        } else {
            when > tick && when.second() % 2 == 1
        };
        if due {
            assert!(rows.contains_key(&t), "tick {when} lost: {rows:?}");
        }
    }
}

/// A schedule changed while no replica leads (its leader died): the leader elected
/// afterwards runs the old schedule's ticks missed before the change and the new one's
/// after it (each by the job's misfire policy, here all of them), each once, in order;
/// and the ticks of a job added meanwhile, from when it was added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_changed_while_nobody_leads_loses_no_tick_of_either_schedule() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let ticks = Arc::new(Ticks::default());
    let work = Duration::from_millis(50);
    let mut first = counting_replica(&cluster, "a", &url, &ticks, work).await;
    leader_of(std::slice::from_ref(&first), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let admin = SchedulerAdmin::new(history.clone(), Scheduler::DEFAULT_NAME).operator("ops");
    let even = JobSpec::new("handover", "*/2 * * * * *")
        .handler("count")
        .misfire(Misfire::CatchUp { max: 10 });
    let added = admin.add_job(even.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Half way between two even ticks (no run going on: a run cut by the crash would be
    // recorded abandoned), the leader dies; nobody leads: two even ticks pass, the job moves to odd seconds
    // (accepted: the dead replica's beat, with its handlers, is recent), two odd ticks
    // pass, then a replica starts.
    let odd = {
        let s = Utc::now().timestamp() + 1;
        s + (1 - s % 2)
    };
    sleep_until(DateTime::from_timestamp(odd, 0).unwrap()).await;
    first.sandbox.crash();
    tokio::time::sleep(Duration::from_millis(4200)).await;
    let change = admin
        .reschedule_job(even.schedule("1/2 * * * * *"))
        .await
        .unwrap();
    // A job added meanwhile, never run before the election: its ticks since it was
    // added were missed too.
    let meanwhile = admin
        .add_job(
            JobSpec::new("meanwhile", "* * * * * *")
                .handler("count")
                .misfire(Misfire::CatchUp { max: 10 }),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(4200)).await;
    let second = counting_replica(&cluster, "b", &url, &ticks, work).await;
    leader_of(std::slice::from_ref(&second), Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ended = Utc::now();
    second.shutdown().await;
    let rows = runs_by_tick(&history, "handover").await;
    for (t, runs) in &ticks.snapshot() {
        let jobs: std::collections::HashSet<&str> = runs
            .iter()
            .map(|run| run.split('@').next().unwrap())
            .collect();
        assert_eq!(jobs.len(), runs.len(), "tick {t} ran twice: {runs:?}");
    }
    let added_meanwhile = rows_by_tick(&history, "meanwhile").await;
    let from = meanwhile.changed + chrono::Duration::milliseconds(1000);
    for t in seconds(from, ended - chrono::Duration::milliseconds(1500)) {
        assert_eq!(
            added_meanwhile.get(&t),
            Some(&Outcome::Succeeded),
            "tick {t} of the job added while nobody led: {added_meanwhile:?}"
        );
    }
    let at = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap();
    let changed = change.changed.timestamp_millis();
    for t in rows.keys() {
        let odd = at(*t).second() % 2 == 1;
        assert_eq!(odd, *t > changed, "tick {} on the wrong schedule", at(*t));
    }
    let from = added.changed + chrono::Duration::milliseconds(1500);
    for t in seconds(from, ended - chrono::Duration::milliseconds(1500)) {
        let odd = at(t).second() % 2 == 1;
        if odd == (t > changed) {
            assert_eq!(
                rows.get(&t).map(|run| run.outcome),
                Some(Outcome::Succeeded),
                "tick {} (the change at {}): {rows:?}",
                at(t),
                change.changed
            );
        }
    }
}

/// A schedule changed through the leader's own `Scheduler` 50 ms before a tick
/// applies from that very tick: it does not run, the new schedule's next tick does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_changed_on_the_leader_just_before_a_tick_applies_from_that_tick() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let ticks = Arc::new(Ticks::default());
    let replicas = replicas(&cluster, &url, &ticks, Duration::from_millis(100)).await;
    let leader = leader_of(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let scheduler = &replicas[leader].scheduler;
    let even = JobSpec::new("pinned", "*/2 * * * * *")
        .handler("count")
        .run_on_leader(true);
    scheduler.add_job(even.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let next_even = {
        let s = Utc::now().timestamp() + 1;
        s + s % 2
    };
    let tick = DateTime::from_timestamp(next_even, 0).unwrap();
    sleep_until(tick - chrono::Duration::milliseconds(50)).await;
    scheduler
        .reschedule_job(even.schedule("1/2 * * * * *"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        scheduler.leadership().is_some(),
        "the leader changed mid-test"
    );
    for replica in &replicas {
        replica.shutdown().await;
    }
    let rows = runs_by_tick(&history, "pinned").await;
    let record = ticks.snapshot();
    let t = tick.timestamp_millis();
    assert!(
        !record.contains_key(&t),
        "the tick at the switch ran: {record:?}"
    );
    assert!(
        rows.get(&t)
            .is_none_or(|run| run.outcome == Outcome::Skipped),
        "{:?}",
        rows.get(&t)
    );
    for after in [t + 1000, t + 3000] {
        assert_eq!(
            rows.get(&after).map(|r| r.outcome),
            Some(Outcome::Succeeded),
            "the new schedule's tick {after}: {rows:?}"
        );
    }
    assert!(!rows.contains_key(&(t + 2000)), "{rows:?}");
}

/// A job removed while a run of it goes on: the run finishes and is recorded as it
/// ended; no tick fires after the change reached the leader; the job is gone from every
/// replica and from the admin's list, and the change records the old definition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_removed_while_it_runs_finishes_that_run_and_fires_no_more() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let ticks = Arc::new(Ticks::default());
    let replicas = replicas(&cluster, &url, &ticks, Duration::from_millis(1500)).await;
    let leader = leader_of(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spec = JobSpec::new("removed", "*/2 * * * * *").handler("count");
    replicas[leader]
        .scheduler
        .add_job(spec.clone())
        .await
        .unwrap();
    // Wait for a run to start, then remove the job while it goes on.
    let deadline = Instant::now() + Duration::from_secs(5);
    while ticks.snapshot().is_empty() {
        assert!(Instant::now() < deadline, "no run started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let follower = (leader + 1) % replicas.len();
    let change = replicas[follower]
        .scheduler
        .remove_job("removed")
        .await
        .unwrap();
    assert_eq!(change.action, JobChangeAction::Remove);
    assert_eq!(change.previous.as_ref(), Some(&spec));
    until_every_replica(&replicas, "removed", false, Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let admin = SchedulerAdmin::new(history.clone(), Scheduler::DEFAULT_NAME);
    assert!(
        !admin
            .jobs()
            .await
            .unwrap()
            .iter()
            .any(|j| j.name == "removed")
    );
    match admin.remove_job("removed").await {
        Err(RequestError::UnknownJob { .. }) => {}
        other => panic!("a second removal: {other:?}"),
    }
    for replica in &replicas {
        replica.shutdown().await;
    }
    let rows = rows_by_tick(&history, "removed").await;
    // The run going on at the change finished (not cancelled); nothing after the
    // change ran (a tick claimed before the leader saw it may be recorded skipped).
    let changed = change.changed.timestamp_millis();
    let before: Vec<_> = rows.iter().filter(|(t, _)| **t <= changed).collect();
    assert!(!before.is_empty());
    assert!(
        before.iter().all(|(_, o)| **o == Outcome::Succeeded),
        "{rows:?}"
    );
    let record = ticks.snapshot();
    let bound = changed + 1000;
    assert!(
        record.keys().all(|t| *t <= bound),
        "a tick after the removal ran: {record:?} (removed at {changed})"
    );
}

/// Bad changes are refused with the reason, and nothing is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_changes_are_refused() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let ticks = Arc::new(Ticks::default());
    let replicas = replicas(&cluster, &url, &ticks, Duration::ZERO).await;
    leader_of(&replicas, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let admin = SchedulerAdmin::new(history.clone(), Scheduler::DEFAULT_NAME);
    let scheduler = &replicas[0].scheduler;
    let unknown_handler = JobSpec::new("x", "* * * * * *").handler("nope");
    assert!(matches!(
        admin.add_job(unknown_handler.clone()).await,
        Err(RequestError::UnknownHandler { .. })
    ));
    assert!(matches!(
        scheduler.add_job(unknown_handler).await,
        Err(RequestError::UnknownHandler { .. })
    ));
    for bad in [
        JobSpec::new("x", "every minute").handler("count"),
        JobSpec::new("x", "* * * * *")
            .handler("count")
            .time_zone("Mars/Olympus"),
        JobSpec::new("", "* * * * *").handler("count"),
    ] {
        assert!(
            matches!(
                scheduler.add_job(bad.clone()).await,
                Err(RequestError::InvalidJob(_))
            ),
            "{bad:?}"
        );
        assert!(matches!(
            admin.add_job(bad).await,
            Err(RequestError::InvalidJob(_))
        ));
    }
    assert!(matches!(
        scheduler
            .reschedule_job(JobSpec::new("x", "* * * * *").handler("count"))
            .await,
        Err(RequestError::UnknownJob { .. })
    ));
    assert!(matches!(
        scheduler.remove_job("x").await,
        Err(RequestError::UnknownJob { .. })
    ));
    assert!(admin.job_changes(None, 10).await.unwrap().is_empty());
    // A replica of a version without job changes (its beat names no handlers) is
    // alive: changes are refused until it is upgraded.
    let replicas_table = "redlock_scheduler_replicas";
    sqlx::query(&format!(
        "INSERT INTO {replicas_table} (scheduler, instance, capacity, running, jobs_digest, polled_ms, seen_ms)
         VALUES ('scheduler', 'old', NULL, 0, '', 0, $1)"
    ))
    .bind(Utc::now().timestamp_millis())
    .execute(history.pool())
    .await
    .unwrap();
    match admin
        .add_job(JobSpec::new("x", "* * * * * *").handler("count"))
        .await
    {
        Err(RequestError::ReplicasOutdated { instances }) => {
            assert_eq!(instances, ["old"]);
        }
        other => panic!("a change beside an old replica: {other:?}"),
    }
    sqlx::query(&format!(
        "DELETE FROM {replicas_table} WHERE instance = 'old'"
    ))
    .execute(history.pool())
    .await
    .unwrap();
    // A change a later version wrote, which this one cannot read: the replicas go past
    // it and apply the next ones.
    sqlx::query(
        "INSERT INTO redlock_scheduler_job_changes
         (scheduler, seq, job, action, definition, previous, changed_by, changed_ms)
         VALUES ('scheduler', 1, 'future', 'pause_forever', NULL, NULL, 'v9', $1)",
    )
    .bind(Utc::now().timestamp_millis())
    .execute(history.pool())
    .await
    .unwrap();
    let change = admin
        .add_job(JobSpec::new("after", "0 0 1 1 *").handler("count"))
        .await
        .unwrap();
    assert_eq!(change.seq, 2);
    until_every_replica(&replicas, "after", true, Duration::from_secs(2)).await;
    for replica in &replicas {
        replica.shutdown().await;
    }
}
