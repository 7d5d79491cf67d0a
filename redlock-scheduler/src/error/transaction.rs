//! [`TransactionError`]: why a run's transaction was refused, or failed.

use super::history::HistoryError;

/// Why a run's transaction was refused, or failed. Refused, everything it wrote was
/// rolled back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionError {
    /// A run's transaction ([`JobContext::transaction`](crate::JobContext::transaction))
    /// needs the history database, and the scheduler has none: give it one with
    /// [`SchedulerBuilder::history`](crate::SchedulerBuilder::history).
    #[error(
        "a run's transaction needs the scheduler's history database: give the scheduler one (SchedulerBuilder::history)"
    )]
    NoHistory,

    /// A later run of the job committed its transaction since this run took its job's
    /// run lock: this run lost the lock while it went on (its replica was paused, or cut
    /// off, past the lock's TTL) and another took it. The transaction was rolled back;
    /// nothing it wrote is kept. Do not retry: the later run's effects stand.
    #[error(
        "job `{job}`, tick {tick}: run token {token} is stale (a later run of the job committed with token {highest}); the run's transaction was rolled back: do not retry, the later run's effects stand"
    )]
    StaleRun {
        /// The job.
        job: String,
        /// The tick (RFC 3339).
        tick: String,
        /// The run's token: the fencing token of its lock on the job.
        token: u64,
        /// The highest run token that committed for the job.
        highest: u64,
    },

    /// A run's transaction was refused because the run is over for the scheduler: it
    /// was told to stop (leadership or its run lock lost, timeout, shutdown, an
    /// operator's cancel), or its history row was closed or claimed by another replica.
    /// The transaction was rolled back; nothing it wrote is kept.
    #[error(
        "job `{job}`, tick {tick}: {reason}; the run's transaction was rolled back: stop the run, the scheduler records how it ended"
    )]
    RunEnded {
        /// The job.
        job: String,
        /// The tick (RFC 3339).
        tick: String,
        /// Why the run is over.
        reason: String,
    },

    /// A run's commit was sent and failed (its answer lost when the link to the
    /// database failed or it did not answer in time, or an error), and the run's row
    /// could not be read back to tell whether it committed all the same. Do not redo the
    /// effects: the history records the run as its row says (`succeeded` if the commit
    /// went through) once the database answers again.
    #[error(
        "job `{job}`, tick {tick}: whether the run's transaction committed is not known ({cause}); do not redo its effects: the run's history row says it once the database answers"
    )]
    CommitUnknown {
        /// The job.
        job: String,
        /// The tick (RFC 3339).
        tick: String,
        /// Why the answer is missing.
        cause: String,
    },

    /// The history database failed, and nothing was committed (when the commit itself
    /// failed, the run's row was read back to tell).
    #[error(transparent)]
    History(#[from] HistoryError),
}
