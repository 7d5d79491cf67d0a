//! Fencing tokens: [`FencingToken`], the fencing token of the request's lock, as an extractor;
//! [`TokenFuture`], its future; [`MissingToken`], why a request has none.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use redlock_core::LockHandle;

use crate::config::DistributedLockConfig;
use crate::error::DistributedLockError;

pub use redlock_http::MissingToken;

/// The fencing token of the request's lock: strictly greater for every new holder of
/// the lock's key, to pass to the storage with each write so that it can refuse a
/// writer whose lock has expired and been taken since (see `redlock-fence`).
///
/// An extractor reading the [`LockHandle`] in the request's extensions, which
/// [`LockMiddleware`](crate::LockMiddleware) puts there before the handler runs, and a
/// [`DistributedLock`](crate::DistributedLock) argument of the same handler once it
/// holds its lock (whatever the arguments' order: the token waits for the lock). The
/// lock must be taken with fencing on
/// ([`LockOptions::fencing`](crate::LockOptions::fencing), or the
/// client's [`fencing`](redlock_core::RedlockBuilder::fencing) setting).
///
/// Without a token the handler is not called: a request that holds no lock is refused
/// with [`DistributedLockError::NoLock`], a lock without a token with
/// [`DistributedLockError::NoFencingToken`], both `500` (through the configuration's
/// [`on_refusal`](crate::DistributedLockConfig::on_refusal) hook when there is one). A
/// request that [`LockMiddleware`](crate::LockMiddleware) let through unlocked
/// ([`fail_open`](crate::LockOptions::fail_open)) is answered `503`
/// ([`DistributedLockError::FailedOpen`]), as in `redlock-tower`.
/// The body says which of the two it is and nothing of the server's insides; the log
/// names the setting to change.
///
/// With several locks in one handler, the token is the last acquired one's: read each
/// lock's own with [`LockGuard::fencing_token`](crate::guard::LockGuard::fencing_token).
///
/// ```
/// use actix_web::{App, HttpResponse, test, web};
/// use redlock_actix::{DistributedLock, DistributedLockConfig, FencingToken, LockOptions};
/// use redlock_core::Redlock;
///
/// async fn pay(order: DistributedLock<web::Path<u64>>, token: FencingToken) -> HttpResponse {
///     // e.g. `SqlFence::check(&mut *tx, order.guard().resource(), token.0)` before the write
///     HttpResponse::Ok().body(format!("paid {} with token {}", *order, token.0))
/// }
///
/// # #[actix_web::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let cluster = redlock_testkit::Cluster::start(1).await;
/// # let urls = cluster.urls();
/// let redlock = Redlock::builder()
///     .nodes(urls)
/// #   .restart_quarantine(false) // the test node was started a moment ago
///     .build()?;
/// let config = DistributedLockConfig::new(redlock)
///     .options(LockOptions::new().resource_prefix("order:").fencing(true));
/// let app = test::init_service(
///     App::new().app_data(config).route("/orders/{id}/pay", web::post().to(pay)),
/// )
/// .await;
///
/// let request = test::TestRequest::post().uri("/orders/42/pay").to_request();
/// let body = test::call_and_read_body(&app, request).await;
/// assert!(body.starts_with(b"paid 42 with token "));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token's value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The token of the lock in `req`'s extensions, as it stands now (a
    /// [`DistributedLock`](crate::DistributedLock) still being acquired is not waited
    /// for; the extractor does that).
    ///
    /// # Errors
    ///
    /// [`DistributedLockError::NoLock`], [`DistributedLockError::NoFencingToken`], or
    /// [`DistributedLockError::FailedOpen`] (the [`MissingToken`]
    /// reasons of both web crates).
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

/// The future of the [`FencingToken`] extractor: ready once no
/// [`DistributedLock`](crate::DistributedLock) of the request is still being acquired.
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
        Poll::Ready(FencingToken::from_req(req).map_err(
            |err| match DistributedLockConfig::from_req(req) {
                Some(config) => config.reject(err, None, req),
                None => err.respond(req),
            },
        ))
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
