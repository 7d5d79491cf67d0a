//! The built `redlock` binary, run as a process against a real scheduler (in this
//! process, over real `redis-server` nodes) whose history is a SQLite file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_scheduler::admin::SchedulerAdmin;
use redlock_scheduler::history::RunFilter;
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use redlock_testkit::{Cluster, until};

mod common;
use common::run_cli;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_jobs_history_and_requests() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("history.db").display());
    let history = History::connect(&url).await.unwrap();
    let redlock = redlock_testkit::builder(&cluster)
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    let manual = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&manual);
    let scheduler = Scheduler::builder(redlock)
        .name("billing")
        .instance("replica-a")
        .leader_ttl(Duration::from_secs(2))
        .retry_interval(Duration::from_millis(100))
        .history(history.clone())
        .job(Job::new(
            "every-second",
            "* * * * * *",
            |_ctx: JobContext| async { Ok::<_, std::io::Error>(()) },
        ))
        .job(
            Job::new("nightly", "0 0 3 * * *", move |ctx: JobContext| {
                let recorded = Arc::clone(&recorded);
                async move {
                    recorded.lock().unwrap().push(ctx.is_manual());
                    Ok::<_, std::io::Error>(())
                }
            })
            .time_zone("Europe/Paris"),
        )
        .build()
        .unwrap();
    scheduler.start();
    let admin = SchedulerAdmin::new(history.clone(), "billing");
    until("a leader", Duration::from_secs(10), || async {
        scheduler.leadership().map(|_| ())
    })
    .await;
    until("the jobs published", Duration::from_secs(10), || async {
        (admin.jobs().await.unwrap().len() == 2).then_some(())
    })
    .await;
    until("a run of every-second", Duration::from_secs(10), || async {
        let runs = admin
            .runs(&RunFilter::new().job("every-second").limit(1))
            .await
            .unwrap();
        runs.first().filter(|r| r.outcome.is_terminal()).map(|_| ())
    })
    .await;
    // The scheduler's name through its variable, the database through its flag.
    let env = [("REDLOCK_SCHEDULER", "billing")];
    let db = ["--database", url.as_str()];
    let cli = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(db.iter())
            .map(|s| (*s).to_owned())
            .collect()
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_cli(&args, &env).await
    };

    // jobs: both, with next ticks in their zones.
    let jobs = run(cli(&["jobs", "--json"])).await.expect(0).json();
    let jobs = jobs.as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let nightly = jobs.iter().find(|j| j["name"] == "nightly").unwrap();
    assert_eq!(nightly["time_zone"], "Europe/Paris");
    assert_eq!(nightly["schedule"], "0 0 3 * * *");
    assert_eq!(nightly["next_ticks"].as_array().unwrap().len(), 5);
    let secondly = jobs.iter().find(|j| j["name"] == "every-second").unwrap();
    let next: Vec<chrono::DateTime<chrono::Utc>> = secondly["next_ticks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(next.len(), 5);
    assert!(
        next.windows(2).all(|w| (w[1] - w[0]).num_seconds() == 1),
        "{next:?}"
    );
    assert_eq!(secondly["paused"], false);
    assert!(secondly["last_run"]["outcome"].is_string(), "{secondly}");
    let human = run(cli(&["jobs"])).await.expect(0);
    assert!(human.stdout.contains("leader replica-a"), "{human:?}");
    assert!(
        human
            .stdout
            .lines()
            .any(|l| l.starts_with("nightly") && l.contains("Europe/Paris")),
        "{human:?}"
    );
    // The default scheduler name has no jobs: said on stderr, exit code 0.
    let other = run_cli(
        &cli(&["jobs"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        &[],
    )
    .await
    .expect(0);
    assert!(
        other.stderr.contains("no replica of scheduler `scheduler`"),
        "{other:?}"
    );

    // history: newest first, filtered.
    let runs = run(cli(&["history", "every-second", "--json"]))
        .await
        .expect(0)
        .json();
    let runs = runs.as_array().unwrap();
    assert!(!runs.is_empty());
    assert!(runs.iter().all(|r| r["job"] == "every-second"));
    let ticks: Vec<&str> = runs.iter().map(|r| r["tick"].as_str().unwrap()).collect();
    assert!(
        ticks.windows(2).all(|w| w[0] > w[1]),
        "newest first: {ticks:?}"
    );
    let one = run(cli(&["history", "every-second", "--limit", "1", "--json"]))
        .await
        .expect(0)
        .json();
    assert_eq!(one.as_array().unwrap().len(), 1);
    let failed = run(cli(&[
        "history",
        "every-second",
        "--outcome",
        "failed",
        "--since",
        "1h",
        "--json",
    ]))
    .await
    .expect(0)
    .json();
    assert!(failed.as_array().unwrap().is_empty());
    let table = run(cli(&["history", "every-second"])).await.expect(0);
    assert!(table.stdout.starts_with("TICK"), "{table:?}");
    let unknown = run(cli(&["history", "no-such-job"])).await.expect(1);
    assert!(
        unknown.stderr.contains("no job named `no-such-job`"),
        "{unknown:?}"
    );

    // trigger: waits for the leader's result.
    let triggered = run(cli(&["trigger", "nightly"])).await.expect(0);
    assert!(triggered.stdout.contains("succeeded"), "{triggered:?}");
    assert!(triggered.stdout.contains("ok: tick "), "{triggered:?}");
    until("the manual run", Duration::from_secs(5), || async {
        (manual.lock().unwrap().as_slice() == [true]).then_some(())
    })
    .await;
    let request = run(cli(&["trigger", "nightly", "--json"]))
        .await
        .expect(0)
        .json();
    assert_eq!(request["state"], "succeeded");
    assert_eq!(request["action"], "trigger");
    assert_eq!(request["done_by"], "replica-a");
    let manual_runs = run(cli(&["history", "nightly", "--json"]))
        .await
        .expect(0)
        .json();
    assert!(
        manual_runs
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["manual"] == true)
    );
    assert_eq!(manual_runs.as_array().unwrap().len(), 2);
    // --no-wait: the id at once, read back with `request`.
    let pending = run(cli(&["trigger", "nightly", "--no-wait", "--json"]))
        .await
        .expect(0)
        .json();
    let id = pending["id"].as_str().unwrap().to_owned();
    let done = run(cli(&["request", &id, "--wait", "10s", "--json"]))
        .await
        .expect(0)
        .json();
    assert_eq!(done["state"], "succeeded", "{done}");
    // A request that cannot be carried out fails the command.
    let cancel = run(cli(&["cancel", "nightly"])).await.expect(1);
    assert!(cancel.stdout.contains("failed"), "{cancel:?}");
    assert!(cancel.stderr.contains("was not carried out"), "{cancel:?}");
    let unknown = run(cli(&["trigger", "no-such-job"])).await.expect(1);
    assert!(unknown.stderr.contains("no job named"), "{unknown:?}");

    // pause / resume, seen by the admin API and by `jobs`.
    let paused = run(cli(&["pause", "every-second", "--json"]))
        .await
        .expect(0)
        .json();
    assert_eq!(paused["paused"], true);
    assert!(admin.job("every-second").await.unwrap().paused);
    let jobs = run(cli(&["jobs", "--json"])).await.expect(0).json();
    let secondly = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "every-second")
        .unwrap();
    assert_eq!(secondly["paused"], true);
    run(cli(&["resume", "every-second"])).await.expect(0);
    assert!(!admin.job("every-second").await.unwrap().paused);

    // leader, then step-down.
    let leader = run(cli(&["leader", "--json"])).await.expect(0).json();
    assert_eq!(leader["instance"], "replica-a");
    let epoch = leader["epoch"].as_u64().unwrap();
    let stepped = run(cli(&["step-down", "--json"])).await.expect(0).json();
    assert_eq!(stepped["state"], "succeeded", "{stepped}");
    assert_eq!(stepped["action"], "step_down");
    until("leadership given up", Duration::from_secs(5), || async {
        scheduler.leadership().is_none().then_some(())
    })
    .await;
    // The only replica takes over again later, with a higher epoch.
    until("a new term", Duration::from_secs(15), || async {
        let leader = admin.leader().await.unwrap()?;
        (leader.epoch > epoch).then_some(())
    })
    .await;

    // Shut down, the replica is not named as the leader any more.
    scheduler.shutdown(Duration::from_secs(5)).await;
    let leader = run(cli(&["leader", "--json"])).await.expect(0).json();
    assert!(leader.is_null(), "{leader}");
    let human = run(cli(&["leader"])).await.expect(0);
    assert!(
        human
            .stdout
            .starts_with("no leader for scheduler `billing`: the last, replica-a (epoch "),
        "{human:?}"
    );
    assert!(
        human.stdout.contains("ended its leadership at"),
        "{human:?}"
    );
    assert!(!human.stdout.contains("leads"), "{human:?}");
    let jobs = run(cli(&["jobs"])).await.expect(0);
    assert!(
        jobs.stdout
            .starts_with("scheduler `billing`: no leader (the last, replica-a, ended"),
        "{jobs:?}"
    );
}
