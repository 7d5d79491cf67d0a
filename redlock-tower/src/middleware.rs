//! The one layer, service and future behind [`crate::lock`] and [`crate::limit`]: the
//! request decision is the engine's ([`redlock_http::Guard`]); this module reads the
//! request, builds the response and wraps the body.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use pin_project_lite::pin_project;
use redlock_core::{Error, Redlock};
use redlock_http::guard::Route;
use redlock_http::key::{Key, KeyBoundError, KeyRoom};
use redlock_http::{Hold, LimitOptions, LockOptions, Refusal};
use tower_service::Service;

use crate::body::LockBody;
use crate::extract::KeyExtractor;
use crate::fencing::FailedOpen;
use crate::guard::{Guard, Held};
use crate::response::{OnRefusal, RefusalResponse, problem_response};

/// Takes what a request holds while it runs: a lock, or a semaphore permit.
type AcquireFuture = Pin<Box<dyn Future<Output = Result<Held, Error>> + Send>>;

/// The engine's options of a lock or of a concurrency limit.
#[derive(Clone, Debug)]
pub(crate) enum Options {
    Lock(LockOptions),
    Limit(LimitOptions),
}

/// What every service of a layer shares: the options and the refusal hook.
#[derive(Clone)]
pub(crate) struct Config {
    options: Options,
    on_refusal: Option<OnRefusal>,
}

impl Config {
    /// The engine's decision, for either kind of options.
    fn guard(&self) -> &dyn redlock_http::Guard {
        match &self.options {
            Options::Lock(o) => o,
            Options::Limit(o) => o,
        }
    }

    fn acquire(&self, redlock: &Redlock, resource: String) -> AcquireFuture {
        match &self.options {
            Options::Lock(o) => {
                let acquire = o.acquire(redlock, resource);
                Box::pin(async move { acquire.await.map(Held::Lock) })
            }
            Options::Limit(o) => {
                let acquire = o.acquire(redlock, resource);
                Box::pin(async move { acquire.await.map(Held::Permit) })
            }
        }
    }

    /// The response to `refusal`: the hook's, or the problem+json default.
    fn render(&self, refusal: &Refusal) -> RefusalResponse {
        match &self.on_refusal {
            Some(hook) => hook(refusal),
            None => problem_response(&refusal.problem),
        }
    }

    /// The layer's and the service's names, for `Debug`.
    fn names(&self) -> [&'static str; 2] {
        match self.options {
            Options::Lock(_) => ["LockLayer", "LockService"],
            Options::Limit(_) => ["ClusterLimitLayer", "ClusterLimitService"],
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("options", &self.options)
            .field("on_refusal", &self.on_refusal.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// The layer of [`LockLayer`](crate::LockLayer) (`O`: [`LockOptions`]) and
/// [`ClusterLimitLayer`](crate::ClusterLimitLayer) (`O`: [`LimitOptions`]): a
/// [`Redlock`] client, a [`KeyExtractor`] and the engine's options. Cloning is cheap:
/// its services share the client (its connections and its watchdog) and the settings.
pub struct GuardLayer<O, E> {
    redlock: Redlock,
    extractor: Arc<E>,
    config: Arc<Config>,
    options: PhantomData<fn() -> O>,
}

impl<O, E> GuardLayer<O, E> {
    pub(crate) fn with_options(redlock: Redlock, extractor: E, options: Options) -> Self {
        let config = Config {
            options,
            on_refusal: None,
        };
        Self {
            redlock,
            extractor: Arc::new(extractor),
            config: Arc::new(config),
            options: PhantomData,
        }
    }

    pub(crate) fn set_options(mut self, options: Options) -> Self {
        Arc::make_mut(&mut self.config).options = options;
        self
    }

    /// The longest key taken under the prefix (and a limit's slot suffix).
    pub(crate) fn key_room(&self) -> Result<KeyRoom, KeyBoundError> {
        match &self.config.options {
            Options::Lock(o) => KeyRoom::new(&self.redlock, o.prefix(), 0),
            Options::Limit(o) => o.room(&self.redlock),
        }
    }

    /// Renders refusals with `hook`, once per refused request (default:
    /// [`problem_response`]); e.g. for tonic, whose clients expect `200` with a
    /// `grpc-status` header.
    #[must_use]
    pub fn on_refusal<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Refusal) -> RefusalResponse + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.config).on_refusal = Some(Arc::new(hook));
        self
    }

    /// The lock client.
    pub fn redlock(&self) -> &Redlock {
        &self.redlock
    }

    /// The key extractor.
    pub fn extractor(&self) -> &E {
        &self.extractor
    }
}

impl<O, E> Clone for GuardLayer<O, E> {
    fn clone(&self) -> Self {
        Self {
            redlock: self.redlock.clone(),
            extractor: Arc::clone(&self.extractor),
            config: Arc::clone(&self.config),
            options: PhantomData,
        }
    }
}

impl<O, E: fmt::Debug> fmt::Debug for GuardLayer<O, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.config.names()[0])
            .field("redlock", &self.redlock)
            .field("extractor", &self.extractor)
            .field("config", &self.config)
            .finish()
    }
}

impl<O, S, E> tower_layer::Layer<S> for GuardLayer<O, E> {
    type Service = GuardService<O, S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        GuardService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`GuardLayer`]: extracts each request's key, takes its lock or
/// permit, calls the inner service, and keeps it until the response (by default its
/// body) is done.
///
/// `poll_ready` is the inner service's. `call` takes the inner service that was polled
/// ready and leaves a clone in its place, so the request is handed to a ready service
/// once it holds its lock (a waiting request keeps that readiness reserved).
pub struct GuardService<O, S, E> {
    inner: S,
    layer: GuardLayer<O, E>,
}

impl<O, S, E> GuardService<O, S, E> {
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

impl<O, S: Clone, E> Clone for GuardService<O, S, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<O, S: fmt::Debug, E: fmt::Debug> fmt::Debug for GuardService<O, S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layer = &self.layer;
        f.debug_struct(layer.config.names()[1])
            .field("inner", &self.inner)
            .field("redlock", &layer.redlock)
            .field("extractor", &layer.extractor)
            .field("config", &layer.config)
            .finish()
    }
}

impl<O, S, E, ReqBody, ResBody> Service<Request<ReqBody>> for GuardService<O, S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    E: KeyExtractor<ReqBody>,
{
    type Response = Response<LockBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The ready service goes with this request; the clone waits for its own
        // `poll_ready`.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = self.layer.extractor.extract(&request);
        ResponseFuture::start(&self.layer, key, inner, request)
    }
}

pin_project! {
    /// The response future of a lock's or a limit's service: taking the lock (or
    /// permit), then running the inner service's future under it.
    ///
    /// Dropping it (the client went away, a timeout) is safe at any point: an
    /// acquisition in flight releases whatever it had set on the nodes, and a held lock
    /// is released at once in the background, not left to expire at its TTL.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, S::Future>,
        config: Arc<Config>,
        // The request's id (`x-request-id`), for rejections and the log.
        request_id: Option<String>,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateOwned]
    enum State<S, ReqBody, F> {
        Acquiring {
            acquire: AcquireFuture,
            resource: String,
            inner: S,
            request: Request<ReqBody>,
            started: Instant,
            // Whether the handler is told about the lock (a `LockHandle`, or the
            // fail-open marker); a concurrency limit's permit is not a lock on the key,
            // and its handle would hide the one of a `LockLayer` on the same route.
            expose: bool,
        },
        Running {
            #[pin]
            future: F,
            guard: Option<Guard>,
        },
        Rejected {
            response: RefusalResponse,
        },
        Done,
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquiring { resource, .. } => format!("acquiring `{resource}`"),
            State::Running { guard: Some(g), .. } => format!("running under `{}`", g.key()),
            State::Running { guard: None, .. } => "running unlocked".to_owned(),
            State::Rejected { response } => format!("rejected ({})", response.status()),
            State::Done => "done".to_owned(),
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    /// The request whose key extractor decided `key`, with `inner` already polled
    /// ready: passed through, refused, or run once its lock (or permit) is taken.
    fn start<O, E>(
        layer: &GuardLayer<O, E>,
        key: Key,
        mut inner: S,
        request: Request<ReqBody>,
    ) -> Self {
        let (redlock, config) = (&layer.redlock, Arc::clone(&layer.config));
        let request_id =
            redlock_http::problem::request_id(|name| request.headers().get(name)?.to_str().ok());
        let state = match config.guard().route(redlock, key, request_id.as_deref()) {
            Route::Take(resource) => State::Acquiring {
                acquire: config.acquire(redlock, resource.clone()),
                resource,
                inner,
                request,
                started: Instant::now(),
                expose: matches!(config.options, Options::Lock(_)),
            },
            Route::Refuse(refusal) => State::Rejected {
                response: config.render(&refusal.with_request_id(request_id.clone())),
            },
            _ => State::Running {
                future: inner.call(request),
                guard: None,
            },
        };
        Self {
            state,
            config,
            request_id,
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<LockBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Acquiring { acquire, .. } => {
                    let acquired = match acquire.as_mut().poll(cx) {
                        Poll::Ready(acquired) => acquired,
                        Poll::Pending => return Poll::Pending,
                    };
                    let StateOwned::Acquiring {
                        resource,
                        mut inner,
                        mut request,
                        started,
                        expose,
                        ..
                    } = this.state.as_mut().project_replace(State::Done)
                    else {
                        continue; // not reached: the state was `Acquiring`
                    };
                    let guard = this.config.guard();
                    let next = match acquired {
                        Ok(lock) => {
                            if expose {
                                request.extensions_mut().insert(lock.lock().handle());
                            }
                            let held = Guard::new(lock, Instant::now(), guard.aborts_on_loss());
                            State::Running {
                                future: inner.call(request),
                                guard: Some(held),
                            }
                        }
                        Err(error) => {
                            let id = this.request_id.as_deref();
                            match guard.refuse(&resource, error, id, started.elapsed()) {
                                Some(refusal) => State::Rejected {
                                    response: this
                                        .config
                                        .render(&refusal.with_request_id(this.request_id.clone())),
                                },
                                // Fail-open: through without a lock (and without a
                                // handle); the marker tells `FencingToken` why.
                                None => {
                                    if expose {
                                        request.extensions_mut().insert(FailedOpen);
                                    }
                                    State::Running {
                                        future: inner.call(request),
                                        guard: None,
                                    }
                                }
                            }
                        }
                    };
                    this.state.set(next);
                }
                StateProj::Running { future, guard } => {
                    if let Some(held) = guard.as_mut()
                        && held.poll_lost(cx, "handler").is_ready()
                        && held.abort_on_loss()
                    {
                        let key = held.key().to_owned();
                        // Drops the handler's future where it stands, then the guard.
                        this.state.set(State::Done);
                        tracing::warn!(
                            key = %key,
                            request_id = this.request_id.as_deref(),
                            "lock lost while the request ran (a majority of lock nodes could not extend it in time): request stopped"
                        );
                        let refusal = Refusal::lost_while_running()
                            .with_resource(key)
                            .with_request_id(this.request_id.clone());
                        let response = this.config.render(&refusal);
                        return Poll::Ready(Ok(response.map(LockBody::full)));
                    }
                    let output = match future.poll(cx) {
                        Poll::Ready(output) => output,
                        Poll::Pending => return Poll::Pending,
                    };
                    let guard = match this.config.guard().held_until() {
                        // Dropping the guard releases the lock.
                        Hold::UntilHead => None,
                        _ => guard.take(),
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(
                        output.map(|response| response.map(|body| LockBody::inner(body, guard))),
                    );
                }
                StateProj::Rejected { .. } => {
                    if let StateOwned::Rejected { response } =
                        this.state.as_mut().project_replace(State::Done)
                    {
                        return Poll::Ready(Ok(response.map(LockBody::full)));
                    }
                }
                // Polled after completion: a caller's bug; never completes again.
                StateProj::Done => return Poll::Pending,
            }
        }
    }
}

// The lock's layer and service: the engine's `LockOptions`.
/// Serializes requests per key across every replica of a service, with a Redlock
/// distributed lock: one key per request, named by a
/// [`KeyExtractor`](crate::extract::KeyExtractor); busy: `409` at once by default.
///
/// ```
/// use std::time::Duration;
/// use redlock_core::Redlock;
/// use redlock_tower::{LockLayer, LockOptions, extract::Header};
///
/// # fn layer(redlock: Redlock) -> LockLayer<Header> {
/// LockLayer::new(redlock, Header::new("x-tenant").required()).options(
///     LockOptions::new()
///         .resource_prefix("tenant:")
///         .ttl(Duration::from_secs(5))
///         .wait(Duration::from_secs(1)),
/// )
/// # }
/// ```
pub type LockLayer<E> = GuardLayer<LockOptions, E>;

/// The service made by a [`LockLayer`]: the request runs while holding its key's lock,
/// released when the response (by default its body) is done.
pub type LockService<S, E> = GuardService<LockOptions, S, E>;

impl<E> LockLayer<E> {
    /// A layer locking, for each request, the key `extractor` names, through `redlock`,
    /// with the default [`LockOptions`].
    pub fn new(redlock: Redlock, extractor: E) -> Self {
        Self::with_options(redlock, extractor, Options::Lock(LockOptions::new()))
    }

    /// Takes its locks by `options` (see [`LockOptions`] for each and its default).
    #[must_use]
    pub fn options(self, options: LockOptions) -> Self {
        self.set_options(Options::Lock(options))
    }
}

impl<S, E> LockService<S, E> {
    /// A layer making this service (the same as [`LockLayer::new`]).
    pub fn layer(redlock: Redlock, extractor: E) -> LockLayer<E> {
        LockLayer::new(redlock, extractor)
    }
}

// The concurrency limit's layer and service: the engine's `LimitOptions`.
/// At most [`limit`](LimitOptions::limit) concurrent requests per key, across every
/// replica of a service. See the [module documentation](crate::limit).
pub type ClusterLimitLayer<E> = GuardLayer<LimitOptions, E>;

/// The service made by a [`ClusterLimitLayer`]: the request runs while holding a
/// permit of its key's semaphore, released when the response (by default its body) is
/// done.
pub type ClusterLimitService<S, E> = GuardService<LimitOptions, S, E>;

impl<E> ClusterLimitLayer<E> {
    /// A layer letting at most `options.limit()` requests with the key `extractor`
    /// names run at once, cluster-wide, through `redlock`. A limit of `0`, or a prefix
    /// that leaves no room for a key, is logged here ([`LimitOptions::check`]) and
    /// answers `500` to every request with a key.
    pub fn new(redlock: Redlock, extractor: E, options: LimitOptions) -> Self {
        options.check(&redlock);
        Self::with_options(redlock, extractor, Options::Limit(options))
    }

    /// The longest key (after escaping) taken under the options' prefix and limit
    /// ([`LimitOptions::room`]).
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`] when the prefix leaves none.
    pub fn room(&self) -> Result<KeyRoom, KeyBoundError> {
        self.key_room()
    }
}

impl<S, E> ClusterLimitService<S, E> {
    /// A layer making this service (the same as [`ClusterLimitLayer::new`]).
    pub fn layer(redlock: Redlock, extractor: E, options: LimitOptions) -> ClusterLimitLayer<E> {
        ClusterLimitLayer::new(redlock, extractor, options)
    }
}
