//! A run's transaction: the job's own writes and the run's history row commit together,
//! or not at all, guarded by the leadership's fencing token.
//!
//! Two replicas can both believe they lead for a moment: one paused (a GC pause, a
//! `SIGSTOP`, a VM migration) past its term wakes up still running a tick while a newer
//! leader runs the next ones. [`JobContext::transaction`] opens a transaction on the
//! history database; write the job's effects through it (it dereferences to a sqlx
//! connection), then [`RunTransaction::commit`]. The commit checks, in the same
//! transaction:
//!
//! - the job's **fence**: the highest leadership token that committed for the job (or
//!   took over: a new leader raises the fences of all jobs when it is elected). A lower
//!   token is refused with [`Error::StaleRun`];
//! - the run's **row**: it must still be this run's `running` row (not closed as
//!   abandoned or cancelled by another replica), and is marked `succeeded` in the same
//!   commit. Otherwise [`Error::RunEnded`].
//!
//! Refused, everything is rolled back, so a tick's effects happen at most once even when
//! two replicas believe they lead, and exactly once when its run succeeds: the effects
//! are committed if and only if the history says `succeeded`.
//!
//! ```no_run
//! use redlock_scheduler::{BoxError, Job, JobContext};
//!
//! let job = Job::new("settle", "0 * * * * *", |ctx: JobContext| async move {
//!     let mut tx = ctx.transaction().await?;
//!     sqlx::query("UPDATE ledger SET settled = 1 WHERE settled = 0 AND due_ms <= $1")
//!         .bind(ctx.tick().timestamp_millis())
//!         .execute(&mut *tx)
//!         .await?;
//!     tx.commit().await?; // with the run's `succeeded` row, or not at all
//!     Ok::<_, BoxError>(())
//! });
//! ```
//!
//! The check is made at commit, so the fence row is locked (PostgreSQL) only from the
//! check to the commit, two statements in a row; keep other work out of that window.
//! On SQLite the whole database has one writer: a run's transaction that has written
//! holds every other writer off (the history included) until it ends, so keep them
//! short there.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};
use sqlx::{Any, AnyConnection, Transaction};

use crate::clock::Clock;
use crate::error::Error;
use crate::job::JobContext;
use crate::store::{History, Refused, RunKey};

/// What a run's context knows of the history, for its transactions.
pub(crate) struct RunRecord {
    pub(crate) history: History,
    pub(crate) scheduler: String,
    pub(crate) started: DateTime<Utc>,
    pub(crate) clock: Arc<dyn Clock>,
    /// A transaction of the run committed: its effects, and its `succeeded` row.
    pub(crate) committed: AtomicBool,
}

impl fmt::Debug for RunRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunRecord")
            .field("history", &self.history)
            .field("scheduler", &self.scheduler)
            .field("committed", &self.committed)
            .finish_non_exhaustive()
    }
}

impl RunRecord {
    pub(crate) fn committed(&self) -> bool {
        self.committed.load(Ordering::Acquire)
    }
}

/// A transaction on the history database whose commit also records the run as
/// succeeded, and which a stale leader cannot commit. From
/// [`JobContext::transaction`]; see [the module](self) for the guarantees.
///
/// It dereferences to the connection: pass `&mut *tx` to sqlx queries. Dropped
/// without [`commit`](Self::commit), it rolls back.
pub struct RunTransaction {
    tx: Transaction<'static, Any>,
    ctx: JobContext,
}

impl fmt::Debug for RunTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunTransaction")
            .field("job", &self.ctx.job())
            .field("tick", &self.ctx.tick())
            .field("fencing_token", &self.ctx.fencing_token())
            .finish_non_exhaustive()
    }
}

impl Deref for RunTransaction {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        &self.tx
    }
}

impl DerefMut for RunTransaction {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.tx
    }
}

impl JobContext {
    fn record(&self) -> Result<&RunRecord, Error> {
        self.record.as_deref().ok_or(Error::NoHistory)
    }

    fn ended(&self, reason: &str) -> Error {
        Error::RunEnded {
            job: self.job().to_owned(),
            tick: self.tick().to_rfc3339(),
            reason: reason.to_owned(),
        }
    }

    /// Opens a transaction on the history database in which the job's writes commit
    /// together with the run's `succeeded` row, guarded by the leadership's fencing
    /// token ([`RunTransaction::commit`]). See [`RunTransaction`].
    ///
    /// # Errors
    ///
    /// [`Error::NoHistory`] without a history; [`Error::RunEnded`] when the run was
    /// already told to stop; [`Error::Store`] or [`Error::StoreTimeout`].
    pub async fn transaction(&self) -> Result<RunTransaction, Error> {
        let record = self.record()?;
        if self.cancel.is_cancelled() {
            return Err(self.ended(STOPPED));
        }
        let tx = record.history.begin_run().await?;
        Ok(RunTransaction {
            tx,
            ctx: self.clone(),
        })
    }
}

const STOPPED: &str = "the run was told to stop (leadership or its run lock lost, timeout, shutdown, or an operator's cancel)";

impl RunTransaction {
    /// The leadership's fencing token the commit is checked against.
    pub fn fencing_token(&self) -> u64 {
        self.ctx.fencing_token()
    }

    /// Commits the job's writes together with the run's `succeeded` row, if this run's
    /// leadership is still the latest for the job and its row is still its own;
    /// otherwise rolls everything back.
    ///
    /// Once committed, the run is recorded as succeeded whatever the handler does next
    /// (an error it returns afterwards is kept as a note).
    ///
    /// # Errors
    ///
    /// [`Error::StaleRun`]: a later leadership took over (this replica was paused or
    /// cut off past its term); [`Error::RunEnded`]: the run was told to stop, or its
    /// row was closed by another replica; [`Error::Store`] or [`Error::StoreTimeout`]
    /// (the outcome of a commit that timed out is unknown: the history's row says it).
    pub async fn commit(self) -> Result<(), Error> {
        let Self { tx, ctx } = self;
        let record = ctx.record()?;
        if ctx.cancel.is_cancelled() {
            drop(tx);
            return Err(ctx.ended(STOPPED));
        }
        let run = RunKey {
            scheduler: &record.scheduler,
            job: ctx.job(),
            tick: ctx.tick(),
            instance: ctx.instance(),
            token: ctx.fencing_token(),
            manual: ctx.is_manual(),
            started: record.started,
        };
        match record.history.commit_run(tx, run, record.clock.now()).await {
            Ok(()) => {
                record.committed.store(true, Ordering::Release);
                Ok(())
            }
            Err(Refused::Stale { highest }) => {
                tracing::warn!(job = ctx.job(), tick = %ctx.tick(), token = ctx.fencing_token(), highest, "a later leadership took over: the run's transaction was rolled back");
                Err(Error::StaleRun {
                    job: ctx.job().to_owned(),
                    tick: ctx.tick().to_rfc3339(),
                    token: ctx.fencing_token(),
                    highest,
                })
            }
            Err(Refused::RowClosed) => Err(ctx.ended(
                "its history row was closed (abandoned or cancelled) or claimed by another replica",
            )),
            Err(Refused::Failed(err)) => Err(err),
        }
    }

    /// Rolls the transaction back (as dropping it does, but waiting for it).
    ///
    /// # Errors
    ///
    /// [`Error::Store`] or [`Error::StoreTimeout`].
    pub async fn rollback(self) -> Result<(), Error> {
        let Self { tx, ctx } = self;
        ctx.record()?.history.rollback_run(tx).await
    }
}
