//! Key extractors: which lock (if any) a request needs.
//!
//! A [`KeyExtractor`] looks at a request and answers with a [`Key`]:
//!
//! - [`Key::Lock`]: serialize this request with every other request of the same key;
//! - [`Key::Pass`]: no lock, the request goes straight through;
//! - [`Key::Reject`]: refuse the request (by default `400 Bad Request`, for a missing or
//!   malformed key), with a [`Problem`] saying why.
//!
//! Built in: [`Header`] (optionally required), [`PathPrefix`], [`Global`], and, with the
//! `axum` feature, `PathParam` for a path parameter of an axum route. Any closure
//! `Fn(&http::Request<B>) -> Option<String>` is an extractor too (`None` passes the
//! request through), and [`from_fn`] wraps a closure that returns a full [`Key`].
//!
//! ```
//! use http::Request;
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
//! // A closure: lock POSTs per tenant, let everything else through.
//! let by_tenant = |req: &Request<()>| {
//!     (req.method() == http::Method::POST)
//!         .then(|| req.headers().get("x-tenant")?.to_str().ok().map(str::to_owned))
//!         .flatten()
//! };
//! assert_eq!(by_tenant.extract(&pay), Key::Pass); // no x-tenant header
//! ```

use http::Request;
use http::header::HeaderName;
use redlock_http::Problem;

/// The longest key a built-in extractor accepts, in bytes; a longer one is refused with
/// `400` (a client must not be able to make the layer store arbitrarily large keys).
pub const MAX_KEY_LEN: usize = 512;

/// What a [`KeyExtractor`] decided for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Key {
    /// Take the lock on this key (the layer's [key
    /// prefix](crate::LockLayer::key_prefix) is put in front) for the request.
    Lock(String),
    /// Take no lock: the request goes through at once, unserialized.
    Pass,
    /// Refuse the request with this problem (usually [`Problem::bad_key`], a `400`).
    Reject(Problem),
}

impl Key {
    /// The key to lock, if the decision is [`Key::Lock`].
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Lock(key) => Some(key),
            _ => None,
        }
    }

    /// The problem, if the decision is [`Key::Reject`].
    pub fn rejection(&self) -> Option<&Problem> {
        match self {
            Self::Reject(problem) => Some(problem),
            _ => None,
        }
    }

    /// `Some(key)` locks it, `None` passes the request through.
    pub fn from_option(key: Option<String>) -> Self {
        key.map_or(Self::Pass, Self::Lock)
    }
}

impl From<Option<String>> for Key {
    fn from(key: Option<String>) -> Self {
        Self::from_option(key)
    }
}

/// Names the lock a request needs. See the [module documentation](self).
///
/// Implemented for closures `Fn(&http::Request<B>) -> Option<String>`; implement it
/// yourself (or use [`from_fn`]) to reject requests. It runs synchronously in
/// `Service::call`, before anything else: keep it cheap, and do not read the body.
pub trait KeyExtractor<B> {
    /// Decides the key for `request`.
    fn extract(&self, request: &Request<B>) -> Key;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn extract(&self, request: &Request<B>) -> Key {
        Key::from_option(self(request))
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

/// The key is a request header's value, e.g. `Idempotency-Key` or a tenant id.
///
/// Without the header the request passes through unlocked, or, once
/// [`required`](Self::required), is refused with `400`. A value that is empty, longer
/// than [`MAX_KEY_LEN`], or not visible ASCII is always refused with `400`.
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
    required: bool,
}

impl Header {
    /// The key from header `name` (any case: `"Idempotency-Key"`).
    ///
    /// `name` is a literal, checked once when the extractor is built; use
    /// [`from_name`](Self::from_name) for a name known only at run time.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (a programming error, like an invalid
    /// literal route in a router).
    pub fn new(name: &'static str) -> Self {
        // Lowercases a valid name; an invalid one goes to `from_static`, which panics
        // with the http crate's message.
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| HeaderName::from_static(name));
        Self::from_name(name)
    }

    /// The key from header `name`.
    pub fn from_name(name: HeaderName) -> Self {
        Self {
            name,
            required: false,
        }
    }

    /// Refuse requests without the header (`400`) instead of letting them through.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// The header's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl<B> KeyExtractor<B> for Header {
    fn extract(&self, request: &Request<B>) -> Key {
        let mut values = request.headers().get_all(&self.name).iter();
        let Some(value) = values.next() else {
            return if self.required {
                Key::Reject(Problem::bad_key(format!(
                    "the `{}` header is required",
                    self.name
                )))
            } else {
                Key::Pass
            };
        };
        if values.next().is_some() {
            return Key::Reject(Problem::bad_key(format!(
                "the `{}` header must be given once",
                self.name
            )));
        }
        match value.to_str() {
            Ok(text) => checked(text.trim(), || format!("the `{}` header", self.name)),
            Err(_) => Key::Reject(Problem::bad_key(format!(
                "the `{}` header must be visible ASCII",
                self.name
            ))),
        }
    }
}

/// The key is a path prefix plus the segments that follow it: with
/// `PathPrefix::new("/orders")`, `POST /orders/42/pay` and `GET /orders/42` share the
/// key `/orders/42`.
///
/// Requests outside the prefix, or with fewer segments after it than asked, pass
/// through unlocked. The prefix matches whole segments (`/orders` does not match
/// `/orders-archive/1`). Segments are taken as they appear in the URI
/// (percent-encoded), so equal paths give equal keys.
#[derive(Debug, Clone)]
pub struct PathPrefix {
    prefix: String,
    segments: usize,
}

impl PathPrefix {
    /// Requests under `prefix` lock the prefix plus the next segment.
    pub fn new(prefix: impl Into<String>) -> Self {
        let mut prefix: String = prefix.into();
        while prefix.ends_with('/') {
            prefix.pop();
        }
        if !prefix.starts_with('/') {
            prefix.insert(0, '/');
        }
        Self {
            prefix,
            segments: 1,
        }
    }

    /// How many segments after the prefix belong to the key (default 1; 0 makes the
    /// whole prefix one key).
    pub fn segments(mut self, n: usize) -> Self {
        self.segments = n;
        self
    }
}

impl<B> KeyExtractor<B> for PathPrefix {
    fn extract(&self, request: &Request<B>) -> Key {
        let path = request.uri().path();
        let rest = if self.prefix == "/" {
            path
        } else {
            match path.strip_prefix(self.prefix.as_str()) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
                _ => return Key::Pass,
            }
        };
        let mut end = 0;
        for _ in 0..self.segments {
            let tail = &rest[end..];
            let Some(after_slash) = tail.strip_prefix('/') else {
                return Key::Pass;
            };
            let len = after_slash.find('/').unwrap_or(after_slash.len());
            if len == 0 {
                return Key::Pass;
            }
            end += 1 + len;
        }
        let mut key = String::with_capacity(self.prefix.len() + end);
        if self.prefix != "/" {
            key.push_str(&self.prefix);
        }
        key.push_str(&rest[..end]);
        if key.is_empty() {
            key.push('/');
        }
        checked(&key, || "the request path".to_owned())
    }
}

/// One key for every request: the layer then lets one request at a time through,
/// cluster-wide (e.g. on an admin route that runs migrations).
#[derive(Debug, Clone)]
pub struct Global {
    key: String,
}

impl Global {
    /// Every request locks `key`.
    pub fn new(key: impl Into<String>) -> Self {
        Self { key: key.into() }
    }
}

impl<B> KeyExtractor<B> for Global {
    fn extract(&self, _request: &Request<B>) -> Key {
        Key::Lock(self.key.clone())
    }
}

/// Refuses an empty or over-long key; `what` names its source for the message.
fn checked(key: &str, what: impl FnOnce() -> String) -> Key {
    if key.is_empty() {
        Key::Reject(Problem::bad_key(format!("{} is empty", what())))
    } else if key.len() > MAX_KEY_LEN {
        Key::Reject(Problem::bad_key(format!(
            "{} is longer than {MAX_KEY_LEN} bytes",
            what()
        )))
    } else {
        Key::Lock(key.to_owned())
    }
}

#[cfg(feature = "axum")]
pub use self::path_param::PathParam;

#[cfg(feature = "axum")]
mod path_param {
    use axum::extract::{MatchedPath, OriginalUri};
    use http::Request;
    use redlock_http::Problem;

    use super::{Key, KeyExtractor, checked, param_value};

    /// The key is a path parameter of the axum route, e.g. `id` in
    /// `/orders/{id}/pay` (feature `axum`).
    ///
    /// Use the layer with `Router::route_layer` (or `Router::layer`): axum has matched
    /// the route by then and put [`MatchedPath`] into the request's extensions; the
    /// value is read from the request path at the parameter's place in that template,
    /// percent-decoded as axum's `Path` extractor does (a `{*wildcard}` takes the rest
    /// of the path). Nested routers work: the original URI ([`OriginalUri`]) is used
    /// when present.
    ///
    /// Answers `500` when the layer sits where no route was matched (outside the
    /// `Router`, or on a fallback) or the route has no such parameter: both are
    /// configuration mistakes. A value that is not UTF-8 once decoded is refused with
    /// `400`.
    ///
    /// ```
    /// use axum::{Extension, Router, body::Body, routing::post};
    /// use http::{Request, StatusCode};
    /// use redlock_tower::{LockHandle, LockLayer, extract::PathParam};
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock_tower::BoxError> {
    /// # let cluster = redlock_testkit::Cluster::start(1).await;
    /// # let redlock = redlock_tower::Redlock::builder()
    /// #     .nodes(cluster.urls())
    /// #     .restart_quarantine(false) // the test node was started a moment ago
    /// #     .build()?;
    /// let app: Router = Router::new()
    ///     .route(
    ///         "/orders/{id}/pay",
    ///         post(|Extension(lock): Extension<LockHandle>| async move {
    ///             format!("paid under {}", lock.resource())
    ///         }),
    ///     )
    ///     .route_layer(LockLayer::new(redlock, PathParam::new("id")).key_prefix("order:"));
    ///
    /// let pay = Request::post("/orders/42/pay").body(Body::empty())?;
    /// let response = app.oneshot(pay).await?;
    /// assert_eq!(response.status(), StatusCode::OK);
    /// let body = axum::body::to_bytes(response.into_body(), 1024).await?;
    /// assert_eq!(body, "paid under order:42");
    /// # Ok(())
    /// # }
    /// ```
    #[derive(Debug, Clone)]
    pub struct PathParam {
        name: String,
    }

    impl PathParam {
        /// The key from the route's parameter `name` (without braces).
        pub fn new(name: impl Into<String>) -> Self {
            Self { name: name.into() }
        }
    }

    impl<B> KeyExtractor<B> for PathParam {
        fn extract(&self, request: &Request<B>) -> Key {
            let Some(template) = request.extensions().get::<MatchedPath>() else {
                return Key::Reject(Problem::misconfigured(format!(
                    "no matched route for path parameter `{}`: add the lock layer with axum's `Router::route_layer`",
                    self.name
                )));
            };
            let path = request
                .extensions()
                .get::<OriginalUri>()
                .map_or_else(|| request.uri().path(), |original| original.0.path());
            match param_value(template.as_str(), path, &self.name) {
                Some(Ok(value)) => checked(&value, || format!("path parameter `{}`", self.name)),
                Some(Err(())) => Key::Reject(Problem::bad_key(format!(
                    "path parameter `{}` is not valid UTF-8",
                    self.name
                ))),
                None => Key::Reject(Problem::misconfigured(format!(
                    "route `{}` has no path parameter `{}` (or the path does not fit it)",
                    template.as_str(),
                    self.name
                ))),
            }
        }
    }
}

/// The value of parameter `name` of route `template` (axum syntax: `{name}`,
/// `{*name}`) in `path`, percent-decoded: `None` if the template has no such parameter
/// or the path does not fit it, `Some(Err)` if the value is not UTF-8.
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
fn param_value(template: &str, path: &str, name: &str) -> Option<Result<String, ()>> {
    let plain = format!("{{{name}}}");
    let wildcard = format!("{{*{name}}}");
    let mut path_segments = path.split('/');
    for segment in template.split('/') {
        if segment == wildcard {
            let rest: Vec<&str> = path_segments.collect();
            return Some(decode(&rest.join("/")));
        }
        let value = path_segments.next()?;
        if let Some((before, after)) = segment.split_once(plain.as_str()) {
            // A parameter may share its segment with literal text (`{file}.json`).
            let inner = value.strip_prefix(before)?.strip_suffix(after)?;
            return Some(decode(inner));
        }
    }
    None
}

/// Percent-decodes `raw` (a path segment; `+` stays `+`), requiring UTF-8.
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
fn decode(raw: &str) -> Result<String, ()> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = |at: usize| bytes.get(at).and_then(|c| (*c as char).to_digit(16));
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str) -> Request<()> {
        Request::get(path).body(()).unwrap()
    }

    #[test]
    fn header_optional_required_and_invalid() {
        let optional = Header::new("idempotency-key");
        let required = Header::new("idempotency-key").required();
        assert_eq!(optional.extract(&req("/")), Key::Pass);
        let missing = required.extract(&req("/"));
        assert_eq!(missing.rejection().map(|p| p.status), Some(400));
        assert!(
            missing
                .rejection()
                .unwrap()
                .detail
                .contains("idempotency-key")
        );

        let with = |v: &[u8]| {
            Request::get("/")
                .header("idempotency-key", http::HeaderValue::from_bytes(v).unwrap())
                .body(())
                .unwrap()
        };
        assert_eq!(required.extract(&with(b" abc ")), Key::Lock("abc".into()));
        for bad in [&b""[..], b"  ", "é".as_bytes(), &[b'a'; MAX_KEY_LEN + 1]] {
            let got = optional.extract(&with(bad));
            assert_eq!(got.rejection().map(|p| p.status), Some(400), "{bad:?}");
        }
        let twice = Request::get("/")
            .header("idempotency-key", "a")
            .header("idempotency-key", "b")
            .body(())
            .unwrap();
        assert_eq!(
            optional.extract(&twice).rejection().map(|p| p.status),
            Some(400)
        );
    }

    #[test]
    fn path_prefix_takes_whole_segments() {
        let p = PathPrefix::new("/orders/");
        assert_eq!(
            p.extract(&req("/orders/42/pay")),
            Key::Lock("/orders/42".into())
        );
        assert_eq!(
            p.extract(&req("/orders/42")),
            Key::Lock("/orders/42".into())
        );
        assert_eq!(
            p.extract(&req("/orders/42?x=1")),
            Key::Lock("/orders/42".into())
        );
        assert_eq!(p.extract(&req("/orders")), Key::Pass);
        assert_eq!(p.extract(&req("/orders/")), Key::Pass);
        assert_eq!(p.extract(&req("/orders//pay")), Key::Pass);
        assert_eq!(p.extract(&req("/orders-archive/1")), Key::Pass);
        assert_eq!(p.extract(&req("/health")), Key::Pass);

        let two = PathPrefix::new("tenants").segments(3);
        assert_eq!(
            two.extract(&req("/tenants/acme/orders/7/pay")),
            Key::Lock("/tenants/acme/orders/7".into())
        );
        assert_eq!(two.extract(&req("/tenants/acme/orders")), Key::Pass);

        let whole = PathPrefix::new("/admin").segments(0);
        assert_eq!(
            whole.extract(&req("/admin/migrate")),
            Key::Lock("/admin".into())
        );
        let root = PathPrefix::new("/");
        assert_eq!(root.extract(&req("/a/b")), Key::Lock("/a".into()));
        assert_eq!(root.extract(&req("/")), Key::Pass);
    }

    #[test]
    fn global_and_closures() {
        assert_eq!(Global::new("g").extract(&req("/x")), Key::Lock("g".into()));
        let f = |r: &Request<()>| (r.uri().path() == "/x").then(|| "k".to_owned());
        assert_eq!(f.extract(&req("/x")), Key::Lock("k".into()));
        assert_eq!(f.extract(&req("/y")), Key::Pass);
        let reject = from_fn(|_: &Request<()>| Key::Reject(Problem::bad_key("no".into())));
        assert!(reject.extract(&req("/")).rejection().is_some());
    }

    #[test]
    fn path_parameters_from_templates() {
        let v = |t: &str, p: &str, n: &str| param_value(t, p, n);
        assert_eq!(
            v("/orders/{id}/pay", "/orders/42/pay", "id"),
            Some(Ok("42".into()))
        );
        assert_eq!(
            v("/t/{tenant}/o/{id}", "/t/acme/o/7", "tenant"),
            Some(Ok("acme".into()))
        );
        assert_eq!(
            v("/t/{tenant}/o/{id}", "/t/acme/o/7", "id"),
            Some(Ok("7".into()))
        );
        assert_eq!(
            v("/files/{*path}", "/files/a/b%20c", "path"),
            Some(Ok("a/b c".into()))
        );
        assert_eq!(
            v("/r/{name}.json", "/r/x.json", "name"),
            Some(Ok("x".into()))
        );
        assert_eq!(
            v("/orders/{id}", "/orders/%E2%82%AC", "id"),
            Some(Ok("€".into()))
        );
        assert_eq!(v("/orders/{id}", "/orders/%FF", "id"), Some(Err(())));
        assert_eq!(
            v("/orders/{id}", "/orders/100%", "id"),
            Some(Ok("100%".into()))
        );
        assert_eq!(v("/orders/{id}", "/orders/42", "other"), None);
        assert_eq!(v("/orders/{id}", "/orders", "id"), None);
    }
}
