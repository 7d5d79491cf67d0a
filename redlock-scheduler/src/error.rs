//! [`Error`]: what a scheduler's call returns, by concern: the history
//! ([`HistoryError`]), a run's transaction ([`TransactionError`]), an operator's control
//! ([`RequestError`]), a lock, or the scheduler's own life (not ready, shut down).

use crate::history::HistoryError;
use crate::request::RequestError;
use crate::transaction::TransactionError;

/// An error of a running scheduler, of its admin, or of a run's transaction: each
/// concern's own error, wrapped (`?` converts each), or the scheduler's own state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The run history's database failed; see [`HistoryError`].
    #[error(transparent)]
    History(#[from] HistoryError),

    /// A run's transaction was refused or failed; see [`TransactionError`].
    #[error(transparent)]
    Transaction(#[from] TransactionError),

    /// An operator's control was refused; see [`RequestError`].
    #[error(transparent)]
    Request(#[from] RequestError),

    /// A lock operation failed (no quorum of Redis nodes, say): retry once the nodes
    /// answer (the message says which did not).
    #[error(transparent)]
    Lock(#[from] redlock_core::Error),

    /// The scheduler did not become ready in time: what was still missing.
    #[error("the scheduler is not ready: {missing}; check the Redis nodes, then wait again")]
    NotReady {
        /// What is missing (Redis quorum, quarantine, history).
        missing: String,
    },

    /// The scheduler is shutting down or shut down: use a running replica.
    #[error("the scheduler is shut down; use a running replica")]
    ShutDown,
}
