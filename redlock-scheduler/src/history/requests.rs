//! Operators' requests (trigger, cancel, step down), which admin tools write without the
//! jobs' code and the leader carries out: who asked, who took it, and the result.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::Db;
use super::HistoryError as Error;
use super::{Shared, from_ms, ms};
use crate::request::{Request, RequestAction, state_of};

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

/// A new request id: 128 random bits, in hex.
pub(crate) fn new_request_id() -> String {
    format!("{:032x}", random_u128())
}

/// 128 random bits from the thread's CSPRNG.
#[cfg(not(feature = "sim"))]
fn random_u128() -> u128 {
    use rand::RngExt;
    rand::rng().random()
}

/// 128 random bits from core's random source, which a simulation seeds.
#[cfg(feature = "sim")]
fn random_u128() -> u128 {
    redlock_core::sim::random_u128()
}

/// The requests table.
#[derive(Clone, Copy)]
pub(crate) struct Requests<'a> {
    pub(super) shared: &'a Shared,
}

impl Requests<'_> {
    /// Records a new request.
    pub(crate) async fn insert_request(
        self,
        id: &str,
        scheduler: &str,
        job: Option<&str>,
        action: RequestAction,
        requested_by: &str,
        at: DateTime<Utc>,
    ) -> Result<(), Error> {
        const RECORD: &str = "record a request";
        if let Some(answer) = self
            .shared
            .in_memory(RECORD, |t| {
                t.requests
                    .insert(id, scheduler, job, action, requested_by, at)
            })
            .await
        {
            // The id is the key: the SQL store refuses a second request under it.
            return match answer? {
                true => Ok(()),
                false => Err(super::memory::failed(RECORD, "a request has this id")),
            };
        }
        let sql = format!(
            "INSERT INTO {} (id, scheduler, job, action, requested_ms, requested_by)
             VALUES ($1, $2, $3, $4, $5, $6)",
            self.shared.tables.requests
        );
        self.shared
            .bounded(
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
    pub(crate) async fn request(self, scheduler: &str, id: &str) -> Result<Option<Request>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read a request", |t| t.requests.request(scheduler, id))
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {REQUEST_COLUMNS} FROM {} WHERE id = $1 AND scheduler = $2",
            self.shared.tables.requests
        );
        let row = self
            .shared
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
    pub(crate) async fn pending_requests(self, scheduler: &str) -> Result<Vec<Request>, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("read the pending requests", |t| {
                t.requests.pending(scheduler)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "SELECT {REQUEST_COLUMNS} FROM {} WHERE scheduler = $1 AND done_ms IS NULL
             ORDER BY requested_ms, id LIMIT 100",
            self.shared.tables.requests
        );
        let rows = self
            .shared
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
        self,
        id: &str,
        by: &str,
        at: DateTime<Utc>,
        result: Option<&str>,
    ) -> Result<bool, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("claim a request", |t| t.requests.claim(id, by, at, result))
            .await
        {
            return answer;
        }
        let sql = format!(
            "UPDATE {} SET done_ms = $1, done_by = $2, result = $3
             WHERE id = $4 AND done_ms IS NULL",
            self.shared.tables.requests
        );
        let done = self
            .shared
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
    pub(crate) async fn finish_request(self, id: &str, result: &str) -> Result<(), Error> {
        if let Some(answer) = self
            .shared
            .in_memory("record a request's result", |t| {
                t.requests.finish(id, result)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "UPDATE {} SET result = $1 WHERE id = $2",
            self.shared.tables.requests
        );
        self.shared
            .bounded(
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
        self,
        scheduler: &str,
        cutoff: DateTime<Utc>,
    ) -> Result<u64, Error> {
        if let Some(answer) = self
            .shared
            .in_memory("prune the requests", |t| {
                t.requests.prune(scheduler, cutoff)
            })
            .await
        {
            return answer;
        }
        let sql = format!(
            "DELETE FROM {} WHERE scheduler = $1 AND done_ms IS NOT NULL AND requested_ms < $2",
            self.shared.tables.requests
        );
        Ok(self
            .shared
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
    use crate::History;
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
        let requests = history.requests();
        let id = new_request_id();
        requests
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
        let pending = requests.pending_requests("s").await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].state, RequestState::Pending);
        assert!(requests.pending_requests("other").await.unwrap().is_empty());
        assert!(
            requests
                .claim_request(&id, "r1", Utc::now(), None)
                .await
                .unwrap()
        );
        assert!(
            !requests
                .claim_request(&id, "r2", Utc::now(), None)
                .await
                .unwrap()
        );
        let taken = requests.request("s", &id).await.unwrap().unwrap();
        assert_eq!(
            (taken.state, taken.done_by.as_deref()),
            (RequestState::Executing, Some("r1"))
        );
        requests.finish_request(&id, "ok: tick x").await.unwrap();
        let done = requests.request("s", &id).await.unwrap().unwrap();
        assert!(done.is_done());
        assert_eq!(done.state, RequestState::Succeeded);
        assert!(requests.pending_requests("s").await.unwrap().is_empty());
        assert!(requests.request("other", &id).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn done_requests_go_with_the_age_retention() {
        let history = History::builder("sqlite::memory:")
            .keep_for(std::time::Duration::from_secs(3600))
            .connect()
            .await
            .unwrap();
        let requests = history.requests();
        let long_ago = Utc::now() - chrono::Duration::hours(2);
        let (done, pending, recent) = (new_request_id(), new_request_id(), new_request_id());
        for (id, at) in [
            (&done, long_ago),
            (&pending, long_ago),
            (&recent, Utc::now()),
        ] {
            requests
                .insert_request(id, "s", None, RequestAction::StepDown, "ops", at)
                .await
                .unwrap();
        }
        for id in [&done, &recent] {
            assert!(
                requests
                    .claim_request(id, "r1", Utc::now(), Some("ok"))
                    .await
                    .unwrap()
            );
        }
        history.prune("s", Utc::now()).await.unwrap();
        assert!(requests.request("s", &done).await.unwrap().is_none());
        assert!(requests.request("s", &pending).await.unwrap().is_some());
        assert!(requests.request("s", &recent).await.unwrap().is_some());
    }
}
