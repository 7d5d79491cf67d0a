//! [`IdempotentBody`]: the response body of an [`IdempotencyService`](super::IdempotencyService).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use redlock_core::BoxError;

/// The response body of an [`IdempotencyService`](super::IdempotencyService): a body in
/// one piece (a replay, a stored response, a refusal), or the bytes already read (none
/// for a response not read) followed by the rest of the inner body: no byte is lost.
pub struct IdempotentBody<B> {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    rest: Option<Pin<Box<B>>>,
}

impl<B> IdempotentBody<B> {
    /// A body in one piece.
    pub fn full(data: Bytes) -> Self {
        Self::full_with_trailers(data, None)
    }

    /// A body in one piece, then `trailers` (the inner body's, when it had some).
    pub(crate) fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self::from_parts(data, trailers, None)
    }

    /// The inner service's body, unchanged.
    pub fn new(body: B) -> Self {
        Self::with_prefix(Bytes::new(), body)
    }

    /// `prefix` (bytes already read from `body`), then the rest of `body`.
    pub fn with_prefix(prefix: Bytes, body: B) -> Self {
        Self::with_pinned_prefix(prefix, Box::pin(body))
    }

    /// [`with_prefix`](Self::with_prefix) with a body already pinned.
    pub(crate) fn with_pinned_prefix(prefix: Bytes, body: Pin<Box<B>>) -> Self {
        Self::from_parts(prefix, None, Some(body))
    }

    fn from_parts(data: Bytes, trailers: Option<HeaderMap>, rest: Option<Pin<Box<B>>>) -> Self {
        let data = (!data.is_empty()).then_some(data);
        Self {
            data,
            trailers,
            rest,
        }
    }
}

impl<B> fmt::Debug for IdempotentBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentBody").finish_non_exhaustive()
    }
}

impl<B> Body for IdempotentBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match this.rest.as_mut() {
            Some(rest) => rest.as_mut().poll_frame(cx).map_err(Into::into),
            None => Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        let rest_ended = self.rest.as_ref().is_none_or(|rest| rest.is_end_stream());
        self.data.is_none() && self.trailers.is_none() && rest_ended
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.data.as_ref().map_or(0, |d| d.len() as u64);
        let mut hint = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), |r| r.size_hint());
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint.set_lower(hint.lower().saturating_add(read));
        hint
    }
}
