//! Jobs added, rescheduled and removed at run time through the history database: each
//! change is checked against the job's definition in force (the latest change of it,
//! or else the definition its replicas published), then recorded under the next
//! change number; a writer that lost the number to another change reads again.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::SchedulerAdmin;
use crate::changes::{JobChange, JobChangeAction};
use crate::error::{HistoryError, RequestError};
use crate::history::{JobDefinition, NewChange};
use crate::spec::JobSpec;
use crate::spec::{DEFAULT_GRACE, Misfire};
use crate::time::DstPolicy;

/// How many times a change is read again and retried when other changes take its
/// number first.
const CHANGE_ATTEMPTS: u32 = 8;

/// A replica whose beat is this recent counts as alive when a change's handler is
/// looked up, and when replicas of a version without job changes are looked for.
const HANDLER_SEEN: Duration = Duration::from_secs(60);

/// The most changes [`SchedulerAdmin::job_changes`] returns at once.
const MAX_CHANGES: u32 = 1000;

/// Where the definition of a job that no change touched yet comes from.
pub(crate) enum Base {
    /// The definitions the replicas published.
    Published,
    /// This replica's own (a job declared in its code), else the published ones.
    Local(Option<JobSpec>),
}

impl SchedulerAdmin {
    /// Adds a job to every replica: recorded in the history, it reaches each replica
    /// within [`JOB_CHANGE_POLL`](crate::changes::JOB_CHANGE_POLL), and the leader fires its ticks
    /// after the time of the change. Its handler is looked up among those the replicas
    /// registered ([`SchedulerBuilder::handler`](crate::SchedulerBuilder::handler)).
    /// Its name may be at most [`max_job_name_len`](Self::max_job_name_len) bytes (see
    /// [`keys`](crate::keys)), reckoned with [`max_resource_len`](Self::max_resource_len).
    ///
    /// # Errors
    ///
    /// [`RequestError::InvalidJob`] (the schedule, time zone or an option);
    /// [`RequestError::NameTooLong`] (the job's name, or the scheduler's, with the
    /// bound in bytes); [`RequestError::JobExists`]; [`RequestError::UnknownHandler`] if no replica alive
    /// in the last minute registered the handler; [`RequestError::ReplicasOutdated`] if
    /// a replica alive then runs a version without job changes;
    /// [`RequestError::ChangeConflict`]; [`RequestError::History`].
    pub async fn add_job(&self, spec: JobSpec) -> Result<JobChange, RequestError> {
        crate::job::check_spec(&spec, &self.scheduler, self.max_resource_len)
            .map_err(RequestError::from)?;
        self.check_handler(&spec).await?;
        self.change(
            spec.name(),
            Base::Published,
            self.clock.now(),
            |current| match current {
                Some(_) => Err(RequestError::JobExists {
                    name: spec.name().to_owned(),
                }),
                None => Ok((JobChangeAction::Add, Some(spec.clone()))),
            },
        )
        .await
    }

    /// Puts `spec` in force for the job of its name on every replica (its schedule and
    /// settings; [`job_spec`](Self::job_spec) gives the one in force to start from).
    /// Ticks of the old definition the leader fired before it saw the change stand;
    /// the new one fires its ticks after the time of the change, and a tick both have
    /// runs once.
    ///
    /// # Errors
    ///
    /// As [`add_job`](Self::add_job), with [`RequestError::UnknownJob`] instead of
    /// [`RequestError::JobExists`].
    pub async fn reschedule_job(&self, spec: JobSpec) -> Result<JobChange, RequestError> {
        crate::job::check_spec(&spec, &self.scheduler, self.max_resource_len)
            .map_err(RequestError::from)?;
        self.check_handler(&spec).await?;
        self.change(
            spec.name(),
            Base::Published,
            self.clock.now(),
            |current| match current {
                Some(_) => Ok((JobChangeAction::Reschedule, Some(spec.clone()))),
                None => Err(RequestError::UnknownJob {
                    name: spec.name().to_owned(),
                }),
            },
        )
        .await
    }

    /// Removes `job` from every replica: no tick of it fires once the leader sees the
    /// change; a run of it going on then finishes (it is not cancelled: cancel it with
    /// [`cancel`](Self::cancel) first if it must stop).
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`]; [`RequestError::ChangeConflict`]; [`RequestError::History`].
    pub async fn remove_job(&self, job: &str) -> Result<JobChange, RequestError> {
        self.change(
            job,
            Base::Published,
            self.clock.now(),
            |current| match current {
                Some(_) => Ok((JobChangeAction::Remove, None)),
                None => Err(RequestError::UnknownJob {
                    name: job.to_owned(),
                }),
            },
        )
        .await
    }

    /// The definition of `job` in force: that of its latest change, or else the one
    /// its replicas published (`None` if there is neither, or it was removed).
    ///
    /// # Errors
    ///
    /// [`HistoryError`].
    pub async fn job_spec(&self, job: &str) -> Result<Option<JobSpec>, HistoryError> {
        self.current(job, &Base::Published).await
    }

    /// The latest changes of the jobs (of `job` only, if given), newest first, at most
    /// `limit` (capped at 1,000): who changed what, when, old → new.
    ///
    /// # Errors
    ///
    /// [`HistoryError`].
    pub async fn job_changes(
        &self,
        job: Option<&str>,
        limit: u32,
    ) -> Result<Vec<JobChange>, HistoryError> {
        self.history
            .changes()
            .job_changes(&self.scheduler, job, limit.min(MAX_CHANGES))
            .await
    }

    /// The definition of `job` in force, as [`job_spec`](Self::job_spec) with `base`.
    async fn current(&self, job: &str, base: &Base) -> Result<Option<JobSpec>, HistoryError> {
        let latest = self
            .history
            .changes()
            .job_changes(&self.scheduler, Some(job), 1)
            .await?;
        if let Some(change) = latest.into_iter().next() {
            return Ok(change.definition);
        }
        if let Base::Local(Some(spec)) = base {
            return Ok(Some(spec.clone()));
        }
        let published = self
            .history
            .definitions()
            .job_definition(&self.scheduler, job)
            .await?;
        Ok(published.map(spec_of_published))
    }

    /// Records the change `decide` makes of `job`'s definition in force (`None`: no
    /// such job), under the next change number, made at `at`.
    pub(crate) async fn change(
        &self,
        job: &str,
        base: Base,
        at: DateTime<Utc>,
        decide: impl Fn(Option<JobSpec>) -> Result<(JobChangeAction, Option<JobSpec>), RequestError>,
    ) -> Result<JobChange, RequestError> {
        let since = at - chrono::Duration::from_std(HANDLER_SEEN).unwrap_or_default();
        let outdated = self
            .history
            .dispatch()
            .replicas_without_changes(&self.scheduler, since)
            .await?;
        if !outdated.is_empty() {
            return Err(RequestError::ReplicasOutdated {
                instances: outdated,
            });
        }
        for _ in 0..CHANGE_ATTEMPTS {
            let last = self
                .history
                .changes()
                .last_job_change(&self.scheduler)
                .await?;
            let previous = self.current(job, &base).await?;
            let (action, definition) = decide(previous.clone())?;
            let change = NewChange {
                seq: last + 1,
                job,
                action,
                definition: definition.as_ref(),
                previous: previous.as_ref(),
                by: &self.operator,
                at,
            };
            if self
                .history
                .changes()
                .insert_job_change(&self.scheduler, &change)
                .await?
            {
                tracing::info!(%job, action = action.as_str(), seq = change.seq, by = %self.operator, "job changed");
                return Ok(JobChange {
                    seq: change.seq,
                    job: job.to_owned(),
                    action,
                    definition,
                    previous,
                    changed_by: self.operator.clone(),
                    changed: at,
                });
            }
        }
        Err(RequestError::ChangeConflict {
            job: job.to_owned(),
        })
    }

    /// Refuses a handler no replica alive in the last minute registered.
    async fn check_handler(&self, spec: &JobSpec) -> Result<(), RequestError> {
        let since = self.clock.now() - chrono::Duration::from_std(HANDLER_SEEN).unwrap_or_default();
        let place = match self
            .history
            .dispatch()
            .handler_registered(&self.scheduler, spec.handler_name(), since)
            .await?
        {
            Some(true) => return Ok(()),
            Some(false) => "on any replica alive in the last minute",
            None => "on a replica alive (none said it is alive in the last minute)",
        };
        Err(RequestError::UnknownHandler {
            job: spec.name().to_owned(),
            handler: spec.handler_name().to_owned(),
            place: place.to_owned(),
        })
    }
}

/// A published definition as a spec: what a row written before these columns lacks
/// takes [`Job`](crate::Job)'s defaults (the handler of the job's name).
fn spec_of_published(definition: JobDefinition) -> JobSpec {
    let mut spec = JobSpec::new(definition.job.as_str(), definition.schedule)
        .time_zone(definition.time_zone)
        .misfire(Misfire::from_text(&definition.misfire).unwrap_or_default())
        .dst(
            definition
                .dst
                .and_then(|dst| dst.parse::<DstPolicy>().ok())
                .unwrap_or_default(),
        )
        .timeout(
            definition
                .timeout_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis),
        )
        .misfire_grace(
            definition
                .grace_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map_or(DEFAULT_GRACE, Duration::from_millis),
        )
        .run_on_leader(definition.on_leader.unwrap_or(false));
    if let Some(handler) = definition.handler {
        spec = spec.handler(handler);
    }
    spec
}
