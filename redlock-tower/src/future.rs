//! [`ResponseFuture`]: one request through the [`LockService`](crate::LockService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use pin_project_lite::pin_project;
use redlock_core::{Error, ErrorClass, Redlock};
use redlock_http::Problem;
use tower_service::Service;

use crate::body::LockBody;
use crate::config::{Config, Hold};
use crate::guard::{Guard, Held};
use crate::response::{Rejection, RejectionKind, RejectionResponse};
use crate::token::FailedOpen;

/// Takes what a request holds while it runs: a lock, or a semaphore permit.
pub(crate) type AcquireFuture = Pin<Box<dyn Future<Output = Result<Held, Error>> + Send>>;

pin_project! {
    /// The response future of [`LockService`](crate::LockService): acquiring the lock,
    /// then running the inner service's future under it.
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
            // fail-open marker); a concurrency limit's permit is not a lock on the key.
            expose: bool,
        },
        Running {
            #[pin]
            future: F,
            guard: Option<Guard>,
        },
        Rejected {
            response: RejectionResponse,
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
    /// The request needs no lock: the inner service's future, as it is.
    pub(crate) fn unlocked(future: S::Future, config: Arc<Config>) -> Self {
        Self {
            state: State::Running {
                future,
                guard: None,
            },
            config,
            request_id: None,
        }
    }

    /// Answer with a rejection, without calling the service.
    pub(crate) fn rejected(
        kind: RejectionKind,
        key: Option<&str>,
        problem: Problem,
        request_id: Option<String>,
        config: Arc<Config>,
    ) -> Self {
        let problem = problem.with_request_id(request_id.clone());
        let response = render(&config, kind, key, problem, None);
        Self {
            state: State::Rejected { response },
            config,
            request_id,
        }
    }

    /// Take the lock on `resource`, then call `inner` (already polled ready).
    pub(crate) fn acquiring(
        redlock: Redlock,
        resource: String,
        inner: S,
        request: Request<ReqBody>,
        request_id: Option<String>,
        config: Arc<Config>,
    ) -> Self {
        let (ttl, retry, fencing) = (config.ttl, config.retry, config.fencing);
        let name = resource.clone();
        let acquire: AcquireFuture = Box::pin(async move {
            let acquire = redlock.lock(name).ttl(ttl).retry(retry);
            match fencing {
                Some(on) => acquire.fencing(on).await,
                None => acquire.await,
            }
            .map(Held::Lock)
        });
        Self::holding(acquire, resource, inner, request, request_id, config, true)
    }

    /// Run `acquire` (what the request is to hold, named `resource` in the log and in
    /// rejections), then call `inner` (already polled ready). `expose`: whether the
    /// handler finds a `LockHandle` for it in the request's extensions.
    pub(crate) fn holding(
        acquire: AcquireFuture,
        resource: String,
        inner: S,
        request: Request<ReqBody>,
        request_id: Option<String>,
        config: Arc<Config>,
        expose: bool,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                resource,
                inner,
                request,
                started: Instant::now(),
                expose,
            },
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
                    let next = match acquired {
                        Ok(mut lock) => {
                            lock.auto_extend(this.config.max_hold);
                            tracing::debug!(
                                key = %resource,
                                waited_ms = started.elapsed().as_millis() as u64,
                                attempts = lock.attempts(),
                                validity_ms = lock.validity().as_millis() as u64,
                                "lock acquired"
                            );
                            if expose {
                                request.extensions_mut().insert(lock.handle());
                            }
                            let guard = Guard::new(lock, Instant::now(), this.config.abort_on_loss);
                            State::Running {
                                future: inner.call(request),
                                guard: Some(guard),
                            }
                        }
                        Err(error) => match refusal(
                            this.config,
                            &resource,
                            this.request_id.as_deref(),
                            &error,
                            started,
                        ) {
                            Some((kind, problem)) => State::Rejected {
                                response: render(
                                    this.config,
                                    kind,
                                    Some(&resource),
                                    problem.with_request_id(this.request_id.clone()),
                                    Some(&error),
                                ),
                            },
                            // Fail-open: through without a lock (and without a handle);
                            // the marker tells `FencingToken` why.
                            None => {
                                if expose {
                                    request.extensions_mut().insert(FailedOpen);
                                }
                                State::Running {
                                    future: inner.call(request),
                                    guard: None,
                                }
                            }
                        },
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
                        let problem =
                            Problem::lost_while_running().with_request_id(this.request_id.clone());
                        let response =
                            render(this.config, RejectionKind::Lost, Some(&key), problem, None);
                        return Poll::Ready(Ok(response.map(LockBody::full)));
                    }
                    let output = match future.poll(cx) {
                        Poll::Ready(output) => output,
                        Poll::Pending => return Poll::Pending,
                    };
                    let guard = match this.config.hold {
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

/// What to answer for an acquisition error: `None` lets the request through unlocked
/// (fail-open on a backend failure).
fn refusal(
    config: &Config,
    resource: &str,
    request_id: Option<&str>,
    error: &Error,
    started: Instant,
) -> Option<(RejectionKind, Problem)> {
    let waited_ms = started.elapsed().as_millis() as u64;
    let mut problem = Problem::from_error(error);
    // The body is generic (see `Problem::from_error`); the details go to the log.
    match error.class() {
        ErrorClass::Contended { .. } => {
            tracing::debug!(key = %resource, request_id, waited_ms, error = %error, "lock busy: request refused");
            problem.status = config.busy_status.as_u16();
            Some((RejectionKind::Busy, problem))
        }
        ErrorClass::InvalidResource => {
            tracing::debug!(key = %resource, request_id, error = %error, "lock key refused");
            Some((RejectionKind::Key, problem))
        }
        ErrorClass::InvalidInput => {
            tracing::error!(key = %resource, request_id, error = %error, "lock refused as misconfigured");
            Some((RejectionKind::Misconfigured, problem))
        }
        _ if config.fail_open => {
            tracing::warn!(key = %resource, request_id, waited_ms, error = %error, "lock service unavailable: fail-open, serving the request WITHOUT a lock");
            None
        }
        _ => {
            tracing::warn!(key = %resource, request_id, waited_ms, error = %error, "lock service unavailable: request refused (fail-closed)");
            Some((RejectionKind::Unavailable, problem))
        }
    }
}

/// The response for a rejection: the hook's, or the problem+json default.
fn render(
    config: &Config,
    kind: RejectionKind,
    key: Option<&str>,
    problem: Problem,
    error: Option<&Error>,
) -> RejectionResponse {
    let rejection = Rejection {
        kind,
        key,
        problem,
        error,
    };
    match &config.on_rejection {
        Some(hook) => hook(&rejection),
        None => rejection.to_response(),
    }
}
