//! [`ClusterLimitMiddleware`]: at most `limit` concurrent requests per key, across
//! every replica.

use std::future::{Ready, ready};
use std::rc::Rc;

use actix_web::HttpResponse;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use redlock_core::Redlock;
use redlock_http::{LimitOptions, Refusal};
use tokio::runtime::Handle;

use crate::config::Setup;
use crate::extract::{Header, KeyExtractor, PathParam};

use super::ClusterLimitService;

/// At most `limit` requests per key at once, across every replica: a cluster-wide
/// counterpart of a local concurrency limit, and the actix counterpart of
/// `redlock-tower`'s `ClusterLimitLayer` (the same options type,
/// [`LimitOptions`](crate::LimitOptions), and the same answers).
///
/// `wrap()` it around a scope, a resource or the whole app. Each request takes a key
/// from a [`KeyExtractor`] ([`extract`](crate::extract): a path parameter, a header such
/// as the tenant's, a closure), and a permit of the cluster-wide semaphore
/// ([`Redlock::semaphore`]) named `resource_prefix + key` with `limit` permits. The
/// permit is auto-extended while the handler runs (a handler may run far longer than
/// the TTL), up to `max_hold`, and kept until the response body has been sent or
/// dropped (`hold`). Requests of other keys are not limited by it; a request whose key
/// extractor answers [`Key::Pass`](crate::extract::Key::Pass) goes through unlimited.
///
/// Answers, as `application/problem+json` (or [`on_refusal`](Self::on_refusal)'s
/// responses): the limit reached: `busy_status` (default `429 Too Many Requests`) with
/// `Retry-After`; no quorum of Redis nodes: `503` with `Retry-After`, or the request
/// goes through unlimited with `fail_open`; the permit lost while the handler runs,
/// with `abort_on_loss`: `503`; a bad key: `400`; a limit of 0, or a TTL the client
/// refuses: `500` (at request time; nothing panics).
///
/// Responses come out boxed ([`BoxBody`]): the body of a request holding a permit
/// keeps it until it ends.
///
/// As with the crate's other middleware, every call into the client runs on one
/// long-lived runtime (the crate's own thread, or [`runtime`](Self::runtime)), never on
/// an actix worker's (see [Runtimes](crate::DistributedLockConfig#runtimes)).
///
/// ```
/// use std::time::Duration;
///
/// use actix_web::{App, HttpResponse, web};
/// use redlock_actix::{ClusterLimitMiddleware, Hold, LimitOptions, error::problem_response};
/// use redlock_core::Redlock;
///
/// async fn report(tenant: web::Path<String>) -> HttpResponse {
///     HttpResponse::Ok().body(format!("report for {tenant}"))
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let redlock = Redlock::builder().node("redis://127.0.0.1:6379").build()?;
/// let per_tenant = LimitOptions::new(3).resource_prefix("reports:");
/// let app = App::new().service(
///     web::scope("/tenants/{tenant}")
///         // at most 3 reports per tenant at once, across every replica
///         .wrap(ClusterLimitMiddleware::path_param(redlock.clone(), "tenant", per_tenant))
///         .route("/report", web::get().to(report)),
/// );
/// # let _ = app;
///
/// let options = LimitOptions::new(2)
///     .resource_prefix("export:")
///     .ttl(Duration::from_secs(5)) // extended while the request runs
///     .wait(Duration::from_secs(1)) // then 429
///     .hold(Hold::UntilHead) // the body is sent without the permit
///     .max_hold(Duration::from_secs(60))
///     .abort_on_loss(true); // a lost permit: 503, not a request past the limit
/// let limit = ClusterLimitMiddleware::header(redlock, "x-tenant", options).on_refusal(|refusal| {
///     tracing::info!(kind = ?refusal.kind, "export refused");
///     problem_response(&refusal.problem)
/// });
/// # let _ = limit;
/// # Ok(())
/// # }
/// ```
pub struct ClusterLimitMiddleware<K> {
    key: Rc<K>,
    setup: Rc<(Setup, LimitOptions)>,
}

impl<K> Clone for ClusterLimitMiddleware<K> {
    fn clone(&self) -> Self {
        Self {
            key: Rc::clone(&self.key),
            setup: Rc::clone(&self.setup),
        }
    }
}

impl<K> std::fmt::Debug for ClusterLimitMiddleware<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterLimitMiddleware")
            .field("setup", &self.setup)
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor> ClusterLimitMiddleware<K> {
    /// Limits each request by `key` (typically a closure
    /// `|req: &ServiceRequest| -> Result<Option<impl LockKey>, BadKey>`), counted
    /// through `redlock`, by `options` (the limit and the rest).
    ///
    /// A limit of `0`, or a resource prefix that leaves no room for a key, is logged
    /// here and answered `500` at request time.
    pub fn new(redlock: Redlock, key: K, options: LimitOptions) -> Self {
        options.check(&redlock);
        Self {
            key: Rc::new(key),
            setup: Rc::new((Setup::new(redlock), options)),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Setup)) -> Self {
        change(&mut Rc::make_mut(&mut self.setup).0);
        self
    }

    /// Build refusal responses yourself (default: an `application/problem+json`
    /// document), as [`DistributedLockConfig::on_refusal`](crate::DistributedLockConfig::on_refusal).
    #[must_use]
    pub fn on_refusal<F>(self, hook: F) -> Self
    where
        F: Fn(&Refusal) -> HttpResponse + Send + Sync + 'static,
    {
        self.with(|s| s.on_refusal = Some(std::sync::Arc::new(hook)))
    }

    /// Runs the client's calls on this runtime instead of the crate's own thread.
    #[must_use]
    pub fn runtime(self, handle: Handle) -> Self {
        self.with(|s| s.runtime = Some(handle))
    }

    /// The options.
    pub fn options(&self) -> &LimitOptions {
        &self.setup.1
    }

    /// The longest key taken under the prefix and limit ([`LimitOptions::room`]).
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`](redlock_http::key::KeyBoundError::NoRoom) when the prefix
    /// leaves none.
    pub fn room(&self) -> Result<redlock_http::key::KeyRoom, redlock_http::key::KeyBoundError> {
        self.setup.1.room(&self.setup.0.redlock)
    }
}

impl ClusterLimitMiddleware<PathParam> {
    /// Limits each request by the path parameter `name` (shorthand for
    /// `ClusterLimitMiddleware::new(redlock, PathParam::new(name), options)`).
    pub fn path_param(redlock: Redlock, name: impl Into<String>, options: LimitOptions) -> Self {
        Self::new(redlock, PathParam::new(name), options)
    }
}

impl ClusterLimitMiddleware<Header> {
    /// Limits each request by the header `name`; a request without it goes through
    /// unlimited (shorthand for `ClusterLimitMiddleware::new(redlock, Header::new(name), options)`).
    pub fn header(redlock: Redlock, name: &'static str, options: LimitOptions) -> Self {
        Self::new(redlock, Header::new(name), options)
    }
}

impl<S, B, K> Transform<S, ServiceRequest> for ClusterLimitMiddleware<K>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = actix_web::Error;
    type Transform = ClusterLimitService<S, K>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(ClusterLimitService {
            service: Rc::new(service),
            key: Rc::clone(&self.key),
            setup: Rc::clone(&self.setup),
        }))
    }
}
