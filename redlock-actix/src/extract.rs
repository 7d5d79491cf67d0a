//! Key extractors of [`LockMiddleware`](crate::LockMiddleware): which lock (if any) a
//! request needs, by the rule that `redlock-tower` follows too ([`redlock_http::key`]).
//!
//! A [`KeyExtractor`] looks at a request and answers with a [`Key`]:
//!
//! - [`Key::Lock`]: serialize this request with every other request of the same key;
//! - [`Key::Pass`]: no lock, the request goes straight through;
//! - [`Key::Reject`]: refuse the request (by default `400 Bad Request`, for a missing or
//!   malformed key), with a [`Problem`](redlock_http::Problem) saying why.
//!
//! Built in, with the names and keys of `redlock_tower::extract`: [`Header`]
//! (optionally required), [`PathParam`], [`PathPrefix`], [`Global`]. Any closure
//! `Fn(&ServiceRequest) -> Result<Option<K>, BadKey>` with `K:` [`LockKey`] is an
//! extractor too (`None` passes the request through, as in `redlock-tower`), and
//! [`from_fn`] wraps a closure that returns a full [`Key`].
//!
//! ```
//! use actix_web::test::TestRequest;
//! use redlock_actix::extract::{Global, Header, Key, KeyExtractor, PathPrefix};
//!
//! let pay = TestRequest::post()
//!     .uri("/orders/42/pay")
//!     .insert_header(("idempotency-key", "a:b"))
//!     .to_srv_request();
//!
//! // The header's value is the key, escaped as in redlock-tower: `a:b` locks `a%3Ab`.
//! let by_header = Header::new("idempotency-key").required();
//! assert_eq!(by_header.extract(&pay), Key::Lock("a%3Ab".into()));
//! let bare = TestRequest::post().uri("/orders/42/pay").to_srv_request();
//! assert_eq!(by_header.extract(&bare).rejection().map(|p| p.status), Some(400));
//!
//! // The prefix and the next segment: every request under /orders/42 shares a key.
//! assert_eq!(PathPrefix::new("/orders").extract(&pay), Key::Lock("/orders/42".into()));
//!
//! // One key for everything.
//! assert_eq!(Global::new("migrations").extract(&bare), Key::Lock("migrations".into()));
//! ```

use actix_web::dev::ServiceRequest;
use redlock_http::key::BadKey;

use crate::key::LockKey;

pub use redlock_http::extract::{Global, PathParam, PathPrefix};
pub use redlock_http::key::Key;

/// Names the lock a request takes in [`LockMiddleware`](crate::LockMiddleware). See the
/// [module documentation](self).
///
/// Implemented for closures `Fn(&ServiceRequest) -> Result<Option<K>, BadKey>` where
/// `K:` [`LockKey`], with the meaning `redlock-tower`'s closures have: `Ok(Some(value))`
/// locks by the value's key ([`LockKey::lock_key`]: a string is escaped as tower's
/// closures' strings are), `Ok(None)` passes the request through, `Err` refuses it with
/// `400`; and for [`PathParam`], [`Header`],
/// [`PathPrefix`], [`Global`] and [`from_fn`]. A [`Key::Lock`] you return yourself is
/// the final key.
pub trait KeyExtractor: 'static {
    /// Decides the key for `req` (without the configuration's resource prefix).
    fn extract(&self, req: &ServiceRequest) -> Key;
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&ServiceRequest) -> Result<Option<K>, BadKey> + 'static,
    K: LockKey,
{
    fn extract(&self, req: &ServiceRequest) -> Key {
        match self(req) {
            Ok(Some(value)) => Key::from(value.lock_key()),
            Ok(None) => Key::Pass,
            Err(bad) => Key::Reject(bad.problem()),
        }
    }
}

/// An extractor from a closure returning a full [`Key`] (to pass requests through or
/// reject them), as `redlock_tower::extract::from_fn`.
///
/// ```
/// use actix_web::dev::ServiceRequest;
/// use redlock_actix::extract::{Key, from_fn};
///
/// // Lock POSTs per tenant; let everything else through.
/// let by_tenant = from_fn(|req: &ServiceRequest| match req.headers().get("x-tenant") {
///     Some(tenant) if req.method() == actix_web::http::Method::POST => {
///         Key::from_value(tenant.to_str().ok())
///     }
///     _ => Key::Pass,
/// });
/// # let redlock = redlock_core::Redlock::builder().node("redis://127.0.0.1:6379").build().unwrap();
/// # let _ = redlock_actix::LockMiddleware::new(redlock_actix::DistributedLockConfig::new(redlock), by_tenant);
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F> {
    FromFn(f)
}

/// See [`from_fn`].
#[derive(Debug, Clone, Copy)]
pub struct FromFn<F>(F);

impl<F> KeyExtractor for FromFn<F>
where
    F: Fn(&ServiceRequest) -> Key + 'static,
{
    fn extract(&self, req: &ServiceRequest) -> Key {
        (self.0)(req)
    }
}

/// The key is a path parameter of the scope or resource, e.g. `id` in
/// `web::scope("/accounts/{id}")` (as `redlock_tower::extract::PathParam` for axum):
/// percent-decoded (UTF-8, else `400`), then escaped ([`redlock_http::key::path_param_key`]).
/// A route without the parameter is the server's mistake: `500`, its detail in the log.
///
/// A value that is not UTF-8 once decoded is refused with `400`, as in tower; note that
/// actix's own `web::Path<String>` (the [`DistributedLock`](crate::DistributedLock)
/// extractor's inner value) decodes it lossily instead, with U+FFFD in place of the
/// invalid bytes.
impl KeyExtractor for PathParam {
    fn extract(&self, req: &ServiceRequest) -> Key {
        // actix leaves `%`, `/` and `+` encoded in `match_info`; decoding the rest gives
        // what decoding the request path gives.
        let value = req.match_info().get(self.name());
        // But it replaces bytes that are not UTF-8 with U+FFFD: refused, as in tower.
        if value.is_some_and(|v| v.contains('\u{FFFD}'))
            && redlock_http::key::decode_path_segment(req.path()).is_err()
        {
            return redlock_http::key::path_param_not_utf8(self.name());
        }
        self.key(value)
    }
}

/// The key is a request header's value, e.g. `Idempotency-Key` or a tenant id (as
/// `redlock_tower::extract::Header`, by the same rule:
/// [`redlock_http::key::header_lock_key`]).
///
/// Without the header the request passes through unlocked, or, once
/// [`required`](Self::required), is refused with `400`. A value given twice, empty, or
/// not visible ASCII is always refused with `400`. `Idempotency-Key: a:b` locks
/// `a%3Ab`.
#[derive(Debug, Clone)]
pub struct Header {
    name: &'static str,
    // Whether `name` is a valid header name (else every request is answered 500).
    valid: bool,
    required: bool,
}

impl Header {
    /// The key from header `name` (any case). A `name` that is not a valid header name
    /// (a programming error) makes every request answered `500`, the name in the
    /// server's log, as in `redlock-tower`.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            valid: actix_web::http::header::HeaderName::from_bytes(name.as_bytes()).is_ok(),
            required: false,
        }
    }

    /// Refuse requests without the header (`400`) instead of letting them through.
    #[must_use]
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// The header's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl KeyExtractor for Header {
    fn extract(&self, req: &ServiceRequest) -> Key {
        if !self.valid {
            return Key::Reject(redlock_http::Problem::misconfigured(format!(
                "`{}` given to `redlock_actix::extract::Header::new` is not a valid header name",
                self.name
            )));
        }
        let values = req
            .headers()
            .get_all(self.name)
            .map(actix_web::http::header::HeaderValue::as_bytes);
        redlock_http::key::header_lock_key(self.name, values, self.required)
    }
}

/// The path as sent (actix shows it whole under a scope): [`redlock_http::key::sent_path`].
impl KeyExtractor for PathPrefix {
    fn extract(&self, req: &ServiceRequest) -> Key {
        self.key(redlock_http::key::sent_path(req.path(), None))
    }
}

impl KeyExtractor for Global {
    fn extract(&self, _req: &ServiceRequest) -> Key {
        self.key()
    }
}
