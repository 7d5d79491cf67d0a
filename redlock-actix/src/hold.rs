//! What a request holds until its response has been sent: [`Kept`], a lock or a permit
//! released on the background runtime, and [`HoldingBody`], a response body keeping it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use actix_web::body::{BodySize, MessageBody};
use actix_web::web::Bytes;
use redlock_core::semaphore::Permit;
use redlock_core::{Lock, LockHandle, Released};
use redlock_http::LockLost;
use redlock_http::body::{Holding, Step};
use tokio::runtime::Handle;

/// A lock or a permit a request holds, released on the background runtime when dropped
/// (never on the worker's, whose tasks may die with it).
pub struct Kept<T: Release> {
    held: Option<T>,
    pub(crate) handle: LockHandle,
    pub(crate) acquired: Instant,
    runtime: Handle,
}

/// A lock or a permit, for [`Kept`].
pub trait Release: Send + 'static {
    /// What it is, for the log.
    const WHAT: &'static str;

    /// Gives it back.
    fn release(self) -> impl Future<Output = Result<Released, redlock_core::Error>> + Send;
}

impl Release for Lock {
    const WHAT: &'static str = "lock";

    fn release(self) -> impl Future<Output = Result<Released, redlock_core::Error>> + Send {
        Lock::release(self)
    }
}

impl Release for Permit {
    const WHAT: &'static str = "concurrency permit";

    fn release(self) -> impl Future<Output = Result<Released, redlock_core::Error>> + Send {
        Permit::release(self)
    }
}

impl<T: Release> Kept<T> {
    pub(crate) fn new(held: T, handle: LockHandle, acquired: Instant, runtime: Handle) -> Self {
        Self {
            held: Some(held),
            handle,
            acquired,
            runtime,
        }
    }

    pub(crate) fn held_ms(&self) -> u64 {
        self.acquired.elapsed().as_millis() as u64
    }

    /// Releases it now, on the background runtime: the client's answer, or why the task
    /// did not run.
    pub(crate) async fn release(
        &mut self,
    ) -> Result<Result<Released, redlock_core::Error>, String> {
        let Some(held) = self.held.take() else {
            return Err(format!("the {} was already released", T::WHAT));
        };
        self.runtime
            .spawn(held.release())
            .await
            .map_err(|err| err.to_string())
    }
}

impl<T: Release> Drop for Kept<T> {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let (key, held_ms, what) = (self.handle.resource().to_owned(), self.held_ms(), T::WHAT);
        if !self.handle.is_held() {
            tracing::warn!(%key, held_ms, "{what} lost before the request finished: another request may have overlapped");
        }
        self.runtime.spawn(async move {
            match held.release().await {
                Ok(released) => {
                    tracing::debug!(%key, held_ms, was_held = released.was_held(), "{what} released");
                }
                Err(err) => {
                    tracing::warn!(%key, held_ms, error = %err, "{what} release failed: it ends at its TTL");
                }
            }
        });
    }
}

/// What a [`HoldingBody`] keeps until its body ends: a
/// [`LockGuard`](crate::guard::LockGuard), or a permit. Dropping it releases what it
/// holds.
pub trait BodyHold {
    /// What it is, for the log.
    const WHAT: &'static str;

    /// Its lock's handle (a permit's: its slot lock's).
    fn handle(&self) -> &LockHandle;
}

impl<T: Release> BodyHold for Kept<T> {
    const WHAT: &'static str = T::WHAT;

    fn handle(&self) -> &LockHandle {
        &self.handle
    }
}

pin_project_lite::pin_project! {
    /// A response body holding `H` (if any) until it ends or is dropped, by the engine's
    /// [`Holding`]: inside [`LockBody`](crate::guard::LockBody), and the concurrency
    /// limit's body.
    pub struct HoldingBody<B, H> {
        #[pin]
        body: B,
        pub(crate) hold: Holding<H>,
    }
}

impl<B, H: BodyHold> HoldingBody<B, H> {
    /// `body`, holding `held` (if any) until it ends; cut off at its loss if
    /// `abort_on_loss`.
    pub(crate) fn new(body: B, held: Option<H>, abort_on_loss: bool) -> Self {
        let lost = held
            .as_ref()
            .filter(|_| abort_on_loss)
            .map(|held| held.handle().cancellation_token().cancelled_owned());
        Self {
            body,
            hold: Holding::new(held, lost),
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
        match this.hold.step(cx) {
            Step::Ended => return Poll::Ready(None),
            // Released first, then the loss logged.
            Step::Lost(held) => {
                let key = held.handle().resource().to_owned();
                drop(held);
                tracing::warn!(%key, "{} lost while the response body was sent: body cut off", H::WHAT);
                return Poll::Ready(Some(Err(Box::new(LockLost::new(key)))));
            }
            _ => {}
        }
        let next = this.body.poll_next(cx);
        this.hold.release_at_end(&next);
        next.map(|chunk| chunk.map(|result| result.map_err(Into::into)))
    }
}
