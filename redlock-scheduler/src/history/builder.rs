//! [`HistoryBuilder`]: where the history lives, how long to wait for it, which tables,
//! what to keep.

use std::future::Future;
use std::sync::{Arc, Once};
use std::time::Duration;

use chrono::Utc;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Connection};

use super::HistoryError as Error;
use super::schema::{self, DEFAULT_TABLE_PREFIX, Tables, is_identifier};
use super::target::{self, Backend, Target};
use super::{History, Shared, ms};
use crate::error::build::BuildError;
use crate::error::history::IntoHistoryError;

/// The default bound on opening the database (and on the first migration).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on waiting for a pooled connection.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);
/// The default bound on one statement, connection wait included.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest connect, acquire or statement timeout accepted: one day. A history that
/// does not answer for that long is down, and the bound keeps every deadline computed
/// from a timeout (and PostgreSQL's `statement_timeout`, in milliseconds) in range.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

pub(super) enum Source {
    Url(String),
    Pool(AnyPool),
    /// The tables in this process's memory (a simulation's).
    #[cfg(feature = "sim")]
    Memory {
        faults: Option<Arc<dyn super::MemoryFaults>>,
    },
}

/// Builds a [`History`]: where, how long to wait, which tables, what to keep.
#[must_use = "a builder does nothing until `connect()`"]
pub struct HistoryBuilder {
    source: Source,
    connect_timeout: Duration,
    acquire_timeout: Duration,
    statement_timeout: Duration,
    max_connections: u32,
    prefix: String,
    schema: Option<String>,
    keep_for: Option<Duration>,
    keep_runs: Option<u32>,
}

impl std::fmt::Debug for HistoryBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            Source::Url(url) => target::redact(url),
            Source::Pool(_) => "an existing pool".to_owned(),
            #[cfg(feature = "sim")]
            Source::Memory { .. } => "memory".to_owned(),
        };
        f.debug_struct("HistoryBuilder")
            .field("source", &source)
            .field("connect_timeout", &self.connect_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("prefix", &self.prefix)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl HistoryBuilder {
    pub(super) fn new(source: Source) -> Self {
        Self {
            source,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            max_connections: 5,
            prefix: DEFAULT_TABLE_PREFIX.to_owned(),
            schema: None,
            keep_for: None,
            keep_runs: None,
        }
    }

    /// How long opening the database may take (default 5 s): past it,
    /// [`connect`](Self::connect) fails naming the database and the cause.
    /// More than zero and at most [`MAX_TIMEOUT`] (a day), or
    /// [`connect`](Self::connect) fails with [`HistoryError::Config`](Error::Config).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a statement may wait for a pooled connection (default 2 s).
    /// More than zero and at most [`MAX_TIMEOUT`] (a day), or
    /// [`connect`](Self::connect) fails with [`HistoryError::Config`](Error::Config).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// How long one statement may take, waiting for a connection included (default
    /// 5 s; on PostgreSQL also set as the server's `statement_timeout`).
    /// More than zero and at most [`MAX_TIMEOUT`] (a day), or
    /// [`connect`](Self::connect) fails with [`HistoryError::Config`](Error::Config).
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// The pool's size (default 5; an in-memory SQLite database always uses 1).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Prefix of the history's table names (default `redlock_`): letters, digits and
    /// `_`.
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The PostgreSQL schema holding the tables (created if missing; default: the
    /// connection's `search_path`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Deletes finished rows whose tick is older than this (the leader prunes at its
    /// election and about every 10 minutes). Each job's latest row, and its latest
    /// scheduled row (where a new leader catches up from; a manual run is not one), are
    /// always kept.
    pub fn keep_for(mut self, age: Duration) -> Self {
        self.keep_for = Some(age);
        self
    }

    /// Keeps this many finished rows per job (the latest ones), and each job's latest
    /// scheduled row besides when manual runs came after it (a new leader catches up
    /// from it).
    pub fn keep_runs(mut self, runs: u32) -> Self {
        self.keep_runs = Some(runs);
        self
    }

    /// A memory history's statements answer as `faults` decide (a simulation's, drawn
    /// from its seed). Ignored by a history on a database.
    #[cfg(feature = "sim")]
    pub fn memory_faults(mut self, faults: Arc<dyn super::MemoryFaults>) -> Self {
        if let Source::Memory { faults: slot } = &mut self.source {
            *slot = Some(faults);
        }
        self
    }

    fn check(&self) -> Result<(), Error> {
        let invalid = |what: &str, reason: &str| {
            Error::Config(BuildError::InvalidOption {
                what: what.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if !is_identifier(&self.prefix) {
            return Err(invalid(
                "table prefix",
                "use up to 40 letters, digits and `_`, not starting with a digit",
            ));
        }
        if let Some(schema) = &self.schema
            && !is_identifier(schema)
        {
            return Err(invalid(
                "schema",
                "use up to 40 letters, digits and `_`, not starting with a digit",
            ));
        }
        for (what, t) in [
            ("connect timeout", self.connect_timeout),
            ("acquire timeout", self.acquire_timeout),
            ("statement timeout", self.statement_timeout),
        ] {
            if t.is_zero() {
                return Err(invalid(what, "must be more than zero"));
            }
            if t > MAX_TIMEOUT {
                return Err(invalid(what, "must be at most a day (MAX_TIMEOUT)"));
            }
        }
        if self.max_connections == 0 {
            return Err(invalid("max connections", "must be at least 1"));
        }
        if self.keep_runs == Some(0) || self.keep_for.is_some_and(|d| d.is_zero()) {
            return Err(invalid(
                "retention",
                "keep at least one run and a positive age",
            ));
        }
        Ok(())
    }

    /// Opens the database (checking it answers within the connect timeout) and brings
    /// the schema up to date.
    ///
    /// # Errors
    ///
    /// [`HistoryError::InvalidUrl`](Error::InvalidUrl) for a URL that names no supported database,
    /// [`HistoryError::Config`](Error::Config) for a bad prefix, schema or timeout (zero, or above
    /// [`MAX_TIMEOUT`]), [`HistoryError::Connect`](Error::Connect)
    /// naming the database and the cause (refused, no answer within the timeout, bad
    /// credentials, a file that cannot be opened), [`HistoryError::Migration`](Error::Migration) if a migration
    /// fails.
    pub async fn connect(self) -> Result<History, Error> {
        static DRIVERS: Once = Once::new();
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        self.check()?;
        let (pool, backend, place) = match &self.source {
            #[cfg(feature = "sim")]
            Source::Memory { faults } => {
                return self.memory(faults.clone());
            }
            Source::Url(url) => self.open(url).await?,
            Source::Pool(pool) => {
                let mut conn = bounded(self.connect_timeout, "connect", pool.acquire()).await?;
                let backend = match conn.backend_name() {
                    "PostgreSQL" => Backend::Postgres,
                    "SQLite" => Backend::Sqlite,
                    other => {
                        return Err(Error::Config(BuildError::InvalidOption {
                            what: "pool".to_owned(),
                            reason: format!("{other} is not supported: use SQLite or PostgreSQL"),
                        }));
                    }
                };
                let _ = conn.ping().await;
                (pool.clone(), backend, "the given pool".to_owned())
            }
        };
        if self.schema.is_some() && backend == Backend::Sqlite {
            return Err(Error::Config(BuildError::InvalidOption {
                what: "schema".to_owned(),
                reason: "SQLite has no schemas: use a table prefix".to_owned(),
            }));
        }
        let tables = Tables::new(&self.prefix, self.schema.as_deref());
        let history = History {
            shared: Arc::new(Shared {
                pool,
                memory: None,
                place,
                tables,
                statement_timeout: self.statement_timeout,
                keep_for: self.keep_for,
                keep_runs: self.keep_runs,
            }),
        };
        // Waiting for other replicas' migrations is part of connecting.
        let mut conn = bounded(
            self.connect_timeout,
            "connect",
            history.shared.pool.acquire(),
        )
        .await?;
        let migrate = schema::migrate(&mut conn, backend, &history.shared.tables, ms(Utc::now()));
        let limit = migrate_limit(self.connect_timeout, self.statement_timeout);
        tokio::time::timeout(limit, migrate)
            .await
            .map_err(|_| Error::Timeout {
                operation: "migrate",
                after: limit,
            })??;
        Ok(history)
    }

    /// A memory history: the tables in this process, a pool that is never used (on a
    /// private in-memory SQLite database, opened lazily, so never).
    #[cfg(feature = "sim")]
    fn memory(&self, faults: Option<Arc<dyn super::MemoryFaults>>) -> Result<History, Error> {
        // No maintenance task either (no idle timeout, no lifetime, no minimum): a
        // simulation's runtime runs nothing of sqlx's.
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy("sqlite::memory:")
            .map_err(|err| Error::Connect {
                place: "memory".to_owned(),
                cause: err.to_string(),
            })?;
        Ok(History {
            shared: Arc::new(Shared {
                pool,
                memory: Some(super::memory::Store::new(faults)),
                place: "memory".to_owned(),
                tables: Tables::new(&self.prefix, None),
                statement_timeout: self.statement_timeout,
                keep_for: self.keep_for,
                keep_runs: self.keep_runs,
            }),
        })
    }

    async fn open(&self, url: &str) -> Result<(AnyPool, Backend, String), Error> {
        let target = Target::parse(url)?;
        let connect_error = |cause: String| Error::Connect {
            place: target.place.clone(),
            cause,
        };
        // One connection first: its error names the cause (a pool would retry until its
        // own timeout and say only "timed out").
        match tokio::time::timeout(
            self.connect_timeout,
            sqlx::AnyConnection::connect(&target.url),
        )
        .await
        {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
            }
            Ok(Err(err)) => return Err(connect_error(err.to_string())),
            Err(_) => {
                return Err(connect_error(format!(
                    "no answer within {:?} (the connect timeout)",
                    self.connect_timeout
                )));
            }
        }
        let memory = target.private_memory || target.shared_memory;
        let sqlite = target.backend == Backend::Sqlite;
        let statement_ms = self.statement_timeout.as_millis();
        let mut options = AnyPoolOptions::new()
            // A private in-memory database exists once per connection: keep exactly one.
            .max_connections(if target.private_memory {
                1
            } else {
                self.max_connections
            })
            .min_connections(u32::from(memory))
            .acquire_timeout(self.acquire_timeout)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    let setting = if sqlite {
                        // Replicas write concurrently: wait for the file lock, not longer
                        // than a statement may take.
                        format!("PRAGMA busy_timeout = {statement_ms}")
                    } else {
                        format!("SET statement_timeout = {statement_ms}")
                    };
                    sqlx::query(&setting).execute(&mut *conn).await?;
                    Ok(())
                })
            });
        if memory {
            // The database lives as long as its connection.
            options = options.idle_timeout(None).max_lifetime(None);
        }
        let pool = options
            .connect_lazy(&target.url)
            .map_err(|err| connect_error(err.to_string()))?;
        if sqlite && !memory {
            // Readers do not block the writer (and the other way round): replicas and
            // their status queries share the file. The mode is stored in the file.
            bounded(
                self.connect_timeout,
                "connect",
                sqlx::query("PRAGMA journal_mode = WAL").execute(&pool),
            )
            .await
            .map_err(|err| match err {
                Error::Database(err) => connect_error(err.to_string()),
                other => other,
            })?;
        }
        Ok((pool, target.backend, target.place))
    }
}

/// How long connecting may wait for the migrations (other replicas' included): the
/// connect timeout plus one statement's, saturating (never an overflow, whatever the
/// timeouts).
fn migrate_limit(connect: Duration, statement: Duration) -> Duration {
    connect.saturating_add(statement)
}

/// `fut`, failing with [`Error::Timeout`] after `limit`.
pub(super) async fn bounded<T, E>(
    limit: Duration,
    operation: &'static str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, Error>
where
    E: IntoHistoryError,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result.map_err(IntoHistoryError::into_history_error),
        Err(_) => Err(Error::Timeout {
            operation,
            after: limit,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::migrate_limit;

    #[test]
    fn the_migration_bound_saturates() {
        assert_eq!(
            migrate_limit(Duration::MAX, Duration::from_secs(5)),
            Duration::MAX
        );
        assert_eq!(migrate_limit(Duration::MAX, Duration::MAX), Duration::MAX);
        assert_eq!(
            migrate_limit(Duration::from_secs(5), Duration::from_secs(2)),
            Duration::from_secs(7)
        );
    }
}
