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

/// An extractor holding the cluster-wide lock named by the inner extractor `T`'s value
/// ([`LockKey`]) while it lives, taken by the innermost [`DistributedLockConfig`] in
/// `app_data`: the handler runs only while this replica holds it. It dereferences to
/// `T`; `T`'s own errors are its own responses, refusals are [`DistributedLockError`]s.
/// Its [`LockHandle`](redlock_core::LockHandle) goes into the request's extensions, for a
/// [`FencingToken`](crate::FencingToken) argument.
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

    /// The inner value and the lock guard (e.g. for [`LockGuard::hold_during`]).
    pub fn into_parts(self) -> (T, LockGuard) {
        (self.inner, self.guard)
    }

    /// Releases the lock now (the inner value is dropped).
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
                return Err(DistributedLockError::MissingConfig.reject(&req, None));
            };
            let resource = match inner.lock_key().and_then(|key| config.resource(&key)) {
                Ok(resource) => resource,
                Err(bad) => return Err(DistributedLockError::from(bad).reject(&req, None)),
            };
            match config.acquire(resource.clone()).await {
                Ok(guard) => {
                    // For `FencingToken` (and `web::ReqData<LockHandle>`), as the
                    // middleware does.
                    req.extensions_mut().insert(guard.handle());
                    Ok(Self { inner, guard })
                }
                Err(err) => Err(err.reject(&req, Some(&resource))),
            }
        })
    }
}
