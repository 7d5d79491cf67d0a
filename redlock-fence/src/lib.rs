//! The storage side of fencing tokens.
//!
//! A lock alone cannot stop a holder that was paused past its lock's validity from
//! writing afterwards: it still believes it holds the lock. A fencing token
//! ([`Lock::fencing_token`](https://docs.rs/redlock-core), strictly greater for every
//! new holder) stops it only if the storage checks it. [`SqlFence`] does that check in
//! the write's own transaction, with one statement: it records the highest token seen
//! per resource in a fence table, raises it to the writer's token, or refuses the writer
//! if a higher token was seen ([`FenceError::Stale`], carrying both). Committed, the write
//! and the raise happen together; refused, the caller rolls back.
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

mod sql;

pub use sql::{DEFAULT_FENCE_TABLE, FenceError, SqlFence};
