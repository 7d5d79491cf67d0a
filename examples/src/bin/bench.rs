//! Benchmark: the uncontended acquire + release cycle against a round-trip floor.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin bench
//! ```
//!
//! Starts 5 local `redis-server` nodes (or uses `REDLOCK_NODES`) and measures, in one
//! run, at concurrency 1 and 32:
//! - the floor: per cycle, two rounds of concurrent `PING` to all nodes, waiting for
//!   every node (what any client needs at least for a two-round-trip protocol), over
//!   the same kind of connection the lock uses (one multiplexed connection per node);
//! - the lock: `try_lock` on a fresh resource, then `release`, with no metrics recorded;
//! - the same with a Prometheus recorder recording every metric of the library (a
//!   recorder switched on and off between slices of one run: off, it drops everything,
//!   as the facade does with no recorder installed);
//! - the minimal Redlock: `SET NX PX` with a random value on every node, then a
//!   compare-and-delete script (no queue, no wake-up, no checks), over the same
//!   connections.
//!
//! Prints cycles/s, p50 and p99 for each, the CPU time per cycle of this process and of
//! all the Redis servers, and the ratios the targets are about: among them the cost of a
//! lock cycle next to the minimal Redlock's, server and client CPU, measured in the same
//! run (a ratio that holds on any machine).
//! `BENCH_SECS` sets the duration of each run (default 3).

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redlock_core::Redlock;
use redlock_examples::Nodes;
use redlock_examples::measure::{
    self, OpError, closed_loop, floor_cycle, fmt_us, lock_cycle, minimal_cycle, process_cpu_secs,
    quantiles, verdict,
};

#[derive(Debug, Clone, Copy)]
enum Workload {
    Floor,
    Lock,
    /// The lock, with the metrics recorder on.
    Metered,
    /// The minimal Redlock: `SET NX PX` with a random value, then compare-and-delete.
    Minimal,
}

struct Stats {
    cycles_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    redlock_examples::init_tracing();
    let recorder = redlock_examples::metered::install()?;
    let secs: u64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let nodes = Nodes::from_env_or_start(5).await;
    let urls = nodes.urls();
    println!(
        "redlock bench: {}, {secs} s per run, {} worker threads",
        nodes.describe(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let redlock = Redlock::builder()
        .nodes(urls.clone())
        .ttl(Duration::from_secs(2))
        .build()?;
    redlock_examples::wait_until_ready(&redlock).await;
    let conns = Arc::new(measure::connect(&urls).await?);
    let rounds: u32 = 6;
    let slice = Duration::from_secs(secs) / rounds;

    // Warm up every path (connections, script cache).
    let warm_up = Duration::from_millis(300);
    for workload in [Workload::Floor, Workload::Minimal, Workload::Lock] {
        slice_of(workload, 4, warm_up, &conns, &redlock)
            .await
            .map_err(unsend)?;
    }

    println!(
        "{}",
        measure::header(&format!("workload (interleaved, {rounds} rounds)"))
    );
    let workloads = [
        Workload::Floor,
        Workload::Lock,
        Workload::Metered,
        Workload::Minimal,
    ];
    match std::env::var("BENCH_ONLY").as_deref() {
        Ok("contended") => return contended(&urls, Duration::from_secs(secs)).await,
        Ok("watchdog") => return watchdog(&urls, &conns).await,
        _ => {}
    }
    // BENCH_ONLY=lock (or floor, minimal): run one workload at c=32, for profiling.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let workload = match only.as_str() {
            "floor" => Workload::Floor,
            "minimal" => Workload::Minimal,
            _ => Workload::Lock,
        };
        let run = slice * rounds;
        let tallies = measure::interleave(&[workload], 1, &conns, async |w| {
            slice_of(w, 32, run, &conns, &redlock).await
        })
        .await
        .map_err(unsend)?;
        for mut tally in tallies {
            println!("{}", tally.row(&format!("{only} (c=32)")));
        }
        return Ok(());
    }
    let mut results = Vec::new();
    for concurrency in [1usize, 32] {
        // Alternate the workloads in short slices so that machine noise hits all alike.
        let tallies = measure::interleave(&workloads, rounds, &conns, async |w| {
            recorder.set(matches!(w, Workload::Metered));
            let result = slice_of(w, concurrency, slice, &conns, &redlock).await;
            recorder.set(false);
            result
        })
        .await
        .map_err(unsend)?;
        for (workload, mut tally) in workloads.iter().zip(tallies) {
            let label = match workload {
                Workload::Floor => format!(
                    "floor: 2 rounds of PING to all {} (c={concurrency})",
                    urls.len()
                ),
                Workload::Lock => format!("lock: try_lock + release (c={concurrency})"),
                Workload::Metered => format!("lock, metrics recorded (c={concurrency})"),
                Workload::Minimal => format!("minimal Redlock: SET NX PX + CAD (c={concurrency})"),
            };
            println!("{}", tally.row(&label));
            results.push(tally);
        }
    }
    let [
        floor1,
        lock1,
        metered1,
        minimal1,
        floor32,
        lock32,
        metered32,
        minimal32,
    ] = &mut results[..]
    else {
        return Err("missing results".into());
    };
    let p50 = |tally: &mut measure::Tally| tally.p50_p99().0;
    let p50_ratio = p50(lock1).as_secs_f64() / p50(floor1).as_secs_f64();
    let tput_ratio = lock32.cycles_per_sec() / floor32.cycles_per_sec();
    println!();
    println!(
        "p50 at c=1: lock / floor = {p50_ratio:.2} (target <= 1.00: {})",
        verdict(p50_ratio <= 1.0)
    );
    println!(
        "throughput at c=32: lock / floor = {tput_ratio:.2} (target >= 0.75: {})",
        verdict(tput_ratio >= 0.75)
    );
    let metrics_cost = 1.0 - metered32.cycles_per_sec() / lock32.cycles_per_sec();
    println!(
        "metrics cost at c=32: 1 - metered / lock = {:.1}% (target < 2%: {}); at c=1 p50 {} vs {}",
        metrics_cost * 100.0,
        verdict(metrics_cost < 0.02),
        fmt_us(p50(metered1)),
        fmt_us(p50(lock1))
    );
    let recorded = recorder.render();
    println!(
        "(recorded while on: {} acquisitions)",
        recorded
            .lines()
            .filter(|l| l.starts_with("redlock_acquisitions_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    );
    println!(
        "(reference: the minimal Redlock, waiting for every node: p50 c=1 {:.2}x floor, c=32 {:.2}x floor throughput)",
        p50(minimal1).as_secs_f64() / p50(floor1).as_secs_f64(),
        minimal32.cycles_per_sec() / floor32.cycles_per_sec()
    );
    // The cost of a cycle, next to the minimal Redlock's in the same run: CPU time is far
    // steadier than wall time on a shared machine. (CI checks the servers' share with
    // redlock-testkit's `cost` program.)
    for (c, lock, minimal) in [(1, lock1, minimal1), (32, lock32, minimal32)] {
        let server = lock.server_us() / minimal.server_us();
        let client = lock.client_us() / minimal.client_us();
        println!(
            "cost at c={c}: lock / minimal Redlock: server CPU {server:.2} (target <= 1.10: {}), client CPU {client:.2} (target <= 1.10: {})",
            verdict(server <= 1.10),
            verdict(client <= 1.10)
        );
    }
    drop(nodes);
    Ok(())
}

/// Watchdog scale: 10,000 watched locks held by one client with a 3 s TTL.
///
/// Reports what the targets are about:
/// - memory: the growth of this process's resident set (`VmRSS`) per watched lock,
///   from before the locks are taken (nodes, connections and the watchdog up, after a
///   warm-up that takes, watches and releases a batch of locks) to when all of them are
///   held and the watchdog has extended them for two periods, and again at the end of
///   the watch (target <= 2 KiB per lock);
/// - CPU: this process's CPU time (user + system, as `getrusage` counts it) during the
///   steady watch of `BENCH_WATCH_SECS` seconds (default 60) only, acquisition excluded,
///   as a share of one core (target <= 3 %);
/// - round trips per node per extension period (ttl/3), and the servers' read events.
///
/// The allocator is the program's (glibc malloc here); run with `MALLOC_ARENA_MAX=2`
/// to see how much of the resident set its per-thread arenas account for.
async fn watchdog(
    urls: &[String],
    conns: &[MultiplexedConnection],
) -> Result<(), Box<dyn std::error::Error>> {
    const LOCKS: usize = 10_000;
    const CHUNK: usize = 500;
    let ttl = Duration::from_secs(3);
    let period = ttl / 3;
    let secs: u64 = std::env::var("BENCH_WATCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .ttl(ttl)
        .node_timeout(Duration::from_millis(500))
        .build()?;
    redlock_examples::wait_until_ready(&redlock).await;
    // Takes `count` locks from `first` on, `CHUNK` at a time, each watched.
    let take = |first: usize, count: usize| {
        let redlock = redlock.clone();
        async move {
            let mut locks = Vec::with_capacity(count);
            for chunk in (first..first + count).step_by(CHUNK) {
                let batch = futures_util::future::join_all(
                    (chunk..(chunk + CHUNK).min(first + count))
                        .map(|i| redlock.try_lock(format!("bench:watch:{i}")).into_future()),
                )
                .await;
                for lock in batch {
                    let mut lock = lock?;
                    lock.auto_extend();
                    locks.push(lock);
                }
            }
            Ok::<_, redlock_core::Error>(locks)
        }
    };
    // Warm-up: the runtime's threads, the connections, the scripts, the watchdog task and
    // the allocator's arenas are in use before the baseline is read; one chunk's
    // acquisition, a watchdog round over it, and its release.
    let warm = take(LOCKS, CHUNK).await?;
    tokio::time::sleep(period + period / 2).await;
    for lock in warm {
        lock.release().await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_before = proc_status_kib("VmRSS");

    let acquiring = Instant::now();
    let locks = take(0, LOCKS).await?;
    let acquired_in = acquiring.elapsed();
    // Two extension periods for the watchdog to extend all of them (and settle on shared
    // rounds), then the resident set with all of them held.
    tokio::time::sleep(period * 2 + period / 4).await;
    let rss_held = proc_status_kib("VmRSS");

    let reads_before = servers_stat(conns, "total_reads_processed").await;
    let rounds_before = redlock.watchdog_rounds();
    let cpu_before = process_cpu_secs();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let elapsed = started.elapsed();
    let cpu = process_cpu_secs() - cpu_before;
    let sent = redlock.watchdog_rounds() - rounds_before;
    let reads = servers_stat(conns, "total_reads_processed").await;
    let rss_end = proc_status_kib("VmRSS");
    let held = locks.iter().filter(|l| l.is_held()).count();

    let periods = elapsed.as_secs_f64() / period.as_secs_f64();
    let per_node: Vec<f64> = reads
        .iter()
        .zip(&reads_before)
        .map(|(a, b)| (a - b) as f64 / periods)
        .collect();
    let per_lock = |after: u64| (after as f64 - rss_before as f64) / LOCKS as f64;
    let (held_kib, end_kib) = (per_lock(rss_held), per_lock(rss_end));
    let cpu_share = cpu / elapsed.as_secs_f64() * 100.0;
    println!(
        "\nwatchdog: {LOCKS} watched locks, TTL {} s (acquired in {:.1} s), watched {:.0} s: {held} still held",
        ttl.as_secs(),
        acquired_in.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    println!(
        "memory (VmRSS): {} KiB before the locks, {} KiB with all held after 2 periods, {} KiB at the end (peak VmHWM {} KiB)",
        rss_before,
        rss_held,
        rss_end,
        proc_status_kib("VmHWM")
    );
    println!(
        "memory per watched lock: {held_kib:.2} KiB after 2 periods, {end_kib:.2} KiB at the end (target <= 2 KiB: {})",
        verdict(held_kib.max(end_kib) <= 2.0)
    );
    println!(
        "watchdog CPU while watching: {cpu:.2} s in {:.0} s = {cpu_share:.2}% of one core (target <= 3%: {})",
        elapsed.as_secs_f64(),
        verdict(cpu_share <= 3.0)
    );
    println!(
        "round trips per node per extension period (ttl/3): {:.2} ({sent} pipelines per node in {periods:.1} periods; target: 1)",
        sent as f64 / periods
    );
    println!(
        "(servers' read events per node per period: {}; a pipeline of 10,000 extensions arrives in several reads)",
        per_node
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for lock in locks {
        let _ = lock.release().await;
    }
    Ok(())
}

/// A numeric field of `INFO stats` on every server.
async fn servers_stat(conns: &[MultiplexedConnection], field: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for conn in conns {
        let mut conn = conn.clone();
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        out.push(
            info.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0),
        );
    }
    out
}

/// A memory field of /proc/self/status (`VmRSS`, `VmHWM`) in KiB (0 where unavailable).
fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Contended: 8 clients (separate connections), one resource; each takes the lock, runs
/// a short critical section, releases. With wake-on-release, and with sleep-only retry.
async fn contended(urls: &[String], run: Duration) -> Result<(), Box<dyn std::error::Error>> {
    const CLIENTS: usize = 8;
    const CRITICAL: Duration = Duration::from_micros(200);
    println!(
        "\ncontended: {CLIENTS} clients, one resource, {} us critical section, {:.0} s per mode",
        CRITICAL.as_micros(),
        run.as_secs_f64()
    );
    println!(
        "{:<46} {:>11} {:>10} {:>10} {:>9}",
        "mode", "sections/s", "wait p50", "wait p99", "attempts"
    );
    // Without a pause, a client asks again right after its release: with sleep-only
    // retries it wins again and again (the others sleep), an unfair but fast monopoly.
    // With 1 ms of other work between sections, that monopoly is gone.
    for think in [Duration::ZERO, Duration::from_millis(1)] {
        let mut rates = Vec::new();
        for wake in [true, false] {
            let stats = contend(urls, run, CLIENTS, CRITICAL, think, wake).await?;
            let label = format!(
                "{}, {} pause",
                if wake {
                    "wake on release + queue"
                } else {
                    "sleep-only (50-100 ms)"
                },
                if think.is_zero() { "no" } else { "1 ms" }
            );
            println!(
                "{label:<46} {:>11.0} {:>10} {:>10} {:>9.2}",
                stats.0.cycles_per_sec,
                fmt_us(stats.0.p50),
                fmt_us(stats.0.p99),
                stats.1
            );
            rates.push(stats.0);
        }
        if let [wake, sleep] = &rates[..] {
            let ratio = wake.cycles_per_sec / sleep.cycles_per_sec;
            println!(
                "  wake / sleep-only: {ratio:.2}x sections/s (target >= 2x: {}), wake p99 {} (target < 10 ms: {})",
                verdict(ratio >= 2.0),
                fmt_us(wake.p99),
                verdict(wake.p99 < Duration::from_millis(10)),
            );
        }
    }
    Ok(())
}

/// One contended run: the section rate and wait times, and the attempts per section.
async fn contend(
    urls: &[String],
    run: Duration,
    clients: usize,
    critical: Duration,
    think: Duration,
    wake: bool,
) -> Result<(Stats, f64), Box<dyn std::error::Error>> {
    let mut redlocks = Vec::new();
    for _ in 0..clients {
        let redlock = Redlock::builder()
            .nodes(urls.to_vec())
            .ttl(Duration::from_secs(2))
            .wake_on_release(wake)
            // The default delays (50 ms + up to 50 ms), up to 10 s of waiting.
            .retry(redlock_core::RetryPolicy::deadline(Duration::from_secs(10)))
            .build()?;
        redlock_examples::wait_until_ready(&redlock).await;
        redlocks.push(redlock);
    }
    let deadline = Instant::now() + run;
    let mut tasks = Vec::new();
    for redlock in redlocks {
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            let mut attempts = 0u64;
            while Instant::now() < deadline {
                let asked = Instant::now();
                let lock = redlock.lock("bench:contended").await?;
                waits.push(asked.elapsed());
                attempts += u64::from(lock.attempts());
                // CPU work (a tokio sleep would round up to the 1 ms timer tick).
                let until = Instant::now() + critical;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                lock.release().await?;
                if !think.is_zero() {
                    tokio::time::sleep(think).await;
                }
            }
            Ok::<_, redlock_core::Error>((waits, attempts))
        }));
    }
    let started = Instant::now();
    let mut waits = Vec::new();
    let mut attempts = 0;
    for task in tasks {
        let (w, a) = task.await??;
        waits.extend(w);
        attempts += a;
    }
    let spent = started.elapsed();
    let sections = waits.len();
    let stats = Stats::from(&mut waits, spent);
    Ok((stats, attempts as f64 / sections.max(1) as f64))
}

/// One slice of `workload`: a closed loop of `concurrency` clients for `run`, each cycle
/// on a fresh key.
async fn slice_of(
    workload: Workload,
    concurrency: usize,
    run: Duration,
    conns: &Arc<Vec<MultiplexedConnection>>,
    redlock: &Redlock,
) -> Result<(Vec<Duration>, Duration), OpError> {
    let (conns, redlock) = (Arc::clone(conns), redlock.clone());
    closed_loop(concurrency, run, move |worker, i| {
        let (conns, redlock) = (Arc::clone(&conns), redlock.clone());
        async move {
            match workload {
                Workload::Floor => floor_cycle(&conns).await,
                Workload::Minimal => minimal_cycle(&conns, &format!("minimal:{worker}:{i}")).await,
                Workload::Lock | Workload::Metered => {
                    lock_cycle(&redlock, format!("bench:{worker}:{i}")).await
                }
            }
        }
    })
    .await
}

/// A measurement's error as `main` returns it.
fn unsend(err: OpError) -> Box<dyn std::error::Error> {
    err
}

impl Stats {
    fn from(samples: &mut [Duration], spent: Duration) -> Self {
        let [p50, p99] = quantiles(samples, [0.50, 0.99]);
        Self {
            cycles_per_sec: samples.len() as f64 / spent.as_secs_f64(),
            p50,
            p99,
        }
    }
}
