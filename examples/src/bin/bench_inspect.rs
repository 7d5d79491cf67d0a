//! Benchmark: listing held locks (`Redlock::locks`) against the target of 10,000 locks
//! over 5 nodes in under a second.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin bench_inspect
//! ```
//!
//! Starts 5 local `redis-server` nodes (or uses `REDLOCK_NODES`), takes `BENCH_LOCKS`
//! locks (default 10,000; fencing on, so every lock also has a counter key), then lists
//! them all `BENCH_RUNS` times (default 5) and prints each listing's time, and beside it
//! the floor: one `SCAN` of one node's whole key space by the same pages, with nothing
//! else asked.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redlock_core::Redlock;
use redlock_examples::Nodes;
use redlock_examples::measure::{fmt_us, verdict};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    redlock_examples::init_tracing();
    let count: usize = env("BENCH_LOCKS", 10_000);
    let runs: usize = env("BENCH_RUNS", 5);
    let nodes = Nodes::from_env_or_start(5).await;
    println!("redlock bench_inspect: {}, {count} locks", nodes.describe());
    let redlock = Redlock::builder()
        .nodes(nodes.urls())
        .fencing(true)
        .holder("bench")
        .ttl(Duration::from_secs(120))
        // The nodes started for the run would sit in quarantine for the 2-minute TTL;
        // the benchmark measures reads, not safety across restarts.
        .restart_quarantine(false)
        .build()?;
    redlock_examples::wait_until_ready(&redlock).await;

    let started = Instant::now();
    let locks: Vec<_> = futures_util::stream::iter(0..count)
        .map(|i| {
            let redlock = redlock.clone();
            async move { redlock.try_lock(format!("bench-inspect:{i:06}")).await }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    let locks: Vec<_> = locks.into_iter().collect::<Result<_, _>>()?;
    println!(
        "took {} locks in {:.2} s",
        locks.len(),
        started.elapsed().as_secs_f64()
    );

    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let listing = redlock.locks("bench-inspect:").limit(count).await?;
        let took = started.elapsed();
        if listing.locks.len() != count || !listing.failures.is_empty() {
            return Err(format!(
                "listed {} of {count} locks, {} nodes failed",
                listing.locks.len(),
                listing.failures.len()
            )
            .into());
        }
        times.push(took);
    }
    times.sort();
    let floor = scan_floor(&nodes.urls()[0]).await?;
    let median = times[times.len() / 2];
    println!(
        "list {count} locks over {} nodes: median {}, best {}, worst {}",
        nodes.urls().len(),
        fmt_us(median),
        fmt_us(times[0]),
        fmt_us(times[times.len() - 1])
    );
    println!(
        "floor: SCAN of one node's keys alone: {} (listing / floor = {:.1})",
        fmt_us(floor),
        median.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "target: {count} locks listed in under 1 s: {}",
        verdict(median < Duration::from_secs(1))
    );
    drop(locks);
    Ok(())
}

/// One full `SCAN` of a node, in pages of 2000, matching every key.
async fn scan_floor(url: &str) -> Result<Duration, Box<dyn std::error::Error>> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let started = Instant::now();
    let mut cursor: u64 = 0;
    loop {
        let (next, _keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(2000)
            .query_async(&mut conn)
            .await?;
        if next == 0 {
            return Ok(started.elapsed());
        }
        cursor = next;
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}
