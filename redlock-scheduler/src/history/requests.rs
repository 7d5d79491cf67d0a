//! What admin tools read and write without the jobs' code: the job definitions replicas
//! publish, the leader's record, the latest run of each job, and operators' requests.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::Db;
use super::HistoryError as Error;
use super::run::run_from_row;
use super::{History, RUN_COLUMNS, Run, from_ms, ms};
use crate::request::{Request, RequestAction, state_of};

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

/// The leader as last recorded: instance, epoch, since when, and its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderRecord {
    pub(crate) instance: String,
    pub(crate) epoch: u64,
    pub(crate) since: DateTime<Utc>,
    /// Until when the record holds unless the leader renews it; `None` if a replica
    /// that keeps no lease (an earlier version) wrote it.
    pub(crate) expires: Option<DateTime<Utc>>,
    /// When the leadership ended, as its leader recorded it.
    pub(crate) ended: Option<DateTime<Utc>>,
}

impl LeaderRecord {
    /// Whether the record still names a leader at `now`: its leadership has not ended
    /// and its lease has not run out.
    pub(crate) fn is_current(&self, now: DateTime<Utc>) -> bool {
        self.ended.is_none() && self.expires.is_none_or(|expires| expires > now)
    }
}

const REQUEST_COLUMNS: &str =
    "id, scheduler, job, action, requested_ms, requested_by, done_ms, done_by, result";

fn request_from_row(row: &AnyRow) -> Result<Request, Error> {
    let action: String = row.try_get("action").db()?;
    let done: Option<i64> = row.try_get("done_ms").db()?;
    let result: Option<String> = row.try_get("result").db()?;
    Ok(Request {
        id: row.try_get("id").db()?,
        scheduler: row.try_get("scheduler").db()?,
        job: row.try_get("job").db()?,
        action: RequestAction::from_str(&action)
            .map_err(|e| sqlx::Error::Decode(e.into()))
            .db()?,
        requested: from_ms(row.try_get("requested_ms").db()?),
        requested_by: row.try_get("requested_by").db()?,
        done: done.map(from_ms),
        done_by: row.try_get("done_by").db()?,
        state: state_of(done, result.as_deref()),
        result,
    })
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

/// A new request id: 128 random bits, in hex.
pub(crate) fn new_request_id() -> String {
    use rand::RngExt;
    format!("{:032x}", rand::rng().random::<u128>())
}

const DEFINITION_COLUMNS: &str = "job, schedule, time_zone, misfire, timeout_ms, updated_ms, \
     updated_by, dst, handler, grace_ms, on_leader";

impl History {
    /// Publishes `definitions` as `instance`'s jobs of `scheduler` (replacing what was
    /// there under the same names), in one transaction.
    pub(crate) async fn publish_jobs(
        &self,
        scheduler: &str,
        instance: &str,
        definitions: &[JobDefinition],
    ) -> Result<(), Error> {
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
        self.bounded("publish the jobs", async {
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
    pub(crate) async fn unpublish_job(&self, scheduler: &str, job: &str) -> Result<(), Error> {
        let sql = format!(
            "DELETE FROM {} WHERE scheduler = $1 AND job = $2",
            self.shared.tables.jobs
        );
        self.bounded(
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
        &self,
        scheduler: &str,
    ) -> Result<Vec<JobDefinition>, Error> {
        let sql = format!(
            "SELECT {DEFINITION_COLUMNS} FROM {} WHERE scheduler = $1 ORDER BY job",
            self.shared.tables.jobs
        );
        let rows = self
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
        &self,
        scheduler: &str,
        job: &str,
    ) -> Result<Option<JobDefinition>, Error> {
        let sql = format!(
            "SELECT {DEFINITION_COLUMNS} FROM {} WHERE scheduler = $1 AND job = $2",
            self.shared.tables.jobs
        );
        let row = self
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

    /// The leader last recorded for `scheduler`, with its epoch, since when and its
    /// lease, whether or not its leadership goes on.
    pub(crate) async fn leader_record(
        &self,
        scheduler: &str,
    ) -> Result<Option<LeaderRecord>, Error> {
        let sql = format!(
            "SELECT instance, epoch, since_ms, lease_epoch, expires_ms, ended_ms
             FROM {} WHERE scheduler = $1",
            self.shared.tables.leaders
        );
        type Columns = (String, i64, i64, Option<i64>, Option<i64>, Option<i64>);
        let row: Option<Columns> = self
            .bounded(
                "read the leader",
                sqlx::query_as(&sql)
                    .bind(scheduler)
                    .fetch_optional(&self.shared.pool),
            )
            .await?;
        Ok(
            row.map(|(instance, epoch, since, lease_epoch, expires, ended)| {
                // The lease columns speak for the epoch that wrote them: a replica that
                // keeps no lease rewrites the rest of the row and leaves them behind.
                let leased = lease_epoch == Some(epoch);
                LeaderRecord {
                    instance,
                    epoch: u64::try_from(epoch).unwrap_or(0),
                    since: from_ms(since),
                    expires: expires.filter(|_| leased).map(from_ms),
                    ended: ended.filter(|_| leased).map(from_ms),
                }
            }),
        )
    }

    /// The latest row of each job of `scheduler` (manual runs included).
    pub(crate) async fn last_runs(&self, scheduler: &str) -> Result<Vec<Run>, Error> {
        let runs = &self.shared.tables.runs;
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM {runs} AS r WHERE r.scheduler = $1
               AND r.tick_ms = (SELECT MAX(l.tick_ms) FROM {runs} AS l
                                WHERE l.scheduler = r.scheduler AND l.job = r.job)"
        );
        let rows = self
            .bounded(
                "read the last runs",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// Records a new request.
    pub(crate) async fn insert_request(
        &self,
        id: &str,
        scheduler: &str,
        job: Option<&str>,
        action: RequestAction,
        requested_by: &str,
        at: DateTime<Utc>,
    ) -> Result<(), Error> {
        let sql = format!(
            "INSERT INTO {} (id, scheduler, job, action, requested_ms, requested_by)
             VALUES ($1, $2, $3, $4, $5, $6)",
            self.shared.tables.requests
        );
        self.bounded(
            "record a request",
            sqlx::query(&sql)
                .bind(id)
                .bind(scheduler)
                .bind(job)
                .bind(action.as_str())
                .bind(ms(at))
                .bind(requested_by)
                .execute(&self.shared.pool),
        )
        .await?;
        Ok(())
    }

    /// The request `id` of `scheduler`.
    pub(crate) async fn request(
        &self,
        scheduler: &str,
        id: &str,
    ) -> Result<Option<Request>, Error> {
        let sql = format!(
            "SELECT {REQUEST_COLUMNS} FROM {} WHERE id = $1 AND scheduler = $2",
            self.shared.tables.requests
        );
        let row = self
            .bounded(
                "read a request",
                sqlx::query(&sql)
                    .bind(id)
                    .bind(scheduler)
                    .fetch_optional(&self.shared.pool),
            )
            .await?;
        row.as_ref().map(request_from_row).transpose()
    }

    /// The requests of `scheduler` no replica took yet, oldest first (at most 100).
    pub(crate) async fn pending_requests(&self, scheduler: &str) -> Result<Vec<Request>, Error> {
        let sql = format!(
            "SELECT {REQUEST_COLUMNS} FROM {} WHERE scheduler = $1 AND done_ms IS NULL
             ORDER BY requested_ms, id LIMIT 100",
            self.shared.tables.requests
        );
        let rows = self
            .bounded(
                "read pending requests",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(request_from_row).collect()
    }

    /// Takes the request `id` for `by`, atomically: `true` if it was still pending
    /// (then only this caller acts on it). With a `result`, it is done at once.
    pub(crate) async fn claim_request(
        &self,
        id: &str,
        by: &str,
        at: DateTime<Utc>,
        result: Option<&str>,
    ) -> Result<bool, Error> {
        let sql = format!(
            "UPDATE {} SET done_ms = $1, done_by = $2, result = $3
             WHERE id = $4 AND done_ms IS NULL",
            self.shared.tables.requests
        );
        let done = self
            .bounded(
                "take a request",
                sqlx::query(&sql)
                    .bind(ms(at))
                    .bind(by)
                    .bind(result)
                    .bind(id)
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records the result of a request taken by [`claim_request`](Self::claim_request).
    pub(crate) async fn finish_request(&self, id: &str, result: &str) -> Result<(), Error> {
        let sql = format!(
            "UPDATE {} SET result = $1 WHERE id = $2",
            self.shared.tables.requests
        );
        self.bounded(
            "record a request's result",
            sqlx::query(&sql)
                .bind(result)
                .bind(id)
                .execute(&self.shared.pool),
        )
        .await?;
        Ok(())
    }

    /// Deletes the requests of `scheduler` done and asked before `cutoff`.
    pub(crate) async fn prune_requests(
        &self,
        scheduler: &str,
        cutoff: DateTime<Utc>,
    ) -> Result<u64, Error> {
        let sql = format!(
            "DELETE FROM {} WHERE scheduler = $1 AND done_ms IS NOT NULL AND requested_ms < $2",
            self.shared.tables.requests
        );
        Ok(self
            .bounded(
                "prune requests",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(ms(cutoff))
                    .execute(&self.shared.pool),
            )
            .await?
            .rows_affected())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::request::RequestState;

    #[test]
    fn request_states() {
        assert_eq!(state_of(None, None), RequestState::Pending);
        assert_eq!(state_of(Some(1), None), RequestState::Executing);
        assert_eq!(state_of(Some(1), Some("ok")), RequestState::Succeeded);
        assert_eq!(
            state_of(Some(1), Some("ok: tick 2026-01-01T00:00:00Z")),
            RequestState::Succeeded
        );
        assert_eq!(state_of(Some(1), Some("okay?")), RequestState::Failed);
        assert_eq!(
            state_of(Some(1), Some("expired: no replica took it within 60 s")),
            RequestState::Expired
        );
        assert_eq!(
            state_of(Some(1), Some("no run going")),
            RequestState::Failed
        );
    }

    #[test]
    fn request_ids_are_128_random_bits() {
        let (a, b) = (new_request_id(), new_request_id());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[tokio::test]
    async fn requests_are_taken_once() {
        let history = History::connect("sqlite::memory:").await.unwrap();
        let id = new_request_id();
        history
            .insert_request(
                &id,
                "s",
                Some("a"),
                RequestAction::Trigger,
                "ops",
                Utc::now(),
            )
            .await
            .unwrap();
        let pending = history.pending_requests("s").await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].state, RequestState::Pending);
        assert!(history.pending_requests("other").await.unwrap().is_empty());
        assert!(
            history
                .claim_request(&id, "r1", Utc::now(), None)
                .await
                .unwrap()
        );
        assert!(
            !history
                .claim_request(&id, "r2", Utc::now(), None)
                .await
                .unwrap()
        );
        let taken = history.request("s", &id).await.unwrap().unwrap();
        assert_eq!(
            (taken.state, taken.done_by.as_deref()),
            (RequestState::Executing, Some("r1"))
        );
        history.finish_request(&id, "ok: tick x").await.unwrap();
        let done = history.request("s", &id).await.unwrap().unwrap();
        assert!(done.is_done());
        assert_eq!(done.state, RequestState::Succeeded);
        assert!(history.pending_requests("s").await.unwrap().is_empty());
        assert!(history.request("other", &id).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn done_requests_go_with_the_age_retention() {
        let history = History::builder("sqlite::memory:")
            .keep_for(std::time::Duration::from_secs(3600))
            .connect()
            .await
            .unwrap();
        let long_ago = Utc::now() - chrono::Duration::hours(2);
        let (done, pending, recent) = (new_request_id(), new_request_id(), new_request_id());
        for (id, at) in [
            (&done, long_ago),
            (&pending, long_ago),
            (&recent, Utc::now()),
        ] {
            history
                .insert_request(id, "s", None, RequestAction::StepDown, "ops", at)
                .await
                .unwrap();
        }
        for id in [&done, &recent] {
            assert!(
                history
                    .claim_request(id, "r1", Utc::now(), Some("ok"))
                    .await
                    .unwrap()
            );
        }
        history.prune("s", Utc::now()).await.unwrap();
        assert!(history.request("s", &done).await.unwrap().is_none());
        assert!(history.request("s", &pending).await.unwrap().is_some());
        assert!(history.request("s", &recent).await.unwrap().is_some());
    }

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
            .publish_jobs("s", "r1", &[definition("* * * * *")])
            .await
            .unwrap();
        history
            .publish_jobs("s", "r2", &[definition("0 * * * *")])
            .await
            .unwrap();
        let jobs = history.job_definitions("s").await.unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(
            (jobs[0].schedule.as_str(), jobs[0].updated_by.as_str()),
            ("0 * * * *", "r2")
        );
        assert_eq!(jobs[0].timeout_ms, Some(1500));
        assert_eq!(jobs[0].dst.as_deref(), Some("skip/twice"));
        assert!(history.job_definition("s", "b").await.unwrap().is_none());
        assert!(history.job_definitions("t").await.unwrap().is_empty());
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
        let old = history.job_definition("s", "old").await.unwrap().unwrap();
        assert_eq!(old.dst, None);
        assert_eq!(old.schedule, "30 1 * * *");
    }
}
