//! The README's main job: three scheduler replicas share two cron jobs; the leader is
//! killed mid-run and comes back; every tick runs exactly once.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin demo
//! ```
//!
//! Starts 5 local `redis-server` nodes (unless `REDLOCK_NODES` lists plain `redis://`
//! nodes, comma-separated), then 3 replicas of one service in this process, each in a
//! sandbox of its own (own runtime, own links to the nodes), declaring the same jobs: one
//! every second, one every 5 seconds, with the run history in a SQLite file. Mid-run the
//! leader is killed like a process (links cut, tasks dropped, nothing released); a
//! follower takes over when its lock expires and catches up the ticks missed meanwhile;
//! the killed replica is then started again and joins as a follower.
//!
//! Prints one line per tick from the history table (replica, lag, outcome) and ends with
//! `N ticks, each ran exactly once, fail-over took X ms`, computed from the history;
//! exits non-zero if a tick ran twice or not at all.
//!
//! While it runs it serves its metrics (the core's and the scheduler's) in Prometheus
//! text format at `http://DEMO_METRICS_ADDR/metrics` (`127.0.0.1:9464` by default, or a
//! free port if that one is taken), and prints the address first.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use metrics_exporter_prometheus::PrometheusHandle;
use redlock_admin::{Admin, AdminService};
use redlock_core::Redlock;
use redlock_examples::Nodes;
use redlock_scheduler::admin::SchedulerAdmin;
use redlock_scheduler::history::{Outcome, Run};
use redlock_scheduler::job::Misfire;
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use redlock_testkit::Sandbox;

const LEADER_TTL: Duration = Duration::from_secs(2);
const JOBS: [(&str, &str, u64); 2] = [
    ("every-second", "* * * * * *", 50),
    ("every-5s", "*/5 * * * * *", 300),
];

/// What each handler saw: (job, tick ms) → replicas that ran it.
type Record = Arc<Mutex<HashMap<(String, i64), Vec<String>>>>;

struct Replica {
    name: String,
    sandbox: Sandbox,
    scheduler: Scheduler,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn start_replica(
    name: &str,
    servers: &[SocketAddr],
    history: &str,
    record: &Record,
) -> Result<Replica, BoxError> {
    let sandbox = Sandbox::start_with(servers).await;
    let (urls, history, record, instance) = (
        sandbox.urls(),
        history.to_owned(),
        Arc::clone(record),
        name.to_owned(),
    );
    let scheduler = sandbox
        .run(async move {
            let redlock = Redlock::builder().nodes(urls).ttl(LEADER_TTL).build()?;
            // Fresh local nodes sit in restart quarantine for the max TTL.
            redlock_examples::wait_until_ready(&redlock).await;
            let mut builder = Scheduler::builder(redlock)
                .name("demo")
                .instance(instance)
                .leader_ttl(LEADER_TTL)
                .history(History::connect(&history).await?);
            for (job, cron, work_ms) in JOBS {
                let record = Arc::clone(&record);
                builder = builder.job(
                    Job::new(job, cron, move |ctx: JobContext| {
                        let record = Arc::clone(&record);
                        async move {
                            record
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .entry((ctx.job().to_owned(), ctx.tick().timestamp_millis()))
                                .or_default()
                                .push(ctx.instance().to_owned());
                            tokio::time::sleep(Duration::from_millis(work_ms)).await;
                            Ok::<_, std::convert::Infallible>(())
                        }
                    })
                    // Ticks missed during a fail-over run late rather than never.
                    .misfire(Misfire::CatchUp { max: 10 }),
                );
            }
            let scheduler = builder.build()?;
            scheduler.start();
            Ok::<_, BoxError>(scheduler)
        })
        .await?;
    Ok(Replica {
        name: name.to_owned(),
        sandbox,
        scheduler,
    })
}

fn leader(replicas: &[Replica]) -> Option<usize> {
    replicas
        .iter()
        .position(|r| !r.sandbox.is_crashed() && r.scheduler.leadership().is_some())
}

/// The leading replica, once there is one; an error if none leads within 30 s (the
/// nodes stopped answering).
async fn wait_for_leader(replicas: &[Replica]) -> Result<usize, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(i) = leader(replicas) {
            return Ok(i);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err("no replica took the lead within 30 s: are the Redis nodes still reachable?".into())
}

/// Serves the Prometheus page at `/metrics` and the admin dashboard at `/admin/` on
/// `DEMO_METRICS_ADDR`; returns the address it listens on.
async fn serve(prometheus: PrometheusHandle, admin: Admin) -> Result<SocketAddr, BoxError> {
    let listener = match std::env::var("DEMO_METRICS_ADDR") {
        Ok(addr) => tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| format!("cannot serve metrics on DEMO_METRICS_ADDR={addr}: {e}"))?,
        // The default port, or any free one if it is taken.
        Err(_) => match tokio::net::TcpListener::bind("127.0.0.1:9464").await {
            Ok(listener) => listener,
            Err(_) => tokio::net::TcpListener::bind("127.0.0.1:0").await?,
        },
    };
    let local = listener.local_addr()?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let page = prometheus.render();
                async move { ([("content-type", "text/plain; version=0.0.4")], page) }
            }),
        )
        .nest_service("/admin", AdminService::new(admin));
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            eprintln!("metrics endpoint stopped: {err}");
        }
    });
    Ok(local)
}

/// The admin dashboard over the demo's nodes and history: read-only, unless
/// `DEMO_ADMIN_TOKEN` gives the token its buttons need.
fn admin(redlock: &Redlock, history: &History) -> Result<Admin, BoxError> {
    let mut admin = Admin::builder()
        .redlock(redlock.clone())
        .scheduler(SchedulerAdmin::new(history.clone(), "demo"))
        .title("redlock demo");
    if let Ok(token) = std::env::var("DEMO_ADMIN_TOKEN") {
        admin = admin.allow_mutations(token);
    }
    Ok(admin.build()?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    redlock_examples::init_tracing();
    // Installed before the first lock operation, which keeps the metrics' handles.
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    redlock_core::telemetry::describe();
    redlock_scheduler::telemetry::describe();
    let nodes = Nodes::from_env_or_start(5).await;
    let probe = Redlock::builder()
        .nodes(nodes.urls())
        .ttl(LEADER_TTL)
        .build()?;
    let dir = tempfile::tempdir()?;
    let history_url = format!("sqlite://{}", dir.path().join("history.db").display());
    let history = History::connect(&history_url).await?;
    let addr = serve(prometheus, admin(&probe, &history)?).await?;
    println!("metrics: http://{addr}/metrics");
    println!("dashboard: http://{addr}/admin/");
    // The nodes as configured answer (or the program exits, naming them) before any
    // replica starts.
    redlock_examples::wait_until_ready(&probe).await;
    let servers = nodes.addrs();
    if servers.len() != nodes.urls().len() {
        return Err(format!(
            "the demo puts a proxy in front of each node, so it needs plain redis://host:port nodes; REDLOCK_NODES has {:?}",
            nodes.urls()
        )
        .into());
    }
    let record: Record = Arc::default();
    println!(
        "redlock demo: {}, 3 scheduler replicas, jobs every second and every 5 s, history in SQLite",
        nodes.describe()
    );

    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        replicas.push(start_replica(name, &servers, &history_url, &record).await?);
    }
    let first = wait_for_leader(&replicas).await?;
    let started = Utc::now();
    println!("  replica {} leads", replicas[first].name);
    tokio::time::sleep(Duration::from_secs(7)).await;

    // Kill the leader like a process: no release, its lock must expire. Between runs
    // (600 ms past a second: the jobs run 50 and 300 ms from the second), so that the
    // report can hold every tick to "ran exactly once" (a run killed midway is recorded
    // as abandoned, never run again: at most once).
    let past_second = u64::from(Utc::now().timestamp_subsec_millis());
    tokio::time::sleep(Duration::from_millis((1_600 - past_second) % 1_000)).await;
    let dead = wait_for_leader(&replicas).await?;
    let dead_name = replicas[dead].name.clone();
    replicas[dead].sandbox.crash();
    let killed = Instant::now();
    println!("  killed the leader, replica {dead_name}");
    let next = wait_for_leader(&replicas).await?;
    println!(
        "  replica {} leads after {} ms (leadership TTL {} ms)",
        replicas[next].name,
        killed.elapsed().as_millis(),
        LEADER_TTL.as_millis()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    replicas[dead] = start_replica(&dead_name, &servers, &history_url, &record).await?;
    println!("  replica {dead_name} restarted, following");
    tokio::time::sleep(Duration::from_secs(5)).await;
    for replica in replicas.iter().filter(|r| !r.sandbox.is_crashed()) {
        let scheduler = replica.scheduler.clone();
        replica
            .sandbox
            .run(async move { scheduler.shutdown(Duration::from_secs(5)).await })
            .await;
    }
    let ended = Utc::now();

    // The report, from the history table.
    let rows = history.runs_between("demo", started, ended).await?;
    println!(
        "\n{:<24} {:<13} {:<8} {:>8}  outcome",
        "tick (UTC)", "job", "replica", "lag ms"
    );
    for run in &rows {
        let lag = run.started.map_or(String::from("-"), |s| {
            (s - run.tick).num_milliseconds().to_string()
        });
        println!(
            "{:<24} {:<13} {:<8} {:>8}  {}{}",
            run.tick.format("%H:%M:%S%.3f"),
            run.job,
            run.instance,
            lag,
            run.outcome.as_str(),
            run.error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
    }
    let problems = check(&rows, &record, &dead_name, started, ended);
    let failover = failover_ms(&rows, &dead_name);
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("VIOLATION: {problem}");
        }
        std::process::exit(1);
    }
    println!(
        "\n{} ticks, each ran exactly once, fail-over took {} ms",
        rows.len(),
        failover.map_or_else(|| "?".to_owned(), |ms| ms.to_string())
    );
    Ok(())
}

/// Every tick of every job in the run (but its first and last seconds) has exactly one
/// row, succeeded (or still `running` if the killed leader was running it), and was run
/// by exactly that replica.
fn check(
    rows: &[Run],
    record: &Record,
    dead: &str,
    started: DateTime<Utc>,
    ended: DateTime<Utc>,
) -> Vec<String> {
    let record = record
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut problems = Vec::new();
    for ((job, tick), replicas) in record.iter() {
        if replicas.len() != 1 {
            problems.push(format!("{job} tick {tick} ran on {replicas:?}"));
        }
    }
    let by_tick: HashMap<(&str, i64), &Run> = rows
        .iter()
        .map(|r| ((r.job.as_str(), r.tick.timestamp_millis()), r))
        .collect();
    for (job, cron, _) in JOBS {
        let Ok(schedule) = redlock_scheduler::time::Schedule::parse(cron, "UTC") else {
            problems.push(format!("{job}: invalid cron {cron}"));
            continue;
        };
        let from = started + chrono::Duration::seconds(1);
        let to = ended - chrono::Duration::seconds(1);
        for tick in schedule.ticks_between(from, to) {
            let ms = tick.timestamp_millis();
            match by_tick.get(&(job, ms)) {
                None => problems.push(format!("{job} tick {tick} never ran")),
                // Started by the leader that was killed: it ran once, cut short.
                Some(run) if run.outcome == Outcome::Running && run.instance == dead => {}
                Some(run) if run.outcome != Outcome::Succeeded => {
                    problems.push(format!("{job} tick {tick}: {:?}", run.outcome));
                }
                Some(run) => {
                    let ran = record.get(&(job.to_owned(), ms));
                    if ran.map(|r| r.as_slice()) != Some(std::slice::from_ref(&run.instance)) {
                        problems.push(format!(
                            "{job} tick {tick}: history says {}, handler saw {ran:?}",
                            run.instance
                        ));
                    }
                }
            }
        }
    }
    problems
}

/// From the dead leader's last run to the first run of its successor (every-second job).
fn failover_ms(rows: &[Run], dead: &str) -> Option<i64> {
    let mut runs: Vec<&Run> = rows
        .iter()
        .filter(|r| r.job == "every-second" && r.started.is_some())
        .collect();
    runs.sort_by_key(|r| r.started);
    runs.windows(2)
        .rev()
        .find(|pair| pair[0].instance == dead && pair[1].instance != dead)
        .and_then(|pair| Some((pair[1].started? - pair[0].started?).num_milliseconds()))
}
