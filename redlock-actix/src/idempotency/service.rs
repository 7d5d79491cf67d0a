//! [`IdempotencyService`]: actix's requests and responses to and from the engine's flow.

use std::fmt;
use std::future::{poll_fn, ready};
use std::rc::Rc;

use actix_web::body::{BodySize, BodyStream, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse, forward_ready};
use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::web::Bytes;
use actix_web::{HttpMessage, HttpResponse};
use futures_util::future::LocalBoxFuture;
use futures_util::{StreamExt, stream};
use redlock_idempotency::middleware::{Admit, Collect, Decision, RequestHead};
use redlock_idempotency::{Refusal, Run, StoredResponse};
use tokio::runtime::Handle;

use super::IdempotencyMiddleware;
use crate::config::AbortOnDrop;
use crate::error::{problem_response, request_id};

type Answer<B> = Result<ServiceResponse<EitherBody<B>>, actix_web::Error>;

/// The service made by [`IdempotencyMiddleware`].
pub struct IdempotencyService<S> {
    pub(super) service: Rc<S>,
    pub(super) config: Rc<IdempotencyMiddleware>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for IdempotencyService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Answer<B>>;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let (service, config) = (Rc::clone(&self.service), Rc::clone(&self.config));
        Box::pin(async move {
            // The target as the client sent it (actix shows it whole, under a scope too).
            let uri = req.uri();
            let shown = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
            let target = redlock_http::key::sent_target(shown, None);
            let headers = |name: &str| req.headers().get_all(name).map(|v| v.as_bytes()).collect();
            let head = RequestHead::new(req.method().as_str(), target, headers);
            let scope = config
                .scope
                .as_ref()
                .map(|hook| || hook.scope(req.request()));
            let mut reading = match config.core.admit(&head, scope) {
                Admit::Read(reading) => reading,
                Admit::Refuse(refusal) => return Ok(refuse(req, &refusal)),
                // `PassThrough`: no key, and keys are optional.
                _ => return Ok(service.call(req).await?.map_into_left_body()),
            };
            let mut payload = req.take_payload();
            while let Some(chunk) = payload.next().await {
                let chunk = chunk.map_err(|error| reading.unreadable(&error));
                if let Err(refusal) = chunk.and_then(|chunk| reading.push(&chunk)) {
                    return Ok(refuse(req, &refusal));
                }
            }
            let (body, decision) = reading.finish();
            req.set_payload(Payload::from(body));
            let runtime = match config.handle() {
                Ok(runtime) => runtime,
                Err(error) => return Ok(misconfigured(req, &error)),
            };
            // The decision runs on the long-lived runtime: so do the lock's watchdog and,
            // when the run ends or is dropped, its release.
            let run = match AbortOnDrop::spawn(&runtime, decision).await {
                Ok(Decision::Run(run)) => run,
                Ok(Decision::Replay(stored)) => {
                    return Ok(req.into_response(replayed(stored)).map_into_right_body());
                }
                Ok(Decision::Refuse(refusal)) => return Ok(refuse(req, &refusal)),
                Ok(other) => return Ok(misconfigured(req, &format!("{other:?}"))),
                Err(error) => return Ok(misconfigured(req, &error)),
            };
            if let Some(lock) = run.handle() {
                // For `web::ReqData<LockHandle>` and the `FencingToken` extractor.
                req.extensions_mut().insert(lock);
            }
            // An error (or this future dropped) drops `run`: its lock is released on the
            // runtime it began on, and the record stays in flight (a retry runs again).
            finish(service.call(req).await?, run, &runtime).await
        })
    }
}

/// The handler's `response` to `run`, read for the engine to store it (its final write
/// on `runtime`), and answered whole in every case.
async fn finish<B: MessageBody + 'static>(
    response: ServiceResponse<B>,
    run: Run,
    runtime: &Handle,
) -> Answer<B> {
    let len = match response.response().body().size() {
        BodySize::Sized(len) => Some(len),
        _ => None,
    };
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()));
    let mut collect = run.respond(response.status().as_u16(), headers, len);
    if !collect.wants() {
        // Not stored (by its status or its size): sent as it is.
        write(runtime, collect).await;
        return Ok(response.map_into_left_body());
    }
    let (req, res) = response.into_parts();
    let (head, body) = res.into_parts();
    let mut rest = Box::pin(body);
    while collect.wants() {
        match poll_fn(|cx| rest.as_mut().poll_next(cx)).await {
            Some(Ok(chunk)) => collect.push(&chunk),
            Some(Err(error)) => {
                let res = problem_response(&collect.failed(&error.into()).problem);
                return Ok(ServiceResponse::new(req, res).map_into_right_body());
            }
            None => break,
        };
    }
    let whole = collect.wants();
    let read = write(runtime, collect).await;
    let body = match whole {
        true => BoxBody::new(read),
        // Too large: what was read, then the rest.
        false => {
            let rest = stream::poll_fn(move |cx| rest.as_mut().poll_next(cx));
            BoxBody::new(BodyStream::new(stream::once(ready(Ok(read))).chain(rest)))
        }
    };
    Ok(ServiceResponse::new(req, head.set_body(body)).map_into_right_body())
}

/// The run's final write on `runtime`, awaited (it goes on if this future is dropped);
/// what was read of the body.
async fn write(runtime: &Handle, collect: Collect) -> Bytes {
    let (read, write) = collect.finish();
    if let Err(error) = runtime.spawn(write).await {
        tracing::error!(%error, "the idempotent request's final write failed to run: a retry runs again once the lock expires");
    }
    read
}

/// The engine's replay as a response (a header actix cannot take is left out).
fn replayed(stored: StoredResponse) -> HttpResponse {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::with_body(status, BoxBody::new(stored.body));
    *response.headers_mut() = (stored.headers.into_iter())
        .filter_map(|(name, value)| {
            let name = HeaderName::try_from(name).ok()?;
            Some((name, HeaderValue::from_maybe_shared(value).ok()?))
        })
        .collect();
    response
}

/// `req` answered with the refusal's problem.
fn refuse<B>(req: ServiceRequest, refusal: &Refusal) -> ServiceResponse<EitherBody<B>> {
    req.into_response(problem_response(&refusal.problem))
        .map_into_right_body()
}

/// `req` refused as misconfigured (`500`), the cause logged.
fn misconfigured<B>(
    req: ServiceRequest,
    error: &dyn fmt::Display,
) -> ServiceResponse<EitherBody<B>> {
    tracing::error!(%error, "the idempotency middleware cannot decide: request refused");
    let mut refusal = Refusal::misconfigured();
    refusal.problem = refusal.problem.with_request_id(request_id(req.request()));
    refuse(req, &refusal)
}
