//! Benchmark: what the idempotency layer costs, against the same route behind the lock
//! layer alone, and what a replay costs against running the handler.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin bench_idempotency
//! ```
//!
//! Starts 3 local `redis-server` lock nodes (or uses `REDLOCK_NODES`) and one data Redis
//! for the records (`RedisStore`), and one axum server on a loopback port with the same
//! trivial `POST` handler (a small JSON body in, a small JSON body out) on three routes:
//! `/plain` (no layer), `/locked` (`LockLayer` on the `Idempotency-Key` header) and
//! `/idempotent` (`IdempotencyLayer`, scoped by a tenant header). Clients (one keep-alive
//! connection each; `BENCH_CONCURRENCY`, default 1) measure, interleaved in short slices
//! so that machine noise hits all alike:
//! - `handler`: `/plain` (the server and client alone);
//! - `lock layer`: `/locked` with a fresh key per request;
//! - `lock layer + fencing`: the same with fencing tokens (`/locked-fenced`), the lock
//!   the idempotency layer takes;
//! - `idempotency, fresh key`: `/idempotent` with a fresh key per request (the first
//!   run: read, lock, in-flight write, handler, response write);
//! - `idempotency, replay`: `/idempotent` with a key already run (one read);
//! - `lock cycle`: the bare `redlock.lock(key)` + `release()`.
//!
//! Prints requests/s, p50, p99 and CPU per operation (this process; the Redis servers),
//! then the two ratios: fresh key / lock layer at p50 (target <= 1.5) and what a replay
//! adds over the handler, in lock cycles at p50 (target <= 1). `BENCH_SECS` sets each
//! workload's duration (default 3).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use redlock_core::Redlock;
use redlock_examples::Nodes;
use redlock_examples::measure::{
    closed_loop, fmt_us, process_cpu_secs, quantiles, servers_cpu_secs, verdict,
};
use redlock_idempotency::store::RedisStore;
use redlock_tower::IdempotencyLayer;
use redlock_tower::extract::Header;
use redlock_tower::{LockLayer, LockOptions};

fn concurrency() -> usize {
    std::env::var("BENCH_CONCURRENCY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}
const ROUNDS: u32 = 6;
const BODY: &str = r#"{"order":42,"cents":500}"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Handler,
    LockLayer,
    LockLayerFenced,
    Fresh,
    Replay,
    LockCycle,
}

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Self::Handler => "handler (no layer)",
            Self::LockLayer => "lock layer, fresh key",
            Self::LockLayerFenced => "lock layer + fencing, fresh key",
            Self::Fresh => "idempotency, fresh key",
            Self::Replay => "idempotency, replay",
            Self::LockCycle => "lock cycle (lock + release)",
        }
    }
}

struct Stats {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    cpu_us: f64,
    server_cpu_us: f64,
}

struct Ctx {
    base: String,
    client: reqwest::Client,
    redlock: Redlock,
    run: String,
    /// Numbers fresh keys across every slice (a slice's own counter starts at 0).
    next: std::sync::atomic::AtomicU64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    redlock_examples::init_tracing();
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let nodes = Nodes::from_env_or_start(3).await;
    let data = redlock_testkit::Cluster::start(1).await;
    let redlock = Redlock::builder()
        .nodes(nodes.urls())
        .ttl(Duration::from_secs(2))
        .build()?;
    redlock_examples::wait_until_ready(&redlock).await;
    let mut conns = Vec::new();
    for url in nodes.urls().iter().chain(data.urls().iter()) {
        conns.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }

    let store = RedisStore::open(&data.urls()[0]).await?;
    let handler = || post(|body: String| async move { format!(r#"{{"refund":{}}}"#, body.len()) });
    let app = Router::new()
        .route("/plain", handler())
        .route(
            "/locked",
            handler().route_layer(
                LockLayer::new(redlock.clone(), Header::new("Idempotency-Key").required())
                    .options(LockOptions::new().resource_prefix("bench:lock:")),
            ),
        )
        .route(
            "/locked-fenced",
            handler().route_layer(
                LockLayer::new(redlock.clone(), Header::new("Idempotency-Key").required()).options(
                    LockOptions::new()
                        .resource_prefix("bench:fenced:")
                        .fencing(true),
                ),
            ),
        )
        .route(
            "/idempotent",
            handler().route_layer(
                IdempotencyLayer::new(
                    redlock_idempotency::Idempotency::new(redlock.clone(), store)
                        .resource_prefix("bench:idem:"),
                )
                .scope_header("x-tenant-id"),
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency() * 2)
        .build()?;
    let run = format!("{}", std::process::id());
    let ctx = Arc::new(Ctx {
        base,
        client,
        redlock,
        run,
        next: std::sync::atomic::AtomicU64::new(0),
    });
    println!(
        "bench_idempotency: {} lock nodes and 1 data Redis, {} concurrent clients, {secs} s per workload in {ROUNDS} interleaved slices, {} cores",
        nodes.describe(),
        concurrency(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let workloads = [
        Workload::Handler,
        Workload::LockLayer,
        Workload::LockLayerFenced,
        Workload::Fresh,
        Workload::Replay,
        Workload::LockCycle,
    ];
    for workload in workloads {
        measure(&ctx, workload, Duration::from_millis(300)).await?; // warm up (and store the replays)
    }
    let slice = Duration::from_secs_f64(secs / f64::from(ROUNDS));
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); workloads.len()];
    let mut spent = vec![Duration::ZERO; workloads.len()];
    let mut cpu = vec![0.0f64; workloads.len()];
    let mut server_cpu = vec![0.0f64; workloads.len()];
    for _ in 0..ROUNDS {
        for (w, workload) in workloads.iter().enumerate() {
            let cpu_before = process_cpu_secs();
            let servers_before = servers_cpu_secs(&conns).await;
            let (s, elapsed) = measure(&ctx, *workload, slice).await?;
            cpu[w] += process_cpu_secs() - cpu_before;
            server_cpu[w] += servers_cpu_secs(&conns).await - servers_before;
            samples[w].extend(s);
            spent[w] += elapsed;
        }
    }
    println!(
        "\n{:<32} {:>10} {:>10} {:>10} {:>10} {:>10}",
        format!("workload (c={})", concurrency()),
        "ops/s",
        "p50",
        "p99",
        "cli us/op",
        "srv us/op"
    );
    let mut stats = Vec::new();
    for (w, workload) in workloads.iter().enumerate() {
        let [p50, p99] = quantiles(&mut samples[w], [0.50, 0.99]);
        let n = samples[w].len().max(1) as f64;
        let s = Stats {
            per_sec: samples[w].len() as f64 / spent[w].as_secs_f64(),
            p50,
            p99,
            cpu_us: cpu[w] / n * 1e6,
            server_cpu_us: server_cpu[w] / n * 1e6,
        };
        println!(
            "{:<32} {:>10.0} {:>10} {:>10} {:>10.1} {:>10.1}",
            workload.label(),
            s.per_sec,
            fmt_us(s.p50),
            fmt_us(s.p99),
            s.cpu_us,
            s.server_cpu_us
        );
        stats.push(s);
    }
    let [handler, lock_layer, fenced, fresh, replay, lock_cycle] = &stats[..] else {
        return Err("missing results".into());
    };
    let fresh_ratio = fresh.p50.as_secs_f64() / lock_layer.p50.as_secs_f64();
    println!(
        "\nidempotency (fresh key) / lock layer alone, at p50: {fresh_ratio:.2} (target <= 1.5: {})",
        verdict(fresh_ratio <= 1.5)
    );
    let added = replay.p50.as_secs_f64() - handler.p50.as_secs_f64();
    let replay_ratio = added / lock_cycle.p50.as_secs_f64();
    println!(
        "a replay over the handler, at p50: +{} = {replay_ratio:.2} lock cycles (target <= 1: {})",
        fmt_us(Duration::from_secs_f64(added.max(0.0))),
        verdict(replay_ratio <= 1.0)
    );
    println!(
        "idempotency (fresh key) / lock layer with fencing tokens (the lock it takes), at p50: {:.2}",
        fresh.p50.as_secs_f64() / fenced.p50.as_secs_f64()
    );
    println!(
        "in capacity: fresh / lock layer {:.2}; replay / handler {:.2}",
        lock_layer.per_sec / fresh.per_sec,
        handler.per_sec / replay.per_sec
    );
    println!(
        "(cli us/op: CPU time of this process (HTTP client + server + lock client) per operation; srv us/op: of all the Redis servers, data Redis included)"
    );
    drop(nodes);
    Ok(())
}

async fn measure(
    ctx: &Arc<Ctx>,
    workload: Workload,
    run: Duration,
) -> Result<(Vec<Duration>, Duration), Box<dyn std::error::Error>> {
    let ctx = Arc::clone(ctx);
    closed_loop(concurrency(), run, move |worker, i| {
        let ctx = Arc::clone(&ctx);
        async move {
            let fresh = ctx.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (route, key, expect) = match workload {
                Workload::LockCycle => {
                    let lock = ctx
                        .redlock
                        .lock(format!("bench:raw:{worker}-{i}-{fresh}"))
                        .await?;
                    lock.release().await?;
                    return Ok(());
                }
                Workload::Handler => ("plain", format!("{}-{fresh}", ctx.run), None),
                Workload::LockLayer => ("locked", format!("{}-{fresh}", ctx.run), None),
                Workload::LockLayerFenced => {
                    ("locked-fenced", format!("{}-{fresh}", ctx.run), None)
                }
                Workload::Fresh => ("idempotent", format!("{}-{fresh}", ctx.run), Some(false)),
                // One key per worker: run once (in the warm-up), replayed from then on.
                Workload::Replay => ("idempotent", format!("{}-replay-{worker}", ctx.run), None),
            };
            let response = ctx
                .client
                .post(format!("{}/{route}", ctx.base))
                .header("idempotency-key", key)
                .header("x-tenant-id", "bench")
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await?;
            let status = response.status();
            let replayed = response.headers().contains_key("idempotent-replayed");
            response.bytes().await?;
            if status != reqwest::StatusCode::OK {
                return Err(format!("{route}: {status}").into());
            }
            if expect == Some(false) && replayed {
                return Err("a fresh key was replayed".into());
            }
            Ok(())
        }
    })
    .await
    .map_err(|e| e as Box<dyn std::error::Error>)
}
