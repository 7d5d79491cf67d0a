//! The lock itself: competing clients on one resource, and proof that they never
//! overlapped.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin locks
//! ```
//!
//! Starts 5 local `redis-server` nodes (unless `REDLOCK_NODES` lists some, comma-separated),
//! then 5 independent clients (separate connections, like 5 replicas of a service) with
//! 4 tasks each contend for one account. Each holder does a read-modify-write on a shared
//! balance with a pause in between: without mutual exclusion updates would be lost. With
//! local nodes, one node is frozen (`SIGSTOP`) for a second mid-run to show that a
//! minority fault does not stop the lock.
//!
//! Prints acquisitions, contention, wait times, and the overlap check; exits non-zero if
//! any two holds overlapped or an update was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{Redlock, RetryPolicy};
use redlock_examples::Nodes;
use tokio::sync::Mutex;

const CLIENTS: usize = 5;
const TASKS: usize = 4;
const PER_TASK: usize = 25;
const RESOURCE: &str = "demo:account:42";

struct Hold {
    client: usize,
    start: Instant,
    end: Instant,
    waited: Duration,
    attempts: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    redlock_examples::init_tracing();
    let nodes = Nodes::from_env_or_start(5).await;
    let urls = nodes.urls();

    let clients: Vec<Redlock> = (0..CLIENTS)
        .map(|_| {
            Redlock::builder()
                .nodes(urls.clone())
                .ttl(Duration::from_secs(2))
                .node_timeout(Duration::from_millis(50))
                .retry(
                    RetryPolicy::deadline(Duration::from_secs(30))
                        .with_delay(Duration::from_millis(2), Duration::from_millis(8)),
                )
                .build()
        })
        .collect::<Result<_, _>>()?;
    println!(
        "redlock demo: {} (quorum {}), {CLIENTS} clients x {TASKS} tasks contend for `{RESOURCE}`",
        nodes.describe(),
        clients[0].quorum()
    );
    for client in &clients {
        redlock_examples::wait_until_ready(client).await;
    }

    // The "account" lives outside Redis; the lock is all that protects it.
    let balance = Arc::new(AtomicU64::new(0));
    let holds = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, redlock) in clients.iter().enumerate() {
        for _ in 0..TASKS {
            let (redlock, balance, holds) = (redlock.clone(), balance.clone(), holds.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..PER_TASK {
                    let asked = Instant::now();
                    let lock = redlock.lock(RESOURCE).await?;
                    let start = Instant::now();
                    // Read, think, write: a lost update if anyone else ran meanwhile.
                    let read = balance.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    balance.store(read + 1, Ordering::SeqCst);
                    let end = Instant::now();
                    if end >= lock.valid_until() {
                        return Err(format!("held past validity by client {c}").into());
                    }
                    holds.lock().await.push(Hold {
                        client: c,
                        start,
                        end,
                        waited: start - asked,
                        attempts: lock.attempts(),
                    });
                    lock.release().await?;
                }
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }));
        }
    }

    // A minority fault mid-run: freeze one node for a second.
    if let Nodes::Local(cluster) = &nodes {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.node(2).pause();
        println!(
            "  t={:>5} ms  node 3 of 5 frozen (SIGSTOP)",
            started.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        cluster.node(2).resume();
        println!(
            "  t={:>5} ms  node 3 of 5 resumed",
            started.elapsed().as_millis()
        );
    }
    for task in tasks {
        task.await?.map_err(|e| e.to_string())?;
    }
    let elapsed = started.elapsed();

    let mut holds = std::mem::take(&mut *holds.lock().await);
    holds.sort_by_key(|h| h.start);
    let overlaps = holds.windows(2).filter(|w| w[1].start < w[0].end).count();
    let contended = holds.iter().filter(|h| h.attempts > 1).count();
    let attempts: u64 = holds.iter().map(|h| u64::from(h.attempts)).sum();
    let mut waits: Vec<Duration> = holds.iter().map(|h| h.waited).collect();
    let [p50, p99, max] = redlock_examples::measure::quantiles(&mut waits, [0.5, 0.99, 1.0]);
    let mut per_client = [0usize; CLIENTS];
    for h in &holds {
        per_client[h.client] += 1;
    }
    let expected = (CLIENTS * TASKS * PER_TASK) as u64;
    let final_balance = balance.load(Ordering::SeqCst);

    println!(
        "acquisitions:       {} in {:.2} s ({:.0}/s)",
        holds.len(),
        elapsed.as_secs_f64(),
        holds.len() as f64 / elapsed.as_secs_f64()
    );
    println!(
        "contention:         {contended} acquisitions had to retry; {attempts} attempts in all"
    );
    println!(
        "wait for the lock:  p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(p50),
        ms(p99),
        ms(max)
    );
    println!("per client:         {per_client:?}");
    println!(
        "balance:            {final_balance} of {expected} increments (lost updates: {})",
        expected - final_balance.min(expected)
    );
    println!("overlapping holds:  {overlaps}");
    if overlaps > 0 || final_balance != expected {
        println!("MUTUAL EXCLUSION VIOLATED");
        std::process::exit(1);
    }
    println!("ok: every hold was exclusive");
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
