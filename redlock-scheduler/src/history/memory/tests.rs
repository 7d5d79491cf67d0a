//! The memory tables against SQLite: seeded sequences of statements through both, every
//! answer compared, then every row. A difference names the seed, the step and the
//! statement; `REDLOCK_HISTORY_FIDELITY_SEED=N` runs that sequence alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use chrono::{DateTime, TimeZone, Utc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use redlock_fence::FenceError;

use super::{CommitRefused, Tables};
use crate::changes::JobChangeAction;
use crate::history::{Change, Handoff, History, JobDefinition, NewRun, Outcome, Presence, RunEnd};
use crate::history::{HistoryError, NewChange, Refused, RunKey, RunWrites};
use crate::request::RequestAction;
use crate::spec::JobSpec;

const SEQUENCES: u64 = 40;
const STEPS: usize = 250;
const SCHEDULERS: [&str; 2] = ["s", "t"];
const JOBS: [&str; 3] = ["a", "b", "c"];
const REPLICAS: [&str; 3] = ["r1", "r2", "r3"];
const HANDLERS: [&str; 3] = ["a", "b", "h"];
const IDS: [&str; 4] = ["q0", "q1", "q2", "q3"];
const RESULTS: [&str; 3] = ["ok", "ok: tick 1", "expired: no replica took it"];
/// The retention of the history under test.
const KEEP_FOR: std::time::Duration = std::time::Duration::from_secs(3);
const KEEP_RUNS: u32 = 2;
/// Ticks: whole seconds from the base.
const TICKS: i64 = 6;

fn base() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap()
}

/// A time within 8 s of the base, sometimes with sub-millisecond digits (the tables
/// keep milliseconds).
fn time(rng: &mut StdRng) -> DateTime<Utc> {
    let ms = rng.random_range(0..8_000);
    let nanos = if rng.random_bool(0.3) {
        rng.random_range(0..1_000_000)
    } else {
        0
    };
    base() + chrono::Duration::milliseconds(ms) + chrono::Duration::nanoseconds(nanos)
}

fn tick(rng: &mut StdRng) -> DateTime<Utc> {
    base() + chrono::Duration::seconds(rng.random_range(0..TICKS))
}

fn token(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..4) {
        0 => u64::MAX, // beyond i64: stored as i64::MAX
        1 => 0,
        _ => rng.random_range(1..5),
    }
}

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

fn outcome(rng: &mut StdRng) -> Outcome {
    [
        Outcome::Running,
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Skipped,
        Outcome::Cancelled,
    ][rng.random_range(0..5)]
}

fn note(rng: &mut StdRng) -> Option<&'static str> {
    rng.random_bool(0.5).then_some("why")
}

/// A definition of one of the jobs, its optional fields drawn.
fn definition(rng: &mut StdRng) -> JobDefinition {
    JobDefinition {
        job: pick(rng, &JOBS).to_owned(),
        schedule: pick(rng, &["* * * * * *", "0 * * * * *"]).to_owned(),
        time_zone: pick(rng, &["UTC", "Europe/Paris"]).to_owned(),
        misfire: pick(rng, &["run_once", "skip"]).to_owned(),
        dst: rng.random_bool(0.5).then(|| "skip/twice".to_owned()),
        timeout_ms: rng.random_bool(0.5).then(|| rng.random_range(1..5_000)),
        handler: rng
            .random_bool(0.5)
            .then(|| pick(rng, &HANDLERS).to_owned()),
        grace_ms: rng.random_bool(0.5).then(|| rng.random_range(1..60_000)),
        on_leader: rng.random_bool(0.7).then(|| rng.random_bool(0.5)),
        updated: time(rng),
        updated_by: pick(rng, &REPLICAS).to_owned(),
    }
}

/// A definition of `job`, or none.
fn spec(rng: &mut StdRng, job: &str) -> Option<JobSpec> {
    rng.random_bool(0.7).then(|| {
        JobSpec::new(job, pick(rng, &["* * * * * *", "0 */5 * * * *"]))
            .time_zone(pick(rng, &["UTC", "Asia/Tokyo"]))
            .timeout(
                rng.random_bool(0.5)
                    .then(|| std::time::Duration::from_millis(rng.random_range(1..9_000))),
            )
            .run_on_leader(rng.random_bool(0.3))
    })
}

fn sorted(mut handoffs: Vec<Handoff>) -> Vec<Handoff> {
    handoffs.sort_by(|a, b| a.tick.cmp(&b.tick).then_with(|| a.job.cmp(&b.job)));
    handoffs
}

/// One sequence: every statement's answer from SQLite and from the memory tables.
async fn sequence(seed: u64) {
    let history = History::builder("sqlite::memory:")
        .keep_for(KEEP_FOR)
        .keep_runs(KEEP_RUNS)
        .connect()
        .await
        .unwrap();
    let (dispatch, control) = (history.dispatch(), history.control());
    let (requests, definitions) = (history.requests(), history.definitions());
    let (changes, fences) = (history.changes(), history.fences());
    sqlx::query("CREATE TABLE effects (scheduler TEXT, job TEXT, tick_ms BIGINT, what TEXT)")
        .execute(history.pool())
        .await
        .unwrap();
    let mut memory = Tables::default();
    let mut rng = StdRng::seed_from_u64(seed);
    // Hand-offs as read (some since moved, taken or declined), for the statements that
    // act on a hand-off read earlier.
    let mut read: Vec<Handoff> = Vec::new();
    for step in 0..STEPS {
        let scheduler = pick(&mut rng, &SCHEDULERS);
        let at = format!("seed {seed} step {step}");
        match rng.random_range(0..35) {
            0 | 1 => {
                let presence = Presence {
                    instance: pick(&mut rng, &REPLICAS).to_owned(),
                    capacity: match rng.random_range(0..3) {
                        0 => None,
                        1 => Some(u32::MAX),
                        _ => Some(rng.random_range(0..4)),
                    },
                    running: rng.random_range(0..4),
                    polled_ms: rng.random_range(0..9_000),
                    jobs_digest: pick(&mut rng, &["d1", "d2"]).to_owned(),
                    seen: time(&mut rng),
                };
                dispatch.beat(scheduler, &presence).await.unwrap();
                memory.replicas.beat(scheduler, &presence);
            }
            2 => {
                let instance = pick(&mut rng, &REPLICAS);
                let names: Vec<&str> = HANDLERS
                    .iter()
                    .copied()
                    .filter(|_| rng.random_bool(0.5))
                    .collect();
                let list = serde_json::to_string(&names).unwrap();
                dispatch
                    .say_handlers(scheduler, instance, &list)
                    .await
                    .unwrap();
                memory.replicas.say_handlers(scheduler, instance, &list);
            }
            3 => {
                let (handler, since) = (pick(&mut rng, &HANDLERS), time(&mut rng));
                let sql = dispatch
                    .handler_registered(scheduler, handler, since)
                    .await
                    .unwrap();
                let mem = memory
                    .replicas
                    .handler_registered(scheduler, handler, since);
                assert_eq!(sql, mem, "{at}: handler_registered({handler}, {since})");
                let sql = dispatch
                    .replicas_without_changes(scheduler, since)
                    .await
                    .unwrap();
                let mem = memory.replicas.replicas_without_changes(scheduler, since);
                assert_eq!(sql, mem, "{at}: replicas_without_changes({since})");
            }
            4 => {
                let instance = pick(&mut rng, &REPLICAS);
                dispatch.leave(scheduler, instance).await.unwrap();
                memory.replicas.leave(scheduler, instance);
            }
            5 => {
                let (since, forget) = (time(&mut rng), time(&mut rng));
                let sql = dispatch.replicas(scheduler, since, forget).await.unwrap();
                let mem = memory.replicas.replicas(scheduler, since, forget);
                assert_eq!(sql, mem, "{at}: replicas({since}, {forget})");
            }
            6 | 7 => {
                let (job, tick) = (pick(&mut rng, &JOBS), tick(&mut rng));
                let replica = pick(&mut rng, &REPLICAS);
                let (run_token, now) = (token(&mut rng), time(&mut rng));
                let sql = dispatch
                    .hand_off(scheduler, job, tick, replica, run_token, now)
                    .await
                    .unwrap();
                let mem = memory
                    .handoffs
                    .hand_off(scheduler, job, tick, replica, run_token, now);
                assert_eq!(sql, mem, "{at}: hand_off({job}, {tick}, {replica})");
            }
            8 => {
                let replica = pick(&mut rng, &REPLICAS);
                let sql = sorted(dispatch.handed_to(scheduler, replica).await.unwrap());
                let mem = memory.handoffs.handed_to(scheduler, replica);
                assert_eq!(sql, mem, "{at}: handed_to({replica})");
                read.extend(sql);
            }
            9 => {
                let before = time(&mut rng);
                let sql = sorted(dispatch.stale_handoffs(scheduler, before).await.unwrap());
                let mem = memory.handoffs.stale(scheduler, before);
                assert_eq!(sql, mem, "{at}: stale_handoffs({before})");
                read.extend(sql);
            }
            10 if !read.is_empty() => {
                let handoff = read[rng.random_range(0..read.len())].clone();
                let (outcome, note, when) = (outcome(&mut rng), note(&mut rng), time(&mut rng));
                let sql = dispatch
                    .take_handoff(scheduler, &handoff, outcome, note, when)
                    .await
                    .unwrap();
                let mem = memory.take_handoff(scheduler, &handoff, outcome, note, when);
                assert_eq!(sql, mem, "{at}: take_handoff({handoff:?})");
            }
            11 if !read.is_empty() => {
                let handoff = read[rng.random_range(0..read.len())].clone();
                if rng.random_bool(0.5) {
                    let sql = dispatch.decline_handoff(scheduler, &handoff).await.unwrap();
                    let mem = memory.handoffs.decline(scheduler, &handoff);
                    assert_eq!(sql, mem, "{at}: decline_handoff({handoff:?})");
                } else {
                    let replica = rng.random_bool(0.7).then(|| pick(&mut rng, &REPLICAS));
                    let (run_token, now) = (token(&mut rng), time(&mut rng));
                    let sql = dispatch
                        .move_handoff(scheduler, &handoff, replica, run_token, now)
                        .await
                        .unwrap();
                    let mem = memory
                        .handoffs
                        .move_to(scheduler, &handoff, replica, run_token, now);
                    assert_eq!(sql, mem, "{at}: move_handoff({handoff:?}, {replica:?})");
                }
            }
            14 | 15 => {
                let instance = pick(&mut rng, &REPLICAS);
                let (epoch, since, expires) = (token(&mut rng), time(&mut rng), time(&mut rng));
                control
                    .record_leader(scheduler, instance, epoch, since, expires)
                    .await
                    .unwrap();
                memory
                    .leaders
                    .record(scheduler, instance, epoch, since, expires);
            }
            16 => {
                let (epoch, when) = (token(&mut rng), time(&mut rng));
                control
                    .end_leadership(scheduler, epoch, when)
                    .await
                    .unwrap();
                memory.leaders.end(scheduler, epoch, when);
                let sql = control.leader_record(scheduler).await.unwrap();
                let mem = memory.leaders.record_of(scheduler);
                assert_eq!(
                    sql, mem,
                    "{at}: leader_record after end_leadership({epoch})"
                );
            }
            17 => {
                let (job, paused) = (pick(&mut rng, &JOBS), rng.random_bool(0.6));
                control.set_paused(scheduler, job, paused).await.unwrap();
                memory.pauses.set(scheduler, job, paused);
                let mut sql = control.paused_jobs(scheduler).await.unwrap();
                sql.sort();
                let mem = memory.pauses.paused(scheduler);
                assert_eq!(
                    sql, mem,
                    "{at}: paused_jobs after set_paused({job}, {paused})"
                );
            }
            18 => {
                let id = pick(&mut rng, &IDS);
                let job = rng.random_bool(0.7).then(|| pick(&mut rng, &JOBS));
                let action = [
                    RequestAction::Trigger,
                    RequestAction::Cancel,
                    RequestAction::StepDown,
                ][rng.random_range(0..3)];
                let (by, when) = (pick(&mut rng, &REPLICAS), time(&mut rng));
                let sql = requests
                    .insert_request(id, scheduler, job, action, by, when)
                    .await;
                let mem = memory.requests.insert(id, scheduler, job, action, by, when);
                assert_eq!(sql.is_ok(), mem, "{at}: insert_request({id}): {sql:?}");
            }
            19 => {
                let id = pick(&mut rng, &IDS);
                if rng.random_bool(0.6) {
                    let (by, when) = (pick(&mut rng, &REPLICAS), time(&mut rng));
                    let result = rng.random_bool(0.5).then(|| pick(&mut rng, &RESULTS));
                    let sql = requests.claim_request(id, by, when, result).await.unwrap();
                    let mem = memory.requests.claim(id, by, when, result);
                    assert_eq!(sql, mem, "{at}: claim_request({id}, {result:?})");
                } else {
                    let result = pick(&mut rng, &RESULTS);
                    requests.finish_request(id, result).await.unwrap();
                    memory.requests.finish(id, result);
                }
                let sql = requests.request(scheduler, id).await.unwrap();
                let mem = memory.requests.request(scheduler, id);
                assert_eq!(sql, mem, "{at}: request({id})");
                let sql = requests.pending_requests(scheduler).await.unwrap();
                let mem = memory.requests.pending(scheduler);
                assert_eq!(sql, mem, "{at}: pending_requests");
            }
            20 => {
                let cutoff = time(&mut rng);
                let sql = requests.prune_requests(scheduler, cutoff).await.unwrap();
                let mem = memory.requests.prune(scheduler, cutoff);
                assert_eq!(sql, mem, "{at}: prune_requests({cutoff})");
            }
            21 => {
                let instance = pick(&mut rng, &REPLICAS);
                let published: Vec<JobDefinition> = (0..rng.random_range(0..3))
                    .map(|_| definition(&mut rng))
                    .collect();
                definitions
                    .publish_jobs(scheduler, instance, &published)
                    .await
                    .unwrap();
                memory.jobs.publish(scheduler, instance, &published);
                let sql = definitions.job_definitions(scheduler).await.unwrap();
                let mem = memory.jobs.all(scheduler);
                assert_eq!(sql, mem, "{at}: job_definitions after publish_jobs");
            }
            22 => {
                let job = pick(&mut rng, &JOBS);
                if rng.random_bool(0.4) {
                    definitions.unpublish_job(scheduler, job).await.unwrap();
                    memory.jobs.unpublish(scheduler, job);
                }
                let sql = definitions.job_definition(scheduler, job).await.unwrap();
                let mem = memory.jobs.one(scheduler, job);
                assert_eq!(sql, mem, "{at}: job_definition({job})");
            }
            23 | 24 => {
                let job = pick(&mut rng, &JOBS);
                let (definition, previous) = (spec(&mut rng, job), spec(&mut rng, job));
                let change = NewChange {
                    seq: rng.random_range(1..6),
                    job,
                    action: [
                        JobChangeAction::Add,
                        JobChangeAction::Reschedule,
                        JobChangeAction::Remove,
                    ][rng.random_range(0..3)],
                    definition: definition.as_ref(),
                    previous: previous.as_ref(),
                    by: pick(&mut rng, &REPLICAS),
                    at: time(&mut rng),
                };
                let sql = changes.insert_job_change(scheduler, &change).await.unwrap();
                let mem = memory.changes.insert(scheduler, &change);
                assert_eq!(sql, mem, "{at}: insert_job_change({})", change.seq);
            }
            25 => {
                let after = rng.random_range(0..6);
                let sql = changes.job_changes_after(scheduler, after).await.unwrap();
                let mem = memory.changes.after(scheduler, after);
                assert_eq!(sql, mem, "{at}: job_changes_after({after})");
                let job = rng.random_bool(0.5).then(|| pick(&mut rng, &JOBS));
                let limit = rng.random_range(0..4);
                let sql = changes.job_changes(scheduler, job, limit).await.unwrap();
                let mem = memory.changes.latest(scheduler, job, limit).unwrap();
                assert_eq!(sql, mem, "{at}: job_changes({job:?}, {limit})");
                let sql = changes.last_job_change(scheduler).await.unwrap();
                let mem = memory.changes.last(scheduler);
                assert_eq!(sql, mem, "{at}: last_job_change");
            }
            26 => {
                let job = pick(&mut rng, &JOBS);
                let sql = history.last_tick(scheduler, job).await.unwrap();
                let mem = memory.runs.last_tick(scheduler, job);
                assert_eq!(sql, mem, "{at}: last_tick({job})");
                let sql = history.last_ticks(scheduler).await.unwrap();
                let mem = memory.runs.last_ticks(scheduler);
                assert_eq!(sql, mem, "{at}: last_ticks");
                let limit = rng.random_range(0..4);
                let sql = history.runs(scheduler, job, limit).await.unwrap();
                let mem = memory.runs.runs(scheduler, job, limit);
                assert_eq!(sql, mem, "{at}: runs({job}, {limit})");
                let mut sql = history.last_runs(scheduler).await.unwrap();
                sql.sort_by(|a, b| a.job.cmp(&b.job));
                let mem = memory.runs.last_runs(scheduler);
                assert_eq!(sql, mem, "{at}: last_runs");
            }
            27 => {
                let (from, to) = (tick(&mut rng), tick(&mut rng));
                let sql = history.runs_between(scheduler, from, to).await.unwrap();
                let mem = memory.runs.between(scheduler, from, to);
                assert_eq!(sql, mem, "{at}: runs_between({from}, {to})");
                // By tick only: ties in any order.
                let mut sql = history.running(scheduler).await.unwrap();
                sql.sort_by(|a, b| a.tick.cmp(&b.tick).then_with(|| a.job.cmp(&b.job)));
                let mem = memory.runs.running(scheduler);
                assert_eq!(sql, mem, "{at}: running");
                let (job, tick) = (pick(&mut rng, &JOBS), tick(&mut rng));
                let sql = history.claimant(scheduler, job, tick).await.unwrap();
                let mem = memory.runs.claimant(scheduler, job, tick);
                assert_eq!(sql, mem, "{at}: claimant({job}, {tick})");
            }
            28 => {
                let mut filter = crate::history::RunFilter::new();
                if rng.random_bool(0.5) {
                    filter = filter.job(pick(&mut rng, &JOBS));
                }
                if rng.random_bool(0.3) {
                    filter = filter.outcome(outcome(&mut rng));
                }
                if rng.random_bool(0.3) {
                    filter = filter.since(tick(&mut rng));
                }
                if rng.random_bool(0.3) {
                    filter = filter.until(tick(&mut rng));
                }
                match rng.random_range(0..3) {
                    0 => filter = filter.manual_only(),
                    1 => filter = filter.scheduled_only(),
                    _ => {}
                }
                if rng.random_bool(0.5) {
                    filter = filter.limit(rng.random_range(0..4));
                }
                let sql = history.query_runs(scheduler, &filter).await.unwrap();
                let mem = memory.runs.query(scheduler, &filter);
                assert_eq!(sql, mem, "{at}: query_runs({filter:?})");
            }
            29 => {
                let (job, tick) = (pick(&mut rng, &JOBS), tick(&mut rng));
                if let Some(run) = history.run_at(scheduler, job, tick).await.unwrap() {
                    let mut run = run;
                    if rng.random_bool(0.5) {
                        // As another replica saw it: not its row to close.
                        let other = REPLICAS.iter().find(|r| **r != run.instance);
                        run.instance = other.copied().unwrap_or_default().to_owned();
                    }
                    let (by, when) = (pick(&mut rng, &REPLICAS), time(&mut rng));
                    let sql = history.abandon(&run, by, "gone", when).await.unwrap();
                    let mem = memory.runs.abandon(&run, by, "gone", when);
                    assert_eq!(sql, mem, "{at}: abandon({run:?})");
                }
            }
            30 => {
                let now = time(&mut rng);
                let sql = history.prune(scheduler, now).await.unwrap();
                let cutoff = crate::time::earlier(now, KEEP_FOR);
                let mem = memory.runs.prune(scheduler, Some(cutoff), Some(KEEP_RUNS));
                memory.requests.prune(scheduler, cutoff);
                assert_eq!(sql, mem, "{at}: prune({now})");
            }
            31..=34 => {
                let run = RunKey {
                    scheduler,
                    job: pick(&mut rng, &JOBS),
                    tick: tick(&mut rng),
                    instance: pick(&mut rng, &REPLICAS),
                    token: token(&mut rng),
                    fence: token(&mut rng),
                    manual: rng.random_bool(0.2),
                    started: time(&mut rng),
                };
                let (held, when, what) = (rng.random_bool(0.8), time(&mut rng), format!("e{step}"));
                let RunWrites::Sql(mut tx) = fences.begin_run().await.unwrap() else {
                    panic!("{at}: a database history's run writes are a transaction");
                };
                sqlx::query(
                    "INSERT INTO effects (scheduler, job, tick_ms, what) VALUES ($1, $2, $3, $4)",
                )
                .bind(run.scheduler)
                .bind(run.job)
                .bind(run.tick.timestamp_millis())
                .bind(&what)
                .execute(&mut *tx)
                .await
                .unwrap();
                let sql = match fences
                    .commit_run(RunWrites::Sql(tx), run, when, || held)
                    .await
                {
                    Ok(()) => Ok(()),
                    Err(Refused::Stale { highest }) => Err(CommitRefused::Stale { highest }),
                    Err(Refused::RowClosed) => Err(CommitRefused::RowClosed),
                    Err(Refused::LockLost) => Err(CommitRefused::LockLost),
                    Err(Refused::Failed(HistoryError::Fence(FenceError::TokenOutOfRange {
                        ..
                    }))) => Err(CommitRefused::OutOfRange),
                    Err(other) => panic!("{at}: commit_run({run:?}): {other:?}"),
                };
                let mem = memory.commit_run(run, when, || held, &[what]);
                assert_eq!(sql, mem, "{at}: commit_run({run:?}, held: {held})");
                let sql = fences.commit_outcome(run).await.unwrap();
                let mem = memory.committed(run);
                assert_eq!(sql, mem, "{at}: commit_outcome({run:?})");
            }
            _ => {
                let changes: Vec<Change<'_>> = (0..rng.random_range(1..4))
                    .map(|_| {
                        let (job, tick) = (pick(&mut rng, &JOBS), tick(&mut rng));
                        let instance = pick(&mut rng, &REPLICAS);
                        if rng.random_bool(0.5) {
                            Change::Claim(NewRun {
                                scheduler,
                                job,
                                tick,
                                instance,
                                token: token(&mut rng),
                                outcome: outcome(&mut rng),
                                note: note(&mut rng),
                                manual: rng.random_bool(0.2),
                                at: time(&mut rng),
                            })
                        } else {
                            Change::Finish(RunEnd {
                                scheduler,
                                job,
                                tick,
                                instance,
                                outcome: outcome(&mut rng),
                                error: note(&mut rng),
                                at: time(&mut rng),
                            })
                        }
                    })
                    .collect();
                let sql = history.apply(&changes).await.unwrap();
                let mem = memory.runs.apply(&changes);
                assert_eq!(sql, mem, "{at}: apply({changes:?})");
            }
        }
    }
    // Every row.
    let end = format!("seed {seed}, at the end");
    let sql: Vec<(String, String, i64, String)> =
        sqlx::query_as("SELECT scheduler, job, tick_ms, what FROM effects")
            .fetch_all(history.pool())
            .await
            .unwrap();
    let (mut sql, mut mem) = (sql, memory.effects.clone());
    sql.sort();
    mem.sort();
    assert_eq!(sql, mem, "{end}: the jobs' writes");
    let (first, last) = (base(), base() + chrono::Duration::days(1));
    for scheduler in SCHEDULERS {
        for job in JOBS {
            for s in 0..TICKS {
                let tick = base() + chrono::Duration::seconds(s);
                let sql = history.run_at(scheduler, job, tick).await.unwrap();
                let mem = memory.runs.run_at(scheduler, job, tick);
                assert_eq!(sql, mem, "{end}: the run of {scheduler}/{job} at {tick}");
            }
        }
        let sql = sorted(dispatch.stale_handoffs(scheduler, last).await.unwrap());
        let mem = memory.handoffs.stale(scheduler, last);
        assert_eq!(sql, mem, "{end}: the hand-offs of {scheduler}");
        let sql = control.leader_record(scheduler).await.unwrap();
        let mem = memory.leaders.record_of(scheduler);
        assert_eq!(sql, mem, "{end}: the leader of {scheduler}");
        let sql = definitions.job_definitions(scheduler).await.unwrap();
        let mem = memory.jobs.all(scheduler);
        assert_eq!(sql, mem, "{end}: the job definitions of {scheduler}");
        let sql = changes.job_changes_after(scheduler, 0).await.unwrap();
        let mem = memory.changes.after(scheduler, 0);
        assert_eq!(sql, mem, "{end}: the job changes of {scheduler}");
        for id in IDS {
            let sql = requests.request(scheduler, id).await.unwrap();
            let mem = memory.requests.request(scheduler, id);
            assert_eq!(sql, mem, "{end}: the request {id} of {scheduler}");
        }
        let mut sql = control.paused_jobs(scheduler).await.unwrap();
        sql.sort();
        let mem = memory.pauses.paused(scheduler);
        assert_eq!(sql, mem, "{end}: the pauses of {scheduler}");
        let sql = dispatch.replicas(scheduler, first, first).await.unwrap();
        let mem = memory.replicas.replicas(scheduler, first, first);
        assert_eq!(sql, mem, "{end}: the replicas of {scheduler}");
    }
}

#[tokio::test]
async fn the_memory_tables_answer_as_sqlite_does() {
    let seeds = match std::env::var("REDLOCK_HISTORY_FIDELITY_SEED") {
        Ok(seed) => {
            let seed = seed.parse().expect("a seed is a number");
            seed..seed + 1
        }
        Err(_) => 0..SEQUENCES,
    };
    for seed in seeds {
        sequence(seed).await;
    }
}
