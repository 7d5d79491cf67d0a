//! Errors: what went wrong and what to do next.

/// A job definition or scheduler option that cannot work, reported by
/// [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) (and an election option by
/// [`LeaderElectorBuilder::start`](crate::LeaderElectorBuilder::start)) with the offending
/// input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A job has an empty (or blank) name: give it a unique one.
    #[error("a job has an empty name: give every job a unique, non-empty name")]
    EmptyName,

    /// Two jobs share a name: names identify ticks and history rows, so they must be
    /// unique.
    #[error("job name `{name}` is used twice: job names must be unique")]
    DuplicateJob {
        /// The repeated name.
        name: String,
    },

    /// A job's cron expression or time zone is invalid.
    #[error("job `{job}`: invalid schedule `{expression}` ({reason})")]
    InvalidSchedule {
        /// The job.
        job: String,
        /// The expression (and zone) as given.
        expression: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An option is out of range.
    #[error("{what}: {reason}")]
    InvalidOption {
        /// The option (and job, if it is a job's).
        what: String,
        /// Why it cannot work.
        reason: String,
    },
}

/// An error of a running scheduler or of its history store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The run history database failed. Check the database; the scheduler keeps going
    /// with the Redis claims alone until it answers again.
    #[error("run history: {0}")]
    Store(#[from] sqlx::Error),

    /// A history statement did not finish in time (the database is slow, or its link is
    /// down). The scheduler keeps going with the Redis claims alone and writes what it
    /// could not once the database answers again.
    #[error(
        "run history: {operation} got no answer within {after:?}; check the database and the link to it"
    )]
    StoreTimeout {
        /// What was being done.
        operation: &'static str,
        /// The bound that ran out.
        after: std::time::Duration,
    },

    /// The history database could not be opened.
    #[error("run history: cannot open {place}: {cause}")]
    Connect {
        /// The database (address or file, no credentials).
        place: String,
        /// Why: refused, no answer within the connect timeout, authentication, ...
        cause: String,
    },

    /// The history URL names no supported database.
    #[error("run history: invalid URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given (password redacted).
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A history option cannot work.
    #[error("run history: {what}: {reason}")]
    InvalidConfig {
        /// The option.
        what: String,
        /// Why.
        reason: String,
    },

    /// A schema migration failed (the transaction was rolled back; nothing changed).
    #[error("run history: migration {version} failed: {source}")]
    Migration {
        /// The migration's number.
        version: i64,
        /// The database's error.
        source: sqlx::Error,
    },

    /// A lock operation failed (no quorum of Redis nodes, say).
    #[error(transparent)]
    Lock(#[from] redlock_core::Error),

    /// No job has this name (for [`SchedulerAdmin`](crate::SchedulerAdmin): none that a
    /// replica of the scheduler published when it started).
    #[error(
        "no job named `{name}`: check the name (and the scheduler's name) against the list of jobs"
    )]
    UnknownJob {
        /// The name asked for.
        name: String,
    },

    /// The tick was already claimed (run, running or skipped) by some replica.
    #[error("job `{job}`: the tick {tick} is already claimed")]
    AlreadyClaimed {
        /// The job.
        job: String,
        /// The tick (RFC 3339).
        tick: String,
    },

    /// Only the leader runs jobs, manual triggers included: call this on the leader
    /// (named if known).
    #[error("this replica does not lead{}; trigger the job on the leader", leader.as_deref().map(|l| format!(" (`{l}` does)")).unwrap_or_default())]
    NotLeader {
        /// The leading replica, if known.
        leader: Option<String>,
    },

    /// A run of the job is still going (on this replica or another one): a job never
    /// overlaps itself. Trigger it again once that run has ended.
    #[error("job `{job}`: a run is still going")]
    AlreadyRunning {
        /// The job.
        job: String,
    },

    /// No run of the job is going, so there is nothing to cancel.
    #[error("job `{job}`: no run is going, nothing to cancel")]
    NotRunning {
        /// The job.
        job: String,
    },

    /// No request of this scheduler has this id.
    #[error(
        "no request `{id}` for this scheduler: check the id and the scheduler's name it was made for"
    )]
    UnknownRequest {
        /// The id asked for.
        id: String,
    },

    /// A request was not carried out within the time waited. It may still be: read it
    /// again later. A request stays pending while no replica leads; the leader marks it
    /// expired, without acting, once it is older than a minute.
    #[error(
        "request `{id}` not carried out within {waited:?} (it is {state:?}): check that a replica of the scheduler leads, and read the request again later"
    )]
    RequestNotDone {
        /// The request.
        id: String,
        /// How long it was waited for.
        waited: std::time::Duration,
        /// Where it stood then.
        state: crate::store::RequestState,
    },

    /// The scheduler did not become ready in time: what was still missing.
    #[error("the scheduler is not ready: {missing}")]
    NotReady {
        /// What is missing (Redis quorum, quarantine, history).
        missing: String,
    },

    /// A run's transaction ([`JobContext::transaction`](crate::JobContext::transaction))
    /// needs the history database, and the scheduler has none: give it one with
    /// [`SchedulerBuilder::history`](crate::SchedulerBuilder::history).
    #[error(
        "a run's transaction needs the scheduler's history database: give the scheduler one (SchedulerBuilder::history)"
    )]
    NoHistory,

    /// A later leadership wrote through a run's transaction (or took over) since this
    /// run's leadership began: this replica no longer leads (it was paused, or cut off,
    /// past its term). The transaction was rolled back; nothing it wrote is kept. Do not
    /// retry: the leader decides what runs.
    #[error(
        "job `{job}`, tick {tick}: leadership token {token} is stale (token {highest} took over since); the run's transaction was rolled back"
    )]
    StaleRun {
        /// The job.
        job: String,
        /// The tick (RFC 3339).
        tick: String,
        /// The run's leadership token.
        token: u64,
        /// The highest token seen for the job.
        highest: u64,
    },

    /// A run's transaction was refused because the run is over for the scheduler: it
    /// was told to stop (leadership or its run lock lost, timeout, shutdown, an
    /// operator's cancel), or its history row was closed or claimed by another replica.
    /// The transaction was rolled back; nothing it wrote is kept.
    #[error("job `{job}`, tick {tick}: {reason}; the run's transaction was rolled back")]
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
        "job `{job}`, tick {tick}: whether the run's transaction committed is not known ({cause}); the run's history row says it once the database answers"
    )]
    CommitUnknown {
        /// The job.
        job: String,
        /// The tick (RFC 3339).
        tick: String,
        /// Why the answer is missing.
        cause: String,
    },

    /// A fence check could not be made (a token beyond the fence table's range).
    #[error("run history: {0}")]
    Fence(redlock_fence::FenceError),

    /// The scheduler is shutting down or shut down.
    #[error("the scheduler is shut down")]
    ShutDown,
}
