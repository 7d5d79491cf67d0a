//! What the scheduler keeps beside its runs: the leader last recorded (with the lease it
//! renews while it leads, and when its leadership ended), and paused jobs.

use chrono::{DateTime, Utc};

use super::HistoryError as Error;
use super::{Shared, from_ms, ms, token};

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

/// The leaders and pauses tables.
#[derive(Clone, Copy)]
pub(crate) struct Control<'a> {
    pub(super) shared: &'a Shared,
}

impl Control<'_> {
    /// Records that `instance` leads `scheduler` with `epoch` since `since`, its record
    /// holding until `expires` unless renewed: the same call, made again while it leads,
    /// renews it. Ignored if a newer epoch is recorded, or if this epoch's leadership
    /// was recorded as ended.
    pub(crate) async fn record_leader(
        self,
        scheduler: &str,
        instance: &str,
        epoch: u64,
        since: DateTime<Utc>,
        expires: DateTime<Utc>,
    ) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("record the leader", |t| {
                t.leaders.record(scheduler, instance, epoch, since, expires)
            })
            .await
        {
            return answer;
        }
        let leaders = &self.shared.tables.leaders;
        let bare = leaders.rsplit('.').next().unwrap_or_default();
        let sql = format!(
            "INSERT INTO {leaders}
                (scheduler, instance, epoch, since_ms, lease_epoch, expires_ms, ended_ms)
             VALUES ($1, $2, $3, $4, $5, $6, NULL)
             ON CONFLICT (scheduler) DO UPDATE
             SET instance = excluded.instance, epoch = excluded.epoch,
                 since_ms = excluded.since_ms, lease_epoch = excluded.lease_epoch,
                 expires_ms = excluded.expires_ms, ended_ms = NULL
             WHERE {bare}.epoch < excluded.epoch
                OR ({bare}.epoch = excluded.epoch AND {bare}.ended_ms IS NULL)"
        );
        self.shared
            .bounded(
                "record the leader",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(instance)
                    .bind(token(epoch))
                    .bind(ms(since))
                    .bind(token(epoch))
                    .bind(ms(expires))
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(())
    }

    /// Records that the leadership of `epoch` over `scheduler` ended at `at` (stepped
    /// down, shut down, end of term, lost): the record names no leader until the next
    /// one records itself. Does nothing if another epoch is recorded, or it ended already.
    pub(crate) async fn end_leadership(
        self,
        scheduler: &str,
        epoch: u64,
        at: DateTime<Utc>,
    ) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("record the end of a leadership", |t| {
                t.leaders.end(scheduler, epoch, at)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "UPDATE {} SET ended_ms = $1
             WHERE scheduler = $2 AND epoch = $3 AND lease_epoch = $4 AND ended_ms IS NULL",
            self.shared.tables.leaders
        );
        self.shared
            .bounded(
                "record the end of a leadership",
                sqlx::query(&sql)
                    .bind(ms(at))
                    .bind(scheduler)
                    .bind(token(epoch))
                    .bind(token(epoch))
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(())
    }

    /// The replica recorded as leading `scheduler` at `now`: `None` if none ever did,
    /// its leadership ended, or its record's lease ran out (it stopped renewing it).
    pub(crate) async fn leader(
        self,
        scheduler: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<String>, Error> {
        Ok(self
            .leader_record(scheduler)
            .await?
            .filter(|record| record.is_current(now))
            .map(|record| record.instance))
    }

    /// Marks `job` paused (or not) for every replica of `scheduler`.
    pub(crate) async fn set_paused(
        self,
        scheduler: &str,
        job: &str,
        paused: bool,
    ) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("pause", |t| t.pauses.set(scheduler, job, paused))
            .await
        {
            return answer;
        }
        let pauses = &self.shared.tables.pauses;
        let sql = if paused {
            format!(
                "INSERT INTO {pauses} (scheduler, job) VALUES ($1, $2)
                 ON CONFLICT (scheduler, job) DO NOTHING"
            )
        } else {
            format!("DELETE FROM {pauses} WHERE scheduler = $1 AND job = $2")
        };
        self.shared
            .bounded(
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
    pub(crate) async fn paused_jobs(self, scheduler: &str) -> Result<Vec<String>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read pauses", |t| t.pauses.paused(scheduler))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT job FROM {} WHERE scheduler = $1",
            self.shared.tables.pauses
        );
        self.shared
            .bounded(
                "read pauses",
                sqlx::query_scalar(&sql)
                    .bind(scheduler)
                    .fetch_all(&self.shared.pool),
            )
            .await
    }

    /// The leader last recorded for `scheduler`, with its epoch, since when and its
    /// lease, whether or not its leadership goes on.
    pub(crate) async fn leader_record(
        self,
        scheduler: &str,
    ) -> Result<Option<LeaderRecord>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the leader", |t| t.leaders.record_of(scheduler))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT instance, epoch, since_ms, lease_epoch, expires_ms, ended_ms
             FROM {} WHERE scheduler = $1",
            self.shared.tables.leaders
        );
        type Columns = (String, i64, i64, Option<i64>, Option<i64>, Option<i64>);
        let row: Option<Columns> = self
            .shared
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
}
