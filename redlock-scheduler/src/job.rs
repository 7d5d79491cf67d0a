//! A job: a name, a schedule, a handler, and what to do about missed ticks, overlaps and
//! runs that take too long. A [`Job`] is a [`JobSpec`] (its options, as data) with its
//! handler; the handler gets a [`JobContext`]; [`Misfire`] says what to do about the
//! ticks missed while no replica led.
//!
//! ```
//! use std::time::Duration;
//! use redlock_scheduler::job::{Job, JobContext, Misfire};
//!
//! let job = Job::new("invoices", "0 */5 * * * *", |ctx: JobContext| async move {
//!     // The tick this run is for (not "now"), and the token to fence writes with.
//!     println!("{} for {} with token {}", ctx.job(), ctx.tick(), ctx.fencing_token());
//!     Ok::<_, std::io::Error>(())
//! })
//! .time_zone("Europe/Paris")
//! .misfire(Misfire::CatchUp { max: 3 })
//! .timeout(Duration::from_secs(60));
//! assert_eq!(job.name(), "invoices");
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::BoxError;
use tokio_util::sync::CancellationToken;

use crate::error::{BuildError, TransactionError};
pub use crate::spec::{JobSpec, Misfire};
use crate::time::{BoxFuture, DstPolicy, Schedule};
use crate::transaction::{RunRecord, RunScope, RunTransaction};

pub(crate) type Handler =
    Arc<dyn Fn(JobContext) -> BoxFuture<'static, Result<(), BoxError>> + Send + Sync>;

/// What a run is told.
#[derive(Debug, Clone)]
pub struct JobContext {
    pub(crate) job: Arc<str>,
    pub(crate) tick: DateTime<Utc>,
    pub(crate) fencing_token: u64,
    pub(crate) instance: Arc<str>,
    pub(crate) cancel: CancellationToken,
    pub(crate) manual: bool,
    /// The history, for [`transaction`](Self::transaction) (`None` without one).
    pub(crate) record: Option<Arc<RunRecord>>,
}

impl JobContext {
    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The scheduled tick this run is for: the planned time, not the time it started.
    pub fn tick(&self) -> DateTime<Utc> {
        self.tick
    }

    /// A token strictly greater than that of every earlier leadership: pass it along with
    /// writes and have the target reject writes carrying an older one, so that a replica
    /// that lost leadership without noticing (a long pause) cannot overwrite newer work.
    /// A run that goes on while the leadership changes hands keeps the earlier token,
    /// which such a store refuses once the new leader's runs wrote; a run's transaction
    /// ([`transaction`](Self::transaction)) is fenced by the run's own lock instead, and
    /// commits.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The replica running it.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Fires when the run must stop: leadership lost, the tick's claim lost, the job's
    /// timeout reached, shutdown past its deadline, or an operator cancelled the run. Stop promptly when it does; the
    /// run is dropped a short grace time later.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Completes when [`cancellation_token`](Self::cancellation_token) fires.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// Started by [`Scheduler::trigger`](crate::Scheduler::trigger), not by the schedule.
    pub fn is_manual(&self) -> bool {
        self.manual
    }

    /// Opens a transaction on the history database in which the job's writes commit
    /// together with the run's `succeeded` row, guarded by the fencing token of the run's
    /// lock on its job ([`RunTransaction::commit`]). See [the `transaction`
    /// module](crate::transaction).
    ///
    /// # Errors
    ///
    /// [`TransactionError::NoHistory`] without a history; [`TransactionError::RunEnded`]
    /// when the run was already told to stop; [`TransactionError::History`] when the
    /// database fails.
    pub async fn transaction(&self) -> Result<RunTransaction, TransactionError> {
        RunTransaction::begin(self.run_scope()?).await
    }

    /// [`transaction`](Self::transaction) on a memory history (a simulation's, feature
    /// `sim`): the job's writes are strings kept with the run's row.
    ///
    /// # Errors
    ///
    /// As [`transaction`](Self::transaction); [`TransactionError::History`] on a
    /// history kept in a database.
    #[cfg(feature = "sim")]
    pub async fn memory_transaction(
        &self,
    ) -> Result<crate::transaction::MemoryTransaction, TransactionError> {
        crate::transaction::MemoryTransaction::begin(self.run_scope()?).await
    }

    fn run_scope(&self) -> Result<RunScope, TransactionError> {
        let record = self.record.clone().ok_or(TransactionError::NoHistory)?;
        Ok(RunScope {
            job: Arc::clone(&self.job),
            tick: self.tick,
            fencing_token: self.fencing_token,
            instance: Arc::clone(&self.instance),
            manual: self.manual,
            cancel: self.cancel.clone(),
            record,
        })
    }
}

/// A handler behind the type every job keeps.
pub(crate) fn handler_of<F, Fut, E>(handler: F) -> Handler
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    Arc::new(move |ctx| {
        let run = handler(ctx);
        Box::pin(async move { run.await.map_err(Into::into) })
    })
}

/// One job definition. Every replica must declare the same jobs (same names and
/// schedules). A [`JobSpec`] (the options, written once) and the handler it runs; the
/// setters here set the spec's.
#[derive(Clone)]
pub struct Job {
    pub(crate) spec: JobSpec,
    pub(crate) handler: Handler,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = &self.spec;
        f.debug_struct("Job")
            .field("name", &spec.name())
            .field("expression", &spec.expression())
            .field("zone", &spec.zone())
            .field("misfire", &spec.misfire_policy())
            .field("grace", &spec.grace())
            .field("timeout", &spec.run_timeout())
            .field("dst", &spec.dst_policy())
            .field("on_leader", &spec.on_leader())
            .finish_non_exhaustive()
    }
}

impl Job {
    /// The default misfire grace window ([`misfire_grace`](Self::misfire_grace)):
    /// ticks missed longer ago are forgotten.
    pub const DEFAULT_GRACE: Duration = crate::spec::DEFAULT_GRACE;

    /// A job named `name` running `handler` on the cron `expression` (5 fields, or 6 with
    /// seconds first), in UTC unless [`time_zone`](Self::time_zone) says otherwise. The
    /// expression is checked by [`SchedulerBuilder::build`](crate::SchedulerBuilder::build),
    /// and so is the name: at most
    /// [`keys::max_job_name_len`](crate::keys::max_job_name_len) bytes (477 beside the
    /// default scheduler name under the default `max_resource_len`), so that every lock
    /// key made from it fits.
    pub fn new<F, Fut, E>(
        name: impl Into<String>,
        expression: impl Into<String>,
        handler: F,
    ) -> Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        Self {
            spec: JobSpec::new(name, expression),
            handler: handler_of(handler),
        }
    }

    /// The IANA time zone the expression is read in (default `UTC`); see
    /// [`dst`](Self::dst) for the DST behaviour.
    pub fn time_zone(mut self, zone: impl Into<String>) -> Self {
        self.spec = self.spec.time_zone(zone);
        self
    }

    /// What a fixed-time job (one second, minute and hour: `30 2 * * *`) does when its
    /// wall time falls in a skipped stretch of local time (spring forward) or in a
    /// repeated one (fall back): default [`Gap::RunAtEnd`](crate::time::Gap::RunAtEnd)
    /// (02:30 runs at 03:00 that day) and [`Fold::Once`](crate::time::Fold::Once) (01:30
    /// runs at its first pass only). Interval jobs (`*/15 * * * *`, `30 * * * *`) keep
    /// their real-time cadence whatever the policy. See [`DstPolicy`].
    ///
    /// Every replica should declare the same policy; the one published to the history
    /// is what admin tools compute next ticks with.
    ///
    /// ```
    /// use redlock_scheduler::time::{DstPolicy, Fold, Gap};
    /// use redlock_scheduler::{Job, JobContext};
    ///
    /// // A job at 02:30 Berlin time: not run on the day 02:00 jumps to 03:00, run at
    /// // 02:30 summer time and again at 02:30 winter time on the day 03:00 goes back
    /// // to 02:00.
    /// let job = Job::new("meter", "30 2 * * *", |_ctx: JobContext| async {
    ///     Ok::<_, std::io::Error>(())
    /// })
    /// .time_zone("Europe/Berlin")
    /// .dst(DstPolicy::new().gap(Gap::Skip).fold(Fold::Twice));
    /// assert_eq!(job.name(), "meter");
    /// ```
    pub fn dst(mut self, dst: DstPolicy) -> Self {
        self.spec = self.spec.dst(dst);
        self
    }

    /// What to do with missed ticks (default [`Misfire::RunOnce`]).
    pub fn misfire(mut self, misfire: Misfire) -> Self {
        self.spec = self.spec.misfire(misfire);
        self
    }

    /// How old a missed tick may be and still count (default 60 s); older ones are
    /// forgotten. Without a history store it is also capped by how long the Redis claims
    /// can be kept (the `Redlock`'s maximum TTL).
    pub fn misfire_grace(mut self, grace: Duration) -> Self {
        self.spec = self.spec.misfire_grace(grace);
        self
    }

    /// Cancels a run that takes longer (through its token), records it as timed out.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec = self.spec.timeout(timeout);
        self
    }

    /// Runs every tick of this job on the leader, never on another replica. With a
    /// [`History`](crate::History), the leader hands runs to the replicas with the
    /// fewest runs going (see
    /// [`SchedulerBuilder::max_concurrent_runs`](crate::SchedulerBuilder::max_concurrent_runs));
    /// a job that needs what only the leader has (state it keeps in memory, a
    /// connection it alone opens) opts out here. Its runs end when the leadership ends,
    /// as every run does without a history.
    pub fn run_on_leader(mut self) -> Self {
        self.spec = self.spec.run_on_leader(true);
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        self.spec.name()
    }
}

/// `spec`'s schedule, parsed and checked as [`SchedulerBuilder::build`](crate::SchedulerBuilder::build)
/// checks a job declared in code (its name is checked apart, against the scheduler's).
///
/// # Errors
///
/// [`BuildError`] naming the job and the input.
pub(crate) fn parse_schedule(spec: &JobSpec) -> Result<Schedule, BuildError> {
    let schedule = Schedule::parse(spec.expression(), spec.zone())
        .map_err(|reason| BuildError::InvalidSchedule {
            job: spec.name().to_owned(),
            expression: format!("{} in {}", spec.expression(), spec.zone()),
            reason,
        })?
        .with_dst(spec.dst_policy());
    if spec.run_timeout().is_some_and(|t| t.is_zero()) {
        return Err(BuildError::InvalidOption {
            what: format!("job `{}`: timeout", spec.name()),
            reason: "must be more than zero".to_owned(),
        });
    }
    Ok(schedule)
}

/// Checks `spec` as [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) checks
/// a job of the scheduler `scheduler` whose client takes resource names up to
/// `max_resource_len` bytes, its handler named: its parsed schedule.
///
/// # Errors
///
/// [`BuildError`] naming the job and the input; [`BuildError::NameTooLong`] for a
/// name too long for its keys (see [`crate::keys`]).
pub(crate) fn check_spec(
    spec: &JobSpec,
    scheduler: &str,
    max_resource_len: usize,
) -> Result<Schedule, BuildError> {
    if spec.name().trim().is_empty() {
        return Err(BuildError::EmptyName);
    }
    crate::keys::check_job(scheduler, spec.name(), max_resource_len)?;
    if spec.handler_name().trim().is_empty() {
        return Err(BuildError::InvalidOption {
            what: format!("job `{}`: handler", spec.name()),
            reason: "must name a registered handler".to_owned(),
        });
    }
    parse_schedule(spec)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;

    use super::*;
    use crate::error::NameTooLong;
    use crate::keys::NameKind;

    #[test]
    fn a_spec_is_checked_as_a_job_is() {
        assert!(
            check_spec(
                &JobSpec::new("a", "* * * * *"),
                "scheduler",
                DEFAULT_MAX_RESOURCE_LEN
            )
            .is_ok()
        );
        assert!(matches!(
            check_spec(
                &JobSpec::new("a", "every minute"),
                "scheduler",
                DEFAULT_MAX_RESOURCE_LEN
            ),
            Err(BuildError::InvalidSchedule { .. })
        ));
        assert!(matches!(
            check_spec(
                &JobSpec::new("a", "* * * * *").time_zone("Mars/Olympus"),
                "scheduler",
                DEFAULT_MAX_RESOURCE_LEN
            ),
            Err(BuildError::InvalidSchedule { .. })
        ));
        assert!(matches!(
            check_spec(
                &JobSpec::new(" ", "* * * * *"),
                "scheduler",
                DEFAULT_MAX_RESOURCE_LEN
            ),
            Err(BuildError::EmptyName)
        ));
        assert!(matches!(
            check_spec(
                &JobSpec::new("a", "* * * * *").handler(""),
                "scheduler",
                DEFAULT_MAX_RESOURCE_LEN
            ),
            Err(BuildError::InvalidOption { .. })
        ));
        assert!(matches!(
            check_spec(
                &JobSpec::new("a", "* * * * *").timeout(Duration::ZERO),
                "scheduler",
                DEFAULT_MAX_RESOURCE_LEN
            ),
            Err(BuildError::InvalidOption { .. })
        ));
        // The name, against the keys made from it (477 bytes beside `scheduler`).
        let longest = "j".repeat(477);
        assert!(
            check_spec(
                &JobSpec::new(longest.as_str(), "* * * * *"),
                "scheduler",
                DEFAULT_MAX_RESOURCE_LEN
            )
            .is_ok()
        );
        assert!(matches!(
            check_spec(
                &JobSpec::new(format!("{longest}j"), "* * * * *"),
                "scheduler",
                DEFAULT_MAX_RESOURCE_LEN
            ),
            Err(BuildError::NameTooLong(NameTooLong {
                kind: NameKind::Job,
                len: 478,
                max: 477,
                ..
            }))
        ));
        assert!(matches!(
            check_spec(
                &JobSpec::new("a", "* * * * *"),
                &"s".repeat(486),
                DEFAULT_MAX_RESOURCE_LEN
            ),
            Err(BuildError::NameTooLong(NameTooLong {
                kind: NameKind::Scheduler,
                len: 486,
                max: 485,
                ..
            }))
        ));
    }
}
