//! [`HistoryError`]: the run history's database failed, or cannot be opened.

use std::time::Duration;

use crate::build_error::BuildError;

/// The run history's database failed, did not answer, or cannot be opened. A running
/// scheduler keeps going with the Redis claims alone until the database answers again,
/// and writes what it could not then.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// The database answered with an error. Check the database (and the message);
    /// reads can be made again.
    #[error("run history: {0}; check the database")]
    Database(#[from] sqlx::Error),

    /// A statement did not finish in time (the database is slow, or its link is down).
    #[error(
        "run history: {operation} got no answer within {after:?}; check the database and the link to it"
    )]
    Timeout {
        /// What was being done.
        operation: &'static str,
        /// The bound that ran out.
        after: Duration,
    },

    /// The database could not be opened.
    #[error(
        "run history: cannot open {place}: {cause}; check the address, the credentials and that the database runs"
    )]
    Connect {
        /// The database (address or file, no credentials).
        place: String,
        /// Why: refused, no answer within the connect timeout, authentication, ...
        cause: String,
    },

    /// The URL names no supported database.
    #[error(
        "run history: invalid URL `{url}`: {reason}; use sqlite://path, sqlite::memory: or postgres://user@host/db"
    )]
    InvalidUrl {
        /// The URL as given (password redacted).
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An option of the [`HistoryBuilder`](super::HistoryBuilder) cannot work (checked
    /// by [`connect`](super::HistoryBuilder::connect) before anything is opened, or,
    /// for a schema on SQLite or a pool of another database, once the backend is known).
    #[error("run history: {0}")]
    Config(#[from] BuildError),

    /// A schema migration failed (the transaction was rolled back; nothing changed).
    #[error(
        "run history: migration {version} failed: {source}; fix the cause and connect again (the migration is retried)"
    )]
    Migration {
        /// The migration's number.
        version: i64,
        /// The database's error.
        source: sqlx::Error,
    },

    /// A fence check could not be made (a token beyond the fence table's range).
    #[error("run history: {0}; the run's transaction was not committed")]
    Fence(redlock_fence::FenceError),
}
