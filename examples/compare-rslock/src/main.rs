//! redlock-core's lock cycle next to rslock's (0.10), measured with the workspace's
//! benchmark harness (`redlock_testkit::measure`) in one run.
//!
//! ```text
//! CARGO_TARGET_DIR=target cargo run --release --manifest-path examples/compare-rslock/Cargo.toml
//! ```
//!
//! Starts 5 local `redis-server` nodes and runs, at concurrency 1 and 32, each cycle on a
//! fresh key, the workloads interleaved in 6 rounds of short slices so that machine
//! noise hits all alike:
//! - the floor: two rounds of `PING` to every node, waiting for all;
//! - the minimal Redlock: `SET NX PX` with a random value on every node, then
//!   compare-and-delete;
//! - the lock: redlock-core's `try_lock` and `release`, the library's defaults (restart
//!   quarantine on, waited out before measuring), a 2 s TTL;
//! - rslock: a `LockManager` over the same 5 node URLs, `lock` with a 2 s TTL, then
//!   `unlock`. Its retry count is set to 1 (`set_retry(1, ..)`: one attempt, no sleep),
//!   the counterpart of `try_lock`; by default it would make up to 3 attempts, which an
//!   uncontended fresh key never needs anyway.
//!
//! Prints cycles/s, p50, p99, and the CPU time per cycle of this process and of all the
//! servers (`INFO cpu`) for each, then the ratios: the lock next to rslock and next to
//! the floor. `COMPARE_SECS` sets how long each workload runs at each concurrency
//! (default 3).
//!
//! rslock's `tokio-comp` feature turns on redis's `tokio-rustls-comp`, so in this
//! package both clients use a redis crate built with it; the nodes are plain `redis://`
//! and no TLS is involved.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redlock_core::Redlock;
use redlock_testkit::Cluster;
use redlock_testkit::measure::{
    self, OpError, Tally, closed_loop, floor_cycle, lock_cycle, minimal_cycle, verdict,
};
use rslock::LockManager;

/// The lock's TTL, for both libraries (and the max TTL, the restart quarantine's).
const TTL: Duration = Duration::from_secs(2);

/// Rounds of slices: each workload runs once per round.
const ROUNDS: u32 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Floor,
    Minimal,
    Lock,
    Rslock,
}

const WORKLOADS: [Workload; 4] = [
    Workload::Floor,
    Workload::Minimal,
    Workload::Lock,
    Workload::Rslock,
];

/// What the cycles run over.
struct Clients {
    conns: Arc<Vec<MultiplexedConnection>>,
    redlock: Redlock,
    rslock: LockManager,
}

#[tokio::main]
async fn main() -> Result<(), OpError> {
    let secs: f64 = std::env::var("COMPARE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| *s > 0.0)
        .unwrap_or(3.0);
    let cluster = Cluster::start(5).await;
    let urls = cluster.urls();
    let redlock = measure::ready_client(urls.clone(), TTL).await?;
    let mut rslock = LockManager::new(urls.clone());
    rslock.set_retry(1, Duration::from_millis(1));
    let clients = Clients {
        conns: Arc::new(measure::connect(&urls).await?),
        redlock,
        rslock,
    };
    let slice = Duration::from_secs_f64(secs) / ROUNDS;
    println!(
        "redlock-core vs rslock 0.10: 5 local redis-server nodes, {} worker threads, {ROUNDS} rounds of {} ms per workload",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        slice.as_millis()
    );

    // Warm-up: connections (rslock connects on first use), the scripts' cache.
    for workload in WORKLOADS {
        slice_of(workload, 4, Duration::from_millis(300), &clients).await?;
    }

    println!("{}", measure::header("workload (interleaved)"));
    let mut results = Vec::new();
    for concurrency in [1usize, 32] {
        let tallies = measure::interleave(&WORKLOADS, ROUNDS, &clients.conns, async |w| {
            slice_of(w, concurrency, slice, &clients).await
        })
        .await?;
        for (workload, mut tally) in WORKLOADS.into_iter().zip(tallies) {
            let label = match workload {
                Workload::Floor => "floor: 2 rounds of PING to all",
                Workload::Minimal => "minimal Redlock: SET NX PX + CAD",
                Workload::Lock => "redlock-core: try_lock + release",
                Workload::Rslock => "rslock: lock + unlock (1 attempt)",
            };
            println!("{}", tally.row(&format!("{label} (c={concurrency})")));
            results.push((concurrency, workload, tally));
        }
    }

    println!();
    let find = |c: usize, w: Workload| {
        results
            .iter()
            .find(|(rc, rw, _)| *rc == c && *rw == w)
            .map(|(_, _, tally)| tally.clone())
            .ok_or("missing results")
    };
    for c in [1, 32] {
        let (mut floor, minimal, mut lock, mut rslock) = (
            find(c, Workload::Floor)?,
            find(c, Workload::Minimal)?,
            find(c, Workload::Lock)?,
            find(c, Workload::Rslock)?,
        );
        let ratio = |a: f64, b: f64| a / b;
        println!(
            "c={c}: throughput lock / rslock {:.2}, lock / floor {:.2}, rslock / floor {:.2}; p50 lock / rslock {:.2}, lock / floor {:.2}",
            ratio(lock.cycles_per_sec(), rslock.cycles_per_sec()),
            ratio(lock.cycles_per_sec(), floor.cycles_per_sec()),
            ratio(rslock.cycles_per_sec(), floor.cycles_per_sec()),
            ratio(p50(&mut lock), p50(&mut rslock)),
            ratio(p50(&mut lock), p50(&mut floor)),
        );
        println!(
            "c={c}: server CPU per cycle lock / rslock {:.2}, lock / minimal {:.2}; client CPU per cycle lock / rslock {:.2}, lock / minimal {:.2}",
            ratio(lock.server_us(), rslock.server_us()),
            ratio(lock.server_us(), minimal.server_us()),
            ratio(lock.client_us(), rslock.client_us()),
            ratio(lock.client_us(), minimal.client_us()),
        );
        if c == 32 {
            let (vs_rslock, vs_floor) = (
                ratio(lock.cycles_per_sec(), rslock.cycles_per_sec()),
                ratio(lock.cycles_per_sec(), floor.cycles_per_sec()),
            );
            println!(
                "c=32 targets: lock >= rslock throughput: {}; lock >= 0.6x floor throughput: {}",
                verdict(vs_rslock >= 1.0),
                verdict(vs_floor >= 0.6)
            );
        }
    }
    drop(cluster);
    Ok(())
}

/// A tally's median, in seconds.
fn p50(tally: &mut Tally) -> f64 {
    tally.p50_p99().0.as_secs_f64()
}

/// One slice of `workload`: a closed loop of `concurrency` clients for `run`, each cycle
/// on a fresh key.
async fn slice_of(
    workload: Workload,
    concurrency: usize,
    run: Duration,
    clients: &Clients,
) -> Result<(Vec<Duration>, Duration), OpError> {
    let (conns, redlock, rslock) = (
        Arc::clone(&clients.conns),
        clients.redlock.clone(),
        clients.rslock.clone(),
    );
    closed_loop(concurrency, run, move |client, i| {
        let (conns, redlock, rslock) = (Arc::clone(&conns), redlock.clone(), rslock.clone());
        async move {
            match workload {
                Workload::Floor => floor_cycle(&conns).await,
                Workload::Minimal => minimal_cycle(&conns, &format!("minimal:{client}:{i}")).await,
                Workload::Lock => lock_cycle(&redlock, format!("lock:{client}:{i}")).await,
                Workload::Rslock => {
                    let lock = rslock
                        .lock(format!("rslock:{client}:{i}").as_str(), TTL)
                        .await?;
                    rslock.unlock(&lock).await;
                    Ok(())
                }
            }
        }
    })
    .await
}
