//! [`RequestError`]: why an operator's control or a job change was refused, or could not
//! be carried out.

use std::time::Duration;

use super::build::{BuildError, NameTooLong};
use super::history::HistoryError;
use crate::request::RequestState;

/// Why an operator's control (trigger, cancel, pause, resume, step down, a job added,
/// rescheduled or removed, a job or request looked up or waited for) was refused, or
/// could not be carried out: the history's error, a lock's, or a scheduler shut down.
/// What to do next is in each message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No job has this name (for a [`SchedulerAdmin`](crate::admin::SchedulerAdmin):
    /// none that a replica of the scheduler published when it started).
    #[error(
        "no job named `{name}`: check the name (and the scheduler's name) against the list of jobs"
    )]
    UnknownJob {
        /// The name asked for.
        name: String,
    },

    /// The tick was already claimed (run, running or skipped) by some replica.
    #[error("job `{job}`: the tick {tick} is already claimed; trigger it again for a new tick")]
    AlreadyClaimed {
        /// The job.
        job: String,
        /// The tick (RFC 3339).
        tick: String,
    },

    /// Only the leader carries this out, and this replica does not lead; without a
    /// history it cannot pass the control on as a request either.
    #[error(
        "this replica does not lead and has no history to pass the request on: call it on the leader, or give the scheduler a history (SchedulerBuilder::history)"
    )]
    NotLeader,

    /// A run of the job is still going (on this replica or another one): a job never
    /// overlaps itself.
    #[error("job `{job}`: a run is still going; trigger it again once that run has ended")]
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

    /// A job of this name is there already: reschedule it, or add it under another
    /// name.
    #[error("a job named `{name}` is there already: reschedule it instead, or choose another name")]
    JobExists {
        /// The name.
        name: String,
    },

    /// No handler of this name is registered (on this replica, for a change made
    /// through a [`Scheduler`](crate::Scheduler); on any replica that said it is alive
    /// in the last minute, for one made through a
    /// [`SchedulerAdmin`](crate::admin::SchedulerAdmin)).
    #[error(
        "job `{job}`: no handler named `{handler}` is registered {place}: register it with SchedulerBuilder::handler, or name a registered one"
    )]
    UnknownHandler {
        /// The job.
        job: String,
        /// The handler's name.
        handler: String,
        /// Where it was looked for.
        place: String,
    },

    /// The job's definition cannot work (its schedule, time zone or an option).
    #[error("the job's definition is refused: {0}")]
    InvalidJob(#[source] BuildError),

    /// The job's name (or the scheduler's) is too long for the lock keys made from it;
    /// see [`NameTooLong`].
    #[error(transparent)]
    NameTooLong(#[from] NameTooLong),

    /// Replicas alive now run a version that does not apply job changes: they would
    /// keep firing the jobs as they were. Upgrade them first.
    #[error(
        "replicas {instances:?} run a version that does not apply job changes: upgrade every replica before changing jobs at run time"
    )]
    ReplicasOutdated {
        /// The replicas' ids.
        instances: Vec<String>,
    },

    /// Other changes of the scheduler's jobs kept coming in between reading and writing
    /// this one: try again.
    #[error("job `{job}`: other job changes kept coming in while this one was written; try again")]
    ChangeConflict {
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
    NotDone {
        /// The request.
        id: String,
        /// How long it was waited for.
        waited: Duration,
        /// Where it stood then.
        state: RequestState,
    },

    /// The scheduler is shutting down or shut down: use a running replica.
    #[error("the scheduler is shut down; use a running replica")]
    ShutDown,

    /// A lock operation failed (no quorum of Redis nodes, say): retry once the nodes
    /// answer (the message says which did not).
    #[error(transparent)]
    Lock(#[from] redlock_core::Error),

    /// The run history's database failed; see [`HistoryError`].
    #[error(transparent)]
    History(#[from] HistoryError),
}

impl From<BuildError> for RequestError {
    /// A name too long for its keys is [`RequestError::NameTooLong`]; any other
    /// definition that cannot work, [`RequestError::InvalidJob`].
    fn from(err: BuildError) -> Self {
        match err {
            BuildError::NameTooLong(err) => Self::NameTooLong(err),
            other => Self::InvalidJob(other),
        }
    }
}
