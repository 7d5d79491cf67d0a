//! [`Idempotency`]: a `wrap()`-able middleware that runs each request carrying an
//! `Idempotency-Key` once, cluster-wide, and replays its response to retries.

use std::fmt;
use std::future::{Ready, poll_fn, ready};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_LENGTH, HeaderMap, HeaderName, HeaderValue};
use actix_web::web::{Bytes, BytesMut};
use actix_web::{HttpMessage, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use futures_util::future::LocalBoxFuture;
use redlock_core::Redlock;
use redlock_http::Problem;
use redlock_idempotency::Idempotency as Core;
use redlock_idempotency::{Begin, REPLAYED_HEADER, Refusal, Replay, Run, Store};
use tokio::runtime::Handle;

use crate::config::{AbortOnDrop, background};
use crate::error::{problem_response, request_id};

/// The type of the problem answered when the request's body cannot be read.
const UNREADABLE_BODY: &str = "urn:redlock:idempotency:unreadable-body";
/// The type of the problem answered when the handler's body fails before it could be
/// stored.
const RESPONSE_FAILED: &str = "urn:redlock:idempotency:response-failed";

type ScopeFn = dyn Fn(&HttpRequest) -> Option<String> + Send + Sync;

/// Runs each request with an idempotency key once, cluster-wide, and replays its
/// response to retries: `wrap()` it around an `App`, a scope or a resource. Built on
/// [`redlock_idempotency`] (its docs say the semantics and the guarantees), with the
/// options of `redlock-tower`'s `IdempotencyLayer`, under the same names:
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | [`header`](Self::header) | `Idempotency-Key` | the request header with the key |
/// | [`required`](Self::required) | `true` | no key: `400`; `false`: the request passes through, unprotected |
/// | [`scope`](Self::scope), [`scope_header`](Self::scope_header) | none | whose key it is: the subject, the tenant; a configured scope that names none: `400` |
/// | [`resource_prefix`](Self::resource_prefix) | `idempotency:` | the locks' resource names: the prefix, then the record's id |
/// | [`ttl`](Self::ttl) | the client's `default_ttl` | the lock's TTL, extended while the handler runs |
/// | [`fail_fast`](Self::fail_fast) | yes | a request while its key's first one runs: `409` at once |
/// | [`wait`](Self::wait) | | wait up to a deadline for the first to finish, then replay its response (else `409`) |
/// | [`max_hold`](Self::max_hold) | the client's | no extension past this: the lock is then lost |
/// | [`expire_after`](Self::expire_after) | 24 h | how long records live after their run |
/// | [`max_body`](Self::max_body) | 1 MiB | the largest response body stored; larger ones are answered, not stored |
/// | [`max_request_body`](Self::max_request_body) | 1 MiB | the largest request body taken; larger: `413` |
/// | [`max_key_len`](Self::max_key_len) | 255 | the longest key, in bytes; escaped and joined to its escaped scope, it must also fit the room the resource prefix leaves under the 512-byte resource-name bound (`room()`: 500 bytes by default), else `400` naming the bound |
/// | [`fingerprint_headers`](Self::fingerprint_headers) | none | request headers that are part of the fingerprint |
/// | [`store_if`](Self::store_if) | `2xx`, `4xx` | which statuses are stored (others: the next request runs again) |
/// | [`store_timeout`](Self::store_timeout) | 2 s | how long a store operation may take (then `503`) |
/// | [`runtime`](Self::runtime) | the crate's own thread | where the lock client's and the store's calls run |
///
/// A request with a key is read whole (to fingerprint its body), then handed to the
/// handler with the same body. The first one runs under the key's lock; its response
/// is stored (status, headers without hop-by-hop ones, body) before it is sent. A retry
/// gets the stored response, marked `Idempotent-Replayed: true`, without the handler
/// running. The handler sees the run's lock as `web::ReqData<redlock_actix::LockHandle>`,
/// and its fencing token as a [`FencingToken`](crate::FencingToken) argument.
///
/// Refusals are `application/problem+json` responses (with the request's id, as the
/// lock middleware's): `400` no usable key or scope, `409` in flight (with
/// `Retry-After`) or not replayable, `413` a request body over the limit, `422` the key
/// reused for another request, `503` the lock service or the store unavailable.
///
/// # Runtimes
///
/// As with [`DistributedLockConfig`](crate::DistributedLockConfig#runtimes), every call
/// into the lock client and the store (the decision, the final write, the lock's
/// release) runs on one long-lived runtime, not on an actix worker's: the crate's own
/// thread by default, or the one given with [`runtime`](Self::runtime). Open the store
/// on a runtime that outlives the server as well (`RedisStore::open` starts its
/// connection's task where it is called).
///
/// ```
/// use std::time::Duration;
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::{Idempotency, Redlock};
/// use redlock_idempotency::store::RedisStore;
///
/// async fn refund(body: web::Bytes) -> HttpResponse {
///     // ... refunds once per key and tenant, whatever the client's retries ...
///     HttpResponse::Created().body(body)
/// }
///
/// fn app(
///     redlock: Redlock,
///     store: RedisStore,
/// ) -> App<
///     impl actix_web::dev::ServiceFactory<
///         actix_web::dev::ServiceRequest,
///         Config = (),
///         Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
///         Error = actix_web::Error,
///         InitError = (),
///     >,
/// > {
///     let idempotency = Idempotency::new(redlock, store)
///         .scope_header("x-tenant")
///         .wait(Duration::from_secs(5));
///     App::new().service(
///         web::resource("/refunds")
///             .wrap(idempotency)
///             .route(web::post().to(refund)),
///     )
/// }
/// ```
#[derive(Clone)]
pub struct Idempotency {
    core: Core,
    scope: Option<Arc<ScopeFn>>,
    runtime: Option<Handle>,
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("core", &self.core)
            .field("scope", &self.scope.is_some())
            .field("runtime", &self.runtime.is_some())
            .finish()
    }
}

impl Idempotency {
    /// Keys locked with `redlock`, records kept in `store`, default options.
    pub fn new(redlock: Redlock, store: impl Store) -> Self {
        Self::from_core(Core::new(redlock, store))
    }

    /// The middleware of a configured core (e.g. one shared with `redlock-tower`'s
    /// layer, or built with [`Core::with_store`]).
    pub fn from_core(idempotency: Core) -> Self {
        Self {
            core: idempotency,
            scope: None,
            runtime: None,
        }
    }

    /// The framework-free core, with its options.
    pub fn core(&self) -> &Core {
        &self.core
    }

    fn core_option(mut self, set: impl FnOnce(Core) -> Core) -> Self {
        self.core = set(self.core);
        self
    }

    /// The request header with the key (default `Idempotency-Key`).
    #[must_use]
    pub fn header(self, name: impl Into<String>) -> Self {
        self.core_option(|c| c.header(name))
    }

    /// Whether requests must carry a key (default `true`: `400` without one). `false`:
    /// a request without a key passes through, unprotected.
    #[must_use]
    pub fn required(self, required: bool) -> Self {
        self.core_option(|c| c.required(required))
    }

    /// Whose key it is: the request's scope (the authenticated subject, the tenant, the
    /// API key), so that two clients sending the same key never share a record. A
    /// request with a key whose scope is `None` is refused (`400`).
    ///
    /// **Without a scope, any client that sends the same key gets the other client's
    /// stored response.**
    ///
    /// ```
    /// use actix_web::HttpMessage;
    /// use redlock_actix::{Idempotency, Redlock};
    /// use redlock_idempotency::store::RedisStore;
    ///
    /// #[derive(Clone)]
    /// struct Subject(String); // put in the extensions by the authentication middleware
    ///
    /// fn middleware(redlock: Redlock, store: RedisStore) -> Idempotency {
    ///     Idempotency::new(redlock, store)
    ///         .scope(|req| req.extensions().get::<Subject>().map(|s| s.0.clone()))
    /// }
    /// ```
    #[must_use]
    pub fn scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&HttpRequest) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// [`scope`](Self::scope) from a request header (a tenant id): its value, trimmed,
    /// when it is one header of visible ASCII; else the request has no scope (`400`).
    #[must_use]
    pub fn scope_header(self, name: impl Into<String>) -> Self {
        let name = name.into().to_ascii_lowercase();
        self.scope(move |req| header_scope(req.headers(), &name))
    }

    /// The locks' resource names: `prefix` and the record's id (default
    /// `idempotency:`).
    #[must_use]
    pub fn resource_prefix(self, prefix: impl Into<String>) -> Self {
        self.core_option(|c| c.resource_prefix(prefix))
    }

    /// The lock's TTL (default: the client's). It is extended while the handler runs;
    /// it is how long a replica that died mid-request blocks its key's retries.
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.core_option(|c| c.ttl(ttl))
    }

    /// A request whose key's first request still runs: `409` at once (the default).
    #[must_use]
    pub fn fail_fast(self) -> Self {
        self.core_option(Core::fail_fast)
    }

    /// A request whose key's first request still runs: wait up to `deadline` for it
    /// to finish, then replay its response; `409` if it still runs at the deadline.
    #[must_use]
    pub fn wait(self, deadline: Duration) -> Self {
        self.core_option(|c| c.wait(deadline))
    }

    /// No lock extension past `max_hold` after the acquisition (default: the client's
    /// `max_hold`): a handler running longer loses its lock.
    #[must_use]
    pub fn max_hold(self, max_hold: Duration) -> Self {
        self.core_option(|c| c.max_hold(max_hold))
    }

    /// How long a record lives after its run finished (default 24 h): a retry later
    /// than that runs again.
    #[must_use]
    pub fn expire_after(self, expire_after: Duration) -> Self {
        self.core_option(|c| c.expire_after(expire_after))
    }

    /// The largest response body stored, in bytes (default 1 MiB). A larger response is
    /// answered whole but not stored: retries get `409` (never part of a body).
    #[must_use]
    pub fn max_body(self, bytes: usize) -> Self {
        self.core_option(|c| c.max_body(bytes))
    }

    /// The largest request body taken, in bytes (default 1 MiB): the body is read whole
    /// to fingerprint it, then handed to the handler. A larger one: `413`.
    #[must_use]
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.core_option(|c| c.max_request_body(bytes))
    }

    /// The longest key taken, in bytes (default 255); a longer one: `400`. Once
    /// escaped (`%` and `:` take three bytes) and joined to its escaped scope, a key
    /// must also fit the room the [`resource_prefix`](Self::resource_prefix) leaves
    /// under the resource-name bound ([`Core::room`]: 500 bytes by default), else `400`
    /// naming that bound, as in `redlock-tower`.
    #[must_use]
    pub fn max_key_len(self, bytes: usize) -> Self {
        self.core_option(|c| c.max_key_len(bytes))
    }

    /// Request headers that are part of the fingerprint (default none), e.g. the
    /// `content-type`, an API version header.
    #[must_use]
    pub fn fingerprint_headers<I, S>(self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.core_option(|c| c.fingerprint_headers(names))
    }

    /// Which responses are stored, by status (default `2xx` and `4xx`). A response not
    /// stored lets the next request with the key run again.
    #[must_use]
    pub fn store_if(self, store_if: impl Fn(u16) -> bool + Send + Sync + 'static) -> Self {
        self.core_option(|c| c.store_if(store_if))
    }

    /// How long one store operation may take (default 2 s); then the request gets `503`
    /// (or, for the final write, its response unstored).
    #[must_use]
    pub fn store_timeout(self, timeout: Duration) -> Self {
        self.core_option(|c| c.store_timeout(timeout))
    }

    /// Runs the lock client's and the store's calls on this runtime instead of the
    /// crate's own thread (see [Runtimes](Self#runtimes)). It must outlive every request
    /// through this middleware, and have its time and I/O drivers enabled.
    #[must_use]
    pub fn runtime(mut self, handle: Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// The runtime the client's and the store's calls run on.
    fn handle(&self) -> Result<Handle, String> {
        match &self.runtime {
            Some(handle) => Ok(handle.clone()),
            None => background().cloned(),
        }
    }
}

/// The scope in header `name`, by the core's rule (`scope_from_header`).
fn header_scope(headers: &HeaderMap, name: &str) -> Option<String> {
    redlock_idempotency::scope_from_header(headers.get_all(name).map(|value| value.as_bytes()))
}

impl<S, B> Transform<S, ServiceRequest> for Idempotency
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = IdempotencyService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        // Checked where the service is built, once every option is set.
        if let Err(error) = self.core.room() {
            tracing::error!(%error, "idempotency misconfigured: every request with a key will be answered 500");
        }
        ready(Ok(IdempotencyService {
            service: Rc::new(service),
            config: Rc::new(self.clone()),
        }))
    }
}

/// The service made by [`Idempotency`].
pub struct IdempotencyService<S> {
    service: Rc<S>,
    config: Rc<Idempotency>,
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
    config: &Idempotency,
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
            None => {
                let refusal = Refusal::bad_key(
                    "The request names no scope for its idempotency key (the client, tenant or subject it is made for)."
                        .to_owned(),
                );
                return Ok(refuse(req, refusal.problem));
            }
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
        return Ok(refuse(req, Refusal::body_too_large(limit).problem));
    }
    let mut payload = req.take_payload();
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        match chunk {
            Ok(chunk) if body.len() + chunk.len() > limit => {
                return Ok(refuse(req, Refusal::body_too_large(limit).problem));
            }
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(error) => {
                let id = request_id(req.request());
                tracing::debug!(request_id = id.as_deref(), %error, "request body unreadable: idempotent request refused");
                let problem = Problem::new(
                    400,
                    UNREADABLE_BODY,
                    "Request body unreadable",
                    "The request's body could not be read; send the request again.".to_owned(),
                );
                return Ok(refuse(req, problem));
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
    let target = redlock_http::sent_target(shown, None);
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
            let problem = Problem::misconfigured(redlock_http::MISCONFIGURED_DETAIL.to_owned());
            return Ok(refuse(req, problem));
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
            let problem = Problem::misconfigured(redlock_http::MISCONFIGURED_DETAIL.to_owned());
            return Ok(refuse(req, problem));
        }
        Err(error) => {
            tracing::error!(%error, "the idempotency decision's task failed: request refused");
            let problem = Problem::misconfigured(redlock_http::MISCONFIGURED_DETAIL.to_owned());
            return Ok(refuse(req, problem));
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
            let problem = Problem::new(
                500,
                RESPONSE_FAILED,
                "Response failed",
                "The response could not be produced; retry the request with the same idempotency key.".to_owned(),
            )
            .with_request_id(id);
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
