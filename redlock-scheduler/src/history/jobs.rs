//! The job definitions each replica publishes when it starts (schedule, time zone,
//! misfire policy, timeout, handler), which admin tools read without the jobs' code.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::Db;
use super::HistoryError as Error;
use super::{Shared, from_ms, ms};

/// A job definition as a replica published it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobDefinition {
    pub(crate) job: String,
    pub(crate) schedule: String,
    pub(crate) time_zone: String,
    /// As [`Misfire::to_text`](crate::job::Misfire) writes it.
    pub(crate) misfire: String,
    /// As [`DstPolicy`](crate::time::DstPolicy)'s `Display` writes it; `None` in a row
    /// a replica that knows no DST policy wrote (it ran the default one).
    pub(crate) dst: Option<String>,
    pub(crate) timeout_ms: Option<i64>,
    /// The handler's name (`None` in a row written before: the job's name).
    pub(crate) handler: Option<String>,
    /// Its misfire grace (`None` in a row written before: the default).
    pub(crate) grace_ms: Option<i64>,
    /// It runs on the leader only (`None` in a row written before: no).
    pub(crate) on_leader: Option<bool>,
    pub(crate) updated: DateTime<Utc>,
    pub(crate) updated_by: String,
}

fn definition_from_row(row: &AnyRow) -> Result<JobDefinition, Error> {
    Ok(JobDefinition {
        job: row.try_get("job").db()?,
        schedule: row.try_get("schedule").db()?,
        time_zone: row.try_get("time_zone").db()?,
        misfire: row.try_get("misfire").db()?,
        dst: row.try_get("dst").db()?,
        timeout_ms: row.try_get("timeout_ms").db()?,
        handler: row.try_get("handler").db()?,
        grace_ms: row.try_get("grace_ms").db()?,
        on_leader: row
            .try_get::<Option<i64>, _>("on_leader")
            .db()?
            .map(|flag| flag != 0),
        updated: from_ms(row.try_get("updated_ms").db()?),
        updated_by: row.try_get("updated_by").db()?,
    })
}

const DEFINITION_COLUMNS: &str = "job, schedule, time_zone, misfire, timeout_ms, updated_ms, \
     updated_by, dst, handler, grace_ms, on_leader";

/// The job definitions table.
#[derive(Clone, Copy)]
pub(crate) struct Definitions<'a> {
    pub(super) shared: &'a Shared,
}

impl Definitions<'_> {
    /// Publishes `definitions` as `instance`'s jobs of `scheduler` (replacing what was
    /// there under the same names), in one transaction.
    pub(crate) async fn publish_jobs(
        self,
        scheduler: &str,
        instance: &str,
        definitions: &[JobDefinition],
    ) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("publish the jobs", |t| {
                t.jobs.publish(scheduler, instance, definitions)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "INSERT INTO {} (scheduler, {DEFINITION_COLUMNS})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (scheduler, job) DO UPDATE
             SET schedule = excluded.schedule, time_zone = excluded.time_zone,
                 misfire = excluded.misfire, timeout_ms = excluded.timeout_ms,
                 updated_ms = excluded.updated_ms, updated_by = excluded.updated_by,
                 dst = excluded.dst, handler = excluded.handler,
                 grace_ms = excluded.grace_ms, on_leader = excluded.on_leader",
            self.shared.tables.jobs
        );
        let pool = &self.shared.pool;
        self.shared
            .bounded("publish the jobs", async {
                let mut tx = pool.begin().await?;
                for definition in definitions {
                    sqlx::query(&sql)
                        .bind(scheduler)
                        .bind(definition.job.as_str())
                        .bind(definition.schedule.as_str())
                        .bind(definition.time_zone.as_str())
                        .bind(definition.misfire.as_str())
                        .bind(definition.timeout_ms)
                        .bind(ms(definition.updated))
                        .bind(instance)
                        .bind(definition.dst.as_deref())
                        .bind(definition.handler.as_deref())
                        .bind(definition.grace_ms)
                        .bind(definition.on_leader.map(i64::from))
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await
            })
            .await
    }

    /// Takes `job`'s published definition away (the job was removed at run time).
    pub(crate) async fn unpublish_job(self, scheduler: &str, job: &str) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("unpublish a job", |t| t.jobs.unpublish(scheduler, job))
            .await
        {
            return answer;
        }
        let sql = format!(
            "DELETE FROM {} WHERE scheduler = $1 AND job = $2",
            self.shared.tables.jobs
        );
        self.shared
            .bounded(
                "unpublish a job",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(job)
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(())
    }

    /// The job definitions published for `scheduler`, by name.
    pub(crate) async fn job_definitions(
        self,
        scheduler: &str,
    ) -> Result<Vec<JobDefinition>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the job definitions", |t| t.jobs.all(scheduler))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {DEFINITION_COLUMNS} FROM {} WHERE scheduler = $1 ORDER BY job",
            self.shared.tables.jobs
        );
        let rows = self
            .shared
            .bounded(
                "read the jobs",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(definition_from_row).collect()
    }

    /// The definition of `job` of `scheduler`, if a replica published it.
    pub(crate) async fn job_definition(
        self,
        scheduler: &str,
        job: &str,
    ) -> Result<Option<JobDefinition>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read a job definition", |t| t.jobs.one(scheduler, job))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {DEFINITION_COLUMNS} FROM {} WHERE scheduler = $1 AND job = $2",
            self.shared.tables.jobs
        );
        let row = self
            .shared
            .bounded(
                "read a job",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(job)
                    .fetch_optional(&self.shared.pool),
            )
            .await?;
        row.as_ref().map(definition_from_row).transpose()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::History;

    #[tokio::test]
    async fn job_definitions_are_replaced_by_name() {
        let history = History::connect("sqlite::memory:").await.unwrap();
        let definition = |schedule: &str| JobDefinition {
            job: "a".to_owned(),
            schedule: schedule.to_owned(),
            time_zone: "UTC".to_owned(),
            misfire: "run_once".to_owned(),
            dst: Some("skip/twice".to_owned()),
            timeout_ms: Some(1500),
            handler: Some("h".to_owned()),
            grace_ms: Some(30_000),
            on_leader: Some(true),
            updated: Utc::now(),
            updated_by: String::new(),
        };
        history
            .definitions()
            .publish_jobs("s", "r1", &[definition("* * * * *")])
            .await
            .unwrap();
        history
            .definitions()
            .publish_jobs("s", "r2", &[definition("0 * * * *")])
            .await
            .unwrap();
        let jobs = history.definitions().job_definitions("s").await.unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(
            (jobs[0].schedule.as_str(), jobs[0].updated_by.as_str()),
            ("0 * * * *", "r2")
        );
        assert_eq!(jobs[0].timeout_ms, Some(1500));
        assert_eq!(jobs[0].dst.as_deref(), Some("skip/twice"));
        assert!(
            history
                .definitions()
                .job_definition("s", "b")
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            history
                .definitions()
                .job_definitions("t")
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_definition_published_without_a_dst_policy_reads_as_none() {
        let history = History::connect("sqlite::memory:").await.unwrap();
        // As a replica of a version without DST policies writes it: no `dst` column.
        sqlx::query(&format!(
            "INSERT INTO {} (scheduler, job, schedule, time_zone, misfire, timeout_ms,
                             updated_ms, updated_by)
             VALUES ('s', 'old', '30 1 * * *', 'America/New_York', 'run_once', NULL, 0, 'r0')",
            history.shared.tables.jobs
        ))
        .execute(history.pool())
        .await
        .unwrap();
        let old = history
            .definitions()
            .job_definition("s", "old")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(old.dst, None);
        assert_eq!(old.schedule, "30 1 * * *");
    }
}
