//! Operators' requests as data: what was asked ([`RequestAction`]), where it stands
//! ([`RequestState`]), the recorded [`Request`], and what a control did ([`Dispatched`])
//! (why one was refused is a [`RequestError`](crate::error::RequestError)). The history
//! stores them; the scheduler and [`SchedulerAdmin`](crate::admin::SchedulerAdmin) make
//! and carry them out.

use std::str::FromStr;

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
