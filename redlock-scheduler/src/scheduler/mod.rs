//! [`Scheduler`]: the leader fires the jobs; every tick is claimed before it runs.
//!
//! Each replica declares the same jobs. The elected leader wakes at each tick of each
//! job, **claims** it (a lock on the scheduler's name, the job's name and the tick's
//! scheduled time, not "now"; then, with a [`History`](crate::History), a row under
//! `UNIQUE (scheduler, job, tick)`) and only then runs it. The claim is left to expire
//! once the tick has left its misfire grace window, never released, so a tick claimed once
//! is never run again: not after a fail-over, not when two replicas briefly both believe
//! they lead, not under clock skew. While a run goes on it holds the job's *run lock*,
//! so no other run of the job starts anywhere (no overlap, cluster-wide, also across a
//! hand-over); a job without a timeout keeps it as long as it runs.
//!
//! The scheduling loop never waits on the database: ticks are claimed and recorded by
//! tasks of their own, the Redis claim stays the guard while the database is away, and
//! the rows it could not write are written when it returns (see [`Health`]).

mod builder;
mod changes;
mod fire;
mod handoff;
mod placement;
mod requests;
mod state;
mod tenure;
mod tick;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::Redlock;

pub use self::builder::SchedulerBuilder;
use self::requests::triggered;
use self::state::Slot;
use self::state::{Inner, lock};
use self::tick::{Grant, NotTaken};
use crate::control::SchedulerAdmin;
use crate::error::Error;
use crate::history::Outcome;
use crate::leader::{LeaderElector, LeaderEvent, Leadership};
use crate::request::{Dispatched, RequestAction, RequestError};
use crate::status::{self, Health, JobStatus, LastRun, SchedulerStatus};

/// A cron scheduler whose every tick runs on exactly one replica. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let cluster = redlock_testkit::Cluster::start(3).await;
/// use std::time::Duration;
/// use redlock_core::Redlock;
/// use redlock_scheduler::{History, Job, JobContext, Scheduler};
///
/// let redlock = Redlock::builder()
///     .nodes(cluster.urls())
/// #   .restart_quarantine(false) // the kit's nodes are seconds old
///     .build()?;
/// let scheduler = Scheduler::builder(redlock)
///     .job(Job::new("heartbeat", "* * * * * *", |ctx: JobContext| async move {
///         println!("tick {} on {}", ctx.tick(), ctx.instance());
///         Ok::<_, std::convert::Infallible>(())
///     }))
///     .history(History::connect("sqlite::memory:").await?)
///     .build()?;
/// scheduler.wait_ready(Duration::from_secs(5)).await?;
/// scheduler.start();
/// tokio::time::sleep(Duration::from_millis(2500)).await;
/// scheduler.shutdown(Duration::from_secs(5)).await;
/// let status = scheduler.status().await;
/// assert!(status.jobs[0].last_run.is_some());
/// assert!(status.health.redis.ok);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("name", &self.inner.name)
            .field("instance", &self.inner.instance)
            .field("jobs", &self.inner.jobs.live().len())
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler's name unless [`SchedulerBuilder::name`] sets one: the name
    /// [`SchedulerAdmin::new`](crate::admin::SchedulerAdmin::new) takes to find it.
    pub const DEFAULT_NAME: &'static str = "scheduler";

    /// A scheduler whose locks go through `redlock`.
    pub fn builder(redlock: Redlock) -> SchedulerBuilder {
        SchedulerBuilder::new(redlock)
    }

    /// Starts the background tasks once: the Redis probe and, with a history, its
    /// writer, the publication of the job definitions and the follower's share of the
    /// operators' requests.
    fn start_background(&self) {
        let inner = &self.inner;
        inner.background.get_or_init(|| {
            inner.background_tasks.spawn(status::watch_redis(
                inner.redlock.clone(),
                Arc::clone(&inner.redis_health),
                inner.ready.clone(),
                inner.stop_background.clone(),
            ));
            if let Some(recorder) = inner.recorder.clone() {
                let (stop, give_up) = (inner.stop_background.clone(), inner.hard_stop.clone());
                inner
                    .background_tasks
                    .spawn(async move { recorder.run(stop, give_up).await });
                // The jobs changed at run time; for admin tools, what this replica
                // runs; and the cancels of its runs.
                inner.background_tasks.spawn(changes::follow_changes(
                    Arc::clone(inner),
                    inner.stop_background.clone(),
                ));
                inner.background_tasks.spawn(requests::follow(
                    Arc::clone(inner),
                    inner.stop_background.clone(),
                ));
            }
        });
    }

    /// Starts campaigning for leadership and, while leading, firing the jobs (on the
    /// current tokio runtime). Calling it again does nothing.
    pub fn start(&self) {
        let inner = &self.inner;
        if inner.stop_firing.is_cancelled() {
            return;
        }
        self.start_background();
        let mut started = false;
        let elector = inner.elector.get_or_init(|| {
            started = true;
            let mut builder =
                LeaderElector::builder(inner.redlock.clone(), crate::keys::leader(&inner.name))
                    .instance(inner.instance.to_string())
                    .term(inner.term)
                    .retry_interval(inner.retry_interval);
            if let Some(ttl) = inner.leader_ttl {
                builder = builder.ttl(ttl);
            }
            // The options were checked by `SchedulerBuilder::build`.
            builder.spawn()
        });
        if started {
            let (inner, events) = (Arc::clone(&self.inner), elector.subscribe());
            tokio::spawn(fire::lead(inner, events));
            if self.inner.recorder.is_some() {
                // Runs the leader hands to this replica.
                let inner = Arc::clone(&self.inner);
                let stop = inner.stop_background.clone();
                self.inner
                    .background_tasks
                    .spawn(handoff::serve(inner, stop));
            }
        }
    }

    /// Waits until the scheduler can lead: a majority of Redis nodes answers and is out
    /// of restart quarantine (the history, if any, was migrated when it connected). For
    /// start-up and readiness probes; [`start`](Self::start) does not need it.
    ///
    /// # Errors
    ///
    /// [`Error::NotReady`] after `timeout`, saying what is missing.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        self.start_background();
        let mut ready = self.inner.ready.subscribe();
        match tokio::time::timeout(timeout, ready.wait_for(|r| *r)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::NotReady {
                missing: self
                    .inner
                    .redis_health
                    .snapshot()
                    .last_error
                    .unwrap_or_else(|| "no answer from the Redis nodes yet".to_owned()),
            }),
        }
    }

    /// Whether the scheduler can lead now (see [`wait_ready`](Self::wait_ready)); for
    /// health checks. `false` until the first probe of the nodes, which
    /// [`start`](Self::start) or [`wait_ready`](Self::wait_ready) begin.
    pub fn is_ready(&self) -> bool {
        *self.inner.ready.borrow()
    }

    /// The Redis quorum and the history database: ok or failing since when, and why.
    pub fn health(&self) -> Health {
        Health {
            ready: self.is_ready(),
            redis: self.inner.redis_health.snapshot(),
            history: self.inner.recorder.as_ref().map(|r| r.health.snapshot()),
        }
    }

    /// This replica's id.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// This replica's leadership changes, as a `watch` receiver (`None` before
    /// [`start`](Self::start)).
    pub fn leader_events(&self) -> Option<tokio::sync::watch::Receiver<LeaderEvent>> {
        self.inner.elector.get().map(LeaderElector::subscribe)
    }

    /// The current leadership, if this replica leads.
    pub fn leadership(&self) -> Option<Leadership> {
        self.inner.leadership()
    }

    /// Runs `job` once now, through the same claim path as a scheduled tick (the tick is
    /// the current time, recorded as manual: it does not count as the job's latest
    /// scheduled tick). Only the leader runs jobs: on the leader it is done here
    /// ([`Dispatched::Done`], with the tick run); on another replica with a
    /// [`History`](crate::History) it is recorded as a request that the leader carries
    /// out within about a second ([`Dispatched::Requested`]: follow it with
    /// [`admin`](Self::admin)), as [`SchedulerAdmin::trigger`] does. A follower does
    /// not need to know which replica leads.
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`]; [`Error::ShutDown`]; on the leader
    /// [`RequestError::AlreadyRunning`] (a run of the job goes on somewhere),
    /// [`RequestError::AlreadyClaimed`], or the claim's lock error; without a history,
    /// [`RequestError::NotLeader`] on another replica; the history's error.
    pub async fn trigger(&self, job: &str) -> Result<Dispatched, Error> {
        let inner = &self.inner;
        inner.job(job)?;
        if inner.stop_firing.is_cancelled() {
            return Err(Error::ShutDown);
        }
        if inner.leadership().is_some() || inner.history().is_none() {
            let tick = inner.trigger(job).await?;
            return Ok(Dispatched::Done {
                result: triggered(tick),
                tick: Some(tick),
            });
        }
        self.request(Some(job), RequestAction::Trigger).await
    }

    /// Cancels the run of `job` going now: its token fires, and it is recorded as
    /// [`Outcome::Cancelled`] with the error `cancelled by an operator`. Done here if
    /// this replica runs it; otherwise, with a [`History`](crate::History), recorded as
    /// a request that the replica running it carries out within about a second (follow
    /// it with [`admin`](Self::admin)).
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`]; [`RequestError::NotRunning`] if no run of it goes on (as far as
    /// this replica and the history tell); without a history, [`RequestError::NotLeader`] when
    /// the run is not here and this replica does not lead; the history's error.
    pub async fn cancel(&self, job: &str) -> Result<Dispatched, Error> {
        let inner = &self.inner;
        // A job removed while its run goes on included.
        if inner.jobs.find(job).is_none() {
            return Err(RequestError::UnknownJob {
                name: job.to_owned(),
            }
            .into());
        }
        if let Some(tick) = inner.cancel_local(job) {
            return Ok(Dispatched::Done {
                result: inner.cancelled(tick),
                tick: Some(tick),
            });
        }
        let Some(history) = inner.history() else {
            return Err(match self.leadership() {
                Some(_) => RequestError::NotRunning {
                    job: job.to_owned(),
                },
                None => RequestError::NotLeader,
            }
            .into());
        };
        let elsewhere = history
            .running(&inner.name)
            .await?
            .iter()
            .any(|run| run.job == job && *run.instance != *inner.instance);
        if !elsewhere {
            return Err(RequestError::NotRunning {
                job: job.to_owned(),
            }
            .into());
        }
        self.request(Some(job), RequestAction::Cancel).await
    }

    /// Gives leadership up: this replica hands the leadership lock over to a waiting
    /// replica and keeps out of the election for a while (the leadership TTL, at least
    /// 2 s), so another replica takes over (with a higher epoch). Runs going here go on.
    /// Done here if this replica leads; otherwise, with a [`History`](crate::History),
    /// recorded as a request for the leader, carried out within about a second (follow
    /// it with [`admin`](Self::admin)).
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`]; without a history, [`RequestError::NotLeader`] when this replica
    /// does not lead; the history's error.
    pub async fn step_down(&self) -> Result<Dispatched, Error> {
        let inner = &self.inner;
        if inner.stop_firing.is_cancelled() {
            return Err(Error::ShutDown);
        }
        if let (Some(elector), Some(leadership)) = (inner.elector.get(), self.leadership())
            && elector.step_down(inner.step_down_back_off()).await
        {
            return Ok(Dispatched::Done {
                result: inner.stepped_down(leadership.epoch()),
                tick: None,
            });
        }
        if inner.history().is_none() {
            return Err(RequestError::NotLeader.into());
        }
        self.request(None, RequestAction::StepDown).await
    }

    /// Records a request for the replica that can carry it out.
    async fn request(&self, job: Option<&str>, action: RequestAction) -> Result<Dispatched, Error> {
        let Some(admin) = self.admin() else {
            return Err(RequestError::NotLeader.into());
        };
        // The job is this replica's own: no need to look it up among the published ones.
        admin.submit(job, action).await
    }

    /// An admin over this scheduler's history (requests made through it name this
    /// replica as their author): to follow the requests [`cancel`](Self::cancel) and
    /// [`step_down`](Self::step_down) record, or to see what every replica published.
    /// `None` without a [`History`](crate::History).
    pub fn admin(&self) -> Option<SchedulerAdmin> {
        let inner = &self.inner;
        inner.history().map(|history| {
            SchedulerAdmin::new(history.clone(), inner.name.clone())
                .operator(inner.instance.to_string())
                .max_resource_len(inner.max_resource_len)
        })
    }

    /// Stops firing `job` (its ticks are skipped and recorded as such) until
    /// [`resume`](Self::resume); for every replica when a [`History`](crate::History) is
    /// configured (the leader sees it within a second), for this one otherwise.
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`], or the history's error (nothing changed then).
    pub async fn pause(&self, job: &str) -> Result<(), Error> {
        self.set_paused(job, true).await
    }

    /// Fires `job` again after [`pause`](Self::pause).
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`], or the history's error (nothing changed then).
    pub async fn resume(&self, job: &str) -> Result<(), Error> {
        self.set_paused(job, false).await
    }

    async fn set_paused(&self, job: &str, paused: bool) -> Result<(), Error> {
        let (_, state) = self.inner.job(job)?;
        if let Some(history) = self.inner.history() {
            history.set_paused(&self.inner.name, job, paused).await?;
        }
        state.paused.store(paused, Ordering::Release);
        Ok(())
    }

    /// This replica, the leader if known, the health of Redis and the history, and each
    /// job: schedule, next fire time, last run, last skipped tick. Serializable with
    /// serde. Reads from the history are bounded by its statement timeout; when it does
    /// not answer, this replica's own view is shown.
    pub async fn status(&self) -> SchedulerStatus {
        let inner = &self.inner;
        let now = inner.clock.now();
        let leading = self.leadership();
        let paused_in_history = match inner.history() {
            Some(history) => history.paused_jobs(&inner.name).await.ok(),
            None => None,
        };
        let live = inner.jobs.live();
        let mut jobs = Vec::with_capacity(live.len());
        for state in live {
            let def = state.def();
            let local = lock(&state.last).clone();
            let mut last_run = local.clone();
            if let Some(history) = inner.history()
                && let Ok(runs) = history.runs(&inner.name, &state.name, 1).await
                && let Some(run) = runs.into_iter().next()
            {
                let row = LastRun::from(run);
                // This replica's account wins while its row waits to be written.
                let newer_here = local.as_ref().is_some_and(|l| {
                    !l.recorded
                        && (l.tick > row.tick
                            || (l.tick == row.tick && row.outcome == Outcome::Running))
                });
                if !newer_here {
                    last_run = Some(row);
                }
            }
            let paused = match &paused_in_history {
                Some(paused) => paused.iter().any(|p| *p == *state.name),
                None => state.paused.load(Ordering::Acquire),
            };
            jobs.push(JobStatus {
                name: def.job.spec.name().to_owned(),
                schedule: def.schedule.expression().to_owned(),
                time_zone: def.schedule.zone().name().to_owned(),
                next_fire: def.schedule.next_after(now),
                misfire: def.job.spec.misfire_policy(),
                dst: def.schedule.dst(),
                paused,
                running: state.running.load(Ordering::Acquire),
                last_run,
                last_skipped: lock(&state.last_skipped).clone(),
                skipped: state.skipped.load(Ordering::Relaxed),
                abandoned: state.abandoned.load(Ordering::Relaxed),
            });
        }
        SchedulerStatus {
            scheduler: inner.name.clone(),
            instance: inner.instance.to_string(),
            is_leader: leading.is_some(),
            leader: match &leading {
                Some(_) => Some(inner.instance.to_string()),
                None => self.leader().await,
            },
            epoch: leading.map(|l| l.epoch()),
            health: self.health(),
            jobs,
        }
    }

    /// The leader as last recorded in the history (`None` without one).
    async fn leader(&self) -> Option<String> {
        self.inner.recorded_leader().await
    }

    /// Stops firing and hands leadership over to another replica at once; lets the runs
    /// in progress finish until `deadline`, then cancels them (through their token, then
    /// drops them after a short grace) and records their outcome (history writes still
    /// waiting for the database get until the deadline too). Returns when all is done.
    /// A deadline too long to count (`Duration::MAX`) means no deadline: the runs are
    /// waited for.
    pub async fn shutdown(&self, deadline: Duration) {
        let inner = &self.inner;
        let until = crate::time::instant_after(deadline);
        inner.stop_firing.cancel();
        if let Some(elector) = inner.elector.get() {
            let leading = elector.leadership();
            elector.shutdown().await;
            // Admin tools name no leader until the next one records itself.
            if let Some(leadership) = leading {
                let ended = inner.record_leadership_end(leadership.epoch());
                let _ = tokio::time::timeout_at(until, ended).await;
            }
        }
        inner.runs.close();
        if tokio::time::timeout_at(until, inner.runs.wait())
            .await
            .is_err()
        {
            tracing::warn!(scheduler = %inner.name, "shutdown deadline reached: cancelling the runs still going");
            inner.hard_stop.cancel();
            inner.runs.wait().await;
        }
        // The writer empties its queue, then ends (or gives up at the deadline).
        inner.stop_background.cancel();
        inner.background_tasks.close();
        let give_up = inner.hard_stop.clone();
        let deadline_passed = async move {
            tokio::time::sleep_until(until).await;
            give_up.cancel();
        };
        tokio::select! {
            () = inner.background_tasks.wait() => {}
            () = deadline_passed => inner.background_tasks.wait().await,
        }
    }
}

impl Inner {
    /// Runs `job` now, on the leader ([`Scheduler::trigger`]): the tick run.
    pub(super) async fn trigger(self: &Arc<Self>, job: &str) -> Result<DateTime<Utc>, Error> {
        let inner = self;
        let (index, state) = inner.job(job)?;
        let state = &*state;
        if inner.stop_firing.is_cancelled() {
            return Err(Error::ShutDown);
        }
        let Some(leadership) = inner.leadership() else {
            return Err(RequestError::NotLeader.into());
        };
        // Millisecond precision, like the history's.
        let now = inner.clock.now();
        let mut tick = DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now);
        if tick.timestamp_subsec_millis() == 0 {
            // Not the key of a scheduled tick (those are whole seconds).
            tick += chrono::Duration::milliseconds(1);
        }
        let already_claimed = || -> Error {
            RequestError::AlreadyClaimed {
                job: job.to_owned(),
                tick: tick.to_rfc3339(),
            }
            .into()
        };
        let now = inner.clock.now();
        match inner
            .take(
                &inner.claim_resource(state, tick),
                inner.claim_ttl(state),
                Duration::ZERO,
                now,
                Some(&leadership),
            )
            .await
        {
            Ok(claim) => drop(claim.detach()),
            Err(NotTaken::Held) => return Err(already_claimed()),
            Err(NotTaken::Stopped) => return Err(Error::ShutDown),
            Err(NotTaken::Failed(err)) => return Err(Error::Lock(err)),
        }
        let run_lock = match inner
            .take(
                &inner.run_resource(job),
                inner.run_lock_ttl,
                Duration::ZERO,
                now,
                Some(&leadership),
            )
            .await
        {
            Ok(run_lock) => run_lock,
            Err(NotTaken::Held) => {
                return Err(RequestError::AlreadyRunning {
                    job: job.to_owned(),
                }
                .into());
            }
            Err(NotTaken::Stopped) => return Err(Error::ShutDown),
            Err(NotTaken::Failed(err)) => return Err(Error::Lock(err)),
        };
        if !inner
            .insert_row(state, tick, leadership.epoch(), true)
            .await
        {
            let _ = run_lock.release().await;
            return Err(already_claimed());
        }
        let grant = Grant::of(&leadership);
        inner.start_run(index, tick, run_lock, grant, Slot::take(inner), false, true);
        Ok(tick)
    }
}
