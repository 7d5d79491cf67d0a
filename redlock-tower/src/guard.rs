//! [`Guard`]: a held lock (or a semaphore permit) while a request (and its response
//! body) is served.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use redlock_core::semaphore::Permit;
use redlock_core::{Error, Lock, Released};

/// What a request holds: the lock of a [`LockLayer`](crate::LockLayer), or the permit
/// of a [`ClusterLimitLayer`](crate::ClusterLimitLayer) (a held slot lock).
#[derive(Debug)]
pub(crate) enum Held {
    Lock(Lock),
    Permit(Permit),
}

impl Held {
    /// The held lock (a permit's: its slot lock).
    pub(crate) fn lock(&self) -> &Lock {
        match self {
            Self::Lock(lock) => lock,
            Self::Permit(permit) => permit.lock(),
        }
    }

    async fn release(self) -> Result<Released, Error> {
        match self {
            Self::Lock(lock) => lock.release().await,
            Self::Permit(permit) => permit.release().await,
        }
    }
}

/// Owns the lock of one request: watches for its loss, and releases it when dropped
/// (in the background, on the current runtime: `Drop` never blocks).
pub(crate) struct Guard {
    lock: Option<Held>,
    acquired: Instant,
    /// Completes when the watchdog declares the lock lost.
    lost: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    lost_seen: bool,
    abort_on_loss: bool,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.key())
            .field("lost", &self.lost_seen)
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// Takes over `lock`, which the watchdog keeps alive (`auto_extend` was called).
    pub(crate) fn new(lock: Held, acquired: Instant, abort_on_loss: bool) -> Self {
        let token = lock.lock().cancellation_token();
        Self {
            lock: Some(lock),
            acquired,
            lost: Some(Box::pin(token.cancelled_owned())),
            lost_seen: false,
            abort_on_loss,
        }
    }

    /// Whether the request is to be cut off when the lock is lost.
    pub(crate) fn abort_on_loss(&self) -> bool {
        self.abort_on_loss
    }

    pub(crate) fn key(&self) -> &str {
        self.lock.as_ref().map_or("", |held| held.lock().resource())
    }

    /// `Ready` once the lock is lost (and from then on); logs the loss once. Registers
    /// the task to be woken when it happens.
    pub(crate) fn poll_lost(&mut self, cx: &mut Context<'_>, during: &'static str) -> Poll<()> {
        if self.lost_seen {
            return Poll::Ready(());
        }
        let Some(lost) = self.lost.as_mut() else {
            return Poll::Pending;
        };
        if lost.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.lost = None;
        self.lost_seen = true;
        tracing::warn!(
            key = %self.key(),
            held_ms = self.acquired.elapsed().as_millis() as u64,
            during,
            abort = self.abort_on_loss,
            "lock lost while serving the request: another request for this key may run now"
        );
        Poll::Ready(())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        let held_ms = self.acquired.elapsed().as_millis() as u64;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Dropping it lets redlock-core say that it will expire at its TTL.
            drop(lock);
            return;
        };
        runtime.spawn(async move {
            let key = lock.lock().resource().to_owned();
            match lock.release().await {
                Ok(released) => tracing::debug!(
                    key = %key,
                    held_ms,
                    was_held = released.was_held(),
                    "lock released"
                ),
                Err(err) => tracing::warn!(
                    key = %key,
                    held_ms,
                    error = %err,
                    "lock release failed: it ends at its TTL"
                ),
            }
        });
    }
}
