//! [`FenceError`]: why a fenced write was refused or could not be checked, for every
//! backend.

/// Why a fenced write was refused or could not be checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A higher token was seen for the resource: the lock has had a newer holder since
    /// this token was handed out. The write was not applied (SQL: roll back). Do not
    /// retry with this token; acquire the lock again for a new one.
    #[error(
        "stale fencing token {token} for `{resource}`: token {highest} was seen already; roll back and acquire the lock again"
    )]
    Stale {
        /// The resource.
        resource: String,
        /// The token refused.
        token: u64,
        /// The highest token seen for the resource.
        highest: u64,
    },
    /// The token does not fit the fence table's BIGINT (SQL only: the Redis fence takes
    /// every `u64`).
    #[error(
        "fencing token {token} is above the largest the fence table stores ({})",
        i64::MAX
    )]
    TokenOutOfRange {
        /// The token.
        token: u64,
    },
    /// The resource name is empty, or longer than the fence's bound (`max_resource_len`
    /// on [`SqlFence`](crate::SqlFence) and `RedisFence`; by default redlock-core's
    /// [`DEFAULT_MAX_RESOURCE_LEN`](redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN), 512 bytes).
    /// The rule is redlock-core's for lock names
    /// ([`check_resource_name`](redlock_core::check_resource_name)), so no lock is taken
    /// for such a name either. Nothing was sent. Fence the name the lock was taken for (a
    /// hash of a long one, say), or raise the bound along with the lock client's.
    #[error("the fence refuses the resource name: {0}")]
    InvalidResource(#[source] redlock_core::ArgumentError),
    /// The fence table's name is not a plain SQL identifier.
    #[error(
        "`{table}` is not a plain table name (letters, digits, `_`, optionally `schema.table`)"
    )]
    InvalidTable {
        /// The name given.
        table: String,
    },
    /// The SQL database failed.
    #[error("the fence check failed in the database: {0}")]
    Database(#[from] sqlx::Error),
    /// A Redis fence key holds something other than a fencing token (the decimal
    /// digits of a `u64`): another program wrote it. Nothing was written.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[error("fence key `{key}` holds {value:?}, not a fencing token; nothing was written")]
    NotAToken {
        /// The fence key.
        key: String,
        /// What it holds.
        value: String,
    },
    /// Redis failed, or refused the script (a fence key of another type, keys in two
    /// hash slots on a cluster, an invalid TTL). Nothing was written, unless the
    /// connection failed after the script ran: then the write may have been applied.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[error("the fenced Redis write failed: {0}")]
    Redis(#[from] ::redis::RedisError),
}
