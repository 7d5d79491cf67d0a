//! The request's idempotency key: the header, its rule, and the record's id.

use std::fmt;

use redlock_http::{BadKey, header_key, lock_key};

/// The request header carrying the key unless told otherwise
/// ([`header`](crate::Idempotency::header)).
pub const DEFAULT_HEADER: &str = "idempotency-key";

/// The longest key taken unless told otherwise
/// ([`max_key_len`](crate::Idempotency::max_key_len)), in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

/// A request's idempotency key, as the header gave it (validated).
///
/// The header takes what the IETF draft (`draft-ietf-httpapi-idempotency-key-header`)
/// and the usual clients send: a token (`Idempotency-Key: 8e03978e-40d5`) or a quoted
/// string (`Idempotency-Key: "8e03978e-40d5"`, the quotes are not part of the key),
/// given once, visible ASCII, at most `max_key_len` bytes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key of a request whose header `name` has these values: `Ok(None)` when it has
    /// none and the key is optional.
    ///
    /// ```
    /// use redlock_idempotency::IdempotencyKey;
    ///
    /// let key = |v: &'static [u8]| IdempotencyKey::from_header("idempotency-key", [v], true, 16);
    /// assert_eq!(key(b"abc-1").unwrap().unwrap().as_str(), "abc-1");
    /// assert_eq!(key(br#""abc-1""#).unwrap().unwrap().as_str(), "abc-1");
    /// assert!(key(b"").is_err());
    /// assert!(key(b"\"\"").is_err());
    /// assert!(key(b"0123456789abcdefX").is_err()); // longer than 16
    /// assert!(IdempotencyKey::from_header("idempotency-key", [], true, 16).is_err());
    /// assert_eq!(IdempotencyKey::from_header("idempotency-key", [], false, 16), Ok(None));
    /// ```
    ///
    /// # Errors
    ///
    /// A [`BadKey`] (answered `400`) saying what is wrong: missing while required, given
    /// twice, not visible ASCII, empty, or too long.
    pub fn from_header<'a>(
        name: &str,
        values: impl IntoIterator<Item = &'a [u8]>,
        required: bool,
        max_len: usize,
    ) -> Result<Option<Self>, BadKey> {
        let Some(text) = header_key(name, values, required)? else {
            return Ok(None);
        };
        let text = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            Some(inner) if inner.contains(['"', '\\']) => {
                return Err(BadKey::new(format!(
                    "the `{name}` header's quoted key must not contain quotes or backslashes"
                )));
            }
            Some(inner) => inner,
            None => text,
        };
        if text.is_empty() {
            return Err(BadKey::new(format!("the `{name}` header is empty")));
        }
        if text.len() > max_len {
            return Err(BadKey::new(format!(
                "the `{name}` header is too long: keys may be at most {max_len} bytes"
            )));
        }
        Ok(Some(Self(text.to_owned())))
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id of a key's record, which is also its lock's key (after the resource prefix):
/// the scope and the key, each by the web crates' [`lock_key`] rule, joined by `:`;
/// only the key when there is no scope. Since neither part contains a `:` once escaped,
/// two scopes never share an id.
///
/// ```
/// use redlock_idempotency::{IdempotencyKey, record_id};
///
/// let key = IdempotencyKey::from_header("k", [&b"k:1"[..]], true, 64).unwrap().unwrap();
/// assert_eq!(record_id(Some("tenant:7"), &key), "tenant%3A7:k%3A1");
/// assert_eq!(record_id(None, &key), "k%3A1");
/// assert_eq!(record_id(Some(""), &key), "%:k%3A1"); // an empty scope is still a scope
/// ```
pub fn record_id(scope: Option<&str>, key: &IdempotencyKey) -> String {
    // A validated key is never empty; `lock_key` refuses only empty values.
    let key = lock_key(key.as_str()).unwrap_or_default();
    match scope {
        None => key,
        // An empty scope gets a name no escaped value has (a lone `%`).
        Some("") => format!("%:{key}"),
        Some(scope) => format!("{}:{key}", lock_key(scope).unwrap_or_default()),
    }
}

/// The scope named by a request header with these values (the web crates'
/// `scope_header`): exactly one value, visible ASCII once trimmed (no spaces inside).
/// `None` otherwise, which the middleware answers `400`: a request whose scope is
/// missing or ambiguous must not share records with anyone.
///
/// ```
/// use redlock_idempotency::scope_from_header;
///
/// assert_eq!(scope_from_header([&b" acme "[..]]).as_deref(), Some("acme"));
/// assert_eq!(scope_from_header([]), None);
/// assert_eq!(scope_from_header([&b"  "[..]]), None);
/// assert_eq!(scope_from_header([&b"a b"[..]]), None);
/// assert_eq!(scope_from_header([&b"a"[..], &b"b"[..]]), None);
/// assert_eq!(scope_from_header([&b"caf\xc3\xa9"[..]]), None);
/// ```
pub fn scope_from_header<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<String> {
    let mut values = values.into_iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let value = std::str::from_utf8(value).ok()?.trim();
    let visible = !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic());
    visible.then(|| value.to_owned())
}
