//! Where records live: the [`Store`] trait and its two implementations.
//!
//! | store | feature | a write is fenced because | expiry |
//! | --- | --- | --- | --- |
//! | [`RedisStore`] | `redis` | one script reads the record's token, compares and writes | the key's TTL |
//! | [`SqlStore`] (PostgreSQL, SQLite) | `sql` | one conditional upsert (its own transaction) compares and writes | `expires_ms`, and a bounded sweep |
//!
//! Both keep the record's fencing token in the record itself: a run whose lock went stale
//! (its replica paused past the lock's validity, and another run took the key since)
//! writes under a lower token than the record holds, and is refused
//! ([`StoreError::Stale`]). The fence lives exactly as long as the record.
#![cfg_attr(feature = "redis", doc = "")]
#![cfg_attr(feature = "redis", doc = "[`RedisStore`]: RedisStore")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisStore`]: https://docs.rs/redlock-idempotency/latest/redlock_idempotency/store/struct.RedisStore.html"
)]
#![cfg_attr(feature = "sql", doc = "[`SqlStore`]: SqlStore")]
#![cfg_attr(
    not(feature = "sql"),
    doc = "[`SqlStore`]: https://docs.rs/redlock-idempotency/latest/redlock_idempotency/store/struct.SqlStore.html"
)]

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::record::{Corrupt, Record, RecordState};

#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sql")]
mod sql;

#[cfg(feature = "redis")]
pub use self::redis::{DEFAULT_REDIS_PREFIX, RedisStore};
#[cfg(feature = "sql")]
pub use self::sql::{DEFAULT_TABLE, SqlStore};

/// A boxed future of a store operation.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// What [`Store::start`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Started {
    /// The in-flight record is written: run the request.
    Started,
    /// A record that must not be overwritten is there: a completed one (replay it or
    /// refuse), or another request's in-flight one (another fingerprint). Returned as
    /// found; nothing was written.
    Found(Record),
}

/// A store's failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The record holds a higher fencing token than the writer's: another run took the
    /// key since this one's lock was taken (this run's lock went stale). Nothing was
    /// written.
    #[error(
        "a newer run of this key holds token {highest} (this run's is {token}): its lock went stale; nothing was written"
    )]
    Stale {
        /// The writer's token.
        token: u64,
        /// The record's.
        highest: u64,
    },
    /// The stored record is not readable.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
    /// The store did not answer in time (the operation's outcome is unknown).
    #[error("the idempotency store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store's own error (connection, query); its text is for the log only.
    #[error("idempotency store error: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// One record in a listing ([`Store::list`]): what operators see, no response body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordSummary {
    /// The record's id: the scope and the key (see [`record_id`](crate::record_id)).
    pub id: String,
    /// Where its request stands.
    pub state: RecordState,
    /// The fencing token of the run that wrote it.
    pub token: u64,
    /// When the run began, Unix milliseconds.
    pub started_ms: u64,
    /// The response's status, once finished.
    pub status: Option<u16>,
    /// The stored body's length in bytes (completed records).
    pub body_len: Option<usize>,
    /// How long until it expires, if the store knows.
    pub expires_in: Option<Duration>,
}

impl RecordSummary {
    /// The summary of `record`, stored under `id`.
    pub fn new(id: String, record: &Record, expires_in: Option<Duration>) -> Self {
        Self {
            id,
            state: record.state,
            token: record.token,
            started_ms: record.started_ms,
            status: record.status,
            body_len: record.response.as_ref().map(|r| r.body.len()),
            expires_in,
        }
    }
}

/// A place that keeps idempotency records, each written under a fencing token.
///
/// Implemented by [`RedisStore`] and [`SqlStore`]; implement it for another database
/// with the same guarantees:
///
/// - [`start`](Self::start) and [`finish`](Self::finish) compare the writer's token with
///   the record's and write in one atomic step (one script, one statement, or one
///   transaction that locks the row): a lower token than the record's is refused
///   ([`StoreError::Stale`]) and nothing changes;
/// - [`load`](Self::load) never returns an expired record.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// The record with this id, unless there is none or it expired.
    fn load<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Record>>;

    /// Writes `record` (in flight) unless the one stored must stay: refuses a lower token
    /// ([`StoreError::Stale`]); keeps and returns ([`Started::Found`]) a completed or
    /// not-stored record, or an in-flight one with another fingerprint. An abandoned
    /// record, an in-flight one with the same fingerprint (its run died or was cancelled)
    /// and an expired one are overwritten. `ttl`: how long the record lives.
    fn start<'a>(
        &'a self,
        id: &'a str,
        record: &'a Record,
        ttl: Duration,
    ) -> StoreFuture<'a, Started>;

    /// Writes `record` (a run's end: completed, not stored, abandoned) unless the stored
    /// one has a higher token ([`StoreError::Stale`]). `ttl`: how long it lives from now.
    fn finish<'a>(&'a self, id: &'a str, record: &'a Record, ttl: Duration) -> StoreFuture<'a, ()>;

    /// Up to `limit` unexpired records whose id starts with `prefix`, in id order.
    fn list<'a>(&'a self, prefix: &'a str, limit: usize) -> StoreFuture<'a, Vec<RecordSummary>>;
}
