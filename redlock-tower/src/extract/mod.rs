//! Key extractors: which lock (if any) a request needs, by the rule that
//! `redlock-actix` follows too ([`redlock_http::key`]).
//!
//! A [`KeyExtractor`] looks at a request and answers with a [`Key`]:
//!
//! - [`Key::Lock`]: serialize this request with every other request of the same key;
//! - [`Key::Pass`]: no lock, the request goes straight through;
//! - [`Key::Reject`]: refuse the request (by default `400 Bad Request`, for a missing or
//!   malformed key), with a [`Problem`](redlock_http::Problem) saying why.
//!
//! Built in: [`Header`] (optionally required), [`PathPrefix`], [`Global`], and, with the
//! `axum` feature, `PathParam` for a path parameter of an axum route. Any closure
//! `Fn(&http::Request<B>) -> Result<Option<V>, BadKey>` (`V` a string) is an
//! extractor too, with the meaning `redlock-actix`'s closures have: `Ok(Some(value))`
//! locks by the value's key, `Ok(None)` passes the request through, `Err(bad)` refuses
//! it with `400`. [`from_fn`] wraps a closure that returns a full [`Key`].
//!
//! ```
//! use http::Request;
//! use redlock_tower::extract::BadKey;
//! use redlock_tower::extract::{Global, Header, Key, KeyExtractor, PathPrefix};
//!
//! let pay = Request::post("/orders/42/pay")
//!     .header("idempotency-key", "7c1e")
//!     .body(())
//!     .unwrap();
//!
//! // The header's value is the key; without the header the request is refused (400).
//! let by_header = Header::new("idempotency-key").required();
//! assert_eq!(by_header.extract(&pay), Key::Lock("7c1e".into()));
//! let bare = Request::post("/orders/42/pay").body(()).unwrap();
//! assert_eq!(by_header.extract(&bare).rejection().map(|p| p.status), Some(400));
//!
//! // The prefix and the next segment: every request under /orders/42 shares a key.
//! let by_order = PathPrefix::new("/orders");
//! assert_eq!(by_order.extract(&pay), Key::Lock("/orders/42".into()));
//! let other = Request::get("/health").body(()).unwrap();
//! assert_eq!(by_order.extract(&other), Key::Pass);
//!
//! // One key for everything.
//! assert_eq!(Global::new("migrations").extract(&other), Key::Lock("migrations".into()));
//!
//! // A closure: lock POSTs per tenant, let everything else through; refuse a tenant
//! // that is not text.
//! let by_tenant = |req: &Request<()>| -> Result<Option<String>, BadKey> {
//!     match req.headers().get("x-tenant") {
//!         Some(tenant) if req.method() == http::Method::POST => tenant
//!             .to_str()
//!             .map(|t| Some(t.to_owned()))
//!             .map_err(|_| BadKey::new("x-tenant must be text")),
//!         _ => Ok(None),
//!     }
//! };
//! assert_eq!(by_tenant.extract(&pay), Key::Pass); // no x-tenant header
//! ```

mod global;
mod header;
#[cfg(feature = "axum")]
mod path_param;
mod path_prefix;
#[cfg(test)]
mod tests;

use http::Request;
pub use redlock_http::key::BadKey;

pub use self::header::Header;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use redlock_http::extract::PathParam;
pub use redlock_http::extract::{Global, PathPrefix};

pub use redlock_http::key::Key;

/// Names the lock a request needs. See the [module documentation](self).
///
/// Implemented for closures `Fn(&http::Request<B>) -> Result<Option<V>, BadKey>` where
/// `V: AsRef<str>`: `Ok(Some(value))` locks by the value, made a key by
/// [`redlock_http::key::lock_key`] (`%` and `:` escaped, empty refused with `400`), as
/// actix's closures' values are; `Ok(None)` passes the request through; `Err` refuses it
/// with `400`. Implement it yourself (or use [`from_fn`]) for a full [`Key`]; a
/// [`Key::Lock`] you return is the final key. It runs synchronously in `Service::call`,
/// before anything else: keep it cheap, and do not read the body.
pub trait KeyExtractor<B> {
    /// Decides the key for `request`.
    fn extract(&self, request: &Request<B>) -> Key;
}

impl<B, F, V> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Result<Option<V>, BadKey>,
    V: AsRef<str>,
{
    fn extract(&self, request: &Request<B>) -> Key {
        match self(request) {
            Ok(value) => Key::from_value(value.as_ref().map(AsRef::as_ref)),
            Err(bad) => Key::Reject(bad.problem()),
        }
    }
}

/// An extractor from a closure returning a full [`Key`] (to reject requests too).
///
/// ```
/// use http::Request;
/// use redlock_http::Problem;
/// use redlock_tower::extract::{Key, KeyExtractor, from_fn};
///
/// let tenant = from_fn(|req: &Request<()>| match req.headers().get("x-tenant") {
///     None => Key::Pass,
///     Some(v) => match v.to_str() {
///         Ok(t) if t.bytes().all(|b| b.is_ascii_alphanumeric()) => Key::Lock(format!("tenant:{t}")),
///         _ => Key::Reject(Problem::bad_key("x-tenant must be alphanumeric".into())),
///     },
/// });
/// let req = Request::get("/").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(tenant.extract(&req), Key::Lock("tenant:acme".into()));
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F> {
    FromFn(f)
}

/// See [`from_fn`].
#[derive(Debug, Clone, Copy)]
pub struct FromFn<F>(F);

impl<B, F> KeyExtractor<B> for FromFn<F>
where
    F: Fn(&Request<B>) -> Key,
{
    fn extract(&self, request: &Request<B>) -> Key {
        (self.0)(request)
    }
}
