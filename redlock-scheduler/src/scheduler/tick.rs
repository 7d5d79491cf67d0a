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

use super::state::{Inner, JobState, lock};
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
        let deadline = self.deadline(state, tick);
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
                    leadership,
                    SkipReason::Unclaimable,
                    format!("not claimable within the grace window: {err}"),
                );
                return;
            }
        }
        let late = match action {
            Action::Skip(reason) => {
                self.record_skip(state, tick, leadership, SkipReason::Missed, reason);
                return;
            }
            Action::Run { late } => late,
        };
        if state.paused.load(Ordering::Acquire) {
            let paused = SkipReason::Paused;
            self.record_skip(state, tick, leadership, paused, "paused".to_owned());
            return;
        }
        // No overlap, cluster-wide: the job's run lock. A late run waits for the one
        // before it (within the grace window); an on-time tick does not.
        let wait = if late {
            (deadline - self.clock.now()).to_std().unwrap_or_default()
        } else {
            OVERLAP_WAIT
        };
        let run_lock = match self
            .take(
                &self.run_resource(&state.name),
                self.run_lock_ttl,
                wait,
                deadline,
                Some(leadership),
            )
            .await
        {
            Ok(run_lock) => run_lock,
            Err(NotTaken::Stopped) => return,
            Err(NotTaken::Held) => {
                let reason = match state.running_tick() {
                    Some(running) => format!(
                        "overlap: the run of {} is still going",
                        running.to_rfc3339()
                    ),
                    None => {
                        "overlap: a run of the job is still going on another replica".to_owned()
                    }
                };
                self.record_skip(state, tick, leadership, SkipReason::Overlap, reason);
                return;
            }
            Err(NotTaken::Failed(err)) => {
                self.record_skip(
                    state,
                    tick,
                    leadership,
                    SkipReason::RunLock,
                    format!("the job's run lock could not be taken: {err}"),
                );
                return;
            }
        };
        if !self
            .insert_row(state, tick, leadership.epoch(), false)
            .await
        {
            let _ = run_lock.release().await;
            return;
        }
        self.start_run(index, tick, run_lock, leadership.clone(), late, false);
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
        leadership: &Leadership,
        kind: SkipReason,
        reason: String,
    ) {
        tracing::info!(job = %state.name, %tick, %reason, "tick skipped");
        telemetry::skipped(&state.name, kind);
        state.skipped.fetch_add(1, Ordering::Relaxed);
        *lock(&state.last_skipped) = Some(LastRun {
            tick,
            instance: self.instance.to_string(),
            outcome: Outcome::Skipped,
            error: Some(reason.clone()),
            recorded: false,
        });
        if let Some(recorder) = &self.recorder {
            recorder.insert_later(Row {
                job: Arc::clone(&state.name),
                tick,
                token: leadership.epoch(),
                outcome: Outcome::Skipped,
                note: Some(reason),
                manual: false,
                at: self.clock.now(),
            });
        }
    }

    /// Starts the run of a claimed tick whose run lock is held.
    pub(super) fn start_run(
        self: &Arc<Self>,
        index: usize,
        tick: DateTime<Utc>,
        run_lock: Lock,
        leadership: Leadership,
        late: bool,
        manual: bool,
    ) {
        let Some(state) = self.jobs.get(index) else {
            return;
        };
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
            token = leadership.epoch(),
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
                let Some(state) = inner.jobs.get(index) else {
                    return;
                };
                let started = std::time::Instant::now();
                let ctx = JobContext {
                    job: Arc::clone(&state.name),
                    tick,
                    fencing_token: leadership.epoch(),
                    instance: Arc::clone(&inner.instance),
                    cancel: CancellationToken::new(),
                    manual,
                    record: record.clone(),
                };
                let (outcome, error) = inner
                    .run(state, ctx, run_lock, &leadership, &operator_cancel)
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
        leadership: &Leadership,
        operator_cancel: &CancellationToken,
    ) -> (Outcome, Option<String>) {
        // The lock lives as long as the run: up to the job's timeout (and the time to
        // stop) if it has one; otherwise as long as it goes on (the core's upper bound
        // on any hold, 30 days).
        let bound = state
            .job
            .timeout
            .map_or(Duration::MAX, |t| t.saturating_add(CANCEL_GRACE * 2));
        // A commit under way when the run must stop is waited for, the lock kept.
        let record = ctx.record.clone();
        let bound =
            bound.saturating_add(record.as_ref().map_or(Duration::ZERO, |r| r.commit_bound()));
        run_lock.auto_extend_for(bound);
        let cancel = ctx.cancel.clone();
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
                let _ = run_lock.release().await;
                return match result {
                    Ok(()) => (Outcome::Succeeded, None),
                    Err(err) => (Outcome::Failed, Some(err.to_string())),
                };
            }
            () = leadership.lost_token().cancelled() => (Outcome::Cancelled, "leadership lost"),
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
