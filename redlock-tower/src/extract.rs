//! Key extractors: which lock (if any) a request needs, by the rule that
//! `redlock-actix` follows too ([`redlock_http::key`]).
//!
//! A [`KeyExtractor`] answers each request with a [`Key`]: [`Key::Lock`] (serialize it
//! with every request of the same key), [`Key::Pass`] (no lock) or [`Key::Reject`]
//! (refuse it, `400` for a missing or malformed key). Built in: [`Header`],
//! [`PathPrefix`], [`Global`], and, with the `axum` feature, `PathParam`; any closure
//! `Fn(&http::Request<B>) -> Result<Option<V>, BadKey>` is one too, and [`from_fn`]
//! wraps a closure that returns a full [`Key`].
//!
//! ```
//! use http::Request;
//! use redlock_tower::extract::{BadKey, Header, Key, KeyExtractor, PathPrefix};
//!
//! let pay = Request::post("/orders/42/pay").header("idempotency-key", "7c1e").body(())?;
//! assert_eq!(Header::new("idempotency-key").extract(&pay), Key::Lock("7c1e".into()));
//! assert_eq!(PathPrefix::new("/orders").extract(&pay), Key::Lock("/orders/42".into()));
//! // A closure: lock per tenant, let requests without one through.
//! let by_tenant = |req: &Request<()>| -> Result<Option<String>, BadKey> {
//!     match req.headers().get("x-tenant") {
//!         Some(tenant) => tenant.to_str().map(|t| Some(t.to_owned())).map_err(|_| BadKey::new("x-tenant must be text")),
//!         None => Ok(None),
//!     }
//! };
//! assert_eq!(by_tenant.extract(&pay), Key::Pass);
//! # Ok::<(), http::Error>(())
//! ```

use http::Request;
use http::header::HeaderName;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use redlock_http::extract::PathParam;
pub use redlock_http::extract::{Global, PathPrefix};
pub use redlock_http::key::{BadKey, Key};
use redlock_http::{Problem, key};

use crate::target::sent_path;

/// Names the lock a request needs. See the [module documentation](self).
///
/// For a closure, `Ok(Some(value))` locks by the value made a key by
/// [`redlock_http::key::lock_key`] (`%` and `:` escaped, empty refused with `400`),
/// `Ok(None)` passes the request through, `Err` refuses it with `400`. A [`Key::Lock`]
/// an implementation returns is the final key. It runs synchronously in
/// `Service::call`: keep it cheap, and do not read the body.
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
/// use redlock_tower::extract::{Key, KeyExtractor, from_fn};
///
/// let tenant = from_fn(|req: &Request<()>| match req.headers().get("x-tenant") {
///     Some(v) => Key::Lock(format!("tenant:{}", v.to_str().unwrap_or("?"))),
///     None => Key::Pass,
/// });
/// let req = Request::get("/").header("x-tenant", "acme").body(())?;
/// assert_eq!(tenant.extract(&req), Key::Lock("tenant:acme".into()));
/// # Ok::<(), http::Error>(())
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F> {
    FromFn(f)
}

/// See [`from_fn`].
#[derive(Debug, Clone, Copy)]
pub struct FromFn<F>(F);

impl<B, F: Fn(&Request<B>) -> Key> KeyExtractor<B> for FromFn<F> {
    fn extract(&self, request: &Request<B>) -> Key {
        (self.0)(request)
    }
}

impl<B> KeyExtractor<B> for Global {
    fn extract(&self, _request: &Request<B>) -> Key {
        self.key()
    }
}

/// The path the client sent: under axum's `Router::nest("/api", ..)` (feature `axum`),
/// a layer inside the nested router keys `/api/orders/42`, from axum's `OriginalUri`.
impl<B> KeyExtractor<B> for PathPrefix {
    fn extract(&self, request: &Request<B>) -> Key {
        self.key(sent_path(request.uri(), request.extensions()))
    }
}

/// The key is a request header's value, e.g. `Idempotency-Key` or a tenant id, by the
/// rule of both web crates ([`redlock_http::key::header_lock_key`]: given once, visible
/// ASCII, trimmed, `%` and `:` escaped, else `400`). Without the header the request
/// passes through unlocked, or, once [`required`](Self::required), is refused with `400`.
#[derive(Debug, Clone)]
pub struct Header {
    /// The name, or the literal that is not a valid one.
    name: Result<HeaderName, &'static str>,
    required: bool,
}

impl Header {
    /// The key from header `name` (any case). A literal that is not a valid header name
    /// (a programming error) makes every request answered `500`, the name in the log;
    /// [`from_name`](Self::from_name) takes a checked name.
    pub fn new(name: &'static str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| name);
        Self {
            name,
            required: false,
        }
    }

    /// The key from header `name`.
    pub fn from_name(name: HeaderName) -> Self {
        Self {
            name: Ok(name),
            required: false,
        }
    }

    /// Refuse requests without the header (`400`) instead of letting them through.
    #[must_use]
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// The header's name (`None` for an invalid literal given to [`new`](Self::new)).
    pub fn name(&self) -> Option<&HeaderName> {
        self.name.as_ref().ok()
    }
}

impl<B> KeyExtractor<B> for Header {
    fn extract(&self, request: &Request<B>) -> Key {
        let name = match &self.name {
            Ok(name) => name,
            Err(literal) => {
                return Key::Reject(Problem::misconfigured(format!(
                    "`{literal}` given to `redlock_tower::extract::Header::new` is not a valid header name"
                )));
            }
        };
        let values = request.headers().get_all(name).iter();
        key::header_lock_key(name.as_str(), values.map(|v| v.as_bytes()), self.required)
    }
}

/// Feature `axum`: the parameter of the matched axum 0.8 route (add the layer with
/// `Router::route_layer`), read from the path the client sent and percent-decoded as
/// axum's `Path` does. No matched route, no such parameter, or another axum version:
/// `500`, the cause in the log.
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<B> KeyExtractor<B> for PathParam {
    fn extract(&self, request: &Request<B>) -> Key {
        let Some(template) = request.extensions().get::<axum::extract::MatchedPath>() else {
            return Key::Reject(Problem::misconfigured(format!(
                "no axum 0.8 `MatchedPath` in the request for path parameter `{}`: either the lock layer is not added with `Router::route_layer` (it then sees requests before routing), or the router is not axum 0.8, the version redlock-tower's `axum` feature supports (an axum 0.7 `Router` compiles with the layer, but its extensions are other types: upgrade to axum 0.8, or use `extract::from_fn` with your own extractor)",
                self.name()
            )));
        };
        let path = sent_path(request.uri(), request.extensions());
        match param_value(template.as_str(), path, self.name()) {
            Some(raw) => self.key(Some(&raw)),
            None => Key::Reject(Problem::misconfigured(format!(
                "route `{}` has no path parameter `{}` (or the path does not fit it)",
                template.as_str(),
                self.name()
            ))),
        }
    }
}

/// The raw value (still percent-encoded) of parameter `name` of route `template`
/// (axum syntax: `{name}`, `{*name}`) in `path`: `None` if the template has no such
/// parameter or the path does not fit it.
#[cfg(feature = "axum")]
fn param_value(template: &str, path: &str, name: &str) -> Option<String> {
    let (plain, wildcard) = (format!("{{{name}}}"), format!("{{*{name}}}"));
    let mut path_segments = path.split('/');
    for segment in template.split('/') {
        if segment == wildcard {
            return Some(path_segments.collect::<Vec<_>>().join("/"));
        }
        let value = path_segments.next()?;
        if let Some((before, after)) = segment.split_once(plain.as_str()) {
            // A parameter may share its segment with literal text (`{file}.json`).
            let inner = value.strip_prefix(before)?.strip_suffix(after)?;
            return Some(inner.to_owned());
        }
    }
    None
}

/// What no axum 0.8 route reaches (the router refuses the template, or has matched the
/// path already); the rest is tested through a router, in `tests/extract.rs`.
#[cfg(all(test, feature = "axum"))]
mod tests {
    #[test]
    fn a_parameter_sharing_its_segment_or_a_path_that_does_not_fit() {
        let value = super::param_value;
        assert_eq!(
            value("/r/{name}.json", "/r/x.json", "name").as_deref(),
            Some("x")
        );
        assert_eq!(value("/r/{name}.json", "/r/x.xml", "name"), None);
        assert_eq!(value("/orders/{id}", "/orders", "id"), None);
    }
}
