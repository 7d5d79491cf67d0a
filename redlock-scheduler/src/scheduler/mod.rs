//! [`Scheduler`]: the leader fires the jobs; every tick is claimed before it runs.
//!
//! Each replica declares the same jobs. The elected leader wakes at each tick of each
//! job, **claims** it (a lock on the scheduler's name, the job's name and the tick's
//! scheduled time, not "now"; then, with a [`History`](crate::History), a row under
//! `UNIQUE (scheduler, job, tick)`) and only then runs it. Once its tick started, was
//! recorded or was handed over, the claim is left to expire after the tick's misfire
//! grace window, never released, so a tick claimed once is never run again: not after a
//! fail-over, not when two replicas briefly both believe they lead, not under clock
//! skew. A claim whose tick had not started when the leadership ended is given back to
//! the next leader. While a run goes on it holds the job's *run lock*,
//! so no other run of the job starts anywhere (no overlap, cluster-wide, also across a
//! hand-over); a job without a timeout keeps it as long as it runs.
//!
//! The scheduling loop never waits on the database: ticks are claimed and recorded by
//! tasks of their own, the Redis claim stays the guard while the database is away, and
//! the rows it could not write are written when it returns (see [`Health`]).

pub(crate) mod builder;
mod changes;
mod context;
mod fire;
mod handoff;
mod parts;
mod placement;
mod requests;
mod state;
mod tenure;
mod tick;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::parts::Parts;
use self::requests::triggered;
use self::state::lock;
use crate::changes::{JobChange, JobChangeAction};
use crate::control::{Base, SchedulerAdmin};
use crate::error::{NotReady, RequestError};
use crate::history::Outcome;
use crate::leader::{LeaderElector, LeaderEvent, Leadership};
use crate::request::{Dispatched, RequestAction};
use crate::spec::JobSpec;
use crate::status::{self, Health, HealthCell, JobStatus, LastRun, SchedulerStatus};

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

/// What a [`Scheduler`] holds: the shared context and the parts of the engine (each
/// with its own state), and the background tasks.
struct Inner {
    parts: Parts,
    /// Background tasks started (Redis probe, history writer).
    background: OnceLock<()>,
    redis_health: Arc<HealthCell>,
    ready: tokio::sync::watch::Sender<bool>,
    /// The runs (and ticks being claimed) are done: background tasks may end.
    stop_background: CancellationToken,
    background_tasks: TaskTracker,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts = &self.inner.parts;
        f.debug_struct("Scheduler")
            .field("name", &parts.ctx.name)
            .field("instance", &parts.ctx.instance)
            .field("jobs", &parts.ctx.jobs.live().len())
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler's name unless [`SchedulerBuilder::name`](crate::SchedulerBuilder::name) sets one: the name
    /// [`SchedulerAdmin::new`](crate::admin::SchedulerAdmin::new) takes to find it.
    pub const DEFAULT_NAME: &'static str = "scheduler";

    /// Starts the background tasks once: the Redis probe and, with a history, its
    /// writer, the publication of the job definitions and the follower's share of the
    /// operators' requests.
    fn start_background(&self) {
        let inner = &self.inner;
        let parts = &inner.parts;
        inner.background.get_or_init(|| {
            inner.background_tasks.spawn(status::watch_redis(
                parts.ctx.redlock.clone(),
                Arc::clone(&inner.redis_health),
                inner.ready.clone(),
                inner.stop_background.clone(),
            ));
            if let Some(recorder) = parts.ctx.recorder.clone() {
                let (stop, give_up) = (inner.stop_background.clone(), parts.ctx.hard_stop.clone());
                inner
                    .background_tasks
                    .spawn(async move { recorder.run(stop, give_up).await });
                // The jobs changed at run time; for admin tools, what this replica
                // runs; and the cancels of its runs.
                let (changes, stop) = (Arc::clone(&parts.changes), inner.stop_background.clone());
                inner
                    .background_tasks
                    .spawn(async move { changes.follow(stop).await });
                inner.background_tasks.spawn(requests::follow(
                    Arc::clone(&parts.requests),
                    Arc::clone(&parts.tenure),
                    inner.stop_background.clone(),
                ));
            }
        });
    }

    /// Starts campaigning for leadership and, while leading, firing the jobs (on the
    /// current tokio runtime). Calling it again does nothing.
    pub fn start(&self) {
        let inner = &self.inner;
        let parts = &inner.parts;
        if parts.ctx.stop_firing.is_cancelled() {
            return;
        }
        self.start_background();
        if let Some(events) = parts.tenure.start() {
            tokio::spawn(fire::lead(parts.clone(), events));
            if parts.ctx.recorder.is_some() {
                // Runs the leader hands to this replica.
                let (handoffs, ticks) = (Arc::clone(&parts.handoffs), Arc::clone(&parts.ticks));
                let stop = inner.stop_background.clone();
                inner.background_tasks.spawn(handoffs.serve(ticks, stop));
            }
        }
    }

    /// Waits until the scheduler can lead: a majority of Redis nodes answers and is out
    /// of restart quarantine (the history, if any, was migrated when it connected). For
    /// start-up and readiness probes; [`start`](Self::start) does not need it.
    ///
    /// # Errors
    ///
    /// [`NotReady`] after `timeout`, saying what is missing.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), NotReady> {
        self.start_background();
        let mut ready = self.inner.ready.subscribe();
        match tokio::time::timeout(timeout, ready.wait_for(|r| *r)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(NotReady::new(
                self.inner
                    .redis_health
                    .snapshot()
                    .last_error
                    .unwrap_or_else(|| "no answer from the Redis nodes yet".to_owned()),
            )),
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
            history: self
                .inner
                .parts
                .ctx
                .recorder
                .as_ref()
                .map(|r| r.health.snapshot()),
        }
    }

    /// This replica's id.
    pub fn instance(&self) -> &str {
        &self.inner.parts.ctx.instance
    }

    /// This replica's leadership changes, as a `watch` receiver (`None` before
    /// [`start`](Self::start)).
    pub fn leader_events(&self) -> Option<tokio::sync::watch::Receiver<LeaderEvent>> {
        self.inner
            .parts
            .tenure
            .elector()
            .map(LeaderElector::subscribe)
    }

    /// The current leadership, if this replica leads.
    pub fn leadership(&self) -> Option<Leadership> {
        self.inner.parts.tenure.leadership()
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
    /// [`RequestError::UnknownJob`]; [`RequestError::ShutDown`]; on the leader
    /// [`RequestError::AlreadyRunning`] (a run of the job goes on somewhere),
    /// [`RequestError::AlreadyClaimed`], or the claim's lock error
    /// ([`RequestError::Lock`]); without a history,
    /// [`RequestError::NotLeader`] on another replica; [`RequestError::History`].
    pub async fn trigger(&self, job: &str) -> Result<Dispatched, RequestError> {
        let parts = &self.inner.parts;
        parts.ctx.job(job)?;
        if parts.ctx.stop_firing.is_cancelled() {
            return Err(RequestError::ShutDown);
        }
        if parts.tenure.leadership().is_some() || parts.ctx.history().is_none() {
            let tick = parts.ticks.trigger(job, parts.tenure.leadership()).await?;
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
    /// the run is not here and this replica does not lead; [`RequestError::History`].
    pub async fn cancel(&self, job: &str) -> Result<Dispatched, RequestError> {
        let parts = &self.inner.parts;
        // A job removed while its run goes on included.
        if parts.ctx.jobs.find(job).is_none() {
            return Err(RequestError::UnknownJob {
                name: job.to_owned(),
            });
        }
        if let Some(tick) = parts.requests.cancel_local(job) {
            return Ok(Dispatched::Done {
                result: parts.requests.cancelled(tick),
                tick: Some(tick),
            });
        }
        let Some(history) = parts.ctx.history() else {
            return Err(match self.leadership() {
                Some(_) => RequestError::NotRunning {
                    job: job.to_owned(),
                },
                None => RequestError::NotLeader,
            });
        };
        let elsewhere = history
            .running(&parts.ctx.name)
            .await?
            .iter()
            .any(|run| run.job == job && *run.instance != *parts.ctx.instance);
        if !elsewhere {
            return Err(RequestError::NotRunning {
                job: job.to_owned(),
            });
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
    /// [`RequestError::ShutDown`]; without a history, [`RequestError::NotLeader`] when this replica
    /// does not lead; [`RequestError::History`].
    pub async fn step_down(&self) -> Result<Dispatched, RequestError> {
        let parts = &self.inner.parts;
        if parts.ctx.stop_firing.is_cancelled() {
            return Err(RequestError::ShutDown);
        }
        if let Some(leadership) = self.leadership()
            && parts.tenure.step_down().await
        {
            return Ok(Dispatched::Done {
                result: parts.requests.stepped_down(leadership.epoch()),
                tick: None,
            });
        }
        if parts.ctx.history().is_none() {
            return Err(RequestError::NotLeader);
        }
        self.request(None, RequestAction::StepDown).await
    }

    /// Records a request for the replica that can carry it out.
    async fn request(
        &self,
        job: Option<&str>,
        action: RequestAction,
    ) -> Result<Dispatched, RequestError> {
        let Some(admin) = self.admin() else {
            return Err(RequestError::NotLeader);
        };
        // The job is this replica's own: no need to look it up among the published ones.
        admin.submit(job, action).await
    }

    /// An admin over this scheduler's history (requests made through it name this
    /// replica as their author): to follow the requests [`cancel`](Self::cancel) and
    /// [`step_down`](Self::step_down) record, or to see what every replica published.
    /// `None` without a [`History`](crate::History).
    pub fn admin(&self) -> Option<SchedulerAdmin> {
        let parts = &self.inner.parts;
        parts.ctx.history().map(|history| {
            SchedulerAdmin::new(history.clone(), parts.ctx.name.clone())
                .operator(parts.ctx.instance.to_string())
                .max_resource_len(parts.ctx.max_resource_len)
                .shared_clock(Arc::clone(&parts.ctx.clock))
        })
    }

    /// Stops firing `job` (its ticks are skipped and recorded as such) until
    /// [`resume`](Self::resume); for every replica when a [`History`](crate::History) is
    /// configured (the leader sees it within a second), for this one otherwise.
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`], or [`RequestError::History`] (nothing changed then).
    pub async fn pause(&self, job: &str) -> Result<(), RequestError> {
        self.set_paused(job, true).await
    }

    /// Fires `job` again after [`pause`](Self::pause).
    ///
    /// # Errors
    ///
    /// [`RequestError::UnknownJob`], or [`RequestError::History`] (nothing changed then).
    pub async fn resume(&self, job: &str) -> Result<(), RequestError> {
        self.set_paused(job, false).await
    }

    async fn set_paused(&self, job: &str, paused: bool) -> Result<(), RequestError> {
        let parts = &self.inner.parts;
        let (_, state) = parts.ctx.job(job)?;
        if let Some(history) = parts.ctx.history() {
            history
                .control()
                .set_paused(&parts.ctx.name, job, paused)
                .await?;
        }
        state.paused.store(paused, Ordering::Release);
        Ok(())
    }

    /// This replica, the leader if known, the health of Redis and the history, and each
    /// job: schedule, next fire time, last run, last skipped tick. Serializable with
    /// serde. Reads from the history are bounded by its statement timeout; when it does
    /// not answer, this replica's own view is shown.
    pub async fn status(&self) -> SchedulerStatus {
        let parts = &self.inner.parts;
        let now = parts.ctx.clock.now();
        let leading = self.leadership();
        let paused_in_history = match parts.ctx.history() {
            Some(history) => history.control().paused_jobs(&parts.ctx.name).await.ok(),
            None => None,
        };
        let live = parts.ctx.jobs.live();
        let mut jobs = Vec::with_capacity(live.len());
        for state in live {
            let def = state.def();
            let local = lock(&state.last).clone();
            let mut last_run = local.clone();
            if let Some(history) = parts.ctx.history()
                && let Ok(runs) = history.runs(&parts.ctx.name, &state.name, 1).await
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
                time_zone: def.schedule.zone().to_owned(),
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
            scheduler: parts.ctx.name.clone(),
            instance: parts.ctx.instance.to_string(),
            is_leader: leading.is_some(),
            leader: match &leading {
                Some(_) => Some(parts.ctx.instance.to_string()),
                None => self.leader().await,
            },
            epoch: leading.map(|l| l.epoch()),
            health: self.health(),
            jobs,
        }
    }

    /// The leader as last recorded in the history (`None` without one).
    async fn leader(&self) -> Option<String> {
        self.inner.parts.tenure.recorded_leader().await
    }

    /// Stops firing and hands leadership over to another replica at once; lets the runs
    /// in progress finish until `deadline`, then cancels them (through their token, then
    /// drops them after a short grace) and records their outcome (history writes still
    /// waiting for the database get until the deadline too). Returns when all is done.
    /// A deadline too long to count (`Duration::MAX`) means no deadline: the runs are
    /// waited for.
    pub async fn shutdown(&self, deadline: Duration) {
        let inner = &self.inner;
        let parts = &inner.parts;
        let until = crate::time::instant_after(deadline);
        parts.ctx.stop_firing.cancel();
        parts.tenure.shutdown(until).await;
        parts.ctx.runs.close();
        if tokio::time::timeout_at(until, parts.ctx.runs.wait())
            .await
            .is_err()
        {
            tracing::warn!(scheduler = %parts.ctx.name, "shutdown deadline reached: cancelling the runs still going");
            parts.ctx.hard_stop.cancel();
            parts.ctx.runs.wait().await;
        }
        // The writer empties its queue, then ends (or gives up at the deadline).
        inner.stop_background.cancel();
        inner.background_tasks.close();
        let give_up = parts.ctx.hard_stop.clone();
        let deadline_passed = async move {
            tokio::time::sleep_until(until).await;
            give_up.cancel();
        };
        tokio::select! {
            biased;
            () = inner.background_tasks.wait() => {}
            () = deadline_passed => inner.background_tasks.wait().await,
        }
    }
}

impl Scheduler {
    /// Adds a job at run time, on every replica: with a [`History`](crate::History) the
    /// change is recorded there, applied here at once and on the other replicas within
    /// [`JOB_CHANGE_POLL`](crate::changes::JOB_CHANGE_POLL); the leader fires the job's ticks after the time of the
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
    /// [`RequestError::ChangeConflict`]; [`RequestError::ShutDown`]; [`RequestError::History`].
    pub async fn add_job(&self, spec: JobSpec) -> Result<JobChange, RequestError> {
        self.inner.parts.changes.check(&spec)?;
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
    pub async fn reschedule_job(&self, spec: JobSpec) -> Result<JobChange, RequestError> {
        self.inner.parts.changes.check(&spec)?;
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
    /// [`RequestError::ShutDown`]; [`RequestError::History`].
    pub async fn remove_job(&self, job: &str) -> Result<JobChange, RequestError> {
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
        let parts = &self.inner.parts;
        crate::keys::max_job_name_len(&parts.ctx.name, parts.ctx.max_resource_len)
    }

    /// Records the change `decide` makes (through the history, or here alone without
    /// one) and applies it here.
    async fn change(
        &self,
        job: &str,
        decide: impl Fn(Option<JobSpec>) -> Result<(JobChangeAction, Option<JobSpec>), RequestError>,
    ) -> Result<JobChange, RequestError> {
        let parts = &self.inner.parts;
        if parts.ctx.stop_firing.is_cancelled() {
            return Err(RequestError::ShutDown);
        }
        let now = parts.ctx.clock.now();
        let Some(admin) = self.admin() else {
            // This replica alone.
            return parts.changes.change_here(job, now, decide).await;
        };
        let base = Base::Local(parts.changes.local_spec(job));
        let change = admin.change(job, base, now, decide).await?;
        // In force here at once (and every change before it, in order).
        parts.changes.sync().await;
        Ok(change)
    }
}
