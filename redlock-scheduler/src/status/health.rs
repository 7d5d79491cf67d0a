//! What stops or degrades scheduling, as [`Scheduler::status`](crate::Scheduler::status)
//! reports it: the Redis quorum and the history database, each ok or failing since when,
//! with the last error. Each change of state is logged once (WARN when something starts
//! failing, INFO when it is back), not once per tick.

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::Redlock;
use tokio::sync::watch;

/// How often the Redis nodes are probed for the quorum and readiness.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The health of the scheduler's dependencies, as this replica sees them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Health {
    /// Ready to lead: a majority of Redis nodes answers and is out of restart quarantine
    /// (and the history, if any, is migrated, which connecting it ensures).
    pub ready: bool,
    /// The Redis nodes: ok while a majority can vote.
    pub redis: ComponentHealth,
    /// The history database, if one is configured: ok while its statements succeed.
    pub history: Option<ComponentHealth>,
}

/// One dependency's health.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ComponentHealth {
    /// Working.
    pub ok: bool,
    /// Since when it is in its current state (ok or failing).
    pub since: DateTime<Utc>,
    /// The latest error (kept after recovery, for the record).
    pub last_error: Option<String>,
    /// History writes waiting for the database (rows to insert or finish); 0 for Redis.
    pub pending_writes: usize,
    /// History writes given up because too many were waiting; 0 for Redis.
    pub dropped_writes: u64,
}

/// A dependency's state, changed by what uses it.
#[derive(Debug)]
pub(crate) struct HealthCell {
    what: &'static str,
    state: Mutex<ComponentHealth>,
}

impl HealthCell {
    pub(crate) fn new(what: &'static str, ok: bool) -> Self {
        Self {
            what,
            state: Mutex::new(ComponentHealth {
                ok,
                since: Utc::now(),
                last_error: None,
                pending_writes: 0,
                dropped_writes: 0,
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut ComponentHealth) -> T) -> T {
        f(&mut self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// It failed with `error`; logs at WARN if it was ok.
    pub(crate) fn fail(&self, error: &dyn std::fmt::Display) {
        let error = error.to_string();
        let changed = self.with(|s| {
            s.last_error = Some(error.clone());
            std::mem::replace(&mut s.ok, false)
                .then(|| s.since = Utc::now())
                .is_some()
        });
        if changed {
            tracing::warn!(dependency = self.what, %error, "{} failing: scheduling is degraded until it answers again", self.what);
        }
    }

    /// It worked; logs at INFO if it was failing.
    pub(crate) fn succeed(&self) {
        let down_for = self.with(|s| {
            (!std::mem::replace(&mut s.ok, true)).then(|| {
                let since = std::mem::replace(&mut s.since, Utc::now());
                (Utc::now() - since).to_std().unwrap_or_default()
            })
        });
        if let Some(down_for) = down_for {
            tracing::info!(
                dependency = self.what,
                ?down_for,
                "{} answers again",
                self.what
            );
        }
    }

    /// A read worked: ok again, unless writes still wait (only the writer can say the
    /// database takes them again).
    pub(crate) fn read_ok(&self) {
        if self.with(|s| s.pending_writes) == 0 {
            self.succeed();
        }
    }

    pub(crate) fn is_ok(&self) -> bool {
        self.with(|s| s.ok)
    }

    pub(crate) fn set_pending(&self, pending: usize) {
        self.with(|s| s.pending_writes = pending);
    }

    pub(crate) fn count_dropped(&self, n: u64) {
        self.with(|s| s.dropped_writes += n);
    }

    pub(crate) fn snapshot(&self) -> ComponentHealth {
        self.with(|s| s.clone())
    }
}

/// Probes the Redis nodes every [`PROBE_INTERVAL`] until `stop`, keeping `cell` and
/// `ready` up to date.
pub(crate) async fn watch_redis(
    redlock: Redlock,
    cell: std::sync::Arc<HealthCell>,
    ready: watch::Sender<bool>,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let statuses = redlock.node_status().await;
        let voting = statuses.iter().filter(|s| s.votes()).count();
        if voting >= redlock.quorum() {
            cell.succeed();
            ready.send_if_modified(|r| !std::mem::replace(r, true));
        } else {
            let reasons: Vec<String> = statuses
                .iter()
                .filter(|s| !s.votes())
                .map(|s| match (&s.reachable, s.quarantined) {
                    (Err(err), _) => format!("{}: {err}", s.node),
                    (Ok(()), Some(left)) => {
                        format!("{}: in restart quarantine for {left:.1?} more", s.node)
                    }
                    (Ok(()), None) => format!("{}: not voting", s.node),
                })
                .collect();
            cell.fail(&format!(
                "{voting} of {} Redis nodes can vote, {} needed ({})",
                statuses.len(),
                redlock.quorum(),
                reasons.join("; ")
            ));
            ready.send_if_modified(|r| std::mem::replace(r, false));
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PROBE_INTERVAL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_of_state_are_tracked() {
        let cell = HealthCell::new("history", true);
        cell.fail(&"disk full");
        let failing = cell.snapshot();
        assert!(!failing.ok);
        cell.fail(&"still full");
        let again = cell.snapshot();
        assert_eq!(
            again.since, failing.since,
            "a repeated failure is not a change"
        );
        assert_eq!(again.last_error.as_deref(), Some("still full"));
        cell.succeed();
        assert!(cell.is_ok());
    }
}
