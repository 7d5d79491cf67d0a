//! A run's transaction across a change of leader, against real redis-server nodes and
//! a SQLite file: a run handed to the follower is going when the leader steps down and
//! the follower takes over; the run then commits, and its row says `succeeded` with its
//! effect in. Its transaction is fenced by its own run lock, which it still holds: the
//! new leadership does not make it stale.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Replica;
use redlock_core::BoxError;
use redlock_scheduler::history::Outcome;
use redlock_scheduler::{History, Job, JobContext};
use redlock_testkit::{Cluster, until};

/// What the held run saw: (instance, tick ms), then its commit's answer.
#[derive(Default)]
struct Held {
    /// The replica whose runs wait for `release` before they commit.
    hold_on: Mutex<Option<String>>,
    started: Mutex<Option<(String, i64)>>,
    release: AtomicBool,
    answer: Mutex<Option<Result<(), String>>>,
}

fn job(effects: &str, held: &Arc<Held>) -> Job {
    let (effects, held) = (effects.to_owned(), Arc::clone(held));
    Job::new("settle", "* * * * * *", move |ctx: JobContext| {
        let (effects, held) = (effects.clone(), Arc::clone(&held));
        async move {
            let tick = ctx.tick().timestamp_millis();
            let holds = held.hold_on.lock().unwrap().as_deref() == Some(ctx.instance())
                && held.started.lock().unwrap().is_none();
            if holds {
                *held.started.lock().unwrap() = Some((ctx.instance().to_owned(), tick));
                while !held.release.load(Ordering::Acquire) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let mut tx = ctx.transaction().await?;
            sqlx::query(&format!(
                "INSERT INTO {effects} (tick_ms, instance) VALUES ($1, $2)"
            ))
            .bind(tick)
            .bind(ctx.instance().to_owned())
            .execute(&mut *tx)
            .await?;
            let answer = tx.commit().await;
            if holds {
                *held.answer.lock().unwrap() =
                    Some(answer.as_ref().map(|_| ()).map_err(ToString::to_string));
            }
            answer?;
            Ok::<_, BoxError>(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_going_when_the_leader_steps_down_commits() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = common::sqlite_url();
    let history = History::connect(&url).await.unwrap();
    let effects = "effects";
    sqlx::query("CREATE TABLE effects (tick_ms BIGINT NOT NULL, instance TEXT NOT NULL)")
        .execute(history.pool())
        .await
        .unwrap();
    let held = Arc::new(Held::default());
    let a = Replica::start(
        &cluster,
        "a",
        Some(url.clone()),
        vec![job(effects, &held)],
        |b| b,
    )
    .await;
    until("a leads", Duration::from_secs(10), || async {
        a.leads().then_some(())
    })
    .await;
    let b = Replica::start(
        &cluster,
        "b",
        Some(url.clone()),
        vec![job(effects, &held)],
        |b| b,
    )
    .await;
    // The follower's next run waits; the leader's runs go on.
    *held.hold_on.lock().unwrap() = Some("b".to_owned());
    let (instance, tick) = until("a run held on b", Duration::from_secs(15), || async {
        held.started.lock().unwrap().clone()
    })
    .await;
    assert_eq!(instance, "b");
    let epoch = a.scheduler.leadership().expect("a leads").epoch();
    let leader = a.scheduler.clone();
    a.sandbox
        .run(async move { leader.step_down().await })
        .await
        .expect("a steps down");
    until("b took over", Duration::from_secs(10), || async {
        b.scheduler
            .leadership()
            .filter(|l| l.is_current() && l.epoch() > epoch)
            .map(|_| ())
    })
    .await;
    // The new leader's election chores are done by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.release.store(true, Ordering::Release);
    let answer = until("the held run's commit", Duration::from_secs(10), || async {
        held.answer.lock().unwrap().clone()
    })
    .await;
    assert_eq!(answer, Ok(()), "the run of tick {tick} on b commits");
    let row = until("the held run's row", Duration::from_secs(10), || async {
        let rows = history.runs("scheduler", "settle", 100).await.unwrap();
        rows.into_iter()
            .find(|r| r.tick.timestamp_millis() == tick && r.outcome != Outcome::Running)
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(row.outcome, Outcome::Succeeded, "{row:?}");
    assert_eq!(row.instance, "b", "{row:?}");
    let written: Vec<String> =
        sqlx::query_scalar("SELECT instance FROM effects WHERE tick_ms = $1")
            .bind(tick)
            .fetch_all(history.pool())
            .await
            .unwrap();
    assert_eq!(written, ["b"], "the held run's effect, once");
}
