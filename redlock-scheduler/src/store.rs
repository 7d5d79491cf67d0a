//! Run history in SQL (sqlx): one row per (job, scheduled tick).
//!
//! SQLite (a file, or in memory) needs no server; PostgreSQL suits clusters. The row is
//! inserted *before* a run starts, and the table's `UNIQUE (job, tick_ms)` makes the
//! database itself refuse a second run of the same tick: a conflicting insert means
//! another replica has it.
//!
//! The schema is created and upgraded by [`History::connect`] from migrations recorded in
//! their own table, `redlock_scheduler_migrations`, so they never mix with the
//! application's own sqlx migrations in the same database:
//!
//! ```sql
//! CREATE TABLE redlock_job_runs (
//!     job           TEXT   NOT NULL,
//!     tick_ms       BIGINT NOT NULL,   -- the scheduled tick, Unix ms (UTC)
//!     instance      TEXT   NOT NULL,
//!     fencing_token BIGINT,
//!     started_ms    BIGINT,
//!     finished_ms   BIGINT,
//!     outcome       TEXT   NOT NULL,   -- running, succeeded, failed, timed_out, cancelled, skipped
//!     error         TEXT,
//!     UNIQUE (job, tick_ms)
//! );
//! ```
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlock_scheduler::Error> {
//! use redlock_scheduler::History;
//!
//! let history = History::connect("sqlite::memory:").await?;
//! assert!(history.runs("nightly", 10).await?.is_empty());
//! # Ok(())
//! # }
//! ```

use std::str::FromStr;
use std::sync::Once;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use crate::error::Error;

/// The schema, in order; each entry runs once per database.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE IF NOT EXISTS redlock_job_runs (
            job TEXT NOT NULL,
            tick_ms BIGINT NOT NULL,
            instance TEXT NOT NULL,
            fencing_token BIGINT,
            started_ms BIGINT,
            finished_ms BIGINT,
            outcome TEXT NOT NULL,
            error TEXT,
            CONSTRAINT redlock_job_runs_tick UNIQUE (job, tick_ms)
        )",
    ),
    (
        2,
        "CREATE TABLE IF NOT EXISTS redlock_scheduler_leaders (
            scheduler TEXT NOT NULL PRIMARY KEY,
            instance TEXT NOT NULL,
            epoch BIGINT NOT NULL,
            since_ms BIGINT NOT NULL
        )",
    ),
    (
        3,
        "CREATE TABLE IF NOT EXISTS redlock_job_pauses (
            scheduler TEXT NOT NULL,
            job TEXT NOT NULL,
            PRIMARY KEY (scheduler, job)
        )",
    ),
];

/// How a run ended (or that it is still running).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// Claimed, and running now (or its replica died while it ran).
    Running,
    /// The handler returned `Ok`.
    Succeeded,
    /// The handler returned an error (in the `error` column).
    Failed,
    /// The job's timeout ran out.
    TimedOut,
    /// Stopped: leadership or the claim was lost, or shutdown passed its deadline.
    Cancelled,
    /// Not run: missed (misfire policy) or the previous run was still going (overlap).
    Skipped,
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
        }
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
            other => return Err(format!("unknown outcome `{other}`")),
        })
    }
}

/// One row of the history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Run {
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
    /// The error, for a failed run (or why it was skipped or cancelled).
    pub error: Option<String>,
}

/// The run history: a sqlx pool on SQLite or PostgreSQL. Cheap to clone.
#[derive(Debug, Clone)]
pub struct History {
    pool: AnyPool,
}

pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn from_ms(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

impl History {
    /// Connects to `url` and brings the schema up to date. `sqlite://path/to/file.db`
    /// (created if missing), `sqlite::memory:` (private to this pool; use
    /// `sqlite:file:NAME?mode=memory&cache=shared` to share one between pools), or
    /// `postgres://user@host/db`.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] if the database cannot be reached or migrated.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        static DRIVERS: Once = Once::new();
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let sqlite = url.starts_with("sqlite:");
        let url = if sqlite && !url.contains("memory") && !url.contains("mode=") {
            // Create the file if it is missing.
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}mode=rwc")
        } else {
            url.to_owned()
        };
        let memory = url.contains(":memory:");
        let pool = AnyPoolOptions::new()
            // A private in-memory database exists once per connection: keep one.
            .max_connections(if memory { 1 } else { 5 })
            .min_connections(u32::from(memory || url.contains("mode=memory")))
            .idle_timeout(None)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if sqlite {
                        // Replicas write concurrently: wait for the file lock, don't fail.
                        sqlx::query("PRAGMA busy_timeout = 10000")
                            .execute(&mut *conn)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await?;
        if sqlite && !memory && !url.contains("mode=memory") {
            // Readers do not block the writer (and the other way round): replicas and
            // their status queries share the file. The mode is stored in the file.
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        let history = Self { pool };
        history.migrate().await?;
        Ok(history)
    }

    async fn migrate(&self) -> Result<(), Error> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS redlock_scheduler_migrations (
                version BIGINT NOT NULL PRIMARY KEY,
                applied_ms BIGINT NOT NULL
            )",
        )
        .execute(&self.pool)
        .await?;
        for (version, sql) in MIGRATIONS {
            let applied: Option<i64> = sqlx::query_scalar(
                "SELECT version FROM redlock_scheduler_migrations WHERE version = $1",
            )
            .bind(*version)
            .fetch_optional(&self.pool)
            .await?;
            if applied.is_some() {
                continue;
            }
            // Idempotent statements: replicas starting together may both run one.
            sqlx::query(sql).execute(&self.pool).await?;
            sqlx::query(
                "INSERT INTO redlock_scheduler_migrations (version, applied_ms) VALUES ($1, $2)
                 ON CONFLICT (version) DO NOTHING",
            )
            .bind(*version)
            .bind(ms(Utc::now()))
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }

    /// Inserts the row for a tick. `false` if the tick already has one (another replica
    /// claimed it): then it must not run here.
    pub(crate) async fn claim(
        &self,
        job: &str,
        tick: DateTime<Utc>,
        instance: &str,
        token: u64,
        outcome: Outcome,
        note: Option<&str>,
    ) -> Result<bool, Error> {
        let now = ms(Utc::now());
        let (started, finished) = match outcome {
            Outcome::Running => (Some(now), None),
            _ => (None, Some(now)),
        };
        let done = sqlx::query(
            "INSERT INTO redlock_job_runs
                (job, tick_ms, instance, fencing_token, started_ms, finished_ms, outcome, error)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (job, tick_ms) DO NOTHING",
        )
        .bind(job)
        .bind(ms(tick))
        .bind(instance)
        .bind(i64::try_from(token).unwrap_or(i64::MAX))
        .bind(started)
        .bind(finished)
        .bind(outcome.as_str())
        .bind(note)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records how a run this replica claimed ended.
    pub(crate) async fn finish(
        &self,
        job: &str,
        tick: DateTime<Utc>,
        instance: &str,
        outcome: Outcome,
        error: Option<&str>,
    ) -> Result<(), Error> {
        sqlx::query(
            "UPDATE redlock_job_runs SET finished_ms = $1, outcome = $2, error = $3
             WHERE job = $4 AND tick_ms = $5 AND instance = $6",
        )
        .bind(ms(Utc::now()))
        .bind(outcome.as_str())
        .bind(error)
        .bind(job)
        .bind(ms(tick))
        .bind(instance)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The latest tick recorded for `job` (run or skipped), if any.
    pub async fn last_tick(&self, job: &str) -> Result<Option<DateTime<Utc>>, Error> {
        let last: Option<i64> =
            sqlx::query_scalar("SELECT MAX(tick_ms) FROM redlock_job_runs WHERE job = $1")
                .bind(job)
                .fetch_one(&self.pool)
                .await?;
        Ok(last.map(from_ms))
    }

    /// The `limit` latest rows of `job`, newest first.
    pub async fn runs(&self, job: &str, limit: u32) -> Result<Vec<Run>, Error> {
        let rows = sqlx::query(
            "SELECT job, tick_ms, instance, fencing_token, started_ms, finished_ms, outcome, error
             FROM redlock_job_runs WHERE job = $1 ORDER BY tick_ms DESC LIMIT $2",
        )
        .bind(job)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// Every row with a tick in `[from, to]`, oldest first (all jobs).
    pub async fn runs_between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<Run>, Error> {
        let rows = sqlx::query(
            "SELECT job, tick_ms, instance, fencing_token, started_ms, finished_ms, outcome, error
             FROM redlock_job_runs WHERE tick_ms >= $1 AND tick_ms <= $2 ORDER BY tick_ms, job",
        )
        .bind(ms(from))
        .bind(ms(to))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// Records that `instance` leads `scheduler` with `epoch` (ignored if a newer epoch
    /// is already recorded).
    pub(crate) async fn record_leader(
        &self,
        scheduler: &str,
        instance: &str,
        epoch: u64,
    ) -> Result<(), Error> {
        let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
        sqlx::query(
            "INSERT INTO redlock_scheduler_leaders (scheduler, instance, epoch, since_ms)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (scheduler) DO UPDATE
             SET instance = excluded.instance, epoch = excluded.epoch, since_ms = excluded.since_ms
             WHERE redlock_scheduler_leaders.epoch < excluded.epoch",
        )
        .bind(scheduler)
        .bind(instance)
        .bind(epoch)
        .bind(ms(Utc::now()))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The replica last recorded as leading `scheduler`.
    pub(crate) async fn leader(&self, scheduler: &str) -> Result<Option<String>, Error> {
        Ok(sqlx::query_scalar(
            "SELECT instance FROM redlock_scheduler_leaders WHERE scheduler = $1",
        )
        .bind(scheduler)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Marks `job` paused (or not) for every replica of `scheduler`.
    pub(crate) async fn set_paused(
        &self,
        scheduler: &str,
        job: &str,
        paused: bool,
    ) -> Result<(), Error> {
        let sql = if paused {
            "INSERT INTO redlock_job_pauses (scheduler, job) VALUES ($1, $2) ON CONFLICT (scheduler, job) DO NOTHING"
        } else {
            "DELETE FROM redlock_job_pauses WHERE scheduler = $1 AND job = $2"
        };
        sqlx::query(sql)
            .bind(scheduler)
            .bind(job)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Whether `job` is paused for the replicas of `scheduler`.
    pub(crate) async fn is_paused(&self, scheduler: &str, job: &str) -> Result<bool, Error> {
        let found: Option<String> = sqlx::query_scalar(
            "SELECT job FROM redlock_job_pauses WHERE scheduler = $1 AND job = $2",
        )
        .bind(scheduler)
        .bind(job)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.is_some())
    }

    /// The underlying pool, for queries of your own.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }
}

fn run_from_row(row: &AnyRow) -> Result<Run, Error> {
    let outcome: String = row.try_get("outcome")?;
    let token: Option<i64> = row.try_get("fencing_token")?;
    let started: Option<i64> = row.try_get("started_ms")?;
    let finished: Option<i64> = row.try_get("finished_ms")?;
    Ok(Run {
        job: row.try_get("job")?,
        tick: from_ms(row.try_get("tick_ms")?),
        instance: row.try_get("instance")?,
        fencing_token: token.and_then(|t| u64::try_from(t).ok()),
        started: started.map(from_ms),
        finished: finished.map(from_ms),
        outcome: Outcome::from_str(&outcome).map_err(|e| sqlx::Error::Decode(e.into()))?,
        error: row.try_get("error")?,
    })
}
