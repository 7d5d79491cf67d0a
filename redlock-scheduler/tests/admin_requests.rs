//! The admin API against real redis-server nodes, SQLite files and the PostgreSQL at
//! `DATABASE_URL`: a `SchedulerAdmin` made from the history's URL alone lists the jobs
//! the replicas published and the leader they recorded, reads runs through filters,
//! pauses jobs, and has the replicas trigger and cancel runs and step down through
//! request rows.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use redlock_scheduler::admin::{
    Dispatched, JobInfo, Request, RequestAction, RequestState, SchedulerAdmin,
};
use redlock_scheduler::error::RequestError;
use redlock_scheduler::history::{Outcome, Run, RunFilter};
use redlock_scheduler::job::Misfire;
use redlock_scheduler::leader::LeaderElector;
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use redlock_testkit::{Cluster, require, until};

mod common;
use common::*;

/// How long a request may take to be carried out (the leader looks twice a second).
const REQUEST_WAIT: Duration = Duration::from_secs(10);

/// The test's jobs: `yearly` (Paris, never due during a test) records its manual runs,
/// `secondly` counts its ticks, `slow` (never due either) runs until cancelled.
struct Jobs {
    yearly: String,
    secondly: String,
    slow: String,
    manual: Arc<Mutex<Vec<bool>>>,
    ticks: Arc<Ticks>,
}

impl Jobs {
    fn new() -> Self {
        Self {
            yearly: unique("yearly"),
            secondly: unique("secondly"),
            slow: unique("slow"),
            manual: Arc::default(),
            ticks: Arc::default(),
        }
    }

    fn jobs(&self) -> Vec<Job> {
        let manual = Arc::clone(&self.manual);
        vec![
            Job::new(&self.yearly, "0 0 0 1 1 *", move |ctx: JobContext| {
                let manual = Arc::clone(&manual);
                async move {
                    manual.lock().unwrap().push(ctx.is_manual());
                    Ok::<_, std::io::Error>(())
                }
            })
            .time_zone("Europe/Paris")
            .misfire(Misfire::CatchUp { max: 2 })
            .timeout(Duration::from_secs(30)),
            counting_job(&self.secondly, "* * * * * *", &self.ticks, Duration::ZERO),
            Job::new(&self.slow, "0 0 0 1 1 *", |ctx: JobContext| async move {
                ctx.cancelled().await; // ends only when told to
                Err::<(), _>(std::io::Error::other("stopped"))
            }),
        ]
    }
}

/// Two replicas of the scheduler `name` sharing the history at `url`; the index of the
/// leader.
async fn replicas(cluster: &Cluster, url: &str, name: &str, jobs: &Jobs) -> (Vec<Replica>, usize) {
    let mut replicas = Vec::new();
    for instance in ["a", "b"] {
        let name = name.to_owned();
        replicas.push(
            Replica::start(
                cluster,
                instance,
                Some(url.to_owned()),
                jobs.jobs(),
                move |b| b.name(name),
            )
            .await,
        );
    }
    let leader = leader_of(&replicas, Duration::from_secs(5)).await;
    (replicas, leader)
}

/// An admin of `name` made from nothing but the history's URL.
async fn admin(url: &str, name: &str) -> SchedulerAdmin {
    SchedulerAdmin::new(History::connect(url).await.unwrap(), name).operator("ops")
}

async fn jobs_listed(admin: &SchedulerAdmin, n: usize) -> Vec<JobInfo> {
    until("the jobs published", Duration::from_secs(5), || async {
        let jobs = admin.jobs().await.unwrap();
        (jobs.len() == n).then_some(jobs)
    })
    .await
}

/// The request `dispatched` recorded, once done.
async fn done(admin: &SchedulerAdmin, dispatched: &Dispatched) -> Request {
    let id = dispatched.request_id().expect("recorded as a request");
    admin.wait(id, REQUEST_WAIT).await.unwrap()
}

/// The latest run of `job` once it has ended.
async fn ended(admin: &SchedulerAdmin, job: &str) -> Run {
    until("the run's end recorded", Duration::from_secs(5), || async {
        let runs = admin
            .runs(&RunFilter::new().job(job).limit(1))
            .await
            .unwrap();
        runs.into_iter().next().filter(|r| r.outcome.is_terminal())
    })
    .await
}

fn tick_of(result: &str) -> DateTime<Utc> {
    let tick = result.strip_prefix("ok: tick ").expect(result);
    DateTime::parse_from_rfc3339(tick).unwrap().to_utc()
}

/// The admin lists the jobs (schedule, zone, policy, next ticks in the job's zone) and
/// the leader from the history alone; unknown jobs and requests are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_lists_jobs_and_the_leader_from_the_history_alone() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let jobs = Jobs::new();
    let (replicas, leader) = replicas(&cluster, &url, Scheduler::DEFAULT_NAME, &jobs).await;
    let admin = admin(&url, Scheduler::DEFAULT_NAME).await;

    let listed = jobs_listed(&admin, 3).await;
    let yearly = listed.iter().find(|j| j.name == jobs.yearly).unwrap();
    assert_eq!(yearly.schedule, "0 0 0 1 1 *");
    assert_eq!(yearly.time_zone, "Europe/Paris");
    assert_eq!(yearly.misfire, Some(Misfire::CatchUp { max: 2 }));
    assert_eq!(yearly.timeout_ms, Some(30_000));
    assert!(!yearly.paused && !yearly.running && yearly.last_run.is_none());
    assert!(["a", "b"].contains(&yearly.published_by.as_str()));
    // Five new years' midnights in Paris, one a year.
    assert_eq!(yearly.next_ticks.len(), 5, "{yearly:?}");
    for (i, tick) in yearly.next_ticks.iter().enumerate() {
        let paris = tick.with_timezone(&Tz::Europe__Paris);
        assert_eq!(paris.format("%m-%d %H:%M:%S").to_string(), "01-01 00:00:00");
        if i > 0 {
            assert_eq!(
                paris.format("%Y").to_string().parse::<i32>().unwrap(),
                yearly.next_ticks[i - 1]
                    .with_timezone(&Tz::Europe__Paris)
                    .format("%Y")
                    .to_string()
                    .parse::<i32>()
                    .unwrap()
                    + 1
            );
        }
    }
    let secondly = listed.iter().find(|j| j.name == jobs.secondly).unwrap();
    assert_eq!(
        (secondly.time_zone.as_str(), secondly.misfire),
        ("UTC", Some(Misfire::RunOnce))
    );
    assert_eq!(secondly.timeout_ms, None);
    assert!(secondly.next_ticks[0] > Utc::now() - chrono::Duration::seconds(1));
    for pair in secondly.next_ticks.windows(2) {
        assert_eq!(pair[1] - pair[0], chrono::Duration::seconds(1));
    }
    // The ticks run meanwhile show as the last run.
    let secondly = until("a secondly run", Duration::from_secs(5), || async {
        let job = admin.job(&jobs.secondly).await.unwrap();
        job.last_run.is_some().then_some(job)
    })
    .await;
    let last = secondly.last_run.unwrap();
    assert_eq!(last.instance, replicas[leader].scheduler.instance());

    // The leader as recorded: instance and epoch of the live leadership.
    let leadership = replicas[leader].scheduler.leadership().unwrap();
    let recorded = until("the leader recorded", Duration::from_secs(5), || async {
        admin.leader().await.unwrap()
    })
    .await;
    assert_eq!(recorded.instance, replicas[leader].scheduler.instance());
    assert_eq!(recorded.epoch, leadership.epoch());
    assert!(recorded.since <= Utc::now());

    // Serializable for an admin endpoint.
    let json = serde_json::to_string(&listed).unwrap();
    assert!(
        json.contains(r#""misfire":{"policy":"catch_up","max":2}"#),
        "{json}"
    );
    assert!(json.contains(r#""next_ticks":["#), "{json}");

    // Unknown names.
    for error in [
        admin.trigger("nope").await.err(),
        admin.cancel("nope").await.err(),
        admin.pause("nope").await.err(),
        admin.resume("nope").await.err(),
        admin.job("nope").await.err(),
    ] {
        match error {
            Some(RequestError::UnknownJob { name }) => assert_eq!(name, "nope"),
            other => panic!("expected UnknownJob, got {other:?}"),
        }
    }
    let missing = "0".repeat(32);
    assert!(matches!(
        admin.request(&missing).await,
        Err(RequestError::UnknownRequest { id }) if id == missing
    ));
    // Another scheduler's name sees none of it.
    let other = SchedulerAdmin::new(admin.history().clone(), "another");
    assert!(other.jobs().await.unwrap().is_empty());
    assert!(other.leader().await.unwrap().is_none());
    assert!(matches!(
        other.trigger(&jobs.yearly).await,
        Err(RequestError::UnknownJob { .. })
    ));
    // A running scheduler offers the same view.
    let own = replicas[1 - leader].scheduler.admin().unwrap();
    assert_eq!(own.jobs().await.unwrap().len(), 3);

    for replica in &replicas {
        replica.shutdown().await;
    }
}

/// Trigger runs the job once on the leader (manual row); pause skips the next ticks
/// (recorded as paused) until resume; cancel ends a long run as cancelled by an
/// operator; the filters select runs by job, outcome, kind, time and count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_pause_cancel_and_filtered_runs() {
    let cluster = Cluster::start(3).await;
    let (_dir, url) = sqlite_url();
    let jobs = Jobs::new();
    let (replicas, leader) = replicas(&cluster, &url, Scheduler::DEFAULT_NAME, &jobs).await;
    let leader_name = replicas[leader].scheduler.instance().to_owned();
    let admin = admin(&url, Scheduler::DEFAULT_NAME).await;
    jobs_listed(&admin, 3).await;

    // Trigger: carried out by the leader, once, as a manual run.
    let trigger = admin.trigger(&jobs.yearly).await.unwrap();
    let id = trigger
        .request_id()
        .expect("an admin's trigger is a request");
    assert_eq!(id.len(), 32);
    let pending = admin.request(id).await.unwrap();
    assert_eq!(
        (
            pending.action,
            pending.requested_by.as_str(),
            pending.job.as_deref()
        ),
        (RequestAction::Trigger, "ops", Some(jobs.yearly.as_str()))
    );
    let request = done(&admin, &trigger).await;
    assert_eq!(request.state, RequestState::Succeeded, "{request:?}");
    assert_eq!(request.done_by.as_deref(), Some(leader_name.as_str()));
    let tick = tick_of(request.result.as_deref().unwrap());
    let run = ended(&admin, &jobs.yearly).await;
    assert_eq!((run.tick, run.manual), (tick, true));
    assert_eq!(
        (run.outcome, run.instance.as_str()),
        (Outcome::Succeeded, leader_name.as_str())
    );
    assert_eq!(
        *jobs.manual.lock().unwrap(),
        vec![true],
        "ran once, manually"
    );

    // Pause: the next ticks are recorded as skipped (paused), cluster-wide.
    admin.pause(&jobs.secondly).await.unwrap();
    let paused_at = Utc::now();
    assert!(admin.job(&jobs.secondly).await.unwrap().paused);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    admin.resume(&jobs.secondly).await.unwrap();
    let resumed_at = Utc::now();
    assert!(!admin.job(&jobs.secondly).await.unwrap().paused);
    let while_paused = RunFilter::new()
        .job(&jobs.secondly)
        .since(paused_at + chrono::Duration::milliseconds(1100))
        .until(resumed_at - chrono::Duration::milliseconds(100));
    let skipped = admin.runs(&while_paused).await.unwrap();
    assert!(!skipped.is_empty());
    for run in &skipped {
        assert_eq!(
            (run.outcome, run.error.as_deref()),
            (Outcome::Skipped, Some("paused")),
            "{run:?}"
        );
        assert!(run.tick >= paused_at && run.tick <= resumed_at);
    }

    // Cancel: a long run ends, recorded as cancelled by an operator.
    let started = done(&admin, &admin.trigger(&jobs.slow).await.unwrap()).await;
    assert_eq!(started.state, RequestState::Succeeded, "{started:?}");
    let slow_tick = tick_of(started.result.as_deref().unwrap());
    let running = until(
        "the slow run shown running",
        Duration::from_secs(5),
        || async {
            let job = admin.job(&jobs.slow).await.unwrap();
            job.running.then_some(job)
        },
    )
    .await;
    assert_eq!(running.running_on.as_deref(), Some(leader_name.as_str()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancel = done(&admin, &admin.cancel(&jobs.slow).await.unwrap()).await;
    assert_eq!(cancel.state, RequestState::Succeeded, "{cancel:?}");
    assert_eq!(
        cancel.result.as_deref(),
        Some(
            format!(
                "ok: cancelled the run of {} on {leader_name}",
                slow_tick.to_rfc3339()
            )
            .as_str()
        )
    );
    let run = ended(&admin, &jobs.slow).await;
    assert_eq!(run.tick, slow_tick);
    assert_eq!(
        (run.outcome, run.error.as_deref()),
        (Outcome::Cancelled, Some("cancelled by an operator"))
    );
    let took = run.finished.unwrap() - run.started.unwrap();
    assert!(took < chrono::Duration::seconds(5), "{took:?}");
    assert!(!admin.job(&jobs.slow).await.unwrap().running);
    // Nothing to cancel: the request says so; the scheduler says so at once.
    let nothing = done(&admin, &admin.cancel(&jobs.yearly).await.unwrap()).await;
    assert_eq!(
        (nothing.state, nothing.result.as_deref()),
        (RequestState::Failed, Some("no run going"))
    );
    assert!(matches!(
        replicas[1 - leader].scheduler.cancel(&jobs.yearly).await,
        Err(RequestError::NotRunning { .. })
    ));

    // Filters: job and outcome and limit; outcome alone; manual or scheduled; limit.
    let two = admin
        .runs(
            &RunFilter::new()
                .job(&jobs.secondly)
                .outcome(Outcome::Skipped)
                .limit(2),
        )
        .await
        .unwrap();
    assert_eq!(two.len(), 2);
    assert!(
        two.iter()
            .all(|r| r.job == jobs.secondly && r.outcome == Outcome::Skipped)
    );
    assert!(two[0].tick > two[1].tick, "newest first");
    let cancelled = admin
        .runs(&RunFilter::new().outcome(Outcome::Cancelled))
        .await
        .unwrap();
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0].job, jobs.slow);
    let manual = admin.runs(&RunFilter::new().manual_only()).await.unwrap();
    let mut manual_jobs: Vec<&str> = manual.iter().map(|r| r.job.as_str()).collect();
    manual_jobs.sort_unstable();
    let mut expected = vec![jobs.yearly.as_str(), jobs.slow.as_str()];
    expected.sort_unstable();
    assert_eq!(manual_jobs, expected);
    let scheduled = admin
        .runs(&RunFilter::new().scheduled_only())
        .await
        .unwrap();
    assert!(!scheduled.is_empty());
    assert!(
        scheduled
            .iter()
            .all(|r| !r.manual && r.job == jobs.secondly)
    );
    let three = admin.runs(&RunFilter::new().limit(3)).await.unwrap();
    assert_eq!(three.len(), 3);
    assert!(three.windows(2).all(|w| w[0].tick >= w[1].tick));
    let all = admin.runs(&RunFilter::new().limit(5000)).await.unwrap();
    assert!(all.len() > three.len());
    assert!(manual.iter().all(|run| all.contains(run)));
    assert_eq!(RunFilter::new().limit(5000).limit_or_default(), 1000);

    for replica in &replicas {
        replica.shutdown().await;
    }
}

/// Step-down moves leadership to the other replica (new epoch, recorded); a run going
/// on the old leader goes on and is cancelled there on request; the scheduler steps
/// down directly when it leads and through a request when it does not. On PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_down_hands_leadership_over() {
    let Some(url) = require::database_url() else {
        return;
    };
    let cluster = Cluster::start(3).await;
    let name = unique("admin");
    let jobs = Jobs::new();
    let (replicas, first) = replicas(&cluster, &url, &name, &jobs).await;
    let second = 1 - first;
    let (first_name, second_name) = (
        replicas[first].scheduler.instance().to_owned(),
        replicas[second].scheduler.instance().to_owned(),
    );
    let admin = admin(&url, &name).await;
    jobs_listed(&admin, 3).await;
    let recorded_as = |instance: String, above: u64| {
        let admin = admin.clone();
        async move {
            until(
                "the new leader recorded",
                Duration::from_secs(5),
                || async {
                    admin
                        .leader()
                        .await
                        .unwrap()
                        .filter(|l| l.instance == instance && l.epoch > above)
                },
            )
            .await
        }
    };
    let epoch = recorded_as(first_name.clone(), 0).await.epoch;

    // A long run on the leader, then the leader steps down on request.
    let started = done(&admin, &admin.trigger(&jobs.slow).await.unwrap()).await;
    assert_eq!(started.state, RequestState::Succeeded, "{started:?}");
    let request = done(&admin, &admin.step_down().await.unwrap()).await;
    assert_eq!(request.state, RequestState::Succeeded, "{request:?}");
    assert_eq!(request.done_by.as_deref(), Some(first_name.as_str()));
    assert_eq!(
        request.result.as_deref(),
        Some(format!("ok: {first_name} stepped down from epoch {epoch}").as_str())
    );
    let handed_over = Instant::now();
    until(
        "the other replica leads",
        Duration::from_secs(3),
        || async { replicas[second].leads().then_some(()) },
    )
    .await;
    assert!(
        handed_over.elapsed() < Duration::from_secs(1),
        "handed over at once"
    );
    assert!(!replicas[first].leads());
    let second_epoch = recorded_as(second_name.clone(), epoch).await.epoch;

    // The run goes on on the old leader; a cancel reaches it there.
    let running = admin.job(&jobs.slow).await.unwrap();
    assert_eq!(running.running_on.as_deref(), Some(first_name.as_str()));
    let cancel = done(&admin, &admin.cancel(&jobs.slow).await.unwrap()).await;
    assert_eq!(cancel.state, RequestState::Succeeded, "{cancel:?}");
    assert_eq!(cancel.done_by.as_deref(), Some(first_name.as_str()));
    let run = ended(&admin, &jobs.slow).await;
    assert_eq!(
        (run.outcome, run.error.as_deref(), run.instance.as_str()),
        (
            Outcome::Cancelled,
            Some("cancelled by an operator"),
            first_name.as_str()
        )
    );

    // The leader steps down directly (the old one has waited out its back-off)...
    match replicas[second].scheduler.step_down().await.unwrap() {
        Dispatched::Done { result, tick } => {
            assert!(result.starts_with("ok: "), "{result}");
            assert_eq!(tick, None);
        }
        other => panic!("expected Done, got {other:?}"),
    }
    let third_epoch = recorded_as(first_name.clone(), second_epoch).await.epoch;
    assert!(replicas[first].leads());
    // ...and a follower asks the leader to, through a request.
    let step_down = replicas[second].scheduler.step_down().await.unwrap();
    assert!(
        matches!(step_down, Dispatched::Requested { .. }),
        "{step_down:?}"
    );
    let request = done(&admin, &step_down).await;
    assert_eq!(request.requested_by, second_name);
    assert_eq!(request.state, RequestState::Succeeded, "{request:?}");
    recorded_as(second_name.clone(), third_epoch).await;

    for replica in &replicas {
        replica.shutdown().await;
    }
}

/// `LeaderElector::step_down`: the lock goes to the waiting replica at once, the
/// leadership ends without counting as lost, and the old leader keeps out of the
/// election for the back-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elector_steps_down_and_keeps_out_for_the_back_off() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster)
        .ttl(LEADER_TTL)
        .build()
        .unwrap();
    let election = unique("election");
    let ended = Arc::new(Mutex::new(Vec::new()));
    let on_lost = Arc::clone(&ended);
    let a = LeaderElector::builder(redlock.clone(), &election)
        .instance("a")
        .retry_interval(RETRY)
        .on_lost(move |l| on_lost.lock().unwrap().push(l.epoch()))
        .start()
        .unwrap();
    let led = tokio::time::timeout(Duration::from_secs(5), a.elected())
        .await
        .unwrap();
    let b = LeaderElector::builder(redlock, &election)
        .instance("b")
        .retry_interval(RETRY)
        .start()
        .unwrap();
    assert!(
        !b.step_down(Duration::from_secs(1)).await,
        "b does not lead"
    );
    tokio::time::sleep(Duration::from_millis(200)).await; // b waits in the queue

    let back_off = Duration::from_secs(3);
    let stepped = Instant::now();
    assert!(a.step_down(back_off).await);
    assert!(led.ended_token().is_cancelled());
    assert!(!led.lost_token().is_cancelled(), "a voluntary end");
    assert_eq!(*ended.lock().unwrap(), vec![led.epoch()]);
    assert!(a.leadership().is_none());
    let next = tokio::time::timeout(Duration::from_secs(1), b.elected())
        .await
        .expect("b takes over at once");
    assert!(next.epoch() > led.epoch());

    // b leaves at once: a still keeps out until its back-off is over.
    b.shutdown().await;
    while stepped.elapsed() < back_off - Duration::from_millis(300) {
        assert!(a.leadership().is_none(), "a campaigned during its back-off");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = tokio::time::timeout(Duration::from_secs(3), a.elected())
        .await
        .expect("a campaigns again after the back-off");
    assert!(again.epoch() > next.epoch());
    assert!(stepped.elapsed() >= back_off);
    a.shutdown().await;
}

/// The leader's record ends with its leadership: once the leader shut down, the admin
/// names no leader (the last record says when it ended); once a leader crashed, as
/// soon as its record's lease runs out (seconds, not at once: it may only be slow).
async fn the_leader_record_ends_with_the_leadership(url: &str) {
    let cluster = Cluster::start(3).await;
    let name = unique("tenure");
    let jobs = Jobs::new();
    let admin = admin(url, &name).await;
    let start = |instance: &'static str| {
        let name = name.clone();
        Replica::start(
            &cluster,
            instance,
            Some(url.to_owned()),
            jobs.jobs(),
            move |b| b.name(name),
        )
    };
    let recorded = |instance: &'static str| {
        let admin = admin.clone();
        async move {
            until("the leader recorded", Duration::from_secs(10), || async {
                admin
                    .leader()
                    .await
                    .unwrap()
                    .filter(|l| l.instance == instance)
            })
            .await
        }
    };

    // A graceful shutdown: no leader at once.
    let a = start("a").await;
    let led = recorded("a").await;
    assert!(led.ended.is_none(), "{led:?}");
    assert!(led.expires.is_some_and(|e| e > Utc::now()), "{led:?}");
    a.shutdown().await;
    assert_eq!(admin.leader().await.unwrap(), None, "a shut down");
    let last = admin.last_leader().await.unwrap().unwrap();
    assert_eq!((last.instance.as_str(), last.epoch), ("a", led.epoch));
    assert!(last.ended.is_some_and(|e| e <= Utc::now()), "{last:?}");
    assert!(!last.is_current_at(Utc::now()));

    // A crash: named until its record runs out, then no leader.
    let mut b = start("b").await;
    let led_b = recorded("b").await;
    assert!(led_b.epoch > led.epoch);
    b.sandbox.crash();
    let crashed = Instant::now();
    assert_eq!(
        admin.leader().await.unwrap().map(|l| l.instance),
        Some("b".to_owned()),
        "the record holds for its lease"
    );
    until("b's record run out", Duration::from_secs(20), || async {
        admin.leader().await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(
        crashed.elapsed() > Duration::from_secs(5),
        "ran out after {:?}, before its lease",
        crashed.elapsed()
    );
    let last = admin.last_leader().await.unwrap().unwrap();
    assert_eq!((last.instance.as_str(), last.ended), ("b", None));
    assert!(last.expires.is_some_and(|e| e <= Utc::now()), "{last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_record_ends_with_the_leadership_on_sqlite() {
    let (_dir, url) = sqlite_url();
    the_leader_record_ends_with_the_leadership(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_record_ends_with_the_leadership_on_postgres() {
    let Some(url) = require::database_url() else {
        return;
    };
    the_leader_record_ends_with_the_leadership(&url).await;
}
