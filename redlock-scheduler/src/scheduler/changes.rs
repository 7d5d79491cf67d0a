//! Jobs changed at run time, on a replica: the changes recorded in the history are
//! read in order (at start, every [`JOB_CHANGE_POLL`], and at once after a change made
//! here) and applied to the job table; the leader's firing loops follow the table
//! (see `fire`). Also the [`Scheduler`] calls that make them.

use std::sync::Arc;
use std::time::Duration;

use redlock_core::CancellationToken;

use super::Scheduler;
use super::state::{Inner, JobDef, JobState, lock};
use crate::changes::{JOB_CHANGE_POLL, JobChange, JobChangeAction};
use crate::control::Base;
use crate::error::Error;
use crate::history::JobDefinition;
use crate::job::{Handler, Job, check_spec};
use crate::request::RequestError;
use crate::spec::JobSpec;

impl Inner {
    /// Reads the changes recorded since the last one applied here and applies them,
    /// in order, then publishes the definitions they changed (and those whose
    /// publication failed before): `false` if the history could not be read.
    pub(super) async fn sync_changes(&self) -> bool {
        let Some(recorder) = &self.recorder else {
            return true;
        };
        {
            // One reader at a time, so that each change applies once and in order.
            let mut applied = self.applied_change.lock().await;
            let changes = match recorder
                .history()
                .job_changes_after(&self.name, *applied)
                .await
            {
                Ok(changes) => changes,
                Err(err) => {
                    recorder.health.fail(&err);
                    return false;
                }
            };
            for change in changes {
                match change {
                    Ok(change) => {
                        *applied = change.seq;
                        if self.apply_change(&change) {
                            lock(&self.unpublished).insert(change.job);
                        }
                    }
                    Err(unread) => {
                        *applied = unread.seq;
                        self.leave_out(&unread.job, &unread.error);
                    }
                }
            }
        }
        self.publish_changed().await;
        true
    }

    /// Puts `change` in force here: whether it took effect.
    pub(super) fn apply_change(&self, change: &JobChange) -> bool {
        match (&change.action, &change.definition) {
            (JobChangeAction::Add | JobChangeAction::Reschedule, Some(spec)) => {
                let def = match self.def_of(spec, change) {
                    Ok(def) => def,
                    Err(err) => {
                        // Checked when it was made: a definition this version cannot
                        // take (a later version's).
                        self.leave_out(&change.job, &err.to_string());
                        return false;
                    }
                };
                if !def.runnable {
                    tracing::warn!(job = %change.job, handler = %def.job.spec.handler_name(), "no handler of this name on this replica: it declines the job's runs handed to it, and records them failed if it runs them as the leader");
                }
                match self.jobs.find(&change.job) {
                    Some((_, state)) => state.redefine(def),
                    None => {
                        self.jobs.push(JobState::new(def));
                    }
                }
            }
            (JobChangeAction::Remove, _) => {
                if let Some((_, state)) = self.jobs.find(&change.job) {
                    state.remove();
                }
            }
            _ => return false,
        }
        tracing::info!(job = %change.job, action = change.action.as_str(), seq = change.seq, by = %change.changed_by, "job change applied");
        self.jobs.notify();
        true
    }

    /// A change of `job` this version cannot apply: the job is left out on this
    /// replica (it fires and takes none of its runs), rather than kept as it was
    /// before a change the other replicas applied; a later change it can read brings
    /// it back.
    fn leave_out(&self, job: &str, error: &str) {
        tracing::error!(%job, %error, "a job change this version cannot apply: the job is left out on this replica until a change it can read; upgrade it");
        if let Some((_, state)) = self.jobs.find(job) {
            state.remove();
            self.jobs.notify();
        }
    }

    /// Publishes (or takes away, once removed) the definitions of the jobs changed
    /// since the last publication; those that fail are tried again next time.
    async fn publish_changed(&self) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let jobs: Vec<String> = lock(&self.unpublished).drain().collect();
        let history = recorder.history();
        for job in jobs {
            let result = match self.jobs.find(&job) {
                Some((_, state)) if !state.is_removed() => {
                    let definition = self.definition(&state);
                    history
                        .publish_jobs(&self.name, &self.instance, &[definition])
                        .await
                }
                _ => history.unpublish_job(&self.name, &job).await,
            };
            if let Err(err) = result {
                recorder.health.fail(&err);
                lock(&self.unpublished).insert(job);
            }
        }
    }

    /// The definition `spec` puts in force from `change`'s time.
    fn def_of(&self, spec: &JobSpec, change: &JobChange) -> Result<JobDef, crate::BuildError> {
        let schedule = check_spec(spec, &self.name, self.max_resource_len)?;
        let (handler, runnable) = match self.handlers.get(spec.handler_name()) {
            Some(handler) => (Arc::clone(handler), true),
            None => (missing_handler(spec.handler_name(), &self.instance), false),
        };
        Ok(JobDef {
            job: Job {
                spec: spec.clone(),
                handler,
            },
            schedule,
            since: Some(change.changed),
            version: 0,
            runnable,
        })
    }

    /// `state`'s definition as published for admin tools.
    pub(super) fn definition(&self, state: &JobState) -> JobDefinition {
        let def = state.def();
        let spec = &def.job.spec;
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        JobDefinition {
            job: spec.name().to_owned(),
            schedule: def.schedule.expression().to_owned(),
            time_zone: def.schedule.zone().name().to_owned(),
            misfire: spec.misfire_policy().to_text(),
            dst: Some(def.schedule.dst().to_string()),
            timeout_ms: spec.run_timeout().map(ms),
            handler: Some(spec.handler_name().to_owned()),
            grace_ms: Some(ms(spec.grace())),
            on_leader: Some(spec.on_leader()),
            updated: chrono::Utc::now(),
            updated_by: self.instance.to_string(),
        }
    }

    /// This replica's definition of `job` (declared in code, or applied here).
    fn local_spec(&self, job: &str) -> Option<JobSpec> {
        let (_, state) = self.job(job).ok()?;
        Some(state.def().job.spec.clone())
    }
}

/// The handler of a job whose handler is not registered on this replica: its runs fail
/// saying so.
pub(super) fn missing_handler(name: &str, instance: &str) -> Handler {
    let message = format!(
        "no handler named `{name}` is registered on replica {instance}: register it with SchedulerBuilder::handler on every replica"
    );
    Arc::new(move |_| {
        let message = message.clone();
        Box::pin(async move { Err(message.into()) })
    })
}

/// On every replica with a history, from start to shutdown: applies the changes
/// recorded (every [`JOB_CHANGE_POLL`]) and publishes this replica's job definitions
/// for admin tools once it has applied those recorded at its start (retried with a
/// backoff of 1 s, doubling up to 30 s, until the database takes them).
pub(super) async fn follow_changes(inner: Arc<Inner>, stop: CancellationToken) {
    let Some(recorder) = inner.recorder.clone() else {
        return;
    };
    let mut backoff = Duration::from_secs(1);
    let mut publish_at = Some(tokio::time::Instant::now());
    loop {
        let synced = inner.sync_changes().await;
        if synced && publish_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
            let definitions: Vec<JobDefinition> = inner
                .jobs
                .live()
                .iter()
                .map(|state| inner.definition(state))
                .collect();
            match recorder
                .history()
                .publish_jobs(&inner.name, &inner.instance, &definitions)
                .await
            {
                Ok(()) => {
                    recorder.health.read_ok();
                    publish_at = None;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "could not publish the job definitions for admin tools; retrying");
                    recorder.health.fail(&err);
                    publish_at = Some(tokio::time::Instant::now() + backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(JOB_CHANGE_POLL) => {}
            () = stop.cancelled() => return,
        }
    }
}

impl Scheduler {
    /// Adds a job at run time, on every replica: with a [`History`](crate::History) the
    /// change is recorded there, applied here at once and on the other replicas within
    /// [`JOB_CHANGE_POLL`]; the leader fires the job's ticks after the time of the
    /// change. Without a history it is added to this replica alone. Its handler must be
    /// registered here ([`SchedulerBuilder::handler`](crate::SchedulerBuilder::handler)),
    /// and should be on every replica.
    ///
    /// The job's name may be at most [`max_job_name_len`](Self::max_job_name_len)
    /// bytes (477 for the default scheduler name under the default `max_resource_len`;
    /// see [`keys`](crate::keys)), so that every lock key made from it fits.
    ///
    /// # Errors
    ///
    /// [`RequestError::InvalidJob`]; [`RequestError::NameTooLong`] with the bound in
    /// bytes; [`RequestError::UnknownHandler`]; [`RequestError::JobExists`];
    /// [`RequestError::ChangeConflict`]; [`Error::ShutDown`]; the history's error.
    pub async fn add_job(&self, spec: JobSpec) -> Result<JobChange, Error> {
        self.check_spec(&spec)?;
        let name = spec.name().to_owned();
        self.change(&name, |current| match current {
            Some(_) => Err(RequestError::JobExists { name: name.clone() }),
            None => Ok((JobChangeAction::Add, Some(spec.clone()))),
        })
        .await
    }

    /// Puts `spec` in force for the job of its name, on every replica, as
    /// [`add_job`](Self::add_job) adds one (and
    /// [`SchedulerAdmin::reschedule_job`](crate::admin::SchedulerAdmin::reschedule_job)
    /// says what happens at the switch).
    ///
    /// # Errors
    ///
    /// As [`add_job`](Self::add_job) (the name's bound included), with
    /// [`RequestError::UnknownJob`] instead of [`RequestError::JobExists`].
    pub async fn reschedule_job(&self, spec: JobSpec) -> Result<JobChange, Error> {
        self.check_spec(&spec)?;
        let name = spec.name().to_owned();
        self.change(&name, |current| match current {
            Some(_) => Ok((JobChangeAction::Reschedule, Some(spec.clone()))),
            None => Err(RequestError::UnknownJob { name: name.clone() }),
        })
        .await
    }

    /// Removes `job` at run time, on every replica, as [`add_job`](Self::add_job) adds
    /// one: no tick of it fires once the leader has the change; a run of it going on
    /// then finishes.
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`]; [`RequestError::ChangeConflict`];
    /// [`Error::ShutDown`]; the history's error.
    pub async fn remove_job(&self, job: &str) -> Result<JobChange, Error> {
        self.change(job, |current| match current {
            Some(_) => Ok((JobChangeAction::Remove, None)),
            None => Err(RequestError::UnknownJob {
                name: job.to_owned(),
            }),
        })
        .await
    }

    /// The longest job name this scheduler takes, in bytes: what its name leaves
    /// under the client's `max_resource_len` for the longest key made from a job's
    /// name (see [`keys::max_job_name_len`](crate::keys::max_job_name_len)).
    pub fn max_job_name_len(&self) -> usize {
        crate::keys::max_job_name_len(&self.inner.name, self.inner.max_resource_len)
    }

    /// A spec's definition and handler, checked here.
    fn check_spec(&self, spec: &JobSpec) -> Result<(), Error> {
        check_spec(spec, &self.inner.name, self.inner.max_resource_len)
            .map_err(RequestError::from)?;
        if !self.inner.handlers.contains_key(spec.handler_name()) {
            return Err(RequestError::UnknownHandler {
                job: spec.name().to_owned(),
                handler: spec.handler_name().to_owned(),
                place: format!("on this replica ({})", self.inner.instance),
            }
            .into());
        }
        Ok(())
    }

    /// Records the change `decide` makes (through the history, or here alone without
    /// one) and applies it here.
    async fn change(
        &self,
        job: &str,
        decide: impl Fn(Option<JobSpec>) -> Result<(JobChangeAction, Option<JobSpec>), RequestError>,
    ) -> Result<JobChange, Error> {
        let inner = &self.inner;
        if inner.stop_firing.is_cancelled() {
            return Err(Error::ShutDown);
        }
        let now = inner.clock.now();
        let Some(admin) = self.admin() else {
            // This replica alone: numbered after the last change made here, checked
            // and applied under one lock (no other change in between).
            let mut applied = inner.applied_change.lock().await;
            let previous = inner.local_spec(job);
            let (action, definition) = decide(previous.clone())?;
            *applied += 1;
            let change = JobChange {
                seq: *applied,
                job: job.to_owned(),
                action,
                definition,
                previous,
                changed_by: inner.instance.to_string(),
                changed: now,
            };
            inner.apply_change(&change);
            return Ok(change);
        };
        let base = Base::Local(inner.local_spec(job));
        let change = admin.change(job, base, now, decide).await?;
        // In force here at once (and every change before it, in order).
        inner.sync_changes().await;
        Ok(change)
    }
}

/// The changes applied here so far, for [`Inner`] (the number of the last one).
pub(super) type Applied = tokio::sync::Mutex<u64>;
