//! The errors, one per concern, and [`Error`], the umbrella that each converts into.
//!
//! Each call returns the error of its concern:
//!
//! | error | returned by |
//! | --- | --- |
//! | [`BuildError`] | [`SchedulerBuilder::build`](crate::SchedulerBuilder::build), [`LeaderElectorBuilder::start`](crate::leader::LeaderElectorBuilder::start): an option or a job definition that cannot work |
//! | [`NotReady`] | [`Scheduler::wait_ready`](crate::Scheduler::wait_ready): what was still missing when the wait ended |
//! | [`HistoryError`] | [`History`](crate::History)'s calls and the history reads of [`SchedulerAdmin`](crate::admin::SchedulerAdmin) (jobs, leader, runs, job changes): the database failed, or cannot be opened ([`DatabaseError`]: the database's own error) |
//! | [`RequestError`] | an operator's control on a [`Scheduler`](crate::Scheduler) or a [`SchedulerAdmin`](crate::admin::SchedulerAdmin) (trigger, cancel, pause, resume, step down, a job added, rescheduled or removed, a job or a request looked up or waited for): refused, or the history's or a lock's error |
//! | [`TransactionError`] | a run's transaction ([`JobContext::transaction`](crate::JobContext::transaction), [`RunTransaction`](crate::transaction::RunTransaction)) |
//!
//! `?` converts each into [`Error`], for code that calls several concerns and does not
//! need to tell them apart.

// One file per concern, each using only those before it: `build`, `history` (uses
// `build`), `request` (`build`, `history`), `transaction` (`history`); this file uses
// them all.
pub(crate) mod build;
pub(crate) mod history;
pub(crate) mod request;
pub(crate) mod transaction;

pub use self::build::{BuildError, NameTooLong};
pub use self::history::{DatabaseError, HistoryError};
pub use self::request::RequestError;
pub use self::transaction::TransactionError;

/// Any error of this crate: each concern's own error, wrapped (`?` converts each), or
/// the scheduler's own state (not ready, shut down).
///
/// A [`RequestError`] that carries the history's or a lock's error, or says the
/// scheduler is shut down, converts into [`Error::History`], [`Error::Lock`] or
/// [`Error::ShutDown`], so that one arm matches each of those whatever the call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An option or a job definition cannot work; see [`BuildError`].
    #[error(transparent)]
    Build(#[from] BuildError),

    /// The run history's database failed; see [`HistoryError`].
    #[error(transparent)]
    History(#[from] HistoryError),

    /// A run's transaction was refused or failed; see [`TransactionError`].
    #[error(transparent)]
    Transaction(#[from] TransactionError),

    /// An operator's control was refused; see [`RequestError`].
    #[error(transparent)]
    Request(RequestError),

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

impl From<RequestError> for Error {
    /// [`RequestError::History`], [`RequestError::Lock`] and [`RequestError::ShutDown`]
    /// become [`Error::History`], [`Error::Lock`] and [`Error::ShutDown`]; any other
    /// refusal, [`Error::Request`].
    fn from(err: RequestError) -> Self {
        match err {
            RequestError::History(err) => Self::History(err),
            RequestError::Lock(err) => Self::Lock(err),
            RequestError::ShutDown => Self::ShutDown,
            other => Self::Request(other),
        }
    }
}

impl From<NotReady> for Error {
    fn from(err: NotReady) -> Self {
        Self::NotReady {
            missing: err.missing,
        }
    }
}

/// The scheduler did not become ready within the time waited
/// ([`Scheduler::wait_ready`](crate::Scheduler::wait_ready)): a majority of the Redis
/// nodes did not answer, or was still in restart quarantine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the scheduler is not ready: {missing}; check the Redis nodes, then wait again")]
#[non_exhaustive]
pub struct NotReady {
    missing: String,
}

impl NotReady {
    pub(crate) fn new(missing: String) -> Self {
        Self { missing }
    }

    /// What was missing: the Redis nodes' last error, or that none answered yet.
    pub fn missing(&self) -> &str {
        &self.missing
    }
}
