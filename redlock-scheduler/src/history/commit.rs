//! A run's own transaction: the job's writes and the run's row commit together, fenced
//! by the token of the run's lock on its job.

use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_fence::FenceError;
use sqlx::{Any, Transaction};

use super::HistoryError as Error;
use super::memory::CommitRefused;
use super::schema::fence;
use super::{Shared, ms, token};

/// A run's writes until its commit.
#[derive(Debug)]
pub(crate) enum RunWrites {
    /// A transaction on the history's database, holding the job's writes.
    Sql(Transaction<'static, Any>),
    /// A memory history: the job's writes, as it described them.
    Memory(Vec<String>),
}

/// The run a transaction commits for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunKey<'a> {
    pub(crate) scheduler: &'a str,
    pub(crate) job: &'a str,
    pub(crate) tick: DateTime<Utc>,
    pub(crate) instance: &'a str,
    /// The leadership's token, which the run's row carries.
    pub(crate) token: u64,
    /// The run lock's token, checked against the job's fence.
    pub(crate) fence: u64,
    pub(crate) manual: bool,
    pub(crate) started: DateTime<Utc>,
}

/// Why a run's transaction was not committed (it was rolled back).
#[derive(Debug)]
pub(crate) enum Refused {
    /// A later run of the job committed (a higher run token was seen).
    Stale { highest: u64 },
    /// The run's row is not this run's `running` row any more: closed (abandoned,
    /// cancelled) by another replica, or claimed by one.
    RowClosed,
    /// The run no longer holds its job's run lock (checked last, before the commit).
    LockLost,
    /// The database failed before the commit was sent.
    Failed(Error),
    /// The commit was sent and failed (its answer lost, or an error): it may have
    /// committed all the same.
    InDoubt(Error),
}

/// Attempts at reading back the outcome of a commit that failed, and the pause
/// before the first retry (doubled each time).
const READ_BACK_ATTEMPTS: u32 = 3;
const READ_BACK_PAUSE: Duration = Duration::from_millis(200);

impl From<Error> for Refused {
    fn from(err: Error) -> Self {
        Self::Failed(err)
    }
}

impl From<sqlx::Error> for Refused {
    fn from(err: sqlx::Error) -> Self {
        Self::Failed(Error::database(err))
    }
}

/// The fence's resource for `job` of `scheduler` (see [`crate::keys::fence`]).
pub(crate) fn fence_resource(scheduler: &str, job: &str) -> String {
    crate::keys::fence(scheduler, job)
}

/// The fences table, and the runs' own transactions checked against it.
#[derive(Clone, Copy)]
pub(crate) struct Fences<'a> {
    pub(super) shared: &'a Shared,
}

impl Fences<'_> {
    /// Opens a run's writes: a transaction on the database, or on a memory history a
    /// list of the job's writes.
    pub(crate) async fn begin_run(self) -> Result<RunWrites, Error> {
        const BEGIN: &str = "begin a run's transaction";
        if let Some(answer) = self
            .shared
            .in_memory(BEGIN, |_| RunWrites::Memory(Vec::new()))
            .await
        {
            return answer;
        }
        let tx = self.shared.bounded(BEGIN, self.shared.pool.begin()).await?;
        Ok(RunWrites::Sql(tx))
    }

    /// Commits a run's writes if its run token is still the highest seen for the job, its
    /// row is still its own `running` row and the run still holds its job's run lock
    /// (`held`, asked last, right before the commit): checks the fence (raising it to
    /// the token), marks the row succeeded (inserting it if its insert still waits in
    /// the writer's queue), and commits, all or nothing. Refused, it is rolled back.
    pub(crate) async fn commit_run(
        self,
        writes: RunWrites,
        run: RunKey<'_>,
        at: DateTime<Utc>,
        held: impl Fn() -> bool,
    ) -> Result<(), Refused> {
        match writes {
            RunWrites::Sql(tx) => self.commit_sql(tx, run, at, held).await,
            RunWrites::Memory(effects) => self.commit_memory(&effects, run, at, held).await,
        }
    }

    async fn commit_sql(
        self,
        mut tx: Transaction<'static, Any>,
        run: RunKey<'_>,
        at: DateTime<Utc>,
        held: impl Fn() -> bool,
    ) -> Result<(), Refused> {
        let outcome = match self.commit_steps(&mut tx, run, at).await {
            Ok(()) if !held() => Err(Refused::LockLost),
            outcome => outcome,
        };
        match outcome {
            // Whatever failed, the commit may have gone through: even an error the
            // database sends can come after the commit (a session terminated while it
            // waits for a synchronous standby has committed locally).
            Ok(()) => self
                .shared
                .bounded("commit a run's transaction", tx.commit())
                .await
                .map_err(Refused::InDoubt),
            Err(refused) => {
                // Dropping the transaction rolls it back too; this says so at once.
                let _ = self.rollback_run(RunWrites::Sql(tx)).await;
                Err(refused)
            }
        }
    }

    /// The memory history's commit: one statement, whose failure leaves it in doubt
    /// (a fault may come after it took effect).
    async fn commit_memory(
        self,
        effects: &[String],
        run: RunKey<'_>,
        at: DateTime<Utc>,
        held: impl Fn() -> bool,
    ) -> Result<(), Refused> {
        const COMMIT: &str = "commit a run's transaction";
        let committed = self
            .shared
            .in_memory(COMMIT, |tables| tables.commit_run(run, at, held, effects))
            .await
            .ok_or(Refused::Failed(Error::NoDatabase { operation: COMMIT }))?
            .map_err(Refused::InDoubt)?;
        committed.map_err(|refused| match refused {
            CommitRefused::Stale { highest } => Refused::Stale { highest },
            CommitRefused::RowClosed => Refused::RowClosed,
            CommitRefused::LockLost => Refused::LockLost,
            CommitRefused::OutOfRange => {
                Refused::Failed(Error::Fence(FenceError::TokenOutOfRange {
                    token: run.fence,
                }))
            }
        })
    }

    /// Whether a run's transaction committed, for a commit that failed: reads the run's
    /// row back once no transaction holds the job's fence any more (a run's transaction
    /// takes it first and keeps it to its end), so that a commit still under way is
    /// waited for, not taken for one that failed. Retried a few times, each within the
    /// statement timeout.
    pub(crate) async fn commit_outcome(self, run: RunKey<'_>) -> Result<bool, Error> {
        let mut pause = READ_BACK_PAUSE;
        let mut attempt = 1;
        loop {
            match self.read_back(run).await {
                Ok(committed) => return Ok(committed),
                Err(err) if attempt >= READ_BACK_ATTEMPTS => return Err(err),
                Err(err) => {
                    tracing::debug!(job = run.job, tick = %run.tick, error = %err, "reading a run's row back failed; retrying");
                }
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
            attempt += 1;
        }
    }

    async fn read_back(self, run: RunKey<'_>) -> Result<bool, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read a run's row back", |tables| tables.committed(run))
            .await
        {
            return answer;
        }
        let fence = fence(&self.shared.tables.fences);
        let resource = fence_resource(run.scheduler, run.job);
        let sql = format!(
            "SELECT instance, fencing_token, outcome FROM {}
             WHERE scheduler = $1 AND job = $2 AND tick_ms = $3",
            self.shared.tables.runs
        );
        let pool = &self.shared.pool;
        let read = self
            .shared
            .bounded("read a run's row back", async {
                let mut tx = pool.begin().await?;
                // Token 0 raises nothing: the statement only waits for the fence's row
                // (or its insert) to be free, and is rolled back below.
                match fence.check(&mut *tx, &resource, 0).await {
                    Ok(()) | Err(FenceError::Stale { .. }) => {}
                    Err(FenceError::Database(err)) => return Err(err),
                    Err(other) => return Ok(Err(other)),
                }
                let row: Option<(String, Option<i64>, String)> = sqlx::query_as(&sql)
                    .bind(run.scheduler)
                    .bind(run.job)
                    .bind(ms(run.tick))
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.rollback().await?;
                Ok(Ok(row))
            })
            .await?;
        let row = read.map_err(Error::Fence)?;
        Ok(row.is_some_and(|(instance, fencing_token, outcome)| {
            instance == run.instance
                && fencing_token == Some(token(run.token))
                && outcome == super::Outcome::Succeeded.as_str()
        }))
    }

    /// The longest a run's commit can take: its three statements and the read-back of
    /// an outcome in doubt, each within the statement timeout, and the pauses between.
    pub(crate) fn commit_bound(self) -> Duration {
        let statements = 3 + READ_BACK_ATTEMPTS;
        let pauses = READ_BACK_PAUSE.saturating_mul((1 << (READ_BACK_ATTEMPTS - 1)) - 1);
        self.shared
            .statement_timeout
            .saturating_mul(statements)
            .saturating_add(pauses)
    }

    /// Rolls a run's writes back, within the statement timeout (a memory history's
    /// are dropped).
    pub(crate) async fn rollback_run(self, writes: RunWrites) -> Result<(), Error> {
        match writes {
            RunWrites::Sql(tx) => {
                self.shared
                    .bounded("roll back a run's transaction", tx.rollback())
                    .await
            }
            RunWrites::Memory(_) => Ok(()),
        }
    }

    async fn commit_steps(
        self,
        tx: &mut Transaction<'static, Any>,
        run: RunKey<'_>,
        at: DateTime<Utc>,
    ) -> Result<(), Refused> {
        let fence = fence(&self.shared.tables.fences);
        let resource = fence_resource(run.scheduler, run.job);
        let checked = self
            .shared
            .bounded("check the run's fence", async {
                Ok::<_, sqlx::Error>(fence.check(&mut **tx, &resource, run.fence).await)
            })
            .await?;
        match checked {
            Ok(()) => {}
            Err(FenceError::Stale { highest, .. }) => return Err(Refused::Stale { highest }),
            Err(FenceError::Database(err)) => return Err(err.into()),
            Err(other) => return Err(Refused::Failed(Error::Fence(other))),
        }
        let runs = &self.shared.tables.runs;
        let bare = runs.rsplit('.').next().unwrap_or(runs);
        let sql = format!(
            "INSERT INTO {runs} (scheduler, job, tick_ms, instance, fencing_token, started_ms,
                                 finished_ms, outcome, error, manual, closed_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'succeeded', NULL, $8, NULL)
             ON CONFLICT (scheduler, job, tick_ms) DO UPDATE
             SET outcome = 'succeeded', finished_ms = excluded.finished_ms, error = NULL
             WHERE {bare}.instance = excluded.instance AND {bare}.outcome = 'running'"
        );
        let done = self
            .shared
            .bounded(
                "record the run in its transaction",
                sqlx::query(&sql)
                    .bind(run.scheduler)
                    .bind(run.job)
                    .bind(ms(run.tick))
                    .bind(run.instance)
                    .bind(token(run.token))
                    .bind(ms(run.started))
                    .bind(ms(at))
                    .bind(i32::from(run.manual))
                    .execute(&mut **tx),
            )
            .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(Refused::RowClosed)
        }
    }
}
