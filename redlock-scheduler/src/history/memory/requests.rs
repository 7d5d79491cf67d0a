//! The operators' requests table in memory, each statement a method that does what
//! [`Requests`](super::super::Requests)'s SQL does.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::super::{from_ms, ms};
use crate::request::{Request, RequestAction, state_of};

/// The most pending requests a read returns (its SQL's `LIMIT`).
const PENDING_READ: usize = 100;

/// A request's row.
#[derive(Debug, Clone)]
struct RequestRow {
    scheduler: String,
    job: Option<String>,
    action: RequestAction,
    requested_ms: i64,
    requested_by: String,
    done_ms: Option<i64>,
    done_by: Option<String>,
    result: Option<String>,
}

/// The requests table: id to its row.
#[derive(Debug, Default)]
pub(in super::super) struct OperatorRequests {
    rows: BTreeMap<String, RequestRow>,
}

impl OperatorRequests {
    /// [`Requests::insert_request`](super::super::Requests::insert_request): `false` if
    /// a request has this id (the SQL store refuses it: the id is the key).
    #[allow(clippy::too_many_arguments)] // one row's columns
    pub(in super::super) fn insert(
        &mut self,
        id: &str,
        scheduler: &str,
        job: Option<&str>,
        action: RequestAction,
        requested_by: &str,
        at: DateTime<Utc>,
    ) -> bool {
        if self.rows.contains_key(id) {
            return false;
        }
        let row = RequestRow {
            scheduler: scheduler.to_owned(),
            job: job.map(str::to_owned),
            action,
            requested_ms: ms(at),
            requested_by: requested_by.to_owned(),
            done_ms: None,
            done_by: None,
            result: None,
        };
        self.rows.insert(id.to_owned(), row);
        true
    }

    fn request_of(id: &str, row: &RequestRow) -> Request {
        Request {
            id: id.to_owned(),
            scheduler: row.scheduler.clone(),
            job: row.job.clone(),
            action: row.action,
            requested: from_ms(row.requested_ms),
            requested_by: row.requested_by.clone(),
            done: row.done_ms.map(from_ms),
            done_by: row.done_by.clone(),
            state: state_of(row.done_ms, row.result.as_deref()),
            result: row.result.clone(),
        }
    }

    /// [`Requests::request`](super::super::Requests::request).
    pub(in super::super) fn request(&self, scheduler: &str, id: &str) -> Option<Request> {
        self.rows
            .get(id)
            .filter(|row| row.scheduler == scheduler)
            .map(|row| Self::request_of(id, row))
    }

    /// [`Requests::pending_requests`](super::super::Requests::pending_requests): oldest
    /// first, then by id.
    pub(in super::super) fn pending(&self, scheduler: &str) -> Vec<Request> {
        let mut pending: Vec<(&String, &RequestRow)> = self
            .rows
            .iter()
            .filter(|(_, row)| row.scheduler == scheduler && row.done_ms.is_none())
            .collect();
        pending.sort_by(|(a_id, a), (b_id, b)| {
            a.requested_ms
                .cmp(&b.requested_ms)
                .then_with(|| a_id.cmp(b_id))
        });
        pending
            .into_iter()
            .take(PENDING_READ)
            .map(|(id, row)| Self::request_of(id, row))
            .collect()
    }

    /// [`Requests::claim_request`](super::super::Requests::claim_request).
    pub(in super::super) fn claim(
        &mut self,
        id: &str,
        by: &str,
        at: DateTime<Utc>,
        result: Option<&str>,
    ) -> bool {
        match self.rows.get_mut(id) {
            Some(row) if row.done_ms.is_none() => {
                row.done_ms = Some(ms(at));
                row.done_by = Some(by.to_owned());
                row.result = result.map(str::to_owned);
                true
            }
            _ => false,
        }
    }

    /// [`Requests::finish_request`](super::super::Requests::finish_request).
    pub(in super::super) fn finish(&mut self, id: &str, result: &str) {
        if let Some(row) = self.rows.get_mut(id) {
            row.result = Some(result.to_owned());
        }
    }

    /// [`Requests::prune_requests`](super::super::Requests::prune_requests): how many
    /// were deleted.
    pub(in super::super) fn prune(&mut self, scheduler: &str, cutoff: DateTime<Utc>) -> u64 {
        let cutoff = ms(cutoff);
        let before = self.rows.len();
        self.rows.retain(|_, row| {
            !(row.scheduler == scheduler && row.done_ms.is_some() && row.requested_ms < cutoff)
        });
        u64::try_from(before - self.rows.len()).unwrap_or(u64::MAX)
    }
}
