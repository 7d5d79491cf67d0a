//! Jobs changed at run time: [`JobChange`], one change as the history records it, with
//! the [`JobSpec`]s it put in force and replaced.
//!
//! A change is a row of the history database, numbered per scheduler; every replica
//! reads the new ones within [`JOB_CHANGE_POLL`] and applies them in order, so all
//! replicas converge on the same jobs. The jobs declared in code are where a replica
//! starts; the changes recorded since apply on top of them, on every replica and at
//! every start (a job removed at run time stays removed when a replica that declares
//! it in code starts again, until it is added again).

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::spec::JobSpec;

/// How often every replica reads the changes made since it last looked; a change made
/// through a replica's [`Scheduler`](crate::Scheduler) applies there at once.
pub const JOB_CHANGE_POLL: Duration = Duration::from_millis(250);

/// What a change did to its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobChangeAction {
    /// Added a job that was not there.
    Add,
    /// Put another definition in force for a job that was there.
    Reschedule,
    /// Took a job away.
    Remove,
}

impl JobChangeAction {
    /// Its name in the history (`add`, `reschedule`, `remove`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Reschedule => "reschedule",
            Self::Remove => "remove",
        }
    }

    pub(crate) fn from_text(text: &str) -> Option<Self> {
        match text {
            "add" => Some(Self::Add),
            "reschedule" => Some(Self::Reschedule),
            "remove" => Some(Self::Remove),
            _ => None,
        }
    }
}

/// One change of a job at run time, as recorded: what, by whom, when, old → new.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct JobChange {
    /// Its number: changes apply in this order.
    pub seq: u64,
    /// The job.
    pub job: String,
    /// What it did.
    pub action: JobChangeAction,
    /// The definition it put in force (`None` for a removal).
    pub definition: Option<JobSpec>,
    /// The definition it replaced (`None` for an addition).
    pub previous: Option<JobSpec>,
    /// Who made it (the operator's name, or the replica's id).
    pub changed_by: String,
    /// When it was made (the writer's clock); the new definition fires no tick before.
    pub changed: DateTime<Utc>,
}
