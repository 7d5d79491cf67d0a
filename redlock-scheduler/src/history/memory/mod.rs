//! The history's tables in memory: the same rows, and the same answers to the same
//! statements, as the SQL store, without a database.
//!
//! The scheduler's deterministic simulation needs a history that answers on the
//! simulation's own thread: sqlx's SQLite driver answers from a thread of its own (so a
//! paused clock would run ahead while a statement runs), and a run's open transaction
//! would hold SQLite's one writer against the single runtime thread. These tables are
//! that store's rows, one owner per group of tables, each statement a method that does
//! what its SQL does (its compare-and-set conditions, its `ON CONFLICT`, its order and
//! limit, its integer conversions), checked against SQLite by a differential test
//! (`tests.rs`: seeded sequences of statements through both, every answer and every row
//! compared). Only rows this version writes are modelled (an earlier version's, such
//! as a leader's record without a lease, are not). They hold the run rows, the replicas, the hand-offs, the leader's record, the
//! pauses, the operators' requests, the published job definitions and the job change log:
//! every table but the fences (and a run's own transaction).

mod changes;
mod control;
mod dispatch;
mod jobs;
mod requests;
mod runs;

#[cfg(test)]
mod tests;

use chrono::{DateTime, Utc};

pub(super) use self::changes::ChangeLog;
pub(super) use self::control::{Leaders, Pauses};
pub(super) use self::dispatch::{Handoffs, Replicas};
pub(super) use self::jobs::PublishedJobs;
pub(super) use self::requests::OperatorRequests;
pub(super) use self::runs::RunRows;
use super::{Handoff, NewRun, Outcome};

/// Every table, for the statements that span two.
#[derive(Debug, Default)]
pub(super) struct Tables {
    pub(super) runs: RunRows,
    pub(super) replicas: Replicas,
    pub(super) handoffs: Handoffs,
    pub(super) leaders: Leaders,
    pub(super) pauses: Pauses,
    pub(super) requests: OperatorRequests,
    pub(super) jobs: PublishedJobs,
    pub(super) changes: ChangeLog,
}

impl Tables {
    /// [`Dispatch::take_handoff`](super::Dispatch::take_handoff): deletes `handoff` where
    /// it still names its replica, unmoved and not declined, and inserts its tick's row
    /// unless the tick has one, as one transaction. `true` if both were done.
    pub(super) fn take_handoff(
        &mut self,
        scheduler: &str,
        handoff: &Handoff,
        outcome: Outcome,
        note: Option<&str>,
        at: DateTime<Utc>,
    ) -> bool {
        if !self.handoffs.take(scheduler, handoff) {
            return false;
        }
        let run = NewRun {
            scheduler,
            job: &handoff.job,
            tick: handoff.tick,
            instance: &handoff.replica,
            token: handoff.token,
            outcome,
            note,
            manual: false,
            at,
        };
        self.runs.claim(&run)
    }
}
