//! Operators' requests ([`SchedulerAdmin`](crate::admin::SchedulerAdmin)): the leader carries
//! out triggers and step-downs, and cancels of its own runs; a replica running a job
//! carries out the cancels of that run. Each request is taken atomically (the row's
//! `done_ms` set only where it is still empty), so exactly one replica acts on it; the
//! result is written afterwards. Requests older than [`REQUEST_EXPIRY`] are marked
//! expired instead of being carried out late.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::state::lock;
use super::tenure::Tenure;
use super::tick::Ticks;
use crate::error::RequestError;
use crate::leader::Leadership;
use crate::request::{EXPIRED, Request, RequestAction};

/// How often the leader (and a replica with a run going) looks for requests.
pub(super) const REQUEST_POLL: Duration = Duration::from_millis(500);

/// A request nobody took within this long is marked expired, not carried out.
const REQUEST_EXPIRY: Duration = Duration::from_secs(60);

/// Attempts at writing a request's result.
const RESULT_ATTEMPTS: u32 = 3;

/// Operators' requests, as this replica carries them out.
pub(super) struct Requests {
    ctx: Arc<Context>,
}

impl Requests {
    pub(super) fn new(ctx: Arc<Context>) -> Self {
        Self { ctx }
    }

    /// The leader's share of the pending requests: all of them, oldest first, except
    /// the cancels of runs going on other replicas (theirs to carry out).
    pub(super) async fn serve(&self, ticks: &Arc<Ticks>, tenure: &Tenure, leadership: &Leadership) {
        let Some(pending) = self.pending_requests().await else {
            return;
        };
        let now = self.ctx.clock.now();
        for request in pending {
            if !leadership.is_current() || self.ctx.stop_firing.is_cancelled() {
                return;
            }
            let age = (now - request.requested).to_std().unwrap_or_default();
            if age > REQUEST_EXPIRY {
                let result = format!(
                    "{EXPIRED}: no replica carried it out within {}s",
                    REQUEST_EXPIRY.as_secs()
                );
                tracing::warn!(id = %request.id, action = request.action.as_str(), "request expired");
                self.claim(&request, Some(&result)).await;
                continue;
            }
            match request.action {
                RequestAction::Trigger => {
                    if !self.claim(&request, None).await {
                        continue;
                    }
                    let job = request.job.as_deref().unwrap_or_default();
                    let result = match ticks.trigger(job, tenure.leadership()).await {
                        Ok(tick) => triggered(tick),
                        Err(err) => err.to_string(),
                    };
                    tracing::info!(id = %request.id, %job, %result, by = %request.requested_by, "trigger requested");
                    self.finish(&request, &result).await;
                }
                RequestAction::Cancel => self.serve_cancel(&request, true).await,
                RequestAction::StepDown => {
                    if !self.claim(&request, None).await {
                        continue;
                    }
                    let result = if tenure.step_down().await {
                        self.stepped_down(leadership.epoch())
                    } else {
                        format!("{} no longer led", self.ctx.instance)
                    };
                    tracing::info!(id = %request.id, %result, by = %request.requested_by, "step-down requested");
                    self.finish(&request, &result).await;
                    // Not the leader any more: the rest is the next one's.
                    return;
                }
            }
        }
    }

    /// A follower's share: the cancels of the runs going here (it reads the requests
    /// only while one goes).
    pub(super) async fn serve_cancels(&self) {
        if !self
            .ctx
            .jobs
            .all()
            .iter()
            .any(|(_, s)| s.running.load(Ordering::Acquire))
        {
            return;
        }
        let Some(pending) = self.pending_requests().await else {
            return;
        };
        for request in pending {
            if request.action == RequestAction::Cancel {
                self.serve_cancel(&request, false).await;
            }
        }
    }

    /// A cancel: carried out if the run goes here. Otherwise the leader answers `no
    /// run going` unless the history says another replica runs the job (then that
    /// replica answers); a follower leaves it.
    async fn serve_cancel(&self, request: &Request, leader: bool) {
        let job = request.job.as_deref().unwrap_or_default();
        // A removed job's run going on can still be cancelled.
        let Some((_, state)) = self.ctx.jobs.find(job) else {
            if leader {
                let unknown = RequestError::UnknownJob {
                    name: job.to_owned(),
                };
                self.claim(request, Some(&unknown.to_string())).await;
            }
            return;
        };
        let state = &*state;
        if state.running.load(Ordering::Acquire) {
            if !self.claim(request, None).await {
                return;
            }
            let result = match self.cancel_local(job) {
                Some(tick) => self.cancelled(tick),
                None => "no run going".to_owned(),
            };
            tracing::info!(id = %request.id, %job, %result, by = %request.requested_by, "cancel requested");
            self.finish(request, &result).await;
            return;
        }
        if !leader {
            return;
        }
        let Some(recorder) = &self.ctx.recorder else {
            return;
        };
        match recorder.history().running(&self.ctx.name).await {
            Ok(running) => {
                if running
                    .iter()
                    .any(|run| run.job == job && *run.instance != *self.ctx.instance)
                {
                    // That replica's to cancel (or, if it died, the sweep closes its row
                    // and the next look answers).
                    return;
                }
                self.claim(request, Some("no run going")).await;
            }
            Err(err) => recorder.health.fail(&err),
        }
    }

    async fn pending_requests(&self) -> Option<Vec<Request>> {
        let recorder = self.ctx.recorder.as_ref()?;
        match recorder
            .history()
            .requests()
            .pending_requests(&self.ctx.name)
            .await
        {
            Ok(pending) => {
                recorder.health.read_ok();
                Some(pending)
            }
            Err(err) => {
                recorder.health.fail(&err);
                None
            }
        }
    }

    /// Takes `request` (done at once with a `result`): whether this replica got it.
    async fn claim(&self, request: &Request, result: Option<&str>) -> bool {
        let Some(recorder) = &self.ctx.recorder else {
            return false;
        };
        match recorder
            .history()
            .requests()
            .claim_request(
                &request.id,
                &self.ctx.instance,
                self.ctx.clock.now(),
                result,
            )
            .await
        {
            Ok(taken) => taken,
            Err(err) => {
                recorder.health.fail(&err);
                false
            }
        }
    }

    /// Writes the result of a request this replica took.
    async fn finish(&self, request: &Request, result: &str) {
        let Some(recorder) = &self.ctx.recorder else {
            return;
        };
        for attempt in 1..=RESULT_ATTEMPTS {
            match recorder
                .history()
                .requests()
                .finish_request(&request.id, result)
                .await
            {
                Ok(()) => return,
                Err(err) => {
                    recorder.health.fail(&err);
                    if attempt == RESULT_ATTEMPTS {
                        tracing::error!(id = %request.id, %result, error = %err, "the request's result could not be written");
                    } else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
    }

    /// Cancels the run of `job` going on this replica, as an operator asked: its tick,
    /// or `None` if no run of it goes here.
    pub(super) fn cancel_local(&self, job: &str) -> Option<DateTime<Utc>> {
        // A job removed while its run goes on can still have that run cancelled.
        let (_, state) = self.ctx.jobs.find(job)?;
        let token = lock(&state.operator_cancel).clone()?;
        let tick = state.running_tick()?;
        token.cancel();
        Some(tick)
    }

    /// A cancel's result, as [`triggered`]'s.
    pub(super) fn cancelled(&self, tick: DateTime<Utc>) -> String {
        format!(
            "ok: cancelled the run of {} on {}",
            tick.to_rfc3339(),
            self.ctx.instance
        )
    }

    /// A step-down's result, as [`triggered`]'s.
    pub(super) fn stepped_down(&self, epoch: u64) -> String {
        format!("ok: {} stepped down from epoch {epoch}", self.ctx.instance)
    }
}

/// A trigger's result: the same text whether the leader was asked directly or through
/// a request.
pub(super) fn triggered(tick: DateTime<Utc>) -> String {
    format!("ok: tick {}", tick.to_rfc3339())
}

/// On every replica with a history: carries out the cancels of the runs going here
/// while another replica leads (per `tenure`), until `stop`.
pub(super) async fn follow(requests: Arc<Requests>, tenure: Arc<Tenure>, stop: CancellationToken) {
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REQUEST_POLL) => {}
        }
        // The leader serves them all from its housekeeping.
        if tenure.leadership().is_none() {
            requests.serve_cancels().await;
        }
    }
}
