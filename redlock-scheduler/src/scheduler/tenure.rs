//! [`Tenure`]: this replica's part in the election, and the leader's record in the
//! history for admin tools ([`SchedulerAdmin::leader`](crate::admin::SchedulerAdmin::leader)):
//! written when this replica is elected, renewed while it leads, marked ended when its
//! leadership ends. A leader that stops without saying so (a crash, a lost database)
//! leaves a record whose lease runs out.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use super::context::Context;
use crate::leader::{LeaderElector, LeaderEvent, Leadership};

/// How often the leader renews its record.
const RENEW_EVERY: Duration = Duration::from_secs(2);

/// How long the record holds without a renewal: a few renewals, so that a slow
/// database or a little clock skew between the leader and an admin tool does not hide
/// a live leader.
const LEASE: Duration = Duration::from_secs(10);

/// Leadership: the elector (started once), its options, and the leader's record.
pub(super) struct Tenure {
    ctx: Arc<Context>,
    elector: OnceLock<LeaderElector>,
    leader_ttl: Option<Duration>,
    term: Duration,
    retry_interval: Duration,
}

impl Tenure {
    /// The options were checked by `SchedulerBuilder::build`.
    pub(super) fn new(
        ctx: Arc<Context>,
        leader_ttl: Option<Duration>,
        term: Duration,
        retry_interval: Duration,
    ) -> Self {
        Self {
            ctx,
            elector: OnceLock::new(),
            leader_ttl,
            term,
            retry_interval,
        }
    }

    /// Starts campaigning, once: the elector's events the first time, `None` after.
    pub(super) fn start(&self) -> Option<watch::Receiver<LeaderEvent>> {
        let mut started = false;
        let elector = self.elector.get_or_init(|| {
            started = true;
            let ctx = &self.ctx;
            let mut builder =
                LeaderElector::builder(ctx.redlock.clone(), crate::keys::leader(&ctx.name))
                    .instance(ctx.instance.to_string())
                    .term(self.term)
                    .retry_interval(self.retry_interval)
                    .shared_clock(Arc::clone(&ctx.clock));
            if let Some(ttl) = self.leader_ttl {
                builder = builder.ttl(ttl);
            }
            builder.spawn()
        });
        started.then(|| elector.subscribe())
    }

    /// The elector, once started.
    pub(super) fn elector(&self) -> Option<&LeaderElector> {
        self.elector.get()
    }

    /// The current leadership, if this replica leads.
    pub(super) fn leadership(&self) -> Option<Leadership> {
        self.elector.get().and_then(LeaderElector::leadership)
    }

    /// Hands leadership over and keeps out of the election for a while: whether this
    /// replica led and stepped down.
    pub(super) async fn step_down(&self) -> bool {
        match self.elector.get() {
            Some(elector) => elector.step_down(self.step_down_back_off()).await,
            None => false,
        }
    }

    /// How long a leader that stepped down keeps out of the election: the leadership
    /// TTL, at least 2 s, so that another replica takes over.
    fn step_down_back_off(&self) -> Duration {
        self.leader_ttl
            .unwrap_or_else(|| self.ctx.redlock.default_ttl())
            .max(Duration::from_secs(2))
    }

    /// The leader as recorded in the history, for a replica that does not lead (`None`
    /// without a history, or before the leader recorded itself). A record naming this
    /// replica is its own leadership, ended before the record says so: no leader is
    /// known then, rather than this replica.
    pub(super) async fn recorded_leader(&self) -> Option<String> {
        let ctx = &self.ctx;
        let leader = ctx
            .history()?
            .control()
            .leader(&ctx.name, ctx.clock.now())
            .await
            .ok()
            .flatten()?;
        (*leader != *ctx.instance).then_some(leader)
    }

    /// Leaves the election (handing leadership over if this replica leads) and marks
    /// its leadership ended in the history, the latter until `until` at most.
    pub(super) async fn shutdown(&self, until: tokio::time::Instant) {
        let Some(elector) = self.elector.get() else {
            return;
        };
        let leading = elector.leadership();
        elector.shutdown().await;
        // Admin tools name no leader until the next one records itself.
        if let Some(leadership) = leading {
            let ended = self.record_end(leadership.epoch());
            let _ = tokio::time::timeout_at(until, ended).await;
        }
    }

    /// Keeps this replica's record as `leadership`'s leader until the leadership ends,
    /// then marks it ended.
    pub(super) async fn keep_record(&self, leadership: Leadership) {
        let ctx = &self.ctx;
        let Some(recorder) = &ctx.recorder else {
            return;
        };
        let lease = chrono::Duration::from_std(LEASE).unwrap_or_default();
        let mut renewals = tokio::time::interval(RENEW_EVERY);
        renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = leadership.ended_token().cancelled() => break,
                _ = renewals.tick() => {
                    let written = recorder
                        .history()
                        .control().record_leader(
                            &ctx.name,
                            &ctx.instance,
                            leadership.epoch(),
                            leadership.since(),
                            ctx.clock.now() + lease,
                        )
                        .await;
                    match written {
                        Ok(()) => recorder.health.read_ok(),
                        Err(err) => recorder.health.fail(&err),
                    }
                }
            }
        }
        self.record_end(leadership.epoch()).await;
    }

    /// Marks the leadership of `epoch` ended in the history (once is enough: a second
    /// time does nothing).
    async fn record_end(&self, epoch: u64) {
        let ctx = &self.ctx;
        let Some(recorder) = &ctx.recorder else {
            return;
        };
        if let Err(err) = recorder
            .history()
            .control()
            .end_leadership(&ctx.name, epoch, ctx.clock.now())
            .await
        {
            tracing::warn!(error = %err, epoch, "could not record the end of this replica's leadership: admin tools name it leader until its record runs out");
            recorder.health.fail(&err);
        }
    }
}
