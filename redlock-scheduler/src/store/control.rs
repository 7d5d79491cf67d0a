//! What the scheduler keeps beside its runs: the leader last recorded, and paused jobs.

use chrono::Utc;

use super::{History, ms, token};
use crate::error::Error;

impl History {
    /// Records that `instance` leads `scheduler` with `epoch` (ignored if a newer epoch
    /// is already recorded).
    pub(crate) async fn record_leader(
        &self,
        scheduler: &str,
        instance: &str,
        epoch: u64,
    ) -> Result<(), Error> {
        let sql = format!(
            "INSERT INTO {leaders} (scheduler, instance, epoch, since_ms)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (scheduler) DO UPDATE
             SET instance = excluded.instance, epoch = excluded.epoch, since_ms = excluded.since_ms
             WHERE {leaders_bare}.epoch < excluded.epoch",
            leaders = self.shared.tables.leaders,
            leaders_bare = self
                .shared
                .tables
                .leaders
                .rsplit('.')
                .next()
                .unwrap_or_default(),
        );
        self.bounded(
            "record the leader",
            sqlx::query(&sql)
                .bind(scheduler)
                .bind(instance)
                .bind(token(epoch))
                .bind(ms(Utc::now()))
                .execute(&self.shared.pool),
        )
        .await?;
        Ok(())
    }

    /// The replica last recorded as leading `scheduler`.
    pub(crate) async fn leader(&self, scheduler: &str) -> Result<Option<String>, Error> {
        let sql = format!(
            "SELECT instance FROM {} WHERE scheduler = $1",
            self.shared.tables.leaders
        );
        self.bounded(
            "read the leader",
            sqlx::query_scalar(&sql)
                .bind(scheduler)
                .fetch_optional(&self.shared.pool),
        )
        .await
    }

    /// Marks `job` paused (or not) for every replica of `scheduler`.
    pub(crate) async fn set_paused(
        &self,
        scheduler: &str,
        job: &str,
        paused: bool,
    ) -> Result<(), Error> {
        let pauses = &self.shared.tables.pauses;
        let sql = if paused {
            format!(
                "INSERT INTO {pauses} (scheduler, job) VALUES ($1, $2)
                 ON CONFLICT (scheduler, job) DO NOTHING"
            )
        } else {
            format!("DELETE FROM {pauses} WHERE scheduler = $1 AND job = $2")
        };
        self.bounded(
            "pause",
            sqlx::query(&sql)
                .bind(scheduler)
                .bind(job)
                .execute(&self.shared.pool),
        )
        .await?;
        Ok(())
    }

    /// The jobs of `scheduler` paused for every replica.
    pub(crate) async fn paused_jobs(&self, scheduler: &str) -> Result<Vec<String>, Error> {
        let sql = format!(
            "SELECT job FROM {} WHERE scheduler = $1",
            self.shared.tables.pauses
        );
        self.bounded(
            "read pauses",
            sqlx::query_scalar(&sql)
                .bind(scheduler)
                .fetch_all(&self.shared.pool),
        )
        .await
    }
}
