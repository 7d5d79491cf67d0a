//! [`IdempotencyService`]: one request through idempotency: read it whole, decide
//! (the engine), run or replay, store the answer.

use std::fmt;
use std::future::poll_fn;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, forward_ready};
use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use actix_web::web::{Bytes, BytesMut};
use actix_web::{HttpMessage, HttpResponse};
use futures_util::StreamExt;
use futures_util::future::LocalBoxFuture;
use redlock_http::Problem;
use redlock_idempotency::{Begin, REPLAYED_HEADER, Refusal, Replay, Run};
use tokio::runtime::Handle;

use crate::config::AbortOnDrop;
use crate::error::{problem_response, request_id};

use super::IdempotencyMiddleware;

/// The service made by [`IdempotencyMiddleware`].
pub struct IdempotencyService<S> {
    pub(super) service: Rc<S>,
    pub(super) config: Rc<IdempotencyMiddleware>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for IdempotencyService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let config = Rc::clone(&self.config);
        Box::pin(async move { answer(&service, &config, req).await })
    }
}

/// The answer to `req`: refused, replayed, passed through, or run by `service`.
async fn answer<S, B>(
    service: &S,
    config: &IdempotencyMiddleware,
    mut req: ServiceRequest,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody + 'static,
{
    let core = &config.core;
    let values = req.headers().get_all(core.header_name());
    let key = match core.key(values.map(HeaderValue::as_bytes)) {
        Ok(Some(key)) => key,
        // Optional and absent: the request goes through, unprotected.
        Ok(None) => return Ok(service.call(req).await?.map_into_left_body()),
        Err(refusal) => return Ok(refuse(req, refusal.problem)),
    };
    let scope = match &config.scope {
        Some(scope) => match scope(req.request()) {
            Some(scope) => Some(scope),
            None => return Ok(refuse(req, core.no_scope().problem)),
        },
        None => None,
    };

    // The body, read whole to be fingerprinted, then handed back for the handler.
    let limit = core.request_body_limit();
    let announced = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if announced.is_some_and(|len| len > limit) {
        return Ok(refuse(req, core.body_too_large().problem));
    }
    let mut payload = req.take_payload();
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        match chunk {
            Ok(chunk) if body.len() + chunk.len() > limit => {
                return Ok(refuse(req, core.body_too_large().problem));
            }
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(error) => {
                let id = request_id(req.request());
                tracing::debug!(request_id = id.as_deref(), %error, "request body unreadable: idempotent request refused");
                return Ok(refuse(req, Refusal::unreadable_body().problem));
            }
        }
    }
    let body = body.freeze();
    // The target as the client sent it (actix shows it whole, under a scope too), by
    // the rule redlock-tower follows: the same request fingerprints alike in both.
    let shown = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.path(), |pq| pq.as_str());
    let target = redlock_http::key::sent_target(shown, None);
    let fingerprint = core.fingerprint(
        req.method().as_str(),
        target,
        |name| {
            req.headers()
                .get_all(name)
                .map(HeaderValue::as_bytes)
                .collect()
        },
        &body,
    );
    req.set_payload(actix_web::dev::Payload::from(body));

    let runtime = match config.handle() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "no runtime for the idempotency middleware: request refused");
            return Ok(refuse(req, Refusal::misconfigured().problem));
        }
    };
    // The decision runs on the long-lived runtime: so do the lock's watchdog and, when
    // the run ends or is dropped, its release.
    let begun = {
        let core = core.clone();
        AbortOnDrop::spawn(&runtime, async move {
            core.begin(scope.as_deref(), &key, fingerprint).await
        })
        .await
    };
    let run = match begun {
        Ok(Ok(Begin::Run(run))) => run,
        Ok(Ok(Begin::Replay(replay))) => {
            return Ok(req.into_response(replayed(&replay)).map_into_right_body());
        }
        Ok(Err(refusal)) => return Ok(refuse(req, refusal.problem)),
        Ok(Ok(other)) => {
            tracing::error!(decision = ?other, "an idempotency decision this version does not know: request refused");
            return Ok(refuse(req, Refusal::misconfigured().problem));
        }
        Err(error) => {
            tracing::error!(%error, "the idempotency decision's task failed: request refused");
            return Ok(refuse(req, Refusal::misconfigured().problem));
        }
    };
    if let Some(lock) = run.handle() {
        // For `web::ReqData<LockHandle>` and the `FencingToken` extractor.
        req.extensions_mut().insert(lock);
    }
    // An error (or this future dropped) drops `run`: its lock is released on the
    // runtime it began on, and the record stays in flight (a retry runs again).
    let response = service.call(req).await?;
    finish(response, run, &runtime).await
}

/// Records the handler's `response` through `run` (on `runtime`), then answers it.
async fn finish<B>(
    response: ServiceResponse<B>,
    run: Run,
    runtime: &Handle,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error>
where
    B: MessageBody + 'static,
{
    let status = response.status().as_u16();
    let headers: Vec<(String, Bytes)> = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                Bytes::copy_from_slice(value.as_bytes()),
            )
        })
        .collect();
    if !run.stores(status) {
        // Recorded "abandoned": the key's next request runs again.
        end(runtime, run, status, headers, None).await;
        return Ok(response.map_into_left_body());
    }
    let max = run.max_body();
    let size = response.response().body().size();
    if matches!(size, BodySize::Sized(len) if len > max as u64) {
        // Known too large: sent as it is, not stored.
        end(runtime, run, status, headers, None).await;
        return Ok(response.map_into_left_body());
    }
    let (req, res) = response.into_parts();
    let (head, body) = res.into_parts();
    match collect(body, max).await {
        Collected::Whole(bytes) => {
            end(runtime, run, status, headers, Some(bytes.clone())).await;
            let res = head.set_body(BoxBody::new(bytes));
            Ok(ServiceResponse::new(req, res).map_into_right_body())
        }
        Collected::TooLarge { read, rest } => {
            end(runtime, run, status, headers, None).await;
            let body = Prefixed {
                prefix: Some(read),
                rest,
                size,
            };
            let res = head.set_body(BoxBody::new(body));
            Ok(ServiceResponse::new(req, res).map_into_right_body())
        }
        Collected::Failed(error) => {
            let id = request_id(&req);
            tracing::warn!(id = run.id(), request_id = id.as_deref(), %error, "the response body failed before it could be stored: answered 500, and the key's next request runs again");
            drop(run);
            let problem = Refusal::response_failed().problem.with_request_id(id);
            let res = problem_response(&problem);
            Ok(ServiceResponse::new(req, res).map_into_right_body())
        }
    }
}

/// [`Run::finish`] on `runtime`, awaited (it goes on if this future is dropped).
async fn end(
    runtime: &Handle,
    run: Run,
    status: u16,
    headers: Vec<(String, Bytes)>,
    body: Option<Bytes>,
) {
    let id = run.id().to_owned();
    let task = runtime.spawn(run.finish(status, headers, body));
    if let Err(error) = task.await {
        tracing::error!(%id, %error, "the idempotent request's final write failed to run: a retry runs again once the lock expires");
    }
}

/// What [`collect`] read of a body.
enum Collected<B> {
    /// The whole body.
    Whole(Bytes),
    /// More than the limit: what was read, and the rest.
    TooLarge {
        read: Bytes,
        rest: Option<Pin<Box<B>>>,
    },
    /// The body failed.
    Failed(Box<dyn std::error::Error>),
}

/// Reads `body` to its end, or until more than `max` bytes were read.
async fn collect<B: MessageBody>(body: B, max: usize) -> Collected<B> {
    let body = match body.try_into_bytes() {
        Ok(bytes) if bytes.len() <= max => return Collected::Whole(bytes),
        Ok(bytes) => {
            return Collected::TooLarge {
                read: bytes,
                rest: None,
            };
        }
        Err(body) => body,
    };
    let mut body = Box::pin(body);
    let mut read = BytesMut::new();
    loop {
        match poll_fn(|cx| body.as_mut().poll_next(cx)).await {
            None => return Collected::Whole(read.freeze()),
            Some(Ok(chunk)) => {
                read.extend_from_slice(&chunk);
                if read.len() > max {
                    return Collected::TooLarge {
                        read: read.freeze(),
                        rest: Some(body),
                    };
                }
            }
            Some(Err(error)) => return Collected::Failed(error.into()),
        }
    }
}

/// A body: the bytes already read, then the rest.
struct Prefixed<B> {
    prefix: Option<Bytes>,
    rest: Option<Pin<Box<B>>>,
    size: BodySize,
}

impl<B: MessageBody> MessageBody for Prefixed<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        match self.size {
            BodySize::Sized(len) => BodySize::Sized(len),
            _ => BodySize::Stream,
        }
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(prefix)));
        }
        match this.rest.as_mut() {
            Some(rest) => rest.as_mut().poll_next(cx),
            None => Poll::Ready(None),
        }
    }
}

/// The response to replay, marked with [`REPLAYED_HEADER`].
fn replayed(replay: &Replay) -> HttpResponse {
    let status = StatusCode::from_u16(replay.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::with_body(status, BoxBody::new(replay.body().clone()));
    let headers = response.headers_mut();
    for (name, value) in replay.headers() {
        // A header this version of actix cannot parse is left out.
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    headers.insert(
        HeaderName::from_static(REPLAYED_HEADER),
        HeaderValue::from_static("true"),
    );
    response
}

/// `req` answered with `problem`, with the request's id.
fn refuse<B>(req: ServiceRequest, problem: Problem) -> ServiceResponse<EitherBody<B>> {
    let id = request_id(req.request());
    req.into_response(problem_response(&problem.with_request_id(id)))
        .map_into_right_body()
}
