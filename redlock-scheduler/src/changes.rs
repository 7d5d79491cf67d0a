//! Jobs changed at run time: [`JobSpec`], a job's definition with its handler named
//! instead of given, and [`JobChange`], one change as the history records it.
//!
//! A change is a row of the history database, numbered per scheduler; every replica
//! reads the new ones within [`JOB_CHANGE_POLL`] and applies them in order, so all
//! replicas converge on the same jobs. The jobs declared in code are where a replica
//! starts; the changes recorded since apply on top of them, on every replica and at
//! every start (a job removed at run time stays removed when a replica that declares
//! it in code starts again, until it is added again).
//!
//! ```
//! use std::time::Duration;
//! use redlock_scheduler::{JobSpec, Misfire};
//!
//! // Runs the handler registered as "export" (`SchedulerBuilder::handler`) every five
//! // minutes, Paris time.
//! let spec = JobSpec::new("export-eu", "0 */5 * * * *")
//!     .handler("export")
//!     .time_zone("Europe/Paris")
//!     .misfire(Misfire::Skip)
//!     .timeout(Duration::from_secs(60));
//! assert_eq!(spec.name(), "export-eu");
//! assert_eq!(spec.handler_name(), "export");
//! ```

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::build_error::BuildError;
use crate::job::{Handler, Job, Misfire};
use crate::time::{DstPolicy, Schedule};

/// How often every replica reads the changes made since it last looked; a change made
/// through a replica's [`Scheduler`](crate::Scheduler) applies there at once.
pub const JOB_CHANGE_POLL: Duration = Duration::from_millis(250);

/// A job's definition without its code: the handler is named, and registered on the
/// replicas with [`SchedulerBuilder::handler`](crate::SchedulerBuilder::handler) (a job
/// declared in code registers its handler under the job's name). The options mean
/// what [`Job`]'s do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobSpec {
    name: String,
    handler: String,
    schedule: String,
    time_zone: String,
    misfire: Misfire,
    #[serde(rename = "misfire_grace_ms", serialize_with = "millis")]
    grace: Duration,
    #[serde(rename = "timeout_ms", serialize_with = "optional_millis")]
    timeout: Option<Duration>,
    #[serde(serialize_with = "display")]
    dst: DstPolicy,
    run_on_leader: bool,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn optional_millis<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => millis(d, s),
        None => s.serialize_none(),
    }
}

fn display<S: serde::Serializer>(dst: &DstPolicy, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(dst)
}

/// The stored form of a [`JobSpec`] (the name is a column of its own).
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    handler: String,
    schedule: String,
    time_zone: String,
    misfire: String,
    grace_ms: u64,
    timeout_ms: Option<u64>,
    dst: String,
    on_leader: bool,
}

impl JobSpec {
    /// A job named `name` on the cron `expression` (5 fields, or 6 with seconds first),
    /// in UTC, running the handler registered under its own name unless
    /// [`handler`](Self::handler) names another. The name may be at most
    /// [`keys::max_job_name_len`](crate::keys::max_job_name_len) bytes (477 beside the
    /// default scheduler name under the default `max_resource_len`): a longer one is
    /// refused by `add_job` and `reschedule_job` with
    /// [`RequestError::NameTooLong`](crate::admin::RequestError::NameTooLong).
    pub fn new(name: impl Into<String>, expression: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            handler: name.clone(),
            name,
            schedule: expression.into(),
            time_zone: "UTC".to_owned(),
            misfire: Misfire::default(),
            grace: Job::DEFAULT_GRACE,
            timeout: None,
            dst: DstPolicy::new(),
            run_on_leader: false,
        }
    }

    /// The handler to run, by the name it was registered under.
    pub fn handler(mut self, handler: impl Into<String>) -> Self {
        self.handler = handler.into();
        self
    }

    /// Another cron expression.
    pub fn schedule(mut self, expression: impl Into<String>) -> Self {
        self.schedule = expression.into();
        self
    }

    /// The IANA time zone the expression is read in (default `UTC`).
    pub fn time_zone(mut self, zone: impl Into<String>) -> Self {
        self.time_zone = zone.into();
        self
    }

    /// See [`Job::dst`].
    pub fn dst(mut self, dst: DstPolicy) -> Self {
        self.dst = dst;
        self
    }

    /// See [`Job::misfire`].
    pub fn misfire(mut self, misfire: Misfire) -> Self {
        self.misfire = misfire;
        self
    }

    /// See [`Job::misfire_grace`].
    pub fn misfire_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// See [`Job::timeout`]; `None` for no timeout.
    pub fn timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.timeout = timeout.into();
        self
    }

    /// See [`Job::run_on_leader`] (`false`: runs may go to any replica).
    pub fn run_on_leader(mut self, on_leader: bool) -> Self {
        self.run_on_leader = on_leader;
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the handler it runs.
    pub fn handler_name(&self) -> &str {
        &self.handler
    }

    /// Its cron expression.
    pub fn expression(&self) -> &str {
        &self.schedule
    }

    /// Its time zone.
    pub fn zone(&self) -> &str {
        &self.time_zone
    }

    /// The spec of a job declared in code (its handler under the job's name).
    pub(crate) fn of_job(job: &Job, handler: &str) -> Self {
        Self {
            name: job.name.clone(),
            handler: handler.to_owned(),
            schedule: job.expression.clone(),
            time_zone: job.zone.clone(),
            misfire: job.misfire,
            grace: job.grace,
            timeout: job.timeout,
            dst: job.dst,
            run_on_leader: job.on_leader,
        }
    }

    /// The job it defines, running `handler`.
    pub(crate) fn to_job(&self, handler: Handler) -> Job {
        Job {
            name: self.name.clone(),
            expression: self.schedule.clone(),
            zone: self.time_zone.clone(),
            handler,
            misfire: self.misfire,
            grace: self.grace,
            timeout: self.timeout,
            dst: self.dst,
            on_leader: self.run_on_leader,
        }
    }

    /// Checks it as [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) checks
    /// a job of the scheduler `scheduler` whose client takes resource names up to
    /// `max_resource_len` bytes: its parsed schedule.
    ///
    /// # Errors
    ///
    /// [`BuildError`] naming the job and the input; [`BuildError::NameTooLong`] for a
    /// name too long for its keys (see [`crate::keys`]).
    pub(crate) fn check(
        &self,
        scheduler: &str,
        max_resource_len: usize,
    ) -> Result<Schedule, BuildError> {
        if self.name.trim().is_empty() {
            return Err(BuildError::EmptyName);
        }
        crate::keys::check_job(scheduler, &self.name, max_resource_len)?;
        if self.handler.trim().is_empty() {
            return Err(BuildError::InvalidOption {
                what: format!("job `{}`: handler", self.name),
                reason: "must name a registered handler".to_owned(),
            });
        }
        let unused: Handler = std::sync::Arc::new(|_| Box::pin(async { Ok(()) }));
        self.to_job(unused).parse_schedule()
    }

    /// The stored form (JSON; the name is stored beside it).
    pub(crate) fn to_text(&self) -> String {
        let stored = Stored {
            handler: self.handler.clone(),
            schedule: self.schedule.clone(),
            time_zone: self.time_zone.clone(),
            misfire: self.misfire.to_text(),
            grace_ms: u64::try_from(self.grace.as_millis()).unwrap_or(u64::MAX),
            timeout_ms: self
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            dst: self.dst.to_string(),
            on_leader: self.run_on_leader,
        };
        serde_json::to_string(&stored).unwrap_or_default()
    }

    /// Reads what [`to_text`](Self::to_text) wrote for the job `name`.
    pub(crate) fn from_text(name: &str, text: &str) -> Result<Self, String> {
        let stored: Stored = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Ok(Self {
            name: name.to_owned(),
            handler: stored.handler,
            schedule: stored.schedule,
            time_zone: stored.time_zone,
            misfire: Misfire::from_text(&stored.misfire)
                .ok_or_else(|| format!("unknown misfire policy `{}`", stored.misfire))?,
            grace: Duration::from_millis(stored.grace_ms),
            timeout: stored.timeout_ms.map(Duration::from_millis),
            dst: DstPolicy::from_str(&stored.dst)?,
            run_on_leader: stored.on_leader,
        })
    }
}

/// What a change did to its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobChangeAction {
    /// Added a job that was not there.
    Add,
    /// Put another definition in force for a job that was there.
    Reschedule,
    /// Took a job away.
    Remove,
}

impl JobChangeAction {
    /// Its name in the history (`add`, `reschedule`, `remove`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Reschedule => "reschedule",
            Self::Remove => "remove",
        }
    }

    pub(crate) fn from_text(text: &str) -> Option<Self> {
        match text {
            "add" => Some(Self::Add),
            "reschedule" => Some(Self::Reschedule),
            "remove" => Some(Self::Remove),
            _ => None,
        }
    }
}

/// One change of a job at run time, as recorded: what, by whom, when, old → new.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct JobChange {
    /// Its number: changes apply in this order.
    pub seq: u64,
    /// The job.
    pub job: String,
    /// What it did.
    pub action: JobChangeAction,
    /// The definition it put in force (`None` for a removal).
    pub definition: Option<JobSpec>,
    /// The definition it replaced (`None` for an addition).
    pub previous: Option<JobSpec>,
    /// Who made it (the operator's name, or the replica's id).
    pub changed_by: String,
    /// When it was made (the writer's clock); the new definition fires no tick before.
    pub changed: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use redlock_core::DEFAULT_MAX_RESOURCE_LEN;

    use super::*;
    use crate::keys::NameKind;
    use crate::time::{Fold, Gap};

    #[test]
    fn the_stored_form_round_trips() {
        let spec = JobSpec::new("a", "*/5 * * * * *")
            .handler("h")
            .time_zone("Europe/Berlin")
            .dst(DstPolicy::new().gap(Gap::Skip).fold(Fold::Twice))
            .misfire(Misfire::CatchUp { max: 3 })
            .misfire_grace(Duration::from_secs(5))
            .timeout(Duration::from_millis(1500))
            .run_on_leader(true);
        assert_eq!(JobSpec::from_text("a", &spec.to_text()).unwrap(), spec);
        assert!(JobSpec::from_text("a", "{}").is_err());
    }

    #[test]
    fn a_spec_is_checked_as_a_job_is() {
        assert!(
            JobSpec::new("a", "* * * * *")
                .check("scheduler", DEFAULT_MAX_RESOURCE_LEN)
                .is_ok()
        );
        assert!(matches!(
            JobSpec::new("a", "every minute").check("scheduler", DEFAULT_MAX_RESOURCE_LEN),
            Err(BuildError::InvalidSchedule { .. })
        ));
        assert!(matches!(
            JobSpec::new("a", "* * * * *")
                .time_zone("Mars/Olympus")
                .check("scheduler", DEFAULT_MAX_RESOURCE_LEN),
            Err(BuildError::InvalidSchedule { .. })
        ));
        assert!(matches!(
            JobSpec::new(" ", "* * * * *").check("scheduler", DEFAULT_MAX_RESOURCE_LEN),
            Err(BuildError::EmptyName)
        ));
        assert!(matches!(
            JobSpec::new("a", "* * * * *")
                .handler("")
                .check("scheduler", DEFAULT_MAX_RESOURCE_LEN),
            Err(BuildError::InvalidOption { .. })
        ));
        assert!(matches!(
            JobSpec::new("a", "* * * * *")
                .timeout(Duration::ZERO)
                .check("scheduler", DEFAULT_MAX_RESOURCE_LEN),
            Err(BuildError::InvalidOption { .. })
        ));
        // The name, against the keys made from it (477 bytes beside `scheduler`).
        let longest = "j".repeat(477);
        assert!(
            JobSpec::new(longest.as_str(), "* * * * *")
                .check("scheduler", DEFAULT_MAX_RESOURCE_LEN)
                .is_ok()
        );
        assert!(matches!(
            JobSpec::new(format!("{longest}j"), "* * * * *")
                .check("scheduler", DEFAULT_MAX_RESOURCE_LEN),
            Err(BuildError::NameTooLong {
                kind: NameKind::Job,
                len: 478,
                max: 477,
                ..
            })
        ));
        assert!(matches!(
            JobSpec::new("a", "* * * * *").check(&"s".repeat(486), DEFAULT_MAX_RESOURCE_LEN),
            Err(BuildError::NameTooLong {
                kind: NameKind::Scheduler,
                len: 486,
                max: 485,
                ..
            })
        ));
    }
}
