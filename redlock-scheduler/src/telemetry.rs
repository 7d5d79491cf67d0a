//! The scheduler's metrics, through the [`metrics`](https://docs.rs/metrics) facade (as
//! `redlock_core::telemetry`, whose lock metrics the scheduler's locks report too).
//!
//! Labels carry bounded values only: job names (the jobs registered in code), outcomes
//! and skip reasons from fixed lists. Ticks, instances and errors go to `tracing` and the
//! run history.
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `redlock_scheduler_runs_total` | counter | `job`, `outcome`: `succeeded`, `failed`, `timed_out`, `cancelled` | runs this replica ended |
//! | `redlock_scheduler_run_duration_seconds` | histogram | `job` | how long a run took |
//! | `redlock_scheduler_tick_lag_seconds` | histogram | `job` | from a tick's time to its run's start (late ticks and fail-overs show here) |
//! | `redlock_scheduler_skipped_total` | counter | `job`, `reason`: `missed`, `paused`, `overlap`, `run_lock`, `unclaimable`, `no_room`, `untaken` | ticks this replica claimed but did not run |
//! | `redlock_scheduler_abandoned_total` | counter | `job` | runs of dead replicas this replica closed as abandoned |
//! | `redlock_scheduler_leader_changes_total` | counter | | times this replica became leader |
//! | `redlock_scheduler_leader` | gauge | | 1 while this replica leads, else 0 |
//!
//! Call [`describe`] once after installing a recorder.

use std::time::Duration;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

/// Runs this replica ended, by job and outcome.
pub const RUNS: &str = "redlock_scheduler_runs_total";
/// How long a run took, by job.
pub const RUN_DURATION: &str = "redlock_scheduler_run_duration_seconds";
/// From a tick's time to its run's start, by job.
pub const TICK_LAG: &str = "redlock_scheduler_tick_lag_seconds";
/// Ticks claimed but not run, by job and reason.
pub const SKIPPED: &str = "redlock_scheduler_skipped_total";
/// Runs of dead replicas closed as abandoned, by job.
pub const ABANDONED: &str = "redlock_scheduler_abandoned_total";
/// Times this replica became leader.
pub const LEADER_CHANGES: &str = "redlock_scheduler_leader_changes_total";
/// 1 while this replica leads, else 0.
pub const LEADER: &str = "redlock_scheduler_leader";

/// Why a claimed tick was not run (the `reason` label of [`SKIPPED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SkipReason {
    /// Missed in a fail-over, beyond what the misfire policy runs late.
    Missed,
    /// The job is paused.
    Paused,
    /// A run of the job was still going.
    Overlap,
    /// The job's run lock could not be taken (no quorum).
    RunLock,
    /// The tick could not be claimed within its grace window.
    Unclaimable,
    /// No replica had room for the run (`max_concurrent_runs`) within the grace window.
    NoRoom,
    /// Handed to a replica that did not take it within the grace window.
    Untaken,
    /// The job was removed at run time after the tick was claimed.
    Removed,
    /// The job was rescheduled at run time after the tick was claimed, and the new
    /// definition has no such tick.
    Rescheduled,
}

impl SkipReason {
    fn label(self) -> &'static str {
        match self {
            Self::Missed => "missed",
            Self::Paused => "paused",
            Self::Overlap => "overlap",
            Self::RunLock => "run_lock",
            Self::Unclaimable => "unclaimable",
            Self::NoRoom => "no_room",
            Self::Untaken => "untaken",
            Self::Removed => "removed",
            Self::Rescheduled => "rescheduled",
        }
    }
}

/// Gives the installed recorder each metric's description and unit.
pub fn describe() {
    describe_counter!(RUNS, "Runs this replica ended, by job and outcome.");
    describe_histogram!(RUN_DURATION, Unit::Seconds, "How long a run took, by job.");
    describe_histogram!(
        TICK_LAG,
        Unit::Seconds,
        "From a tick's time to its run's start, by job."
    );
    describe_counter!(SKIPPED, "Ticks claimed but not run, by job and reason.");
    describe_counter!(
        ABANDONED,
        "Runs of dead replicas this replica closed as abandoned, by job."
    );
    describe_counter!(LEADER_CHANGES, "Times this replica became leader.");
    describe_gauge!(LEADER, "1 while this replica leads, else 0.");
}

pub(crate) fn run_started(job: &str, lag: Duration) {
    histogram!(TICK_LAG, "job" => job.to_owned()).record(lag.as_secs_f64());
}

pub(crate) fn run_ended(job: &str, outcome: &'static str, took: Duration) {
    counter!(RUNS, "job" => job.to_owned(), "outcome" => outcome).increment(1);
    histogram!(RUN_DURATION, "job" => job.to_owned()).record(took.as_secs_f64());
}

pub(crate) fn skipped(job: &str, reason: SkipReason) {
    counter!(SKIPPED, "job" => job.to_owned(), "reason" => reason.label()).increment(1);
}

pub(crate) fn abandoned(job: &str) {
    counter!(ABANDONED, "job" => job.to_owned()).increment(1);
}

pub(crate) fn leading(on: bool) {
    if on {
        counter!(LEADER_CHANGES).increment(1);
    }
    gauge!(LEADER).set(if on { 1.0 } else { 0.0 });
}
