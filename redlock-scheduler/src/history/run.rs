//! A history row: the run of one tick, and how it ended.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::Db;
use super::HistoryError as Error;
use super::from_ms;

/// How a run ended (or that it is still running).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// Claimed, and running now (or its replica died while it ran and no leader has
    /// looked at it since).
    Running,
    /// The handler returned `Ok`.
    Succeeded,
    /// The handler returned an error (in the `error` column).
    Failed,
    /// The job's timeout ran out.
    TimedOut,
    /// Stopped: leadership or the run's lock was lost, shutdown passed its deadline, or
    /// an operator cancelled it (the error then says `cancelled by an operator`).
    Cancelled,
    /// Not run, for the reason in the `error` column: missed while no replica led (per
    /// the misfire policy), paused, or the previous run was still going (overlap).
    Skipped,
    /// Its replica stopped (crashed, or lost contact) while it ran: a later leader found
    /// its lock gone and closed the row (`closed_by`, `finished_ms`).
    Abandoned,
}

impl Outcome {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
            Self::Skipped => "skipped",
            Self::Abandoned => "abandoned",
        }
    }

    /// Whether the run is over (every outcome but [`Running`](Self::Running)).
    pub fn is_terminal(self) -> bool {
        self != Self::Running
    }
}

impl FromStr for Outcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "running" => Self::Running,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "timed_out" => Self::TimedOut,
            "cancelled" => Self::Cancelled,
            "skipped" => Self::Skipped,
            "abandoned" => Self::Abandoned,
            other => return Err(format!("unknown outcome `{other}`")),
        })
    }
}

/// One row of the history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Run {
    /// The scheduler's name.
    pub scheduler: String,
    /// The job.
    pub job: String,
    /// The scheduled tick.
    pub tick: DateTime<Utc>,
    /// The replica that claimed it.
    pub instance: String,
    /// The leadership fencing token it ran with.
    pub fencing_token: Option<u64>,
    /// When it started (`None` if skipped).
    pub started: Option<DateTime<Utc>>,
    /// When it ended.
    pub finished: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: Outcome,
    /// The error, for a failed run (or why it was skipped, cancelled or abandoned).
    pub error: Option<String>,
    /// Started by [`Scheduler::trigger`](crate::Scheduler::trigger), not the schedule.
    pub manual: bool,
    /// The replica that closed it as [`Outcome::Abandoned`].
    pub closed_by: Option<String>,
}

/// A row to insert when a tick is claimed.
#[derive(Debug, Clone)]
pub(crate) struct NewRun<'a> {
    pub(crate) scheduler: &'a str,
    pub(crate) job: &'a str,
    pub(crate) tick: DateTime<Utc>,
    pub(crate) instance: &'a str,
    pub(crate) token: u64,
    pub(crate) outcome: Outcome,
    pub(crate) note: Option<&'a str>,
    pub(crate) manual: bool,
    /// When the run started (or the tick was skipped).
    pub(crate) at: DateTime<Utc>,
}

/// How a run this replica claimed ended.
#[derive(Debug, Clone)]
pub(crate) struct RunEnd<'a> {
    pub(crate) scheduler: &'a str,
    pub(crate) job: &'a str,
    pub(crate) tick: DateTime<Utc>,
    pub(crate) instance: &'a str,
    pub(crate) outcome: Outcome,
    pub(crate) error: Option<&'a str>,
    pub(crate) at: DateTime<Utc>,
}

/// One write to the runs table.
#[derive(Debug, Clone)]
pub(crate) enum Change<'a> {
    /// Insert a tick's row, unless the tick already has one.
    Claim(NewRun<'a>),
    /// Record how a run ended.
    Finish(RunEnd<'a>),
}

pub(super) fn run_from_row(row: &AnyRow) -> Result<Run, Error> {
    let outcome: String = row.try_get("outcome").db()?;
    let token: Option<i64> = row.try_get("fencing_token").db()?;
    let started: Option<i64> = row.try_get("started_ms").db()?;
    let finished: Option<i64> = row.try_get("finished_ms").db()?;
    let manual: i32 = row.try_get("manual").db()?;
    Ok(Run {
        scheduler: row.try_get("scheduler").db()?,
        job: row.try_get("job").db()?,
        tick: from_ms(row.try_get("tick_ms").db()?),
        instance: row.try_get("instance").db()?,
        fencing_token: token.and_then(|t| u64::try_from(t).ok()),
        started: started.map(from_ms),
        finished: finished.map(from_ms),
        outcome: Outcome::from_str(&outcome)
            .map_err(|e| sqlx::Error::Decode(e.into()))
            .db()?,
        error: row.try_get("error").db()?,
        manual: manual != 0,
        closed_by: row.try_get("closed_by").db()?,
    })
}
