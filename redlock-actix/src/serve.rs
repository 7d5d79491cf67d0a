//! One request through a [`GuardMiddleware`](crate::lock::GuardMiddleware): the
//! engine's decision (`redlock_http`: route, acquire, refuse), translated to actix.

use std::time::Instant;

use actix_web::HttpMessage;
use actix_web::body::{BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use futures_util::future::{Either, LocalBoxFuture, select};
use redlock_core::semaphore::Permit;
use redlock_http::guard::Route;
use redlock_http::key::Key;
use redlock_http::{Guard, Hold, LimitOptions, LockOptions, Refusal};

use crate::config::{Failure, Setup, take_lock};
use crate::error::request_id;
use crate::fencing::FailedOpen;
use crate::guard::{LockBody, LockGuard};
use crate::hold::{BodyHold, HoldingBody, Kept};

/// What a guarding middleware takes for a request: the engine's options, how what it
/// holds is taken and shown to the handler, and its response body.
pub trait Guarding: Guard + Clone + 'static {
    /// What a request holds while it runs.
    type Held: BodyHold + 'static;

    /// The middleware's response body.
    type Body<B: MessageBody + 'static>: MessageBody + 'static;

    /// The guarded body (left) or a refusal's (right) as the middleware's body.
    fn body<B: MessageBody + 'static>(
        body: EitherBody<HoldingBody<B, Self::Held>>,
    ) -> Self::Body<B>;

    /// Takes `resource` on the background runtime.
    fn take(
        &self,
        setup: &Setup,
        resource: String,
    ) -> LocalBoxFuture<'static, Result<Self::Held, Failure>>;

    /// Shows the held lock to the handler (its `LockHandle`), or why there is none.
    fn expose(&self, req: &ServiceRequest, held: Option<&Self::Held>);
}

/// The response of a guarded request: the handler's, with its body holding what the
/// request took (left), or a refusal or a request passed through (right).
pub(crate) type Guarded<B, H> = ServiceResponse<EitherBody<HoldingBody<B, H>, BoxBody>>;

/// `req` (whose extractor decided `key`) through `guarding`, then `service`.
pub(crate) async fn serve<S, B, G>(
    service: &S,
    setup: &Setup,
    guarding: &G,
    key: Key,
    req: ServiceRequest,
) -> Result<Guarded<B, G::Held>, actix_web::Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody + 'static,
    G: Guarding,
{
    let id = request_id(req.request());
    let passed =
        |response: ServiceResponse<B>| response.map_into_boxed_body().map_into_right_body();
    let resource = match guarding.route(&setup.redlock, key, id.as_deref()) {
        Route::Take(resource) => resource,
        Route::Refuse(refusal) => return Ok(refuse(setup, req, refusal, id)),
        _ => return Ok(passed(service.call(req).await?)),
    };
    let started = Instant::now();
    let held = match guarding.take(setup, resource.clone()).await {
        Ok(held) => held,
        Err(Failure::Lock(error)) => {
            match guarding.refuse(&resource, error, id.as_deref(), started.elapsed()) {
                Some(refusal) => return Ok(refuse(setup, req, refusal, id)),
                // Fail-open: through without a lock.
                None => {
                    guarding.expose(&req, None);
                    return Ok(passed(service.call(req).await?));
                }
            }
        }
        Err(Failure::Background(error)) => {
            tracing::error!(key = %resource, %error, "the lock's background task failed: request refused");
            return Ok(refuse(setup, req, Refusal::misconfigured(), id));
        }
    };
    guarding.expose(&req, Some(&held));
    let abort = guarding.aborts_on_loss();
    let response = if abort {
        // The request cannot be kept (actix routes it further by `Rc::get_mut`).
        let lost = Box::pin(held.handle().cancellation_token().cancelled_owned());
        let handler = Box::pin(service.call(req));
        match select(handler, lost).await {
            Either::Left((response, _)) => response?,
            Either::Right(((), handler)) => {
                // The handler's future is dropped where it stands, then the lock.
                drop(handler);
                let key = held.handle().resource().to_owned();
                drop(held);
                tracing::warn!(key = %key, request_id = id.as_deref(), "lock lost while the request ran (a majority of lock nodes could not extend it in time): request stopped");
                // Answered as the error of this service (the request went with the
                // handler): actix renders it with the response built here.
                let refusal = Refusal::lost_while_running()
                    .with_resource(key)
                    .with_request_id(id);
                let response = setup.render(&refusal);
                return Err(
                    actix_web::error::InternalError::from_response(refusal, response).into(),
                );
            }
        }
    } else {
        service.call(req).await?
    };
    let held = match guarding.held_until() {
        // Dropping it releases the lock.
        Hold::UntilHead => None,
        _ => Some(held),
    };
    Ok(response
        .map_body(move |_, body| HoldingBody::new(body, held, abort))
        .map_into_left_body())
}

/// `req` answered with `refusal` (with the request's id): the hook's response, or the
/// problem. An ordinary response, not an error, for outer middleware.
fn refuse<B, H>(
    setup: &Setup,
    req: ServiceRequest,
    refusal: Refusal,
    id: Option<String>,
) -> Guarded<B, H> {
    let refusal = refusal.with_request_id(id);
    let response = setup.render(&refusal);
    req.error_response(actix_web::error::InternalError::from_response(
        refusal, response,
    ))
    .map_into_right_body()
}

impl Guarding for LockOptions {
    type Held = LockGuard;
    type Body<B: MessageBody + 'static> = EitherBody<LockBody<B>>;

    fn body<B: MessageBody + 'static>(
        body: EitherBody<HoldingBody<B, LockGuard>>,
    ) -> Self::Body<B> {
        match body {
            EitherBody::Left { body } => EitherBody::left(LockBody::holding(body)),
            EitherBody::Right { body } => EitherBody::right(body),
        }
    }

    fn take(
        &self,
        setup: &Setup,
        resource: String,
    ) -> LocalBoxFuture<'static, Result<LockGuard, Failure>> {
        Box::pin(take_lock(setup, self, resource))
    }

    fn expose(&self, req: &ServiceRequest, held: Option<&LockGuard>) {
        let mut extensions = req.extensions_mut();
        match held {
            // For `web::ReqData<LockHandle>` and `FencingToken`.
            Some(guard) => drop(extensions.insert(guard.handle())),
            // Tells `FencingToken` why there is no lock (fail-open).
            None => drop(extensions.insert(FailedOpen)),
        }
    }
}

impl Guarding for LimitOptions {
    type Held = Kept<Permit>;
    type Body<B: MessageBody + 'static> = BoxBody;

    fn body<B: MessageBody + 'static>(body: EitherBody<HoldingBody<B, Kept<Permit>>>) -> BoxBody {
        body.boxed()
    }

    fn take(
        &self,
        setup: &Setup,
        resource: String,
    ) -> LocalBoxFuture<'static, Result<Kept<Permit>, Failure>> {
        let task = self.acquire(&setup.redlock, resource);
        let setup = setup.clone();
        Box::pin(async move {
            let (permit, runtime) = setup.run(task).await?;
            let handle = permit.handle();
            Ok(Kept::new(permit, handle, Instant::now(), runtime))
        })
    }

    // No `LockHandle` for the handler: a permit is no lock on the key.
    fn expose(&self, _req: &ServiceRequest, _held: Option<&Kept<Permit>>) {}
}
