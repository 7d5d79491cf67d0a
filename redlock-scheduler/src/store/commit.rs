//! A run's own transaction: the job's writes and the run's row commit together, under
//! the leadership's fencing token.

use chrono::{DateTime, Utc};
use redlock_fence::FenceError;
use sqlx::{Any, Transaction};

use super::schema::fence;
use super::{History, ms, token};
use crate::error::Error;

/// The run a transaction commits for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunKey<'a> {
    pub(crate) scheduler: &'a str,
    pub(crate) job: &'a str,
    pub(crate) tick: DateTime<Utc>,
    pub(crate) instance: &'a str,
    pub(crate) token: u64,
    pub(crate) manual: bool,
    pub(crate) started: DateTime<Utc>,
}

/// Why a run's transaction was not committed (it was rolled back).
#[derive(Debug)]
pub(crate) enum Refused {
    /// A later leadership's token was seen: this replica no longer leads.
    Stale { highest: u64 },
    /// The run's row is not this run's `running` row any more: closed (abandoned,
    /// cancelled) by another replica, or claimed by one.
    RowClosed,
    /// The database failed.
    Failed(Error),
}

impl From<Error> for Refused {
    fn from(err: Error) -> Self {
        Self::Failed(err)
    }
}

impl From<sqlx::Error> for Refused {
    fn from(err: sqlx::Error) -> Self {
        Self::Failed(Error::Store(err))
    }
}

/// The fence's resource for `job` of `scheduler` (the scheduler's name is
/// length-prefixed: no two pairs of names give the same resource).
pub(crate) fn fence_resource(scheduler: &str, job: &str) -> String {
    format!("{}:{scheduler}/{job}", scheduler.len())
}

impl History {
    /// Opens a transaction for a run's writes.
    pub(crate) async fn begin_run(&self) -> Result<Transaction<'static, Any>, Error> {
        self.bounded("begin a run's transaction", self.shared.pool.begin())
            .await
    }

    /// Commits a run's transaction if its token is still the highest seen for the job
    /// and its row is still its own `running` row: checks the fence (raising it to the
    /// token), marks the row succeeded (inserting it if its insert still waits in the
    /// writer's queue), and commits, all or nothing. Refused, it is rolled back.
    pub(crate) async fn commit_run(
        &self,
        mut tx: Transaction<'static, Any>,
        run: RunKey<'_>,
        at: DateTime<Utc>,
    ) -> Result<(), Refused> {
        let outcome = self.commit_steps(&mut tx, run, at).await;
        match outcome {
            Ok(()) => {
                self.bounded("commit a run's transaction", tx.commit())
                    .await?;
                Ok(())
            }
            Err(refused) => {
                // Dropping the transaction rolls it back too; this says so at once.
                let _ = self.rollback_run(tx).await;
                Err(refused)
            }
        }
    }

    /// Rolls a run's transaction back, within the statement timeout.
    pub(crate) async fn rollback_run(&self, tx: Transaction<'static, Any>) -> Result<(), Error> {
        self.bounded("roll back a run's transaction", tx.rollback())
            .await
    }

    async fn commit_steps(
        &self,
        tx: &mut Transaction<'static, Any>,
        run: RunKey<'_>,
        at: DateTime<Utc>,
    ) -> Result<(), Refused> {
        let fence = fence(&self.shared.tables.fences);
        let resource = fence_resource(run.scheduler, run.job);
        let checked = self
            .bounded("check the run's fence", async {
                Ok::<_, sqlx::Error>(fence.check(&mut **tx, &resource, run.token).await)
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

    /// Raises the fences of `jobs` to a new leadership's `token`, so that a run of an
    /// earlier leadership (a replica paused past its term) can no longer commit. A fence
    /// already higher (a later leadership raised it) stays.
    pub(crate) async fn raise_fences(
        &self,
        scheduler: &str,
        jobs: impl Iterator<Item = &str>,
        token: u64,
    ) -> Result<(), Error> {
        let fence = fence(&self.shared.tables.fences);
        let resources: Vec<String> = jobs.map(|job| fence_resource(scheduler, job)).collect();
        let pool = &self.shared.pool;
        let raised = self
            .bounded("raise the jobs' fences", async {
                let mut tx = pool.begin().await?;
                for resource in &resources {
                    match fence.check(&mut *tx, resource, token).await {
                        Ok(()) | Err(FenceError::Stale { .. }) => {}
                        Err(other) => return Ok(Err(other)),
                    }
                }
                tx.commit().await.map(Ok)
            })
            .await?;
        raised.map_err(|err| match err {
            FenceError::Database(err) => Error::Store(err),
            other => Error::Fence(other),
        })
    }
}
