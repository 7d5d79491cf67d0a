//! [`Scheduler`]: the leader fires the jobs; every tick is claimed before it runs.
//!
//! Each replica declares the same jobs. The elected leader wakes at each tick of each
//! job, **claims** it — a lock on the job's name and the tick's scheduled time (not
//! "now"), then, with a [`History`], a row under `UNIQUE (job, tick)` — and only then
//! runs it. The claim outlives the run by a margin (it is left to expire, never
//! released), so a tick claimed once is never run again: not after a fail-over, not when
//! two replicas briefly both believe they lead, not under clock skew.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::RngExt;
use redlock_core::{CancellationToken, Error as LockError, Lock, Redlock};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::clock::{Clock, SystemClock};
use crate::error::{BuildError, Error};
use crate::job::{Job, JobContext, Misfire};
use crate::leader::{DEFAULT_RETRY_INTERVAL, DEFAULT_TERM, LeaderElector, Leadership};
use crate::schedule::Schedule;
use crate::status::{JobStatus, LastRun, SchedulerStatus};
use crate::store::{History, Outcome};

/// A tick whose time passed less than this long ago is on time; older ones are missed.
const ON_TIME: Duration = Duration::from_secs(1);

/// A run starting this late is not "on time" for the overlap rule: the next tick waits
/// for it instead of being skipped.
const LATE: Duration = Duration::from_millis(100);

/// How long a cancelled run may take to stop before it is dropped.
const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// What a claim keeps beyond the misfire grace window (clock skew between replicas).
const CLAIM_MARGIN: Duration = Duration::from_secs(5);

/// A random replica id: process id and random bits.
pub(crate) fn random_instance() -> String {
    format!(
        "{}-{:06x}",
        std::process::id(),
        rand::rng().random::<u32>() & 0xff_ffff
    )
}

/// Builds a [`Scheduler`]; see [`Scheduler::builder`].
#[must_use = "a builder does nothing until `build()`"]
pub struct SchedulerBuilder {
    redlock: Redlock,
    name: String,
    instance: Option<String>,
    jobs: Vec<Job>,
    history: Option<History>,
    clock: Arc<dyn Clock>,
    leader_ttl: Option<Duration>,
    term: Duration,
    retry_interval: Duration,
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

impl SchedulerBuilder {
    /// Adds a job.
    pub fn job(mut self, job: Job) -> Self {
        self.jobs.push(job);
        self
    }

    /// Records every run in `history` (SQLite or PostgreSQL); the database then refuses
    /// a second run of a tick too, and gives the last fired tick after a fail-over.
    /// Without one, the Redis claims alone keep each tick to one run.
    pub fn history(mut self, history: History) -> Self {
        self.history = Some(history);
        self
    }

    /// The scheduler's name (default `"scheduler"`): replicas with the same name (and
    /// the same Redis nodes) form one cluster; it prefixes the lock and claim keys.
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
    /// within this plus one retry interval.
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

    /// Checks every job and option.
    ///
    /// # Errors
    ///
    /// [`BuildError`] naming the offending job and input: an empty or duplicate name, an
    /// invalid cron expression or time zone, a zero timeout.
    pub fn build(self) -> Result<Scheduler, BuildError> {
        let mut names = HashSet::new();
        let mut jobs = Vec::with_capacity(self.jobs.len());
        for job in self.jobs {
            if job.name.trim().is_empty() {
                return Err(BuildError::EmptyName);
            }
            if !names.insert(job.name.clone()) {
                return Err(BuildError::DuplicateJob { name: job.name });
            }
            let schedule = Schedule::parse(&job.expression, &job.zone).map_err(|reason| {
                BuildError::InvalidSchedule {
                    job: job.name.clone(),
                    expression: format!("{} in {}", job.expression, job.zone),
                    reason,
                }
            })?;
            if job.timeout.is_some_and(|t| t.is_zero()) {
                return Err(BuildError::InvalidOption {
                    what: format!("job `{}`: timeout", job.name),
                    reason: "must be more than zero".to_owned(),
                });
            }
            jobs.push(JobState {
                schedule,
                job,
                paused: AtomicBool::new(false),
                running: AtomicBool::new(false),
                catching_up: AtomicBool::new(false),
                running_tick: Mutex::new(None),
                last: Mutex::new(None),
                idle: tokio::sync::Notify::new(),
            });
        }
        if self.name.trim().is_empty() {
            return Err(BuildError::InvalidOption {
                what: "scheduler name".to_owned(),
                reason: "must not be empty".to_owned(),
            });
        }
        if self.retry_interval.is_zero() || self.term.is_zero() {
            return Err(BuildError::InvalidOption {
                what: "retry interval / leadership term".to_owned(),
                reason: "must be more than zero".to_owned(),
            });
        }
        let instance: Arc<str> = self.instance.unwrap_or_else(random_instance).into();
        Ok(Scheduler {
            inner: Arc::new(Inner {
                claim_ttl: self.redlock.default_ttl().min(self.redlock.max_ttl()),
                redlock: self.redlock,
                name: self.name,
                instance,
                jobs,
                history: self.history,
                clock: self.clock,
                leader_ttl: self.leader_ttl,
                term: self.term,
                retry_interval: self.retry_interval,
                elector: OnceLock::new(),
                stop_firing: CancellationToken::new(),
                hard_stop: CancellationToken::new(),
                runs: TaskTracker::new(),
            }),
        })
    }
}

/// A cron scheduler whose every tick runs on exactly one replica. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let cluster = redlock_testkit::Cluster::start(3).await;
/// use std::time::Duration;
/// use redlock_scheduler::{History, Job, JobContext, Redlock, Scheduler};
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
/// scheduler.start();
/// tokio::time::sleep(Duration::from_millis(2500)).await;
/// scheduler.shutdown(Duration::from_secs(5)).await;
/// let status = scheduler.status().await;
/// assert!(status.jobs[0].last_run.is_some());
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
            .field("jobs", &self.inner.jobs.len())
            .finish_non_exhaustive()
    }
}

struct Inner {
    redlock: Redlock,
    name: String,
    instance: Arc<str>,
    jobs: Vec<JobState>,
    history: Option<History>,
    clock: Arc<dyn Clock>,
    leader_ttl: Option<Duration>,
    term: Duration,
    retry_interval: Duration,
    /// TTL of a claim while its run goes on (auto-extended).
    claim_ttl: Duration,
    elector: OnceLock<LeaderElector>,
    /// Shutdown began: fire no more ticks.
    stop_firing: CancellationToken,
    /// Shutdown's deadline passed: cancel the runs still going.
    hard_stop: CancellationToken,
    runs: TaskTracker,
}

struct JobState {
    job: Job,
    schedule: Schedule,
    paused: AtomicBool,
    /// A run of this job is going on this replica (overlap policy).
    running: AtomicBool,
    /// That run is for a missed tick (catch-up).
    catching_up: AtomicBool,
    /// The tick of that run.
    running_tick: Mutex<Option<DateTime<Utc>>>,
    /// The last run this replica saw end.
    last: Mutex<Option<LastRun>>,
    /// Notified when a run ends.
    idle: tokio::sync::Notify,
}

impl JobState {
    /// Waits until no run of this job is going on this replica.
    async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            if !self.running.load(Ordering::Acquire) {
                return;
            }
            idle.await;
        }
    }
}

impl Scheduler {
    /// A scheduler whose locks go through `redlock`.
    pub fn builder(redlock: Redlock) -> SchedulerBuilder {
        SchedulerBuilder {
            redlock,
            name: "scheduler".to_owned(),
            instance: None,
            jobs: Vec::new(),
            history: None,
            clock: Arc::new(SystemClock),
            leader_ttl: None,
            term: DEFAULT_TERM,
            retry_interval: DEFAULT_RETRY_INTERVAL,
        }
    }

    /// Starts campaigning for leadership and, while leading, firing the jobs (on the
    /// current tokio runtime). Calling it again does nothing.
    pub fn start(&self) {
        let inner = &self.inner;
        if inner.stop_firing.is_cancelled() {
            return;
        }
        let mut started = false;
        let elector = inner.elector.get_or_init(|| {
            started = true;
            let mut builder =
                LeaderElector::builder(inner.redlock.clone(), format!("{}:leader", inner.name))
                    .instance(inner.instance.to_string())
                    .term(inner.term)
                    .retry_interval(inner.retry_interval);
            if let Some(ttl) = inner.leader_ttl {
                builder = builder.ttl(ttl);
            }
            builder.start()
        });
        if started {
            let (inner, events) = (Arc::clone(&self.inner), elector.subscribe());
            tokio::spawn(lead(inner, events));
        }
    }

    /// This replica's id.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// This replica's leadership changes, as a `watch` receiver (`None` before
    /// [`start`](Self::start)).
    pub fn leader_events(&self) -> Option<tokio::sync::watch::Receiver<crate::LeaderEvent>> {
        self.inner.elector.get().map(LeaderElector::subscribe)
    }

    /// The current leadership, if this replica leads.
    pub fn leadership(&self) -> Option<Leadership> {
        self.inner.elector.get().and_then(LeaderElector::leadership)
    }

    /// Runs `job` once now, through the same claim path as a scheduled tick (the tick is
    /// the current time). Only the leader runs jobs.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`], [`Error::NotLeader`] (naming the leader if known),
    /// [`Error::ShutDown`], [`Error::AlreadyClaimed`], or the claim's lock error.
    pub async fn trigger(&self, job: &str) -> Result<DateTime<Utc>, Error> {
        let inner = &self.inner;
        let state = inner.job(job)?;
        if inner.stop_firing.is_cancelled() {
            return Err(Error::ShutDown);
        }
        let Some(leadership) = self.leadership() else {
            return Err(Error::NotLeader {
                leader: self.leader().await,
            });
        };
        // Millisecond precision, like the history's.
        let now = inner.clock.now();
        let mut tick = DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now);
        if tick.timestamp_subsec_millis() == 0 {
            // Not the key of a scheduled tick (those are whole seconds).
            tick += chrono::Duration::milliseconds(1);
        }
        match inner
            .claim(state, tick, &leadership, Outcome::Running, None)
            .await?
        {
            Some(claim) => {
                inner.spawn_run(state, tick, claim, leadership, true);
                Ok(tick)
            }
            None => Err(Error::AlreadyClaimed {
                job: job.to_owned(),
                tick: tick.to_rfc3339(),
            }),
        }
    }

    /// Stops firing `job` (its ticks are skipped) until [`resume`](Self::resume); for
    /// every replica when a [`History`] is configured, for this one otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`], or [`Error::Store`].
    pub async fn pause(&self, job: &str) -> Result<(), Error> {
        self.set_paused(job, true).await
    }

    /// Fires `job` again after [`pause`](Self::pause).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`], or [`Error::Store`].
    pub async fn resume(&self, job: &str) -> Result<(), Error> {
        self.set_paused(job, false).await
    }

    async fn set_paused(&self, job: &str, paused: bool) -> Result<(), Error> {
        let state = self.inner.job(job)?;
        if let Some(history) = &self.inner.history {
            history.set_paused(&self.inner.name, job, paused).await?;
        }
        state.paused.store(paused, Ordering::Release);
        Ok(())
    }

    /// This replica, the leader if known, and each job: schedule, next fire time, last
    /// run (from the history if there is one). Serializable with serde.
    pub async fn status(&self) -> SchedulerStatus {
        let inner = &self.inner;
        let now = inner.clock.now();
        let leading = self.leadership();
        let mut jobs = Vec::with_capacity(inner.jobs.len());
        for state in &inner.jobs {
            let mut last_run = state
                .last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let mut paused = state.paused.load(Ordering::Acquire);
            if let Some(history) = &inner.history {
                if let Ok(runs) = history.runs(&state.job.name, 1).await
                    && let Some(run) = runs.into_iter().next()
                {
                    last_run = Some(LastRun::from(run));
                }
                paused |= history
                    .is_paused(&inner.name, &state.job.name)
                    .await
                    .unwrap_or(false);
            }
            jobs.push(JobStatus {
                name: state.job.name.clone(),
                schedule: state.schedule.expression().to_owned(),
                time_zone: state.schedule.zone().name().to_owned(),
                next_fire: state.schedule.next_after(now),
                misfire: state.job.misfire,
                paused,
                running: state.running.load(Ordering::Acquire),
                last_run,
            });
        }
        SchedulerStatus {
            scheduler: inner.name.clone(),
            instance: inner.instance.to_string(),
            is_leader: leading.is_some(),
            leader: match leading {
                Some(_) => Some(inner.instance.to_string()),
                None => self.leader().await,
            },
            epoch: self.leadership().map(|l| l.epoch()),
            jobs,
        }
    }

    /// The leader as last recorded in the history (`None` without one).
    async fn leader(&self) -> Option<String> {
        match &self.inner.history {
            Some(history) => history.leader(&self.inner.name).await.ok().flatten(),
            None => None,
        }
    }

    /// Stops firing and hands leadership over to another replica at once; lets the runs
    /// in progress finish until `deadline`, then cancels them (through their token, then
    /// drops them after a short grace) and records their outcome. Returns when all is
    /// recorded.
    pub async fn shutdown(&self, deadline: Duration) {
        let inner = &self.inner;
        inner.stop_firing.cancel();
        if let Some(elector) = inner.elector.get() {
            elector.shutdown().await;
        }
        inner.runs.close();
        if tokio::time::timeout(deadline, inner.runs.wait())
            .await
            .is_err()
        {
            tracing::warn!(scheduler = %inner.name, "shutdown deadline reached: cancelling the runs still going");
            inner.hard_stop.cancel();
            inner.runs.wait().await;
        }
    }
}

/// Follows the election: while this replica leads, runs one firing loop per job.
async fn lead(inner: Arc<Inner>, mut events: tokio::sync::watch::Receiver<crate::LeaderEvent>) {
    loop {
        let leadership = match &*events.borrow_and_update() {
            crate::LeaderEvent::Elected(l) if l.is_current() => Some(l.clone()),
            _ => None,
        };
        if let Some(leadership) = leadership {
            if let Some(history) = &inner.history
                && let Err(err) = history
                    .record_leader(&inner.name, &inner.instance, leadership.epoch())
                    .await
            {
                tracing::warn!(error = %err, "could not record the leader in the history");
            }
            let firing = CancellationToken::new();
            let loops = inner
                .jobs
                .iter()
                .map(|state| fire_loop(&inner, state, &leadership, &firing));
            tokio::select! {
                _ = futures_util::future::join_all(loops) => {}
                () = leadership.ended_token().cancelled() => {}
                () = inner.stop_firing.cancelled() => {}
            }
            firing.cancel();
        }
        tokio::select! {
            changed = events.changed() => if changed.is_err() { return },
            () = inner.stop_firing.cancelled() => return,
        }
    }
}

/// Fires one job's ticks while `leadership` lasts.
async fn fire_loop(
    inner: &Arc<Inner>,
    state: &JobState,
    leadership: &Leadership,
    firing: &CancellationToken,
) {
    let mut cursor = inner.start_cursor(state).await;
    loop {
        let now = inner.clock.now();
        let due = state.schedule.ticks_between(cursor, now);
        if let Some(last) = due.last() {
            cursor = *last;
            inner.handle_due(state, &due, now, leadership).await;
        }
        let Some(next) = state.schedule.next_after(cursor.max(now)) else {
            return;
        };
        tokio::select! {
            () = inner.clock.sleep_until(next) => {}
            () = firing.cancelled() => return,
            () = leadership.ended_token().cancelled() => return,
        }
    }
}

impl Inner {
    fn job(&self, name: &str) -> Result<&JobState, Error> {
        self.jobs
            .iter()
            .find(|s| s.job.name == name)
            .ok_or_else(|| Error::UnknownJob {
                name: name.to_owned(),
            })
    }

    /// How old a missed tick may be: the job's grace, capped (without a history) by
    /// how long a claim can be kept, since the claims are then the only record.
    fn grace(&self, state: &JobState) -> Duration {
        match self.history {
            Some(_) => state.job.grace,
            None => state
                .job
                .grace
                .min(self.redlock.max_ttl().saturating_sub(CLAIM_MARGIN)),
        }
    }

    /// Where a new leader starts: after the last tick in the history, but no earlier
    /// than the grace window.
    async fn start_cursor(&self, state: &JobState) -> DateTime<Utc> {
        let now = self.clock.now();
        let floor = now - chrono::Duration::from_std(self.grace(state)).unwrap_or_default();
        let last = match &self.history {
            Some(history) => match history.last_tick(&state.job.name).await {
                Ok(last) => last,
                Err(err) => {
                    tracing::warn!(job = %state.job.name, error = %err, "no history: starting from the grace window");
                    None
                }
            },
            None => None,
        };
        match (&self.history, last) {
            (_, Some(last)) => last.max(floor),
            // A history without a row for the job: it never ran anywhere, so nothing
            // was missed (a fresh deployment does not catch up on the past).
            (Some(_), None) => now - chrono::Duration::from_std(ON_TIME).unwrap_or_default(),
            // Without a history, the claims tell what ran within the grace window.
            (None, None) => floor,
        }
    }

    /// Runs the ticks that came due, per the misfire policy; ticks that would run but
    /// for a pause or a run still going are claimed and recorded as skipped.
    async fn handle_due(
        self: &Arc<Self>,
        state: &JobState,
        due: &[DateTime<Utc>],
        now: DateTime<Utc>,
        leadership: &Leadership,
    ) {
        let on_time = due
            .last()
            .copied()
            .filter(|t| (now - *t).to_std().unwrap_or_default() < ON_TIME);
        let missed: Vec<DateTime<Utc>> = due
            .iter()
            .copied()
            .filter(|t| Some(*t) != on_time)
            .collect();
        let catch_up: Vec<DateTime<Utc>> = match state.job.misfire {
            Misfire::Skip => Vec::new(),
            Misfire::RunOnce if on_time.is_none() => missed.last().copied().into_iter().collect(),
            Misfire::RunOnce => Vec::new(),
            Misfire::CatchUp { max } => {
                let keep = usize::try_from(max).unwrap_or(usize::MAX);
                missed[missed.len().saturating_sub(keep)..].to_vec()
            }
        };
        let paused = state.paused.load(Ordering::Acquire)
            || match &self.history {
                Some(history) => history
                    .is_paused(&self.name, &state.job.name)
                    .await
                    .unwrap_or(false),
                None => false,
            };
        for &tick in due {
            // Catch-up (and late) runs go one after the other, and the next tick waits
            // for them: the overlap rule is for a run that takes longer than its
            // interval, not for one that started late.
            if state.catching_up.load(Ordering::Acquire) {
                tokio::select! {
                    () = state.wait_idle() => {}
                    () = leadership.ended_token().cancelled() => return,
                    () = self.stop_firing.cancelled() => return,
                }
            }
            if leadership.ended_token().is_cancelled() || self.stop_firing.is_cancelled() {
                return;
            }
            if on_time != Some(tick) && !catch_up.contains(&tick) {
                // Missed, and the policy says not to run it: left alone (unclaimed).
                tracing::debug!(job = %state.job.name, %tick, "missed tick not run (misfire policy)");
                continue;
            }
            let skip = if paused {
                Some("paused".to_owned())
            } else if state.running.load(Ordering::Acquire) {
                let running = *state
                    .running_tick
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                Some(format!(
                    "the run of {} is still going (overlap)",
                    running.map_or_else(|| "the previous tick".to_owned(), |t| t.to_rfc3339())
                ))
            } else {
                None
            };
            let skip = skip.as_deref();
            let outcome = if skip.is_some() {
                Outcome::Skipped
            } else {
                Outcome::Running
            };
            match self.claim(state, tick, leadership, outcome, skip).await {
                Ok(Some(claim)) if skip.is_none() => {
                    // A run that starts late (a missed tick, or one a new leader came
                    // to late) is waited for by the next tick rather than overlapped.
                    let late = on_time != Some(tick)
                        || (self.clock.now() - tick).to_std().unwrap_or_default() > LATE;
                    state.catching_up.store(late, Ordering::Release);
                    self.spawn_run(state, tick, claim, leadership.clone(), false);
                }
                Ok(Some(claim)) => {
                    tracing::info!(job = %state.job.name, %tick, reason = skip, "tick skipped");
                    self.keep_claim(state, claim).await;
                    self.remember(state, tick, Outcome::Skipped, skip.map(str::to_owned));
                }
                Ok(None) => {
                    tracing::debug!(job = %state.job.name, %tick, "tick already claimed elsewhere");
                }
                Err(err) => {
                    // Safety first: a tick that cannot be claimed does not run.
                    tracing::warn!(job = %state.job.name, %tick, error = %err, "could not claim the tick; not running it");
                }
            }
        }
    }

    fn claim_resource(&self, state: &JobState, tick: DateTime<Utc>) -> String {
        format!(
            "{}:job:{}:{}",
            self.name,
            state.job.name,
            tick.timestamp_millis()
        )
    }

    /// Claims `tick`: the lock, then the history row. `None` if another replica has it.
    async fn claim(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        leadership: &Leadership,
        outcome: Outcome,
        note: Option<&str>,
    ) -> Result<Option<Lock>, Error> {
        let lock = match self
            .redlock
            .try_lock(self.claim_resource(state, tick))
            .ttl(self.claim_ttl)
            .fencing(false)
            .await
        {
            Ok(lock) => lock,
            Err(LockError::Taken { .. }) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        if let Some(history) = &self.history {
            match history
                .claim(
                    &state.job.name,
                    tick,
                    &self.instance,
                    leadership.epoch(),
                    outcome,
                    note,
                )
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    // The database has it: keep the lock so nobody else tries either.
                    self.keep_claim(state, lock).await;
                    return Ok(None);
                }
                Err(err) => {
                    tracing::warn!(job = %state.job.name, %tick, error = %err, "history unavailable: the claim alone guards this tick");
                }
            }
        }
        Ok(Some(lock))
    }

    /// Leaves a claim to expire after the misfire grace window (and a margin): until
    /// then no replica will consider its tick again.
    async fn keep_claim(&self, state: &JobState, mut claim: Lock) {
        let keep = (self.grace(state) + CLAIM_MARGIN).min(self.redlock.max_ttl());
        if claim.is_valid() && claim.validity() < keep {
            let _ = claim.extend(keep).await;
        }
        claim.detach();
    }

    fn remember(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        outcome: Outcome,
        error: Option<String>,
    ) {
        *state
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(LastRun {
            tick,
            instance: self.instance.to_string(),
            outcome,
            error,
        });
    }

    fn spawn_run(
        self: &Arc<Self>,
        state: &JobState,
        tick: DateTime<Utc>,
        claim: Lock,
        leadership: Leadership,
        manual: bool,
    ) {
        let Some(index) = self.jobs.iter().position(|s| std::ptr::eq(s, state)) else {
            return;
        };
        state.running.store(true, Ordering::Release);
        *state
            .running_tick
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tick);
        let inner = Arc::clone(self);
        let lag_ms = (inner.clock.now() - tick).num_milliseconds();
        let span = tracing::info_span!(
            "job.run",
            job = %state.job.name,
            %tick,
            instance = %inner.instance,
            token = leadership.epoch(),
            lag_ms,
            manual,
        );
        self.runs.spawn(
            async move {
                let Some(state) = inner.jobs.get(index) else {
                    return;
                };
                let (outcome, error) = inner.run(state, tick, claim, &leadership, manual).await;
                // The run is over (the overlap rule is about runs, not their records).
                state.running.store(false, Ordering::Release);
                state.catching_up.store(false, Ordering::Release);
                state.idle.notify_waiters();
                match outcome {
                    Outcome::Succeeded => tracing::info!("run succeeded"),
                    _ => tracing::warn!(
                        outcome = outcome.as_str(),
                        error = error.as_deref(),
                        "run did not succeed"
                    ),
                }
                if let Some(history) = &inner.history
                    && let Err(err) = history
                        .finish(
                            &state.job.name,
                            tick,
                            &inner.instance,
                            outcome,
                            error.as_deref(),
                        )
                        .await
                {
                    tracing::warn!(error = %err, "could not record the run's outcome");
                }
                inner.remember(state, tick, outcome, error);
            }
            .instrument(span),
        );
    }

    /// Runs the handler until it ends or must stop.
    async fn run(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        mut claim: Lock,
        leadership: &Leadership,
        manual: bool,
    ) -> (Outcome, Option<String>) {
        // The claim stays ours while the run goes on (bounded by the timeout, if any).
        let bound = state
            .job
            .timeout
            .map_or(redlock_core::DEFAULT_MAX_HOLD, |t| t + CANCEL_GRACE * 2);
        claim.auto_extend_for(bound);
        let cancel = CancellationToken::new();
        let ctx = JobContext {
            job: state.job.name.as_str().into(),
            tick,
            fencing_token: leadership.epoch(),
            instance: Arc::clone(&self.instance),
            cancel: cancel.clone(),
            manual,
        };
        let handler = Arc::clone(&state.job.handler);
        let mut work = std::pin::pin!(handler(ctx));
        let timeout = async {
            match state.job.timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let stopped: (Outcome, &str) = tokio::select! {
            result = &mut work => {
                let outcome = match result {
                    Ok(()) => (Outcome::Succeeded, None),
                    Err(err) => (Outcome::Failed, Some(err.to_string())),
                };
                self.keep_claim(state, claim).await;
                return outcome;
            }
            () = leadership.lost_token().cancelled() => (Outcome::Cancelled, "leadership lost"),
            () = claim.lost() => (Outcome::Cancelled, "the tick's claim was lost"),
            () = self.hard_stop.cancelled() => (Outcome::Cancelled, "shutdown deadline reached"),
            () = timeout => (Outcome::TimedOut, "timed out"),
        };
        cancel.cancel();
        let _ = tokio::time::timeout(CANCEL_GRACE, &mut work).await;
        self.keep_claim(state, claim).await;
        (stopped.0, Some(stopped.1.to_owned()))
    }
}
