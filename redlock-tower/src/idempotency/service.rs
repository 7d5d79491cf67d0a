//! [`IdempotencyLayer`], [`IdempotencyService`], [`ResponseFuture`]: tower's requests
//! and responses to and from the engine's [flow](redlock_idempotency::middleware).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, request::Parts};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use redlock_core::BoxError;
use redlock_idempotency::middleware::{Admit, Decision, RequestHead, ScopeHook};
use redlock_idempotency::{Idempotency, Refusal, Run, StoredResponse, scope_from_header};
use tower_layer::Layer;
use tower_service::Service;

use super::body::IdempotentBody;
use crate::response::problem_response;

/// Runs each request with an `Idempotency-Key` once, cluster-wide, and replays its
/// response to retries (see the [module docs](super)). Its options are the engine's
/// [`Idempotency`]; the layer adds the request's [`scope`](Self::scope).
#[derive(Clone, Debug)]
pub struct IdempotencyLayer {
    core: Idempotency,
    scope: Option<ScopeHook<Parts>>,
}

impl IdempotencyLayer {
    /// The middleware of `idempotency`: its options, its store, its lock client.
    pub fn new(core: Idempotency) -> Self {
        Self { core, scope: None }
    }

    /// The engine: its options, its store, its lock client.
    pub fn core(&self) -> &Idempotency {
        &self.core
    }

    /// Whose key a request's is (the authenticated subject from the extensions, a
    /// tenant): two scopes never share a record; `None` refuses the request (`400`).
    #[must_use]
    pub fn scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Some(ScopeHook::new(scope));
        self
    }

    /// [`scope`](Self::scope) from a request header, by the engine's
    /// [`scope_from_header`](redlock_idempotency::scope_from_header).
    #[must_use]
    pub fn scope_header(self, name: impl Into<String>) -> Self {
        let name = name.into().to_ascii_lowercase();
        self.scope(move |parts| scope_from_header(values(&parts.headers, &name)))
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        self.core.check();
        let layer = self.clone();
        IdempotencyService { inner, layer }
    }
}

/// The middleware made by [`IdempotencyLayer`], the inner service as the handler.
/// `call` takes the inner service that was polled ready and leaves a clone in its place.
#[derive(Clone, Debug)]
pub struct IdempotencyService<S> {
    inner: S,
    layer: IdempotencyLayer,
}

impl<S> IdempotencyService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<IdempotentBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = request.into_parts();
        // The target as the client sent it, under a nested router too.
        let target = crate::target::sent_target(&parts.uri, &parts.extensions);
        let headers = |name: &str| values(&parts.headers, name).collect();
        let head = RequestHead::new(parts.method.as_str(), target, headers);
        let scope = self.layer.scope.as_ref().map(|hook| || hook.scope(&parts));
        let mut reading = match self.layer.core.admit(&head, scope) {
            Admit::Read(reading) => reading,
            Admit::Refuse(refusal) => {
                return ResponseFuture::new(async move { Ok(refused(&refusal)) });
            }
            // `PassThrough`: no key, and keys are optional.
            _ => {
                let future = inner.call(Request::from_parts(parts, body));
                return ResponseFuture::new(async { Ok(future.await?.map(IdempotentBody::new)) });
            }
        };
        ResponseFuture::new(async move {
            let mut body = std::pin::pin!(body);
            while let Some(frame) = body.frame().await {
                let pushed = match frame.map(Frame::into_data) {
                    Ok(Ok(mut data)) => reading.push(&data.copy_to_bytes(data.remaining())),
                    Ok(Err(_trailers)) => Ok(()),
                    Err(error) => Err(reading.unreadable(&Into::<BoxError>::into(error))),
                };
                if let Err(refusal) = pushed {
                    return Ok(refused(&refusal));
                }
            }
            let (bytes, decision) = reading.finish();
            let run = match decision.await {
                Decision::Run(run) => run,
                Decision::Replay(stored) => return Ok(replayed(stored)),
                Decision::Refuse(refusal) => return Ok(refused(&refusal)),
                _ => return Ok(refused(&Refusal::misconfigured())),
            };
            let mut request = Request::from_parts(parts, ReqBody::from(bytes));
            if let Some(handle) = run.handle() {
                request.extensions_mut().insert(handle);
            }
            // An error of the inner service drops the run: a retry runs again.
            let response = inner.call(request).await?;
            Ok(finish(run, response).await)
        })
    }
}

type Answer<B, E> = Result<Response<IdempotentBody<B>>, E>;

/// The response future of [`IdempotencyService`]. Dropping it is safe at any point: a
/// run in progress releases its key's lock in the background, and a retry runs again.
pub struct ResponseFuture<B, E> {
    inner: Pin<Box<dyn Future<Output = Answer<B, E>> + Send>>,
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<B: Send + 'static, E: Send + 'static> ResponseFuture<B, E> {
    fn new(future: impl Future<Output = <Self as Future>::Output> + Send + 'static) -> Self {
        let inner = Box::pin(future);
        Self { inner }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Answer<B, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// Every value of header `name`.
fn values<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = &'a [u8]> + use<'a> {
    headers.get_all(name).into_iter().map(HeaderValue::as_bytes)
}

/// The refusal's problem as a response.
fn refused<B>(refusal: &Refusal) -> Response<IdempotentBody<B>> {
    problem_response(&refusal.problem).map(IdempotentBody::full)
}

/// The engine's replay as a response (a header `http` cannot take is left out).
fn replayed<B>(stored: StoredResponse) -> Response<IdempotentBody<B>> {
    let mut response = Response::new(IdempotentBody::full(stored.body));
    let status = StatusCode::from_u16(stored.status);
    *response.status_mut() = status.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = stored.headers.into_iter().filter_map(|(name, value)| {
        let value = HeaderValue::from_maybe_shared(value).ok()?;
        Some((HeaderName::try_from(name).ok()?, value))
    });
    response.headers_mut().extend(headers);
    response
}

/// The inner service's response to a run, read for the engine to store it, and
/// answered whole in every case (what was read, then the rest).
async fn finish<B>(run: Run, response: Response<B>) -> Response<IdempotentBody<B>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let headers = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()));
    let mut collect = run.respond(parts.status.as_u16(), headers, body.size_hint().exact());
    let mut body = Box::pin(body);
    let trailers = loop {
        let frame = match collect.wants() {
            true => body.frame().await,
            false => None,
        };
        match frame.map(|frame| frame.map(Frame::into_data)) {
            None => break None,
            Some(Ok(Ok(data))) => collect.push(&data),
            Some(Ok(Err(frame))) => break frame.into_trailers().ok(),
            Some(Err(error)) => return refused(&collect.failed(&Into::<BoxError>::into(error))),
        };
    };
    let whole = collect.wants();
    let (read, write) = collect.finish();
    write.await;
    let body = match whole {
        true => IdempotentBody::full_with_trailers(read, trailers),
        false => IdempotentBody::with_pinned_prefix(read, body),
    };
    Response::from_parts(parts, body)
}
