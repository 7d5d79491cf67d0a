//! [`ResponseFuture`]: one request through the
//! [`IdempotencyService`](super::IdempotencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use redlock_core::BoxError;
use redlock_http::Problem;
use redlock_idempotency::{Begin, Idempotency, REPLAYED_HEADER, Refusal, Replay, Run};
use tower_service::Service;

use super::body::IdempotentBody;
use super::layer::Scope;
use crate::response::problem_response;

type BoxFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<IdempotentBody<B>>, E>> + Send>>;

/// The response future of [`IdempotencyService`](super::IdempotencyService): reading
/// the request's body, deciding, running the inner service and storing its response.
///
/// Dropping it (the client went away) is safe at any point: a run in progress releases
/// its key's lock in the background, and its record stays in flight, so the key's next
/// request runs again.
pub struct ResponseFuture<B, E> {
    inner: BoxFuture<B, E>,
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<IdempotentBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// The future answering `request`, with `inner` already polled ready.
pub(crate) fn respond<S, ReqBody, ResBody>(
    mut inner: S,
    core: Idempotency,
    scope: Option<Scope>,
    request: Request<ReqBody>,
) -> ResponseFuture<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let request_id =
        redlock_http::problem::request_id(|name| request.headers().get(name)?.to_str().ok());
    let values = request.headers().get_all(core.header_name());
    let key = match core.key(values.iter().map(HeaderValue::as_bytes)) {
        Ok(Some(key)) => key,
        Ok(None) => {
            // Optional and absent: the request goes through, unprotected.
            let future = inner.call(request);
            return ResponseFuture {
                inner: Box::pin(async move { future.await.map(|r| r.map(IdempotentBody::new)) }),
            };
        }
        Err(refusal) => return refused(refusal.problem, request_id),
    };
    let (parts, body) = request.into_parts();
    let scope = match &scope {
        Some(scope) => match scope(&parts) {
            Some(scope) => Some(scope),
            None => return refused(core.no_scope().problem, request_id),
        },
        None => None,
    };

    ResponseFuture {
        inner: Box::pin(async move {
            let limit = core.request_body_limit();
            let bytes = match Limited::new(body, limit).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
                    return Ok(problem(core.body_too_large().problem, request_id));
                }
                Err(error) => {
                    tracing::debug!(request_id = request_id.as_deref(), %error, "request body unreadable: idempotent request refused");
                    return Ok(problem(Refusal::unreadable_body().problem, request_id));
                }
            };
            // The target as the client sent it, under a nested router too: the same
            // request fingerprints alike in both web crates.
            let target = crate::target::sent_target(&parts.uri, &parts.extensions);
            let fingerprint = core.fingerprint(
                parts.method.as_str(),
                target,
                |name| {
                    parts
                        .headers
                        .get_all(name)
                        .iter()
                        .map(HeaderValue::as_bytes)
                        .collect()
                },
                &bytes,
            );
            let run = match core.begin(scope.as_deref(), &key, fingerprint).await {
                Ok(Begin::Replay(replay)) => return Ok(replayed(replay)),
                Ok(Begin::Run(run)) => run,
                Ok(_) => {
                    tracing::error!(
                        request_id = request_id.as_deref(),
                        "idempotency decision unknown to this version: request refused"
                    );
                    return Ok(problem(Refusal::misconfigured().problem, request_id));
                }
                Err(refusal) => return Ok(problem(refusal.problem, request_id)),
            };

            let mut request = Request::from_parts(parts, ReqBody::from(bytes));
            if let Some(handle) = run.handle() {
                request.extensions_mut().insert(handle);
            }
            // An error of the inner service drops the run: the record stays in flight,
            // and the key's next request runs again.
            let response = inner.call(request).await?;
            Ok(finish(run, response, request_id).await)
        }),
    }
}

/// A refusal, answered without running anything.
fn refused<B, E>(problem: Problem, request_id: Option<String>) -> ResponseFuture<B, E>
where
    B: Send + 'static,
    E: Send + 'static,
{
    let response = self::problem(problem, request_id);
    ResponseFuture {
        inner: Box::pin(std::future::ready(Ok(response))),
    }
}

/// `problem` as a response, with the request's id.
fn problem<B>(problem: Problem, request_id: Option<String>) -> Response<IdempotentBody<B>> {
    problem_response(&problem.with_request_id(request_id)).map(IdempotentBody::full)
}

/// The stored response, marked as replayed.
fn replayed<B>(replay: Replay) -> Response<IdempotentBody<B>> {
    let status = StatusCode::from_u16(replay.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let stored = replay.into_response();
    let mut response = Response::new(IdempotentBody::full(stored.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// The inner service's response to a run: stored when its status and size allow, and
/// answered whole in every case.
async fn finish<B>(
    run: Run,
    response: Response<B>,
    request_id: Option<String>,
) -> Response<IdempotentBody<B>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let status = parts.status.as_u16();
    if !run.stores(status) {
        // Recorded as abandoned: the key's next request runs again.
        run.finish(status, stored_headers(&parts.headers), None)
            .await;
        return Response::from_parts(parts, IdempotentBody::new(body));
    }

    let limit = run.max_body();
    let mut body = Box::pin(body);
    let mut read = BytesMut::new();
    let mut trailers = None;
    loop {
        // The error converted at once: the inner one need not be `Send`.
        let frame = body
            .frame()
            .await
            .map(|f| f.map_err(Into::<BoxError>::into));
        match frame {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    read.extend_from_slice(&data);
                    if read.len() > limit {
                        // Too large to store: answered whole (what was read, then the
                        // rest), and retries are told that it cannot be replayed.
                        run.finish(status, stored_headers(&parts.headers), None)
                            .await;
                        let body = IdempotentBody::with_pinned_prefix(read.freeze(), body);
                        return Response::from_parts(parts, body);
                    }
                }
                Err(frame) => {
                    // Trailers end the body.
                    if let Ok(t) = frame.into_trailers() {
                        trailers = Some(t);
                        break;
                    }
                }
            },
            Some(Err(error)) => {
                tracing::warn!(id = run.id(), request_id = request_id.as_deref(), %error, "the response body failed before it could be stored: answered 500, and the key's next request runs again");
                drop(run);
                return problem(Refusal::response_failed().problem, request_id);
            }
        }
    }
    let bytes = read.freeze();
    run.finish(status, stored_headers(&parts.headers), Some(bytes.clone()))
        .await;
    Response::from_parts(parts, IdempotentBody::full_with_trailers(bytes, trailers))
}

/// The response's headers, as the core stores them (it leaves out hop-by-hop ones).
fn stored_headers(headers: &HeaderMap) -> Vec<(String, Bytes)> {
    headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                Bytes::copy_from_slice(value.as_bytes()),
            )
        })
        .collect()
}
