//! [`ResponseFuture`]: one request through the [`LockService`](crate::lock::LockService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use pin_project_lite::pin_project;
use redlock_core::Redlock;
use redlock_http::key::Key;
use redlock_http::{Hold, Refusal, Route};
use tower_service::Service;

use crate::body::LockBody;
use crate::config::{AcquireFuture, Config, Options};
use crate::fencing::FailedOpen;
use crate::guard::Guard;
use crate::response::RefusalResponse;

pin_project! {
    /// The response future of [`LockService`](crate::lock::LockService): acquiring the lock,
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
    pub(crate) fn start(
        redlock: &Redlock,
        config: Arc<Config>,
        key: Key,
        mut inner: S,
        request: Request<ReqBody>,
    ) -> Self {
        let request_id =
            redlock_http::problem::request_id(|name| request.headers().get(name)?.to_str().ok());
        let state = match config.guard().route(redlock, key, request_id.as_deref()) {
            Route::Take(resource) => State::Acquiring {
                acquire: config.acquire(redlock, resource.clone()),
                resource,
                inner,
                request,
                started: Instant::now(),
                // No `LockHandle` for a permit: it is no lock on the key, and would
                // hide the one of a `LockLayer` on the same route.
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
                    let next = match acquired {
                        Ok(lock) => {
                            if expose {
                                request.extensions_mut().insert(lock.lock().handle());
                            }
                            let guard = Guard::new(
                                lock,
                                Instant::now(),
                                this.config.guard().aborts_on_loss(),
                            );
                            State::Running {
                                future: inner.call(request),
                                guard: Some(guard),
                            }
                        }
                        Err(error) => match this.config.guard().refuse(
                            &resource,
                            error,
                            this.request_id.as_deref(),
                            started.elapsed(),
                        ) {
                            Some(refusal) => State::Rejected {
                                response: this
                                    .config
                                    .render(&refusal.with_request_id(this.request_id.clone())),
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
