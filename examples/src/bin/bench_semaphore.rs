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
//! Prints cycles/s, p50, p99 and CPU per cycle (this process; the Redis servers), and
//! each cycle over the mutex cycle at p50 (target for a permit: <= 1.5). `BENCH_SECS`
//! sets each workload's duration (default 3).

use std::sync::Arc;
use std::time::Duration;

use redlock_core::{Redlock, RwLock, Semaphore};
use redlock_examples::Nodes;
use redlock_examples::measure::{closed_loop, header, interleave, verdict};

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
    let mut tallies = interleave(&workloads, 6, &conns, async |w| run(w).await)
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
        let target = if i == 1 {
            format!(" (target <= 1.5: {})", verdict(ratio <= 1.5))
        } else {
            String::new()
        };
        println!(
            "{what} cycle / mutex cycle at p50: {ratio:.2}{target}; in servers' CPU: {:.2}",
            tallies[i].server_us() / tallies[0].server_us()
        );
    }
    drop(nodes);
    Ok(())
}
