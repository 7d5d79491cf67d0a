//! The request's idempotency key: the header, its rule, and the record's id.

use std::fmt;

use redlock_http::key::{BadKey, lock_key};

/// The request header carrying the key unless told otherwise
/// ([`header`](crate::Idempotency::header)).
pub const DEFAULT_HEADER: &str = "idempotency-key";

/// The longest key taken unless told otherwise
/// ([`max_key_len`](crate::Idempotency::max_key_len)), in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

/// A request's idempotency key, as the header gave it (validated).
///
/// The header takes what the IETF draft (`draft-ietf-httpapi-idempotency-key-header`)
/// and the usual clients send, given once, surrounding spaces and tabs aside:
///
/// - a token: one or more visible ASCII characters (`!` to `~`) but `"` and `\`
///   (`Idempotency-Key: 8e03978e-40d5`; no spaces);
/// - or a quoted string: `"`, one or more visible ASCII characters but `"` and `\`, or
///   spaces, then `"` (`Idempotency-Key: "8e03978e-40d5"`, the draft's form); the
///   quotes are not part of the key.
///
/// Anything else is refused (`400`): a token with a space or a control character
/// inside, a lone leading or trailing quote, an empty quoted string, a backslash, a
/// byte outside ASCII. The key is at most `max_key_len` bytes; once escaped and joined
/// to its scope it must also fit the room under the resource-name bound
/// ([`Idempotency::room`](crate::Idempotency::room)).
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
    /// assert!(key(b"a b").is_err()); // a token has no spaces...
    /// assert_eq!(key(br#""a b""#).unwrap().unwrap().as_str(), "a b"); // ...a quoted string may
    /// assert!(key(br#""abc"#).is_err()); // an unmatched quote
    /// assert!(key(b"ab").is_err()); // a control character
    /// assert!(IdempotencyKey::from_header("idempotency-key", [], true, 16).is_err());
    /// assert_eq!(IdempotencyKey::from_header("idempotency-key", [], false, 16), Ok(None));
    /// ```
    ///
    /// # Errors
    ///
    /// A [`BadKey`] (answered `400`) saying what is wrong: missing while required, given
    /// twice, neither a token nor a quoted string (see [`IdempotencyKey`]), empty, or
    /// too long.
    pub fn from_header<'a>(
        name: &str,
        values: impl IntoIterator<Item = &'a [u8]>,
        required: bool,
        max_len: usize,
    ) -> Result<Option<Self>, BadKey> {
        let Some(value) = redlock_http::key::single_header_value(name, values, required)? else {
            return Ok(None);
        };
        let key = parse(name, value)?;
        if key.len() > max_len {
            return Err(BadKey::new(format!(
                "the `{name}` header is too long: keys may be at most {max_len} bytes"
            )));
        }
        Ok(Some(Self(key.to_owned())))
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `b` may stand in a token: visible ASCII but `"` and `\`.
fn token_byte(b: u8) -> bool {
    b.is_ascii_graphic() && b != b'"' && b != b'\\'
}

/// The key in one header value, by the grammar of [`IdempotencyKey`]: surrounding
/// spaces and tabs dropped, then a token, or a quoted string whose quotes are not part
/// of the key.
fn parse<'a>(name: &str, value: &'a [u8]) -> Result<&'a str, BadKey> {
    let start = value
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |last| last + 1);
    let value = value.get(start..end).unwrap_or_default();
    let key = match value {
        [] | [b'"', b'"'] => {
            return Err(BadKey::new(format!("the `{name}` header is empty")));
        }
        [b'"', inner @ .., b'"'] => {
            if !inner.iter().all(|&b| b == b' ' || token_byte(b)) {
                return Err(BadKey::new(format!(
                    "the `{name}` header's quoted key may hold visible ASCII and spaces only, without quotes or backslashes"
                )));
            }
            inner
        }
        [b'"', ..] | [.., b'"'] => {
            return Err(BadKey::new(format!(
                "the `{name}` header has an unmatched quote: send a token, or a key in a pair of quotes"
            )));
        }
        token => {
            if !token.iter().all(|&b| token_byte(b)) {
                return Err(BadKey::new(format!(
                    "the `{name}` header must be a token (visible ASCII without spaces, quotes or backslashes) or a quoted string"
                )));
            }
            token
        }
    };
    // Visible ASCII and spaces only: UTF-8.
    std::str::from_utf8(key)
        .map_err(|_| BadKey::new(format!("the `{name}` header must be visible ASCII")))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &[u8]) -> Result<Option<String>, BadKey> {
        IdempotencyKey::from_header("idempotency-key", [value], true, 64)
            .map(|key| key.map(|k| k.as_str().to_owned()))
    }

    #[test]
    fn the_grammar_is_a_token_or_a_quoted_string() {
        let ok = |v: &[u8], k: &str| assert_eq!(key(v), Ok(Some(k.to_owned())), "{v:?}");
        let bad = |v: &[u8]| assert!(key(v).is_err(), "{v:?} was taken");
        ok(b"8e03978e-40d5", "8e03978e-40d5");
        ok(b"  k:1\t", "k:1");
        ok(br#""8e03978e-40d5""#, "8e03978e-40d5");
        ok(br#""a b""#, "a b");
        ok(br#" "k" "#, "k");
        // Inner spaces in a token.
        bad(b"a b");
        bad(b"a\tb");
        // A lone leading or trailing quote, or a quote inside.
        bad(br#""abc"#);
        bad(br#"abc""#);
        bad(br#"a"b"#);
        bad(br#"""#);
        bad(br#""a"b""#);
        // Empty, quoted or not.
        bad(b"");
        bad(b"   ");
        bad(br#""""#);
        bad(br#" "" "#);
        // Control characters, backslashes, bytes outside ASCII.
        bad(b"a\x01b");
        bad(b"a\x7fb");
        bad(b"\"a\tb\"");
        bad(b"\"a\x00\"");
        bad(br"a\b");
        bad(br#""a\"b""#);
        bad(b"caf\xc3\xa9");
    }

    #[test]
    fn header_rules_around_the_grammar() {
        let from = |values: &[&[u8]], required| {
            IdempotencyKey::from_header("k", values.iter().copied(), required, 4)
        };
        assert!(from(&[], true).is_err());
        assert_eq!(from(&[], false), Ok(None));
        assert!(from(&[b"a", b"b"], true).is_err());
        assert!(from(&[b"abcde"], true).is_err());
        assert!(from(&[br#""abcd""#], true).is_ok()); // the quotes do not count
    }
}
