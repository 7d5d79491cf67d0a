//! What [`Scheduler::status`](crate::Scheduler::status) and
//! [`Scheduler::health`](crate::Scheduler::health) report; serde-serializable (for an
//! admin endpoint, say).

mod health;

use chrono::{DateTime, Utc};

pub use self::health::{ComponentHealth, Health};
pub(crate) use self::health::{HealthCell, watch_redis};
use crate::history::{Outcome, Run};
use crate::spec::Misfire;

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
    /// The Redis quorum and the history database: ok or failing since when.
    pub health: Health,
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
    /// Its daylight saving policy (for a fixed-time schedule; see
    /// [`DstPolicy`](crate::time::DstPolicy)).
    pub dst: crate::time::DstPolicy,
    /// Paused.
    pub paused: bool,
    /// A run is going on this replica.
    pub running: bool,
    /// The latest run (from the history if there is one, else as seen here; this
    /// replica's own account wins while its row waits to be written).
    pub last_run: Option<LastRun>,
    /// The latest tick this replica did not run, with the reason (missed, paused,
    /// overlap, not claimable).
    pub last_skipped: Option<LastRun>,
    /// Ticks this replica recorded as skipped since it started.
    pub skipped: u64,
    /// Runs of other replicas this replica found dead and closed as abandoned.
    pub abandoned: u64,
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
    /// Its error, if any (or why it was skipped or abandoned).
    pub error: Option<String>,
    /// Its row is in the history (`false` while the write waits for the database).
    pub recorded: bool,
}

impl From<Run> for LastRun {
    fn from(run: Run) -> Self {
        Self {
            tick: run.tick,
            instance: run.instance,
            outcome: run.outcome,
            error: run.error,
            recorded: true,
        }
    }
}
