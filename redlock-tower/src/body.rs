//! [`LockBody`]: the response body of a lock's or a limit's service, and [`LockLost`],
//! the error it ends with when its lock is lost under `abort_on_loss`.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use redlock_core::BoxError;
pub use redlock_http::LockLost;

use crate::guard::Guard;

pin_project! {
    /// The response body of a [`LockService`](crate::lock::LockService) (or a limit's):
    /// the inner service's body, holding the request's lock (by default) until its last
    /// frame is out or it is dropped, or a refusal's body in one frame.
    pub struct LockBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            guard: Option<Guard>,
            aborted: bool,
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> fmt::Debug for LockBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { guard, .. } => f
                .debug_struct("LockBody")
                .field("guard", guard)
                .finish_non_exhaustive(),
            Kind::Full { data } => f
                .debug_struct("LockBody")
                .field("rejection", &data.as_ref().map(Bytes::len))
                .finish(),
        }
    }
}

impl<B> LockBody<B> {
    /// `body` as it is, holding no lock.
    pub fn unlocked(body: B) -> Self {
        Self::inner(body, None)
    }

    pub(crate) fn inner(body: B, guard: Option<Guard>) -> Self {
        Self {
            kind: Kind::Inner {
                body,
                guard,
                aborted: false,
            },
        }
    }

    /// A complete body in one piece (a rejection's).
    pub fn full(data: impl Into<Bytes>) -> Self {
        Self {
            kind: Kind::Full {
                data: Some(data.into()),
            },
        }
    }

    /// Whether this body still holds the request's lock (it is released when the body
    /// ends or is dropped).
    pub fn holds_lock(&self) -> bool {
        matches!(&self.kind, Kind::Inner { guard: Some(_), .. })
    }

    /// Whether this is a rejection's body, made by the layer.
    pub fn is_rejection(&self) -> bool {
        matches!(&self.kind, Kind::Full { .. })
    }
}

impl<B> Body for LockBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => {
                let frame = data
                    .take()
                    .filter(|d| !d.is_empty())
                    .map(|d| Ok(Frame::data(d.into())));
                Poll::Ready(frame)
            }
            KindProj::Inner {
                mut body,
                guard,
                aborted,
            } => {
                if *aborted {
                    return Poll::Ready(None);
                }
                if let Some(held) = guard.as_mut()
                    && held.poll_lost(cx, "response body").is_ready()
                    && held.abort_on_loss()
                {
                    let key = held.key().to_owned();
                    *guard = None;
                    *aborted = true;
                    return Poll::Ready(Some(Err(Box::new(LockLost::new(key)))));
                }
                let frame = match body.as_mut().poll_frame(cx) {
                    Poll::Ready(frame) => frame,
                    Poll::Pending => return Poll::Pending,
                };
                // The last frame is out (or the body failed): release now rather than
                // when the server gets round to dropping the body.
                let ended = match &frame {
                    None | Some(Err(_)) => true,
                    Some(Ok(_)) => body.is_end_stream(),
                };
                if ended {
                    *guard = None;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, aborted, .. } => *aborted || body.is_end_stream(),
            Kind::Full { data } => data.as_ref().is_none_or(Bytes::is_empty),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
