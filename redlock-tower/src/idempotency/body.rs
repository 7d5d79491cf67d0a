//! [`IdempotentBody`]: the response body of an [`IdempotencyService`](super::IdempotencyService).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use redlock_core::BoxError;

pin_project! {
    /// The response body of an [`IdempotencyService`](super::IdempotencyService): the
    /// inner service's body as it is (a request without a key, a response not stored),
    /// a body in one piece (a replay, a stored first response, a refusal), or the bytes
    /// already read followed by the rest of the inner body (a response too large to
    /// store: no byte is lost).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use redlock_tower::idempotency::IdempotentBody;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let body = IdempotentBody::with_prefix(Bytes::from("hello, "), Full::new(Bytes::from("world")));
    /// assert_eq!(body.collect().await.unwrap().to_bytes(), "hello, world");
    /// # }
    /// ```
    pub struct IdempotentBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full {
            data: Option<Bytes>,
            trailers: Option<HeaderMap>,
        },
        Inner {
            #[pin]
            body: B,
        },
        // Boxed: the inner body was pinned while its first frames were read.
        Prefix {
            prefix: Option<Bytes>,
            body: Pin<Box<B>>,
        },
    }
}

impl<B> IdempotentBody<B> {
    /// A body in one piece.
    pub fn full(data: Bytes) -> Self {
        Self::full_with_trailers(data, None)
    }

    /// A body in one piece, then `trailers` (the inner body's, when it had some).
    pub(crate) fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    /// The inner service's body, unchanged.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// `prefix` (bytes already read from `body`), then the rest of `body`.
    pub fn with_prefix(prefix: Bytes, body: B) -> Self {
        Self::with_pinned_prefix(prefix, Box::pin(body))
    }

    /// [`with_prefix`](Self::with_prefix) with a body already pinned.
    pub(crate) fn with_pinned_prefix(prefix: Bytes, body: Pin<Box<B>>) -> Self {
        Self {
            kind: Kind::Prefix {
                prefix: (!prefix.is_empty()).then_some(prefix),
                body,
            },
        }
    }
}

impl<B> fmt::Debug for IdempotentBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, len) = match &self.kind {
            Kind::Full { data, .. } => ("full", data.as_ref().map_or(0, Bytes::len)),
            Kind::Inner { .. } => ("inner", 0),
            Kind::Prefix { prefix, .. } => ("prefix", prefix.as_ref().map_or(0, Bytes::len)),
        };
        f.debug_struct("IdempotentBody")
            .field("kind", &kind)
            .field("buffered", &len)
            .finish()
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
        match self.project().kind.project() {
            KindProj::Full { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Prefix { prefix, body } => {
                if let Some(prefix) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
                }
                body.as_mut().poll_frame(cx).map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Prefix { prefix, body } => prefix.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Prefix { prefix, body } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower().saturating_add(extra));
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper.saturating_add(extra));
                }
                hint
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Empty, Full};

    use super::*;

    #[tokio::test]
    async fn full_prefix_and_inner_bodies() {
        let full: IdempotentBody<Empty<Bytes>> = IdempotentBody::full(Bytes::from("abc"));
        assert_eq!(full.size_hint().exact(), Some(3));
        assert!(!full.is_end_stream());
        assert_eq!(
            full.collect().await.ok().map(|c| c.to_bytes()),
            Some(Bytes::from("abc"))
        );

        let empty: IdempotentBody<Empty<Bytes>> = IdempotentBody::full(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));

        let prefixed = IdempotentBody::with_prefix(Bytes::from("ab"), Full::new(Bytes::from("cd")));
        assert_eq!(prefixed.size_hint().exact(), Some(4));
        assert!(!prefixed.is_end_stream());
        assert_eq!(
            prefixed.collect().await.ok().map(|c| c.to_bytes()),
            Some(Bytes::from("abcd"))
        );

        let inner = IdempotentBody::new(Full::new(Bytes::from("xyz")));
        assert_eq!(inner.size_hint().exact(), Some(3));
        assert_eq!(
            inner.collect().await.ok().map(|c| c.to_bytes()),
            Some(Bytes::from("xyz"))
        );

        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("1"));
        let with_trailers: IdempotentBody<Empty<Bytes>> =
            IdempotentBody::full_with_trailers(Bytes::from("a"), Some(trailers));
        let collected = with_trailers.collect().await.ok();
        assert_eq!(
            collected
                .as_ref()
                .and_then(|c| c.trailers())
                .and_then(|t| t.get("x-checksum"))
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
    }
}
