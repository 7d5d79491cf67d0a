//! [`DistributedLock`]: the extractor holding the lock.

use std::ops::{Deref, DerefMut};

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use futures_util::future::LocalBoxFuture;
use redlock_core::Released;

use crate::config::DistributedLockConfig;
use crate::error::DistributedLockError;
use crate::fencing::Acquiring;
use crate::guard::LockGuard;
use crate::key::LockKey;

/// An extractor that holds the cluster-wide lock named by the inner extractor's value for
/// as long as it lives: the handler body runs only while this replica holds the lock.
///
/// `T` is any extractor whose value implements [`LockKey`] (`web::Path<u64>`,
/// `web::Path<(String, u32)>`, `web::Query<MyParams>`, [`LockHeader<N>`](crate::key::LockHeader),
/// a tuple of them…). Extraction runs `T` first: its own errors (a bad path segment →
/// 404, a bad query → 400) are its own responses. Then the lock on
/// `resource_prefix + key` is
/// taken by the innermost [`DistributedLockConfig`] (see there: TTL, wait policy,
/// prefix, rejection hook), auto-extended while held, and released when the extractor is
/// dropped, that is when the handler returns (or by [`release`](Self::release)).
/// Rejections are [`DistributedLockError`]s: busy → 409, no quorum → 503, bad key →
/// 400, no configuration → 500. Of the configuration's options, `hold`, `fail_open`
/// and `abort_on_loss` are the middleware's: the extractor's value is the held lock,
/// kept as long as the handler keeps it (see [`LockOptions::fail_open`](crate::LockOptions::fail_open) and
/// [`LockOptions::abort_on_loss`](crate::LockOptions::abort_on_loss)).
///
/// Once the lock is held, its [`LockHandle`](redlock_core::LockHandle) is also put into the
/// request's extensions, so that a [`FencingToken`](crate::FencingToken) argument of the
/// same handler gets the lock's fencing token (with
/// [`fencing`](crate::LockOptions::fencing) on), as under
/// [`LockMiddleware`](crate::LockMiddleware).
///
/// It dereferences to `T`. To keep the lock while a streaming body is sent, take it
/// apart with [`into_parts`](Self::into_parts) and wrap the body with
/// [`LockGuard::hold_during`].
///
/// ```
/// use std::time::Duration;
/// use actix_web::{App, HttpResponse, test, web};
/// use redlock_actix::{DistributedLock, DistributedLockConfig, LockOptions};
/// use redlock_core::Redlock;
///
/// async fn pay(order: DistributedLock<web::Path<u64>>) -> HttpResponse {
///     // Only one replica at a time gets here for a given order.
///     assert!(order.guard().is_held());
///     HttpResponse::Ok().body(format!("paid {} under {}", *order, order.guard().resource()))
/// }
///
/// # #[actix_web::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let cluster = redlock_testkit::Cluster::start(3).await;
/// # let urls = cluster.urls();
/// // `urls`: three independent Redis masters, e.g. "redis://10.0.0.1:6379".
/// let redlock = Redlock::builder()
///     .nodes(urls)
/// #   .restart_quarantine(false) // the test nodes were started a moment ago
///     .build()?;
/// let config = DistributedLockConfig::new(redlock.clone()).options(
///     LockOptions::new()
///         .ttl(Duration::from_secs(5))
///         .resource_prefix("order:"),
/// );
/// let app = test::init_service(
///     App::new().app_data(config).route("/orders/{id}/pay", web::post().to(pay)),
/// )
/// .await;
///
/// let response = test::call_service(&app, test::TestRequest::post().uri("/orders/42/pay").to_request()).await;
/// assert_eq!(response.status(), 200);
/// assert_eq!(test::read_body(response).await, "paid 42 under order:42");
///
/// // While another replica holds order 42, this one answers 409 at once.
/// let held = redlock.lock("order:42").await?;
/// let busy = test::call_service(&app, test::TestRequest::post().uri("/orders/42/pay").to_request()).await;
/// assert_eq!(busy.status(), 409);
/// assert!(busy.headers().contains_key("retry-after"));
/// held.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct DistributedLock<T> {
    inner: T,
    guard: LockGuard,
}

impl<T: std::fmt::Debug> std::fmt::Debug for DistributedLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedLock")
            .field("inner", &self.inner)
            .field("guard", &self.guard)
            .finish()
    }
}

impl<T> DistributedLock<T> {
    /// The lock: whether it is still held, its loss, fencing token, resource.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The inner extractor's value and the lock guard, e.g. to move the guard into a
    /// streaming body ([`LockGuard::hold_during`]). The lock is then released when the
    /// guard is dropped.
    pub fn into_parts(self) -> (T, LockGuard) {
        (self.inner, self.guard)
    }

    /// Releases the lock now (the inner value is dropped; take what you need from it
    /// first, or use [`into_parts`](Self::into_parts)).
    ///
    /// # Errors
    ///
    /// See [`LockGuard::release`].
    pub async fn release(self) -> Result<Released, DistributedLockError> {
        self.guard.release().await
    }
}

impl<T> Deref for DistributedLock<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for DistributedLock<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T> FromRequest for DistributedLock<T>
where
    T: FromRequest + LockKey + 'static,
    T::Future: 'static,
{
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let inner = T::from_request(req, payload);
        // A `FencingToken` argument waits until this is dropped: after the handle is in
        // the extensions, or on any failure.
        let acquiring = Acquiring::start(req);
        let req = req.clone();
        Box::pin(async move {
            let _acquiring = acquiring;
            // The inner extractor's errors are its own responses.
            let inner = inner.await.map_err(Into::into)?;
            let Some(config) = DistributedLockConfig::from_req(&req).cloned() else {
                return Err(DistributedLockError::MissingConfig.respond(&req));
            };
            let resource = match inner.lock_key().and_then(|key| config.resource(&key)) {
                Ok(resource) => resource,
                Err(bad) => return Err(config.reject(bad.into(), None, &req)),
            };
            match config.acquire(resource.clone()).await {
                Ok(guard) => {
                    // For `FencingToken` (and `web::ReqData<LockHandle>`), as the
                    // middleware does.
                    req.extensions_mut().insert(guard.handle());
                    Ok(Self { inner, guard })
                }
                Err(err) => Err(config.reject(err, Some(&resource), &req)),
            }
        })
    }
}
