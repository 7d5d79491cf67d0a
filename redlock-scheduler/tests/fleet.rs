//! Replica processes: runs spread over three scheduler processes sharing real
//! redis-server nodes and the PostgreSQL at `DATABASE_URL`, while one is killed with
//! `SIGKILL` mid-run and another is stopped (`SIGSTOP`) past its locks' TTL (neither the
//! leader), and one takes one run at a time (`max_concurrent_runs(1)`).
//!
//! This test binary is also the replica: run with `REDLOCK_FLEET_REPLICA` set, the test
//! `replica_process` is a scheduler process until its standard input closes. Each run
//! writes its effect (job, tick, replica, when it started and ended) through its run
//! transaction. The checks, on the history and the effects:
//!
//! - each tick at most once; a tick whose row says succeeded has exactly one effect, and
//!   no other tick has any (a run of the stopped replica that woke up is refused);
//! - no two runs of one job overlap, cluster-wide;
//! - the replica at its limit never ran two at once;
//! - runs spread: every replica ran some;
//! - the killed replica's runs are closed (abandoned), none left `running`;
//! - no tick lost: every tick of the every-second jobs has its row.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::time::Duration;

use chrono::Utc;
use common::own_history;
use redlock_core::{BoxError, Redlock};
use redlock_scheduler::history::Outcome;
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use redlock_testkit::{Cluster, require};
use sqlx::Row as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

const ROLE: &str = "REDLOCK_FLEET_REPLICA";
const SCHEDULER: &str = "fleet";
/// The Redis TTL of the replicas' locks (leadership, run locks).
const TTL: Duration = Duration::from_secs(2);

/// The jobs every replica declares: (name, cron, how long a run works).
const JOBS: &[(&str, &str, u64)] = &[
    ("short-1", "* * * * * *", 50),
    ("short-2", "* * * * * *", 50),
    ("short-3", "* * * * * *", 50),
    ("short-4", "* * * * * *", 50),
    ("medium-1", "* * * * * *", 300),
    ("medium-2", "* * * * * *", 300),
    ("long", "*/2 * * * * *", 1500),
];

fn job(name: &'static str, cron: &str, work_ms: u64, effects: &str) -> Job {
    let effects = effects.to_owned();
    Job::new(name, cron, move |ctx: JobContext| {
        let effects = effects.clone();
        async move {
            let started = Utc::now().timestamp_millis();
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(work_ms)) => {}
                () = ctx.cancelled() => return Err::<(), BoxError>("cancelled".into()),
            }
            let ended = Utc::now().timestamp_millis();
            let mut tx = ctx.transaction().await?;
            sqlx::query(&format!(
                "INSERT INTO {effects} (job, tick_ms, instance, started_ms, ended_ms)
                 VALUES ($1, $2, $3, $4, $5)"
            ))
            .bind(name)
            .bind(ctx.tick().timestamp_millis())
            .bind(ctx.instance().to_owned())
            .bind(started)
            .bind(ended)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        }
    })
}

/// The replica: a scheduler process until its standard input closes.
#[test]
fn replica_process() {
    let Ok(instance) = std::env::var(ROLE) else {
        return; // the test binary run as tests: nothing to do here
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let nodes: Vec<String> = var("REDLOCK_FLEET_NODES")
            .split(',')
            .map(str::to_owned)
            .collect();
        let (prefix, effects) = (var("REDLOCK_FLEET_PREFIX"), var("REDLOCK_FLEET_EFFECTS"));
        let capacity: usize = var("REDLOCK_FLEET_CAPACITY").parse().unwrap();
        let redlock = Redlock::builder()
            .nodes(nodes)
            .restart_quarantine(false)
            .ttl(TTL)
            .node_timeout(Duration::from_millis(100))
            .build()
            .unwrap();
        let history = History::builder(var("REDLOCK_FLEET_HISTORY"))
            .table_prefix(&prefix)
            .connect()
            .await
            .unwrap();
        let mut builder = Scheduler::builder(redlock)
            .name(SCHEDULER)
            .instance(instance)
            .history(history)
            .leader_ttl(TTL)
            .retry_interval(Duration::from_millis(100))
            .max_concurrent_runs(capacity);
        for &(name, cron, work) in JOBS {
            builder = builder.job(job(name, cron, work, &effects));
        }
        let scheduler = builder.build().unwrap();
        scheduler.start();
        println!("started");
        // Until the parent closes standard input (or dies).
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while stdin.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        scheduler.shutdown(Duration::from_secs(5)).await;
    });
}

struct Process {
    name: &'static str,
    child: Child,
}

impl Process {
    fn pid(&self) -> String {
        self.child.id().unwrap().to_string()
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.pid()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {}", self.name);
    }
}

async fn spawn(
    name: &'static str,
    capacity: usize,
    cluster: &Cluster,
    url: &str,
    prefix: &str,
    effects: &str,
) -> Process {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "replica_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, name)
        .env("REDLOCK_FLEET_NODES", cluster.urls().join(","))
        .env("REDLOCK_FLEET_HISTORY", url)
        .env("REDLOCK_FLEET_PREFIX", prefix)
        .env("REDLOCK_FLEET_EFFECTS", effects)
        .env("REDLOCK_FLEET_CAPACITY", capacity.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Waits for the scheduler to start.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("started") {
                return;
            }
        }
        panic!("replica {name} ended before it started");
    })
    .await
    .expect("replica started");
    // The rest of its output (the test harness's) is read and dropped.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Process { name, child }
}

/// An effect: (job, tick ms, replica, started ms, ended ms).
type Effect = (String, i64, String, i64, i64);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_spread_over_replica_processes_through_kills_and_stops() {
    let Some(url) = require::database_url() else {
        return;
    };
    let cluster = Cluster::start(3).await;
    let (history, prefix, effects) = own_history(
        &url,
        "fleet",
        "job TEXT NOT NULL, tick_ms BIGINT NOT NULL, instance TEXT NOT NULL, started_ms BIGINT NOT NULL, ended_ms BIGINT NOT NULL",
    )
    .await;
    let mut processes = vec![
        spawn("a", 4, &cluster, &url, &prefix, &effects).await,
        spawn("b", 4, &cluster, &url, &prefix, &effects).await,
        spawn("c", 1, &cluster, &url, &prefix, &effects).await,
    ];
    let started = Utc::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The faults hit replicas that do not lead (a leader that dies loses the ticks it
    // claimed and had not handed over: that is the fail-over's, tested elsewhere): the
    // first of a and b that does not lead is killed, the other replica that does not
    // lead is stopped.
    let admin = redlock_scheduler::admin::SchedulerAdmin::new(history.clone(), SCHEDULER);
    let leader = admin.leader().await.unwrap().expect("a leader").instance;
    let killed = ["a", "b"].into_iter().find(|n| *n != leader).unwrap();
    let stopped = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != leader && *n != killed)
        .unwrap();
    eprintln!("leader {leader}; killing {killed}, stopping {stopped}");

    // The killed replica dies with a run going: one with at least 250 ms of its work
    // left when seen (a 50 ms run seen going may well be over by the time the signal
    // lands on a loaded machine).
    let running_on = |name: &'static str, left_ms: i64| {
        let history = history.clone();
        async move {
            let now = Utc::now();
            history
                .runs_between(SCHEDULER, started, now)
                .await
                .unwrap()
                .into_iter()
                .filter(|r| r.instance == name && r.outcome == Outcome::Running)
                .filter(|r| {
                    let work = JOBS.iter().find(|j| j.0 == r.job).map_or(0, |j| j.2);
                    r.started.is_some_and(|at| {
                        let work = chrono::Duration::milliseconds(i64::try_from(work).unwrap());
                        (at + work - now).num_milliseconds() >= left_ms
                    })
                })
                .count()
        }
    };
    redlock_testkit::until(
        "a run going on the replica to kill",
        Duration::from_secs(30),
        || async { (running_on(killed, 250).await > 0).then_some(()) },
    )
    .await;
    let index = processes.iter().position(|p| p.name == killed).unwrap();
    let mut victim = processes.remove(index);
    victim.signal("-KILL");
    let _ = victim.child.wait().await;
    // What the dead replica left running: the leader's sweep must close it.
    let left_by_the_dead = running_on(killed, i64::MIN).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Another stops past its locks' TTL, then wakes up.
    let sleeper = processes.iter().find(|p| p.name == stopped).unwrap();
    sleeper.signal("-STOP");
    tokio::time::sleep(TTL * 2).await;
    sleeper.signal("-CONT");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ended = Utc::now();

    // Shut the others down: they end their runs and take themselves out.
    for process in &mut processes {
        drop(process.child.stdin.take());
    }
    for process in &mut processes {
        let done = tokio::time::timeout(Duration::from_secs(20), process.child.wait()).await;
        assert!(done.is_ok(), "replica {} did not shut down", process.name);
    }

    // The tables are this test's own: every row and effect.
    let rows = history
        .runs_between(SCHEDULER, chrono::DateTime::UNIX_EPOCH, Utc::now())
        .await
        .unwrap();
    let effects: Vec<Effect> = sqlx::query(&format!(
        "SELECT job, tick_ms, instance, started_ms, ended_ms FROM {effects}"
    ))
    .fetch_all(history.pool())
    .await
    .unwrap()
    .iter()
    .map(|row| {
        (
            row.get("job"),
            row.get("tick_ms"),
            row.get("instance"),
            row.get("started_ms"),
            row.get("ended_ms"),
        )
    })
    .collect();

    // Each tick at most once (the history's key), with exactly one effect if it
    // succeeded and none otherwise.
    let mut by_tick: HashMap<(String, i64), Vec<&Effect>> = HashMap::new();
    for effect in &effects {
        by_tick
            .entry((effect.0.clone(), effect.1))
            .or_default()
            .push(effect);
    }
    for row in &rows {
        let found = by_tick
            .get(&(row.job.clone(), row.tick.timestamp_millis()))
            .map_or(0, Vec::len);
        let expected = usize::from(row.outcome == Outcome::Succeeded);
        assert_eq!(found, expected, "effects of {row:?}");
    }
    assert!(
        by_tick.values().all(|e| e.len() == 1),
        "a tick with two effects"
    );
    assert_eq!(
        effects.len(),
        rows.iter()
            .filter(|r| r.outcome == Outcome::Succeeded)
            .count(),
        "effects without a succeeded row"
    );

    // No overlap of one job's runs, cluster-wide.
    let mut by_job: BTreeMap<&str, Vec<(i64, i64, &str)>> = BTreeMap::new();
    for (job, _, instance, start, end) in &effects {
        by_job
            .entry(job)
            .or_default()
            .push((*start, *end, instance));
    }
    for (job, runs) in &mut by_job {
        runs.sort_unstable();
        for pair in runs.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "{job}: runs overlap: {pair:?}");
        }
    }

    // c took one run at a time.
    let mut on_c: Vec<(i64, i64)> = effects
        .iter()
        .filter(|e| e.2 == "c")
        .map(|e| (e.3, e.4))
        .collect();
    on_c.sort_unstable();
    for pair in on_c.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "c ran two at once: {pair:?}");
    }

    // Runs spread: every replica ran some.
    let mut per_replica: BTreeMap<&str, usize> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.outcome == Outcome::Succeeded) {
        *per_replica.entry(row.instance.as_str()).or_default() += 1;
    }
    eprintln!(
        "{} rows, {} effects; succeeded per replica: {per_replica:?}",
        rows.len(),
        effects.len()
    );
    for name in ["a", "b", "c"] {
        assert!(
            per_replica.get(name).is_some_and(|&n| n > 0),
            "{name} ran nothing: {per_replica:?}"
        );
    }

    // The killed replica's runs were closed by the leader's sweep.
    let left: Vec<_> = rows
        .iter()
        .filter(|r| r.outcome == Outcome::Running)
        .collect();
    assert!(left.is_empty(), "runs left running: {left:?}");
    assert!(
        left_by_the_dead > 0,
        "{killed}'s run seen going ended before the kill landed"
    );
    assert!(
        rows.iter()
            .any(|r| r.instance == killed && r.outcome == Outcome::Abandoned),
        "the run {killed} was killed in is not recorded abandoned"
    );

    // No tick lost: each second of each every-second job, from the start to the end,
    // has its row (run, abandoned, or skipped saying why).
    let (from, to) = (started.timestamp() + 1, ended.timestamp() - 2);
    for (job, cron, _) in JOBS.iter().filter(|(_, cron, _)| *cron == "* * * * * *") {
        let ticks: std::collections::HashSet<i64> = rows
            .iter()
            .filter(|r| r.job == *job)
            .map(|r| r.tick.timestamp())
            .collect();
        let missing: Vec<i64> = (from..=to).filter(|t| !ticks.contains(t)).collect();
        assert!(missing.is_empty(), "{job} ({cron}): no row for {missing:?}");
    }
}
