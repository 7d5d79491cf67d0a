//! Fenced SQL writes against PostgreSQL (`DATABASE_URL`) and SQLite files: tokens are
//! checked and raised in the write's transaction; a stale holder's write is refused and
//! rolled back, also while a newer holder's transaction is still open, and across a real
//! lock's pause past its validity; without the fence (the negative control) the stale
//! write goes through.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;
use redlock_core::{ArgumentError, RetryPolicy};
use redlock_fence::{FenceError, SqlFence};
use redlock_testkit::{Cluster, require, unique_name};
use sqlx::Executor;

/// Applies a fenced (or, `fenced == false`, an unfenced) write of `value` to row `key`
/// of `data` under `token`; whether it was committed.
async fn write<DB>(
    pool: &sqlx::Pool<DB>,
    fence: &SqlFence,
    data: &str,
    token: u64,
    value: i64,
    fenced: bool,
) -> bool
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Decode<'q, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let mut tx = pool.begin().await.unwrap();
    if fenced {
        match fence.check(&mut *tx, "account:1", token).await {
            Ok(()) => {}
            Err(FenceError::Stale {
                token: t, highest, ..
            }) => {
                assert_eq!(t, token);
                assert!(highest > token);
                tx.rollback().await.unwrap();
                return false;
            }
            Err(err) => panic!("{err}"),
        }
    }
    sqlx::query(&format!("UPDATE {data} SET value = $1 WHERE id = 1"))
        .bind(value)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    true
}

async fn value<DB>(pool: &sqlx::Pool<DB>, data: &str) -> i64
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Decode<'q, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    sqlx::query_scalar(&format!("SELECT value FROM {data} WHERE id = 1"))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn sqlite() -> (sqlx::SqlitePool, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("data.db").display());
    (sqlx::SqlitePool::connect(&url).await.unwrap(), dir)
}

/// A pool on `DATABASE_URL`'s database, or `None` when it is unset (the test then says
/// it is skipped, or fails under `REDLOCK_REQUIRE_ALL_TESTS`).
async fn postgres() -> Option<sqlx::PgPool> {
    let url = require::database_url()?;
    Some(sqlx::PgPool::connect(&url).await.unwrap())
}

/// The rules, whatever the database: first, equal and higher tokens pass; a lower one
/// is refused with both tokens, and its write rolled back.
macro_rules! tokens_only_go_up {
    ($pool:expr) => {{
        let pool = $pool;
        let fence = SqlFence::with_table(unique_name("fences")).unwrap();
        fence.migrate(&pool).await.unwrap();
        fence.migrate(&pool).await.unwrap(); // again: nothing happens
        let data = unique_name("data");
        sqlx::query(&format!(
            "CREATE TABLE {data} (id BIGINT PRIMARY KEY, value BIGINT)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(&format!("INSERT INTO {data} VALUES (1, 0)"))
            .execute(&pool)
            .await
            .unwrap();
        assert!(write(&pool, &fence, &data, 5, 5, true).await);
        assert!(
            write(&pool, &fence, &data, 5, 55, true).await,
            "the same token again"
        );
        assert!(write(&pool, &fence, &data, 7, 7, true).await);
        assert!(
            !write(&pool, &fence, &data, 6, 6, true).await,
            "a lower token"
        );
        assert_eq!(
            value(&pool, &data).await,
            7,
            "the refused write was rolled back"
        );
        let mut conn = pool.acquire().await.unwrap();
        match fence.check(&mut *conn, "account:1", 3).await {
            Err(FenceError::Stale {
                resource,
                token: 3,
                highest: 7,
            }) => {
                assert_eq!(resource, "account:1")
            }
            other => panic!("{other:?}"),
        }
        // Another resource has its own counter.
        fence.check(&mut *conn, "account:2", 1).await.unwrap();
        assert!(matches!(
            fence.check(&mut *conn, "account:2", u64::MAX).await,
            Err(FenceError::TokenOutOfRange { .. })
        ));
        // The negative control: unfenced, the stale write goes through.
        assert!(write(&pool, &fence, &data, 6, 6, false).await);
        assert_eq!(value(&pool, &data).await, 6);
        for table in [data.as_str(), fence.table()] {
            sqlx::query(&format!("DROP TABLE {table}"))
                .execute(&pool)
                .await
                .unwrap();
        }
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_tokens_only_go_up() {
    let (pool, _dir) = sqlite().await;
    tokens_only_go_up!(pool);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tokens_only_go_up() {
    let Some(pool) = postgres().await else {
        return;
    };
    tokens_only_go_up!(pool);
}

/// A name of `len` letters that does not compress (PostgreSQL compresses a long value
/// before it indexes it, so a repeated letter would fit).
fn incompressible(len: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// Resource names follow the locks' rule: a 10 KB name (which PostgreSQL's primary key
/// index cannot take) and an empty one are refused with `InvalidResource` before
/// anything is sent; the longest name a lock takes is fenced; a raised bound takes
/// longer names.
macro_rules! resource_names_are_bounded {
    ($pool:expr) => {{
        let pool = $pool;
        let fence = SqlFence::with_table(unique_name("fences")).unwrap();
        fence.migrate(&pool).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let long = incompressible(10 * 1024);
        match fence.check(&mut *conn, &long, 1).await {
            Err(FenceError::InvalidResource(ArgumentError::ResourceTooLong {
                len, max, ..
            })) => {
                assert_eq!((len, max), (10 * 1024, DEFAULT_MAX_RESOURCE_LEN));
            }
            other => panic!("expected InvalidResource, got {other:?}"),
        }
        assert!(matches!(
            fence.check(&mut *conn, "", 1).await,
            Err(FenceError::InvalidResource(ArgumentError::EmptyResource))
        ));
        fence
            .check(&mut *conn, &incompressible(DEFAULT_MAX_RESOURCE_LEN), 1)
            .await
            .unwrap();
        let raised = fence.clone().max_resource_len(2048);
        raised
            .check(&mut *conn, &incompressible(2048), 1)
            .await
            .unwrap();
        let rows: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", fence.table()))
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(rows, 2, "the refused names wrote nothing");
        drop(conn);
        sqlx::query(&format!("DROP TABLE {}", fence.table()))
            .execute(&pool)
            .await
            .unwrap();
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_resource_names_are_bounded() {
    let (pool, _dir) = sqlite().await;
    resource_names_are_bounded!(pool);
    // The same rule as the locks': no lock is taken for such a name either (refused
    // before any node is asked).
    let redlock = redlock_testkit::builder_for(["redis://127.0.0.1:1"])
        .build()
        .unwrap();
    assert!(matches!(
        redlock.try_lock(incompressible(10 * 1024)).await,
        Err(redlock_core::Error::Argument(
            ArgumentError::ResourceTooLong { .. }
        ))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_resource_names_are_bounded() {
    let Some(pool) = postgres().await else {
        return;
    };
    resource_names_are_bounded!(pool);
}

/// A stale holder whose check comes while the newer holder's transaction is open waits
/// for its commit (the fence row is locked), then is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_stale_check_waits_for_the_newer_commit() {
    let Some(pool) = postgres().await else {
        return;
    };
    let fence = SqlFence::with_table(unique_name("fences")).unwrap();
    fence.migrate(&pool).await.unwrap();
    fence.check(&pool, "r", 5).await.unwrap();
    let mut newer = pool.begin().await.unwrap();
    fence.check(&mut *newer, "r", 6).await.unwrap();
    let stale = {
        let (pool, fence) = (pool.clone(), fence.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let result = fence.check(&mut *tx, "r", 5).await;
            tx.rollback().await.unwrap();
            result
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !stale.is_finished(),
        "the stale check waits for the open transaction"
    );
    newer.commit().await.unwrap();
    match stale.await.unwrap() {
        Err(FenceError::Stale {
            token: 5,
            highest: 6,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    sqlx::query(&format!("DROP TABLE {}", fence.table()))
        .execute(&pool)
        .await
        .unwrap();
}

/// Real locks: a holder paused past its lock's validity; another client takes the lock
/// and writes; the first resumes and writes: refused by the fence, accepted without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_write_is_refused_after_a_newer_holder_wrote() {
    let cluster = Cluster::start(3).await;
    let client = || {
        redlock_testkit::builder(&cluster)
            .fencing(true)
            .ttl(Duration::from_millis(300))
            .retry(RetryPolicy::deadline(Duration::from_secs(5)))
            .build()
            .unwrap()
    };
    let (first, second) = (client(), client());
    let (pool, _dir) = sqlite().await;
    let fence = SqlFence::new();
    fence.migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE data (id BIGINT PRIMARY KEY, value BIGINT)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO data VALUES (1, 0)")
        .execute(&pool)
        .await
        .unwrap();

    let paused = first.lock("account:1").await.unwrap();
    let stale_token = paused.fencing_token().unwrap();
    // "Paused": it does nothing while its lock expires.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!paused.is_valid());
    let newer = second.lock("account:1").await.unwrap();
    let token = newer.fencing_token().unwrap();
    assert!(token > stale_token);
    assert!(write(&pool, &fence, "data", token, 2, true).await);
    // It resumes, still holding its old token.
    assert!(!write(&pool, &fence, "data", stale_token, 1, true).await);
    assert_eq!(value(&pool, "data").await, 2);
    // Without the fence the stale write would have gone through.
    assert!(write(&pool, &fence, "data", stale_token, 1, false).await);
    assert_eq!(value(&pool, "data").await, 1);
    drop((paused, newer));
}
