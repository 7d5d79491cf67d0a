//! [`SchedulerBuilder`]: jobs and options, checked in `build()`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redlock_core::Redlock;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::changes::Changes;
use super::context::Context;
use super::handoff::Handoffs;
use super::parts::Parts;
use super::requests::Requests;
use super::state::{JobDef, JobState, JobTable, Slots, jobs_digest};
use super::tenure::Tenure;
use super::tick::Ticks;
use super::{Inner, Scheduler};
use crate::error::BuildError;
use crate::history::History;
use crate::job::{Handler, Job, JobContext};
use crate::keys;
use crate::leader::{DEFAULT_RETRY_INTERVAL, DEFAULT_TERM, check_election};
use crate::record::Recorder;
use crate::status::HealthCell;
use crate::time::{Clock, SystemClock};

/// Builds a [`Scheduler`]; see [`Scheduler::builder`].
#[must_use = "a builder does nothing until `build()`"]
pub struct SchedulerBuilder {
    redlock: Redlock,
    name: String,
    instance: Option<String>,
    jobs: Vec<Job>,
    handlers: Vec<(String, Handler)>,
    history: Option<History>,
    clock: Arc<dyn Clock>,
    leader_ttl: Option<Duration>,
    term: Duration,
    retry_interval: Duration,
    max_concurrent_runs: Option<usize>,
}

impl std::fmt::Debug for SchedulerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerBuilder")
            .field("name", &self.name)
            .field("instance", &self.instance)
            .field("jobs", &self.jobs)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler whose locks go through `redlock`.
    pub fn builder(redlock: Redlock) -> SchedulerBuilder {
        SchedulerBuilder::new(redlock)
    }
}

impl SchedulerBuilder {
    fn new(redlock: Redlock) -> Self {
        Self {
            redlock,
            name: Scheduler::DEFAULT_NAME.to_owned(),
            instance: None,
            jobs: Vec::new(),
            handlers: Vec::new(),
            history: None,
            clock: Arc::new(SystemClock),
            leader_ttl: None,
            term: DEFAULT_TERM,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            max_concurrent_runs: None,
        }
    }

    /// Adds a job.
    pub fn job(mut self, job: Job) -> Self {
        self.jobs.push(job);
        self
    }

    /// Registers `handler` under `name`, for jobs added at run time
    /// ([`Scheduler::add_job`], [`SchedulerAdmin::add_job`](crate::admin::SchedulerAdmin::add_job))
    /// that name it with [`JobSpec::handler`](crate::JobSpec::handler). Each job declared
    /// with [`job`](Self::job) registers its handler under the job's name too. Register
    /// the same handlers on every replica: a run goes only to replicas that have its
    /// handler, and a leader without it records the run as failed.
    ///
    /// ```
    /// # fn redlock() -> redlock_core::Redlock {
    /// #     redlock_core::Redlock::builder().nodes(["redis://127.0.0.1:1"]).build().unwrap()
    /// # }
    /// use redlock_scheduler::{JobContext, Scheduler};
    ///
    /// let scheduler = Scheduler::builder(redlock())
    ///     .handler("export", |ctx: JobContext| async move {
    ///         println!("exporting for {} at {}", ctx.job(), ctx.tick());
    ///         Ok::<_, std::io::Error>(())
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # drop(scheduler);
    /// ```
    pub fn handler<F, Fut, E>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: Into<redlock_core::BoxError> + 'static,
    {
        self.handlers
            .push((name.into(), crate::job::handler_of(handler)));
        self
    }

    /// Records every run in `history` (SQLite or PostgreSQL); the database then refuses
    /// a second run of a tick too, and gives the last fired tick after a fail-over.
    /// Without one, the Redis claims alone keep each tick to one run.
    pub fn history(mut self, history: History) -> Self {
        self.history = Some(history);
        self
    }

    /// The scheduler's name (default [`Scheduler::DEFAULT_NAME`], `"scheduler"`): replicas with the same name (and
    /// the same Redis nodes) form one cluster; it prefixes the lock and claim keys and
    /// keys the history's rows, so schedulers of different names share a database
    /// without meeting. At most [`keys::max_scheduler_name_len`] bytes (485 under the
    /// default `max_resource_len`), and each byte of it is one less for the job names
    /// (see [`keys`]); [`build`](Self::build) refuses a longer one.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// This replica's id, as recorded in the history (default: process id and random
    /// bits).
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// The wall clock (default: the system's). Lock timing never uses it.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The leadership lock's TTL (default: the `Redlock`'s): a dead leader is replaced
    /// within this plus one retry interval. Ticks that come due meanwhile are run late
    /// (or skipped and recorded) per each job's [`Misfire`](crate::job::Misfire) policy.
    pub fn leader_ttl(mut self, ttl: Duration) -> Self {
        self.leader_ttl = Some(ttl);
        self
    }

    /// How long one leadership lasts before the leader hands over (default 10 min).
    pub fn leadership_term(mut self, term: Duration) -> Self {
        self.term = term;
        self
    }

    /// How often followers retry while the leader's lock stands (default 100 ms).
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// How many runs this replica takes at once (default: no limit). With a
    /// [`History`](crate::History) the leader hands each on-time tick to the replica
    /// with the fewest runs going among those alive with room for one more, itself
    /// included; a replica at its limit gets none until a run ends. A run that only the
    /// leader may start (a job marked [`Job::run_on_leader`], a late run of a missed
    /// tick, every run without a history) waits for room on the leader. A tick that
    /// finds no room waits until its misfire grace window ends, then is recorded as
    /// skipped (reason `no_room`). An operator's [`Scheduler::trigger`] is not held back.
    pub fn max_concurrent_runs(mut self, runs: usize) -> Self {
        self.max_concurrent_runs = Some(runs);
        self
    }

    /// Checks every job and option.
    ///
    /// # Errors
    ///
    /// [`BuildError`] naming the offending job and input: an empty or duplicate name, an
    /// invalid cron expression or time zone, a zero timeout, a zero
    /// `max_concurrent_runs`; [`BuildError::NameTooLong`] for a scheduler name longer
    /// than [`keys::max_scheduler_name_len`] (485 bytes under the default
    /// `max_resource_len` of 512) or a job name longer than
    /// [`keys::max_job_name_len`] (512 less the scheduler name's length less 26: 477
    /// bytes for the default name `scheduler`), so that every lock key made from them
    /// fits under the client's `max_resource_len` for any tick; a zero leadership TTL,
    /// term or retry interval (checked as
    /// [`LeaderElectorBuilder::start`](crate::leader::LeaderElectorBuilder::start) does).
    pub fn build(self) -> Result<Scheduler, BuildError> {
        if self.name.trim().is_empty() {
            return Err(BuildError::InvalidOption {
                what: "scheduler name".to_owned(),
                reason: "must not be empty".to_owned(),
            });
        }
        let max_resource_len = self.redlock.max_resource_len();
        keys::check_scheduler(&self.name, max_resource_len)?;
        let mut names = HashSet::new();
        let mut jobs = Vec::with_capacity(self.jobs.len());
        let mut handlers: HashMap<String, Handler> = HashMap::new();
        for (name, handler) in self.handlers {
            if name.trim().is_empty() {
                return Err(BuildError::InvalidOption {
                    what: "handler name".to_owned(),
                    reason: "must not be empty".to_owned(),
                });
            }
            if handlers.insert(name.clone(), handler).is_some() {
                return Err(BuildError::DuplicateHandler { name });
            }
        }
        for job in self.jobs {
            let name = job.name().to_owned();
            if name.trim().is_empty() {
                return Err(BuildError::EmptyName);
            }
            keys::check_job(&self.name, &name, max_resource_len)?;
            if !names.insert(name.clone()) {
                return Err(BuildError::DuplicateJob { name });
            }
            let schedule = crate::job::parse_schedule(&job.spec)?;
            if handlers
                .insert(name.clone(), Arc::clone(&job.handler))
                .is_some()
            {
                return Err(BuildError::DuplicateHandler { name });
            }
            jobs.push(JobState::new(JobDef {
                job,
                schedule,
                since: None,
                version: 0,
                runnable: true,
            }));
        }
        check_election(self.leader_ttl, self.term, self.retry_interval)?;
        if self.max_concurrent_runs == Some(0) {
            return Err(BuildError::InvalidOption {
                what: "max_concurrent_runs".to_owned(),
                reason: "must be at least 1 (a replica that should run nothing is not started)"
                    .to_owned(),
            });
        }
        let jobs_digest = jobs_digest(jobs.iter().map(|state| &*state.name));
        let instance: Arc<str> = self
            .instance
            .unwrap_or_else(crate::leader::random_instance)
            .into();
        let recorder = self.history.map(|h| {
            Arc::new(Recorder::new(
                h,
                self.name.clone(),
                Arc::clone(&instance),
                Arc::clone(&self.clock),
            ))
        });
        let handler_names = {
            let mut names: Vec<&String> = handlers.keys().collect();
            names.sort_unstable();
            serde_json::to_string(&names).unwrap_or_default()
        };
        let ctx = Arc::new(Context {
            redlock: self.redlock,
            name: self.name,
            max_resource_len,
            instance,
            clock: self.clock,
            recorder,
            jobs: JobTable::new(jobs),
            slots: Slots::new(self.max_concurrent_runs),
            stop_firing: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            runs: TaskTracker::new(),
        });
        let tenure = Tenure::new(
            Arc::clone(&ctx),
            self.leader_ttl,
            self.term,
            self.retry_interval,
        );
        Ok(Scheduler {
            inner: Arc::new(Inner {
                parts: Parts {
                    tenure: Arc::new(tenure),
                    ticks: Arc::new(Ticks::new(Arc::clone(&ctx))),
                    handoffs: Arc::new(Handoffs::new(Arc::clone(&ctx), jobs_digest, handler_names)),
                    changes: Arc::new(Changes::new(Arc::clone(&ctx), handlers)),
                    requests: Arc::new(Requests::new(Arc::clone(&ctx))),
                    ctx,
                },
                background: OnceLock::new(),
                redis_health: Arc::new(HealthCell::new("the Redis quorum", false)),
                ready: tokio::sync::watch::channel(false).0,
                stop_background: CancellationToken::new(),
                background_tasks: TaskTracker::new(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

    use std::time::Duration;

    use redlock_core::Redlock;

    use crate::error::BuildError;
    use crate::scheduler::Scheduler;

    fn redlock() -> Redlock {
        // Nothing is contacted before a lock is asked for.
        Redlock::builder()
            .nodes(["redis://127.0.0.1:1"])
            .build()
            .unwrap()
    }

    #[test]
    fn election_options_must_be_more_than_zero() {
        for (what, builder) in [
            (
                "retry interval",
                Scheduler::builder(redlock()).retry_interval(Duration::ZERO),
            ),
            (
                "leadership term",
                Scheduler::builder(redlock()).leadership_term(Duration::ZERO),
            ),
            (
                "leadership TTL",
                Scheduler::builder(redlock()).leader_ttl(Duration::ZERO),
            ),
        ] {
            match builder.build() {
                Err(BuildError::InvalidOption { what: option, .. }) => {
                    assert!(option.ends_with(what), "{option}");
                }
                other => panic!("{what}: expected InvalidOption, got {other:?}"),
            }
        }
        assert!(Scheduler::builder(redlock()).build().is_ok());
    }

    #[test]
    fn a_replica_takes_at_least_one_run_at_once() {
        match Scheduler::builder(redlock()).max_concurrent_runs(0).build() {
            Err(BuildError::InvalidOption { what, .. }) => assert_eq!(what, "max_concurrent_runs"),
            other => panic!("expected InvalidOption, got {other:?}"),
        }
        assert!(
            Scheduler::builder(redlock())
                .max_concurrent_runs(1)
                .build()
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_shutdown_deadline_too_long_to_count_is_no_deadline() {
        let scheduler = Scheduler::builder(redlock()).build().unwrap();
        tokio::time::timeout(Duration::from_secs(5), scheduler.shutdown(Duration::MAX))
            .await
            .expect("shut down");
    }
}
