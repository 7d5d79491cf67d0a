//! Jobs changed at run time, on a replica: the changes recorded in the history are
//! read in order (at start, every [`JOB_CHANGE_POLL`], and at once after a change made
//! here) and applied to the job table; the leader's firing loops follow the table
//! (see `fire`). [`Changes`] holds the handlers the changes may name and how far this
//! replica applied the change log.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::state::{JobDef, JobState, lock};
use crate::changes::{JOB_CHANGE_POLL, JobChange, JobChangeAction};
use crate::error::{BuildError, RequestError};
use crate::history::JobDefinition;
use crate::job::{Handler, Job, check_spec};
use crate::spec::JobSpec;

/// Run-time changes on this replica: the handlers they may name, the number of the
/// last change applied, the definitions not yet published.
pub(super) struct Changes {
    ctx: Arc<Context>,
    /// The handlers jobs added at run time may name (those of the jobs declared in
    /// code under their names, and those registered by name).
    handlers: HashMap<String, Handler>,
    /// The number of the last job change applied here (one reader at a time, so that
    /// each change applies once and in order).
    applied: tokio::sync::Mutex<u64>,
    /// The jobs whose definition changed here and is not yet published.
    unpublished: Mutex<HashSet<String>>,
}

impl Changes {
    pub(super) fn new(ctx: Arc<Context>, handlers: HashMap<String, Handler>) -> Self {
        Self {
            ctx,
            handlers,
            applied: tokio::sync::Mutex::new(0),
            unpublished: Mutex::default(),
        }
    }

    /// Checks `spec` here: its definition, and its handler registered on this replica.
    pub(super) fn check(&self, spec: &JobSpec) -> Result<(), RequestError> {
        let ctx = &self.ctx;
        check_spec(spec, &ctx.name, ctx.max_resource_len).map_err(RequestError::from)?;
        if !self.handlers.contains_key(spec.handler_name()) {
            return Err(RequestError::UnknownHandler {
                job: spec.name().to_owned(),
                handler: spec.handler_name().to_owned(),
                place: format!("on this replica ({})", ctx.instance),
            });
        }
        Ok(())
    }

    /// Without a history: the change `decide` makes, numbered after the last change
    /// made here, checked and applied under one lock (no other change in between).
    pub(super) async fn change_here(
        &self,
        job: &str,
        now: DateTime<Utc>,
        decide: impl Fn(Option<JobSpec>) -> Result<(JobChangeAction, Option<JobSpec>), RequestError>,
    ) -> Result<JobChange, RequestError> {
        let mut applied = self.applied.lock().await;
        let previous = self.local_spec(job);
        let (action, definition) = decide(previous.clone())?;
        *applied += 1;
        let change = JobChange {
            seq: *applied,
            job: job.to_owned(),
            action,
            definition,
            previous,
            changed_by: self.ctx.instance.to_string(),
            changed: now,
        };
        self.apply_change(&change);
        Ok(change)
    }

    /// Reads the changes recorded since the last one applied here and applies them,
    /// in order, then publishes the definitions they changed (and those whose
    /// publication failed before): `false` if the history could not be read.
    pub(super) async fn sync(&self) -> bool {
        let Some(recorder) = &self.ctx.recorder else {
            return true;
        };
        {
            // One reader at a time, so that each change applies once and in order.
            let mut applied = self.applied.lock().await;
            let changes = match recorder
                .history()
                .changes()
                .job_changes_after(&self.ctx.name, *applied)
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
    fn apply_change(&self, change: &JobChange) -> bool {
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
                match self.ctx.jobs.find(&change.job) {
                    Some((_, state)) => state.redefine(def),
                    None => {
                        self.ctx.jobs.push(JobState::new(def));
                    }
                }
            }
            (JobChangeAction::Remove, _) => {
                if let Some((_, state)) = self.ctx.jobs.find(&change.job) {
                    state.remove();
                }
            }
            _ => return false,
        }
        tracing::info!(job = %change.job, action = change.action.as_str(), seq = change.seq, by = %change.changed_by, "job change applied");
        self.ctx.jobs.notify();
        true
    }

    /// A change of `job` this version cannot apply: the job is left out on this
    /// replica (it fires and takes none of its runs), rather than kept as it was
    /// before a change the other replicas applied; a later change it can read brings
    /// it back.
    fn leave_out(&self, job: &str, error: &str) {
        tracing::error!(%job, %error, "a job change this version cannot apply: the job is left out on this replica until a change it can read; upgrade it");
        if let Some((_, state)) = self.ctx.jobs.find(job) {
            state.remove();
            self.ctx.jobs.notify();
        }
    }

    /// Publishes (or takes away, once removed) the definitions of the jobs changed
    /// since the last publication; those that fail are tried again next time.
    async fn publish_changed(&self) {
        let Some(recorder) = &self.ctx.recorder else {
            return;
        };
        let jobs: Vec<String> = lock(&self.unpublished).drain().collect();
        let history = recorder.history();
        for job in jobs {
            let result = match self.ctx.jobs.find(&job) {
                Some((_, state)) if !state.is_removed() => {
                    let definition = self.definition(&state);
                    history
                        .definitions()
                        .publish_jobs(&self.ctx.name, &self.ctx.instance, &[definition])
                        .await
                }
                _ => {
                    history
                        .definitions()
                        .unpublish_job(&self.ctx.name, &job)
                        .await
                }
            };
            if let Err(err) = result {
                recorder.health.fail(&err);
                lock(&self.unpublished).insert(job);
            }
        }
    }

    /// The definition `spec` puts in force from `change`'s time.
    fn def_of(&self, spec: &JobSpec, change: &JobChange) -> Result<JobDef, BuildError> {
        let schedule = check_spec(spec, &self.ctx.name, self.ctx.max_resource_len)?;
        let (handler, runnable) = match self.handlers.get(spec.handler_name()) {
            Some(handler) => (Arc::clone(handler), true),
            None => (
                missing_handler(spec.handler_name(), &self.ctx.instance),
                false,
            ),
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
    fn definition(&self, state: &JobState) -> JobDefinition {
        let def = state.def();
        let spec = &def.job.spec;
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        JobDefinition {
            job: spec.name().to_owned(),
            schedule: def.schedule.expression().to_owned(),
            time_zone: def.schedule.zone().to_owned(),
            misfire: spec.misfire_policy().to_text(),
            dst: Some(def.schedule.dst().to_string()),
            timeout_ms: spec.run_timeout().map(ms),
            handler: Some(spec.handler_name().to_owned()),
            grace_ms: Some(ms(spec.grace())),
            on_leader: Some(spec.on_leader()),
            updated: self.ctx.clock.now(),
            updated_by: self.ctx.instance.to_string(),
        }
    }

    /// This replica's definition of `job` (declared in code, or applied here).
    pub(super) fn local_spec(&self, job: &str) -> Option<JobSpec> {
        let (_, state) = self.ctx.job(job).ok()?;
        Some(state.def().job.spec.clone())
    }

    /// On every replica with a history, from start to shutdown: applies the changes
    /// recorded (every [`JOB_CHANGE_POLL`]) and publishes this replica's job definitions
    /// for admin tools once it has applied those recorded at its start (retried with a
    /// backoff of 1 s, doubling up to 30 s, until the database takes them).
    pub(super) async fn follow(&self, stop: CancellationToken) {
        let inner = self;
        let Some(recorder) = inner.ctx.recorder.clone() else {
            return;
        };
        let mut backoff = Duration::from_secs(1);
        let mut publish_at = Some(tokio::time::Instant::now());
        loop {
            let synced = inner.sync().await;
            if synced && publish_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
                let definitions: Vec<JobDefinition> = inner
                    .ctx
                    .jobs
                    .live()
                    .iter()
                    .map(|state| inner.definition(state))
                    .collect();
                match recorder
                    .history()
                    .definitions()
                    .publish_jobs(&inner.ctx.name, &inner.ctx.instance, &definitions)
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
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(JOB_CHANGE_POLL) => {}
            }
        }
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
