//! [`BuildError`]: an option or a definition that cannot work, reported by a builder's
//! `build()`, `start()` or `connect()` before anything starts.

/// A job definition or scheduler option that cannot work, reported by
/// [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) (and an election option by
/// [`LeaderElectorBuilder::start`](crate::leader::LeaderElectorBuilder::start)) with the offending
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

    /// Two handlers share a name (a handler registered with
    /// [`SchedulerBuilder::handler`](crate::SchedulerBuilder::handler) and a job declared
    /// in code, whose handler goes by the job's name, count alike).
    #[error("handler name `{name}` is used twice: name each handler once")]
    DuplicateHandler {
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

    /// A name is too long for the lock keys made from it; see [`NameTooLong`].
    #[error(transparent)]
    NameTooLong(#[from] NameTooLong),

    /// An option is out of range.
    #[error("{what}: {reason}")]
    InvalidOption {
        /// The option (and job, if it is a job's).
        what: String,
        /// Why it cannot work.
        reason: String,
    },
}

/// A name too long for the lock keys made from it: the client's `max_resource_len` less
/// the longest suffix the scheduler adds (see [`keys`](crate::keys) for the keys and the
/// bounds). Use a name of at most `max` bytes.
///
/// Refused when a builder checks its names ([`BuildError::NameTooLong`]) and when a job
/// changes at run time ([`RequestError::NameTooLong`](crate::error::RequestError::NameTooLong)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {kind} `{start}` is {len} bytes long, above the {max} bytes its lock keys leave room for: use a name of at most {max} bytes (see redlock_scheduler::keys)"
)]
#[non_exhaustive]
pub struct NameTooLong {
    /// Which name.
    pub kind: NameKind,
    /// Its first bytes (64 at most, then `…`).
    pub start: String,
    /// Its length, in bytes.
    pub len: usize,
    /// The longest name accepted, in bytes.
    pub max: usize,
}

/// Which name is too long for the keys made from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NameKind {
    /// A scheduler's name ([`SchedulerBuilder::name`](crate::SchedulerBuilder::name)).
    Scheduler,
    /// A job's name.
    Job,
    /// The lock a [`LeaderElector`](crate::leader::LeaderElector) campaigns for.
    Election,
}

impl std::fmt::Display for NameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Scheduler => "scheduler name",
            Self::Job => "job name",
            Self::Election => "election's lock name",
        })
    }
}
