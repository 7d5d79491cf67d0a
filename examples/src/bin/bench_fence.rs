//! Benchmark: fenced vs plain SQL updates per second on PostgreSQL, in one run.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --release -p redlock-examples --bin bench_fence
//! ```
//!
//! Each client updates its own account row in a transaction, as a lock holder would
//! (one resource per client: the fence's cost, not contention on one row):
//!
//! - plain: `BEGIN; UPDATE accounts SET balance = balance + 1 ..; COMMIT`;
//! - fenced: the same with `SqlFence::check` (one upsert statement) before the update.
//!
//! Slices of both kinds alternate (`BENCH_SLICES`, default 6 of each, `BENCH_SECS` long,
//! default 2), at each concurrency in `BENCH_CLIENTS` (default `1,8,32`), so that a
//! drift of the machine hits both alike. Prints updates/s and latency for each kind, and
//! the ratio fenced / plain against the target: one extra statement in the same round
//! trips, so at least 3 / 4 of the plain rate (a plain write is three round trips).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redlock_examples::measure::{OpError, closed_loop, fmt_us, quantiles, verdict};
use redlock_fence::SqlFence;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One update of `client`'s account, fenced or not.
async fn update(
    pool: &PgPool,
    fence: &SqlFence,
    table: &str,
    client: usize,
    token: u64,
    fenced: bool,
) -> Result<(), OpError> {
    let mut tx: sqlx::Transaction<'_, Postgres> = pool.begin().await?;
    let account = format!("account-{client}");
    if fenced {
        fence.check(&mut *tx, &account, token).await?;
    }
    sqlx::query(&format!(
        "UPDATE {table} SET balance = balance + 1 WHERE id = $1"
    ))
    .bind(&account)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), OpError> {
    redlock_examples::init_tracing();
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL to a PostgreSQL database (postgres://USER@HOST/DB)")?;
    let secs: f64 = env("BENCH_SECS", 2.0);
    let slices: usize = env("BENCH_SLICES", 6);
    let clients: Vec<usize> = std::env::var("BENCH_CLIENTS")
        .unwrap_or_else(|_| "1,8,32".to_owned())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let max_clients = clients.iter().copied().max().unwrap_or(1);
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(max_clients)?)
        .connect(&url)
        .await?;
    let table = format!("bench_fence_accounts_{}", std::process::id());
    let fence = SqlFence::with_table(format!("bench_fence_fences_{}", std::process::id()))?;
    fence.migrate(&pool).await?;
    sqlx::query(&format!(
        "CREATE TABLE {table} (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)"
    ))
    .execute(&pool)
    .await?;
    for client in 0..max_clients {
        sqlx::query(&format!("INSERT INTO {table} VALUES ($1, 0)"))
            .bind(format!("account-{client}"))
            .execute(&pool)
            .await?;
    }
    println!("redlock bench_fence: PostgreSQL, {slices} slices of {secs} s per kind, alternating");
    let slice = Duration::from_secs_f64(secs);
    // Tokens rise across slices, as a lock's do across holders.
    let tokens = Arc::new(AtomicU64::new(1));
    let mut all_met = true;
    for &c in &clients {
        let mut totals = [
            (0usize, Duration::ZERO, Vec::new()),
            (0, Duration::ZERO, Vec::new()),
        ];
        for round in 0..slices * 2 {
            // plain, fenced, fenced, plain, ...: each kind goes first as often.
            let fenced = (round % 4 == 1) || (round % 4 == 2);
            let (pool, fence, table) = (pool.clone(), fence.clone(), Arc::new(table.clone()));
            let tokens = Arc::clone(&tokens);
            let (mut samples, took) = closed_loop(c, slice, move |client, _| {
                let (pool, fence, table) = (pool.clone(), fence.clone(), Arc::clone(&table));
                let token = tokens.fetch_add(1, Ordering::Relaxed);
                async move { update(&pool, &fence, &table, client, token, fenced).await }
            })
            .await?;
            let total = &mut totals[usize::from(fenced)];
            total.0 += samples.len();
            total.1 += took;
            total.2.append(&mut samples);
        }
        let mut rates = [0.0; 2];
        for (kind, (count, took, samples)) in totals.iter_mut().enumerate() {
            let rate = *count as f64 / took.as_secs_f64();
            rates[kind] = rate;
            let [p50, p99] = quantiles(samples, [0.5, 0.99]);
            println!(
                "  c={c:<3} {:<6} {rate:>9.0} updates/s   p50 {:>9}   p99 {:>9}",
                if kind == 1 { "fenced" } else { "plain" },
                fmt_us(p50),
                fmt_us(p99)
            );
        }
        let ratio = rates[1] / rates[0];
        let met = ratio >= 0.75;
        all_met &= met;
        println!(
            "  c={c:<3} fenced / plain = {ratio:.2} (target >= 0.75: {})",
            verdict(met)
        );
    }
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await?;
    sqlx::query(&format!("DROP TABLE {}", fence.table()))
        .execute(&pool)
        .await?;
    println!(
        "fenced writes: {}",
        if all_met {
            "within one extra statement's cost at every concurrency"
        } else {
            "MISSED the target somewhere"
        }
    );
    Ok(())
}
