//! Jobs changed at run time, as the history carries them: one row per change, numbered
//! per scheduler. A writer takes the number after the last one; a second writer of the
//! same number finds the row there (`ON CONFLICT DO NOTHING`) and reads again, so the
//! numbers give one order that every replica applies the changes in.

use chrono::{DateTime, Utc};
use sqlx::Row as _;
use sqlx::any::AnyRow;

use super::{Db, Error, Shared, from_ms, ms};
use crate::changes::{JobChange, JobChangeAction};
use crate::spec::JobSpec;

const CHANGE_COLUMNS: &str = "seq, job, action, definition, previous, changed_by, changed_ms";

/// A change recorded in a form this version cannot read (written by a later one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnreadChange {
    pub(crate) seq: u64,
    pub(crate) job: String,
    pub(crate) error: String,
}

/// A change row's columns as the table stores them.
#[derive(Debug, Clone)]
pub(super) struct ChangeColumns {
    pub(super) seq: i64,
    pub(super) job: String,
    pub(super) action: String,
    pub(super) definition: Option<String>,
    pub(super) previous: Option<String>,
    pub(super) changed_by: String,
    pub(super) changed_ms: i64,
}

impl ChangeColumns {
    /// The change, or why it cannot be read (its number and job always can).
    pub(super) fn read(self) -> Result<JobChange, UnreadChange> {
        let seq = u64::try_from(self.seq).unwrap_or(0);
        let job = self.job;
        let spec =
            |text: Option<&String>| text.map(|text| JobSpec::from_text(&job, text)).transpose();
        let read = || -> Result<JobChange, String> {
            Ok(JobChange {
                seq,
                action: JobChangeAction::from_text(&self.action)
                    .ok_or_else(|| format!("unknown job change `{}`", self.action))?,
                definition: spec(self.definition.as_ref())?,
                previous: spec(self.previous.as_ref())?,
                changed_by: self.changed_by.clone(),
                changed: from_ms(self.changed_ms),
                job: job.clone(),
            })
        };
        read().map_err(|error| UnreadChange {
            seq,
            job: job.clone(),
            error,
        })
    }

    /// The columns `change` is written as.
    pub(super) fn of(change: &NewChange<'_>) -> Self {
        Self {
            seq: i64::try_from(change.seq).unwrap_or(i64::MAX),
            job: change.job.to_owned(),
            action: change.action.as_str().to_owned(),
            definition: change.definition.map(JobSpec::to_text),
            previous: change.previous.map(JobSpec::to_text),
            changed_by: change.by.to_owned(),
            changed_ms: ms(change.at),
        }
    }
}

/// A change row: the change, or why it cannot be read (its number and job always can).
fn change_from_row(row: &AnyRow) -> Result<Result<JobChange, UnreadChange>, Error> {
    let columns = ChangeColumns {
        seq: row.try_get("seq").db()?,
        job: row.try_get("job").db()?,
        action: row.try_get("action").db()?,
        definition: row.try_get("definition").db()?,
        previous: row.try_get("previous").db()?,
        changed_by: row.try_get("changed_by").db()?,
        changed_ms: row.try_get("changed_ms").db()?,
    };
    Ok(columns.read())
}

/// A change this version cannot read, as the reads that need every change report it.
pub(super) fn unread_error(unread: &UnreadChange) -> Error {
    Error::database(sqlx::Error::Decode(
        format!(
            "job change {} of `{}`: {}",
            unread.seq, unread.job, unread.error
        )
        .into(),
    ))
}

/// The changes of `rows`, those this version cannot read reported as errors.
fn changes_from_rows(rows: &[AnyRow]) -> Result<Vec<JobChange>, Error> {
    rows.iter()
        .map(|row| change_from_row(row)?.map_err(|unread| unread_error(&unread)))
        .collect()
}

/// A change to write: the number it takes, what it does, and who made it when.
pub(crate) struct NewChange<'a> {
    pub(crate) seq: u64,
    pub(crate) job: &'a str,
    pub(crate) action: JobChangeAction,
    pub(crate) definition: Option<&'a JobSpec>,
    pub(crate) previous: Option<&'a JobSpec>,
    pub(crate) by: &'a str,
    pub(crate) at: DateTime<Utc>,
}

/// The job changes table.
#[derive(Clone, Copy)]
pub(crate) struct Changes<'a> {
    pub(super) shared: &'a Shared,
}

impl Changes<'_> {
    /// The changes of `scheduler`'s jobs numbered after `after`, in order, each read or
    /// not (a later version's).
    pub(crate) async fn job_changes_after(
        self,
        scheduler: &str,
        after: u64,
    ) -> Result<Vec<Result<JobChange, UnreadChange>>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the job changes", |t| {
                t.changes.after(scheduler, after)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {CHANGE_COLUMNS} FROM {} WHERE scheduler = $1 AND seq > $2 ORDER BY seq",
            self.shared.tables.changes
        );
        let rows = self
            .shared
            .bounded(
                "read the job changes",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(i64::try_from(after).unwrap_or(i64::MAX))
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(change_from_row).collect()
    }

    /// The latest changes of `scheduler`'s jobs (of `job` only, if given), newest
    /// first, at most `limit`.
    pub(crate) async fn job_changes(
        self,
        scheduler: &str,
        job: Option<&str>,
        limit: u32,
    ) -> Result<Vec<JobChange>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the job changes", |t| {
                t.changes.latest(scheduler, job, limit)
            })
            .await
        {
            return answer?.map_err(|unread| unread_error(&unread));
        }
        let table = &self.shared.tables.changes;
        let sql = match job {
            Some(_) => format!(
                "SELECT {CHANGE_COLUMNS} FROM {table} WHERE scheduler = $1 AND job = $3
                 ORDER BY seq DESC LIMIT $2"
            ),
            None => format!(
                "SELECT {CHANGE_COLUMNS} FROM {table} WHERE scheduler = $1
                 ORDER BY seq DESC LIMIT $2"
            ),
        };
        let mut query = sqlx::query(&sql).bind(scheduler).bind(i64::from(limit));
        if let Some(job) = job {
            query = query.bind(job);
        }
        let rows = self
            .shared
            .bounded("read the job changes", query.fetch_all(&self.shared.pool))
            .await?;
        changes_from_rows(&rows)
    }

    /// The number of `scheduler`'s latest change (0 if none).
    pub(crate) async fn last_job_change(self, scheduler: &str) -> Result<u64, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the job changes", |t| t.changes.last(scheduler))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT MAX(seq) FROM {} WHERE scheduler = $1",
            self.shared.tables.changes
        );
        let last: Option<i64> = self
            .shared
            .bounded(
                "read the job changes",
                sqlx::query_scalar(&sql)
                    .bind(scheduler)
                    .fetch_one(&self.shared.pool),
            )
            .await?;
        Ok(last.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
    }

    /// Writes `change` under its number: `false` if another change took the number.
    pub(crate) async fn insert_job_change(
        self,
        scheduler: &str,
        change: &NewChange<'_>,
    ) -> Result<bool, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("record a job change", |t| {
                t.changes.insert(scheduler, change)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "INSERT INTO {} (scheduler, {CHANGE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (scheduler, seq) DO NOTHING",
            self.shared.tables.changes
        );
        let columns = ChangeColumns::of(change);
        let done = self
            .shared
            .bounded(
                "record a job change",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(columns.seq)
                    .bind(columns.job)
                    .bind(columns.action)
                    .bind(columns.definition)
                    .bind(columns.previous)
                    .bind(columns.changed_by)
                    .bind(columns.changed_ms)
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
