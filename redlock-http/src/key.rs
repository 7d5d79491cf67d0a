//! How a request names its lock: the one rule both web crates follow.
//!
//! A request's lock is named by its *resource*: the integration's
//! [resource prefix](crate#the-web-crates-contract) followed by the request's *key*. The key is
//! derived from what the request carries, by these functions only, in `redlock-tower`
//! and `redlock-actix` alike:
//!
//! | source | key |
//! | --- | --- |
//! | a value (a header's, a path parameter's, a string returned by a closure) | [`lock_key`]: `%` → `%25`, `:` → `%3A`; empty refused |
//! | several values (actix: a tuple) | each by [`lock_key`], joined by [`KEY_SEPARATOR`] (`:`) |
//! | a header | [`header_key`] (given once, visible ASCII, trimmed, not empty), then [`lock_key`] |
//! | a path parameter | its segment percent-decoded ([`decode_path_segment`], UTF-8), then [`lock_key`] |
//! | a path prefix and the segments after it | [`path_prefix_key`]: each segment as sent, by [`lock_key`], of the path the client sent ([`sent_path`]: under a nested router too) |
//! | an integer | its decimal digits |
//!
//! Since a value's key never contains `:`, keys joined by `:` stay unambiguous
//! (`("a:b", "c")` and `("a", "b:c")` differ), and `Idempotency-Key: a:b` is locked as
//! `a%3Ab` by both web crates. The resource is then [`resource_name`]: the prefix and
//! the key; its length is checked by the client (`max_resource_len`) before anything is
//! sent. Where more is derived from a key (a concurrency limit's slots,
//! `<key>/permit/<i>`; an idempotency key joined to its scope), the web crates check the
//! key against the room left under the bound ([`KeyRoom`]) where it enters, and answer
//! `400` naming that room ([`KeyBoundError`]).

use std::borrow::Cow;
use std::fmt;

use crate::Problem;

/// Joins the keys of several values into one (actix's tuple keys).
pub const KEY_SEPARATOR: char = ':';

/// The request carries no usable lock key: answered with `400 Bad Request`
/// ([`Problem::bad_key`]), its detail told to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BadKey {
    detail: Cow<'static, str>,
}

impl BadKey {
    /// A bad key, and why (told to the client in the problem's `detail`).
    pub fn new(detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            detail: detail.into(),
        }
    }

    /// Why the key is unusable.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The `400` problem for it.
    pub fn problem(&self) -> Problem {
        Problem::bad_key(self.detail.clone().into_owned())
    }
}

impl fmt::Display for BadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for BadKey {}

/// What a key extractor decided for one request (the same in both web crates).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Key {
    /// Take the lock on this key (the integration's resource prefix is put in front).
    /// The key is final: extractors derive it by the rule of this module
    /// ([`lock_key`] for a value).
    Lock(String),
    /// Take no lock: the request goes through at once, unserialized.
    Pass,
    /// Refuse the request with this problem (usually a `400`, [`Problem::bad_key`]; a
    /// `500` for a server-side mistake, whose detail then goes to the log only).
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

    /// The key of a value ([`lock_key`]): `Some` locks by it (refused with `400` when
    /// empty), `None` passes the request through.
    pub fn from_value(value: Option<&str>) -> Self {
        match value.map(lock_key) {
            None => Self::Pass,
            Some(Ok(key)) => Self::Lock(key),
            Some(Err(bad)) => Self::Reject(bad.problem()),
        }
    }
}

impl From<Option<String>> for Key {
    fn from(key: Option<String>) -> Self {
        Self::from_option(key)
    }
}

impl From<Result<String, BadKey>> for Key {
    fn from(key: Result<String, BadKey>) -> Self {
        match key {
            Ok(key) => Self::Lock(key),
            Err(bad) => Self::Reject(bad.problem()),
        }
    }
}

/// The key of one value: `%` → `%25` and `:` → `%3A`, everything else as it is; an
/// empty value is a [`BadKey`].
///
/// ```
/// use redlock_http::key::lock_key;
///
/// assert_eq!(lock_key("order-42").unwrap(), "order-42");
/// assert_eq!(lock_key("a:b").unwrap(), "a%3Ab");
/// assert_eq!(lock_key("100%").unwrap(), "100%25");
/// assert_eq!(lock_key("café €").unwrap(), "café €");
/// assert!(lock_key("").is_err());
/// ```
///
/// # Errors
///
/// [`BadKey`] when `value` is empty.
pub fn lock_key(value: &str) -> Result<String, BadKey> {
    if value.is_empty() {
        return Err(BadKey::new("the lock key is empty"));
    }
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The lock's resource name: `resource_prefix` followed by `key`. An empty key is a
/// [`BadKey`]; the length is the client's to check (`max_resource_len`, `400` too).
///
/// ```
/// assert_eq!(redlock_http::key::resource_name("order:", "42").unwrap(), "order:42");
/// assert!(redlock_http::key::resource_name("order:", "").is_err());
/// ```
///
/// # Errors
///
/// [`BadKey`] when `key` is empty.
pub fn resource_name(resource_prefix: &str, key: &str) -> Result<String, BadKey> {
    if key.is_empty() {
        return Err(BadKey::new("the lock key is empty"));
    }
    let mut resource = String::with_capacity(resource_prefix.len() + key.len());
    resource.push_str(resource_prefix);
    resource.push_str(key);
    Ok(resource)
}

/// A path segment percent-decoded (`+` stays `+`; a `%` not followed by two hex digits
/// stays as it is), as axum's and actix's `Path` extractors decode a path parameter.
///
/// ```
/// use redlock_http::key::decode_path_segment;
///
/// assert_eq!(decode_path_segment("a%3Ab").unwrap(), "a:b");
/// assert_eq!(decode_path_segment("%E2%82%AC").unwrap(), "€");
/// assert_eq!(decode_path_segment("100%").unwrap(), "100%");
/// assert!(decode_path_segment("%FF").is_err());
/// ```
///
/// # Errors
///
/// [`BadKey`] when the decoded bytes are not UTF-8.
pub fn decode_path_segment(raw: &str) -> Result<String, BadKey> {
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
    String::from_utf8(out).map_err(|_| BadKey::new("the path segment is not valid UTF-8"))
}

/// The key of a request under a path prefix: `prefix` (normalized to start with `/` and
/// end without one) and the `segments` path segments after it, each as sent (still
/// percent-encoded) and escaped by [`lock_key`]. `None` when `path` is outside the
/// prefix (whole segments only: `/orders` does not match `/orders-archive/1`) or has
/// fewer segments after it.
///
/// ```
/// use redlock_http::key::path_prefix_key;
///
/// assert_eq!(path_prefix_key("/orders", 1, "/orders/42/pay").as_deref(), Some("/orders/42"));
/// assert_eq!(path_prefix_key("/orders", 1, "/orders/a:b").as_deref(), Some("/orders/a%3Ab"));
/// assert_eq!(path_prefix_key("/orders", 1, "/health"), None);
/// ```
pub fn path_prefix_key(prefix: &str, segments: usize, path: &str) -> Option<String> {
    let prefix = normalize_prefix(prefix);
    let rest = if prefix == "/" {
        path
    } else {
        match path.strip_prefix(prefix.as_str()) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
            _ => return None,
        }
    };
    let mut key = if prefix == "/" { String::new() } else { prefix };
    let mut tail = rest;
    for _ in 0..segments {
        let after_slash = tail.strip_prefix('/')?;
        let len = after_slash.find('/').unwrap_or(after_slash.len());
        let segment = after_slash.get(..len)?;
        key.push('/');
        key.push_str(&lock_key(segment).ok()?);
        tail = after_slash.get(len..)?;
    }
    if key.is_empty() {
        key.push('/');
    }
    Some(key)
}

/// The request target (path and query) as the client sent it, given the target the
/// framework shows the middleware (`shown`) and the original one, if the framework kept
/// one (`original`): the original wins.
///
/// A router that mounts a sub-router under a prefix may show its middleware the target
/// without the prefix: axum's `Router::nest("/api", ..)` shows `/refunds` for
/// `/api/refunds` and keeps `/api/refunds` in its `OriginalUri` extension; actix-web's
/// `web::scope("/api")` shows `/api/refunds` and keeps no other. Everything derived from
/// the target (an idempotency fingerprint, a path prefix key) is derived from the one
/// this function picks, in both web crates, so that the same request gets the same key
/// and fingerprint whichever framework and nesting serve it, and one router nested at
/// two prefixes gives two targets.
///
/// ```
/// use redlock_http::key::sent_target;
///
/// assert_eq!(sent_target("/refunds?x=1", Some("/api/refunds?x=1")), "/api/refunds?x=1");
/// assert_eq!(sent_target("/api/refunds", None), "/api/refunds");
/// ```
pub fn sent_target<'a>(shown: &'a str, original: Option<&'a str>) -> &'a str {
    original.unwrap_or(shown)
}

/// The path of the target as the client sent it ([`sent_target`], without the query):
/// what path keys ([`path_prefix_key`]) are derived from.
///
/// ```
/// use redlock_http::key::sent_path;
///
/// assert_eq!(sent_path("/refunds", Some("/v1/refunds?page=2")), "/v1/refunds");
/// assert_eq!(sent_path("/v1/refunds", None), "/v1/refunds");
/// ```
pub fn sent_path<'a>(shown: &'a str, original: Option<&'a str>) -> &'a str {
    let target = sent_target(shown, original);
    target.split_once('?').map_or(target, |(path, _)| path)
}

/// `prefix` starting with `/`, without a trailing one (`"/"` for the root).
pub(crate) fn normalize_prefix(prefix: &str) -> String {
    let mut prefix = prefix.trim_end_matches('/').to_owned();
    if !prefix.starts_with('/') {
        prefix.insert(0, '/');
    }
    prefix
}

/// The lock key a request carries in header `name`, given every value the request has
/// for it (`values`), trimmed of surrounding spaces (not yet escaped: [`lock_key`]
/// makes it a key).
///
/// - no value: `Ok(None)` (the request passes through unlocked), or, when `required`,
///   an error;
/// - more than one value: an error (which one would name the lock?);
/// - a value that is not visible ASCII (spaces and tabs inside allowed), or empty once
///   trimmed: an error.
///
/// ```
/// use redlock_http::key::header_key;
///
/// assert_eq!(header_key("idempotency-key", [&b" k-1 "[..]], false), Ok(Some("k-1")));
/// assert_eq!(header_key("idempotency-key", [], false), Ok(None));
/// assert!(header_key("idempotency-key", [], true).is_err());
/// assert!(header_key("idempotency-key", [&b"a"[..], &b"b"[..]], false).is_err());
/// assert!(header_key("idempotency-key", [&b"caf\xc3\xa9"[..]], false).is_err());
/// ```
///
/// # Errors
///
/// A [`BadKey`] saying why the header names no usable key, as above.
pub fn header_key<'a>(
    name: &str,
    values: impl IntoIterator<Item = &'a [u8]>,
    required: bool,
) -> Result<Option<&'a str>, BadKey> {
    let Some(value) = single_header_value(name, values, required)? else {
        return Ok(None);
    };
    let visible = value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b));
    let text = std::str::from_utf8(value)
        .ok()
        .filter(|_| visible)
        .ok_or_else(|| BadKey::new(format!("the `{name}` header must be visible ASCII")))?
        .trim();
    if text.is_empty() {
        return Err(BadKey::new(format!("the `{name}` header is empty")));
    }
    Ok(Some(text))
}

/// The one value of header `name`, given every value the request has for it: `Ok(None)`
/// for none (an error when `required`), an error for more than one. Every header that
/// names a key (a lock's, a limit's, an idempotency key) is read through it.
///
/// ```
/// use redlock_http::key::single_header_value;
///
/// assert_eq!(single_header_value("k", [&b"a"[..]], true), Ok(Some(&b"a"[..])));
/// assert_eq!(single_header_value("k", [], false), Ok(None));
/// assert!(single_header_value("k", [], true).is_err());
/// assert!(single_header_value("k", [&b"a"[..], &b"b"[..]], false).is_err());
/// ```
///
/// # Errors
///
/// A [`BadKey`]: the header is missing while required, or given more than once.
pub fn single_header_value<'a>(
    name: &str,
    values: impl IntoIterator<Item = &'a [u8]>,
    required: bool,
) -> Result<Option<&'a [u8]>, BadKey> {
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return if required {
            Err(BadKey::new(format!("the `{name}` header is required")))
        } else {
            Ok(None)
        };
    };
    if values.next().is_some() {
        return Err(BadKey::new(format!(
            "the `{name}` header must be given once"
        )));
    }
    Ok(Some(value))
}

/// The key of header `name` ([`header_key`], then [`lock_key`]): what both web crates'
/// `Header` extractors answer.
///
/// ```
/// use redlock_http::key::{Key, header_lock_key};
///
/// assert_eq!(header_lock_key("idempotency-key", [&b"a:b"[..]], true), Key::Lock("a%3Ab".into()));
/// assert_eq!(header_lock_key("idempotency-key", [], false), Key::Pass);
/// ```
pub fn header_lock_key<'a>(
    name: &str,
    values: impl IntoIterator<Item = &'a [u8]>,
    required: bool,
) -> Key {
    match header_key(name, values, required) {
        Ok(value) => Key::from_value(value),
        Err(bad) => Key::Reject(bad.problem()),
    }
}

/// The key of path parameter `name` whose raw value (as in the request path, or as the
/// framework left it) is `raw`: [`decode_path_segment`], then [`lock_key`]. `None`
/// (the route has no such parameter) is a server-side mistake: `500`.
pub fn path_param_key(name: &str, raw: Option<&str>) -> Key {
    let Some(raw) = raw else {
        return Key::Reject(Problem::misconfigured(format!(
            "the route has no path parameter `{name}` (or the path does not fit it)"
        )));
    };
    match decode_path_segment(raw) {
        Ok(value) => match lock_key(&value) {
            Ok(key) => Key::Lock(key),
            Err(_) => Key::Reject(Problem::bad_key(format!(
                "path parameter `{name}` is empty"
            ))),
        },
        Err(_) => path_param_not_utf8(name),
    }
}

/// The answer to a path parameter `name` that is not UTF-8 once percent-decoded: `400`.
/// For a framework that decodes lossily (actix-web's `match_info` puts U+FFFD in place
/// of invalid bytes), so that it refuses what [`path_param_key`] refuses.
pub fn path_param_not_utf8(name: &str) -> Key {
    Key::Reject(Problem::bad_key(format!(
        "path parameter `{name}` is not valid UTF-8"
    )))
}

/// redlock-core's default resource-name bound, 512 bytes: the room of keys is counted
/// against the client's own bound ([`Redlock::max_resource_len`](redlock_core::Redlock::max_resource_len)),
/// this one unless it was built with another.
pub const MAX_RESOURCE_LEN: usize = redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;

/// The separator of a semaphore's slot resources, `<name>/permit/<i>`.
const PERMIT_SEPARATOR: &str = "/permit/";

/// How many bytes the longest slot suffix (`/permit/<limit - 1>`) of a semaphore of
/// `limit` permits adds to its name: what a concurrency limit's key must leave room for.
///
/// ```
/// assert_eq!(redlock_http::key::permit_suffix_len(1), "/permit/0".len());
/// assert_eq!(redlock_http::key::permit_suffix_len(11), "/permit/10".len());
/// ```
pub fn permit_suffix_len(limit: u32) -> usize {
    let mut digits = 1;
    let mut last = limit.saturating_sub(1);
    while last >= 10 {
        last /= 10;
        digits += 1;
    }
    PERMIT_SEPARATOR.len() + digits
}

/// The room a request's key has in its lock's resource name: the client's resource-name
/// bound ([`MAX_RESOURCE_LEN`] by default) less the configured prefix and whatever is derived after the
/// key (a semaphore's slot suffix, [`permit_suffix_len`]). A key (after escaping) longer
/// than the room is refused with `400` ([`KeyBoundError::TooLong`]) before anything is
/// sent; a prefix that leaves no room is the server's mistake
/// ([`KeyBoundError::NoRoom`]).
///
/// ```
/// use redlock_http::key::{KeyBoundError, KeyRoom};
///
/// # fn main() -> Result<(), redlock_core::ConfigError> {
/// let redlock = redlock_core::Redlock::builder().node("redis://127.0.0.1:6379").build()?;
/// let room = KeyRoom::new(&redlock, "export:", 9).unwrap(); // a limit of 1: `/permit/0`
/// assert_eq!(room.bytes(), 512 - 7 - 9);
/// assert!(room.check("limit key", "k".repeat(496).len()).is_ok());
/// let refused = room.check("limit key", 497).unwrap_err();
/// assert_eq!(refused.problem().status, 400);
/// assert!(refused.problem().detail.contains("at most 496 bytes"));
/// assert!(matches!(KeyRoom::new(&redlock, &"p".repeat(510), 9), Err(KeyBoundError::NoRoom { .. })));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRoom {
    bytes: usize,
}

impl KeyRoom {
    /// The room under `prefix` in `redlock`'s resource names, with `suffix_len` bytes
    /// derived after the key.
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`] when the prefix and the suffix leave no byte for a key.
    pub fn new(
        redlock: &redlock_core::Redlock,
        prefix: &str,
        suffix_len: usize,
    ) -> Result<Self, KeyBoundError> {
        Self::with_bound(redlock.max_resource_len(), prefix.len(), suffix_len)
    }

    /// The room under a bound of `max_resource_len` bytes, a prefix of `prefix_len`
    /// bytes and a suffix of `suffix_len` bytes.
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`] when they leave no byte for a key.
    pub fn with_bound(
        max_resource_len: usize,
        prefix_len: usize,
        suffix_len: usize,
    ) -> Result<Self, KeyBoundError> {
        match max_resource_len
            .checked_sub(prefix_len)
            .and_then(|left| left.checked_sub(suffix_len))
        {
            Some(bytes) if bytes > 0 => Ok(Self { bytes }),
            _ => Err(KeyBoundError::NoRoom {
                prefix_len,
                suffix_len,
                max_resource_len,
            }),
        }
    }

    /// The longest key taken, in bytes after escaping.
    pub fn bytes(self) -> usize {
        self.bytes
    }

    /// Checks a key of `len` bytes (after escaping); `what` names it in the answer
    /// (`"lock key"`, `"idempotency key with its scope"`).
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::TooLong`] with the bound.
    pub fn check(self, what: &'static str, len: usize) -> Result<(), KeyBoundError> {
        if len > self.bytes {
            return Err(KeyBoundError::TooLong {
                what,
                len,
                max: self.bytes,
            });
        }
        Ok(())
    }
}

/// A key, or a configured prefix, that does not fit the resource-name bound
/// ([`KeyRoom`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyBoundError {
    /// A request's key is longer than its room, once escaped: answered `400`, with the
    /// bound. Send a shorter key (or scope).
    TooLong {
        /// What is too long (`"lock key"`, `"idempotency key with its scope"`).
        what: &'static str,
        /// Its length in bytes, escaped.
        len: usize,
        /// The room: the longest taken.
        max: usize,
    },
    /// A configured resource prefix (with what is derived after the key) leaves no room
    /// for a key under the bound: a configuration mistake, answered `500` (the detail in
    /// the log). Use a shorter prefix.
    NoRoom {
        /// The prefix's length in bytes.
        prefix_len: usize,
        /// What is derived after the key, in bytes (a semaphore's slot suffix).
        suffix_len: usize,
        /// The resource-name bound.
        max_resource_len: usize,
    },
    /// The configured longest key does not fit the room a configured resource prefix
    /// leaves: a configuration mistake, answered `500` (the detail in the log). Lower
    /// the longest key or use a shorter prefix.
    KeyLimitAboveRoom {
        /// The configured longest key, in bytes.
        max_key_len: usize,
        /// The room the prefix leaves under the bound, in bytes.
        room: usize,
    },
}

impl KeyBoundError {
    /// The answer: `400` naming the bound for a key too long, `500` for a prefix that
    /// leaves no room (the detail goes to the log only).
    pub fn problem(&self) -> Problem {
        match self {
            Self::TooLong { what, len, max } => Problem::bad_key(format!(
                "The request's {what} is too long: {len} bytes once escaped (`%` as `%25`, `:` as `%3A`); at most {max} bytes are taken."
            )),
            Self::NoRoom { .. } | Self::KeyLimitAboveRoom { .. } => {
                Problem::misconfigured(crate::problem::MISCONFIGURED_DETAIL.to_owned())
            }
        }
    }
}

impl fmt::Display for KeyBoundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong { what, len, max } => write!(
                f,
                "the {what} is {len} bytes once escaped, above its room of {max} bytes: send a shorter one"
            ),
            Self::NoRoom {
                prefix_len,
                suffix_len,
                max_resource_len,
            } => write!(
                f,
                "the resource prefix ({prefix_len} bytes) and the {suffix_len} bytes derived after the key leave no room for a key under the resource-name bound of {max_resource_len} bytes: use a shorter prefix"
            ),
            Self::KeyLimitAboveRoom { max_key_len, room } => write!(
                f,
                "keys of up to {max_key_len} bytes do not fit the {room} bytes the resource prefix leaves under the resource-name bound: lower the longest key or use a shorter prefix"
            ),
        }
    }
}

impl std::error::Error for KeyBoundError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_joined_keys_unambiguous() {
        let join = |a: &str, b: &str| format!("{}:{}", lock_key(a).unwrap(), lock_key(b).unwrap());
        assert_ne!(join("a:b", "c"), join("a", "b:c"));
        assert_eq!(lock_key("%3A").unwrap(), "%253A");
        assert_ne!(lock_key("%3A").unwrap(), lock_key(":").unwrap());
    }

    #[test]
    fn path_prefixes_take_whole_segments() {
        let k = |p: &str, n: usize, path: &str| path_prefix_key(p, n, path);
        assert_eq!(
            k("/orders/", 1, "/orders/42").as_deref(),
            Some("/orders/42")
        );
        assert_eq!(k("orders", 1, "/orders"), None);
        assert_eq!(k("/orders", 1, "/orders/"), None);
        assert_eq!(k("/orders", 1, "/orders//pay"), None);
        assert_eq!(k("/orders", 1, "/orders-archive/1"), None);
        assert_eq!(k("/admin", 0, "/admin/migrate").as_deref(), Some("/admin"));
        assert_eq!(k("/", 1, "/a/b").as_deref(), Some("/a"));
        assert_eq!(k("/", 1, "/"), None);
        assert_eq!(
            k("/t", 2, "/t/acme/100%25/x").as_deref(),
            Some("/t/acme/100%2525")
        );
    }

    #[test]
    fn path_params_are_decoded_then_escaped() {
        assert_eq!(
            path_param_key("id", Some("a%3Ab")),
            Key::Lock("a%3Ab".into())
        );
        assert_eq!(path_param_key("id", Some("a:b")), Key::Lock("a%3Ab".into()));
        assert_eq!(
            path_param_key("id", Some("100%25")),
            Key::Lock("100%25".into())
        );
        assert_eq!(
            path_param_key("id", Some("%FF"))
                .rejection()
                .map(|p| p.status),
            Some(400)
        );
        assert_eq!(
            path_param_key("id", None).rejection().map(|p| p.status),
            Some(500)
        );
    }
}
