//! [`RunFilter`]: which runs to read, for admin tools.

use chrono::{DateTime, Utc};

use super::HistoryError as Error;
use super::run::run_from_row;
use super::{Outcome, RUN_COLUMNS, Run, Shared, ms};
#[cfg(doc)]
use crate::History;

/// How many runs [`History::query_runs`] returns unless told otherwise.
pub const DEFAULT_RUN_LIMIT: u32 = 50;

/// The most runs [`History::query_runs`] returns at once: larger limits are capped.
pub const MAX_RUN_LIMIT: u32 = 1000;

/// Which runs to read ([`History::query_runs`],
/// [`SchedulerAdmin::runs`](crate::admin::SchedulerAdmin::runs)): every condition set must
/// hold. Newest tick first, at most [`limit`](Self::limit) rows (default 50, at most
/// 1000).
///
/// ```
/// use chrono::{Duration, Utc};
/// use redlock_scheduler::history::{Outcome, RunFilter};
///
/// // The last ten failures of `invoices` in the past day, scheduled ones only.
/// let filter = RunFilter::new()
///     .job("invoices")
///     .outcome(Outcome::Failed)
///     .since(Utc::now() - Duration::days(1))
///     .scheduled_only()
///     .limit(10);
/// assert_eq!(filter.limit_or_default(), 10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunFilter {
    job: Option<String>,
    outcome: Option<Outcome>,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    manual: Option<bool>,
    limit: Option<u32>,
}

impl Default for RunFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl RunFilter {
    /// Every run (of the scheduler asked), the latest 50.
    pub fn new() -> Self {
        Self {
            job: None,
            outcome: None,
            since: None,
            until: None,
            manual: None,
            limit: None,
        }
    }

    /// Only the runs of this job.
    pub fn job(mut self, job: impl Into<String>) -> Self {
        self.job = Some(job.into());
        self
    }

    /// Only the runs that ended so (or, with [`Outcome::Running`], that still run).
    pub fn outcome(mut self, outcome: Outcome) -> Self {
        self.outcome = Some(outcome);
        self
    }

    /// Only the ticks at or after this time.
    pub fn since(mut self, since: DateTime<Utc>) -> Self {
        self.since = Some(since);
        self
    }

    /// Only the ticks at or before this time.
    pub fn until(mut self, until: DateTime<Utc>) -> Self {
        self.until = Some(until);
        self
    }

    /// Only runs started by a trigger (manual).
    pub fn manual_only(mut self) -> Self {
        self.manual = Some(true);
        self
    }

    /// Only ticks of the schedule (no manual triggers).
    pub fn scheduled_only(mut self) -> Self {
        self.manual = Some(false);
        self
    }

    /// At most this many rows (default 50; between 1 and 1000, larger values are
    /// capped).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The number of rows asked for, defaults and caps applied.
    pub fn limit_or_default(&self) -> u32 {
        self.limit
            .unwrap_or(DEFAULT_RUN_LIMIT)
            .clamp(1, MAX_RUN_LIMIT)
    }
}

impl RunFilter {
    /// Whether `run` (of the scheduler asked) meets every condition set.
    pub(super) fn selects(&self, run: &Run) -> bool {
        let tick = ms(run.tick);
        self.job.as_ref().is_none_or(|job| *job == run.job)
            && self.outcome.is_none_or(|outcome| outcome == run.outcome)
            && self.since.is_none_or(|since| tick >= ms(since))
            && self.until.is_none_or(|until| tick <= ms(until))
            && self.manual.is_none_or(|manual| manual == run.manual)
    }

    /// The runs of `scheduler` this filter selects, newest tick first (then by job).
    pub(super) async fn query(&self, shared: &Shared, scheduler: &str) -> Result<Vec<Run>, Error> {
        let filter = self;
        let mut sql = format!(
            "SELECT {RUN_COLUMNS} FROM {} WHERE scheduler = $1",
            shared.tables.runs
        );
        let mut placeholders = 1;
        let mut condition = |sql: &mut String, column: &str, op: &str| {
            placeholders += 1;
            sql.push_str(&format!(" AND {column} {op} ${placeholders}"));
        };
        if filter.job.is_some() {
            condition(&mut sql, "job", "=");
        }
        if filter.outcome.is_some() {
            condition(&mut sql, "outcome", "=");
        }
        if filter.since.is_some() {
            condition(&mut sql, "tick_ms", ">=");
        }
        if filter.until.is_some() {
            condition(&mut sql, "tick_ms", "<=");
        }
        match filter.manual {
            Some(true) => sql.push_str(" AND manual <> 0"),
            Some(false) => sql.push_str(" AND manual = 0"),
            None => {}
        }
        sql.push_str(&format!(
            " ORDER BY tick_ms DESC, job LIMIT ${}",
            placeholders + 1
        ));
        let mut query = sqlx::query(&sql).bind(scheduler);
        if let Some(job) = &filter.job {
            query = query.bind(job.as_str());
        }
        if let Some(outcome) = filter.outcome {
            query = query.bind(outcome.as_str());
        }
        if let Some(since) = filter.since {
            query = query.bind(ms(since));
        }
        if let Some(until) = filter.until {
            query = query.bind(ms(until));
        }
        query = query.bind(i64::from(filter.limit_or_default()));
        let rows = shared
            .bounded("read runs", query.fetch_all(&shared.pool))
            .await?;
        rows.iter().map(run_from_row).collect()
    }
}
