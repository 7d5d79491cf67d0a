//! [`HistoryError`]: the run history's database failed, or cannot be opened; and
//! [`DatabaseError`], the database's own error, kept as a source.

use std::fmt;
use std::time::Duration;

use super::build::BuildError;

/// The run history's database failed, did not answer, or cannot be opened. A running
/// scheduler keeps going with the Redis claims alone until the database answers again,
/// and writes what it could not then.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// The database answered with an error. Check the database (and the message);
    /// reads can be made again.
    #[error("run history: {0}; check the database")]
    Database(#[source] DatabaseError),

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

    /// An option of the [`HistoryBuilder`](crate::history::HistoryBuilder) cannot work (checked
    /// by [`connect`](crate::history::HistoryBuilder::connect) before anything is opened, or,
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
        source: DatabaseError,
    },

    /// The operation needs a database, and this history is kept in memory (a
    /// simulation's: `History::memory()`, feature `sim`). A run's transaction on it is
    /// `JobContext::memory_transaction`.
    #[error(
        "run history: {operation} needs a database, and this history is kept in memory; use a history on SQLite or PostgreSQL (or, in a simulation, a memory transaction)"
    )]
    NoDatabase {
        /// What was being done.
        operation: &'static str,
    },

    /// A fence check could not be made (a token beyond the fence table's range).
    #[error("run history: {0}; the run's transaction was not committed")]
    Fence(redlock_fence::FenceError),
}

impl HistoryError {
    /// The database's error `err`, as [`HistoryError::Database`].
    pub(crate) fn database(err: sqlx::Error) -> Self {
        Self::Database(DatabaseError::new(err))
    }
}

/// What becomes a [`HistoryError`] inside the crate: the database's error, or one
/// already (no `From<sqlx::Error>`, which would put sqlx in the API).
pub(crate) trait IntoHistoryError {
    fn into_history_error(self) -> HistoryError;
}

impl IntoHistoryError for sqlx::Error {
    fn into_history_error(self) -> HistoryError {
        HistoryError::database(self)
    }
}

impl IntoHistoryError for HistoryError {
    fn into_history_error(self) -> HistoryError {
        self
    }
}

/// `.db()?` on a sqlx result: its error as [`HistoryError::Database`].
pub(crate) trait Db<T> {
    fn db(self) -> Result<T, HistoryError>;
}

impl<T> Db<T> for Result<T, sqlx::Error> {
    fn db(self) -> Result<T, HistoryError> {
        self.map_err(HistoryError::database)
    }
}

/// The database's own error, as the driver reported it: its message is this error's
/// message, and the error itself is its [`source`](std::error::Error::source).
///
/// It is opaque so that the driver's types stay out of this crate's API: the source is
/// the `sqlx::Error` of the sqlx version this crate is built with, which
/// `source().and_then(|e| e.downcast_ref::<sqlx::Error>())` reaches where the same
/// version is in the build (not covered by this crate's semver).
#[non_exhaustive]
pub struct DatabaseError {
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl DatabaseError {
    pub(crate) fn new(err: sqlx::Error) -> Self {
        Self {
            source: Box::new(err),
        }
    }
}

impl fmt::Debug for DatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.source, f)
    }
}

impl fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl std::error::Error for DatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
