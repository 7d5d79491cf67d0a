//! The leaders and pauses tables in memory, each statement a method that does what
//! [`Control`](super::super::Control)'s SQL does.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::super::{LeaderRecord, from_ms, ms, token};

/// The leader's row of one scheduler.
#[derive(Debug, Clone)]
struct LeaderRow {
    instance: String,
    epoch: i64,
    since_ms: i64,
    expires_ms: i64,
    ended_ms: Option<i64>,
}

/// The leaders table: scheduler to its row.
#[derive(Debug, Default)]
pub(in super::super) struct Leaders {
    rows: BTreeMap<String, LeaderRow>,
}

impl Leaders {
    /// [`Control::record_leader`](super::super::Control::record_leader): ignored if a
    /// newer epoch is recorded, or if this epoch's leadership was recorded as ended.
    pub(in super::super) fn record(
        &mut self,
        scheduler: &str,
        instance: &str,
        epoch: u64,
        since: DateTime<Utc>,
        expires: DateTime<Utc>,
    ) {
        let epoch = token(epoch);
        let newer = self
            .rows
            .get(scheduler)
            .is_none_or(|row| row.epoch < epoch || (row.epoch == epoch && row.ended_ms.is_none()));
        if newer {
            let row = LeaderRow {
                instance: instance.to_owned(),
                epoch,
                since_ms: ms(since),
                expires_ms: ms(expires),
                ended_ms: None,
            };
            self.rows.insert(scheduler.to_owned(), row);
        }
    }

    /// [`Control::end_leadership`](super::super::Control::end_leadership).
    pub(in super::super) fn end(&mut self, scheduler: &str, epoch: u64, at: DateTime<Utc>) {
        let epoch = token(epoch);
        if let Some(row) = self.rows.get_mut(scheduler)
            && row.epoch == epoch
            && row.ended_ms.is_none()
        {
            row.ended_ms = Some(ms(at));
        }
    }

    /// [`Control::leader_record`](super::super::Control::leader_record).
    pub(in super::super) fn record_of(&self, scheduler: &str) -> Option<LeaderRecord> {
        self.rows.get(scheduler).map(|row| LeaderRecord {
            instance: row.instance.clone(),
            epoch: u64::try_from(row.epoch).unwrap_or(0),
            since: from_ms(row.since_ms),
            expires: Some(from_ms(row.expires_ms)),
            ended: row.ended_ms.map(from_ms),
        })
    }
}

/// The pauses table: (scheduler, job) for each job paused.
#[derive(Debug, Default)]
pub(in super::super) struct Pauses {
    rows: BTreeSet<(String, String)>,
}

impl Pauses {
    /// [`Control::set_paused`](super::super::Control::set_paused).
    pub(in super::super) fn set(&mut self, scheduler: &str, job: &str, paused: bool) {
        let key = (scheduler.to_owned(), job.to_owned());
        if paused {
            self.rows.insert(key);
        } else {
            self.rows.remove(&key);
        }
    }

    /// [`Control::paused_jobs`](super::super::Control::paused_jobs), by name.
    pub(in super::super) fn paused(&self, scheduler: &str) -> Vec<String> {
        self.rows
            .iter()
            .filter(|(s, _)| s == scheduler)
            .map(|(_, job)| job.clone())
            .collect()
    }
}
