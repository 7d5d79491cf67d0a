//! [`SqlStore`]: records in PostgreSQL or SQLite, each write fenced in its own statement.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

use super::{RecordSummary, Started, Store, StoreError, StoreFuture};
use crate::record::{Record, RecordState};

/// The records' table unless told otherwise.
pub const DEFAULT_TABLE: &str = "redlock_idempotency";

/// How often a store sweeps expired records (at most), and how many it deletes at a time.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
const SWEEP_BATCH: i64 = 1000;

/// Records in PostgreSQL or SQLite through sqlx's `Any` driver, one row per record.
///
/// Each write is one statement, so one transaction: an upsert whose condition compares
/// the writer's fencing token with the row's, and whose `RETURNING` says whether it
/// wrote. A run whose lock went stale writes under a lower token and changes nothing
/// ([`StoreError::Stale`]).
///
/// The table ([`migrate`](Self::migrate) creates it; [`create_statements`](Self::create_statements)
/// gives the DDL for a migration tool of your own):
///
/// | column | type | what |
/// | --- | --- | --- |
/// | `id` | `TEXT` primary key | the scope and the key ([`record_id`](crate::record_id)) |
/// | `state` | `TEXT` | `I` in flight, `C` completed, `N` not stored, `A` abandoned |
/// | `token` | `BIGINT` | the fencing token of the run that wrote it |
/// | `fingerprint` | `BYTEA` | the request's fingerprint (SHA-256) |
/// | `record` | `BYTEA` | the whole record (with the response), in the crate's encoding |
/// | `expires_ms` | `BIGINT`, indexed | when it expires, Unix milliseconds |
///
/// Expired rows are never read. They are deleted by a sweep that runs at most once a
/// minute per store (the first a minute after it is made), in the background of a
/// request, 1,000 rows at a time
/// ([`sweep`](Self::sweep) runs one now). Clocks: `expires_ms` is the writing replica's
/// clock; replicas whose clocks differ by seconds see a 24 h record expire seconds apart.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use redlock_idempotency::store::SqlStore;
///
/// let store = SqlStore::connect("sqlite::memory:").await?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SqlStore {
    pool: AnyPool,
    table: String,
    statements: Arc<Statements>,
    last_sweep_ms: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Statements {
    start: String,
    finish: String,
    load: String,
    token: String,
    list: String,
    sweep: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        let bare = table.rsplit('.').next().unwrap_or(table);
        let upsert = format!(
            "INSERT INTO {table} (id, state, token, fingerprint, record, expires_ms)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (id) DO UPDATE SET
               state = excluded.state, token = excluded.token,
               fingerprint = excluded.fingerprint, record = excluded.record,
               expires_ms = excluded.expires_ms"
        );
        Self {
            // Overwrites an expired row, or one of no higher token that is abandoned or
            // in flight for the same request (its run died).
            start: format!(
                "{upsert}
                 WHERE {bare}.expires_ms <= $7 OR ({bare}.token <= excluded.token AND
                   ({bare}.state = 'A' OR ({bare}.state = 'I' AND {bare}.fingerprint = excluded.fingerprint)))
                 RETURNING token"
            ),
            finish: format!(
                "{upsert}
                 WHERE {bare}.expires_ms <= $7 OR {bare}.token <= excluded.token
                 RETURNING token"
            ),
            load: format!("SELECT record FROM {table} WHERE id = $1 AND expires_ms > $2"),
            token: format!("SELECT token FROM {table} WHERE id = $1"),
            list: format!(
                "SELECT id, record, expires_ms FROM {table}
                 WHERE substr(id, 1, length($1)) = $1 AND expires_ms > $2
                 ORDER BY id LIMIT $3"
            ),
            sweep: format!(
                "DELETE FROM {table} WHERE id IN
                   (SELECT id FROM {table} WHERE expires_ms <= $1 ORDER BY expires_ms LIMIT $2)"
            ),
        }
    }
}

fn backend(error: sqlx::Error) -> StoreError {
    StoreError::Backend(Box::new(error))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn state_code(state: RecordState) -> &'static str {
    match state {
        RecordState::InFlight => "I",
        RecordState::Completed => "C",
        RecordState::NotStored => "N",
        RecordState::Abandoned => "A",
    }
}

fn signed(token: u64) -> Result<i64, StoreError> {
    i64::try_from(token).map_err(|_| {
        StoreError::Backend(
            format!("fencing token {token} is above the SQL store's range (i64::MAX)").into(),
        )
    })
}

impl SqlStore {
    /// A store on this pool, over the table [`DEFAULT_TABLE`].
    ///
    /// The pool must come from sqlx's `Any` driver with the PostgreSQL or SQLite driver
    /// installed (`sqlx::any::install_default_drivers()`).
    pub fn new(pool: AnyPool) -> Self {
        Self {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            statements: Arc::new(Statements::new(DEFAULT_TABLE)),
            // The first sweep comes a minute after the store is made, as every later one:
            // an explicit `sweep` right after making it counts every row it deletes.
            last_sweep_ms: Arc::new(AtomicU64::new(u64::try_from(now_ms()).unwrap_or(0))),
        }
    }

    /// Connects a pool to `url` (`postgres://…`, `sqlite://…`, `sqlite::memory:`) and
    /// makes a store on it. An in-memory SQLite database gets one connection (each
    /// connection would have its own database).
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] when the database cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let memory = url.contains(":memory:") || url.contains("mode=memory");
        let mut options = AnyPoolOptions::new()
            .max_connections(if memory { 1 } else { 10 })
            .acquire_timeout(Duration::from_secs(5));
        if memory {
            options = options.idle_timeout(None).max_lifetime(None);
        }
        let pool = options.connect(url).await.map_err(backend)?;
        Ok(Self::new(pool))
    }

    /// Uses `table` instead (letters, digits and `_`, optionally `schema.table`).
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] for another name (it is spliced into statements).
    pub fn table(mut self, table: impl Into<String>) -> Result<Self, StoreError> {
        let table = table.into();
        let valid = !table.is_empty()
            && table.split('.').count() <= 2
            && table.split('.').all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && !part.starts_with(|c: char| c.is_ascii_digit())
                    && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        if !valid {
            return Err(StoreError::Backend(
                format!("`{table}` is not a table name (letters, digits, `_`, optionally `schema.table`)")
                    .into(),
            ));
        }
        self.statements = Arc::new(Statements::new(&table));
        self.table = table;
        Ok(self)
    }

    /// The statements [`migrate`](Self::migrate) runs: the table and its expiry index
    /// (`IF NOT EXISTS`, valid on PostgreSQL and SQLite).
    pub fn create_statements(&self) -> [String; 2] {
        let table = &self.table;
        let bare = table.rsplit('.').next().unwrap_or(table);
        [
            format!(
                "CREATE TABLE IF NOT EXISTS {table} (
                    id TEXT NOT NULL PRIMARY KEY,
                    state TEXT NOT NULL,
                    token BIGINT NOT NULL,
                    fingerprint BYTEA NOT NULL,
                    record BYTEA NOT NULL,
                    expires_ms BIGINT NOT NULL
                )"
            ),
            format!("CREATE INDEX IF NOT EXISTS {bare}_expires ON {table} (expires_ms)"),
        ]
    }

    /// Creates the table and its index if they do not exist.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`].
    pub async fn migrate(&self) -> Result<(), StoreError> {
        for statement in self.create_statements() {
            sqlx::query(&statement)
                .execute(&self.pool)
                .await
                .map_err(backend)?;
        }
        Ok(())
    }

    /// Deletes up to `limit` expired records now; answers how many.
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`].
    pub async fn sweep(&self, limit: usize) -> Result<u64, StoreError> {
        let deleted = sqlx::query(&self.statements.sweep)
            .bind(now_ms())
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(deleted.rows_affected())
    }

    /// Starts a sweep in the background if the last one is a minute old.
    fn sweep_if_due(&self) {
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        let every = SWEEP_EVERY.as_millis() as u64;
        if now.saturating_sub(last) < every
            || self
                .last_sweep_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            match store.sweep(SWEEP_BATCH as usize).await {
                Ok(0) => {}
                Ok(deleted) => tracing::debug!(deleted, table = %store.table, "expired idempotency records deleted"),
                Err(error) => tracing::warn!(%error, table = %store.table, "sweeping expired idempotency records failed"),
            }
        });
    }

    /// The upsert `statement` of `record` under `id`: whether it wrote.
    async fn upsert(
        &self,
        statement: &str,
        id: &str,
        record: &Record,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = now_ms();
        let expires = now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        let written = sqlx::query(statement)
            .bind(id)
            .bind(state_code(record.state))
            .bind(signed(record.token)?)
            .bind(record.fingerprint.as_bytes().to_vec())
            .bind(record.encode())
            .bind(expires)
            .bind(now)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        Ok(written.is_some())
    }

    async fn stored_token(&self, id: &str) -> Result<u64, StoreError> {
        let token: Option<i64> = sqlx::query_scalar(&self.statements.token)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        Ok(token.and_then(|t| u64::try_from(t).ok()).unwrap_or(0))
    }

    async fn load_record(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let bytes: Option<Vec<u8>> = sqlx::query_scalar(&self.statements.load)
            .bind(id)
            .bind(now_ms())
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        Ok(bytes.map(|b| Record::decode(&b)).transpose()?)
    }
}

impl Store for SqlStore {
    fn load<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(self.load_record(id))
    }

    fn start<'a>(
        &'a self,
        id: &'a str,
        record: &'a Record,
        ttl: Duration,
    ) -> StoreFuture<'a, Started> {
        Box::pin(async move {
            self.sweep_if_due();
            if self.upsert(&self.statements.start, id, record, ttl).await? {
                return Ok(Started::Started);
            }
            // Refused: tell why, from the row that stayed.
            match self.load_record(id).await? {
                Some(stored) if stored.token > record.token => Err(StoreError::Stale {
                    token: record.token,
                    highest: stored.token,
                }),
                Some(stored) => Ok(Started::Found(stored)),
                // Expired or swept in between: the row that refused is gone.
                None => Err(StoreError::Backend(
                    "the record changed while it was being written; retry".into(),
                )),
            }
        })
    }

    fn finish<'a>(&'a self, id: &'a str, record: &'a Record, ttl: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if self
                .upsert(&self.statements.finish, id, record, ttl)
                .await?
            {
                return Ok(());
            }
            Err(StoreError::Stale {
                token: record.token,
                highest: self.stored_token(id).await?,
            })
        })
    }

    fn list<'a>(&'a self, prefix: &'a str, limit: usize) -> StoreFuture<'a, Vec<RecordSummary>> {
        Box::pin(async move {
            let now = now_ms();
            let rows = sqlx::query(&self.statements.list)
                .bind(prefix)
                .bind(now)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(backend)?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let id: String = row.try_get(0).map_err(backend)?;
                let bytes: Vec<u8> = row.try_get(1).map_err(backend)?;
                let expires_ms: i64 = row.try_get(2).map_err(backend)?;
                let Ok(record) = Record::decode(&bytes) else {
                    continue;
                };
                let left = u64::try_from(expires_ms.saturating_sub(now)).ok();
                out.push(RecordSummary::new(
                    id,
                    &record,
                    left.map(Duration::from_millis),
                ));
            }
            Ok(out)
        })
    }
}
