//! [`SqlFence`]: fenced writes in SQL transactions (sqlx; PostgreSQL and SQLite).

use std::time::{SystemTime, UNIX_EPOCH};

use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;
use redlock_core::check_resource_name;
use sqlx::{Database, Decode, Encode, Executor, IntoArguments, Type};

use crate::FenceError;

/// The fence table's name unless told otherwise.
pub const DEFAULT_FENCE_TABLE: &str = "redlock_fences";

/// Checks and raises fencing tokens in a SQL database, in the caller's transaction.
///
/// The fence table (`resource TEXT PRIMARY KEY, token BIGINT, updated_ms BIGINT`) holds
/// the highest token seen per resource; [`migrate`](Self::migrate) creates it. Call
/// [`check`](Self::check) in the transaction of the protected write, before the write:
/// the statement both compares and raises, and its row lock (PostgreSQL) or the write
/// transaction (SQLite) makes a concurrent writer wait for the commit, then see the
/// raised token.
///
/// Resource names follow redlock-core's rule for lock names: not empty, at most
/// [`DEFAULT_MAX_RESOURCE_LEN`] (512) bytes unless
/// [`max_resource_len`](Self::max_resource_len) says otherwise. Another name is refused
/// with [`FenceError::InvalidResource`] before anything is sent (a name of several
/// kilobytes would otherwise fail in PostgreSQL's primary key index).
#[derive(Debug, Clone)]
pub struct SqlFence {
    table: String,
    upsert: String,
    max_resource_len: usize,
}

impl Default for SqlFence {
    fn default() -> Self {
        Self::new()
    }
}

impl SqlFence {
    /// A fence over the table [`DEFAULT_FENCE_TABLE`].
    pub fn new() -> Self {
        Self::with_table_unchecked(DEFAULT_FENCE_TABLE.to_owned())
    }

    /// A fence over `table` (letters, digits, `_`, optionally `schema.table`; each part
    /// at most 63 characters).
    ///
    /// # Errors
    ///
    /// [`FenceError::InvalidTable`] for any other name (it is spliced into statements).
    pub fn with_table(table: impl Into<String>) -> Result<Self, FenceError> {
        let table = table.into();
        let valid = !table.is_empty()
            && table.split('.').count() <= 2
            && table.split('.').all(|part| {
                let mut chars = part.chars();
                part.len() <= 63
                    && chars
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        if !valid {
            return Err(FenceError::InvalidTable { table });
        }
        Ok(Self::with_table_unchecked(table))
    }

    fn with_table_unchecked(table: String) -> Self {
        let bare = table.rsplit('.').next().unwrap_or(&table).to_owned();
        // One statement: insert the first token, or raise the stored one if ours is not
        // lower (a no-op update otherwise, which still locks the row); either way answer
        // the token now stored.
        let upsert = format!(
            "INSERT INTO {table} (resource, token, updated_ms) VALUES ($1, $2, $3)
             ON CONFLICT (resource) DO UPDATE SET
               token = CASE WHEN {bare}.token <= excluded.token THEN excluded.token ELSE {bare}.token END,
               updated_ms = CASE WHEN {bare}.token <= excluded.token THEN excluded.updated_ms ELSE {bare}.updated_ms END
             RETURNING token"
        );
        Self {
            table,
            upsert,
            max_resource_len: DEFAULT_MAX_RESOURCE_LEN,
        }
    }

    /// The longest resource name taken, in bytes (default [`DEFAULT_MAX_RESOURCE_LEN`],
    /// 512, as redlock-core's locks): set it to the lock client's
    /// [`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len) if that was
    /// raised. On PostgreSQL keep it below about 2,700 bytes, the longest entry the fence
    /// table's primary key index takes.
    #[must_use]
    pub fn max_resource_len(mut self, max: usize) -> Self {
        self.max_resource_len = max;
        self
    }

    /// The fence table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the fence table if it does not exist.
    ///
    /// # Errors
    ///
    /// [`FenceError::Database`].
    pub async fn migrate<'c, E, DB>(&self, executor: E) -> Result<(), FenceError>
    where
        E: Executor<'c, Database = DB>,
        DB: Database,
        for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    {
        sqlx::query(&self.create_table_statement())
            .execute(executor)
            .await?;
        Ok(())
    }

    /// The statement [`migrate`](Self::migrate) runs, for a migration system of your own
    /// (`CREATE TABLE IF NOT EXISTS`, valid on PostgreSQL and SQLite).
    pub fn create_table_statement(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (
                resource TEXT NOT NULL PRIMARY KEY,
                token BIGINT NOT NULL,
                updated_ms BIGINT NOT NULL
            )",
            self.table
        )
    }

    /// Admits a write to `resource` under `token` if no higher token was seen for it,
    /// and records `token` as the highest seen; in the caller's transaction (pass
    /// `&mut *tx`), so that the write and the raise commit together.
    ///
    /// The same token may write any number of times; a lower one never again.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] when a higher token was seen (roll the transaction back:
    /// another holder took the lock since); [`FenceError::TokenOutOfRange`] for a token
    /// above `i64::MAX`; [`FenceError::InvalidResource`] for an empty name or one longer
    /// than [`max_resource_len`](Self::max_resource_len) (nothing was sent);
    /// [`FenceError::Database`].
    pub async fn check<'c, E, DB>(
        &self,
        executor: E,
        resource: &str,
        token: u64,
    ) -> Result<(), FenceError>
    where
        E: Executor<'c, Database = DB>,
        DB: Database,
        for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
        for<'q> &'q str: Encode<'q, DB> + Type<DB>,
        for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
        usize: sqlx::ColumnIndex<DB::Row>,
    {
        check_resource_name(resource, self.max_resource_len)
            .map_err(FenceError::InvalidResource)?;
        let signed = i64::try_from(token).map_err(|_| FenceError::TokenOutOfRange { token })?;
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let stored: i64 = sqlx::query_scalar(&self.upsert)
            .bind(resource)
            .bind(signed)
            .bind(now_ms)
            .fetch_one(executor)
            .await?;
        if stored == signed {
            Ok(())
        } else {
            Err(FenceError::Stale {
                resource: resource.to_owned(),
                token,
                highest: u64::try_from(stored).unwrap_or(0),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(SqlFence::with_table("fences").is_ok());
        assert!(SqlFence::with_table("ops.fences_2").is_ok());
        for bad in ["", "a;b", "1x", "a.b.c", "x y"] {
            assert!(
                matches!(
                    SqlFence::with_table(bad),
                    Err(FenceError::InvalidTable { .. })
                ),
                "{bad}"
            );
        }
    }
}
