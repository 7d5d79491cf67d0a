//! [`LockGuard`]: a held lock, and [`LockBody`]: a response body that keeps it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use actix_web::body::{BodySize, MessageBody};
use actix_web::web::Bytes;
use redlock_core::{Lock, LockHandle, Released};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::error::DistributedLockError;

/// The cluster-wide lock a request holds, auto-extended by the client's watchdog while
/// it lives, and released when it is dropped (in the background) or by
/// [`release`](Self::release).
///
/// Check [`is_held`](Self::is_held) before a protected write, or stop the work when
/// [`lost`](Self::lost) completes / the [`cancellation_token`](Self::cancellation_token)
/// is cancelled: a lock can be lost (a majority of nodes unreachable for longer than the
/// TTL allows), and then another replica may take it.
pub struct LockGuard {
    /// `Some` until released or dropped.
    lock: Option<Lock>,
    handle: LockHandle,
    acquired: Instant,
    /// Where the client's calls run (see `DistributedLockConfig::runtime`).
    runtime: Handle,
}

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
        Self {
            handle: lock.handle(),
            acquired: lock.acquired_at(),
            lock: Some(lock),
            runtime,
        }
    }

    /// The locked resource: the configuration's prefix followed by the key.
    pub fn resource(&self) -> &str {
        self.handle.resource()
    }

    /// Whether the lock is still ours: valid, and not declared lost by the watchdog.
    pub fn is_held(&self) -> bool {
        self.handle.is_held()
    }

    /// The validity left (the watchdog moves it forward); zero once it ran out.
    pub fn validity(&self) -> Duration {
        self.handle.validity()
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.acquired.elapsed()
    }

    /// The fencing token, if the lock was taken with fencing on
    /// ([`LockOptions::fencing`](crate::LockOptions::fencing)(crate::LockOptions::fencing)): pass it
    /// with every write to the protected resource, which refuses older tokens.
    pub fn fencing_token(&self) -> Option<u64> {
        self.handle.fencing_token()
    }

    /// Completes when the lock is lost (declared lost by the watchdog, or its validity
    /// ran out).
    pub async fn lost(&self) {
        self.handle.lost().await;
    }

    /// A token cancelled when the lock is lost; hand it to the protected work.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.handle.cancellation_token()
    }

    /// A cheap, cloneable, `Send` view of the lock (resource, token, validity, loss) for
    /// work spawned elsewhere. It does not keep the lock.
    pub fn handle(&self) -> LockHandle {
        self.handle.clone()
    }

    /// Keeps this guard (and so the lock) until `body` has been sent: see
    /// [`LockBody`].
    pub fn hold_during<B: MessageBody>(self, body: B) -> LockBody<B> {
        LockBody::new(body, self)
    }

    /// Releases the lock now, and says whether it was still held by a majority.
    ///
    /// # Errors
    ///
    /// [`DistributedLockError::Unavailable`] if too few nodes answered (the lock then
    /// ends at its TTL); [`DistributedLockError::Background`] if the release task could
    /// not run.
    pub async fn release(mut self) -> Result<Released, DistributedLockError> {
        let Some(lock) = self.lock.take() else {
            return Err(DistributedLockError::Background(
                "the lock was already released".into(),
            ));
        };
        let resource = self.resource().to_owned();
        let held_ms = self.held_for().as_millis() as u64;
        let lost = !self.handle.is_held();
        let released = self
            .runtime
            .spawn(async move { lock.release().await })
            .await
            .map_err(|err| DistributedLockError::Background(err.to_string()))?;
        match released {
            Ok(released) => {
                if lost || !released.was_held() {
                    tracing::warn!(key = %resource, held_ms, "lock released after it was lost: another holder may have overlapped");
                } else {
                    tracing::debug!(key = %resource, held_ms, "lock released");
                }
                Ok(released)
            }
            Err(err) => {
                tracing::warn!(key = %resource, held_ms, error = %err, "lock release failed: it ends at its TTL");
                Err(err.into())
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        let resource = self.resource().to_owned();
        let held_ms = self.held_for().as_millis() as u64;
        if !self.handle.is_held() {
            tracing::warn!(key = %resource, held_ms, "the lock was lost before the request finished");
        }
        // On the background runtime: the release must not depend on this worker's.
        self.runtime.spawn(async move {
            match lock.release().await {
                Ok(released) => {
                    tracing::debug!(key = %resource, held_ms, was_held = released.was_held(), "lock released");
                }
                Err(err) => {
                    tracing::warn!(key = %resource, held_ms, error = %err, "lock release failed: it ends at its TTL");
                }
            }
        });
    }
}

pub use redlock_http::LockLost;

pin_project_lite::pin_project! {
    /// A response body that holds a [`LockGuard`] until it has been produced: the lock is
    /// released when the body ends (its last chunk or an error) or is dropped (the
    /// client went away). The same as `redlock_tower::LockBody`.
    ///
    /// Made by [`LockGuard::hold_during`]; [`LockMiddleware`](crate::LockMiddleware) wraps
    /// every response body of a locked request in one.
    ///
    /// ```
    /// use actix_web::{HttpResponse, web};
    /// use futures_util::stream;
    /// use redlock_actix::DistributedLock;
    ///
    /// async fn export(lock: DistributedLock<web::Path<u64>>) -> HttpResponse {
    ///     let (account, guard) = lock.into_parts();
    ///     let rows = stream::iter((0..3).map(move |i| {
    ///         Ok::<_, std::convert::Infallible>(web::Bytes::from(format!("{account},{i}\n")))
    ///     }));
    ///     // The lock is held until the last row has been sent.
    ///     HttpResponse::Ok().body(guard.hold_during(actix_web::body::BodyStream::new(rows)))
    /// }
    /// ```
    pub struct LockBody<B> {
        #[pin]
        inner: HoldingBody<B, LockGuard>,
    }
}

impl<B> std::fmt::Debug for LockBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockBody")
            .field("guard", &self.inner.held)
            .finish_non_exhaustive()
    }
}

impl<B> LockBody<B> {
    /// `body`, holding `guard` until it ends.
    pub fn new(body: B, guard: LockGuard) -> Self {
        Self::held(body, Some(guard), false)
    }

    /// `body` as it is, holding no lock.
    pub fn unlocked(body: B) -> Self {
        Self::held(body, None, false)
    }

    /// `body`, holding `guard` (if any) until it ends; cut off when the lock is lost if
    /// `abort_on_loss`.
    pub(crate) fn held(body: B, guard: Option<LockGuard>, abort_on_loss: bool) -> Self {
        Self {
            inner: HoldingBody::new(body, guard, abort_on_loss),
        }
    }

    /// The body of a locked request, as the middleware's engine wrapped it.
    pub(crate) fn holding(inner: HoldingBody<B, LockGuard>) -> Self {
        Self { inner }
    }

    /// Whether this body still holds the request's lock (it is released when the body
    /// ends or is dropped).
    pub fn holds_lock(&self) -> bool {
        self.inner.held.is_some()
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

/// What a [`HoldingBody`] keeps until its body ends: a [`LockGuard`], or a concurrency
/// permit. Dropping it releases what it holds.
pub(crate) trait BodyHold {
    /// The held resource's name.
    fn resource(&self) -> &str;

    /// A token cancelled when what it holds is lost.
    fn cancellation_token(&self) -> CancellationToken;

    /// Logs that the loss of `resource` (already dropped) cut a body off, and gives the
    /// error the body ends with.
    fn cut_off(resource: String) -> Box<dyn std::error::Error>;
}

impl BodyHold for LockGuard {
    fn resource(&self) -> &str {
        self.handle.resource()
    }

    fn cancellation_token(&self) -> CancellationToken {
        self.handle.cancellation_token()
    }

    fn cut_off(key: String) -> Box<dyn std::error::Error> {
        tracing::warn!(key = %key, "lock lost while the response body was sent: body cut off");
        Box::new(LockLost::new(key))
    }
}

type LostFuture = Pin<Box<dyn Future<Output = ()>>>;

pin_project_lite::pin_project! {
    /// A response body holding `H` (if any) until it ends (its last chunk or an error) or
    /// is dropped; cut off with [`BodyHold::cut_off`]'s error when what it holds is lost,
    /// with abort on loss. Inside [`LockBody`], and the concurrency limit's body.
    pub(crate) struct HoldingBody<B, H> {
        #[pin]
        body: B,
        held: Option<H>,
        // With abort on loss: completes when the lock is lost.
        lost: Option<LostFuture>,
        aborted: bool,
    }
}

impl<B, H: BodyHold> HoldingBody<B, H> {
    /// `body`, holding `held` (if any) until it ends; cut off when it is lost if
    /// `abort_on_loss`.
    pub(crate) fn new(body: B, held: Option<H>, abort_on_loss: bool) -> Self {
        let lost = held
            .as_ref()
            .filter(|_| abort_on_loss)
            .map(|held| -> LostFuture { Box::pin(held.cancellation_token().cancelled_owned()) });
        Self {
            body,
            held,
            lost,
            aborted: false,
        }
    }
}

impl<B: MessageBody, H: BodyHold> MessageBody for HoldingBody<B, H> {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        if *this.aborted {
            return Poll::Ready(None);
        }
        if let Some(lost) = this.lost.as_mut()
            && lost.as_mut().poll(cx).is_ready()
        {
            *this.lost = None;
            *this.aborted = true;
            // Dropped (released) first, then the loss logged by `cut_off`.
            let resource = this
                .held
                .take()
                .map(|held| held.resource().to_owned())
                .unwrap_or_default();
            return Poll::Ready(Some(Err(H::cut_off(resource))));
        }
        let next = this.body.poll_next(cx);
        if matches!(next, Poll::Ready(None | Some(Err(_)))) {
            // The body is complete (or failed): release now rather than when the
            // response is dropped.
            drop(this.held.take());
            *this.lost = None;
        }
        next.map(|chunk| chunk.map(|result| result.map_err(Into::into)))
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Waker;

    use super::*;

    /// A holder whose loss the test decides, and which says when it was released.
    struct Held {
        token: CancellationToken,
        released: Arc<AtomicBool>,
    }

    impl Drop for Held {
        fn drop(&mut self) {
            self.released.store(true, Ordering::SeqCst);
        }
    }

    impl BodyHold for Held {
        fn resource(&self) -> &str {
            "res"
        }

        fn cancellation_token(&self) -> CancellationToken {
            self.token.clone()
        }

        fn cut_off(key: String) -> Box<dyn std::error::Error> {
            Box::new(LockLost::new(key))
        }
    }

    fn held() -> (Held, CancellationToken, Arc<AtomicBool>) {
        let token = CancellationToken::new();
        let released = Arc::new(AtomicBool::new(false));
        let held = Held {
            token: token.clone(),
            released: Arc::clone(&released),
        };
        (held, token, released)
    }

    #[test]
    fn releases_when_the_body_completes() {
        let (held, _token, released) = held();
        let mut body = pin!(HoldingBody::new(Bytes::from_static(b"x"), Some(held), true));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(
            body.as_mut().poll_next(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(!released.load(Ordering::SeqCst));
        assert!(matches!(
            body.as_mut().poll_next(&mut cx),
            Poll::Ready(None)
        ));
        assert!(released.load(Ordering::SeqCst));
        assert!(body.held.is_none());
    }

    #[test]
    fn a_loss_cuts_the_body_off_only_with_abort_on_loss() {
        let endless = || {
            actix_web::body::BodyStream::new(futures_util::stream::pending::<
                Result<Bytes, std::convert::Infallible>,
            >())
        };
        let mut cx = Context::from_waker(Waker::noop());

        let (kept, token, released) = held();
        let mut body = pin!(HoldingBody::new(endless(), Some(kept), false));
        token.cancel();
        assert!(body.as_mut().poll_next(&mut cx).is_pending());
        assert!(!released.load(Ordering::SeqCst));

        let (cut, token, released) = held();
        let mut body = pin!(HoldingBody::new(endless(), Some(cut), true));
        assert!(body.as_mut().poll_next(&mut cx).is_pending());
        token.cancel();
        let Poll::Ready(Some(Err(err))) = body.as_mut().poll_next(&mut cx) else {
            panic!("the loss did not end the body with an error");
        };
        assert!(err.to_string().contains("`res`"), "{err}");
        assert!(released.load(Ordering::SeqCst));
        assert!(matches!(
            body.as_mut().poll_next(&mut cx),
            Poll::Ready(None)
        ));
    }
}
