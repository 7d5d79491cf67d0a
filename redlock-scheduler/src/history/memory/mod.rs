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
//! as a leader's record without a lease, are not). They hold every table, a run's
//! commit against its job's fence included, the jobs' own writes kept as a list.
//!
//! A [`History`](super::History) built by `History::memory()` (feature `sim`) answers
//! from them ([`Store`]), each statement slowed down or failed as the simulation's
//! [`MemoryFaults`] decide.

// Without the feature nothing builds a memory history: the tables are there for the
// differential test and for builds with it.
#![cfg_attr(not(any(test, feature = "sim")), allow(dead_code, unreachable_pub))]

mod changes;
mod control;
mod dispatch;
mod fences;
mod jobs;
mod requests;
mod runs;
mod store;

#[cfg(test)]
mod tests;

use chrono::{DateTime, Utc};

pub(super) use self::changes::ChangeLog;
pub(super) use self::control::{Leaders, Pauses};
pub(super) use self::dispatch::{Handoffs, Replicas};
pub(super) use self::fences::{FenceCheck, FenceRows};
pub(super) use self::jobs::PublishedJobs;
pub(super) use self::requests::OperatorRequests;
pub(super) use self::runs::RunRows;
#[cfg(feature = "sim")]
pub use self::store::{MemoryFaults, StatementFault};
pub(super) use self::store::{Store, failed};
use super::commit::fence_resource;
use super::{Handoff, NewRun, Outcome, RunKey, ms, token};

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
    pub(super) fences: FenceRows,
    /// The jobs' own writes, as each committed run left them (the SQL store's are the
    /// jobs' tables): (scheduler, job, tick ms, what).
    pub(super) effects: Vec<(String, String, i64, String)>,
}

/// Why a run's transaction was not committed (nothing of it is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CommitRefused {
    /// A later run's token was seen.
    Stale { highest: u64 },
    /// The run's row is not this run's `running` row any more.
    RowClosed,
    /// The run no longer holds its job's run lock.
    LockLost,
    /// A token the fences table cannot hold.
    OutOfRange,
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

    /// [`Fences::commit_run`](super::Fences::commit_run) of a run that wrote `effects`:
    /// checks the job's fence (raising it to the run's token), marks the run's row
    /// succeeded where it is still its own `running` row (inserting it if missing), and
    /// asks `held` last; all of it and the effects are kept, or none.
    pub(super) fn commit_run(
        &mut self,
        run: RunKey<'_>,
        at: chrono::DateTime<chrono::Utc>,
        held: impl Fn() -> bool,
        effects: &[String],
    ) -> Result<(), CommitRefused> {
        let mut fences = self.fences.clone();
        match fences.check(&fence_resource(run.scheduler, run.job), run.fence) {
            FenceCheck::Admitted => {}
            FenceCheck::Stale { highest } => return Err(CommitRefused::Stale { highest }),
            FenceCheck::OutOfRange => return Err(CommitRefused::OutOfRange),
        }
        if !self.runs.succeed(run, at, true) {
            return Err(CommitRefused::RowClosed);
        }
        if !held() {
            return Err(CommitRefused::LockLost);
        }
        self.runs.succeed(run, at, false);
        self.fences = fences;
        let tick = ms(run.tick);
        self.effects.extend(effects.iter().map(|what| {
            (
                run.scheduler.to_owned(),
                run.job.to_owned(),
                tick,
                what.clone(),
            )
        }));
        Ok(())
    }

    /// [`Fences::commit_outcome`](super::Fences::commit_outcome): whether the run's row
    /// says its transaction committed.
    pub(super) fn committed(&self, run: RunKey<'_>) -> bool {
        self.runs
            .run_at(run.scheduler, run.job, run.tick)
            .is_some_and(|row| {
                row.instance == run.instance
                    && row.fencing_token == u64::try_from(token(run.token)).ok()
                    && row.outcome == Outcome::Succeeded
            })
    }
}
