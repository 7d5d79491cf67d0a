//! A run's transaction: the job's own writes and the run's history row commit together,
//! or not at all, guarded by the fencing token of the run's lock on its job.
//!
//! Two runs of one job can both believe they hold it for a moment: one paused (a GC
//! pause, a `SIGSTOP`, a VM migration) past its run lock's TTL wakes up still running
//! a tick while another replica took the lock and ran the next ones.
//! [`JobContext::transaction`](crate::JobContext::transaction) opens a transaction on
//! the history database; write the job's effects through it (it dereferences to a sqlx
//! connection), then [`RunTransaction::commit`]. The commit checks, in the same
//! transaction:
//!
//! - the job's **fence**: the highest run token that committed for the job. Each run
//!   takes its job's run lock with a fencing token, higher for every later run of the
//!   job ([`RunTransaction::fencing_token`]); a lower token is refused with
//!   [`TransactionError::StaleRun`]. A change of leader does not touch it: a run that
//!   goes on while the leadership changes hands (a term's end, a step-down), or that
//!   takes a tick the old leader handed over, still holds its run lock and commits;
//! - the run's **row**: it must still be this run's `running` row (not closed as
//!   abandoned or cancelled by another replica), and is marked `succeeded` in the same
//!   commit. Otherwise [`TransactionError::RunEnded`];
//! - last, right before the commit, the run's own hold of its run lock (by its validity
//!   on this process's clock): a run that lost it is refused with
//!   [`TransactionError::RunEnded`] even before a later run committed.
//!
//! Refused, everything is rolled back, so a tick's effects happen at most once even when
//! two replicas believe they lead, and exactly once when its run succeeds: the effects
//! are committed if and only if the history says `succeeded`.
//!
//! A commit, once begun, is carried out to its answer even when the run is told to stop
//! meanwhile (leadership lost, timeout, shutdown): it runs as a task of its own, the run
//! waits for it (within the history's bounds) before it is dropped, and the handler gets
//! its answer. A commit that failed (its answer lost when the link failed or the
//! database did not answer in time, or an error that may come after the commit) is
//! settled by reading the run's row back, after any transaction still holding the
//! job's fence has ended: never by guessing. The run's end, written to the history
//! afterwards, never overwrites a `succeeded` row.
//!
//! ```no_run
//! use redlock_core::BoxError;
//! use redlock_scheduler::{Job, JobContext};
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
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::LockHandle;
use sqlx::{Any, AnyConnection, Transaction};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::history::HistoryError;
use crate::error::transaction::TransactionError;
use crate::history::{History, Refused, RunKey, RunWrites};
use crate::time::Clock;

/// Where the commits of a run's transactions stand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Commits {
    /// Commits begun and not answered yet.
    pub(crate) in_flight: u32,
    /// A commit went through: the run's effects and its `succeeded` row are in.
    pub(crate) committed: bool,
    /// A commit's outcome could not be learned: only the run's row says it.
    pub(crate) in_doubt: bool,
}

/// What a run's context knows of the history, for its transactions.
pub(crate) struct RunRecord {
    pub(crate) history: History,
    pub(crate) scheduler: String,
    pub(crate) started: DateTime<Utc>,
    pub(crate) clock: Arc<dyn Clock>,
    commits: watch::Sender<Commits>,
    /// The run's lock on its job: no commit once it is no longer held (a replica paused
    /// past its TTL, whose job may run elsewhere since).
    run_lock: std::sync::OnceLock<LockHandle>,
}

impl fmt::Debug for RunRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunRecord")
            .field("history", &self.history)
            .field("scheduler", &self.scheduler)
            .field("commits", &*self.commits.borrow())
            .finish_non_exhaustive()
    }
}

/// How a commit of a run ended, for [`Commits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    Committed,
    NotCommitted,
    InDoubt,
}

impl RunRecord {
    pub(crate) fn new(
        history: History,
        scheduler: String,
        started: DateTime<Utc>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            history,
            scheduler,
            started,
            clock,
            commits: watch::Sender::new(Commits::default()),
            run_lock: std::sync::OnceLock::new(),
        }
    }

    /// The run holds `run_lock` (a view of it): its transactions commit only while it
    /// is held.
    pub(crate) fn held_by(&self, run_lock: LockHandle) {
        let _ = self.run_lock.set(run_lock);
    }

    /// The fencing token of the run's lock on its job, which fences its transactions.
    fn run_token(&self) -> Option<u64> {
        self.run_lock.get().and_then(LockHandle::fencing_token)
    }

    /// Whether the run still holds its job's run lock (by its validity on this
    /// process's monotonic clock, which goes on while the process is stopped).
    fn run_lock_held(&self) -> bool {
        self.run_lock.get().is_none_or(LockHandle::is_held)
    }

    /// Where the run's commits stand now.
    pub(crate) fn commits(&self) -> Commits {
        *self.commits.borrow()
    }

    /// Where the run's commits stand once none is in flight, waiting at most `within`
    /// for those that are (a commit always ends within [`Self::commit_bound`]).
    pub(crate) async fn settled(&self, within: Duration) -> Commits {
        let mut commits = self.commits.subscribe();
        let _ = tokio::time::timeout(within, commits.wait_for(|c| c.in_flight == 0)).await;
        self.commits()
    }

    /// The longest a commit can take, its read-back included.
    pub(crate) fn commit_bound(&self) -> Duration {
        self.history.fences().commit_bound()
    }

    fn begin_commit(&self) {
        self.commits.send_modify(|c| c.in_flight += 1);
    }

    fn end_commit(&self, settled: Settled) {
        self.commits.send_modify(|c| {
            c.in_flight = c.in_flight.saturating_sub(1);
            match settled {
                Settled::Committed => c.committed = true,
                Settled::InDoubt => c.in_doubt = true,
                Settled::NotCommitted => {}
            }
        });
    }
}

/// Ends a commit's count when dropped, as not committed unless told otherwise (a commit
/// task that ends without an answer, dropped with its runtime, committed nothing known).
struct InFlight {
    record: Arc<RunRecord>,
    settled: Settled,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.record.end_commit(self.settled);
    }
}

/// The run a transaction is for: what [`JobContext`](crate::JobContext) knows of it.
#[derive(Debug, Clone)]
pub(crate) struct RunScope {
    pub(crate) job: Arc<str>,
    pub(crate) tick: DateTime<Utc>,
    pub(crate) fencing_token: u64,
    pub(crate) instance: Arc<str>,
    pub(crate) manual: bool,
    pub(crate) cancel: CancellationToken,
    pub(crate) record: Arc<RunRecord>,
}

impl RunScope {
    /// Whether a transaction may open for the run: not told to stop, holding its run
    /// lock, with a token.
    fn open(&self) -> Result<(), TransactionError> {
        if self.cancel.is_cancelled() || !self.record.run_lock_held() {
            return Err(self.ended(STOPPED));
        }
        if self.record.run_token().is_none() {
            return Err(self.ended(NO_RUN_TOKEN));
        }
        Ok(())
    }

    /// The token the run's commits are checked against.
    fn run_token(&self) -> u64 {
        self.record.run_token().unwrap_or_default()
    }

    fn unknown(&self, cause: String) -> TransactionError {
        TransactionError::CommitUnknown {
            job: self.job.to_string(),
            tick: self.tick.to_rfc3339(),
            cause,
        }
    }

    fn ended(&self, reason: &str) -> TransactionError {
        TransactionError::RunEnded {
            job: self.job.to_string(),
            tick: self.tick.to_rfc3339(),
            reason: reason.to_owned(),
        }
    }
}

/// A transaction on the history database whose commit also records the run as
/// succeeded, and which a stale leader cannot commit. From
/// [`JobContext::transaction`](crate::JobContext::transaction); see [the module](self)
/// for the guarantees.
///
/// It dereferences to the connection: pass `&mut *tx` to sqlx queries. Dropped
/// without [`commit`](Self::commit), it rolls back.
pub struct RunTransaction {
    tx: Transaction<'static, Any>,
    run: RunScope,
}

impl fmt::Debug for RunTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunTransaction")
            .field("job", &self.run.job)
            .field("tick", &self.run.tick)
            .field("fencing_token", &self.run.fencing_token)
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

const STOPPED: &str = "the run was told to stop (leadership or its run lock lost, timeout, shutdown, or an operator's cancel)";
const NO_RUN_TOKEN: &str = "it holds no run lock with a fencing token";

impl RunTransaction {
    /// Opens a transaction for `run` (see
    /// [`JobContext::transaction`](crate::JobContext::transaction)).
    pub(crate) async fn begin(run: RunScope) -> Result<Self, TransactionError> {
        run.open()?;
        match run.record.history.fences().begin_run().await? {
            RunWrites::Sql(tx) => Ok(Self { tx, run }),
            writes @ RunWrites::Memory(_) => {
                let _ = run.record.history.fences().rollback_run(writes).await;
                Err(TransactionError::History(HistoryError::NoDatabase {
                    operation: "a run's transaction on the database",
                }))
            }
        }
    }

    /// The token the commit is checked against: the fencing token of the run's lock on
    /// its job, higher for each run of the job (not
    /// [`JobContext::fencing_token`](crate::JobContext::fencing_token), the leadership's).
    pub fn fencing_token(&self) -> u64 {
        self.run.run_token()
    }

    /// Commits the job's writes together with the run's `succeeded` row, if no later run
    /// of the job committed (the fence), its row is still its own and it still holds its
    /// run lock; otherwise rolls everything back.
    ///
    /// Once committed, the run is recorded as succeeded whatever the handler does next
    /// (an error it returns afterwards is kept as a note). The commit is carried out by a
    /// task of its own: a run told to stop meanwhile waits for its answer (within
    /// [`HistoryBuilder::statement_timeout`](crate::history::HistoryBuilder::statement_timeout)
    /// per statement) before it is dropped, and this returns it.
    ///
    /// # Errors
    ///
    /// [`TransactionError::StaleRun`]: a later run of the job took its run lock and
    /// committed (this replica was paused or cut off past the lock's TTL);
    /// [`TransactionError::RunEnded`]: the run was told to stop, lost its run lock, or
    /// its row was closed by another replica;
    /// [`TransactionError::History`]: the database failed and nothing was committed
    /// (when the commit itself failed, the run's row was read back to tell);
    /// [`TransactionError::CommitUnknown`]: the commit failed and the row could not be
    /// read back either (the history records the run as the row says, once the
    /// database answers).
    pub async fn commit(self) -> Result<(), TransactionError> {
        let Self { tx, run } = self;
        commit(RunWrites::Sql(tx), run).await
    }

    /// Rolls the transaction back (as dropping it does, but waiting for it).
    ///
    /// # Errors
    ///
    /// [`TransactionError::History`].
    pub async fn rollback(self) -> Result<(), TransactionError> {
        let Self { tx, run } = self;
        Ok(run
            .record
            .history
            .fences()
            .rollback_run(RunWrites::Sql(tx))
            .await?)
    }
}

/// A run's transaction on a memory history (a simulation's, feature `sim`): the job
/// describes each write as a string, and the commit keeps them with the run's
/// `succeeded` row, or not at all, checked as [`RunTransaction::commit`] checks (the
/// same code: fence, row, run lock, an outcome in doubt read back).
/// [`History::memory_effects`](crate::History::memory_effects) lists what committed.
#[cfg(feature = "sim")]
pub struct MemoryTransaction {
    writes: Vec<String>,
    run: RunScope,
}

#[cfg(feature = "sim")]
impl fmt::Debug for MemoryTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTransaction")
            .field("job", &self.run.job)
            .field("tick", &self.run.tick)
            .field("writes", &self.writes)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "sim")]
impl MemoryTransaction {
    /// Opens a memory transaction for `run` (see
    /// [`JobContext::memory_transaction`](crate::JobContext::memory_transaction)).
    pub(crate) async fn begin(run: RunScope) -> Result<Self, TransactionError> {
        run.open()?;
        match run.record.history.fences().begin_run().await? {
            RunWrites::Memory(writes) => Ok(Self { writes, run }),
            writes @ RunWrites::Sql(_) => {
                let _ = run.record.history.fences().rollback_run(writes).await;
                let misused = crate::error::BuildError::InvalidOption {
                    what: "run transaction".to_owned(),
                    reason: "a memory transaction needs a history kept in memory \
                             (History::memory()); on a database, use JobContext::transaction"
                        .to_owned(),
                };
                Err(TransactionError::History(HistoryError::Config(misused)))
            }
        }
    }

    /// Records a write of the job, kept if the transaction commits.
    pub fn write(&mut self, what: impl Into<String>) {
        self.writes.push(what.into());
    }

    /// The token the commit is checked against: the fencing token of the run's lock on
    /// its job, higher for each run of the job (not
    /// [`JobContext::fencing_token`](crate::JobContext::fencing_token), the leadership's).
    pub fn fencing_token(&self) -> u64 {
        self.run.run_token()
    }

    /// As [`RunTransaction::commit`].
    ///
    /// # Errors
    ///
    /// As [`RunTransaction::commit`].
    pub async fn commit(self) -> Result<(), TransactionError> {
        let Self { writes, run } = self;
        commit(RunWrites::Memory(writes), run).await
    }
}

/// Commits `writes` for `run` in a task of its own and returns its answer (see
/// [`RunTransaction::commit`]).
async fn commit(writes: RunWrites, run: RunScope) -> Result<(), TransactionError> {
    if run.cancel.is_cancelled() {
        drop(writes);
        return Err(run.ended(STOPPED));
    }
    run.record.begin_commit();
    let in_flight = InFlight {
        record: Arc::clone(&run.record),
        settled: Settled::InDoubt,
    };
    let task = tokio::spawn(
        commit_to_the_end(writes, run.clone(), in_flight).instrument(tracing::Span::current()),
    );
    match task.await {
        Ok(answer) => answer,
        Err(err) => Err(run.unknown(format!("the commit's task ended without an answer ({err})"))),
    }
}

/// Commits a run's transaction and settles its outcome in `in_flight`: committed, not,
/// or in doubt when the commit failed and the run's row could not be read back.
async fn commit_to_the_end(
    writes: RunWrites,
    ctx: RunScope,
    mut in_flight: InFlight,
) -> Result<(), TransactionError> {
    let record = Arc::clone(&in_flight.record);
    let Some(fence) = record.run_token() else {
        in_flight.settled = Settled::NotCommitted;
        return Err(ctx.ended(NO_RUN_TOKEN));
    };
    let run = RunKey {
        scheduler: &record.scheduler,
        job: &ctx.job,
        tick: ctx.tick,
        instance: &ctx.instance,
        token: ctx.fencing_token,
        fence,
        manual: ctx.manual,
        started: record.started,
    };
    let held = || record.run_lock_held();
    let committed = record
        .history
        .fences()
        .commit_run(writes, run, record.clock.now(), held)
        .await;
    let (settled, answer) = match committed {
        Ok(()) => (Settled::Committed, Ok(())),
        Err(Refused::Stale { highest }) => {
            tracing::warn!(job = &*ctx.job, tick = %ctx.tick, token = fence, highest, "a later run of the job committed: the run's transaction was rolled back");
            let stale = TransactionError::StaleRun {
                job: ctx.job.to_string(),
                tick: ctx.tick.to_rfc3339(),
                token: fence,
                highest,
            };
            (Settled::NotCommitted, Err(stale))
        }
        Err(Refused::RowClosed) => (
            Settled::NotCommitted,
            Err(ctx.ended(
                "its history row was closed (abandoned or cancelled) or claimed by another replica",
            )),
        ),
        Err(Refused::LockLost) => (
            Settled::NotCommitted,
            Err(ctx.ended(
                "its job's run lock was lost (this replica was stopped or cut off past its TTL): another run of the job may have started",
            )),
        ),
        Err(Refused::Failed(err)) => (Settled::NotCommitted, Err(err.into())),
        Err(Refused::InDoubt(err)) => match record.history.fences().commit_outcome(run).await {
            Ok(true) => {
                tracing::warn!(job = &*ctx.job, tick = %ctx.tick, error = %err, "the commit failed, yet the run's row, read back, says it committed");
                (Settled::Committed, Ok(()))
            }
            Ok(false) => {
                tracing::warn!(job = &*ctx.job, tick = %ctx.tick, error = %err, "the commit failed; the run's row, read back, says it did not commit");
                (Settled::NotCommitted, Err(err.into()))
            }
            Err(read) => {
                tracing::error!(job = &*ctx.job, tick = %ctx.tick, error = %err, read_back = %read, "the commit failed and the run's row cannot be read back: whether it committed is not known yet");
                (
                    Settled::InDoubt,
                    Err(ctx.unknown(format!("{err}; reading the run's row back: {read}"))),
                )
            }
        },
    };
    in_flight.settled = settled;
    drop(in_flight);
    answer
}
