//! The runs table in memory: one row per (scheduler, job, tick), as the SQL store keeps
//! it (times to the millisecond, the fencing token as a signed 64-bit integer).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::super::{Change, NewRun, Outcome, Run, RunEnd, from_ms, ms, token};

/// A run row's key: scheduler, job, tick (Unix ms).
type Key = (String, String, i64);

/// The runs table.
#[derive(Debug, Default)]
pub(in super::super) struct RunRows {
    rows: BTreeMap<Key, Run>,
}

/// `t` as the table stores it: to the millisecond.
fn stored(t: DateTime<Utc>) -> DateTime<Utc> {
    from_ms(ms(t))
}

impl RunRows {
    /// [`History::apply`](super::super::History::apply), in one transaction: for each
    /// change, whether it took effect.
    pub(in super::super) fn apply(&mut self, changes: &[Change<'_>]) -> Vec<bool> {
        changes
            .iter()
            .map(|change| match change {
                Change::Claim(run) => self.claim(run),
                Change::Finish(end) => self.finish(end),
            })
            .collect()
    }

    /// Inserts a tick's row unless the tick has one (`ON CONFLICT DO NOTHING`).
    pub(in super::super) fn claim(&mut self, run: &NewRun<'_>) -> bool {
        let key = (run.scheduler.to_owned(), run.job.to_owned(), ms(run.tick));
        if self.rows.contains_key(&key) {
            return false;
        }
        let at = stored(run.at);
        let (started, finished) = match run.outcome {
            Outcome::Running => (Some(at), None),
            _ => (None, Some(at)),
        };
        let row = Run {
            scheduler: run.scheduler.to_owned(),
            job: run.job.to_owned(),
            tick: stored(run.tick),
            instance: run.instance.to_owned(),
            fencing_token: u64::try_from(token(run.token)).ok(),
            started,
            finished,
            outcome: run.outcome,
            error: run.note.map(str::to_owned),
            manual: run.manual,
            closed_by: None,
        };
        self.rows.insert(key, row);
        true
    }

    /// Records how a run of the instance that claimed it ended; an outcome other than
    /// `succeeded` does not overwrite a `succeeded` row.
    fn finish(&mut self, end: &RunEnd<'_>) -> bool {
        let key = (end.scheduler.to_owned(), end.job.to_owned(), ms(end.tick));
        let Some(row) = self.rows.get_mut(&key) else {
            return false;
        };
        if row.instance != end.instance
            || (end.outcome != Outcome::Succeeded && row.outcome == Outcome::Succeeded)
        {
            return false;
        }
        row.finished = Some(stored(end.at));
        row.outcome = end.outcome;
        row.error = end.error.map(str::to_owned);
        row.closed_by = None;
        true
    }

    /// [`History::run_at`](super::super::History::run_at).
    pub(in super::super) fn run_at(
        &self,
        scheduler: &str,
        job: &str,
        tick: DateTime<Utc>,
    ) -> Option<Run> {
        let key = (scheduler.to_owned(), job.to_owned(), ms(tick));
        self.rows.get(&key).cloned()
    }
}
