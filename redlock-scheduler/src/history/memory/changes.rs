//! The job change log in memory, each statement a method that does what
//! [`Changes`](super::super::Changes)' SQL does: rows as the table stores them (the
//! definitions as text), read back by the same reader.

use std::collections::BTreeMap;

use super::super::NewChange;
use super::super::changes::{ChangeColumns, UnreadChange};
use crate::changes::JobChange;

/// The job changes table: (scheduler, number) to the change's columns.
#[derive(Debug, Default)]
pub(in super::super) struct ChangeLog {
    rows: BTreeMap<(String, i64), ChangeColumns>,
}

impl ChangeLog {
    /// The rows of `scheduler`, by number.
    fn of<'a>(&'a self, scheduler: &'a str) -> impl DoubleEndedIterator<Item = &'a ChangeColumns> {
        self.rows
            .iter()
            .filter(move |((s, _), _)| s == scheduler)
            .map(|(_, columns)| columns)
    }

    /// [`Changes::job_changes_after`](super::super::Changes::job_changes_after).
    pub(in super::super) fn after(
        &self,
        scheduler: &str,
        after: u64,
    ) -> Vec<Result<JobChange, UnreadChange>> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        self.of(scheduler)
            .filter(|columns| columns.seq > after)
            .map(|columns| columns.clone().read())
            .collect()
    }

    /// [`Changes::job_changes`](super::super::Changes::job_changes): newest first; the
    /// first change this version cannot read, if any, instead.
    pub(in super::super) fn latest(
        &self,
        scheduler: &str,
        job: Option<&str>,
        limit: u32,
    ) -> Result<Vec<JobChange>, UnreadChange> {
        self.of(scheduler)
            .rev()
            .filter(|columns| job.is_none_or(|job| columns.job == job))
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|columns| columns.clone().read())
            .collect()
    }

    /// [`Changes::last_job_change`](super::super::Changes::last_job_change).
    pub(in super::super) fn last(&self, scheduler: &str) -> u64 {
        self.of(scheduler)
            .next_back()
            .and_then(|columns| u64::try_from(columns.seq).ok())
            .unwrap_or(0)
    }

    /// [`Changes::insert_job_change`](super::super::Changes::insert_job_change): `false`
    /// if another change took the number.
    pub(in super::super) fn insert(&mut self, scheduler: &str, change: &NewChange<'_>) -> bool {
        let columns = ChangeColumns::of(change);
        let key = (scheduler.to_owned(), columns.seq);
        if self.rows.contains_key(&key) {
            return false;
        }
        self.rows.insert(key, columns);
        true
    }
}
