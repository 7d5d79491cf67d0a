//! The scheduler at fleet scale: runs spread over replica processes.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin scheduler_fleet [-- SECONDS REPLICAS JOBS]
//! ```
//!
//! `REPLICAS` processes (default 4, this program with `--replica`) declare `JOBS` jobs
//! (default 5,000), job `i` on the cron `i%10/10 * * * * *`: a tenth of them are due
//! every second (500 a second by default), each run sleeping 50 ms. The history is the
//! PostgreSQL at `BENCH_HISTORY_URL` (or `DATABASE_URL`), in tables of this run's own;
//! 3 local `redis-server` nodes are started unless `REDLOCK_NODES` lists nodes.
//!
//! After 5 s of warm-up it measures for `SECONDS` (default 30); halfway, one replica
//! that does not lead is killed with `SIGKILL` while its runs go on. Every run appends
//! its tick to its replica's log file (the record outside the library). Then it prints:
//!
//! - tick lag (run start minus scheduled tick, from the history) p50 / p90 / p99 / max,
//!   over the window, over its steady part (all but the ticks from the kill's second
//!   until the dead replica's locks expired) and over those ticks;
//! - each tick due in the window: run once (history and logs), never twice, none lost
//!   (succeeded, or closed as abandoned by the kill, or skipped saying why);
//! - runs per replica before the kill and after it (once its locks expired), against
//!   an even share.

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::Redlock;
use redlock_examples::Nodes;
use redlock_scheduler::history::Outcome;
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SCHEDULER: &str = "fleet";
const TTL: Duration = Duration::from_secs(2);
const WORK: Duration = Duration::from_millis(50);
const WARM_UP: Duration = Duration::from_secs(5);

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn lags(label: &str, mut lags: Vec<i64>) {
    lags.sort_unstable();
    println!(
        "tick lag {label}: {} runs, p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
        lags.len(),
        percentile(&lags, 0.5),
        percentile(&lags, 0.9),
        percentile(&lags, 0.99),
        lags.last().copied().unwrap_or(0)
    );
}

/// A replica process: runs what the leader hands it, logs each run's tick, until its
/// standard input closes.
async fn replica(instance: String) -> Result<(), BoxError> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let urls: Vec<String> = var("FLEET_NODES").split(',').map(str::to_owned).collect();
    let jobs: usize = var("FLEET_JOBS").parse()?;
    let redlock = Redlock::builder()
        .nodes(urls)
        .restart_quarantine(std::env::var("REDLOCK_NODES").is_ok())
        .ttl(TTL)
        .build()?;
    let history = History::builder(var("FLEET_HISTORY"))
        .table_prefix(var("FLEET_PREFIX"))
        .max_connections(16)
        .connect()
        .await?;
    let (log, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(var("FLEET_LOG"))
        .await?;
    // One writer: each run's line, written (not buffered) before the next.
    tokio::spawn(async move {
        while let Some(line) = lines.recv().await {
            let _ = file.write_all(line.as_bytes()).await;
        }
    });
    let mut builder = Scheduler::builder(redlock)
        .name(SCHEDULER)
        .instance(instance)
        .history(history)
        .leader_ttl(TTL)
        .retry_interval(Duration::from_millis(100))
        .max_concurrent_runs(200);
    for i in 0..jobs {
        let log = log.clone();
        builder = builder.job(Job::new(
            format!("job-{i}"),
            format!("{}/10 * * * * *", i % 10),
            move |ctx: JobContext| {
                let line = format!("{} {}\n", ctx.job(), ctx.tick().timestamp_millis());
                let _ = log.send(line);
                async move {
                    tokio::time::sleep(WORK).await;
                    Ok::<_, std::convert::Infallible>(())
                }
            },
        ));
    }
    let scheduler = builder.build()?;
    scheduler.wait_ready(Duration::from_secs(30)).await?;
    scheduler.start();
    println!("started");
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    while stdin.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    scheduler.shutdown(Duration::from_secs(10)).await;
    Ok(())
}

struct Replica {
    name: String,
    child: Child,
    log: std::path::PathBuf,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--replica") {
        return replica(args.get(1).cloned().unwrap_or_default()).await;
    }
    let seconds: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(30);
    let count: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let jobs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5_000);
    let url = std::env::var("BENCH_HISTORY_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .map_err(|_| "set BENCH_HISTORY_URL or DATABASE_URL to a PostgreSQL URL")?;
    let nodes = Nodes::from_env_or_start(3).await;
    let prefix = format!("fleet_{}_", std::process::id());
    let history = History::builder(&url)
        .table_prefix(&prefix)
        .connect()
        .await?;
    let dir = tempfile::tempdir()?;
    println!(
        "{count} replica processes, {jobs} jobs ({} due a second), runs of {} ms; nodes: {}",
        jobs / 10,
        WORK.as_millis(),
        nodes.describe()
    );
    let mut replicas = Vec::new();
    for i in 0..count {
        let name = format!("r{i}");
        let log = dir.path().join(format!("{name}.log"));
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--replica", &name])
            .env("FLEET_NODES", nodes.urls().join(","))
            .env("FLEET_JOBS", jobs.to_string())
            .env("FLEET_HISTORY", &url)
            .env("FLEET_PREFIX", &prefix)
            .env("FLEET_LOG", &log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        while let Some(line) = lines.next_line().await? {
            if line.contains("started") {
                break;
            }
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        replicas.push(Replica { name, child, log });
    }
    tokio::time::sleep(WARM_UP).await;
    let from = Utc::now();
    tokio::time::sleep(Duration::from_secs(seconds / 2)).await;
    // Kill a replica that does not lead, with its runs going.
    let leader = history_leader(&history).await;
    let victim = replicas
        .iter()
        .position(|r| Some(&r.name) != leader.as_ref())
        .ok_or("no replica to kill")?;
    // 20 ms after a second's ticks: its runs (50 ms) are going.
    let now = Utc::now().timestamp_millis();
    let at = (now.div_euclid(1000) + 1) * 1000 + 20;
    tokio::time::sleep(Duration::from_millis(u64::try_from(at - now).unwrap_or(0))).await;
    let killed_at = Utc::now();
    let killed = replicas[victim].name.clone();
    std::process::Command::new("kill")
        .args([
            "-KILL",
            &replicas[victim].child.id().unwrap_or(0).to_string(),
        ])
        .status()?;
    println!("killed {killed} (SIGKILL) at {killed_at}; leader {leader:?}");
    tokio::time::sleep(Duration::from_secs(seconds - seconds / 2)).await;
    let to = Utc::now();
    for replica in &mut replicas {
        drop(replica.child.stdin.take());
    }
    for replica in &mut replicas {
        let _ = tokio::time::timeout(Duration::from_secs(30), replica.child.wait()).await;
    }
    report(&history, &replicas, from, to, &killed, killed_at, jobs).await
}

async fn history_leader(history: &History) -> Option<String> {
    let admin = redlock_scheduler::admin::SchedulerAdmin::new(history.clone(), SCHEDULER);
    admin.leader().await.ok().flatten().map(|l| l.instance)
}

async fn report(
    history: &History,
    replicas: &[Replica],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    killed: &str,
    killed_at: DateTime<Utc>,
    jobs: usize,
) -> Result<(), BoxError> {
    // Ticks due in the window whose time has come long enough before its end.
    let to = to - chrono::Duration::seconds(2);
    let rows = history.runs_between(SCHEDULER, from, to).await?;
    let due = {
        let first = from.timestamp_millis().div_euclid(1000) + 1;
        let last = to.timestamp_millis().div_euclid(1000);
        usize::try_from(last - first + 1).unwrap_or(0) * jobs / 10
    };
    let mut executions: HashMap<(String, i64), usize> = HashMap::new();
    for replica in replicas {
        let text = tokio::fs::read_to_string(&replica.log)
            .await
            .unwrap_or_default();
        for line in text.lines() {
            if let Some((job, tick)) = line.split_once(' ')
                && let Ok(tick) = tick.parse::<i64>()
                && tick >= from.timestamp_millis()
                && tick <= to.timestamp_millis()
            {
                *executions.entry((job.to_owned(), tick)).or_default() += 1;
            }
        }
    }
    let twice = executions.values().filter(|&&n| n > 1).count();
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &rows {
        *outcomes.entry(row.outcome.as_str()).or_default() += 1;
    }
    println!(
        "window {from} .. {to}: {due} ticks due, {} rows {outcomes:?}, {} ticks run (logs), {twice} run twice, {} missing",
        rows.len(),
        executions.len(),
        due.saturating_sub(rows.len())
    );
    let lag_of = |row: &redlock_scheduler::history::Run| {
        row.started
            .map(|started| (started - row.tick).num_milliseconds())
    };
    lags("(whole window)", rows.iter().filter_map(lag_of).collect());
    // Steady state: the ticks before the second of the kill, and those from when the
    // dead replica's locks and hand-offs are gone (its run locks' TTL after the kill).
    let kill_second = DateTime::from_timestamp(killed_at.timestamp(), 0).unwrap_or(killed_at);
    let recovered = kill_second + chrono::Duration::from_std(TTL + Duration::from_secs(1))?;
    let steady = |r: &&redlock_scheduler::history::Run| r.tick < kill_second || r.tick >= recovered;
    lags(
        "(steady: all but the ticks of the kill)",
        rows.iter().filter(steady).filter_map(lag_of).collect(),
    );
    lags(
        &format!("(the ticks from the kill's second to {recovered})"),
        rows.iter()
            .filter(|r| !steady(r))
            .filter_map(lag_of)
            .collect(),
    );
    for (label, before) in [("before the kill", true), ("after the kill", false)] {
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for row in rows
            .iter()
            .filter(|r| r.outcome == Outcome::Succeeded)
            .filter(|r| {
                if before {
                    r.tick < kill_second
                } else {
                    r.tick >= recovered
                }
            })
        {
            *per.entry(row.instance.as_str()).or_default() += 1;
        }
        if !before {
            per.remove(killed);
        }
        let total: usize = per.values().sum();
        let even = total as f64 / per.len().max(1) as f64;
        let worst = per
            .values()
            .map(|&n| ((n as f64 - even) / even).abs())
            .fold(0.0, f64::max);
        println!(
            "runs per replica {label}: {per:?}; even share {even:.0}, furthest {:.1} % from it",
            100.0 * worst
        );
    }
    Ok(())
}
