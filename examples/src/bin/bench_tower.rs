//! Benchmark: what the tower lock layer costs, against the same HTTP server without it
//! and against the bare lock cycle it wraps.
//!
//! ```text
//! cargo run --release -p redlock-examples --bin bench_tower
//! ```
//!
//! Starts 5 local `redis-server` nodes (or uses `REDLOCK_NODES`) and one axum server on
//! a loopback port with two routes: `/plain/{id}` (a trivial handler) and
//! `/locked/{id}` (the same handler behind `LockLayer` with `PathParam("id")`: every
//! request locks its own key, so nothing contends). 32 concurrent clients (one
//! keep-alive connection each) measure, interleaved in short slices so that machine
//! noise hits all alike:
//! - `http`: requests to `/plain/..` (the server and client alone);
//! - `http + layer`: requests to `/locked/..` (distinct keys);
//! - `lock cycle`: the bare `redlock.lock(key)` + `release()` loop at the same
//!   concurrency (the floor: what the layer cannot avoid).
//!
//! and, to see where the cost goes: the lock cycle with `auto_extend` (what the layer
//! does to every lock), the layer called directly as a tower service (no HTTP), and
//! the same server taking and releasing the lock by hand in its handler.
//!
//! Prints requests/s, p50, p99, and CPU per operation (of this process, and of the
//! Redis servers) for each, and the
//! layer's overhead over the plain server in lock cycles (target: at most 1.10).
//! `BENCH_SECS` sets the duration of each workload (default 3), `BENCH_CONCURRENCY`
//! the number of clients (default 32), `BENCH_ONLY=http|layer|lock|watched|service|manual`
//! runs one workload alone (for profiling).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http_body_util::BodyExt;
use redlock_core::Redlock;
use redlock_examples::Nodes;
use redlock_examples::measure::{
    closed_loop, fmt_us, process_cpu_secs, quantiles, servers_cpu_secs, verdict,
};
use redlock_tower::extract::PathParam;
use redlock_tower::{LockLayer, LockOptions};
use tower::{Layer, ServiceExt};

/// Concurrent clients (`BENCH_CONCURRENCY`, default 32).
fn concurrency() -> usize {
    std::env::var("BENCH_CONCURRENCY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32)
}
const ROUNDS: u32 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Http,
    Layer,
    Lock,
    Watched,
    Service,
    Manual,
}

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Self::Http => "http (no layer)",
            Self::Layer => "http + layer (distinct keys)",
            Self::Lock => "lock cycle (lock + release)",
            Self::Watched => "lock + auto_extend + release",
            Self::Service => "layer, no HTTP (tower oneshot)",
            Self::Manual => "http, lock + release in handler",
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    redlock_examples::init_tracing();
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let nodes = Nodes::from_env_or_start(5).await;
    let redlock = Redlock::builder()
        .nodes(nodes.urls())
        .ttl(Duration::from_secs(2))
        .build()?;
    redlock_examples::wait_until_ready(&redlock).await;
    let mut conns = Vec::new();
    for url in nodes.urls() {
        conns.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }

    let layer = LockLayer::new(redlock.clone(), PathParam::new("id"))
        .options(LockOptions::new().resource_prefix("bench:"));
    let manual = redlock.clone();
    let app = Router::new()
        .route("/plain/{id}", get(|| async { "ok" }))
        .route("/locked/{id}", get(|| async { "ok" }).route_layer(layer))
        .route(
            "/manual/{id}",
            get(
                move |axum::extract::Path(id): axum::extract::Path<String>| {
                    let redlock = manual.clone();
                    async move {
                        let Ok(lock) = redlock.lock(format!("bench:manual:{id}")).await else {
                            return http::StatusCode::CONFLICT;
                        };
                        let _ = lock.release().await;
                        http::StatusCode::OK
                    }
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency() * 2)
        .build()?;
    #[allow(clippy::type_complexity)]
    let ok: fn(
        http::Request<()>,
    )
        -> std::future::Ready<Result<http::Response<String>, std::convert::Infallible>> =
        |_| std::future::ready(Ok(http::Response::new("ok".to_owned())));
    let service = LockLayer::new(
        redlock.clone(),
        redlock_tower::extract::PathPrefix::new("/"),
    )
    .options(LockOptions::new().resource_prefix("bench:svc:"))
    .layer(tower::service_fn(ok));
    let ctx = Arc::new(Ctx {
        base,
        client,
        redlock,
        service,
    });
    println!(
        "bench_tower: {}, {} concurrent clients, {secs} s per workload in {ROUNDS} interleaved slices, {} cores",
        nodes.describe(),
        concurrency(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let workloads = [
        Workload::Http,
        Workload::Layer,
        Workload::Lock,
        Workload::Watched,
        Workload::Service,
        Workload::Manual,
    ];
    // BENCH_ONLY=http|layer|lock|watched|service|manual: one workload alone (and only
    // its own warm-up), for profiling.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let Some(workload) = workloads
            .into_iter()
            .find(|w| format!("{w:?}").eq_ignore_ascii_case(&only))
        else {
            return Err(format!("BENCH_ONLY: no workload `{only}`").into());
        };
        measure(&ctx, workload, Duration::from_millis(300)).await?; // warm up
        let cpu_before = process_cpu_secs();
        let (mut s, spent) = measure(&ctx, workload, Duration::from_secs_f64(secs)).await?;
        let s = Stats::from(&mut s, spent, process_cpu_secs() - cpu_before, 0.0);
        println!(
            "{}: {:.0} ops/s, p50 {}, {:.1} CPU us/op",
            workload.label(),
            s.per_sec,
            fmt_us(s.p50),
            s.cpu_us
        );
        return Ok(());
    }
    for workload in workloads {
        measure(&ctx, workload, Duration::from_millis(300)).await?; // warm up
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
        let s = Stats::from(&mut samples[w], spent[w], cpu[w], server_cpu[w]);
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
    let [http, layer, lock, _watched, service, manual] = &stats[..] else {
        return Err("missing results".into());
    };
    // Per request, what the layer adds over the plain server, in lock cycles: at p50,
    // and in capacity (at saturation the time per request, 1 / rate, adds up).
    let added_p50 = layer.p50.as_secs_f64() - http.p50.as_secs_f64();
    let p50_ratio = added_p50 / lock.p50.as_secs_f64();
    let added_cost = 1.0 / layer.per_sec - 1.0 / http.per_sec;
    let cost_ratio = added_cost / (1.0 / lock.per_sec);
    println!(
        "\nlayer over the plain server, at p50: +{} = {p50_ratio:.2} lock cycles (target <= 1.10: {})",
        fmt_us(Duration::from_secs_f64(added_p50.max(0.0))),
        verdict(p50_ratio <= 1.10)
    );
    println!(
        "layer over the plain server, capacity: +{:.1} us per request = {cost_ratio:.2} lock cycles (target <= 1.10: {})",
        added_cost * 1e6,
        verdict(cost_ratio <= 1.10)
    );
    // Where it goes: the middleware alone, and the same lock taken by hand.
    println!(
        "the layer alone (no HTTP) / lock cycle: {:.2} in capacity, {:.2} at p50",
        lock.per_sec / service.per_sec,
        service.p50.as_secs_f64() / lock.p50.as_secs_f64()
    );
    println!(
        "http + layer / http with lock + release in the handler: {:.2} in capacity, {:.2} at p50",
        manual.per_sec / layer.per_sec,
        layer.p50.as_secs_f64() / manual.p50.as_secs_f64()
    );
    println!(
        "(cli us/op: CPU time of this process (HTTP client + server + lock client) per operation; srv us/op: of all the Redis servers)"
    );
    drop(nodes);
    Ok(())
}

type Direct = redlock_tower::lock::LockService<
    tower::util::ServiceFn<
        fn(
            http::Request<()>,
        ) -> std::future::Ready<Result<http::Response<String>, std::convert::Infallible>>,
    >,
    redlock_tower::extract::PathPrefix,
>;

struct Ctx {
    base: String,
    client: reqwest::Client,
    redlock: Redlock,
    service: Direct,
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
            match workload {
                Workload::Http | Workload::Layer | Workload::Manual => {
                    let route = match workload {
                        Workload::Http => "plain",
                        Workload::Layer => "locked",
                        _ => "manual",
                    };
                    let url = format!("{}/{route}/{worker}-{i}", ctx.base);
                    let response = ctx.client.get(url).send().await?;
                    let status = response.status();
                    response.bytes().await?;
                    if status != reqwest::StatusCode::OK {
                        return Err(format!("{route}: {status}").into());
                    }
                }
                Workload::Lock => {
                    let lock = ctx.redlock.lock(format!("bench:raw:{worker}-{i}")).await?;
                    lock.release().await?;
                }
                Workload::Service => {
                    let request = http::Request::get(format!("/{worker}-{i}")).body(())?;
                    let response = ctx.service.clone().oneshot(request).await?;
                    response.into_body().collect().await?;
                }
                Workload::Watched => {
                    let mut lock = ctx.redlock.lock(format!("bench:w:{worker}-{i}")).await?;
                    lock.auto_extend();
                    lock.release().await?;
                }
            }
            Ok(())
        }
    })
    .await
    .map_err(|e| e as Box<dyn std::error::Error>)
}

impl Stats {
    fn from(
        samples: &mut [Duration],
        spent: Duration,
        cpu_secs: f64,
        server_cpu_secs: f64,
    ) -> Self {
        let [p50, p99] = quantiles(samples, [0.50, 0.99]);
        let n = samples.len().max(1) as f64;
        Self {
            per_sec: samples.len() as f64 / spent.as_secs_f64(),
            p50,
            p99,
            cpu_us: cpu_secs / n * 1e6,
            server_cpu_us: server_cpu_secs / n * 1e6,
        }
    }
}
