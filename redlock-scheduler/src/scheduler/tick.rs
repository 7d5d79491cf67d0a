//! One tick, from claim to record: claim it (retrying failures within its grace window),
//! check pause and overlap (the job's run lock, cluster-wide), insert its row, run the
//! handler, record the end. Each tick is a task of its own: the firing loop never waits
//! on Redis or the database.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::{CancellationToken, Error as LockError, Lock, RetryPolicy};
use tracing::Instrument;

use super::handoff::Placed;
use super::state::{Inner, JobState, Slot, lock};
use crate::history::Outcome;
use crate::job::JobContext;
use crate::leader::Leadership;
use crate::plan::Action;
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

impl Inner {
    /// Takes `resource` for `ttl`, waiting up to `wait` while someone holds it, retrying
    /// failures until `until` (wall clock).
    pub(super) async fn take(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
        until: DateTime<Utc>,
        leadership: Option<&Leadership>,
    ) -> Result<Lock, NotTaken> {
        let ended = leadership.map_or_else(CancellationToken::new, |l| l.ended_token().clone());
        let mut backoff = RETRY_FIRST;
        loop {
            let acquire = if wait.is_zero() {
                self.redlock.try_lock(resource)
            } else {
                self.redlock
                    .lock(resource)
                    .retry(RetryPolicy::deadline(wait))
            }
            .ttl(ttl)
            .fencing(false);
            let result = tokio::select! {
                result = acquire => result,
                () = ended.cancelled() => return Err(NotTaken::Stopped),
                () = self.stop_firing.cancelled() => return Err(NotTaken::Stopped),
            };
            let err = match result {
                Ok(lock) => return Ok(lock),
                Err(LockError::Taken { .. }) => return Err(NotTaken::Held),
                Err(err) => err,
            };
            let next_try =
                self.clock.now() + chrono::Duration::from_std(backoff).unwrap_or_default();
            if next_try > until {
                return Err(NotTaken::Failed(err));
            }
            tracing::debug!(%resource, error = %err, "lock attempt failed; retrying");
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = ended.cancelled() => return Err(NotTaken::Stopped),
                () = self.stop_firing.cancelled() => return Err(NotTaken::Stopped),
            }
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Carries out one planned tick.
    pub(super) async fn handle_tick(
        self: &Arc<Self>,
        index: usize,
        tick: DateTime<Utc>,
        action: Action,
        leadership: &Leadership,
    ) {
        let Some(state) = self.jobs.get(index) else {
            return;
        };
        let state = &*state;
        let deadline = self.deadline(state, tick);
        let token = leadership.epoch();
        // An on-time run that may go anywhere is placed ahead of its time, and claimed
        // then if it goes to another replica; a run that stays here is claimed at its
        // time, so that a leader that stops before leaves the tick to the next one.
        let mut placed = None;
        if matches!(action, Action::Run { late: false }) && self.spreads(state) {
            match self.place(leadership, deadline, true).await {
                Placed::Stopped => return,
                place => placed = Some(place),
            }
        }
        let handing_over = matches!(placed, Some(Placed::There(_)));
        if !handing_over && !self.wait_for_tick(tick, Some(leadership)).await {
            return;
        }
        let claim = self
            .take(
                &self.claim_resource(state, tick),
                self.claim_ttl(state),
                Duration::ZERO,
                deadline,
                Some(leadership),
            )
            .await;
        match claim {
            // Left to expire: until then no replica considers the tick again.
            Ok(claim) => drop(claim.detach()),
            Err(NotTaken::Held) => {
                tracing::debug!(job = %state.name, %tick, "tick already claimed elsewhere");
                return;
            }
            Err(NotTaken::Stopped) => return,
            Err(NotTaken::Failed(err)) => {
                tracing::warn!(job = %state.name, %tick, error = %err, "could not claim the tick within its grace window: not run");
                self.record_skip(
                    state,
                    tick,
                    token,
                    SkipReason::Unclaimable,
                    format!("not claimable within the grace window: {err}"),
                );
                return;
            }
        }
        let late = match action {
            Action::Skip(reason) => {
                self.record_skip(state, tick, token, SkipReason::Missed, reason);
                return;
            }
            Action::Run { late } => late,
        };
        if state.paused.load(Ordering::Acquire) {
            let paused = SkipReason::Paused;
            self.record_skip(state, tick, token, paused, "paused".to_owned());
            return;
        }
        if self.dropped(state, tick, token) {
            return;
        }
        if let Some(Placed::There(replica)) = &placed {
            match self.hand_over(state, tick, replica, leadership).await {
                Ok(()) | Err(None) => {}
                Err(Some(reason)) => {
                    self.record_skip(state, tick, token, SkipReason::Untaken, reason);
                }
            }
            return;
        }
        // Here: when this replica has room for it.
        let placed = match placed {
            Some(placed) => placed,
            None => self.place(leadership, deadline, false).await,
        };
        let slot = match placed {
            Placed::Here(slot) => slot,
            Placed::Nowhere => {
                let reason =
                    "no replica had room for the run (max_concurrent_runs) within the grace window";
                self.record_skip(state, tick, token, SkipReason::NoRoom, reason.to_owned());
                return;
            }
            Placed::There(_) | Placed::Stopped => return,
        };
        self.run_here(index, tick, late, slot, leadership).await;
    }

    /// The leader: runs `tick` here, counted by `slot`, once its time comes (a tick
    /// handed out ahead of time starts at its time).
    pub(super) async fn run_here(
        self: &Arc<Self>,
        index: usize,
        tick: DateTime<Utc>,
        late: bool,
        slot: Slot,
        leadership: &Leadership,
    ) {
        let Some(state) = self.jobs.get(index) else {
            return;
        };
        let state = &*state;
        let token = leadership.epoch();
        if !self.wait_for_tick(tick, Some(leadership)).await {
            return;
        }
        if self.dropped(state, tick, token) {
            return;
        }
        let run_lock = match self
            .take_run_lock(state, tick, late, Some(leadership))
            .await
        {
            Ok(run_lock) => run_lock,
            Err(refused) => {
                self.record_refusal(state, tick, token, refused);
                return;
            }
        };
        if !self.insert_row(state, tick, token, false).await {
            let _ = run_lock.release().await;
            return;
        }
        let grant = Grant::of(leadership);
        self.start_run(index, tick, run_lock, grant, slot, late, false);
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
            () = self.clock.sleep_until(tick) => true,
            () = ended.cancelled() => false,
            () = self.stop_firing.cancelled() => false,
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
        let deadline = self.deadline(state, tick);
        let wait = if late {
            (deadline - self.clock.now()).to_std().unwrap_or_default()
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
        let Some(recorder) = &self.recorder else {
            return true;
        };
        let row = Row {
            job: Arc::clone(&state.name),
            tick,
            token,
            outcome: Outcome::Running,
            note: None,
            manual,
            at: self.clock.now(),
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
        if let Some(recorder) = &self.recorder {
            recorder.insert_later(Row {
                job: Arc::clone(&state.name),
                tick,
                token,
                outcome: Outcome::Skipped,
                note: Some(reason),
                manual: false,
                at: self.clock.now(),
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
            instance: self.instance.to_string(),
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
        let Some(state) = self.jobs.get(index) else {
            return;
        };
        let state = &*state;
        state.running.store(true, Ordering::Release);
        state.catching_up.store(late, Ordering::Release);
        *lock(&state.running_tick) = Some(tick);
        let operator_cancel = CancellationToken::new();
        *lock(&state.operator_cancel) = Some(operator_cancel.clone());
        let inner = Arc::clone(self);
        let lag_ms = (inner.clock.now() - tick).num_milliseconds();
        let lag = Duration::from_millis(u64::try_from(lag_ms).unwrap_or(0));
        telemetry::run_started(&state.name, lag);
        let span = tracing::info_span!(
            "job.run",
            job = %state.name,
            %tick,
            instance = %inner.instance,
            token = grant.token,
            lag_ms,
            manual,
        );
        let record = self.recorder.as_ref().map(|recorder| {
            Arc::new(RunRecord::new(
                recorder.history().clone(),
                self.name.clone(),
                self.clock.now(),
                Arc::clone(&self.clock),
            ))
        });
        self.runs.spawn(
            async move {
                let _slot = slot;
                let Some(state) = inner.jobs.get(index) else {
                    return;
                };
                let state = &*state;
                let started = std::time::Instant::now();
                let ctx = JobContext {
                    job: Arc::clone(&state.name),
                    tick,
                    fencing_token: grant.token,
                    instance: Arc::clone(&inner.instance),
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
                    instance: inner.instance.to_string(),
                    outcome,
                    error: error.clone(),
                    recorded: false,
                });
                if let Some(recorder) = &inner.recorder {
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
        let stopped: (Outcome, &str) = tokio::select! {
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
            () = self.hard_stop.cancelled() => (Outcome::Cancelled, "shutdown deadline reached"),
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
