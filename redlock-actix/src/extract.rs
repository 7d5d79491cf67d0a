//! Key extractors of [`LockMiddleware`](crate::LockMiddleware) and
//! [`ClusterLimitMiddleware`](crate::ClusterLimitMiddleware), with the names and keys of
//! `redlock_tower::extract` ([`redlock_http::key`]): [`Header`], [`PathParam`],
//! [`PathPrefix`], [`Global`], [`from_fn`] and closures.
//!
//! ```
//! use actix_web::test::TestRequest;
//! use redlock_actix::extract::{Header, Key, KeyExtractor};
//!
//! let pay = TestRequest::post().insert_header(("idempotency-key", "a:b")).to_srv_request();
//! assert_eq!(Header::new("idempotency-key").extract(&pay), Key::Lock("a%3Ab".into()));
//! ```

use actix_web::dev::ServiceRequest;
use redlock_http::key::BadKey;

use crate::key::LockKey;

pub use redlock_http::extract::{Global, PathParam, PathPrefix};
pub use redlock_http::key::Key;

/// Names the lock (or limit) a request takes. A closure
/// `Fn(&ServiceRequest) -> Result<Option<K>, BadKey>` (`K:` [`LockKey`]) is one:
/// `Ok(Some(value))` locks by the value's key, `Ok(None)` passes the request, `Err`
/// refuses it with `400`, as in `redlock-tower`.
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

/// An extractor from a closure returning a full [`Key`], as
/// `redlock_tower::extract::from_fn`.
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

/// A path parameter of the scope (e.g. `id` in `/accounts/{id}`), by
/// [`redlock_http::key::path_param_key`]: not UTF-8 once decoded → `400` (where actix's
/// `web::Path<String>` decodes lossily), missing → `500`.
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

/// A request header's value (by [`redlock_http::key::header_lock_key`]): without it, the
/// request passes, or is refused with `400` once [`required`](Self::required).
#[derive(Debug, Clone)]
pub struct Header {
    name: &'static str,
    // Whether `name` is a valid header name (else every request is answered 500).
    valid: bool,
    required: bool,
}

impl Header {
    /// The key from header `name` (any case; an invalid name answers every request `500`).
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            valid: actix_web::http::header::HeaderName::from_bytes(name.as_bytes()).is_ok(),
            required: false,
        }
    }

    /// Refuse requests without the header (`400`).
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
