//! The built `redlock` binary, run as a process against real `redis-server` nodes and a
//! real scheduler (in this process) whose history is a SQLite file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock_core::Redlock;
use redlock_scheduler::{History, Job, JobContext, RunFilter, Scheduler, SchedulerAdmin};
use redlock_testkit::Cluster;
use serde_json::Value;

/// The variables the binary reads: cleared for every run, so that the environment the
/// tests run in (a `DATABASE_URL` for the PostgreSQL tests, say) does not leak in.
const VARIABLES: [&str; 7] = [
    "REDLOCK_NODES",
    "REDLOCK_KEY_PREFIX",
    "REDLOCK_MAX_TTL",
    "DATABASE_URL",
    "REDLOCK_SCHEDULER",
    "REDLOCK_OPERATOR",
    "REDLOCK_TIMEOUT",
];

/// What a run of the binary printed, and its exit code.
#[derive(Debug)]
struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Output {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|err| panic!("stdout is not JSON ({err}): {self:?}"))
    }

    fn expect(self, code: i32) -> Self {
        assert_eq!(self.code, code, "exit code of {self:#?}");
        self
    }
}

/// Runs `redlock ARGS` with only the variables in `env` set.
async fn run_cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock"));
    for variable in VARIABLES {
        command.env_remove(variable);
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .unwrap_or_else(|_| panic!("redlock {args:?} did not end within 30s"))
        .expect("the binary runs");
    Output {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// `--nodes URLS` for `cluster`.
fn nodes_of(cluster: &Cluster) -> String {
    cluster.urls().join(",")
}

/// Polls `check` every 50 ms until it gives a value; fails after `within`.
async fn until<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn holder_client(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .holder("billing-1")
        .fencing(true)
        .restart_quarantine(false) // the test nodes were started a moment ago
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_listed_and_released_by_force() {
    let cluster = Cluster::start(3).await;
    let nodes = nodes_of(&cluster);
    let redlock = holder_client(&cluster);
    let lock = redlock
        .lock("invoice:7")
        .ttl(Duration::from_secs(30))
        .await
        .unwrap();
    let token = lock.fencing_token().expect("fencing is on");
    // As the nodes hold it (the counter may be above the token: an attempt that lost
    // counts too).
    let before = redlock.locks("invoice:").await.unwrap().locks.remove(0);

    // Human output: the resource, its holder, 3 of 3 nodes.
    let out = run_cli(&["locks", "--nodes", &nodes], &[]).await.expect(0);
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with("invoice:7"))
        .unwrap_or_else(|| panic!("no row for the lock: {out:?}"));
    assert!(row.contains("billing-1"), "{row}");
    assert!(row.contains("majority") && row.contains("3/3"), "{row}");
    assert!(out.stdout.lines().next().unwrap().starts_with("RESOURCE"));

    // JSON, configured through REDLOCK_NODES as the services are.
    let listing = run_cli(
        &["locks", "invoice:", "--json"],
        &[("REDLOCK_NODES", &nodes)],
    )
    .await
    .expect(0)
    .json();
    let held = &listing["locks"][0];
    assert_eq!(listing["locks"].as_array().unwrap().len(), 1);
    assert_eq!(held["resource"], "invoice:7");
    assert_eq!(held["holder"], "billing-1");
    assert_eq!(held["agreement"], "majority");
    assert_eq!(held["holding"], 3);
    assert!(held["fencing_token"].as_u64().unwrap() >= token);
    let validity = held["validity_ms"].as_u64().unwrap();
    assert!(validity > 20_000 && validity <= 30_000, "{validity}");
    // The flag wins over the variable.
    let flagged = run_cli(
        &["locks", "--json", "--nodes", &nodes],
        &[("REDLOCK_NODES", "redis://127.0.0.1:1")],
    )
    .await
    .expect(0)
    .json();
    assert_eq!(flagged["locks"][0]["resource"], "invoice:7");
    // Another key prefix sees none of them.
    let other = run_cli(&["locks", "--nodes", &nodes, "--key-prefix", "other:"], &[])
        .await
        .expect(0);
    assert!(other.stdout.contains("no locks held"), "{other:?}");

    // Without --force: refused with what it would do, nothing changed.
    let refused = run_cli(&["release", "invoice:7", "--nodes", &nodes], &[])
        .await
        .expect(2);
    assert!(refused.stderr.starts_with("error: "), "{refused:?}");
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    assert!(refused.stderr.contains("fencing"), "{refused:?}");
    assert!(refused.stdout.is_empty());
    let still = redlock.locks("invoice:").await.unwrap();
    assert_eq!(still.locks.len(), 1, "a refused release changes nothing");
    assert_eq!(still.locks[0].fencing_token, before.fencing_token);
    assert_eq!(still.locks[0].acquisition, before.acquisition);
    assert_eq!(still.locks[0].holding, 3);

    // With --force: gone on every node, and the token above the holder's.
    let released = run_cli(
        &[
            "release",
            "invoice:7",
            "--force",
            "--json",
            "--nodes",
            &nodes,
        ],
        &[],
    )
    .await
    .expect(0)
    .json();
    assert_eq!(released["resource"], "invoice:7");
    assert_eq!(released["deleted"], 3);
    let new_token = released["fencing_token"].as_u64().unwrap();
    assert!(new_token > token, "{new_token} > {token}");
    assert!(new_token > before.fencing_token.unwrap());
    assert!(redlock.locks("invoice:").await.unwrap().locks.is_empty());
    let listed = run_cli(&["locks", "--json", "--nodes", &nodes], &[])
        .await
        .expect(0)
        .json();
    assert!(listed["locks"].as_array().unwrap().is_empty());
    // The next holder's token is above the forced one.
    let next = redlock.lock("invoice:7").await.unwrap();
    assert!(next.fencing_token().unwrap() > new_token);
    // Human output of a forced release: the count and the token.
    let human = run_cli(&["release", "invoice:7", "--force", "--nodes", &nodes], &[])
        .await
        .expect(0);
    assert!(
        human.stdout.contains("deleted on 3 of 3 nodes"),
        "{human:?}"
    );
    assert!(human.stdout.contains("fencing token now"), "{human:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_health_and_failures() {
    let started = Instant::now();
    let mut cluster = Cluster::start(3).await;
    let nodes = nodes_of(&cluster);
    let redlock = holder_client(&cluster);
    let _lock = redlock.lock("report").await.unwrap();

    let health = run_cli(&["nodes", "--json", "--nodes", &nodes], &[])
        .await
        .expect(0)
        .json();
    let health = health.as_array().unwrap();
    assert_eq!(health.len(), 3);
    for (node, port) in health.iter().zip((0..3).map(|i| cluster.node(i).port())) {
        assert_eq!(node["reachable"], true, "{node}");
        assert!(
            node["node"]
                .as_str()
                .unwrap()
                .ends_with(&format!(":{port}"))
        );
        assert!(node["latency_us"].as_u64().is_some(), "{node}");
        assert_eq!(node["role"], "master");
        assert!(node["version"].as_str().is_some_and(|v| !v.is_empty()));
        // Seconds-old nodes: in quarantine for clients whose longest TTL is 10 s.
        assert!(node["quarantined_ms"].as_u64().is_some(), "{node}");
    }
    let human = run_cli(&["nodes", "--nodes", &nodes], &[]).await.expect(0);
    assert!(human.stdout.starts_with("NODE"), "{human:?}");
    assert_eq!(
        human.stdout.lines().filter(|l| l.contains(" ok ")).count(),
        3,
        "{human:?}"
    );
    // With --max-ttl 1s, nodes up for 2 s (uptime is in whole seconds, and the
    // quarantine adds one) are out of quarantine.
    tokio::time::sleep_until((started + Duration::from_millis(2100)).into()).await;
    let short = run_cli(
        &["nodes", "--json", "--max-ttl", "1s", "--nodes", &nodes],
        &[],
    )
    .await
    .expect(0)
    .json();
    assert!(
        short
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["quarantined_ms"].is_null() && n["votes"] == true)
    );

    // One node down: the data, a warning naming it, exit code 3.
    let dead = cluster.node(2).port();
    cluster.node_mut(2).kill();
    let partial = run_cli(&["nodes", "--nodes", &nodes], &[]).await.expect(3);
    assert!(partial.stderr.starts_with("warning: "), "{partial:?}");
    assert!(partial.stderr.contains(&format!(":{dead}")), "{partial:?}");
    let row = partial
        .stdout
        .lines()
        .find(|l| l.contains(&format!(":{dead}")))
        .unwrap();
    assert!(row.contains("unreachable"), "{row}");
    let listing = run_cli(&["locks", "--json", "--nodes", &nodes], &[])
        .await
        .expect(3);
    assert!(listing.stderr.contains(&format!(":{dead}")), "{listing:?}");
    assert_eq!(listing.json()["locks"][0]["resource"], "report");

    // Every node down: exit code 1 and one line naming them all.
    let ports: Vec<u16> = (0..3).map(|i| cluster.node(i).port()).collect();
    cluster.node_mut(0).kill();
    cluster.node_mut(1).kill();
    let failed = run_cli(&["locks", "--nodes", &nodes], &[]).await.expect(1);
    assert!(failed.stdout.is_empty(), "{failed:?}");
    assert!(failed.stderr.starts_with("error: "), "{failed:?}");
    assert_eq!(failed.stderr.lines().count(), 1, "{failed:?}");
    for port in &ports {
        assert!(failed.stderr.contains(&format!(":{port}")), "{failed:?}");
    }
    let health = run_cli(&["nodes", "--json", "--nodes", &nodes], &[])
        .await
        .expect(1);
    assert!(
        health
            .json()
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["reachable"] == false)
    );
    let release = run_cli(&["release", "report", "--force", "--nodes", &nodes], &[])
        .await
        .expect(1);
    assert!(
        release.stderr.contains(&format!(":{}", ports[0])),
        "{release:?}"
    );
}

#[tokio::test]
async fn configuration_errors_name_the_flag_and_variable() {
    let nodes = run_cli(&["locks"], &[]).await.expect(1);
    assert!(nodes.stderr.contains("--nodes") && nodes.stderr.contains("REDLOCK_NODES"));
    let database = run_cli(&["jobs"], &[]).await.expect(1);
    assert!(database.stderr.contains("--database") && database.stderr.contains("DATABASE_URL"));

    // A database that cannot be opened: its place, not its password.
    let unreachable = run_cli(
        &[
            "jobs",
            "--database",
            "postgres://nobody:s3cret@127.0.0.1:1/x",
        ],
        &[],
    )
    .await
    .expect(1);
    assert!(unreachable.stderr.starts_with("error: "), "{unreachable:?}");
    assert!(
        unreachable.stderr.contains("127.0.0.1:1"),
        "{unreachable:?}"
    );
    assert!(!unreachable.stderr.contains("s3cret"), "{unreachable:?}");
    assert_eq!(unreachable.stderr.lines().count(), 1);
    let via_env = run_cli(
        &["jobs"],
        &[("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x")],
    )
    .await
    .expect(1);
    assert!(via_env.stderr.contains("127.0.0.1:1"), "{via_env:?}");

    // A SQLite file that does not exist is not created.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let url = format!("sqlite://{}", missing.display());
    let out = run_cli(&["jobs", "--database", &url], &[]).await.expect(1);
    assert!(out.stderr.contains("does not exist"), "{out:?}");
    assert!(!missing.exists());

    // Usage errors are clap's: exit code 2.
    run_cli(&["history"], &[]).await.expect(2);
    run_cli(&["history", "job", "--outcome", "great"], &[])
        .await
        .expect(2);
    run_cli(&["trigger", "job", "--wait", "soon"], &[])
        .await
        .expect(2);
    let help = run_cli(&["--help"], &[]).await.expect(0);
    assert!(help.stdout.contains("Exit codes:") && help.stdout.contains("3  partial"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_jobs_history_and_requests() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("history.db").display());
    let history = History::connect(&url).await.unwrap();
    let redlock = Redlock::builder()
        .nodes(cluster.urls())
        .restart_quarantine(false) // fresh nodes
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

    scheduler.shutdown(Duration::from_secs(5)).await;
}
