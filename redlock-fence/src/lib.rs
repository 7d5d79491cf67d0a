//! The storage side of fencing tokens.
//!
//! A lock alone cannot stop a holder that was paused past its lock's validity from
//! writing afterwards: it still believes it holds the lock. A fencing token
//! ([`Lock::fencing_token`](https://docs.rs/redlock-core), strictly greater for every
//! new holder) stops it only if the storage checks it, atomically with the write. This
//! crate does that check for two kinds of storage; both record the highest token seen
//! per resource, raise it to the writer's token, or refuse the writer if a higher token
//! was seen ([`FenceError::Stale`], carrying both).
//!
//! | storage | type | the check is atomic with the write because |
//! | --- | --- | --- |
//! | SQL (sqlx: PostgreSQL, SQLite) | [`SqlFence`] | it runs in the write's own transaction |
//! | Redis (feature `redis`) | [`RedisFence`] | one Lua script compares, writes and raises |
//!
//! Both take the resource names a lock takes (redlock-core's rule: not empty, at most
//! 512 bytes unless raised) and refuse others with [`FenceError::InvalidResource`]
//! before anything is sent.
//!
//! # SQL
//!
//! [`SqlFence`] checks in the write's own transaction, with one statement on a fence
//! table. Committed, the write and the raise happen together; refused, the caller rolls
//! back.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use redlock_fence::{FenceError, SqlFence};
//! use sqlx::Connection;
//!
//! let mut db = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
//! let fence = SqlFence::new();
//! fence.migrate(&mut db).await?;
//! sqlx::query("CREATE TABLE balances (account TEXT PRIMARY KEY, cents BIGINT)")
//!     .execute(&mut db)
//!     .await?;
//!
//! // The holder of `account:7` with token 12 writes.
//! let mut tx = db.begin().await?;
//! fence.check(&mut *tx, "account:7", 12).await?;
//! sqlx::query("INSERT INTO balances VALUES ('7', 100)").execute(&mut *tx).await?;
//! tx.commit().await?;
//!
//! // A stale holder (token 11, paused past its lock) is refused, and rolls back.
//! let mut tx = db.begin().await?;
//! match fence.check(&mut *tx, "account:7", 11).await {
//!     Err(FenceError::Stale { token: 11, highest: 12, .. }) => tx.rollback().await?,
//!     other => panic!("expected a stale token, got {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Redis
//!
//! With the `redis` feature, [`RedisFence`] writes to a data Redis (not one of the lock's
//! nodes): `set` and `del` of a data key under a token, each one script that compares
//! the token with the fence key's, applies the write and raises the fence. Tokens are
//! compared exactly over the whole `u64` range. On Redis Cluster, the fence key and the
//! data key must share a hash slot (hash tags); the fence lasts only as long as the data
//! Redis keeps its data (`appendonly yes`). Its documentation has an example.
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `redis` | off | [`RedisFence`]: fenced `SET` / `DEL` on a data Redis |
//!
#![cfg_attr(feature = "redis", doc = "[`RedisFence`]: RedisFence")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisFence`]: https://docs.rs/redlock-fence/latest/redlock_fence/struct.RedisFence.html"
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod error;
#[cfg(feature = "redis")]
mod redis;
mod sql;

#[cfg(feature = "redis")]
pub use crate::redis::{DEFAULT_FENCE_PREFIX, RedisFence};
pub use error::FenceError;
pub use sql::{DEFAULT_FENCE_TABLE, SqlFence};

#[doc = include_str!("../guides/FENCING.md")]
pub mod _guide {}

// The README's examples, compiled (and run unless `no_run`) as doctests so that they
// stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
