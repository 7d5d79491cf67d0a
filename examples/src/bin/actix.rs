//! redlock-actix in action: two replicas of an actix-web service share the lock nodes;
//! the extractor guards a payment per order, the middleware serializes a whole scope per
//! account, and every payment and deposit is a fenced SQL write.
//!
//! ```text
//! cargo run -p redlock-examples --bin actix
//! ```
//!
//! Starts 3 local `redis-server` nodes (unless `REDLOCK_NODES` lists some), then two
//! servers ("replicas" A and B, each its own `Redlock` client and 2 workers) on loopback
//! ports, sharing one SQLite database (a temporary file), and sends them concurrent
//! requests:
//!
//! 1. `POST /orders/{id}/pay`, `DistributedLock<web::Path<u64>>`, fail fast: 10
//!    simultaneous payments of one order give one `200` and `409`s with `Retry-After`;
//!    5 different orders are paid in parallel.
//! 2. `POST /accounts/{id}/deposit` under `LockMiddleware::path_param(accounts, "id")`,
//!    a configuration that waits: 10 simultaneous deposits (read, pause, write
//!    a balance kept outside Redis) all succeed, one after the other, with no lost
//!    update.
//!
//! The locks are taken with fencing tokens (`LockOptions::fencing`), and both
//! handlers take the token as a [`FencingToken`] argument (after the `DistributedLock`
//! in `pay`; from the middleware's lock in `deposit`). Each records its write in SQL,
//! fenced: in one transaction, `SqlFence::check` admits the token for the lock's
//! resource (and records it as the highest seen), then the row is inserted, then the
//! transaction commits. A token lower than one already seen (a replica whose lock
//! expired while it was paused, and was taken since) is refused and rolled back; the
//! client gets `409` saying so.
//!
//! Prints every outcome, how many fenced writes committed and how many were refused as
//! stale (none, unless a lock was lost; with the reason of each refusal); exits non-zero
//! if an order was charged twice at once, a deposit was lost, a request got an
//! unexpected answer, a `200` is not exactly one committed write, or a resource's writes
//! committed without rising tokens.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};
use redlock_actix::{
    DistributedLock, DistributedLockConfig, FencingToken, LockMiddleware, LockOptions,
};
use redlock_core::{LockHandle, Redlock};
use redlock_examples::Nodes;
use redlock_examples::fenced::WriteLog;
use redlock_fence::FenceError;

/// What the two replicas share outside Redis: a payment provider that notices two
/// charges of one order at the same time, and account balances.
#[derive(Default)]
struct World {
    charging: Mutex<HashMap<u64, usize>>,
    charges: AtomicU64,
    double_charge: AtomicBool,
    balances: Mutex<HashMap<u64, u64>>,
}

/// A fenced write's answer when it was not committed: `409` for a stale token, `500`
/// for a database failure.
fn not_recorded(what: &str, token: FencingToken, error: &FenceError) -> HttpResponse {
    match error {
        FenceError::Stale { highest, .. } => HttpResponse::Conflict().body(format!(
            "{what} refused: the lock was taken by a newer holder (token {highest}) since this replica got token {token}; nothing was written"
        )),
        other => HttpResponse::InternalServerError().body(format!("{what} not recorded: {other}")),
    }
}

/// The extractor: the body runs only while this replica holds `order:{id}`; the fencing
/// token comes from its lock.
async fn pay(
    order: DistributedLock<web::Path<u64>>,
    token: FencingToken,
    world: web::Data<World>,
    db: web::Data<WriteLog>,
    replica: web::Data<&'static str>,
) -> HttpResponse {
    let id = **order;
    {
        let mut charging = world.charging.lock().unwrap_or_else(|e| e.into_inner());
        let now = charging.entry(id).or_default();
        *now += 1;
        if *now > 1 {
            world.double_charge.store(true, Ordering::SeqCst);
        }
    }
    actix_web::rt::time::sleep(Duration::from_millis(200)).await; // the provider's call
    world.charges.fetch_add(1, Ordering::SeqCst);
    if let Some(now) = world
        .charging
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(&id)
    {
        *now -= 1;
    }
    let what = format!("payment of order {id}");
    if let Err(error) = db
        .record(
            order.guard().resource(),
            token.get(),
            &what,
            replica.get_ref(),
        )
        .await
    {
        return not_recorded(&what, token, &error);
    }
    HttpResponse::Ok().body(format!(
        "order {id} paid by replica {} under `{}`, token {token}",
        replica.get_ref(),
        order.guard().resource()
    ))
}

/// Under the middleware: read, pause, write. Without the lock, deposits would be lost.
/// The fencing token comes from the middleware's lock.
async fn deposit(
    path: web::Path<u64>,
    lock: web::ReqData<LockHandle>,
    token: FencingToken,
    world: web::Data<World>,
    db: web::Data<WriteLog>,
    replica: web::Data<&'static str>,
) -> HttpResponse {
    let account = path.into_inner();
    let before = *world
        .balances
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(account)
        .or_default();
    actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    let what = format!("deposit of 10 to account {account}");
    if let Err(error) = db
        .record(lock.resource(), token.get(), &what, replica.get_ref())
        .await
    {
        return not_recorded(&what, token, &error);
    }
    world
        .balances
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(account, before + 10);
    HttpResponse::Ok().body(format!(
        "account {account}: {before} -> {} under `{}`, token {token}",
        before + 10,
        lock.resource()
    ))
}

async fn start_replica(
    name: &'static str,
    redlock: Redlock,
    world: web::Data<World>,
    db: web::Data<WriteLog>,
) -> std::io::Result<(String, ServerHandle)> {
    // Every lock carries a fencing token, for the handlers' `FencingToken` argument.
    let options = LockOptions::new().ttl(Duration::from_secs(2)).fencing(true);
    let config = DistributedLockConfig::new(redlock)
        .options(options.clone().resource_prefix("actix-example:order:"));
    // The accounts' middleware: its own prefix, and it waits up to 5 s.
    let accounts = config.clone().options(
        options
            .resource_prefix("actix-example:account:")
            .wait(Duration::from_secs(5)),
    );
    let server = HttpServer::new(move || {
        App::new()
            .app_data(world.clone())
            .app_data(db.clone())
            .app_data(web::Data::new(name))
            // The app's configuration: fail fast.
            .app_data(config.clone())
            .route("/orders/{id}/pay", web::post().to(pay))
            .service(
                web::scope("/accounts/{id}")
                    // The handler's `FencingToken` finds the scope's configuration.
                    .app_data(accounts.clone())
                    .wrap(LockMiddleware::path_param(accounts.clone(), "id"))
                    .route("/deposit", web::post().to(deposit)),
            )
    })
    .workers(2)
    .disable_signals()
    .bind(("127.0.0.1", 0))?;
    let base = format!("http://{}", server.addrs()[0]);
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    Ok((base, handle))
}

struct Outcome {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

async fn post(client: &awc::Client, url: String) -> Outcome {
    match client.post(url).send().await {
        Ok(mut response) => {
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = response.body().await.unwrap_or_default();
            Outcome {
                status: response.status().as_u16(),
                retry_after,
                body: String::from_utf8_lossy(&body).into_owned(),
            }
        }
        Err(err) => Outcome {
            status: 0,
            retry_after: None,
            body: err.to_string(),
        },
    }
}

fn tally(outcomes: &[Outcome]) -> String {
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for outcome in outcomes {
        *counts.entry(outcome.status).or_default() += 1;
    }
    counts
        .iter()
        .map(|(status, n)| format!("{n} x {status}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    redlock_examples::init_tracing();
    let nodes = Nodes::from_env_or_start(3).await;
    let client_for_replica = || {
        Redlock::builder()
            .nodes(nodes.urls())
            .ttl(Duration::from_secs(2))
            .node_timeout(Duration::from_millis(50))
            .build()
    };
    let (redlock_a, redlock_b) = (client_for_replica()?, client_for_replica()?);
    println!(
        "redlock-actix example: {} (quorum {}), replicas A and B with 2 workers each",
        nodes.describe(),
        redlock_a.quorum()
    );
    redlock_examples::wait_until_ready(&redlock_a).await;

    let world = web::Data::new(World::default());
    let dir = tempfile::tempdir()?;
    let db = web::Data::new(WriteLog::create(&dir.path().join("ledger.db")).await?);
    let (a, stop_a) = start_replica("A", redlock_a, world.clone(), db.clone()).await?;
    let (b, stop_b) = start_replica("B", redlock_b, world.clone(), db.clone()).await?;
    let mut ok = 0;
    let replica = |i: usize| if i.is_multiple_of(2) { &a } else { &b };
    let http = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let mut failed = false;

    // 1. The extractor, failing fast.
    println!("\n1. extractor: 10 simultaneous payments of order 42, alternating replicas");
    let outcomes = futures_util::future::join_all(
        (0..10).map(|i| post(&http, format!("{}/orders/42/pay", replica(i)))),
    )
    .await;
    println!("   {}", tally(&outcomes));
    for outcome in &outcomes {
        match outcome.status {
            200 => println!("   200 {}", outcome.body),
            409 => {}
            _ => {
                println!("   unexpected: {} {}", outcome.status, outcome.body);
                failed = true;
            }
        }
    }
    if let Some(busy) = outcomes.iter().find(|o| o.status == 409) {
        println!(
            "   409 Retry-After: {} s, application/problem+json:\n   {}",
            busy.retry_after.as_deref().unwrap_or("-"),
            busy.body
        );
    }
    let paid = outcomes.iter().filter(|o| o.status == 200).count();
    ok += paid;
    if paid == 0 {
        println!("   no payment went through");
        failed = true;
    }

    println!("\n   5 different orders at once:");
    let started = Instant::now();
    let outcomes = futures_util::future::join_all(
        (1..=5).map(|i| post(&http, format!("{}/orders/{i}/pay", replica(i)))),
    )
    .await;
    println!(
        "   {} in {} ms (each holds its lock 200 ms: they ran in parallel)",
        tally(&outcomes),
        started.elapsed().as_millis()
    );
    failed |= outcomes.iter().any(|o| o.status != 200);
    ok += outcomes.iter().filter(|o| o.status == 200).count();

    // 2. The middleware, waiting.
    println!("\n2. middleware: 10 simultaneous deposits of 10 to account 7, alternating replicas");
    let started = Instant::now();
    let outcomes = futures_util::future::join_all(
        (0..10).map(|i| post(&http, format!("{}/accounts/7/deposit", replica(i)))),
    )
    .await;
    let balance = world
        .balances
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&7)
        .copied()
        .unwrap_or_default();
    println!(
        "   {} in {} ms; balance {balance} (expected 100)",
        tally(&outcomes),
        started.elapsed().as_millis()
    );
    if let Some(last) = outcomes.iter().find(|o| o.body.contains("-> 100")) {
        println!("   last: {}", last.body);
    }
    failed |= outcomes.iter().any(|o| o.status != 200) || balance != 100;
    ok += outcomes.iter().filter(|o| o.status == 200).count();

    let double = world.double_charge.load(Ordering::SeqCst);
    println!(
        "\ncharges: {}; an order charged twice at once: {}",
        world.charges.load(Ordering::SeqCst),
        if double { "YES" } else { "no" }
    );
    failed |= double;

    if let Some(problem) = db.report(ok).await? {
        println!("   {problem}");
        failed = true;
    }
    stop_a.stop(true).await;
    stop_b.stop(true).await;
    if failed {
        println!("FAILED");
        std::process::exit(1);
    }
    println!("ok");
    Ok(())
}
