//! redlock-tower in an axum app: two replicas of a payment service never charge the
//! same order at the same time, and every charge is a fenced SQL write.
//!
//! ```text
//! cargo run -p redlock-examples --bin tower_axum
//! ```
//!
//! Starts 3 local `redis-server` nodes (unless `REDLOCK_NODES` lists some), then two
//! instances of the app on two loopback ports, each with its own lock client (as two
//! replicas behind a load balancer would be), sharing one SQLite database (a temporary
//! file). The app has
//! - `POST /orders/{id}/pay`: locked per order, failing fast (`409` + `Retry-After`);
//! - `POST /orders/{id}/refund`: locked per order, waiting up to 5 s for its turn.
//!
//! Both layers take their locks with a fencing token, which the handler gets as a
//! [`FencingToken`] argument. After its work, the handler records the charge or refund
//! in SQL, fenced: in one transaction, `SqlFence::check` admits the lock's token for
//! `order:{id}` (and records it as the highest seen), then the row is inserted, then
//! the transaction commits. A token lower than one already seen for the order (a
//! replica whose lock expired while it was paused, and was taken since) is refused and
//! rolled back; the client gets `409` saying so.
//!
//! Then it fires concurrent requests at both instances, prints each outcome, and checks
//! that no two charges or refunds of one order overlapped, that every `200` is one
//! committed fenced write, and that each order's writes committed with rising tokens
//! (exits non-zero if not). It prints how many fenced writes committed and how many were
//! refused as stale (none, unless a lock was lost), with the reason of each refusal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Router};
use redlock_core::LockHandle;
use redlock_core::Redlock;
use redlock_examples::Nodes;
use redlock_examples::fenced::WriteLog;
use redlock_fence::FenceError;
use redlock_tower::extract::PathParam;
use redlock_tower::{FencingToken, LockLayer, LockOptions};

/// What the "payment provider" saw: per order, the intervals it was busy with it.
type Ledger = Arc<Mutex<BTreeMap<String, Vec<(Instant, Instant)>>>>;

const WORK: Duration = Duration::from_millis(300);

fn app(replica: usize, redlock: Redlock, ledger: Ledger, db: Arc<WriteLog>) -> Router {
    let per_order = PathParam::new("id");
    // Every lock carries a fencing token: the handlers take it as an argument.
    let pay = LockLayer::new(redlock.clone(), per_order.clone())
        .options(LockOptions::new().resource_prefix("order:").fencing(true));
    let refund = LockLayer::new(redlock, per_order).options(
        LockOptions::new()
            .resource_prefix("order:")
            .fencing(true)
            .wait(Duration::from_secs(5)),
    );
    let handler = move |kind: &'static str| {
        let (ledger, db) = (Arc::clone(&ledger), Arc::clone(&db));
        move |Path(id): Path<String>,
              Extension(lock): Extension<LockHandle>,
              FencingToken(token): FencingToken| {
            let (ledger, db) = (Arc::clone(&ledger), Arc::clone(&db));
            async move {
                let start = Instant::now();
                tokio::time::sleep(WORK).await; // talking to the payment provider
                ledger
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(id.clone())
                    .or_default()
                    .push((start, Instant::now()));
                match db
                    .record(lock.resource(), token, kind, &replica.to_string())
                    .await
                {
                    Ok(()) => (
                        StatusCode::OK,
                        format!(
                            "{kind} done on replica {replica} under `{}`, token {token} ({} ms of validity left)",
                            lock.resource(),
                            lock.validity().as_millis()
                        ),
                    ),
                    Err(FenceError::Stale { highest, .. }) => (
                        StatusCode::CONFLICT,
                        format!(
                            "{kind} of order {id} refused: the lock was taken by a newer holder (token {highest}) since this replica got token {token}; nothing was written"
                        ),
                    ),
                    Err(error) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("{kind} of order {id} not recorded: {error}"),
                    ),
                }
            }
        }
    };
    Router::new()
        .route("/orders/{id}/pay", post(handler("pay")).route_layer(pay))
        .route(
            "/orders/{id}/refund",
            post(handler("refund")).route_layer(refund),
        )
}

async fn serve(app: Router) -> Result<String, std::io::Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(format!("http://{addr}"))
}

/// Sends `paths` at once, alternating between the replicas; prints each outcome;
/// returns how many got `200`.
async fn burst(
    title: &str,
    client: &reqwest::Client,
    replicas: &[String],
    paths: &[String],
) -> Result<usize, Box<dyn std::error::Error>> {
    println!("\n{title}");
    let started = Instant::now();
    let mut requests = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let url = format!("{}{path}", replicas[i % replicas.len()]);
        let client = client.clone();
        requests.push(tokio::spawn(async move {
            let response = client.post(&url).send().await?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = response.text().await?;
            Ok::<_, reqwest::Error>((url, status, retry_after, body, started.elapsed()))
        }));
    }
    let mut ok = 0;
    for request in requests {
        let (url, status, retry_after, body, at) = request.await??;
        ok += usize::from(status == reqwest::StatusCode::OK);
        let detail = match retry_after {
            Some(secs) => format!("Retry-After: {secs} s; {}", first_chars(&body, 70)),
            None => body,
        };
        println!(
            "  {:>5} ms  POST {url:<45} {status}  {detail}",
            at.as_millis()
        );
    }
    Ok(ok)
}

fn first_chars(s: &str, n: usize) -> String {
    let cut: String = s.chars().take(n).collect();
    if cut.len() < s.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    redlock_examples::init_tracing();
    let nodes = Nodes::from_env_or_start(3).await;
    let ledger: Ledger = Arc::default();
    let dir = tempfile::tempdir()?;
    let db = Arc::new(WriteLog::create(&dir.path().join("orders.db")).await?);
    let mut replicas = Vec::new();
    for replica in 0..2 {
        let redlock = Redlock::builder()
            .nodes(nodes.urls())
            .ttl(Duration::from_secs(2))
            .node_timeout(Duration::from_millis(50))
            .build()?;
        if replica == 0 {
            redlock_examples::wait_until_ready(&redlock).await;
        }
        replicas.push(serve(app(replica, redlock, Arc::clone(&ledger), Arc::clone(&db))).await?);
    }
    println!(
        "tower_axum: 2 replicas ({}) over {}; each request works {} ms under its order's lock, then records it in SQLite, fenced by the lock's token",
        replicas.join(", "),
        nodes.describe(),
        WORK.as_millis()
    );
    let client = reqwest::Client::builder().no_proxy().build()?;

    let mut ok = 0;
    let same: Vec<String> = (0..6).map(|_| "/orders/42/pay".to_owned()).collect();
    ok += burst(
        "6 concurrent payments of order 42 (fail fast): one runs, the others get 409",
        &client,
        &replicas,
        &same,
    )
    .await?;
    let distinct: Vec<String> = (1..=4).map(|id| format!("/orders/{id}/pay")).collect();
    ok += burst(
        "4 concurrent payments of 4 different orders: all run side by side",
        &client,
        &replicas,
        &distinct,
    )
    .await?;
    let queued: Vec<String> = (0..4).map(|_| "/orders/7/refund".to_owned()).collect();
    ok += burst(
        "4 concurrent refunds of order 7 (wait up to 5 s): all run, one at a time",
        &client,
        &replicas,
        &queued,
    )
    .await?;

    let ledger = ledger.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut overlaps = 0;
    for (order, intervals) in &ledger {
        let mut sorted = intervals.clone();
        sorted.sort();
        overlaps += sorted.windows(2).filter(|w| w[1].0 < w[0].1).count();
        println!("order {order}: {} run(s)", sorted.len());
    }
    if overlaps > 0 {
        return Err(format!("{overlaps} overlapping runs of one order").into());
    }
    println!("no two runs of one order overlapped");

    if let Some(problem) = db.report(ok).await? {
        return Err(problem.into());
    }
    Ok(())
}
