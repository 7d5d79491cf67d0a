//! The leader's record in the history, for admin tools
//! ([`SchedulerAdmin::leader`](crate::admin::SchedulerAdmin::leader)): written when this replica
//! is elected, renewed while it leads, marked ended when its leadership ends. A leader
//! that stops without saying so (a crash, a lost database) leaves a record whose lease
//! runs out.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::state::Inner;
use crate::leader::Leadership;

/// How often the leader renews its record.
const RENEW_EVERY: Duration = Duration::from_secs(2);

/// How long the record holds without a renewal: a few renewals, so that a slow
/// database or a little clock skew between the leader and an admin tool does not hide
/// a live leader.
const LEASE: Duration = Duration::from_secs(10);

/// Keeps this replica's record as `leadership`'s leader until the leadership ends,
/// then marks it ended.
pub(super) async fn keep_record(inner: Arc<Inner>, leadership: Leadership) {
    let Some(recorder) = inner.recorder.clone() else {
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
                    .record_leader(
                        &inner.name,
                        &inner.instance,
                        leadership.epoch(),
                        leadership.since(),
                        Utc::now() + lease,
                    )
                    .await;
                match written {
                    Ok(()) => recorder.health.read_ok(),
                    Err(err) => recorder.health.fail(&err),
                }
            }
        }
    }
    inner.record_leadership_end(leadership.epoch()).await;
}

impl Inner {
    /// Marks the leadership of `epoch` ended in the history (once is enough: a second
    /// time does nothing).
    pub(super) async fn record_leadership_end(&self, epoch: u64) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        if let Err(err) = recorder
            .history()
            .end_leadership(&self.name, epoch, Utc::now())
            .await
        {
            tracing::warn!(error = %err, epoch, "could not record the end of this replica's leadership: admin tools name it leader until its record runs out");
            recorder.health.fail(&err);
        }
    }
}
