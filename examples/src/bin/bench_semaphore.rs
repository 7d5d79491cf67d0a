//! Benchmark: an uncontended semaphore permit cycle and read-write lock cycles against a
//! mutex cycle, on the same nodes in one run.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin bench_semaphore
//! BENCH_CONCURRENCY=32 cargo run --release -p redlock-examples --bin bench_semaphore
//! ```
//!
//! Starts 5 local `redis-server` nodes (or uses `REDLOCK_NODES`). Clients
//! (`BENCH_CONCURRENCY`, default 1) run, interleaved in short slices:
//! - `mutex`: `redlock.lock(key)` + `release()`, a distinct key per cycle;
//! - `permit`: `semaphore.acquire()` + `release()` on a semaphore of 64 permits per
//!   client (uncontended: a free slot is found at the first attempt), a distinct
//!   semaphore per client;
//! - `read`: `rw.read()` + `release()` on a read-write lock that every client reads at
//!   once (readers share: uncontended);
//! - `write`: `rw.write()` + `release()`, a read-write lock per client.
//!
//! Prints cycles/s, p50, p99 and CPU per cycle (this process; the Redis servers), each
//! cycle over the mutex cycle at p50 and in the servers' CPU (targets: a permit <= 1.5,
//! a read lock <= 1.3), and what a cycle costs one node: the commands it runs (scripts
//! and the commands inside them, from `INFO commandstats`) and the time spent in them.
//! `BENCH_SECS` sets each workload's duration (default 3).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use redlock_core::Redlock;
use redlock_core::rwlock::RwLock;
use redlock_core::semaphore::Semaphore;
use redlock_examples::Nodes;
use redlock_examples::measure::{closed_loop, header, interleave, verdict};

/// Per command: calls and microseconds, summed over the nodes.
type CommandStats = BTreeMap<String, (u64, f64)>;

/// Every node's `INFO commandstats`, summed.
async fn command_stats(conns: &[MultiplexedConnection]) -> CommandStats {
    let mut sum = CommandStats::new();
    for conn in conns {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn.clone())
            .await
            .unwrap_or_default();
        for line in info.lines() {
            let Some((name, fields)) = line
                .strip_prefix("cmdstat_")
                .and_then(|rest| rest.split_once(':'))
            else {
                continue;
            };
            let (mut calls, mut usec) = (0, 0.0);
            for field in fields.split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => calls = v.parse().unwrap_or(0),
                    Some(("usec", v)) => usec = v.parse().unwrap_or(0.0),
                    _ => {}
                }
            }
            let entry = sum.entry(name.to_owned()).or_default();
            entry.0 += calls;
            entry.1 += usec;
        }
    }
    sum
}

fn concurrency() -> usize {
    std::env::var("BENCH_CONCURRENCY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

#[derive(Debug, Clone, Copy)]
enum Workload {
    Mutex,
    Permit,
    Read,
    Write,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    redlock_examples::init_tracing();
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let nodes = Nodes::from_env_or_start(5).await;
    let redlock = Redlock::builder().nodes(nodes.urls()).build()?;
    redlock_examples::wait_until_ready(&redlock).await;
    let mut conns = Vec::new();
    for url in nodes.urls() {
        conns.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    let clients = concurrency();
    let semaphores: Arc<Vec<Semaphore>> = Arc::new(
        (0..clients)
            .map(|c| redlock.semaphore(format!("bench:sem:{c}"), 64))
            .collect::<Result<_, _>>()?,
    );
    let shared_rw = redlock.rw_lock("bench:rw:shared")?;
    let own_rw: Arc<Vec<RwLock>> = Arc::new(
        (0..clients)
            .map(|c| redlock.rw_lock(format!("bench:rw:{c}")))
            .collect::<Result<_, _>>()?,
    );
    println!(
        "bench_semaphore: {}, {clients} concurrent clients, {secs} s per workload in 6 interleaved slices",
        nodes.describe()
    );
    let workloads = [
        Workload::Mutex,
        Workload::Permit,
        Workload::Read,
        Workload::Write,
    ];
    let slice = Duration::from_secs_f64(secs / 6.0);
    let run = |workload: Workload| {
        let (redlock, semaphores) = (redlock.clone(), Arc::clone(&semaphores));
        let (shared_rw, own_rw) = (shared_rw.clone(), Arc::clone(&own_rw));
        closed_loop(clients, slice, move |client, i| {
            let (redlock, semaphores) = (redlock.clone(), Arc::clone(&semaphores));
            let (shared_rw, own_rw) = (shared_rw.clone(), Arc::clone(&own_rw));
            async move {
                match workload {
                    Workload::Mutex => {
                        let lock = redlock.lock(format!("bench:mutex:{client}:{i}")).await?;
                        lock.release().await?;
                    }
                    Workload::Permit => {
                        let permit = semaphores[client].acquire().await?;
                        permit.release().await?;
                    }
                    Workload::Read => {
                        let read = shared_rw.read().await?;
                        read.release().await?;
                    }
                    Workload::Write => {
                        let write = own_rw[client].write().await?;
                        write.release().await?;
                    }
                }
                Ok(())
            }
        })
    };
    for workload in workloads {
        run(workload)
            .await
            .map_err(|e| e as Box<dyn std::error::Error>)?; // warm up
    }
    let mut stats: Vec<CommandStats> = vec![BTreeMap::new(); workloads.len()];
    let mut tallies = interleave(&workloads, 6, &conns, async |w| {
        let before = command_stats(&conns).await;
        let result = run(w).await;
        let after = command_stats(&conns).await;
        for (name, (calls, usec)) in after {
            let (calls_before, usec_before) = before.get(&name).copied().unwrap_or_default();
            let sum = stats[w as usize].entry(name).or_default();
            sum.0 += calls.saturating_sub(calls_before);
            sum.1 += usec - usec_before;
        }
        result
    })
    .await
    .map_err(|e| e as Box<dyn std::error::Error>)?;
    println!("\n{}", header(&format!("workload (c={clients})")));
    let (mutex_p50, _) = tallies[0].p50_p99();
    let labels = [
        "mutex: lock + release",
        "permit: acquire + release (64 permits)",
        "read lock: read + release (shared)",
        "write lock: write + release",
    ];
    for (tally, label) in tallies.iter_mut().zip(labels) {
        println!("{}", tally.row(label));
    }
    println!();
    for (i, what) in [(1, "permit"), (2, "read lock"), (3, "write lock")] {
        let (p50, _) = tallies[i].p50_p99();
        let ratio = p50.as_secs_f64() / mutex_p50.as_secs_f64();
        let target = match i {
            1 => format!(" (target <= 1.5: {})", verdict(ratio <= 1.5)),
            2 => format!(" (target <= 1.3: {})", verdict(ratio <= 1.3)),
            _ => String::new(),
        };
        println!(
            "{what} cycle / mutex cycle at p50: {ratio:.2}{target}; in servers' CPU: {:.2}",
            tallies[i].server_us() / tallies[0].server_us()
        );
    }
    // A script's time includes the commands it runs, which are also counted on their own.
    println!(
        "\nper cycle on one node (INFO commandstats): calls of each command (in scripts too), and the us spent in them"
    );
    let nodes_count = conns.len().max(1) as f64;
    for ((tally, label), stats) in tallies.iter().zip(labels).zip(&stats) {
        let per = (tally.cycles().max(1) as f64) * nodes_count;
        let parts: Vec<String> = stats
            .iter()
            .filter(|(name, (calls, _))| *calls > 0 && name.as_str() != "info")
            .map(|(name, (calls, usec))| {
                format!("{name} {:.2} ({:.2} us)", *calls as f64 / per, usec / per)
            })
            .collect();
        println!("{label:<46} {}", parts.join(", "));
    }
    drop(nodes);
    Ok(())
}
