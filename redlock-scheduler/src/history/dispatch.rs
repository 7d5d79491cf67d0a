//! Runs spread over the replicas, as the history database carries them: each replica's
//! presence (alive, capacity, runs going) and the ticks the leader hands to a replica.
//!
//! A hand-off is one row per tick, keyed like the tick's run row. The replica it names
//! takes it by deleting it (`DELETE ... WHERE replica = me`); the leader moves it to
//! another replica by updating it where it still names the one it named
//! (`UPDATE ... WHERE replica = old AND dispatched_ms = then`). Both are single-row
//! compare-and-set statements, so a hand-off is taken by one replica at most, or moved,
//! never both.

use chrono::{DateTime, Utc};
use sqlx::Row as _;

use super::{Db, Error, Outcome, RUN_COLUMNS, Shared, from_ms, ms, token};

/// A replica as it last said it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Presence {
    pub(crate) instance: String,
    /// Runs it takes at once; `None`: no limit.
    pub(crate) capacity: Option<u32>,
    /// Runs it had going, those about to start included.
    pub(crate) running: u32,
    /// When the newest hand-off it had picked up was made (the leader's clock, Unix
    /// ms): the leader counts those made later on top of `running`.
    pub(crate) polled_ms: i64,
    /// A digest of the names of the jobs it declares.
    pub(crate) jobs_digest: String,
    /// When it said so (its own clock).
    pub(crate) seen: DateTime<Utc>,
}

/// A tick handed to a replica and not taken yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handoff {
    pub(crate) job: String,
    pub(crate) tick: DateTime<Utc>,
    /// The replica that is to run it.
    pub(crate) replica: String,
    /// The leadership token the run carries.
    pub(crate) token: u64,
    /// When it was handed over (the leader's clock): the compare-and-set's version.
    pub(crate) dispatched_ms: i64,
    /// The replica that said it cannot run it (at its capacity, or it lacks the job).
    pub(crate) declined_by: Option<String>,
}

const HANDOFF_COLUMNS: &str = "job, tick_ms, replica, fencing_token, dispatched_ms, declined_by";

fn handoff_from_row(row: &sqlx::any::AnyRow) -> Result<Handoff, Error> {
    Ok(Handoff {
        job: row.try_get("job").db()?,
        tick: from_ms(row.try_get("tick_ms").db()?),
        replica: row.try_get("replica").db()?,
        token: u64::try_from(row.try_get::<i64, _>("fencing_token").db()?).unwrap_or(0),
        dispatched_ms: row.try_get("dispatched_ms").db()?,
        declined_by: row.try_get("declined_by").db()?,
    })
}

/// The replicas and hand-offs tables.
#[derive(Clone, Copy)]
pub(crate) struct Dispatch<'a> {
    pub(super) shared: &'a Shared,
}

impl Dispatch<'_> {
    /// Says that `presence.instance` of `scheduler` is alive, as `presence` says.
    pub(crate) async fn beat(self, scheduler: &str, presence: &Presence) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("say the replica is alive", |t| {
                t.replicas.beat(scheduler, presence)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "INSERT INTO {} (scheduler, instance, capacity, running, polled_ms, jobs_digest,
                             seen_ms, handlers)
             VALUES ($1, $2, $3, $4, $5, $6, $7, '')
             ON CONFLICT (scheduler, instance) DO UPDATE
             SET capacity = excluded.capacity, running = excluded.running,
                 polled_ms = excluded.polled_ms, jobs_digest = excluded.jobs_digest,
                 seen_ms = excluded.seen_ms",
            self.shared.tables.replicas
        );
        self.shared
            .bounded(
                "say the replica is alive",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(presence.instance.as_str())
                    .bind(presence.capacity.map(i64::from))
                    .bind(i64::from(presence.running))
                    .bind(presence.polled_ms)
                    .bind(presence.jobs_digest.as_str())
                    .bind(ms(presence.seen))
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(())
    }

    /// Writes the names of the handlers registered on `instance` (a JSON array) beside
    /// its beat: a beat writes an empty list for a replica new to the table (its
    /// handlers unknown yet), and leaves them as they are otherwise.
    pub(crate) async fn say_handlers(
        self,
        scheduler: &str,
        instance: &str,
        handlers: &str,
    ) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("say the replica's handlers", |t| {
                t.replicas.say_handlers(scheduler, instance, handlers)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "UPDATE {} SET handlers = $3 WHERE scheduler = $1 AND instance = $2",
            self.shared.tables.replicas
        );
        self.shared
            .bounded(
                "say the replica's handlers",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(instance)
                    .bind(handlers)
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(())
    }

    /// The replicas of `scheduler` seen at `since` or later whose beats name no
    /// handlers: a version that does not apply job changes.
    pub(crate) async fn replicas_without_changes(
        self,
        scheduler: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<String>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the replicas without changes", |t| {
                t.replicas.replicas_without_changes(scheduler, since)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT instance FROM {} WHERE scheduler = $1 AND seen_ms >= $2 AND handlers IS NULL
             ORDER BY instance",
            self.shared.tables.replicas
        );
        self.shared
            .bounded(
                "read the replicas",
                sqlx::query_scalar(&sql)
                    .bind(scheduler)
                    .bind(ms(since))
                    .fetch_all(&self.shared.pool),
            )
            .await
    }

    /// Whether a replica of `scheduler` seen at `since` or later registered the handler
    /// `handler`: `None` if no replica was seen then.
    pub(crate) async fn handler_registered(
        self,
        scheduler: &str,
        handler: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<bool>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the replicas' handlers", |t| {
                t.replicas.handler_registered(scheduler, handler, since)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT handlers FROM {} WHERE scheduler = $1 AND seen_ms >= $2",
            self.shared.tables.replicas
        );
        let lists: Vec<Option<String>> = self
            .shared
            .bounded(
                "read the replicas' handlers",
                sqlx::query_scalar(&sql)
                    .bind(scheduler)
                    .bind(ms(since))
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        if lists.is_empty() {
            return Ok(None);
        }
        Ok(Some(lists.iter().flatten().any(|list| {
            serde_json::from_str::<Vec<String>>(list)
                .is_ok_and(|names| names.iter().any(|name| name == handler))
        })))
    }

    /// Takes `instance` out of the replicas that runs are handed to (it stops).
    pub(crate) async fn leave(self, scheduler: &str, instance: &str) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("take the replica out", |t| {
                t.replicas.leave(scheduler, instance)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "DELETE FROM {} WHERE scheduler = $1 AND instance = $2",
            self.shared.tables.replicas
        );
        self.shared
            .bounded(
                "take the replica out",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(instance)
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(())
    }

    /// The replicas of `scheduler` that said they were alive at `since` or later; those
    /// silent since before `forget` are deleted.
    pub(crate) async fn replicas(
        self,
        scheduler: &str,
        since: DateTime<Utc>,
        forget: DateTime<Utc>,
    ) -> Result<Vec<Presence>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the replicas", |t| {
                t.replicas.replicas(scheduler, since, forget)
            })
            .await
        {
            return answer;
        }
        let table = &self.shared.tables.replicas;
        let forget_sql = format!("DELETE FROM {table} WHERE scheduler = $1 AND seen_ms < $2");
        let sql = format!(
            "SELECT instance, capacity, running, polled_ms, jobs_digest, seen_ms FROM {table}
             WHERE scheduler = $1 AND seen_ms >= $2 ORDER BY instance"
        );
        let pool = &self.shared.pool;
        let rows = self
            .shared
            .bounded("read the replicas", async {
                sqlx::query(&forget_sql)
                    .bind(scheduler)
                    .bind(ms(forget))
                    .execute(pool)
                    .await?;
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(ms(since))
                    .fetch_all(pool)
                    .await
            })
            .await?;
        rows.iter()
            .map(|row| {
                Ok(Presence {
                    instance: row.try_get("instance").db()?,
                    capacity: row
                        .try_get::<Option<i64>, _>("capacity")
                        .db()?
                        .map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
                    running: u32::try_from(row.try_get::<i64, _>("running").db()?).unwrap_or(0),
                    polled_ms: row.try_get("polled_ms").db()?,
                    jobs_digest: row.try_get("jobs_digest").db()?,
                    seen: from_ms(row.try_get("seen_ms").db()?),
                })
            })
            .collect()
    }

    /// Hands `tick` of `job` to `replica`: `false` if it was handed to someone already.
    #[allow(clippy::too_many_arguments)] // one row's columns
    pub(crate) async fn hand_off(
        self,
        scheduler: &str,
        job: &str,
        tick: DateTime<Utc>,
        replica: &str,
        run_token: u64,
        now: DateTime<Utc>,
    ) -> Result<bool, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("hand a tick over", |t| {
                t.handoffs
                    .hand_off(scheduler, job, tick, replica, run_token, now)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "INSERT INTO {} (scheduler, {HANDOFF_COLUMNS})
             VALUES ($1, $2, $3, $4, $5, $6, NULL)
             ON CONFLICT (scheduler, job, tick_ms) DO NOTHING",
            self.shared.tables.dispatch
        );
        let done = self
            .shared
            .bounded(
                "hand a tick over",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(job)
                    .bind(ms(tick))
                    .bind(replica)
                    .bind(token(run_token))
                    .bind(ms(now))
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The ticks handed to `replica` that it has neither taken nor declined.
    pub(crate) async fn handed_to(
        self,
        scheduler: &str,
        replica: &str,
    ) -> Result<Vec<Handoff>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the ticks handed over", |t| {
                t.handoffs.handed_to(scheduler, replica)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {HANDOFF_COLUMNS} FROM {} WHERE scheduler = $1 AND replica = $2
             AND declined_by IS NULL ORDER BY tick_ms LIMIT 1000",
            self.shared.tables.dispatch
        );
        let rows = self
            .shared
            .bounded(
                "read the ticks handed over",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(replica)
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(handoff_from_row).collect()
    }

    /// Takes `handoff` for the replica it names and records its tick, in one
    /// transaction: deletes the hand-off where it still names that replica (and was not
    /// declined) and inserts the tick's row (`running` from `at`, or `skipped` with
    /// `note`). `true` if both were done (then only this caller acts on the tick); a
    /// replica that dies before the commit leaves the hand-off for the leader to move.
    pub(crate) async fn take_handoff(
        self,
        scheduler: &str,
        handoff: &Handoff,
        outcome: Outcome,
        note: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<bool, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("take a tick handed over", |t| {
                t.take_handoff(scheduler, handoff, outcome, note, at)
            })
            .await
        {
            return answer;
        }
        let take = format!(
            "DELETE FROM {} WHERE scheduler = $1 AND job = $2 AND tick_ms = $3
             AND replica = $4 AND dispatched_ms = $5 AND declined_by IS NULL",
            self.shared.tables.dispatch
        );
        let record = format!(
            "INSERT INTO {} ({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, NULL)
             ON CONFLICT (scheduler, job, tick_ms) DO NOTHING",
            self.shared.tables.runs
        );
        let (started, finished) = match outcome {
            Outcome::Running => (Some(ms(at)), None),
            _ => (None, Some(ms(at))),
        };
        let pool = &self.shared.pool;
        self.shared
            .bounded("take a tick handed over", async {
                let mut tx = pool.begin().await?;
                let taken = sqlx::query(&take)
                    .bind(scheduler)
                    .bind(handoff.job.as_str())
                    .bind(ms(handoff.tick))
                    .bind(handoff.replica.as_str())
                    .bind(handoff.dispatched_ms)
                    .execute(&mut *tx)
                    .await?;
                if taken.rows_affected() != 1 {
                    tx.rollback().await?;
                    return Ok(false);
                }
                let recorded = sqlx::query(&record)
                    .bind(scheduler)
                    .bind(handoff.job.as_str())
                    .bind(ms(handoff.tick))
                    .bind(handoff.replica.as_str())
                    .bind(token(handoff.token))
                    .bind(started)
                    .bind(finished)
                    .bind(outcome.as_str())
                    .bind(note)
                    .execute(&mut *tx)
                    .await?;
                // A row already there: the tick is someone else's (the hand-off goes).
                tx.commit().await?;
                Ok::<_, sqlx::Error>(recorded.rows_affected() == 1)
            })
            .await
    }

    /// Gives `handoff` back to the leader: the replica it names will not run it.
    pub(crate) async fn decline_handoff(
        self,
        scheduler: &str,
        handoff: &Handoff,
    ) -> Result<bool, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("decline a tick handed over", |t| {
                t.handoffs.decline(scheduler, handoff)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "UPDATE {} SET declined_by = $1 WHERE scheduler = $2 AND job = $3
             AND tick_ms = $4 AND replica = $1 AND dispatched_ms = $5 AND declined_by IS NULL",
            self.shared.tables.dispatch
        );
        let done = self
            .shared
            .bounded(
                "decline a tick handed over",
                sqlx::query(&sql)
                    .bind(handoff.replica.as_str())
                    .bind(scheduler)
                    .bind(handoff.job.as_str())
                    .bind(ms(handoff.tick))
                    .bind(handoff.dispatched_ms)
                    .execute(&self.shared.pool),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The hand-offs of `scheduler` the leader must look at again: declined, or handed
    /// over (and due) before `before` and still not taken.
    pub(crate) async fn stale_handoffs(
        self,
        scheduler: &str,
        before: DateTime<Utc>,
    ) -> Result<Vec<Handoff>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the stale hand-offs", |t| {
                t.handoffs.stale(scheduler, before)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {HANDOFF_COLUMNS} FROM {} WHERE scheduler = $1
             AND (declined_by IS NOT NULL OR (tick_ms < $2 AND dispatched_ms < $2))
             ORDER BY tick_ms LIMIT 1000",
            self.shared.tables.dispatch
        );
        let rows = self
            .shared
            .bounded(
                "read the ticks not taken",
                sqlx::query(&sql)
                    .bind(scheduler)
                    .bind(ms(before))
                    .fetch_all(&self.shared.pool),
            )
            .await?;
        rows.iter().map(handoff_from_row).collect()
    }

    /// Moves `handoff` to `replica`, with the leadership token `run_token` (`None`:
    /// deletes it, for the leader to record as not run), if it is still as it was read:
    /// `true` if moved.
    pub(crate) async fn move_handoff(
        self,
        scheduler: &str,
        handoff: &Handoff,
        replica: Option<&str>,
        run_token: u64,
        now: DateTime<Utc>,
    ) -> Result<bool, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("move a tick handed over", |t| {
                t.handoffs
                    .move_to(scheduler, handoff, replica, run_token, now)
            })
            .await
        {
            return answer;
        }
        let table = &self.shared.tables.dispatch;
        let guard = "scheduler = $1 AND job = $2 AND tick_ms = $3 AND replica = $4 \
                     AND dispatched_ms = $5";
        let query = match replica {
            Some(_) => format!(
                "UPDATE {table} SET replica = $6, dispatched_ms = $7, fencing_token = $8,
                 declined_by = NULL WHERE {guard}"
            ),
            None => format!("DELETE FROM {table} WHERE {guard}"),
        };
        let mut query = sqlx::query(&query)
            .bind(scheduler)
            .bind(handoff.job.as_str())
            .bind(ms(handoff.tick))
            .bind(handoff.replica.as_str())
            .bind(handoff.dispatched_ms);
        if let Some(replica) = replica {
            // Strictly later than the version read, so the move is a new version.
            query = query
                .bind(replica)
                .bind(ms(now).max(handoff.dispatched_ms.saturating_add(1)))
                .bind(token(run_token));
        }
        let done = self
            .shared
            .bounded("move a tick handed over", query.execute(&self.shared.pool))
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
