//! What [`Scheduler::status`](crate::Scheduler::status) reports; serde-serializable (for
//! an admin endpoint, say).

use chrono::{DateTime, Utc};

use crate::job::Misfire;
use crate::store::{Outcome, Run};

/// The scheduler as this replica sees it.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct SchedulerStatus {
    /// The scheduler's name.
    pub scheduler: String,
    /// This replica.
    pub instance: String,
    /// This replica leads.
    pub is_leader: bool,
    /// The leading replica, if known (this one, or the last recorded in the history).
    pub leader: Option<String>,
    /// This replica's leadership epoch, if it leads.
    pub epoch: Option<u64>,
    /// Every job.
    pub jobs: Vec<JobStatus>,
}

/// One job.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct JobStatus {
    /// Its name.
    pub name: String,
    /// Its cron expression.
    pub schedule: String,
    /// Its time zone.
    pub time_zone: String,
    /// Its next tick.
    pub next_fire: Option<DateTime<Utc>>,
    /// Its misfire policy.
    pub misfire: Misfire,
    /// Paused.
    pub paused: bool,
    /// A run is going on this replica.
    pub running: bool,
    /// The latest run (from the history if there is one, else as seen here).
    pub last_run: Option<LastRun>,
}

/// The latest run of a job.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LastRun {
    /// Its tick.
    pub tick: DateTime<Utc>,
    /// The replica that ran (or skipped) it.
    pub instance: String,
    /// How it ended.
    pub outcome: Outcome,
    /// Its error, if any.
    pub error: Option<String>,
}

impl From<Run> for LastRun {
    fn from(run: Run) -> Self {
        Self {
            tick: run.tick,
            instance: run.instance,
            outcome: run.outcome,
            error: run.error,
        }
    }
}
