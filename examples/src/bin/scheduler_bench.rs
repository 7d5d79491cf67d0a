//! The scheduler at scale: tick lag and CPU with 1,000 jobs on one leader, and fail-over
//! time after `kill -9` of the leading process.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin scheduler_bench [-- SECONDS KILLS]
//! ```
//!
//! 1. **Lag**: one replica leads 1,000 jobs (100 every second, 900 every minute spread
//!    over the seconds of the minute: 115 ticks a second), with its history in a SQLite
//!    file (or at `BENCH_HISTORY_URL`, e.g. a PostgreSQL URL), for `SECONDS` (default
//!    30). Each handler notes how late it started (now minus its scheduled tick).
//!    Prints p50 / p90 / p99 / max lag and the process's CPU time over the window, as a
//!    share of one core (the Redis nodes are processes of their own).
//! 2. **Fail-over**: three replica processes (this program with `--replica`), leadership
//!    TTL 2 s, retry interval 100 ms. `KILLS` times (default 10): SIGKILL the leader, time
//!    until another process reports it leads, start a replacement. Prints each time and
//!    the maximum against TTL + one retry interval.
//!
//! Starts 3 local `redis-server` nodes unless `REDLOCK_NODES` lists nodes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use redlock_core::Redlock;
use redlock_examples::Nodes;
use redlock_scheduler::{History, Job, JobContext, Scheduler};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const LEADER_TTL: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(100);

fn redlock(urls: Vec<String>) -> Result<Redlock, BoxError> {
    Ok(Redlock::builder()
        .nodes(urls)
        // Nodes started for the run are seconds old; with REDLOCK_NODES, wait_ready
        // below waits the quarantine out.
        .restart_quarantine(std::env::var("REDLOCK_NODES").is_ok())
        .ttl(LEADER_TTL)
        .build()?)
}

/// This process's CPU time (user + system) so far.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is the 14th field.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn lag(urls: Vec<String>, seconds: u64) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let url = std::env::var("BENCH_HISTORY_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("h.db").display()));
    let history = History::connect(&url).await?;
    let lags = Arc::new(Mutex::new(Vec::<i64>::with_capacity(200_000)));
    let redlock = redlock(urls)?;
    redlock_examples::wait_until_ready(&redlock).await;
    let mut builder = Scheduler::builder(redlock)
        .name(format!("bench-{}", std::process::id()))
        .leader_ttl(LEADER_TTL)
        .retry_interval(RETRY)
        .history(history);
    for i in 0..1000 {
        let expression = if i < 100 {
            "* * * * * *".to_owned()
        } else {
            format!("{} * * * * *", i % 60)
        };
        let lags = Arc::clone(&lags);
        builder = builder.job(Job::new(
            format!("job-{i}"),
            expression,
            move |ctx: JobContext| {
                let lags = Arc::clone(&lags);
                async move {
                    let lag = (Utc::now() - ctx.tick()).num_milliseconds();
                    lags.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(lag);
                    Ok::<_, std::convert::Infallible>(())
                }
            },
        ));
    }
    let scheduler = builder.build()?;
    scheduler.wait_ready(Duration::from_secs(30)).await?;
    scheduler.start();
    while scheduler.leadership().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Warm up, then measure.
    tokio::time::sleep(Duration::from_secs(3)).await;
    lags.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (cpu, wall) = (cpu_time() - cpu0, wall0.elapsed());
    let mut sorted = lags
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    scheduler.shutdown(Duration::from_secs(5)).await;
    sorted.sort_unstable();
    println!(
        "lag: {} runs in {:.1} s ({:.0}/s): p50 {} ms, p90 {} ms, p99 {} ms, max {} ms; CPU {:.1}% of one core",
        sorted.len(),
        wall.as_secs_f64(),
        sorted.len() as f64 / wall.as_secs_f64(),
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.9),
        percentile(&sorted, 0.99),
        sorted.last().copied().unwrap_or(0),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
    );
    Ok(())
}

/// A replica process: leads when elected, says so on stdout.
async fn replica(urls: Vec<String>, instance: String) -> Result<(), BoxError> {
    let scheduler = Scheduler::builder(redlock(urls)?)
        .name("bench-failover")
        .instance(instance.clone())
        .leader_ttl(LEADER_TTL)
        .retry_interval(RETRY)
        .job(Job::new("noop", "* * * * * *", |_ctx: JobContext| async {
            Ok::<_, std::convert::Infallible>(())
        }))
        .build()?;
    scheduler.start();
    let Some(mut events) = scheduler.leader_events() else {
        return Err("no election".into());
    };
    loop {
        if let redlock_scheduler::leader::LeaderEvent::Elected(l) = &*events.borrow_and_update() {
            println!("LEADER {instance} {}", l.epoch());
        }
        events.changed().await?;
    }
}

struct Process {
    child: Child,
}

fn spawn(
    urls: &[String],
    instance: &str,
    tx: tokio::sync::mpsc::UnboundedSender<(String, Instant)>,
) -> Result<Process, BoxError> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--replica", instance, &urls.join(",")])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix("LEADER ") {
                let who = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let _ = tx.send((who, Instant::now()));
            }
        }
    });
    Ok(Process { child })
}

async fn failover(urls: Vec<String>, kills: usize) -> Result<(), BoxError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut processes: Vec<(String, Process)> = Vec::new();
    for i in 0..3 {
        let name = format!("r{i}");
        processes.push((name.clone(), spawn(&urls, &name, tx.clone())?));
    }
    let (mut leader, _) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await?
        .ok_or("no leader")?;
    let mut times = Vec::new();
    for k in 0..kills {
        // Let the leader settle (its lock extended a few times).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        while rx.try_recv().is_ok() {}
        let index = processes
            .iter()
            .position(|(n, _)| *n == leader)
            .ok_or("leader not found")?;
        let (_, mut process) = processes.remove(index);
        let killed_at = Instant::now();
        process.child.start_kill()?;
        let _ = process.child.wait().await;
        let (next, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await?
            .ok_or("no new leader")?;
        let took = at - killed_at;
        println!(
            "kill {}: {leader} → {next} in {} ms",
            k + 1,
            took.as_millis()
        );
        times.push(took);
        leader = next;
        let name = format!("r{}", 3 + k);
        processes.push((name.clone(), spawn(&urls, &name, tx.clone())?));
    }
    let max = times.iter().max().copied().unwrap_or_default();
    println!(
        "fail-over: max {} ms over {} kills; bound TTL + retry interval = {} ms",
        max.as_millis(),
        times.len(),
        (LEADER_TTL + RETRY).as_millis()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--replica") {
        let instance = args.get(1).cloned().unwrap_or_default();
        let urls = args
            .get(2)
            .map(|u| u.split(',').map(str::to_owned).collect())
            .unwrap_or_default();
        return replica(urls, instance).await;
    }
    let seconds = args.first().and_then(|s| s.parse().ok()).unwrap_or(30);
    let kills = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let nodes = Nodes::from_env_or_start(3).await;
    lag(nodes.urls(), seconds).await?;
    failover(nodes.urls(), kills).await?;
    Ok(())
}
