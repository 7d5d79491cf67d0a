//! The runs table in memory: one row per (scheduler, job, tick), as the SQL store keeps
//! it (times to the millisecond, the fencing token as a signed 64-bit integer).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};

use super::super::{Change, NewRun, Outcome, Run, RunEnd, RunFilter, RunKey, from_ms, ms, token};

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

    /// A run's commit marks its row succeeded: where it is still that instance's
    /// `running` row, or inserted if missing. `dry`: only whether it would.
    pub(in super::super) fn succeed(
        &mut self,
        run: RunKey<'_>,
        at: DateTime<Utc>,
        dry: bool,
    ) -> bool {
        let key = (run.scheduler.to_owned(), run.job.to_owned(), ms(run.tick));
        match self.rows.get_mut(&key) {
            Some(row) if row.instance == run.instance && row.outcome == Outcome::Running => {
                if !dry {
                    row.outcome = Outcome::Succeeded;
                    row.finished = Some(stored(at));
                    row.error = None;
                }
                true
            }
            Some(_) => false,
            None => {
                if !dry {
                    let row = Run {
                        scheduler: run.scheduler.to_owned(),
                        job: run.job.to_owned(),
                        tick: stored(run.tick),
                        instance: run.instance.to_owned(),
                        fencing_token: u64::try_from(token(run.token)).ok(),
                        started: Some(stored(run.started)),
                        finished: Some(stored(at)),
                        outcome: Outcome::Succeeded,
                        error: None,
                        manual: run.manual,
                        closed_by: None,
                    };
                    self.rows.insert(key, row);
                }
                true
            }
        }
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

    /// The rows of `scheduler`, by job then tick.
    fn of<'a>(&'a self, scheduler: &'a str) -> impl DoubleEndedIterator<Item = &'a Run> {
        self.rows
            .iter()
            .filter(move |((s, _, _), _)| s == scheduler)
            .map(|(_, run)| run)
    }

    /// [`History::last_tick`](super::super::History::last_tick).
    pub(in super::super) fn last_tick(&self, scheduler: &str, job: &str) -> Option<DateTime<Utc>> {
        self.of(scheduler)
            .filter(|run| run.job == job && !run.manual)
            .map(|run| run.tick)
            .max()
    }

    /// [`History::last_ticks`](super::super::History::last_ticks).
    pub(in super::super) fn last_ticks(&self, scheduler: &str) -> HashMap<String, DateTime<Utc>> {
        let mut last = HashMap::new();
        for run in self.of(scheduler).filter(|run| !run.manual) {
            last.insert(run.job.clone(), run.tick); // by tick: the last one stays
        }
        last
    }

    /// [`History::runs`](super::super::History::runs): newest first.
    pub(in super::super) fn runs(&self, scheduler: &str, job: &str, limit: u32) -> Vec<Run> {
        self.of(scheduler)
            .rev()
            .filter(|run| run.job == job)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .cloned()
            .collect()
    }

    /// [`History::runs_between`](super::super::History::runs_between): oldest first,
    /// then by job.
    pub(in super::super) fn between(
        &self,
        scheduler: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Vec<Run> {
        let (from, to) = (ms(from), ms(to));
        let mut runs: Vec<Run> = self
            .of(scheduler)
            .filter(|run| (from..=to).contains(&ms(run.tick)))
            .cloned()
            .collect();
        runs.sort_by(|a, b| a.tick.cmp(&b.tick).then_with(|| a.job.cmp(&b.job)));
        runs
    }

    /// [`History::running`](super::super::History::running): by tick, at most 1000.
    pub(in super::super) fn running(&self, scheduler: &str) -> Vec<Run> {
        let mut running: Vec<Run> = self
            .of(scheduler)
            .filter(|run| run.outcome == Outcome::Running)
            .cloned()
            .collect();
        running.sort_by(|a, b| a.tick.cmp(&b.tick).then_with(|| a.job.cmp(&b.job)));
        running.truncate(1000);
        running
    }

    /// [`History::claimant`](super::super::History::claimant).
    pub(in super::super) fn claimant(
        &self,
        scheduler: &str,
        job: &str,
        tick: DateTime<Utc>,
    ) -> Option<(String, Option<u64>)> {
        self.run_at(scheduler, job, tick)
            .map(|run| (run.instance, run.fencing_token))
    }

    /// [`History::abandon`](super::super::History::abandon): `false` if the row is not
    /// that instance's, or not running.
    pub(in super::super) fn abandon(
        &mut self,
        run: &Run,
        closed_by: &str,
        reason: &str,
        at: DateTime<Utc>,
    ) -> bool {
        let key = (run.scheduler.clone(), run.job.clone(), ms(run.tick));
        match self.rows.get_mut(&key) {
            Some(row) if row.instance == run.instance && row.outcome == Outcome::Running => {
                row.outcome = Outcome::Abandoned;
                row.finished = Some(stored(at));
                row.error = Some(reason.to_owned());
                row.closed_by = Some(closed_by.to_owned());
                true
            }
            _ => false,
        }
    }

    /// [`History::query_runs`](super::super::History::query_runs): newest tick first,
    /// then by job.
    pub(in super::super) fn query(&self, scheduler: &str, filter: &RunFilter) -> Vec<Run> {
        let mut runs: Vec<Run> = self
            .of(scheduler)
            .filter(|run| filter.selects(run))
            .cloned()
            .collect();
        runs.sort_by(|a, b| b.tick.cmp(&a.tick).then_with(|| a.job.cmp(&b.job)));
        runs.truncate(usize::try_from(filter.limit_or_default()).unwrap_or(usize::MAX));
        runs
    }

    /// [`History::last_runs`](super::super::History::last_runs): the latest row of each
    /// job, by job.
    pub(in super::super) fn last_runs(&self, scheduler: &str) -> Vec<Run> {
        let mut last: BTreeMap<&str, &Run> = BTreeMap::new();
        for run in self.of(scheduler) {
            last.insert(&run.job, run); // by tick within a job: the last one stays
        }
        last.into_values().cloned().collect()
    }

    /// [`History::prune`](super::super::History::prune)'s rows: those finished, ticked
    /// before `cutoff` (if given) and not the latest of their job, and those finished
    /// with `keep` (if given) later rows of their job or more; either way never the
    /// latest scheduled row of a job. How many went.
    pub(in super::super) fn prune(
        &mut self,
        scheduler: &str,
        cutoff: Option<DateTime<Utc>>,
        keep: Option<u32>,
    ) -> u64 {
        let mut deleted = 0;
        if let Some(cutoff) = cutoff {
            let cutoff = ms(cutoff);
            deleted += self.delete(scheduler, |run, later, later_scheduled| {
                ms(run.tick) < cutoff && later > 0 && (run.manual || later_scheduled > 0)
            });
        }
        if let Some(keep) = keep {
            deleted += self.delete(scheduler, |run, later, later_scheduled| {
                later >= u64::from(keep) && (run.manual || later_scheduled > 0)
            });
        }
        deleted
    }

    /// Deletes the finished rows of `scheduler` for which `doomed` holds, given how many
    /// rows and scheduled rows of their job have later ticks (counted before any goes,
    /// as one statement does). How many went.
    fn delete(&mut self, scheduler: &str, doomed: impl Fn(&Run, u64, u64) -> bool) -> u64 {
        let mut doomed_keys = Vec::new();
        let (mut job, mut later, mut later_scheduled) = (None::<&str>, 0, 0);
        // Newest first within each job: the counts of later rows run up as it goes.
        for (key, run) in self
            .rows
            .iter()
            .rev()
            .filter(|((s, _, _), _)| s == scheduler)
        {
            if job != Some(run.job.as_str()) {
                (job, later, later_scheduled) = (Some(run.job.as_str()), 0, 0);
            }
            if run.outcome != Outcome::Running && doomed(run, later, later_scheduled) {
                doomed_keys.push(key.clone());
            }
            later += 1;
            later_scheduled += u64::from(!run.manual);
        }
        for key in &doomed_keys {
            self.rows.remove(key);
        }
        u64::try_from(doomed_keys.len()).unwrap_or(u64::MAX)
    }
}
