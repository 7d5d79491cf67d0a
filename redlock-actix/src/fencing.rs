//! [`FencingToken`], the request's lock's fencing token as an extractor, and its future.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use redlock_core::LockHandle;

use crate::error::DistributedLockError;

pub use redlock_http::MissingToken;

/// The fencing token of the request's lock (with
/// [`LockOptions::fencing`](crate::LockOptions::fencing) on), to pass with each write so
/// that the storage refuses a writer whose lock has expired (`redlock-fence`). An
/// extractor: it reads the lock of [`LockMiddleware`](crate::LockMiddleware) or of a
/// [`DistributedLock`](crate::DistributedLock) argument (waiting for it); without a token
/// the request is refused ([`MissingToken`]: 500, or 503 after `fail_open`).
///
/// ```
/// use actix_web::HttpResponse;
/// use redlock_actix::{DistributedLock, FencingToken};
///
/// async fn pay(order: DistributedLock<actix_web::web::Path<u64>>, token: FencingToken) -> HttpResponse {
///     HttpResponse::Ok().body(format!("paid {} with token {}", *order, token.0))
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token's value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The token of the lock in `req`'s extensions now (not waiting for one being taken).
    ///
    /// # Errors
    ///
    /// [`DistributedLockError::NoLock`], [`DistributedLockError::NoFencingToken`] or
    /// [`DistributedLockError::FailedOpen`].
    pub fn from_req(req: &HttpRequest) -> Result<Self, DistributedLockError> {
        let extensions = req.extensions();
        match extensions.get::<LockHandle>() {
            None if extensions.get::<FailedOpen>().is_some() => {
                Err(DistributedLockError::FailedOpen)
            }
            None => Err(DistributedLockError::NoLock),
            Some(lock) => lock
                .fencing_token()
                .map(Self)
                .ok_or(DistributedLockError::NoFencingToken),
        }
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromRequest for FencingToken {
    type Error = actix_web::Error;
    type Future = TokenFuture;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        // Read when polled, not now: actix-web creates every argument's future before
        // polling any, so a `DistributedLock` argument has not registered yet.
        TokenFuture { req: req.clone() }
    }
}

/// The future of the [`FencingToken`] extractor: ready once no lock of the request is
/// still being acquired.
pub struct TokenFuture {
    req: HttpRequest,
}

impl fmt::Debug for TokenFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenFuture").finish_non_exhaustive()
    }
}

impl Future for TokenFuture {
    type Output = Result<FencingToken, actix_web::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let req = &self.req;
        let acquiring = req.extensions().get::<Acquiring>().cloned();
        if let Some(acquiring) = acquiring
            && acquiring.0.count.get() > 0
        {
            acquiring.wait(cx.waker());
            return Poll::Pending;
        }
        Poll::Ready(FencingToken::from_req(req).map_err(|err| err.reject(req, None)))
    }
}

/// In the request's extensions when [`LockMiddleware`](crate::LockMiddleware) let it
/// through without a lock (fail-open): tells [`FencingToken`] why there is none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FailedOpen;

/// In the request's extensions while a [`DistributedLock`](crate::DistributedLock) of it
/// is being acquired, for [`FencingToken`] to wait on.
#[derive(Clone, Default)]
pub(crate) struct Acquiring(Rc<AcquiringState>);

#[derive(Default)]
struct AcquiringState {
    count: Cell<usize>,
    waiters: RefCell<Vec<Waker>>,
}

impl Acquiring {
    /// Registers an acquisition for `req`, until the returned value is dropped (after the
    /// lock's handle is in the extensions, or on failure).
    pub(crate) fn start(req: &HttpRequest) -> AcquiringGuard {
        let acquiring = req
            .extensions_mut()
            .get_or_insert_with(Self::default)
            .clone();
        acquiring.0.count.set(acquiring.0.count.get() + 1);
        AcquiringGuard(acquiring)
    }

    fn wait(&self, waker: &Waker) {
        let mut waiters = self.0.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(waker)) {
            waiters.push(waker.clone());
        }
    }
}

/// See [`Acquiring::start`].
pub(crate) struct AcquiringGuard(Acquiring);

impl Drop for AcquiringGuard {
    fn drop(&mut self) {
        let state = &self.0.0;
        state.count.set(state.count.get().saturating_sub(1));
        if state.count.get() == 0 {
            for waker in state.waiters.take() {
                waker.wake();
            }
        }
    }
}
