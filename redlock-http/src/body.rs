//! [`Holding`]: what a guarded response body keeps until it ends, the part of both web
//! crates' bodies that is not their framework's body trait.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type Lost = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a guarded response body keeps: the request's lock or permit `H` (released by
/// dropping it) until the body ends, fails or is dropped, and, with abort on loss, the
/// watch on its loss, which cuts the body off.
///
/// A body calls [`step`](Self::step) before polling its inner body, and
/// [`release`](Self::release) once that has ended (its last chunk, or an error).
pub struct Holding<H> {
    held: Option<H>,
    lost: Option<Lost>,
    aborted: bool,
}

/// What a body does next, by [`Holding::step`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Step<H> {
    /// Poll the inner body.
    Poll,
    /// The body was cut off: it ends here.
    Ended,
    /// What it held was lost just now: it is handed back, to be dropped (released)
    /// before the body ends with an error ([`LockLost`](crate::LockLost)).
    Lost(H),
}

impl<H> Holding<H> {
    /// Holds `held` (if any); with `lost` (completes when it is lost), cuts the body off
    /// at its loss.
    pub fn new(held: Option<H>, lost: Option<impl Future<Output = ()> + Send + 'static>) -> Self {
        Self {
            lost: held
                .as_ref()
                .and(lost)
                .map(|lost| -> Lost { Box::pin(lost) }),
            held,
            aborted: false,
        }
    }

    /// What it holds, until the body ends.
    pub fn held(&self) -> Option<&H> {
        self.held.as_ref()
    }

    /// Before the inner body is polled: whether it was lost (registering `cx` to be
    /// woken at the loss).
    pub fn step(&mut self, cx: &mut Context<'_>) -> Step<H> {
        if self.aborted {
            return Step::Ended;
        }
        if let Some(lost) = self.lost.as_mut()
            && lost.as_mut().poll(cx).is_ready()
        {
            self.lost = None;
            self.aborted = true;
            if let Some(held) = self.held.take() {
                return Step::Lost(held);
            }
        }
        Step::Poll
    }

    /// The inner body ended (or failed): releases what it holds now rather than when
    /// the response is dropped.
    pub fn release(&mut self) {
        self.held = None;
        self.lost = None;
    }

    /// [`release`](Self::release) once `next`, the inner body's poll, says it ended:
    /// `None` or an error.
    pub fn release_at_end<T, E>(&mut self, next: &Poll<Option<Result<T, E>>>) {
        if matches!(next, Poll::Ready(None | Some(Err(_)))) {
            self.release();
        }
    }
}

impl<H: fmt::Debug> fmt::Debug for Holding<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holding")
            .field("held", &self.held)
            .field("abort_on_loss", &self.lost.is_some())
            .field("aborted", &self.aborted)
            .finish()
    }
}
