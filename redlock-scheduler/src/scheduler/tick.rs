//! One tick, from claim to record: claim it (retrying failures within its grace window),
//! check pause and overlap (the job's run lock, cluster-wide), insert its row, run the
//! handler, record the end. Each tick is a task of its own: the firing loop never waits
//! on Redis or the database.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::{Error as LockError, Lock, RetryPolicy};
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tracing::Instrument;

use super::context::{CLAIM_MARGIN, Context};
use super::state::{JobState, Slot, lock};
use crate::error::RequestError;
use crate::history::Outcome;
use crate::job::JobContext;
use crate::leader::Leadership;
use crate::record::{Inserted, Row};
use crate::status::LastRun;
use crate::telemetry::{self, SkipReason};
use crate::transaction::RunRecord;

/// How long an on-time tick waits for the job's previous run to end before it is
/// skipped as an overlap (a run ending just now hands its lock over at once).
const OVERLAP_WAIT: Duration = Duration::from_millis(250);

/// How long a cancelled run may take to stop before it is dropped.
const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// Backoff between claim attempts that failed (not refused).
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Why taking a lock for a tick did not succeed.
pub(super) enum NotTaken {
    /// Held by someone else (another replica claimed the tick, or a run goes on).
    Held,
    /// Leadership ended or shutdown began: leave the tick to the next leader.
    Stopped,
    /// Failures until the deadline: the last one.
    Failed(LockError),
}

/// Why a tick's run lock was not taken.
pub(super) enum RunLockRefused {
    /// Leadership ended or shutdown began: nothing to record.
    Stopped,
    /// A run of the job goes on (why, for the record).
    Overlap(String),
    /// No quorum until the deadline (why, for the record).
    Failed(String),
}

/// What a run answers to besides its own run lock: the fencing token it carries, and a
/// token fired when it must stop (its leadership was lost). A run handed to this
/// replica by the leader carries the leader's token and ends with its run lock only.
#[derive(Clone)]
pub(super) struct Grant {
    pub(super) token: u64,
    pub(super) lost: CancellationToken,
}

impl Grant {
    /// A run the leader starts on itself: it ends with the leadership.
    pub(super) fn of(leadership: &Leadership) -> Self {
        Self {
            token: leadership.epoch(),
            lost: leadership.lost_token().clone(),
        }
    }

    /// A run handed over with the leader's `token`.
    pub(super) fn handed(token: u64) -> Self {
        Self {
            token,
            lost: CancellationToken::new(),
        }
    }
}

/// A tick's claim, taken by the leader. Kept, it is left to expire once its tick has
/// left the grace window (never released), so that no replica considers the tick again,
/// whatever happens to it next. Given back (released) when the leadership ended before
/// the tick was run or recorded, so that the next leader takes the tick; until then
/// the leadership's lock waits (for a leadership that ends of its own accord).
pub(super) struct Claim {
    lock: Option<Lock>,
    _settling: TaskTrackerToken,
}

impl Claim {
    /// The tick ran, or was recorded as not run, or went to another replica.
    pub(super) fn keep(self) {
        // Dropped: kept (see `Drop`), said here where the tick's fate is known.
        drop(self);
    }

    /// The tick was neither run nor recorded (leadership ended first, or a trigger was
    /// refused): released, for the next leader.
    pub(super) async fn give_back(mut self) {
        if let Some(lock) = self.lock.take() {
            tracing::info!(claim = %lock.resource(), "the tick did not start: its claim is given back");
            give_back(lock).await;
        }
    }
}

impl Drop for Claim {
    /// Kept unless given back: a tick left in doubt is not run twice.
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            let _ = lock.detach();
        }
    }
}

/// Releases a lock taken for a tick the leader does not go on with.
async fn give_back(lock: Lock) {
    if let Err(err) = lock.release().await {
        tracing::debug!(error = %err, "could not give a lock back; it expires by itself");
    }
}

/// How long before its time a tick handed to another replica is claimed (and handed
/// over): that replica sees it in time and starts it on time.
pub(super) const AHEAD: Duration = Duration::from_millis(500);

/// Claims and runs: takes a tick's claim and its job's run lock, writes its row,
/// starts and watches its run, records what did not run; and closes the rows of runs
/// whose replica died.
pub(super) struct Ticks {
    ctx: Arc<Context>,
    /// TTL of a job's run lock while its run goes on (auto-extended).
    run_lock_ttl: Duration,
}

impl Ticks {
    pub(super) fn new(ctx: Arc<Context>) -> Self {
        let run_lock_ttl = ctx.redlock.default_ttl().min(ctx.redlock.max_ttl());
        Self { ctx, run_lock_ttl }
    }

    /// TTL of a job's run lock while its run goes on.
    pub(super) fn run_lock_ttl(&self) -> Duration {
        self.run_lock_ttl
    }

    /// How long a tick's claim is kept: until its tick leaves the grace window (and a
    /// margin), as far as the Redis nodes allow.
    fn claim_ttl(&self, state: &JobState) -> Duration {
        // A tick handed over is claimed ahead of its time.
        let ahead = if self.ctx.spreads(state) {
            AHEAD
        } else {
            Duration::ZERO
        };
        self.ctx
            .grace(state)
            .saturating_add(CLAIM_MARGIN)
            .saturating_add(ahead)
            .min(self.ctx.redlock.max_ttl())
    }

    /// Claims `tick` of `state` for `leadership`, retrying failures until `until`. The
    /// claim is kept (left to expire once the tick has left its grace window) unless
    /// given back: see [`Claim`].
    pub(super) async fn claim(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        until: DateTime<Utc>,
        leadership: &Leadership,
    ) -> Result<Claim, NotTaken> {
        // Taken before the claim: should the leadership end meanwhile, the claim is
        // given back before the next leader is elected.
        let settling = leadership.settling();
        let resource = crate::keys::claim(&self.ctx.name, &state.name, tick.timestamp_millis());
        let lock = self
            .take(
                &resource,
                self.claim_ttl(state),
                Duration::ZERO,
                until,
                Some(leadership),
                false,
            )
            .await?;
        Ok(Claim {
            lock: Some(lock),
            _settling: settling,
        })
    }

    /// The lock a run of the job holds while it goes on, on whichever replica: no run
    /// starts while another holds it (no overlap, cluster-wide).
    fn run_resource(&self, job: &str) -> String {
        crate::keys::run(&self.ctx.name, job)
    }

    /// Takes `resource` for `ttl`, waiting up to `wait` while someone holds it, retrying
    /// failures until `until` (wall clock); with a fencing token if `fencing` (a run's
    /// lock: its token fences the run's transaction). A single attempt (`wait` zero) is
    /// carried to its answer, and what it took given back, when leadership ends or
    /// shutdown begins meanwhile: it is over when this returns.
    pub(super) async fn take(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
        until: DateTime<Utc>,
        leadership: Option<&Leadership>,
        fencing: bool,
    ) -> Result<Lock, NotTaken> {
        let ended = leadership.map_or_else(CancellationToken::new, |l| l.ended_token().clone());
        let stopped = || ended.is_cancelled() || self.ctx.stop_firing.is_cancelled();
        let mut backoff = RETRY_FIRST;
        loop {
            let result = if wait.is_zero() {
                let result = self
                    .ctx
                    .redlock
                    .try_lock(resource)
                    .ttl(ttl)
                    .fencing(fencing)
                    .await;
                if stopped() {
                    if let Ok(lock) = result {
                        give_back(lock).await;
                    }
                    return Err(NotTaken::Stopped);
                }
                result
            } else {
                let acquire = self
                    .ctx
                    .redlock
                    .lock(resource)
                    .retry(RetryPolicy::deadline(wait))
                    .ttl(ttl)
                    .fencing(fencing);
                // Dropped half-way, the attempt gives back what it took by itself.
                tokio::select! {
                    biased;
                    () = ended.cancelled() => return Err(NotTaken::Stopped),
                    () = self.ctx.stop_firing.cancelled() => return Err(NotTaken::Stopped),
                    result = acquire => result,
                }
            };
            let err = match result {
                Ok(lock) => return Ok(lock),
                Err(LockError::Taken { .. }) => return Err(NotTaken::Held),
                Err(err) => err,
            };
            let next_try =
                self.ctx.clock.now() + chrono::Duration::from_std(backoff).unwrap_or_default();
            if next_try > until {
                return Err(NotTaken::Failed(err));
            }
            tracing::debug!(%resource, error = %err, "lock attempt failed; retrying");
            tokio::select! {
                biased;
                () = ended.cancelled() => return Err(NotTaken::Stopped),
                () = self.ctx.stop_firing.cancelled() => return Err(NotTaken::Stopped),
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Runs `job` now, on the leader ([`Scheduler::trigger`](crate::Scheduler::trigger)),
    /// `leadership` being this replica's: the tick run.
    pub(super) async fn trigger(
        self: &Arc<Self>,
        job: &str,
        leadership: Option<Leadership>,
    ) -> Result<DateTime<Utc>, RequestError> {
        let ctx = &self.ctx;
        let (index, state) = ctx.job(job)?;
        let state = &*state;
        if ctx.stop_firing.is_cancelled() {
            return Err(RequestError::ShutDown);
        }
        let Some(leadership) = leadership else {
            return Err(RequestError::NotLeader);
        };
        // Millisecond precision, like the history's.
        let now = ctx.clock.now();
        let mut tick = DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now);
        if tick.timestamp_subsec_millis() == 0 {
            // Not the key of a scheduled tick (those are whole seconds).
            tick += chrono::Duration::milliseconds(1);
        }
        let already_claimed = || -> RequestError {
            RequestError::AlreadyClaimed {
                job: job.to_owned(),
                tick: tick.to_rfc3339(),
            }
        };
        let now = ctx.clock.now();
        let claim = match self.claim(state, tick, now, &leadership).await {
            Ok(claim) => claim,
            Err(NotTaken::Held) => return Err(already_claimed()),
            Err(NotTaken::Stopped) => return Err(RequestError::ShutDown),
            Err(NotTaken::Failed(err)) => return Err(RequestError::Lock(err)),
        };
        let run_lock = match self
            .take(
                &self.run_resource(job),
                self.run_lock_ttl,
                Duration::ZERO,
                now,
                Some(&leadership),
                true,
            )
            .await
        {
            Ok(run_lock) => run_lock,
            Err(not_taken) => {
                // Not run: the tick is no one's.
                claim.give_back().await;
                return Err(match not_taken {
                    NotTaken::Held => RequestError::AlreadyRunning {
                        job: job.to_owned(),
                    },
                    NotTaken::Stopped => RequestError::ShutDown,
                    NotTaken::Failed(err) => RequestError::Lock(err),
                });
            }
        };
        if !self.insert_row(state, tick, leadership.epoch(), true).await {
            let _ = run_lock.release().await;
            return Err(already_claimed());
        }
        claim.keep();
        let grant = Grant::of(&leadership);
        self.start_run(index, tick, run_lock, grant, ctx.slots.take(), false, true);
        Ok(tick)
    }

    /// The leader: runs `tick` here, counted by `slot`, once its time comes (a tick
    /// handed out ahead of time starts at its time). `false` if the leadership ended or
    /// shutdown began before the run started: nothing was recorded, and the tick is
    /// for the next leader.
    pub(super) async fn run_here(
        self: &Arc<Self>,
        index: usize,
        tick: DateTime<Utc>,
        late: bool,
        slot: Slot,
        leadership: &Leadership,
    ) -> bool {
        let Some(state) = self.ctx.jobs.get(index) else {
            return true;
        };
        let state = &*state;
        let token = leadership.epoch();
        if !self.wait_for_tick(tick, Some(leadership)).await {
            return false;
        }
        if self.dropped(state, tick, token) {
            return true;
        }
        let run_lock = match self
            .take_run_lock(state, tick, late, Some(leadership))
            .await
        {
            Ok(run_lock) => run_lock,
            Err(RunLockRefused::Stopped) => return false,
            Err(refused) => {
                self.record_refusal(state, tick, token, refused);
                return true;
            }
        };
        if !self.insert_row(state, tick, token, false).await {
            let _ = run_lock.release().await;
            return true;
        }
        let grant = Grant::of(leadership);
        self.start_run(index, tick, run_lock, grant, slot, late, false);
        true
    }

    /// Sleeps until `tick` (at once if it is due): `false` if the leadership (if
    /// given) ended or shutdown began meanwhile.
    pub(super) async fn wait_for_tick(
        &self,
        tick: DateTime<Utc>,
        leadership: Option<&Leadership>,
    ) -> bool {
        let ended = leadership.map_or_else(CancellationToken::new, |l| l.ended_token().clone());
        tokio::select! {
            biased;
            () = ended.cancelled() => false,
            () = self.ctx.stop_firing.cancelled() => false,
            () = self.ctx.clock.sleep_until(tick) => true,
        }
    }

    /// Takes the job's run lock for `tick`: no overlap, cluster-wide. A late run waits
    /// for the one before it (within the grace window); an on-time tick does not.
    pub(super) async fn take_run_lock(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        late: bool,
        leadership: Option<&Leadership>,
    ) -> Result<Lock, RunLockRefused> {
        let deadline = self.ctx.deadline(state, tick);
        let wait = if late {
            (deadline - self.ctx.clock.now())
                .to_std()
                .unwrap_or_default()
        } else {
            OVERLAP_WAIT
        };
        let taken = self
            .take(
                &self.run_resource(&state.name),
                self.run_lock_ttl,
                wait,
                deadline,
                leadership,
                true,
            )
            .await;
        taken.map_err(|not_taken| match not_taken {
            NotTaken::Stopped => RunLockRefused::Stopped,
            NotTaken::Held => RunLockRefused::Overlap(match state.running_tick() {
                Some(running) => format!(
                    "overlap: the run of {} is still going",
                    running.to_rfc3339()
                ),
                None => "overlap: a run of the job is still going on another replica".to_owned(),
            }),
            NotTaken::Failed(err) => {
                RunLockRefused::Failed(format!("the job's run lock could not be taken: {err}"))
            }
        })
    }

    /// Whether a claimed `tick` is dropped because its job changed since it was
    /// planned (removed, or rescheduled without that tick); recorded so.
    pub(super) fn dropped(&self, state: &JobState, tick: DateTime<Utc>, token: u64) -> bool {
        let (kind, reason) = if state.is_removed() {
            (
                SkipReason::Removed,
                "the job was removed after its tick was claimed",
            )
        } else if state.superseded(tick) {
            (
                SkipReason::Rescheduled,
                "the job was rescheduled after its tick was claimed, and its new schedule has no such tick",
            )
        } else {
            return false;
        };
        self.record_skip(state, tick, token, kind, reason.to_owned());
        true
    }

    /// Records why a tick whose run lock was refused did not run.
    pub(super) fn record_refusal(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        token: u64,
        refused: RunLockRefused,
    ) {
        match refused {
            RunLockRefused::Stopped => {}
            RunLockRefused::Overlap(reason) => {
                self.record_skip(state, tick, token, SkipReason::Overlap, reason);
            }
            RunLockRefused::Failed(reason) => {
                self.record_skip(state, tick, token, SkipReason::RunLock, reason);
            }
        }
    }

    /// Inserts the running row of a tick; `false` if another replica's row is there.
    pub(super) async fn insert_row(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        token: u64,
        manual: bool,
    ) -> bool {
        let Some(recorder) = &self.ctx.recorder else {
            return true;
        };
        let row = Row {
            job: Arc::clone(&state.name),
            tick,
            token,
            outcome: Outcome::Running,
            note: None,
            manual,
            at: self.ctx.clock.now(),
        };
        match recorder.insert(row).await {
            Inserted::Yes | Inserted::Queued => true,
            Inserted::Taken => {
                tracing::debug!(job = %state.name, %tick, "tick already recorded by another replica");
                false
            }
        }
    }

    /// Records a tick that was claimed but not run.
    pub(super) fn record_skip(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        token: u64,
        kind: SkipReason,
        reason: String,
    ) {
        self.note_skip(state, tick, kind, &reason);
        if let Some(recorder) = &self.ctx.recorder {
            recorder.insert_later(Row {
                job: Arc::clone(&state.name),
                tick,
                token,
                outcome: Outcome::Skipped,
                note: Some(reason),
                manual: false,
                at: self.ctx.clock.now(),
            });
        }
    }

    /// This replica's account of a skipped tick (its row is written by the caller).
    pub(super) fn note_skip(
        &self,
        state: &JobState,
        tick: DateTime<Utc>,
        kind: SkipReason,
        reason: &str,
    ) {
        tracing::info!(job = %state.name, %tick, %reason, "tick skipped");
        telemetry::skipped(&state.name, kind);
        state.skipped.fetch_add(1, Ordering::Relaxed);
        *lock(&state.last_skipped) = Some(LastRun {
            tick,
            instance: self.ctx.instance.to_string(),
            outcome: Outcome::Skipped,
            error: Some(reason.to_owned()),
            recorded: false,
        });
    }

    /// Starts the run of a claimed tick whose run lock is held, counted by `slot` until
    /// it ends.
    #[allow(clippy::too_many_arguments)] // one run's facts
    pub(super) fn start_run(
        self: &Arc<Self>,
        index: usize,
        tick: DateTime<Utc>,
        run_lock: Lock,
        grant: Grant,
        slot: Slot,
        late: bool,
        manual: bool,
    ) {
        let Some(state) = self.ctx.jobs.get(index) else {
            return;
        };
        let state = &*state;
        state.running.store(true, Ordering::Release);
        state.catching_up.store(late, Ordering::Release);
        *lock(&state.running_tick) = Some(tick);
        let operator_cancel = CancellationToken::new();
        *lock(&state.operator_cancel) = Some(operator_cancel.clone());
        let inner = Arc::clone(self);
        let lag_ms = (inner.ctx.clock.now() - tick).num_milliseconds();
        let lag = Duration::from_millis(u64::try_from(lag_ms).unwrap_or(0));
        telemetry::run_started(&state.name, lag);
        let span = tracing::info_span!(
            "job.run",
            job = %state.name,
            %tick,
            instance = %inner.ctx.instance,
            token = grant.token,
            lag_ms,
            manual,
        );
        let record = self.ctx.recorder.as_ref().map(|recorder| {
            Arc::new(RunRecord::new(
                recorder.history().clone(),
                self.ctx.name.clone(),
                self.ctx.clock.now(),
                Arc::clone(&self.ctx.clock),
            ))
        });
        self.ctx.runs.spawn(
            async move {
                let _slot = slot;
                let Some(state) = inner.ctx.jobs.get(index) else {
                    return;
                };
                let state = &*state;
                let started = std::time::Instant::now();
                let ctx = JobContext {
                    job: Arc::clone(&state.name),
                    tick,
                    fencing_token: grant.token,
                    instance: Arc::clone(&inner.ctx.instance),
                    cancel: CancellationToken::new(),
                    manual,
                    record: record.clone(),
                };
                let (outcome, error) = inner
                    .run(state, ctx, run_lock, &grant, &operator_cancel)
                    .await;
                let (outcome, error) = match record {
                    Some(record) => commits_outcome(&record, outcome, error).await,
                    None => (outcome, error),
                };
                telemetry::run_ended(&state.name, outcome.as_str(), started.elapsed());
                state.running.store(false, Ordering::Release);
                state.catching_up.store(false, Ordering::Release);
                *lock(&state.running_tick) = None;
                *lock(&state.operator_cancel) = None;
                state.idle.notify_waiters();
                match outcome {
                    Outcome::Succeeded => tracing::info!("run succeeded"),
                    _ => tracing::warn!(
                        outcome = outcome.as_str(),
                        error = error.as_deref(),
                        "run did not succeed"
                    ),
                }
                *lock(&state.last) = Some(LastRun {
                    tick,
                    instance: inner.ctx.instance.to_string(),
                    outcome,
                    error: error.clone(),
                    recorded: false,
                });
                if let Some(recorder) = &inner.ctx.recorder {
                    recorder.finish(
                        Arc::clone(&state.name),
                        tick,
                        outcome,
                        error,
                        Arc::clone(&state.last),
                    );
                }
            }
            .instrument(span),
        );
    }

    /// Runs the handler until it ends or must stop (`operator_cancel`: an operator
    /// cancelled it); then lets the run lock go (to the next tick waiting for it, if
    /// any).
    async fn run(
        &self,
        state: &JobState,
        ctx: JobContext,
        mut run_lock: Lock,
        grant: &Grant,
        operator_cancel: &CancellationToken,
    ) -> (Outcome, Option<String>) {
        // The lock lives as long as the run: up to the job's timeout (and the time to
        // stop) if it has one; otherwise as long as it goes on (the core's upper bound
        // on any hold, 30 days).
        let def = state.def();
        let bound = def
            .job
            .spec
            .run_timeout()
            .map_or(Duration::MAX, |t| t.saturating_add(CANCEL_GRACE * 2));
        // A commit under way when the run must stop is waited for, the lock kept.
        let record = ctx.record.clone();
        let bound =
            bound.saturating_add(record.as_ref().map_or(Duration::ZERO, |r| r.commit_bound()));
        run_lock.auto_extend_for(bound);
        if let Some(record) = &record {
            record.held_by(run_lock.handle());
        }
        *lock(&state.run_lock) = Some(run_lock.handle());
        let cancel = ctx.cancel.clone();
        let handler = Arc::clone(&def.job.handler);
        let mut work = std::pin::pin!(handler(ctx));
        let timeout = async {
            match def.job.spec.run_timeout() {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        // A run that ended is recorded as it ended, even when a stop came at the same
        // instant; then a lost lock before a deadline, before an operator's cancel.
        let stopped: (Outcome, &str) = tokio::select! {
            biased;
            result = &mut work => {
                *lock(&state.run_lock) = None;
                let _ = run_lock.release().await;
                return match result {
                    Ok(()) => (Outcome::Succeeded, None),
                    Err(err) => (Outcome::Failed, Some(err.to_string())),
                };
            }
            () = grant.lost.cancelled() => (Outcome::Cancelled, "leadership lost"),
            () = run_lock.lost() => (Outcome::Cancelled, "the job's run lock was lost"),
            () = self.ctx.hard_stop.cancelled() => (Outcome::Cancelled, "shutdown deadline reached"),
            () = operator_cancel.cancelled() => (Outcome::Cancelled, "cancelled by an operator"),
            () = timeout => (Outcome::TimedOut, "timed out"),
        };
        cancel.cancel();
        if tokio::time::timeout(CANCEL_GRACE, &mut work).await.is_err()
            && let Some(record) = record.filter(|r| r.commits().in_flight > 0)
        {
            // A commit is not dropped half-way: its answer is waited for (it ends within
            // its own bound), then the handler gets the grace again to take it.
            record.settled(record.commit_bound()).await;
            let _ = tokio::time::timeout(CANCEL_GRACE, &mut work).await;
        }
        *lock(&state.run_lock) = None;
        let _ = run_lock.release().await;
        (stopped.0, Some(stopped.1.to_owned()))
    }

    /// Closes the rows left `running` whose run no longer holds its job's run lock:
    /// their replica died (or lost contact) mid-run. The lock is free (probed), or a
    /// run on this replica holds it now: either way the row's run cannot be alive.
    pub(super) async fn sweep_abandoned(&self, leadership: &Leadership) {
        let Some(recorder) = &self.ctx.recorder else {
            return;
        };
        let running = match recorder.history().running(&self.ctx.name).await {
            Ok(running) => running,
            Err(err) => {
                recorder.health.fail(&err);
                return;
            }
        };
        for run in running {
            // A removed job's rows are closed too.
            let Some((_, state)) = self.ctx.jobs.find(&run.job) else {
                continue;
            };
            let state = &*state;
            // A live run of the job holds its run lock; a row whose tick is being
            // claimed right now is younger than a claim attempt.
            let young = (self.ctx.clock.now() - run.started.unwrap_or(run.tick))
                .to_std()
                .unwrap_or_default()
                < self.run_lock_ttl;
            if young {
                continue;
            }
            // This row is this replica's live run.
            if state.running_tick() == Some(run.tick) && *run.instance == *self.ctx.instance {
                continue;
            }
            // A run here holds the job's run lock now (a job's runs never overlap, so
            // the row's run cannot be alive); otherwise the lock is probed: another
            // replica's run may hold it (runs are spread).
            if !state.holds_run_lock() && !self.run_lock_is_free(&run.job, leadership).await {
                continue;
            }
            let reason = format!(
                "abandoned: replica {} stopped while it ran (its run lock expired)",
                run.instance
            );
            match recorder
                .history()
                .abandon(&run, &self.ctx.instance, &reason, self.ctx.clock.now())
                .await
            {
                Ok(true) => {
                    state.abandoned.fetch_add(1, Ordering::Relaxed);
                    crate::telemetry::abandoned(&run.job);
                    tracing::warn!(job = %run.job, tick = %run.tick, instance = %run.instance, "run abandoned by its replica: marked so");
                }
                Ok(false) => {}
                Err(err) => recorder.health.fail(&err),
            }
        }
    }

    /// Whether nobody holds `job`'s run lock (probed by taking and releasing it).
    async fn run_lock_is_free(&self, job: &str, leadership: &Leadership) -> bool {
        let Ok(probe) = self
            .take(
                &self.run_resource(job),
                self.run_lock_ttl,
                Duration::ZERO,
                self.ctx.clock.now(),
                Some(leadership),
                false,
            )
            .await
        else {
            return false;
        };
        let _ = probe.release().await;
        true
    }
}

/// How a run with a history is recorded, once no commit of its transactions is in
/// flight (waiting within the commit's bound): succeeded if one committed; otherwise as
/// it ended. A commit whose outcome is in doubt is settled by the run's row: the end
/// written to the history never overwrites a `succeeded` row, and the row is read back.
async fn commits_outcome(
    record: &RunRecord,
    outcome: Outcome,
    error: Option<String>,
) -> (Outcome, Option<String>) {
    let commits = record.settled(record.commit_bound()).await;
    if commits.committed {
        return committed_outcome(outcome, error);
    }
    if commits.in_doubt || commits.in_flight > 0 {
        tracing::warn!(
            outcome = outcome.as_str(),
            "whether the run's transaction committed is not known yet: its history row decides"
        );
    }
    (outcome, error)
}

/// How a run whose transaction committed is recorded: succeeded (its effects are in, and
/// its row says so already), with what happened after the commit as a note.
fn committed_outcome(outcome: Outcome, error: Option<String>) -> (Outcome, Option<String>) {
    match (outcome, error) {
        (Outcome::Succeeded, error) => (Outcome::Succeeded, error),
        (outcome, error) => (
            Outcome::Succeeded,
            Some(format!(
                "its transaction committed; afterwards: {}",
                error.unwrap_or_else(|| outcome.as_str().to_owned())
            )),
        ),
    }
}
