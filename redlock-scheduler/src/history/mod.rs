//! Run history in SQL (sqlx): one row per (scheduler, job, scheduled tick).
//!
//! SQLite (a file, or in memory) needs no server; PostgreSQL suits clusters. The row is
//! inserted *before* a run starts, and the table's `UNIQUE (scheduler, job, tick_ms)`
//! makes the database itself refuse a second run of the same tick: a conflicting insert
//! means another replica has it.
//!
//! The schema is created and upgraded by [`History::connect`] (or
//! [`HistoryBuilder::connect`]) from numbered migrations recorded in their own table, so
//! they never mix with the application's own sqlx migrations in the same database; they
//! run under a lock, so replicas starting together on a fresh database are safe. Table
//! names take a prefix (default `redlock_`) and, on PostgreSQL, a schema:
//!
//! ```sql
//! CREATE TABLE redlock_job_runs (
//!     scheduler     TEXT    NOT NULL,  -- the scheduler's name
//!     job           TEXT    NOT NULL,
//!     tick_ms       BIGINT  NOT NULL,  -- the scheduled tick, Unix ms (UTC)
//!     instance      TEXT    NOT NULL,  -- the replica that claimed it
//!     fencing_token BIGINT,
//!     started_ms    BIGINT,
//!     finished_ms   BIGINT,
//!     outcome       TEXT    NOT NULL,  -- running, succeeded, failed, timed_out,
//!                                      -- cancelled, skipped, abandoned
//!     error         TEXT,              -- the error, or why it was skipped or abandoned
//!     manual        INTEGER NOT NULL DEFAULT 0,  -- 1: started by a trigger
//!     closed_by     TEXT,              -- who marked it abandoned
//!     UNIQUE (scheduler, job, tick_ms)
//! );
//! ```
//!
//! Beside it: the leader last recorded (`redlock_scheduler_leaders`), paused jobs
//! (`redlock_job_pauses`), the job definitions every replica publishes when it starts
//! (`redlock_scheduler_jobs`: schedule, time zone, misfire policy, timeout) and
//! operators' requests (`redlock_scheduler_requests`: trigger, cancel, step down, with
//! who asked, who carried it out and the result), which is what
//! [`SchedulerAdmin`](crate::admin::SchedulerAdmin) works from.
//!
//! Every statement is bounded in time ([`HistoryBuilder::statement_timeout`]); a
//! database that does not answer is a [`HistoryError::Timeout`], never a hang.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlock_scheduler::error::HistoryError> {
//! use std::time::Duration;
//! use redlock_scheduler::History;
//!
//! let history = History::builder("sqlite::memory:")
//!     .connect_timeout(Duration::from_secs(2))
//!     .table_prefix("ops_")
//!     .keep_for(Duration::from_secs(30 * 24 * 3600))
//!     .connect()
//!     .await?;
//! assert!(history.runs("scheduler", "nightly", 10).await?.is_empty());
//! # Ok(())
//! # }
//! ```

mod builder;
mod changes;
mod commit;
mod control;
mod dispatch;
mod filter;
mod jobs;
mod memory;
mod requests;
mod run;
mod schema;
mod target;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::AnyPool;

pub use self::builder::{
    DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_STATEMENT_TIMEOUT, HistoryBuilder,
    MAX_TIMEOUT,
};
use self::builder::{Source, bounded};
pub(crate) use self::changes::{Changes, NewChange};
pub(crate) use self::commit::{Fences, Refused, RunKey, RunWrites};
pub(crate) use self::control::Control;
use self::control::LeaderRecord;
pub(crate) use self::dispatch::{Dispatch, Handoff, Presence};
pub use self::filter::{DEFAULT_RUN_LIMIT, MAX_RUN_LIMIT, RunFilter};
pub(crate) use self::jobs::{Definitions, JobDefinition};
#[cfg(feature = "sim")]
pub use self::memory::{MemoryFaults, StatementFault};
pub(crate) use self::requests::{Requests, new_request_id};
use self::run::run_from_row;
pub(crate) use self::run::{Change, NewRun, RunEnd};
pub use self::run::{Outcome, Run};
pub use self::schema::DEFAULT_TABLE_PREFIX;
use self::schema::Tables;
pub(crate) use crate::error::history::{Db, HistoryError};

/// What this module's calls return.
type Error = HistoryError;

pub(super) struct Shared {
    pub(super) pool: AnyPool,
    /// The tables in memory, for a memory history (then `pool` is never used).
    pub(super) memory: Option<memory::Store>,
    pub(super) place: String,
    pub(super) tables: Tables,
    pub(super) statement_timeout: Duration,
    pub(super) keep_for: Option<Duration>,
    pub(super) keep_runs: Option<u32>,
}

impl Shared {
    /// `fut`, one statement (or a few in a row), within the statement timeout.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, Error> {
        bounded(self.statement_timeout, operation, fut).await
    }

    /// On a memory history, `statement` on its tables as `operation` (`None` on a
    /// database).
    async fn in_memory<T>(
        &self,
        operation: &'static str,
        statement: impl FnOnce(&mut memory::Tables) -> T,
    ) -> Option<Result<T, Error>> {
        let store = self.memory.as_ref()?;
        Some(
            store
                .call(operation, self.statement_timeout, statement)
                .await,
        )
    }
}

/// The run history: a sqlx pool on SQLite or PostgreSQL. Cheap to clone.
#[derive(Clone)]
pub struct History {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("database", &self.shared.place)
            .field("runs", &self.shared.tables.runs)
            .finish_non_exhaustive()
    }
}

pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(super) fn from_ms(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn token(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(i64::MAX)
}

const RUN_COLUMNS: &str = "scheduler, job, tick_ms, instance, fencing_token, started_ms, \
                           finished_ms, outcome, error, manual, closed_by";

impl History {
    /// Connects to `url` with the default options and brings the schema up to date:
    /// `sqlite://path/to/file.db` (created if missing), `sqlite::memory:` (private to
    /// this pool; use `sqlite:file:NAME?mode=memory&cache=shared` to share one between
    /// pools), or `postgres://user@host/db`. See [`builder`](Self::builder) for the
    /// options.
    ///
    /// # Errors
    ///
    /// As [`HistoryBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder(url).connect().await
    }

    /// A history at `url`, with options.
    pub fn builder(url: impl Into<String>) -> HistoryBuilder {
        HistoryBuilder::new(Source::Url(url.into()))
    }

    /// A history kept in this process's memory, for deterministic simulations: its
    /// tables answer each statement as the database's do (a differential test holds
    /// them to SQLite's answers), on the caller's thread and on tokio's clock, and
    /// [`HistoryBuilder::memory_faults`] slows down or fails the statements a
    /// simulation chooses. Clones share it; nothing else does (other processes, tools).
    /// A run's transaction on it is
    /// [`JobContext::memory_transaction`](crate::JobContext::memory_transaction);
    /// [`pool`](Self::pool) is a private, empty, never-opened database.
    #[cfg(feature = "sim")]
    pub fn memory() -> HistoryBuilder {
        HistoryBuilder::new(Source::Memory { faults: None })
    }

    /// Another handle on the same memory history whose statements answer as `faults`
    /// decide (a replica's own link to the database: slow, cut, or paused with it).
    /// `None` on a database.
    #[cfg(feature = "sim")]
    #[must_use]
    pub fn memory_view(&self, faults: Arc<dyn MemoryFaults>) -> Option<History> {
        let store = self.shared.memory.as_ref()?;
        Some(History {
            shared: Arc::new(Shared {
                pool: self.shared.pool.clone(),
                memory: Some(store.view(faults)),
                place: self.shared.place.clone(),
                tables: self.shared.tables.clone(),
                statement_timeout: self.shared.statement_timeout,
                keep_for: self.shared.keep_for,
                keep_runs: self.shared.keep_runs,
            }),
        })
    }

    /// The writes that runs committed on a memory history, as
    /// [`MemoryTransaction::write`](crate::transaction::MemoryTransaction::write) gave
    /// them, in commit order: (job, tick, what). Empty on a database.
    #[cfg(feature = "sim")]
    pub fn memory_effects(&self, scheduler: &str) -> Vec<(String, DateTime<Utc>, String)> {
        self.shared.memory.as_ref().map_or_else(Vec::new, |store| {
            store
                .tables()
                .effects
                .iter()
                .filter(|(s, ..)| s == scheduler)
                .map(|(_, job, tick, what)| (job.clone(), from_ms(*tick), what.clone()))
                .collect()
        })
    }

    /// A history on a pool of your own (SQLite or PostgreSQL, through sqlx's `Any`
    /// driver: call `sqlx::any::install_default_drivers()` before creating it). Its
    /// timeouts and size are yours; statements are still bounded by
    /// [`HistoryBuilder::statement_timeout`].
    pub fn from_pool(pool: AnyPool) -> HistoryBuilder {
        HistoryBuilder::new(Source::Pool(pool))
    }

    /// The database, as errors name it (no credentials).
    pub fn place(&self) -> &str {
        &self.shared.place
    }

    /// How long one statement may take.
    pub fn statement_timeout(&self) -> Duration {
        self.shared.statement_timeout
    }

    /// The leaders and pauses tables.
    pub(crate) fn control(&self) -> Control<'_> {
        Control {
            shared: &self.shared,
        }
    }

    /// The fences table, and the runs' own transactions.
    pub(crate) fn fences(&self) -> Fences<'_> {
        Fences {
            shared: &self.shared,
        }
    }

    /// The replicas and hand-offs tables.
    pub(crate) fn dispatch(&self) -> Dispatch<'_> {
        Dispatch {
            shared: &self.shared,
        }
    }

    /// The job changes table.
    pub(crate) fn changes(&self) -> Changes<'_> {
        Changes {
            shared: &self.shared,
        }
    }

    /// The job definitions table.
    pub(crate) fn definitions(&self) -> Definitions<'_> {
        Definitions {
            shared: &self.shared,
        }
    }

    /// The operators' requests table.
    pub(crate) fn requests(&self) -> Requests<'_> {
        Requests {
            shared: &self.shared,
        }
    }

    /// Applies `changes` in one transaction (one commit, so one disk flush on SQLite and
    /// one commit round trip on PostgreSQL, however many rows): for each, whether it took
    /// effect. A [`Change::Claim`] that finds the tick's row already there (another
    /// replica claimed it) does not take effect: that tick must not run here. A
    /// [`Change::Finish`] other than `succeeded` does not overwrite a `succeeded` row
    /// (the run's own transaction committed it: its effects are in); the update waits
    /// for a transaction still holding the row, so it sees that commit. Either all
    /// changes are applied or, on an error, none.
    pub(crate) async fn apply(&self, changes: &[Change<'_>]) -> Result<Vec<bool>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("write", |t| t.runs.apply(changes))
            .await
        {
            return answer;
        }
        let claim = format!(
            "INSERT INTO {} ({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL)
             ON CONFLICT (scheduler, job, tick_ms) DO NOTHING",
            self.shared.tables.runs
        );
        let finish = format!(
            "UPDATE {} SET finished_ms = $1, outcome = $2, error = $3, closed_by = NULL
             WHERE scheduler = $4 AND job = $5 AND tick_ms = $6 AND instance = $7",
            self.shared.tables.runs
        );
        let finish_unless_succeeded = format!("{finish} AND outcome <> 'succeeded'");
        let pool = &self.shared.pool;
        self.shared
            .bounded("write", async {
                let mut tx = pool.begin().await?;
                let mut applied = Vec::with_capacity(changes.len());
                for change in changes {
                    let query = match change {
                        Change::Claim(run) => {
                            let at = ms(run.at);
                            let (started, finished) = match run.outcome {
                                Outcome::Running => (Some(at), None),
                                _ => (None, Some(at)),
                            };
                            sqlx::query(&claim)
                                .bind(run.scheduler)
                                .bind(run.job)
                                .bind(ms(run.tick))
                                .bind(run.instance)
                                .bind(token(run.token))
                                .bind(started)
                                .bind(finished)
                                .bind(run.outcome.as_str())
                                .bind(run.note)
                                .bind(i32::from(run.manual))
                        }
                        Change::Finish(end) => {
                            let sql = if end.outcome == Outcome::Succeeded {
                                &finish
                            } else {
                                &finish_unless_succeeded
                            };
                            sqlx::query(sql)
                                .bind(ms(end.at))
                                .bind(end.outcome.as_str())
                                .bind(end.error)
                                .bind(end.scheduler)
                                .bind(end.job)
                                .bind(ms(end.tick))
                                .bind(end.instance)
                        }
                    };
                    let done = query.execute(&mut *tx).await?;
                    applied.push(done.rows_affected() == 1);
                }
                tx.commit().await?;
                Ok(applied)
            })
            .await
    }

    /// The latest scheduled tick recorded for `job` of `scheduler` (run or skipped;
    /// manual triggers do not count), if any.
    ///
    /// # Errors
    ///
    /// [`HistoryError::Database`] or [`HistoryError::Timeout`].
    pub async fn last_tick(
        &self,
        scheduler: &str,
        job: &str,
    ) -> Result<Option<DateTime<Utc>>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("last tick", |t| t.runs.last_tick(scheduler, job))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT MAX(tick_ms) FROM {} WHERE scheduler = $1 AND job = $2 AND manual = 0",
            self.shared.tables.runs
        );
        let last: Option<i64> = self
            .shared
            .bounded(
                "last tick",
                sqlx::query_scalar(&sql)
                    .bind(scheduler)
                    .bind(job)
                    .fetch_one(&self.shared.pool),
            )
            .await?;
        Ok(last.map(from_ms))
    }

    /// The latest scheduled tick of every job of `scheduler` that has a row (manual
    /// triggers do not count).
    pub(crate) async fn last_ticks(
        &self,
        scheduler: &str,
    ) -> Result<std::collections::HashMap<String, DateTime<Utc>>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("last ticks", |t| t.runs.last_ticks(scheduler))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT job, MAX(tick_ms) AS last FROM {} WHERE scheduler = $1 AND manual = 0
             GROUP BY job",
            self.shared.tables.runs
        );
        let rows: Vec<(String, i64)> = self
            .shared
            .bounded(
                "last ticks",
                sqlx::query_as(&sql)
                    .bind(scheduler)
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|(job, last)| (job, from_ms(last)))
            .collect())
    }

    /// The `limit` latest rows of `job` of `scheduler`, newest first.
    ///
    /// # Errors
    ///
    /// [`HistoryError::Database`] or [`HistoryError::Timeout`].
    pub async fn runs(&self, scheduler: &str, job: &str, limit: u32) -> Result<Vec<Run>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read runs", |t| t.runs.runs(scheduler, job, limit))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM {} WHERE scheduler = $1 AND job = $2
             ORDER BY tick_ms DESC LIMIT $3",
            self.shared.tables.runs
        );
        let rows = self
            .shared
            .bounded(
                "read runs",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(job)
                    .bind(i64::from(limit))
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// Every row of `scheduler` with a tick in `[from, to]`, oldest first (all jobs).
    ///
    /// # Errors
    ///
    /// [`HistoryError::Database`] or [`HistoryError::Timeout`].
    pub async fn runs_between(
        &self,
        scheduler: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<Run>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read runs", |t| t.runs.between(scheduler, from, to))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM {} WHERE scheduler = $1 AND tick_ms >= $2 AND tick_ms <= $3
             ORDER BY tick_ms, job",
            self.shared.tables.runs
        );
        let rows = self
            .shared
            .bounded(
                "read runs",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(ms(from))
                    .bind(ms(to))
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// The rows of `scheduler` still marked running.
    pub(crate) async fn running(&self, scheduler: &str) -> Result<Vec<Run>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read running runs", |t| t.runs.running(scheduler))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM {} WHERE scheduler = $1 AND outcome = 'running'
             ORDER BY tick_ms LIMIT 1000",
            self.shared.tables.runs
        );
        let rows = self
            .shared
            .bounded(
                "read running runs",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// The row of `job`'s `tick` of `scheduler`, if any.
    pub(crate) async fn run_at(
        &self,
        scheduler: &str,
        job: &str,
        tick: DateTime<Utc>,
    ) -> Result<Option<Run>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read a run", |t| t.runs.run_at(scheduler, job, tick))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM {} WHERE scheduler = $1 AND job = $2 AND tick_ms = $3",
            self.shared.tables.runs
        );
        let row = self
            .shared
            .bounded(
                "read a run",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(job)
                    .bind(ms(tick))
                    .fetch_optional(&self.shared.pool),
            )
            .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// Who claimed `job`'s `tick` of `scheduler`: the replica and its leadership token
    /// (`None` without a row).
    pub(crate) async fn claimant(
        &self,
        scheduler: &str,
        job: &str,
        tick: DateTime<Utc>,
    ) -> Result<Option<(String, Option<u64>)>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read a tick's claimant", |t| {
                t.runs.claimant(scheduler, job, tick)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT instance, fencing_token FROM {} WHERE scheduler = $1 AND job = $2 AND tick_ms = $3",
            self.shared.tables.runs
        );
        let row: Option<(String, Option<i64>)> = self
            .shared
            .bounded(
                "read a tick's claimant",
                sqlx::query_as(&sql)
                    .bind(scheduler)
                    .bind(job)
                    .bind(ms(tick))
                    .fetch_optional(&self.shared.pool),
            )
            .await?;
        Ok(row.map(|(instance, token)| (instance, token.and_then(|t| u64::try_from(t).ok()))))
    }

    /// Closes a row still marked running as abandoned, by `closed_by`. `false` if it
    /// was closed meanwhile.
    pub(crate) async fn abandon(
        &self,
        run: &Run,
        closed_by: &str,
        reason: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("abandon", |t| t.runs.abandon(run, closed_by, reason, at))
            .await
        {
            return answer;
        }
        let sql = format!(
            "UPDATE {} SET outcome = 'abandoned', finished_ms = $1, error = $2, closed_by = $3
             WHERE scheduler = $4 AND job = $5 AND tick_ms = $6 AND instance = $7
               AND outcome = 'running'",
            self.shared.tables.runs
        );
        let done = self
            .shared
            .bounded(
                "abandon",
                sqlx::query(&sql)
                    .bind(ms(at))
                    .bind(reason)
                    .bind(closed_by)
                    .bind(&run.scheduler)
                    .bind(&run.job)
                    .bind(ms(run.tick))
                    .bind(&run.instance)
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The runs of `scheduler` that `filter` selects, newest tick first (then by job).
    /// Bounded by the statement timeout like every other read.
    ///
    /// # Errors
    ///
    /// [`HistoryError::Database`](Error::Database) or [`HistoryError::Timeout`](Error::Timeout).
    pub async fn query_runs(&self, scheduler: &str, filter: &RunFilter) -> Result<Vec<Run>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("query runs", |t| t.runs.query(scheduler, filter))
            .await
        {
            return answer;
        }
        filter.query(&self.shared, scheduler).await
    }

    /// The latest row of each job of `scheduler` (manual runs included).
    pub(crate) async fn last_runs(&self, scheduler: &str) -> Result<Vec<Run>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the last runs", |t| t.runs.last_runs(scheduler))
            .await
        {
            return answer;
        }
        let runs = &self.shared.tables.runs;
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM {runs} AS r WHERE r.scheduler = $1
               AND r.tick_ms = (SELECT MAX(l.tick_ms) FROM {runs} AS l
                                WHERE l.scheduler = r.scheduler AND l.job = r.job)"
        );
        let rows = self
            .shared
            .bounded(
                "read the last runs",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// Deletes finished rows of `scheduler` beyond the retention. Whatever the age and
    /// the count, each job keeps its latest row and its latest *scheduled* row (the tick
    /// a new leader catches up from: a manual run is not one). Returns how many went.
    /// With an age ([`HistoryBuilder::keep_for`]), operators' requests done before the
    /// cutoff go too (not counted).
    ///
    /// # Errors
    ///
    /// [`HistoryError::Database`] or [`HistoryError::Timeout`].
    pub async fn prune(&self, scheduler: &str, now: DateTime<Utc>) -> Result<u64, Error> {
        let cutoff = self
            .shared
            .keep_for
            .map(|age| crate::time::earlier(now, age));
        let keep = self.shared.keep_runs;
        if let Some(answer) = self
            .shared
            .in_memory("prune", |t| {
                let deleted = t.runs.prune(scheduler, cutoff, keep);
                if let Some(cutoff) = cutoff {
                    t.requests.prune(scheduler, cutoff);
                }
                deleted
            })
            .await
        {
            return answer;
        }
        let runs = &self.shared.tables.runs;
        // A manual row, or a scheduled row with a later scheduled row of its job.
        let not_last_scheduled = format!(
            "(r.manual <> 0 OR EXISTS (SELECT 1 FROM {runs} AS s
                WHERE s.scheduler = r.scheduler AND s.job = r.job AND s.manual = 0
                  AND s.tick_ms > r.tick_ms))"
        );
        let mut deleted = 0;
        if let Some(age) = self.shared.keep_for {
            let cutoff = crate::time::earlier(now, age);
            let sql = format!(
                "DELETE FROM {runs} AS r WHERE r.scheduler = $1 AND r.tick_ms < $2
                   AND r.outcome <> 'running'
                   AND r.tick_ms < (SELECT MAX(l.tick_ms) FROM {runs} AS l
                                    WHERE l.scheduler = r.scheduler AND l.job = r.job)
                   AND {not_last_scheduled}"
            );
            deleted += self
                .shared
                .bounded(
                    "prune",
                    sqlx::query(&sql)
                        .bind(scheduler)
                        .bind(ms(cutoff))
                        .execute(&self.shared.pool),
                )
                .await?
                .rows_affected();
            self.requests().prune_requests(scheduler, cutoff).await?;
        }
        if let Some(keep) = self.shared.keep_runs {
            let sql = format!(
                "DELETE FROM {runs} AS r WHERE r.scheduler = $1 AND r.outcome <> 'running'
                   AND (SELECT COUNT(*) FROM {runs} AS l
                        WHERE l.scheduler = r.scheduler AND l.job = r.job
                          AND l.tick_ms > r.tick_ms) >= $2
                   AND {not_last_scheduled}"
            );
            deleted += self
                .shared
                .bounded(
                    "prune",
                    sqlx::query(&sql)
                        .bind(scheduler)
                        .bind(i64::from(keep))
                        .execute(&self.shared.pool),
                )
                .await?
                .rows_affected();
        }
        Ok(deleted)
    }

    /// Whether a retention is configured.
    pub(crate) fn prunes(&self) -> bool {
        self.shared.keep_for.is_some() || self.shared.keep_runs.is_some()
    }

    /// The underlying pool, for queries of your own.
    pub fn pool(&self) -> &AnyPool {
        &self.shared.pool
    }

    /// The table holding the runs (prefix and schema applied), for queries of your own.
    pub fn runs_table(&self) -> &str {
        &self.shared.tables.runs
    }
}

#[cfg(test)]
mod tests;
