//! Concurrent holders under a fault schedule, for each fenced store (PostgreSQL at
//! `DATABASE_URL`, an SQLite file, a data Redis): four holders take one lock on a
//! three-node cluster whose minority node is paused, restarted, cut off or slowed
//! meanwhile; some holders stall past their lock's TTL and then write, still believing
//! they hold it. The claim checked is the fence's: in the order the store accepted
//! writes, tokens never go down (no write is accepted under a token lower than one
//! already accepted). The order is the store's own: the log table's ids, assigned in
//! the write's transaction after the fence check (whose row lock, or SQLite's single
//! writer, orders the transactions); for Redis, the data key's `SET`s as the server
//! executed them, read from `MONITOR`. The runs must also refuse some stale writes (the
//! schedule produced them) and accept many. The negative control runs the same
//! schedule with the fence check left out: it must accept stale writes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redlock_core::RetryPolicy;
use redlock_fence::{FenceError, RedisFence, SqlFence};
use redlock_testkit::{
    Cluster, FaultKind, Persistence, RedisServer, require, run_faults, unique_name,
};
use tokio::task::JoinHandle;

const RESOURCE: &str = "ledger";
const TTL: Duration = Duration::from_millis(300);
const HOLDERS: u64 = 4;
const FENCED_RUN: Duration = Duration::from_secs(8);
const UNFENCED_RUN: Duration = Duration::from_secs(4);
/// The data key of the Redis store.
const DATA_KEY: &str = "ledger:data";
/// Echoed to the data Redis once the holders are done: the end of the `MONITOR` log.
const END_OF_LOG: &str = "end-of-the-schedule";

/// xorshift64*: enough randomness for stalls, reproducible per holder.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Where the holders write, and how the store's acceptance order is read back.
enum Store {
    Postgres {
        pool: sqlx::PgPool,
        fence: SqlFence,
        log: String,
    },
    Sqlite {
        pool: sqlx::SqlitePool,
        fence: SqlFence,
        log: String,
        _dir: tempfile::TempDir,
    },
    Redis {
        _server: RedisServer,
        conn: MultiplexedConnection,
        fence: RedisFence,
        /// The data key's values, in the order the server set them.
        monitor: tokio::sync::Mutex<Option<JoinHandle<Vec<String>>>>,
    },
}

/// One fenced (or, `fenced == false`, unfenced) write in an SQL transaction: the fence
/// check, then the log row.
macro_rules! sql_write {
    ($pool:expr, $fence:expr, $log:expr, $token:expr, $writer:expr, $seq:expr, $fenced:expr) => {{
        let mut tx = $pool.begin().await.unwrap();
        if $fenced {
            if let Err(err) = $fence.check(&mut *tx, RESOURCE, $token).await {
                tx.rollback().await.unwrap();
                return Err(err);
            }
        }
        sqlx::query(&format!(
            "INSERT INTO {} (token, writer, seq) VALUES ($1, $2, $3)",
            $log
        ))
        .bind(i64::try_from($token).unwrap())
        .bind(i64::try_from($writer).unwrap())
        .bind(i64::try_from($seq).unwrap())
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        Ok(())
    }};
}

impl Store {
    async fn postgres(url: &str) -> Self {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        let fence = SqlFence::with_table(unique_name("fences")).unwrap();
        fence.migrate(&pool).await.unwrap();
        let log = unique_name("log");
        sqlx::query(&format!(
            "CREATE TABLE {log} (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL, writer BIGINT NOT NULL, seq BIGINT NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Self::Postgres { pool, fence, log }
    }

    async fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("data.db").display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let fence = SqlFence::new();
        fence.migrate(&pool).await.unwrap();
        let log = "log".to_owned();
        sqlx::query(&format!(
            "CREATE TABLE {log} (id INTEGER PRIMARY KEY AUTOINCREMENT, token BIGINT NOT NULL, writer BIGINT NOT NULL, seq BIGINT NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Self::Sqlite {
            pool,
            fence,
            log,
            _dir: dir,
        }
    }

    /// A data Redis (AOF, as the fence asks), and a `MONITOR` of it that collects the
    /// values set on the data key until [`END_OF_LOG`] is echoed.
    async fn redis() -> Self {
        let server = RedisServer::start(Persistence::AofAlways).await;
        let conn = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let monitor = server.client().get_async_monitor().await.unwrap();
        let monitor = tokio::spawn(async move {
            let mut lines = monitor.into_on_message::<String>();
            let mut values = Vec::new();
            while let Some(line) = lines.next().await {
                if line.contains(END_OF_LOG) {
                    return values;
                }
                if let Some(value) = set_of_data_key(&line) {
                    values.push(value);
                }
            }
            panic!("the monitor stopped before the end of the log");
        });
        Self::Redis {
            _server: server,
            conn,
            fence: RedisFence::new(),
            monitor: tokio::sync::Mutex::new(Some(monitor)),
        }
    }

    /// Writes `token` (and who wrote it) under the fence, or without it.
    async fn write(
        &self,
        token: u64,
        writer: u64,
        seq: u64,
        fenced: bool,
    ) -> Result<(), FenceError> {
        match self {
            Self::Postgres { pool, fence, log } => {
                sql_write!(pool, fence, log, token, writer, seq, fenced)
            }
            Self::Sqlite {
                pool, fence, log, ..
            } => sql_write!(pool, fence, log, token, writer, seq, fenced),
            Self::Redis { conn, fence, .. } => {
                let mut conn = conn.clone();
                let value = format!("{token}:{writer}:{seq}");
                if fenced {
                    fence
                        .set(&mut conn, RESOURCE, token, DATA_KEY, value, None)
                        .await
                } else {
                    redis::cmd("SET")
                        .arg(DATA_KEY)
                        .arg(value)
                        .query_async::<()>(&mut conn)
                        .await
                        .unwrap();
                    Ok(())
                }
            }
        }
    }

    /// The tokens of the accepted writes, in the order the store accepted them.
    async fn accepted_tokens(&self) -> Vec<u64> {
        let tokens: Vec<i64> = match self {
            Self::Postgres { pool, log, .. } => {
                sqlx::query_scalar(&format!("SELECT token FROM {log} ORDER BY id"))
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }
            Self::Sqlite { pool, log, .. } => {
                sqlx::query_scalar(&format!("SELECT token FROM {log} ORDER BY id"))
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }
            Self::Redis { conn, monitor, .. } => {
                let _: String = redis::cmd("ECHO")
                    .arg(END_OF_LOG)
                    .query_async(&mut conn.clone())
                    .await
                    .unwrap();
                let monitor = monitor.lock().await.take().expect("read once");
                let values = tokio::time::timeout(Duration::from_secs(5), monitor)
                    .await
                    .expect("the monitor reaches the end of the log")
                    .unwrap();
                values
                    .iter()
                    .map(|value| value.split(':').next().unwrap().parse().unwrap())
                    .collect()
            }
        };
        tokens
            .into_iter()
            .map(|token| u64::try_from(token).unwrap())
            .collect()
    }

    async fn drop_tables(&self) {
        if let Self::Postgres { pool, fence, log } = self {
            for table in [log.as_str(), fence.table()] {
                sqlx::query(&format!("DROP TABLE {table}"))
                    .execute(pool)
                    .await
                    .unwrap();
            }
        }
    }
}

/// The value of a `SET` of [`DATA_KEY`] in a `MONITOR` line
/// (`1700000000.000000 [0 lua] "SET" "ledger:data" "12:3:7"`), whether a script or a
/// client sent it.
fn set_of_data_key(line: &str) -> Option<String> {
    let (_, command) = line.split_once("] ")?;
    let args: Vec<&str> = command
        .split(' ')
        .map(|arg| arg.trim_matches('"'))
        .collect();
    match args[..] {
        [name, key, value, ..] if name.eq_ignore_ascii_case("SET") && key == DATA_KEY => {
            Some(value.to_owned())
        }
        _ => None,
    }
}

#[derive(Default)]
struct Tally {
    accepted: AtomicUsize,
    refused: AtomicUsize,
    stalled: AtomicUsize,
    lock_failed: AtomicUsize,
}

/// Takes the lock, sometimes stalls past its TTL, then writes under its token, still
/// believing it holds the lock; until `until`.
async fn holder(
    writer: u64,
    urls: Vec<String>,
    store: Arc<Store>,
    fenced: bool,
    until: Instant,
    tally: Arc<Tally>,
) {
    let client = redlock_testkit::builder_for(urls)
        .restart_quarantine(true) // nodes restarted empty (the faults) must not vote at once
        .fencing(true)
        .ttl(TTL)
        .node_timeout(Duration::from_millis(50))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(2))
                .with_delay(Duration::from_millis(5), Duration::from_millis(10)),
        )
        .build()
        .unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(writer + 1));
    let mut seq = 0;
    while Instant::now() < until {
        let Ok(lock) = client.lock(RESOURCE).await else {
            tally.lock_failed.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let token = lock.fencing_token().expect("fencing is on");
        if rng.below(4) == 0 {
            // Stalled (a GC pause, a swapped-out process) past the lock's TTL.
            tally.stalled.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(TTL + Duration::from_millis(100 + rng.below(300))).await;
        } else {
            tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
        }
        match store.write(token, writer, seq, fenced).await {
            Ok(()) => {
                tally.accepted.fetch_add(1, Ordering::Relaxed);
            }
            Err(FenceError::Stale {
                token: refused,
                highest,
                ..
            }) => {
                assert_eq!(refused, token);
                assert!(highest > token, "refused {token} under {highest}");
                tally.refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => panic!("writer {writer}: {err}"),
        }
        seq += 1;
        let _ = lock.release().await;
    }
}

/// What one run found.
struct Outcome {
    accepted: usize,
    refused: usize,
    stale_accepted: usize,
}

/// Runs the holders over a faulty cluster for `run_for`, then checks the store's log
/// against the holders' own count.
async fn schedule(name: &str, store: Store, fenced: bool, run_for: Duration) -> Outcome {
    let cluster = Arc::new(tokio::sync::Mutex::new(Cluster::start_proxied(3).await));
    let urls = cluster.lock().await.urls();
    let stop = Arc::new(AtomicBool::new(false));
    let faults = tokio::spawn(run_faults(
        Arc::clone(&cluster),
        &[
            FaultKind::Pause,
            FaultKind::Restart,
            FaultKind::Cut,
            FaultKind::Delay,
        ],
        1,
        Duration::from_millis(400),
        // The restart quarantine: the max TTL + 1 s of uptime rounding.
        TTL + Duration::from_secs(1),
        Arc::clone(&stop),
        u64::from(fenced) + 11,
    ));
    let store = Arc::new(store);
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let until = started + run_for;
    let holders: Vec<_> = (0..HOLDERS)
        .map(|writer| {
            tokio::spawn(holder(
                writer,
                urls.clone(),
                Arc::clone(&store),
                fenced,
                until,
                Arc::clone(&tally),
            ))
        })
        .collect();
    for holder in holders {
        holder.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let report = faults.await.unwrap();

    let tokens = store.accepted_tokens().await;
    store.drop_tables().await;
    let mut highest = 0;
    let mut stale_accepted = 0;
    for &token in &tokens {
        if token < highest {
            stale_accepted += 1;
        }
        highest = highest.max(token);
    }
    let outcome = Outcome {
        accepted: tally.accepted.load(Ordering::Relaxed),
        refused: tally.refused.load(Ordering::Relaxed),
        stale_accepted,
    };
    eprintln!(
        "{name} ({}): {} writes accepted, {} refused as stale, {} stale writes accepted; \
         {} holders stalled past the TTL, {} lock calls failed; \
         faults (pause, restart, cut, delay) = {:?}; {:.1} s",
        if fenced { "fenced" } else { "unfenced" },
        outcome.accepted,
        outcome.refused,
        outcome.stale_accepted,
        tally.stalled.load(Ordering::Relaxed),
        tally.lock_failed.load(Ordering::Relaxed),
        report.counts,
        started.elapsed().as_secs_f64(),
    );
    assert_eq!(
        tokens.len(),
        outcome.accepted,
        "{name}: the store logged exactly the writes it accepted"
    );
    assert!(
        report.counts.iter().sum::<usize>() > 0,
        "{name}: faults ran"
    );
    outcome
}

async fn fenced(name: &str, store: Store) {
    let outcome = schedule(name, store, true, FENCED_RUN).await;
    assert_eq!(
        outcome.stale_accepted, 0,
        "{name}: a stale write was accepted"
    );
    assert!(outcome.refused > 0, "{name}: no stale write was attempted");
    assert!(
        outcome.accepted >= 20,
        "{name}: only {} writes",
        outcome.accepted
    );
}

async fn unfenced(name: &str, store: Store) {
    let outcome = schedule(name, store, false, UNFENCED_RUN).await;
    assert_eq!(outcome.refused, 0);
    assert!(
        outcome.stale_accepted > 0,
        "{name}: without the fence, the schedule must let a stale write through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_accepts_no_stale_write() {
    let Some(url) = require::database_url() else {
        return;
    };
    fenced("postgres", Store::postgres(&url).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_without_the_fence_accepts_stale_writes() {
    let Some(url) = require::database_url() else {
        return;
    };
    unfenced("postgres", Store::postgres(&url).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_accepts_no_stale_write() {
    fenced("sqlite", Store::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_without_the_fence_accepts_stale_writes() {
    unfenced("sqlite", Store::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_accepts_no_stale_write() {
    fenced("redis", Store::redis().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_the_fence_accepts_stale_writes() {
    unfenced("redis", Store::redis().await).await;
}
