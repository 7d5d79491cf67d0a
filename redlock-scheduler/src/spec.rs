//! One job's definition, its options written once: [`JobSpec`] (the name, the cron
//! expression, the time zone and DST policy, the [`Misfire`] policy and its grace
//! window, the timeout, where runs go, and the handler by name) and its stored form.
//! A [`Job`](crate::Job) declared in code is a spec plus its handler; a job changed at
//! run time is a spec alone, naming a handler registered on the replicas. This module
//! uses nothing of the crate but the time types: the history, the changes and the
//! scheduler read specs, never the other way.
//!
//! ```
//! use std::time::Duration;
//! use redlock_scheduler::job::{JobSpec, Misfire};
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

use crate::time::DstPolicy;

/// The default misfire grace window ([`JobSpec::misfire_grace`]): ticks missed longer
/// ago are forgotten.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(60);

/// What to do with ticks that were missed (no replica led, or the leader was late).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
#[non_exhaustive]
pub enum Misfire {
    /// Do not run them (each is recorded as skipped, with the reason).
    Skip,
    /// The default: run the latest missed tick once, late (unless a tick is due on time
    /// anyway); the older missed ticks are recorded as skipped. A fail-over delays a
    /// tick; it does not lose it.
    #[default]
    RunOnce,
    /// Run up to `max` missed ticks, the latest ones, oldest first.
    CatchUp {
        /// How many missed ticks to run at most.
        max: u32,
    },
}

impl Misfire {
    /// The policy as stored with the published job definitions: `skip`, `run_once`,
    /// `catch_up:<max>`.
    pub(crate) fn to_text(self) -> String {
        match self {
            Self::Skip => "skip".to_owned(),
            Self::RunOnce => "run_once".to_owned(),
            Self::CatchUp { max } => format!("catch_up:{max}"),
        }
    }

    /// Reads what [`to_text`](Self::to_text) wrote.
    pub(crate) fn from_text(text: &str) -> Option<Self> {
        match text {
            "skip" => Some(Self::Skip),
            "run_once" => Some(Self::RunOnce),
            other => other
                .strip_prefix("catch_up:")
                .and_then(|max| max.parse().ok())
                .map(|max| Self::CatchUp { max }),
        }
    }
}

/// A job's definition without its code: the handler is named, and registered on the
/// replicas with [`SchedulerBuilder::handler`](crate::SchedulerBuilder::handler) (a job
/// declared in code registers its handler under the job's name). The options mean
/// what [`Job`](crate::Job)'s do.
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
    /// [`RequestError::NameTooLong`](crate::error::RequestError::NameTooLong).
    pub fn new(name: impl Into<String>, expression: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            handler: name.clone(),
            name,
            schedule: expression.into(),
            time_zone: "UTC".to_owned(),
            misfire: Misfire::default(),
            grace: DEFAULT_GRACE,
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

    /// What a fixed-time job does in a skipped or repeated stretch of local time; see
    /// [`Job::dst`](crate::Job::dst).
    pub fn dst(mut self, dst: DstPolicy) -> Self {
        self.dst = dst;
        self
    }

    /// See [`Job::misfire`](crate::Job::misfire).
    pub fn misfire(mut self, misfire: Misfire) -> Self {
        self.misfire = misfire;
        self
    }

    /// See [`Job::misfire_grace`](crate::Job::misfire_grace).
    pub fn misfire_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// See [`Job::timeout`](crate::Job::timeout); `None` for no timeout.
    pub fn timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.timeout = timeout.into();
        self
    }

    /// See [`Job::run_on_leader`](crate::Job::run_on_leader) (`false`: runs may go to any replica).
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

    /// What it does with missed ticks.
    pub(crate) fn misfire_policy(&self) -> Misfire {
        self.misfire
    }

    /// How old a missed tick may be and still count.
    pub(crate) fn grace(&self) -> Duration {
        self.grace
    }

    /// How long a run may take (`None`: no bound).
    pub(crate) fn run_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Its DST policy.
    pub(crate) fn dst_policy(&self) -> DstPolicy {
        self.dst
    }

    /// Whether its runs stay on the leader.
    pub(crate) fn on_leader(&self) -> bool {
        self.run_on_leader
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
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
    fn misfire_text_round_trips() {
        for misfire in [Misfire::Skip, Misfire::RunOnce, Misfire::CatchUp { max: 7 }] {
            assert_eq!(Misfire::from_text(&misfire.to_text()), Some(misfire));
        }
        assert_eq!(Misfire::from_text("catch_up:x"), None);
        assert_eq!(Misfire::from_text("later"), None);
    }
}
