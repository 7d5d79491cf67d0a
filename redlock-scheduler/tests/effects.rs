//! Job runs whose effects commit with their record (`JobContext::transaction`), against
//! real redis-server nodes, a SQLite file and the PostgreSQL at `DATABASE_URL`.
//!
//! The leader is frozen mid-run (its whole runtime blocked, as `SIGSTOP` would stop a
//! process) past its leadership's term; the other replica takes over and runs the next
//! ticks; the frozen one wakes up and commits the run it was in. That commit is refused
//! (a stale run token: the other replica's run took the job's run lock and committed)
//! and rolled back, and the history and the effects agree:
//! each tick that succeeded has exactly one effect, and no other tick has any.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use common::{Replica, own_history, unique};
use redlock_core::BoxError;
use redlock_scheduler::error::TransactionError;
use redlock_scheduler::history::Outcome;
use redlock_scheduler::{History, Job, JobContext};
use redlock_testkit::{Cluster, require, until};

/// The longest the leader stays frozen (it is thawed once the other replica took over).
const FREEZE_MAX: Duration = Duration::from_secs(30);

/// Freezes replica `a` in its next run, until thawed.
#[derive(Default)]
struct Freeze {
    armed: AtomicBool,
    frozen: AtomicBool,
    /// The tick of the frozen run (Unix ms).
    tick: AtomicI64,
    thawed: AtomicBool,
}

impl Freeze {
    /// Blocks the calling thread (the replica's only worker: its timers, its watchdogs,
    /// its leadership all stop, as in a process sent SIGSTOP) until thawed.
    fn hold(&self, tick: i64) {
        self.tick.store(tick, Ordering::Release);
        self.frozen.store(true, Ordering::Release);
        let started = std::time::Instant::now();
        while !self.thawed.load(Ordering::Acquire) && started.elapsed() < FREEZE_MAX {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What each run's commit answered: (instance, tick ms, answer).
type Commits = Arc<Mutex<Vec<(String, i64, Result<(), String>)>>>;

/// What each run's commit answered: (tick ms, whether its commit was slow, answer).
type Answers = Arc<Mutex<Vec<(i64, bool, Result<(), String>)>>>;

fn settle_job(effects: &str, freeze: &Arc<Freeze>, commits: &Commits, write_first: bool) -> Job {
    let (effects, freeze, commits) = (effects.to_owned(), Arc::clone(freeze), Arc::clone(commits));
    Job::new("settle", "* * * * * *", move |ctx: JobContext| {
        let (effects, freeze, commits) =
            (effects.clone(), Arc::clone(&freeze), Arc::clone(&commits));
        async move {
            let freezes = ctx.instance() == "a" && freeze.armed.swap(false, Ordering::AcqRel);
            let mut tx = ctx.transaction().await?;
            let sql =
                format!("INSERT INTO {effects} (tick_ms, instance, token) VALUES ($1, $2, $3)");
            let write = sqlx::query(&sql)
                .bind(ctx.tick().timestamp_millis())
                .bind(ctx.instance().to_owned())
                .bind(i64::try_from(ctx.fencing_token()).unwrap());
            if freezes && !write_first {
                freeze.hold(ctx.tick().timestamp_millis());
            }
            write.execute(&mut *tx).await?;
            if freezes && write_first {
                freeze.hold(ctx.tick().timestamp_millis());
            }
            let answer = tx.commit().await;
            commits.lock().unwrap().push((
                ctx.instance().to_owned(),
                ctx.tick().timestamp_millis(),
                answer.as_ref().map(|_| ()).map_err(|e| match e {
                    TransactionError::StaleRun { .. } => format!("stale: {e}"),
                    other => other.to_string(),
                }),
            ));
            answer?;
            Ok::<_, BoxError>(())
        }
    })
}

async fn stale_leader_is_rolled_back(url: &str, write_first: bool) {
    let cluster = Cluster::start(3).await;
    let (history, prefix, effects) = own_history(
        url,
        "fx",
        "tick_ms BIGINT NOT NULL, instance TEXT NOT NULL, token BIGINT NOT NULL",
    )
    .await;
    let freeze = Arc::new(Freeze::default());
    let commits: Commits = Arc::default();
    let start = |instance: &'static str| {
        let job = settle_job(&effects, &freeze, &commits, write_first);
        let builder = History::builder(url).table_prefix(&prefix);
        Replica::start_with(&cluster, instance, Some(builder), vec![job], |b| b)
    };
    let a = start("a").await;
    until("replica a leads", Duration::from_secs(10), || async {
        a.leads().then_some(())
    })
    .await;
    let b = start("b").await;
    let from = Utc::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    freeze.armed.store(true, Ordering::Release);

    // a freezes in its next run; b takes over and commits a run; a is thawed and tries
    // to commit.
    until("a frozen", Duration::from_secs(5), || async {
        freeze.frozen.load(Ordering::Acquire).then_some(())
    })
    .await;
    let frozen_at = Utc::now().timestamp_millis();
    until(
        "b took over and committed",
        Duration::from_secs(15),
        || async {
            let committed = commits
                .lock()
                .unwrap()
                .iter()
                .any(|(instance, tick, answer)| {
                    instance == "b" && *tick >= frozen_at && answer.is_ok()
                });
            (b.leads() && committed).then_some(())
        },
    )
    .await;
    freeze.thawed.store(true, Ordering::Release);
    let frozen_tick = freeze.tick.load(Ordering::Acquire);
    let answer = until(
        "the frozen run's commit",
        Duration::from_secs(10),
        || async {
            commits
                .lock()
                .unwrap()
                .iter()
                .find(|(instance, tick, _)| instance == "a" && *tick == frozen_tick)
                .map(|(_, _, answer)| answer.clone())
        },
    )
    .await;
    let refusal = answer.expect_err("the frozen leader's commit is refused");
    if write_first {
        // Nothing awaited between the wake-up and the commit: the replica has not yet
        // noticed that its leadership is gone, and the fence refuses the commit.
        assert!(
            refusal.starts_with("stale:"),
            "refused by the fence: {refusal}"
        );
    } else {
        // Its write came first: the replica may notice its lost leadership meanwhile.
        assert!(
            refusal.starts_with("stale:") || refusal.contains("told to stop"),
            "{refusal}"
        );
    }
    let replicas = [a, b];
    until(
        "b alone leads after the freeze",
        Duration::from_secs(5),
        || async { (replicas[1].leads() && !replicas[0].leads()).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let to = Utc::now();
    for replica in &replicas {
        replica.shutdown().await;
    }

    let effects_rows: Vec<(i64, String, i64)> =
        sqlx::query_as(&format!("SELECT tick_ms, instance, token FROM {effects}"))
            .fetch_all(history.pool())
            .await
            .unwrap();
    let runs = history.runs_between("scheduler", from, to).await.unwrap();
    assert!(
        !effects_rows.iter().any(|(tick, _, _)| *tick == frozen_tick),
        "the frozen run's effect was rolled back: {effects_rows:?}"
    );
    let frozen_row = runs
        .iter()
        .find(|r| r.tick.timestamp_millis() == frozen_tick);
    assert!(
        frozen_row.is_none_or(|r| r.outcome != Outcome::Succeeded),
        "the frozen run is not recorded as succeeded: {frozen_row:?}"
    );
    // One effect per succeeded tick, by the replica the history names; none elsewhere.
    let mut per_tick: HashMap<i64, Vec<&(i64, String, i64)>> = HashMap::new();
    for row in &effects_rows {
        per_tick.entry(row.0).or_default().push(row);
    }
    let mut succeeded = 0;
    for run in &runs {
        let tick = run.tick.timestamp_millis();
        let effects_of_tick = per_tick.remove(&tick).unwrap_or_default();
        if run.outcome == Outcome::Succeeded {
            succeeded += 1;
            assert_eq!(effects_of_tick.len(), 1, "tick {tick}: {effects_of_tick:?}");
            assert_eq!(effects_of_tick[0].1, run.instance, "tick {tick}");
        } else {
            assert!(
                effects_of_tick.is_empty(),
                "{run:?} has effects {effects_of_tick:?}"
            );
        }
    }
    let after_window: Vec<_> = per_tick
        .into_iter()
        .filter(|(tick, _)| (from.timestamp_millis()..=to.timestamp_millis()).contains(tick))
        .collect();
    assert!(
        after_window.is_empty(),
        "effects without a succeeded run: {after_window:?}"
    );
    let by_b = runs
        .iter()
        .filter(|r| r.instance == "b" && r.outcome == Outcome::Succeeded)
        .count();
    assert!(by_b >= 2, "b ran ticks while a was frozen: {runs:?}");
    assert!(succeeded >= 3, "{runs:?}");
    eprintln!(
        "{} ticks succeeded ({by_b} on b), the frozen run's commit refused: {refusal}",
        succeeded
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leaders_run_is_rolled_back_sqlite() {
    let (_dir, url) = common::sqlite_url();
    // SQLite has one writer: a run frozen after writing would hold every other writer
    // off, so it freezes before its write (the commit comes after the takeover either way).
    stale_leader_is_rolled_back(&url, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leaders_run_is_rolled_back_postgres() {
    let Some(url) = require::database_url() else {
        return;
    };
    stale_leader_is_rolled_back(&url, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_needs_a_history_and_commits_with_the_row() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = common::sqlite_url();
    let history = History::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE notes (tick_ms BIGINT NOT NULL)")
        .execute(history.pool())
        .await
        .unwrap();
    let answers: Arc<Mutex<Vec<String>>> = Arc::default();
    let job = |name: &str| {
        let answers = Arc::clone(&answers);
        Job::new(name, "* * * * * *", move |ctx: JobContext| {
            let answers = Arc::clone(&answers);
            async move {
                let mut tx = match ctx.transaction().await {
                    Ok(tx) => tx,
                    Err(err) => {
                        answers.lock().unwrap().push(err.to_string());
                        return Err(BoxError::from(err));
                    }
                };
                sqlx::query("INSERT INTO notes (tick_ms) VALUES ($1)")
                    .bind(ctx.tick().timestamp_millis())
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                // An error after the commit does not undo it: the run stays succeeded.
                Err::<(), BoxError>("after the commit".into())
            }
        })
    };
    let with = Replica::start(
        &cluster,
        "with",
        Some(url.clone()),
        vec![job("noted")],
        |b| b,
    )
    .await;
    let without = Replica::start(&cluster, "without", None, vec![job("unnoted")], |b| {
        b.name("other")
    })
    .await;
    until("a run of each", Duration::from_secs(10), || async {
        let rows = history.runs("scheduler", "noted", 10).await.unwrap();
        let done = rows
            .iter()
            .any(|r| r.outcome == Outcome::Succeeded && r.error.is_some());
        (done && !answers.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    with.shutdown().await;
    without.shutdown().await;
    let answer = answers.lock().unwrap()[0].clone();
    assert!(answer.contains("needs the scheduler's history"), "{answer}");
    let rows = history.runs("scheduler", "noted", 100).await.unwrap();
    let notes: Vec<i64> = sqlx::query_scalar("SELECT tick_ms FROM notes")
        .fetch_all(history.pool())
        .await
        .unwrap();
    for row in rows.iter().filter(|r| r.outcome == Outcome::Succeeded) {
        assert!(notes.contains(&row.tick.timestamp_millis()), "{row:?}");
        assert!(
            row.error
                .as_deref()
                .is_some_and(|e| e.contains("after the commit")),
            "{row:?}"
        );
    }
    assert!(!notes.is_empty());
}

/// A PostgreSQL history under a fresh table prefix, and an effects table (`tick_ms`,
/// `slow`) whose transactions take `stall_secs` longer to `COMMIT` when they inserted a
/// `slow` row (a deferred constraint trigger sleeps, as an fsync stall or a synchronous
/// standby would make a commit wait). Returns the history, the prefix and the table.
async fn stalling_effects(url: &str, name: &str, stall_secs: u32) -> (History, String, String) {
    let prefix = format!("{}_", unique(name).replace('-', "_"));
    let effects = format!("{prefix}effects");
    let history = History::builder(url)
        .table_prefix(&prefix)
        .connect()
        .await
        .unwrap();
    for statement in [
        format!("CREATE TABLE {effects} (tick_ms BIGINT NOT NULL, slow BOOLEAN NOT NULL)"),
        format!(
            "CREATE FUNCTION {prefix}stall() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.slow THEN PERFORM pg_sleep({stall_secs}); END IF; RETURN NULL; END $$"
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER {prefix}stall AFTER INSERT ON {effects}
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {prefix}stall()"
        ),
    ] {
        sqlx::query(&statement)
            .execute(history.pool())
            .await
            .unwrap();
    }
    (history, prefix, effects)
}

/// A run's commit is under way on PostgreSQL, and slow (its `COMMIT` takes 4 s, as with
/// an fsync stall or a synchronous standby: here a deferred constraint trigger sleeps),
/// when the replica loses its leadership (2 of 3 Redis nodes frozen). PostgreSQL
/// commits: the run is recorded `succeeded` with its effect in, and the handler gets
/// the commit's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_under_way_when_leadership_is_lost_is_recorded_as_committed() {
    let Some(url) = require::database_url() else {
        return;
    };
    let cluster = Cluster::start(3).await;
    let (history, prefix, effects) = stalling_effects(&url, "slow", 4).await;
    let armed = Arc::new(AtomicBool::new(false));
    let slow_tick = Arc::new(AtomicI64::new(0));
    let answers: Answers = Arc::default();
    let job = {
        let (effects, armed, slow_tick, answers) = (
            effects.clone(),
            Arc::clone(&armed),
            Arc::clone(&slow_tick),
            Arc::clone(&answers),
        );
        Job::new("settle", "* * * * * *", move |ctx: JobContext| {
            let (effects, armed, slow_tick, answers) = (
                effects.clone(),
                Arc::clone(&armed),
                Arc::clone(&slow_tick),
                Arc::clone(&answers),
            );
            async move {
                let slow = armed.swap(false, Ordering::AcqRel);
                let tick = ctx.tick().timestamp_millis();
                let mut tx = ctx.transaction().await?;
                sqlx::query(&format!(
                    "INSERT INTO {effects} (tick_ms, slow) VALUES ($1, $2)"
                ))
                .bind(tick)
                .bind(slow)
                .execute(&mut *tx)
                .await?;
                if slow {
                    slow_tick.store(tick, Ordering::Release);
                }
                let answer = tx.commit().await;
                answers.lock().unwrap().push((
                    tick,
                    slow,
                    answer.as_ref().map(|_| ()).map_err(|e| e.to_string()),
                ));
                answer?;
                Ok::<_, BoxError>(())
            }
        })
    };
    let builder = History::builder(&url).table_prefix(&prefix);
    let replica = Replica::start_with(&cluster, "a", Some(builder), vec![job], |b| b).await;
    until("replica a leads", Duration::from_secs(10), || async {
        replica.leads().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    armed.store(true, Ordering::Release);
    let tick = until("the slow commit begins", Duration::from_secs(5), || async {
        Some(slow_tick.load(Ordering::Acquire)).filter(|t| *t != 0)
    })
    .await;
    // The leadership is lost within its TTL (2 s), the run is cancelled and dropped 1 s
    // later: all while the commit goes on.
    cluster.node(0).pause();
    cluster.node(1).pause();
    until(
        "the slow run's end recorded",
        Duration::from_secs(20),
        || async {
            let status = replica.scheduler.status().await;
            let pending = status.health.history.as_ref()?.pending_writes;
            let rows = history.runs("scheduler", "settle", 10).await.ok()?;
            let ended = rows
                .iter()
                .any(|r| r.tick.timestamp_millis() == tick && r.outcome.is_terminal());
            (!status.jobs[0].running && pending == 0 && ended).then_some(())
        },
    )
    .await;
    // The end of the run, if it were to overwrite the row, is written by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.node(0).resume();
    cluster.node(1).resume();
    replica.shutdown().await;

    let runs = history.runs("scheduler", "settle", 100).await.unwrap();
    let run = runs
        .iter()
        .find(|r| r.tick.timestamp_millis() == tick)
        .unwrap();
    let effect: Vec<i64> =
        sqlx::query_scalar(&format!("SELECT tick_ms FROM {effects} WHERE tick_ms = $1"))
            .bind(tick)
            .fetch_all(history.pool())
            .await
            .unwrap();
    assert_eq!(
        effect,
        vec![tick],
        "PostgreSQL committed the slow run's effect"
    );
    assert_eq!(
        run.outcome,
        Outcome::Succeeded,
        "a committed run is recorded as succeeded: {run:?}"
    );
    let answer = answers
        .lock()
        .unwrap()
        .iter()
        .find(|(t, _, _)| *t == tick)
        .map(|(_, _, answer)| answer.clone());
    assert_eq!(answer, Some(Ok(())), "the handler got the commit's answer");
    // Every succeeded run has its effect, and no other run has one.
    let all: Vec<i64> = sqlx::query_scalar(&format!("SELECT tick_ms FROM {effects}"))
        .fetch_all(history.pool())
        .await
        .unwrap();
    for run in &runs {
        let has = all.contains(&run.tick.timestamp_millis());
        assert_eq!(has, run.outcome == Outcome::Succeeded, "{run:?}");
    }
}

/// A run's commit outlasts the history's statement timeout (1 s): its answer is lost,
/// and reading the run's row back cannot tell either while the commit goes on (5 s).
/// The handler is told the outcome is not known (`TransactionError::CommitUnknown`) and fails;
/// PostgreSQL commits meanwhile, and the run's end, written afterwards, does not
/// overwrite the `succeeded` row: the history says succeeded, with the effect in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_recorded_as_its_row_says() {
    let Some(url) = require::database_url() else {
        return;
    };
    let cluster = Cluster::start(3).await;
    let (history, prefix, effects) = stalling_effects(&url, "lost", 5).await;
    let armed = Arc::new(AtomicBool::new(false));
    let answers: Answers = Arc::default();
    let job = {
        let (effects, armed, answers) = (effects.clone(), Arc::clone(&armed), Arc::clone(&answers));
        Job::new("settle", "* * * * * *", move |ctx: JobContext| {
            let (effects, armed, answers) =
                (effects.clone(), Arc::clone(&armed), Arc::clone(&answers));
            async move {
                let slow = armed.swap(false, Ordering::AcqRel);
                let tick = ctx.tick().timestamp_millis();
                let mut tx = ctx.transaction().await?;
                // The server lets this commit take its time; the client does not.
                sqlx::query("SET LOCAL statement_timeout = 0")
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&format!(
                    "INSERT INTO {effects} (tick_ms, slow) VALUES ($1, $2)"
                ))
                .bind(tick)
                .bind(slow)
                .execute(&mut *tx)
                .await?;
                let answer = tx.commit().await;
                answers.lock().unwrap().push((
                    tick,
                    slow,
                    answer.as_ref().map(|_| ()).map_err(|e| match e {
                        TransactionError::CommitUnknown { .. } => format!("unknown: {e}"),
                        other => other.to_string(),
                    }),
                ));
                answer?;
                Ok::<_, BoxError>(())
            }
        })
    };
    let builder = History::builder(&url)
        .table_prefix(&prefix)
        .statement_timeout(Duration::from_secs(1));
    let replica = Replica::start_with(&cluster, "a", Some(builder), vec![job], |b| b).await;
    until("replica a leads", Duration::from_secs(10), || async {
        replica.leads().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    armed.store(true, Ordering::Release);
    let (tick, answer) = until(
        "the slow commit's answer",
        Duration::from_secs(15),
        || async {
            answers
                .lock()
                .unwrap()
                .iter()
                .find(|(_, slow, _)| *slow)
                .map(|(tick, _, answer)| (*tick, answer.clone()))
        },
    )
    .await;
    let refusal = answer.expect_err("the commit's outcome is not known to the handler");
    assert!(refusal.starts_with("unknown:"), "{refusal}");
    until("the slow run recorded", Duration::from_secs(20), || async {
        let health = replica.scheduler.health().history?;
        let status = replica.scheduler.status().await;
        let last = status.jobs[0].last_run.clone()?;
        (health.pending_writes == 0 && last.tick.timestamp_millis() > tick).then_some(())
    })
    .await;
    replica.shutdown().await;

    let runs = history.runs("scheduler", "settle", 100).await.unwrap();
    let run = runs
        .iter()
        .find(|r| r.tick.timestamp_millis() == tick)
        .unwrap();
    let effect: Vec<i64> =
        sqlx::query_scalar(&format!("SELECT tick_ms FROM {effects} WHERE tick_ms = $1"))
            .bind(tick)
            .fetch_all(history.pool())
            .await
            .unwrap();
    assert_eq!(
        effect,
        vec![tick],
        "PostgreSQL committed the slow run's effect"
    );
    assert_eq!(
        run.outcome,
        Outcome::Succeeded,
        "a committed run is recorded as succeeded: {run:?}"
    );
    eprintln!("the slow run: {run:?}; its handler was told: {refusal}");
}

/// A replica other than the leader is frozen in a run handed to it, past its run lock's
/// TTL, right after its write; the leader runs and commits the job's next ticks. The
/// frozen replica wakes up and commits at once: refused (its run lock is gone, though
/// the leadership's token is the same), and its write rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_followers_run_is_rolled_back() {
    let Some(url) = require::database_url() else {
        return;
    };
    let cluster = Cluster::start(3).await;
    let (history, prefix, effects) = own_history(
        &url,
        "ff",
        "tick_ms BIGINT NOT NULL, instance TEXT NOT NULL",
    )
    .await;
    let freeze = Arc::new(Freeze::default());
    let commits: Commits = Arc::default();
    let job = || {
        let (effects, freeze, commits) =
            (effects.clone(), Arc::clone(&freeze), Arc::clone(&commits));
        Job::new("settle", "* * * * * *", move |ctx: JobContext| {
            let (effects, freeze, commits) =
                (effects.clone(), Arc::clone(&freeze), Arc::clone(&commits));
            async move {
                let mut tx = ctx.transaction().await?;
                sqlx::query(&format!(
                    "INSERT INTO {effects} (tick_ms, instance) VALUES ($1, $2)"
                ))
                .bind(ctx.tick().timestamp_millis())
                .bind(ctx.instance().to_owned())
                .execute(&mut *tx)
                .await?;
                if ctx.instance() == "b" && freeze.armed.swap(false, Ordering::AcqRel) {
                    freeze.hold(ctx.tick().timestamp_millis());
                }
                // Nothing awaited between the wake-up and the commit.
                let answer = tx.commit().await;
                commits.lock().unwrap().push((
                    ctx.instance().to_owned(),
                    ctx.tick().timestamp_millis(),
                    answer.as_ref().map(|_| ()).map_err(ToString::to_string),
                ));
                answer.map_err(BoxError::from)
            }
        })
    };
    let start = |instance: &'static str| {
        let builder = History::builder(&url).table_prefix(&prefix);
        Replica::start_with(&cluster, instance, Some(builder), vec![job()], |b| b)
    };
    let a = start("a").await;
    until("replica a leads", Duration::from_secs(10), || async {
        a.leads().then_some(())
    })
    .await;
    let b = start("b").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    freeze.armed.store(true, Ordering::Release);
    until("b frozen in a run", Duration::from_secs(10), || async {
        freeze.frozen.load(Ordering::Acquire).then_some(())
    })
    .await;
    let frozen_tick = freeze.tick.load(Ordering::Acquire);
    // The leader runs the job again once b's run lock has expired.
    until(
        "a committed a later tick",
        Duration::from_secs(15),
        || async {
            commits
                .lock()
                .unwrap()
                .iter()
                .any(|(instance, tick, answer)| {
                    instance == "a" && *tick > frozen_tick && answer.is_ok()
                })
                .then_some(())
        },
    )
    .await;
    assert!(
        a.leads(),
        "a still leads: the leadership's token did not change"
    );
    freeze.thawed.store(true, Ordering::Release);
    let answer = until(
        "the frozen run's commit",
        Duration::from_secs(10),
        || async {
            commits
                .lock()
                .unwrap()
                .iter()
                .find(|(instance, tick, _)| instance == "b" && *tick == frozen_tick)
                .map(|(_, _, answer)| answer.clone())
        },
    )
    .await;
    let refusal = answer.expect_err("the frozen follower's commit is refused");
    for replica in [&a, &b] {
        replica.shutdown().await;
    }
    let frozen_effects: Vec<(i64, String)> = sqlx::query_as(&format!(
        "SELECT tick_ms, instance FROM {effects} WHERE tick_ms = $1"
    ))
    .bind(frozen_tick)
    .fetch_all(history.pool())
    .await
    .unwrap();
    assert!(
        frozen_effects.is_empty(),
        "the frozen run's write was rolled back: {frozen_effects:?} ({refusal})"
    );
    eprintln!("the frozen follower's commit was refused: {refusal}");
}
