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

/// `jobs add`, `jobs reschedule`, `jobs remove` and `jobs changes` against a running
/// replica with the handler `work` and no job in code: the changes reach the replica
/// (listed by `jobs`), are recorded with the operator's name, and are refused with exit
/// code 1 when they cannot be made (2 for a usage error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_added_rescheduled_and_removed() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("history.db").display());
    let history = History::connect(&url).await.unwrap();
    let scheduler = Scheduler::builder(redlock_testkit::builder(&cluster).build().unwrap())
        .name("billing")
        .instance("replica-a")
        .history(history.clone())
        .handler("work", |_ctx: JobContext| async {
            Ok::<_, std::io::Error>(())
        })
        .build()
        .unwrap();
    scheduler.start();
    let admin = SchedulerAdmin::new(history.clone(), "billing");
    until("a leader", Duration::from_secs(10), || async {
        scheduler.leadership().map(|_| ())
    })
    .await;
    // The replica's first beat says which handlers it has.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let env = [
        ("REDLOCK_SCHEDULER", "billing"),
        ("REDLOCK_OPERATOR", "alice"),
    ];
    let run = |args: &[&str]| {
        let args: Vec<String> = args
            .iter()
            .chain(["--database", url.as_str()].iter())
            .map(|s| (*s).to_owned())
            .collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_cli(&args, &env).await
        }
    };
    let listed = async || -> Vec<serde_json::Value> {
        let jobs = run(&["jobs", "--json"]).await.expect(0).json();
        jobs.as_array().unwrap().clone()
    };

    // None yet.
    let none = run(&["jobs", "changes"]).await.expect(0);
    assert_eq!(
        none.stdout,
        "no job changes recorded for scheduler `billing`\n"
    );
    let none = run(&["jobs", "changes", "--json"]).await.expect(0).json();
    assert_eq!(none, serde_json::json!([]));

    // Refused: a bad schedule, an unknown handler (exit 1); a bad option (exit 2).
    let bad = run(&[
        "jobs",
        "add",
        "export",
        "--cron",
        "every minute",
        "--handler",
        "work",
    ])
    .await
    .expect(1);
    assert!(bad.stderr.contains("refused"), "{bad:?}");
    let unknown = run(&[
        "jobs",
        "add",
        "export",
        "--cron",
        "* * * * *",
        "--handler",
        "nope",
    ])
    .await
    .expect(1);
    assert!(
        unknown.stderr.contains("no handler named `nope`"),
        "{unknown:?}"
    );
    run(&[
        "jobs",
        "add",
        "export",
        "--cron",
        "* * * * *",
        "--misfire",
        "often",
    ])
    .await
    .expect(2);
    assert!(admin.job_spec("export").await.unwrap().is_none());

    // Added, with every option.
    let added = run(&[
        "jobs",
        "add",
        "export",
        "--cron",
        "*/2 * * * * *",
        "--handler",
        "work",
        "--zone",
        "Europe/Paris",
        "--misfire",
        "catch_up:3",
        "--grace",
        "5s",
        "--run-timeout",
        "1m",
        "--dst",
        "skip/twice",
        "--on-leader",
        "--json",
    ])
    .await
    .expect(0)
    .json();
    assert_eq!(added["action"], "add", "{added}");
    assert_eq!(added["changed_by"], "alice");
    let spec = &added["definition"];
    assert_eq!(spec["schedule"], "*/2 * * * * *", "{added}");
    assert_eq!(spec["handler"], "work");
    assert_eq!(spec["time_zone"], "Europe/Paris");
    assert_eq!(spec["misfire"]["policy"], "catch_up");
    assert_eq!(spec["misfire"]["max"], 3);
    assert_eq!(spec["misfire_grace_ms"], 5000);
    assert_eq!(spec["timeout_ms"], 60_000);
    assert_eq!(spec["dst"], "skip/twice");
    assert_eq!(spec["run_on_leader"], true);
    until("the job listed", Duration::from_secs(10), || async {
        listed()
            .await
            .iter()
            .any(|j| j["name"] == "export")
            .then_some(())
    })
    .await;
    let again = run(&[
        "jobs",
        "add",
        "export",
        "--cron",
        "* * * * *",
        "--handler",
        "work",
    ])
    .await
    .expect(1);
    assert!(again.stderr.contains("there already"), "{again:?}");

    // Rescheduled, only the schedule: the rest kept; the table says before → after.
    let rescheduled = run(&["jobs", "reschedule", "export", "--cron", "*/3 * * * * *"])
        .await
        .expect(0);
    let out = &rescheduled.stdout;
    assert!(
        out.starts_with("rescheduled job `export` (change 2 by alice, "),
        "{rescheduled:?}"
    );
    assert!(
        out.contains("schedule   */2 * * * * * → */3 * * * * *"),
        "{rescheduled:?}"
    );
    assert!(out.contains("zone       Europe/Paris\n"), "{rescheduled:?}");
    assert!(out.contains("timeout    1m00s\n"), "{rescheduled:?}");
    let spec = admin.job_spec("export").await.unwrap().unwrap();
    assert_eq!(
        (spec.expression(), spec.zone(), spec.handler_name()),
        ("*/3 * * * * *", "Europe/Paris", "work")
    );
    until(
        "the new schedule listed",
        Duration::from_secs(10),
        || async {
            listed()
                .await
                .iter()
                .any(|j| j["name"] == "export" && j["schedule"] == "*/3 * * * * *")
                .then_some(())
        },
    )
    .await;
    // Settings switched off; the schedule stays.
    let off = run(&[
        "jobs",
        "reschedule",
        "export",
        "--no-run-timeout",
        "--on-leader=false",
        "--json",
    ])
    .await
    .expect(0)
    .json();
    assert_eq!(
        off["definition"]["timeout_ms"],
        serde_json::Value::Null,
        "{off}"
    );
    assert_eq!(off["definition"]["run_on_leader"], false);
    assert_eq!(off["definition"]["schedule"], "*/3 * * * * *");
    assert_eq!(off["definition"]["misfire_grace_ms"], 5000);
    let nothing = run(&["jobs", "reschedule", "export"]).await.expect(2);
    assert!(nothing.stderr.contains("nothing to change"), "{nothing:?}");
    let unknown = run(&["jobs", "reschedule", "nope", "--cron", "* * * * *"])
        .await
        .expect(1);
    assert!(
        unknown.stderr.contains("no job named `nope`"),
        "{unknown:?}"
    );

    // Removed; again: refused.
    let removed = run(&["jobs", "remove", "export"]).await.expect(0);
    assert!(
        removed
            .stdout
            .starts_with("removed job `export` (change 4 by alice, "),
        "{removed:?}"
    );
    until(
        "the job no longer listed",
        Duration::from_secs(10),
        || async { (!listed().await.iter().any(|j| j["name"] == "export")).then_some(()) },
    )
    .await;
    run(&["jobs", "remove", "export"]).await.expect(1);

    // The record: newest first, by the operator.
    let changes = run(&["jobs", "changes", "--json"]).await.expect(0).json();
    let changes = changes.as_array().unwrap();
    let actions: Vec<&str> = changes
        .iter()
        .map(|c| c["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["remove", "reschedule", "reschedule", "add"]);
    let seqs: Vec<u64> = changes.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [4, 3, 2, 1]);
    assert!(changes.iter().all(|c| c["changed_by"] == "alice"));
    let two = run(&[
        "jobs", "changes", "--job", "export", "--limit", "2", "--json",
    ])
    .await
    .expect(0)
    .json();
    assert_eq!(two.as_array().unwrap().len(), 2);
    let table = run(&["jobs", "changes"]).await.expect(0);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(lines[0].starts_with("SEQ  JOB"), "{table:?}");
    assert!(
        lines[1].starts_with("4    export  remove") && lines[1].contains("alice"),
        "{table:?}"
    );
    assert!(
        lines[3].ends_with("*/2 * * * * * (Europe/Paris) → */3 * * * * * (Europe/Paris)"),
        "{table:?}"
    );
    scheduler.shutdown(Duration::from_secs(5)).await;
}

/// `jobs add` with a name too long for the lock keys made from it: exit code 1, the
/// bound in bytes on stderr, nothing recorded; the longest accepted is added and runs;
/// a `--scheduler` whose name leaves no room for any job is refused, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_add_refuses_a_name_too_long_for_its_keys() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("history.db").display());
    let history = History::connect(&url).await.unwrap();
    let scheduler = Scheduler::builder(redlock_testkit::builder(&cluster).build().unwrap())
        .name("billing")
        .instance("replica-a")
        .history(history.clone())
        .handler("work", |_ctx: JobContext| async {
            Ok::<_, std::io::Error>(())
        })
        .build()
        .unwrap();
    scheduler.start();
    let admin = SchedulerAdmin::new(history.clone(), "billing");
    until("a leader", Duration::from_secs(10), || async {
        scheduler.leadership().map(|_| ())
    })
    .await;
    // The replica's first beat says which handlers it has.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let max = admin.max_job_name_len();
    assert_eq!(max, 512 - "billing".len() - 26);
    let add = |scheduler: &str, name: &str| {
        let args: Vec<String> = [
            "jobs",
            "add",
            name,
            "--cron",
            "* * * * * *",
            "--handler",
            "work",
            "--database",
            url.as_str(),
            "--scheduler",
            scheduler,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_cli(&args, &[]).await
        }
    };

    for len in [max + 1, 600] {
        let refused = add("billing", &"j".repeat(len)).await.expect(1);
        assert!(
            refused.stderr.contains(&format!("is {len} bytes long"))
                && refused
                    .stderr
                    .contains(&format!("use a name of at most {max} bytes")),
            "{refused:?}"
        );
        assert!(refused.stdout.is_empty(), "{refused:?}");
    }
    let refused = add(&"s".repeat(486), "j").await.expect(1);
    assert!(
        refused.stderr.contains("scheduler name") && refused.stderr.contains("at most 485 bytes"),
        "{refused:?}"
    );
    assert!(admin.job_changes(None, 10).await.unwrap().is_empty());

    let longest = "j".repeat(max);
    add("billing", &longest).await.expect(0);
    let succeeded = RunFilter::new()
        .job(&longest)
        .outcome(redlock_scheduler::history::Outcome::Succeeded);
    until(
        "a run of the longest job succeeded",
        Duration::from_secs(15),
        || async { admin.runs(&succeeded).await.ok().filter(|r| !r.is_empty()) },
    )
    .await;
    scheduler.shutdown(Duration::from_secs(5)).await;
}
