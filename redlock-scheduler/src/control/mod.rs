//! [`SchedulerAdmin`]: look at and steer a scheduler from its history database alone.
//!
//! An admin tool (a web service, a command line) has no job definitions and runs no
//! scheduler: it has the history's URL and the scheduler's name. Everything here reads
//! or writes that database:
//!
//! - each replica publishes its job definitions when it starts (schedule, time zone,
//!   misfire policy, timeout), so [`jobs`](SchedulerAdmin::jobs) can list them with
//!   their next ticks, pause state, last run and whether a run goes on;
//! - the leader records itself when elected, renews that record while it leads and
//!   marks it ended when it steps down or shuts down ([`leader`](SchedulerAdmin::leader)
//!   names only a leader whose record is current);
//! - runs are read with a [`RunFilter`] ([`runs`](SchedulerAdmin::runs));
//! - pauses are rows every leader reads within a second
//!   ([`pause`](SchedulerAdmin::pause), [`resume`](SchedulerAdmin::resume));
//! - what only a running replica can do ([`trigger`](SchedulerAdmin::trigger),
//!   [`cancel`](SchedulerAdmin::cancel), [`step_down`](SchedulerAdmin::step_down)) is a
//!   *request*: a row with a random id that the leader (for a cancel: the replica
//!   running the job) takes, atomically, within about half a second, carries out and
//!   answers with a result. [`request`](SchedulerAdmin::request) reads it;
//!   [`wait`](SchedulerAdmin::wait) waits for it, [`wait_up_to`](SchedulerAdmin::wait_up_to)
//!   reads where it stands after a bounded wait. A request no replica took within a
//!   minute is marked expired by the leader that sees it, not carried out late (with
//!   no replica running, it stays pending until one runs and expires it).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlock_scheduler::Error> {
//! use redlock_scheduler::{History, Scheduler};
//! use redlock_scheduler::admin::SchedulerAdmin;
//! use redlock_scheduler::history::RunFilter;
//!
//! let history = History::connect("sqlite::memory:").await?;
//! let admin = SchedulerAdmin::new(history, Scheduler::DEFAULT_NAME).operator("alice");
//! for job in admin.jobs().await? {
//!     println!("{} ({}): next {:?}", job.name, job.schedule, job.next_ticks.first());
//! }
//! let failures = admin.runs(&RunFilter::new().job("invoices").limit(10)).await?;
//! assert!(failures.is_empty());
//! // No replica published `invoices` in this empty database.
//! assert!(admin.trigger("invoices").await.is_err());
//! # Ok(())
//! # }
//! ```

mod changes;

pub(crate) use self::changes::Base;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{HistoryError, RequestError};
use crate::history::{History, JobDefinition, Run, RunFilter};
use crate::request::{Dispatched, Request, RequestAction};
use crate::spec::Misfire;
use crate::status::LastRun;
use crate::time::{Clock, DstPolicy, Schedule, SystemClock};

/// How many next ticks [`SchedulerAdmin::jobs`] lists per job unless told otherwise.
pub const DEFAULT_NEXT_TICKS: usize = 5;

/// The most next ticks [`SchedulerAdmin::jobs`] lists per job.
const MAX_NEXT_TICKS: usize = 100;

/// How often [`SchedulerAdmin::wait`] reads the request again.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// Looks at and steers the scheduler of a given name through its history database,
/// without job definitions or Redis: for admin services and command lines. A running
/// [`Scheduler`](crate::Scheduler) offers one over its own history
/// ([`Scheduler::admin`](crate::Scheduler::admin)). Cheap to clone.
#[derive(Clone)]
pub struct SchedulerAdmin {
    history: History,
    scheduler: String,
    operator: String,
    next_ticks: usize,
    max_resource_len: usize,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for SchedulerAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerAdmin")
            .field("history", &self.history)
            .field("scheduler", &self.scheduler)
            .field("operator", &self.operator)
            .field("next_ticks", &self.next_ticks)
            .field("max_resource_len", &self.max_resource_len)
            .finish_non_exhaustive()
    }
}

/// A job as its replicas published it, with what the history says about it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct JobInfo {
    /// Its name.
    pub name: String,
    /// Its cron expression.
    pub schedule: String,
    /// Its time zone (IANA name).
    pub time_zone: String,
    /// Its misfire policy (`None` if written by a version of this crate that knows a
    /// policy this one does not).
    pub misfire: Option<Misfire>,
    /// Its daylight saving policy, which [`next_ticks`](Self::next_ticks) follow (the
    /// default for a definition published by a version without DST policies; `None`,
    /// with no next ticks and a [`schedule_error`](Self::schedule_error), if written by
    /// a version that knows a policy this one does not).
    pub dst: Option<DstPolicy>,
    /// Its timeout, in milliseconds, if it has one.
    pub timeout_ms: Option<u64>,
    /// Its next ticks after now, computed in its time zone (as many as
    /// [`SchedulerAdmin::next_ticks`] says).
    pub next_ticks: Vec<DateTime<Utc>>,
    /// Why no ticks could be computed, if the published schedule does not parse here.
    pub schedule_error: Option<String>,
    /// Paused for every replica.
    pub paused: bool,
    /// A run of it is going (its row says `running`).
    pub running: bool,
    /// The replica running it, if one does.
    pub running_on: Option<String>,
    /// Its latest recorded run (scheduled or manual, run or skipped).
    pub last_run: Option<LastRun>,
    /// When a replica last published the definition.
    pub published: DateTime<Utc>,
    /// The replica that did.
    pub published_by: String,
}

/// The leader as recorded in the history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The leading replica.
    pub instance: String,
    /// Its fencing epoch: every new leadership has a higher one.
    pub epoch: u64,
    /// When it was elected (as it recorded it).
    pub since: DateTime<Utc>,
    /// Until when its record holds unless it renews it (a leader renews it every
    /// couple of seconds): past it, the replica stopped without saying so (it crashed,
    /// or lost the database). `None` if a replica of a version that keeps no such lease
    /// wrote the record.
    pub expires: Option<DateTime<Utc>>,
    /// When its leadership ended (it stepped down, shut down, reached the end of its
    /// term or lost its lock), as it recorded it; `None` while it goes on.
    pub ended: Option<DateTime<Utc>>,
}

impl LeaderInfo {
    /// Whether it still leads at `now`, as far as the record tells: its leadership has
    /// not ended and its lease has not run out.
    pub fn is_current_at(&self, now: DateTime<Utc>) -> bool {
        self.ended.is_none() && self.expires.is_none_or(|expires| expires > now)
    }
}

impl SchedulerAdmin {
    /// The admin of the scheduler named `scheduler` (a scheduler's default name is
    /// [`Scheduler::DEFAULT_NAME`](crate::Scheduler::DEFAULT_NAME)) in `history`.
    pub fn new(history: History, scheduler: impl Into<String>) -> Self {
        Self {
            history,
            scheduler: scheduler.into(),
            operator: "admin".to_owned(),
            next_ticks: DEFAULT_NEXT_TICKS,
            max_resource_len: redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN,
            clock: Arc::new(SystemClock),
        }
    }

    /// The wall clock requests, changes and the leader's lease are read against
    /// (default: the system's; a scheduler's own admin uses the scheduler's).
    #[must_use]
    pub fn clock(self, clock: impl Clock) -> Self {
        self.shared_clock(Arc::new(clock))
    }

    #[must_use]
    pub(crate) fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The longest resource name the replicas' `Redlock` takes (default
    /// [`DEFAULT_MAX_RESOURCE_LEN`](redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN), 512; give
    /// the replicas' [`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len)
    /// if they set one): the bound on the names of the jobs it adds follows from it
    /// ([`max_job_name_len`](Self::max_job_name_len)). A replica whose client takes
    /// less leaves out a job it cannot lock for (logged as an error).
    #[must_use]
    pub fn max_resource_len(mut self, max: usize) -> Self {
        self.max_resource_len = max;
        self
    }

    /// The longest job name [`add_job`](Self::add_job) takes, in bytes: what the
    /// scheduler's name leaves under [`max_resource_len`](Self::max_resource_len) for
    /// the longest key made from a job's name (see
    /// [`keys::max_job_name_len`](crate::keys::max_job_name_len)); 0 if the scheduler's
    /// name is too long for any.
    pub fn max_job_name_len(&self) -> usize {
        crate::keys::max_job_name_len(&self.scheduler, self.max_resource_len)
    }

    /// Who makes the requests, as recorded with them (default `admin`).
    #[must_use]
    pub fn operator(mut self, operator: impl Into<String>) -> Self {
        self.operator = operator.into();
        self
    }

    /// How many next ticks [`jobs`](Self::jobs) lists per job (default 5, at most 100).
    #[must_use]
    pub fn next_ticks(mut self, n: usize) -> Self {
        self.next_ticks = n.min(MAX_NEXT_TICKS);
        self
    }

    /// The scheduler's name.
    pub fn scheduler(&self) -> &str {
        &self.scheduler
    }

    /// The history it works on.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Every job a replica published, by name: schedule, time zone, misfire policy,
    /// next ticks, pause, last run, whether a run goes on.
    ///
    /// # Errors
    ///
    /// [`HistoryError`].
    pub async fn jobs(&self) -> Result<Vec<JobInfo>, HistoryError> {
        let definitions = self
            .history
            .definitions()
            .job_definitions(&self.scheduler)
            .await?;
        let paused: HashSet<String> = self
            .history
            .control()
            .paused_jobs(&self.scheduler)
            .await?
            .into_iter()
            .collect();
        let mut last: HashMap<String, Run> = HashMap::new();
        for run in self.history.last_runs(&self.scheduler).await? {
            last.insert(run.job.clone(), run);
        }
        let mut running: HashMap<String, String> = HashMap::new();
        for run in self.history.running(&self.scheduler).await? {
            // The latest tick's replica, if rows of several ticks say running.
            running.insert(run.job, run.instance);
        }
        let now = self.clock.now();
        Ok(definitions
            .into_iter()
            .map(|definition| {
                let name = definition.job.clone();
                self.job_info(
                    definition,
                    now,
                    paused.contains(&name),
                    running.remove(&name),
                    last.remove(&name).map(LastRun::from),
                )
            })
            .collect())
    }

    /// One job, as [`jobs`](Self::jobs) lists it.
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`] if no replica published it; [`RequestError::History`].
    pub async fn job(&self, name: &str) -> Result<JobInfo, RequestError> {
        self.jobs()
            .await?
            .into_iter()
            .find(|j| j.name == name)
            .ok_or_else(|| RequestError::UnknownJob {
                name: name.to_owned(),
            })
    }

    fn job_info(
        &self,
        definition: JobDefinition,
        now: DateTime<Utc>,
        paused: bool,
        running_on: Option<String>,
        last_run: Option<LastRun>,
    ) -> JobInfo {
        // No text: a replica that knows no DST policy, so the default one ran.
        let dst = match definition.dst.as_deref() {
            None => Ok(DstPolicy::new()),
            Some(text) => text.parse::<DstPolicy>(),
        };
        let parsed = Schedule::parse(&definition.schedule, &definition.time_zone)
            .and_then(|schedule| dst.clone().map(|dst| schedule.with_dst(dst)));
        let (next_ticks, schedule_error) = match parsed {
            Ok(schedule) => {
                let mut ticks = Vec::with_capacity(self.next_ticks);
                let mut cursor = now;
                while ticks.len() < self.next_ticks {
                    let Some(next) = schedule.next_after(cursor) else {
                        break;
                    };
                    ticks.push(next);
                    cursor = next;
                }
                (ticks, None)
            }
            Err(reason) => (Vec::new(), Some(reason)),
        };
        JobInfo {
            misfire: Misfire::from_text(&definition.misfire),
            dst: dst.ok(),
            timeout_ms: definition.timeout_ms.and_then(|t| u64::try_from(t).ok()),
            name: definition.job,
            schedule: definition.schedule,
            time_zone: definition.time_zone,
            next_ticks,
            schedule_error,
            paused,
            running: running_on.is_some(),
            running_on,
            last_run,
            published: definition.updated,
            published_by: definition.updated_by,
        }
    }

    /// The leader now, as recorded (each leader records itself when elected, renews
    /// the record while it leads and marks it ended when its leadership ends): `None`
    /// if no replica ever led, the last leader's leadership ended (it stepped down or
    /// shut down, and no other replica took over yet), or its record ran out (it
    /// stopped without saying so). [`last_leader`](Self::last_leader) tells which.
    ///
    /// # Errors
    ///
    /// [`HistoryError`].
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, HistoryError> {
        let now = self.clock.now();
        Ok(self
            .last_leader()
            .await?
            .filter(|leader| leader.is_current_at(now)))
    }

    /// The leader last recorded, whether or not it still leads (see
    /// [`LeaderInfo::is_current_at`]): `None` if no replica ever led.
    ///
    /// # Errors
    ///
    /// [`HistoryError`].
    pub async fn last_leader(&self) -> Result<Option<LeaderInfo>, HistoryError> {
        Ok(self
            .history
            .control()
            .leader_record(&self.scheduler)
            .await?
            .map(|record| LeaderInfo {
                instance: record.instance,
                epoch: record.epoch,
                since: record.since,
                expires: record.expires,
                ended: record.ended,
            }))
    }

    /// The runs `filter` selects, newest first.
    ///
    /// # Errors
    ///
    /// [`HistoryError`].
    pub async fn runs(&self, filter: &RunFilter) -> Result<Vec<Run>, HistoryError> {
        self.history.query_runs(&self.scheduler, filter).await
    }

    /// Pauses `job` for every replica: its ticks are skipped (recorded as skipped,
    /// `paused`) from the leader's next look, within a second, until
    /// [`resume`](Self::resume).
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`] if no replica published it; [`RequestError::History`] (nothing changed then).
    pub async fn pause(&self, job: &str) -> Result<(), RequestError> {
        self.known(job).await?;
        Ok(self
            .history
            .control()
            .set_paused(&self.scheduler, job, true)
            .await?)
    }

    /// Fires `job` again after [`pause`](Self::pause).
    ///
    /// # Errors
    ///
    /// As [`pause`](Self::pause).
    pub async fn resume(&self, job: &str) -> Result<(), RequestError> {
        self.known(job).await?;
        Ok(self
            .history
            .control()
            .set_paused(&self.scheduler, job, false)
            .await?)
    }

    /// Asks the leader to run `job` once now (through the claim path, recorded as a
    /// manual run). Answers [`Dispatched::Requested`] with the request's id (as every
    /// control of an admin, which runs no replica: [`Scheduler::trigger`](crate::Scheduler::trigger)
    /// answers the same type, done at once on the leader); the request's result is
    /// `ok: tick <RFC 3339>` or the trigger's error (a run still going, say).
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`] if no replica published it; [`RequestError::History`] (no request recorded then).
    pub async fn trigger(&self, job: &str) -> Result<Dispatched, RequestError> {
        self.known(job).await?;
        self.submit(Some(job), RequestAction::Trigger).await
    }

    /// Asks the replica running `job` to cancel that run: its token fires, and it is
    /// recorded as [`Outcome::Cancelled`](crate::history::Outcome::Cancelled) with the error
    /// `cancelled by an operator`. Answers [`Dispatched::Requested`]; the request's result
    /// names the tick cancelled, or says `no run going`.
    ///
    /// # Errors
    ///
    /// As [`trigger`](Self::trigger).
    pub async fn cancel(&self, job: &str) -> Result<Dispatched, RequestError> {
        // A job removed at run time whose run still goes on is no longer published.
        if self.known(job).await.is_err() {
            let running = self.history.running(&self.scheduler).await?;
            if !running.iter().any(|run| run.job == job) {
                return Err(RequestError::UnknownJob {
                    name: job.to_owned(),
                });
            }
        }
        self.submit(Some(job), RequestAction::Cancel).await
    }

    /// Asks the leader to give leadership up: it hands the lock over to a waiting
    /// replica and keeps out of the election for a while (the leadership TTL, at least
    /// 2 s), so another replica takes over with a higher epoch. Runs going on the old
    /// leader go on (they hold their jobs' run locks). Answers [`Dispatched::Requested`].
    ///
    /// # Errors
    ///
    /// [`RequestError::History`] (no request recorded then).
    pub async fn step_down(&self) -> Result<Dispatched, RequestError> {
        self.submit(None, RequestAction::StepDown).await
    }

    /// The request `id`, and where it stands.
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownRequest`] if this scheduler has none of that id;
    /// [`RequestError::History`].
    pub async fn request(&self, id: &str) -> Result<Request, RequestError> {
        self.history
            .requests()
            .request(&self.scheduler, id)
            .await?
            .ok_or_else(|| RequestError::UnknownRequest { id: id.to_owned() })
    }

    /// Waits until the request `id` is done (succeeded, failed or expired: see
    /// [`Request::is_done`]), reading it about ten times a second, for at most
    /// `timeout`.
    ///
    /// # Errors
    ///
    /// [`RequestError::NotDone`] when `timeout` passes first; as
    /// [`request`](Self::request) otherwise.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<Request, RequestError> {
        let request = self.wait_up_to(id, timeout).await?;
        if request.is_done() {
            Ok(request)
        } else {
            Err(RequestError::NotDone {
                id: id.to_owned(),
                waited: timeout,
                state: request.state,
            })
        }
    }

    /// The request `id` once it is done, or as it stands after `within`: still
    /// [`Pending`](crate::admin::RequestState::Pending) (no replica has taken it) or
    /// [`Executing`](crate::admin::RequestState::Executing). Reads it about ten times a
    /// second; with a `within` of zero, once. For callers that answer at once and let
    /// their own callers follow the request (an HTTP admin answering 202).
    ///
    /// # Errors
    ///
    /// As [`request`](Self::request).
    pub async fn wait_up_to(&self, id: &str, within: Duration) -> Result<Request, RequestError> {
        let started = tokio::time::Instant::now();
        loop {
            let request = self.request(id).await?;
            if request.is_done() || started.elapsed() >= within {
                return Ok(request);
            }
            let left = within.saturating_sub(started.elapsed());
            tokio::time::sleep(WAIT_POLL.min(left)).await;
        }
    }

    /// Records a request.
    pub(crate) async fn submit(
        &self,
        job: Option<&str>,
        action: RequestAction,
    ) -> Result<Dispatched, RequestError> {
        let id = crate::history::new_request_id();
        self.history
            .requests()
            .insert_request(
                &id,
                &self.scheduler,
                job,
                action,
                &self.operator,
                self.clock.now(),
            )
            .await?;
        Ok(Dispatched::Requested { id })
    }

    /// Fails with [`RequestError::UnknownJob`] unless a replica published `job`.
    async fn known(&self, job: &str) -> Result<(), RequestError> {
        match self
            .history
            .definitions()
            .job_definition(&self.scheduler, job)
            .await?
        {
            Some(_) => Ok(()),
            None => Err(RequestError::UnknownJob {
                name: job.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn definition(dst: Option<&str>) -> JobDefinition {
        JobDefinition {
            job: "meter".to_owned(),
            schedule: "30 1 * * *".to_owned(),
            time_zone: "America/New_York".to_owned(),
            misfire: "run_once".to_owned(),
            dst: dst.map(str::to_owned),
            timeout_ms: None,
            handler: None,
            grace_ms: None,
            on_leader: None,
            updated: Utc::now(),
            updated_by: "r1".to_owned(),
        }
    }

    /// The next ticks an admin lists are those of the published policy: a definition
    /// without one (an earlier version's) has the default, one this version does not
    /// know has none.
    #[tokio::test]
    async fn next_ticks_follow_the_published_dst_policy() {
        let history = History::connect("sqlite::memory:").await.unwrap();
        let admin = SchedulerAdmin::new(history, "s").next_ticks(3);
        // The evening before New York's 2026 fall back: 01:30 happens at 05:30Z (EDT)
        // and again at 06:30Z (EST).
        let now = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
        let at = |d, h| Utc.with_ymd_and_hms(2026, 11, d, h, 30, 0).unwrap();
        let once = vec![at(1, 5), at(2, 6), at(3, 6)];
        let twice = vec![at(1, 5), at(1, 6), at(2, 6)];
        for (dst, policy, ticks) in [
            (None, Some(DstPolicy::new()), once.clone()),
            (Some("run_at_end/once"), Some(DstPolicy::new()), once),
            (
                Some("skip/twice"),
                Some(
                    DstPolicy::new()
                        .gap(crate::time::Gap::Skip)
                        .fold(crate::time::Fold::Twice),
                ),
                twice,
            ),
            (Some("run_at_end/thrice"), None, Vec::new()),
        ] {
            let info = admin.job_info(definition(dst), now, false, None, None);
            assert_eq!(info.dst, policy, "{dst:?}");
            assert_eq!(info.next_ticks, ticks, "{dst:?}");
            assert_eq!(
                info.schedule_error
                    .is_some_and(|e| e.contains("invalid DST policy")),
                policy.is_none(),
                "{dst:?}"
            );
        }
    }
}
