//! Operators' requests as data: what was asked ([`RequestAction`]), where it stands
//! ([`RequestState`]), the recorded [`Request`], what a control did ([`Dispatched`]), and
//! why one was refused ([`RequestError`]). The history stores them; the scheduler and
//! [`SchedulerAdmin`](crate::admin::SchedulerAdmin) make and carry them out.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// What an operator asks of a scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RequestAction {
    /// Run a job once now (on the leader, through the claim path, recorded as manual).
    Trigger,
    /// Cancel the run of a job going now (recorded as cancelled by an operator).
    Cancel,
    /// The leader gives up leadership and keeps out of the election for a while, so
    /// that another replica takes over.
    StepDown,
}

impl RequestAction {
    /// The stored text: `trigger`, `cancel`, `step_down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trigger => "trigger",
            Self::Cancel => "cancel",
            Self::StepDown => "step_down",
        }
    }
}

impl FromStr for RequestAction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "trigger" => Self::Trigger,
            "cancel" => Self::Cancel,
            "step_down" => Self::StepDown,
            other => return Err(format!("unknown request action `{other}`")),
        })
    }
}

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RequestState {
    /// No replica has taken it yet (no leader, or the leader's next look is to come:
    /// it looks about twice a second).
    Pending,
    /// A replica took it and is carrying it out.
    Executing,
    /// Done: the result starts with `ok`.
    Succeeded,
    /// Done, but it could not be carried out: the result says why (`no run going`, the
    /// trigger's error, ...).
    Failed,
    /// No replica carried it out within 60 s of the request: the leader that saw it
    /// then marked it so instead of acting late.
    Expired,
}

/// An operator's request to a scheduler, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Request {
    /// Its id (32 hex digits).
    pub id: String,
    /// The scheduler's name.
    pub scheduler: String,
    /// The job, for a trigger or a cancel.
    pub job: Option<String>,
    /// What was asked.
    pub action: RequestAction,
    /// When it was asked.
    pub requested: DateTime<Utc>,
    /// Who asked (an operator's name, or the replica that relayed it).
    pub requested_by: String,
    /// When a replica took it.
    pub done: Option<DateTime<Utc>>,
    /// The replica that took it.
    pub done_by: Option<String>,
    /// `ok` (with details: the tick run, the run cancelled) or what went wrong.
    pub result: Option<String>,
    /// Where it stands (from the columns above).
    pub state: RequestState,
}

impl Request {
    /// Carried out, failed or expired: nothing more will happen to it.
    pub fn is_done(&self) -> bool {
        matches!(
            self.state,
            RequestState::Succeeded | RequestState::Failed | RequestState::Expired
        )
    }
}

/// What an expired request's result starts with.
pub(crate) const EXPIRED: &str = "expired";

pub(crate) fn state_of(done: Option<i64>, result: Option<&str>) -> RequestState {
    match (done, result) {
        (None, _) => RequestState::Pending,
        (Some(_), None) => RequestState::Executing,
        (Some(_), Some(r)) if r == "ok" || r.starts_with("ok:") => RequestState::Succeeded,
        (Some(_), Some(r)) if r.starts_with(EXPIRED) => RequestState::Expired,
        (Some(_), Some(_)) => RequestState::Failed,
    }
}

/// What a control ([`Scheduler::trigger`](crate::Scheduler::trigger),
/// [`cancel`](crate::Scheduler::cancel), [`step_down`](crate::Scheduler::step_down), and
/// the same verbs of [`SchedulerAdmin`](crate::admin::SchedulerAdmin)) did: carried out
/// by the replica asked, or recorded as a request for the replica that can carry it out.
/// Every control answers one, on a `Scheduler` and a `SchedulerAdmin` alike; a
/// `SchedulerAdmin` runs no replica, so it always answers
/// [`Requested`](Self::Requested). Serializable with serde.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
#[non_exhaustive]
pub enum Dispatched {
    /// Done here.
    Done {
        /// What was done, as a request's result says it (starts with `ok`: `ok: tick
        /// <RFC 3339>` for a trigger).
        result: String,
        /// The tick concerned: the one a trigger ran, or the one whose run was
        /// cancelled (`None` for a step-down).
        tick: Option<DateTime<Utc>>,
    },
    /// Recorded as a request; follow it with
    /// [`SchedulerAdmin::wait`](crate::admin::SchedulerAdmin::wait) (a running scheduler
    /// offers one: [`Scheduler::admin`](crate::Scheduler::admin)).
    Requested {
        /// The request's id.
        id: String,
    },
}

impl Dispatched {
    /// The request's id, if the control was recorded as a request.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Self::Requested { id } => Some(id),
            Self::Done { .. } => None,
        }
    }
}

/// Why an operator's control (trigger, cancel, pause, resume, step down, a request
/// read or waited for) was refused. What to do next is in each message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    InvalidJob(#[source] crate::BuildError),

    /// The job's name (or the scheduler's) is too long for the lock keys made from it:
    /// the client's `max_resource_len` less the longest suffix the scheduler adds (see
    /// [`keys`](crate::keys)). Use a name of at most `max` bytes.
    #[error(
        "the {kind} `{start}` is {len} bytes long, above the {max} bytes its lock keys leave room for: use a name of at most {max} bytes (see redlock_scheduler::keys)"
    )]
    NameTooLong {
        /// Which name.
        kind: crate::keys::NameKind,
        /// Its first bytes (64 at most, then `…`).
        start: String,
        /// Its length, in bytes.
        len: usize,
        /// The longest name accepted, in bytes.
        max: usize,
    },

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
}

impl From<crate::BuildError> for RequestError {
    /// A name too long for its keys is [`RequestError::NameTooLong`]; any other
    /// definition that cannot work, [`RequestError::InvalidJob`].
    fn from(err: crate::BuildError) -> Self {
        match err {
            crate::BuildError::NameTooLong {
                kind,
                start,
                len,
                max,
            } => Self::NameTooLong {
                kind,
                start,
                len,
                max,
            },
            other => Self::InvalidJob(other),
        }
    }
}
