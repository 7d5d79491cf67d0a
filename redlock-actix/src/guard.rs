//! [`LockGuard`]: a held lock, and [`LockBody`]: a response body that keeps it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, MessageBody};
use actix_web::web::Bytes;
use redlock_core::{Lock, LockHandle, Released};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::error::DistributedLockError;
use crate::hold::{BodyHold, HoldingBody, Kept};

/// The cluster-wide lock a request holds: auto-extended while it lives, released when
/// dropped (in the background) or by [`release`](Self::release). It can be lost: check
/// [`is_held`](Self::is_held) or [`lost`](Self::lost) before a protected write.
pub struct LockGuard(Kept<Lock>);

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("resource", &self.resource())
            .field("held", &self.is_held())
            .field("validity", &self.validity())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(lock: Lock, runtime: Handle) -> Self {
        let (handle, acquired) = (lock.handle(), lock.acquired_at());
        Self(Kept::new(lock, handle, acquired, runtime))
    }

    /// The locked resource: the configuration's prefix followed by the key.
    pub fn resource(&self) -> &str {
        self.0.handle.resource()
    }

    /// Whether the lock is still ours: valid, and not declared lost by the watchdog.
    pub fn is_held(&self) -> bool {
        self.0.handle.is_held()
    }

    /// The validity left (the watchdog moves it forward); zero once it ran out.
    pub fn validity(&self) -> Duration {
        self.0.handle.validity()
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.0.acquired.elapsed()
    }

    /// The fencing token, with [`LockOptions::fencing`](crate::LockOptions::fencing) on.
    pub fn fencing_token(&self) -> Option<u64> {
        self.0.handle.fencing_token()
    }

    /// Completes when the lock is lost.
    pub async fn lost(&self) {
        self.0.handle.lost().await;
    }

    /// A token cancelled when the lock is lost; hand it to the protected work.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.0.handle.cancellation_token()
    }

    /// A cloneable, `Send` view of the lock (it does not keep it).
    pub fn handle(&self) -> LockHandle {
        self.0.handle.clone()
    }

    /// Keeps this guard (and so the lock) until `body` has been sent ([`LockBody`]).
    pub fn hold_during<B: MessageBody>(self, body: B) -> LockBody<B> {
        LockBody::new(body, self)
    }

    /// Releases the lock now, and says whether it was still held by a majority.
    ///
    /// # Errors
    ///
    /// [`DistributedLockError::Unavailable`] if too few nodes answered,
    /// [`DistributedLockError::Background`] if the release task could not run.
    pub async fn release(mut self) -> Result<Released, DistributedLockError> {
        let (key, held_ms, lost) = (
            self.resource().to_owned(),
            self.0.held_ms(),
            !self.is_held(),
        );
        match self
            .0
            .release()
            .await
            .map_err(DistributedLockError::Background)?
        {
            Ok(released) => {
                if lost || !released.was_held() {
                    tracing::warn!(%key, held_ms, "lock released after it was lost: another holder may have overlapped");
                } else {
                    tracing::debug!(%key, held_ms, "lock released");
                }
                Ok(released)
            }
            Err(err) => {
                tracing::warn!(%key, held_ms, error = %err, "lock release failed: it ends at its TTL");
                Err(err.into())
            }
        }
    }
}

pub use redlock_http::LockLost;

pin_project_lite::pin_project! {
    /// A response body holding a [`LockGuard`] until it ends or is dropped (as
    /// `redlock_tower::LockBody`): made by [`LockGuard::hold_during`] and
    /// [`LockMiddleware`](crate::LockMiddleware).
    pub struct LockBody<B> {
        #[pin]
        inner: HoldingBody<B, LockGuard>,
    }
}

impl<B> std::fmt::Debug for LockBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockBody")
            .field("guard", &self.inner.hold.held())
            .finish_non_exhaustive()
    }
}

impl<B> LockBody<B> {
    /// `body`, holding `guard` until it ends.
    pub fn new(body: B, guard: LockGuard) -> Self {
        Self::holding(HoldingBody::new(body, Some(guard), false))
    }

    /// `body` as it is, holding no lock.
    pub fn unlocked(body: B) -> Self {
        Self::holding(HoldingBody::new(body, None, false))
    }

    pub(crate) fn holding(inner: HoldingBody<B, LockGuard>) -> Self {
        Self { inner }
    }

    /// Whether this body still holds the request's lock.
    pub fn holds_lock(&self) -> bool {
        self.inner.hold.held().is_some()
    }
}

impl<B: MessageBody> MessageBody for LockBody<B> {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.inner.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        self.project().inner.poll_next(cx)
    }
}

impl BodyHold for LockGuard {
    const WHAT: &'static str = "lock";

    fn handle(&self) -> &LockHandle {
        &self.0.handle
    }
}
