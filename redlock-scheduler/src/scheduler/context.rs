//! [`Context`]: what every part of the scheduler reads and none owns: the client, the
//! names, the clock, the history's writer, the job table, the count of runs here, and
//! the shutdown's tokens. Set when the scheduler is built; the parts hold it shared.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::Redlock;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::state::{JobState, JobTable, Slots};
use crate::error::RequestError;
use crate::record::Recorder;
use crate::time::Clock;

/// What a tick's claim is kept for beyond the misfire grace window (clock skew between
/// replicas).
pub(super) const CLAIM_MARGIN: Duration = Duration::from_secs(5);

/// The scheduler's shared, read-only context (the job table and the counters inside
/// it change, each behind its own lock).
pub(super) struct Context {
    pub(super) redlock: Redlock,
    pub(super) name: String,
    /// The longest resource name `redlock` takes: the job names' bound follows from it
    /// (see [`crate::keys`]).
    pub(super) max_resource_len: usize,
    pub(super) instance: Arc<str>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) recorder: Option<Arc<Recorder>>,
    pub(super) jobs: JobTable,
    /// The runs going here, against this replica's limit.
    pub(super) slots: Slots,
    /// Shutdown began: fire no more ticks.
    pub(super) stop_firing: CancellationToken,
    /// Shutdown's deadline passed: cancel the runs still going.
    pub(super) hard_stop: CancellationToken,
    /// The runs (and ticks being claimed and handed over).
    pub(super) runs: TaskTracker,
}

impl Context {
    /// The job named `name`, if it is in force here.
    pub(super) fn job(&self, name: &str) -> Result<(usize, Arc<JobState>), RequestError> {
        self.jobs
            .find(name)
            .filter(|(_, state)| !state.is_removed())
            .ok_or_else(|| RequestError::UnknownJob {
                name: name.to_owned(),
            })
    }

    pub(super) fn history(&self) -> Option<&crate::History> {
        self.recorder.as_deref().map(Recorder::history)
    }

    /// How old a missed tick may be: the job's grace, capped (without a history) by
    /// how long a claim can be kept, since the claims are then the only record.
    pub(super) fn grace(&self, state: &JobState) -> Duration {
        let grace = state.def().job.spec.grace();
        match self.recorder {
            Some(_) => grace,
            None => grace.min(self.redlock.max_ttl().saturating_sub(CLAIM_MARGIN)),
        }
    }

    /// The latest moment `tick` may still be acted on.
    pub(super) fn deadline(&self, state: &JobState, tick: DateTime<Utc>) -> DateTime<Utc> {
        crate::time::later(tick, self.grace(state))
    }

    /// Whether the leader may hand `state`'s runs to other replicas (it has a history
    /// to hand them over through, and the job does not opt out).
    pub(super) fn spreads(&self, state: &JobState) -> bool {
        self.recorder.is_some() && !state.def().job.spec.on_leader()
    }
}
