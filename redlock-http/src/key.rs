//! What a request header says of its lock key: the one rule both web crates follow.

/// The lock key a request carries in header `name`, given every value the request has
/// for it (`values`), trimmed of surrounding spaces.
///
/// - no value: `Ok(None)` (the request passes through unlocked), or, when `required`,
///   an error;
/// - more than one value: an error (which one would name the lock?);
/// - a value that is not visible ASCII (spaces and tabs inside allowed), or empty once
///   trimmed: an error.
///
/// Errors are the reason, for a `400` body ([`Problem::bad_key`](crate::Problem::bad_key)).
///
/// ```
/// use redlock_http::header_key;
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
/// The reason the header names no usable key, as above.
pub fn header_key<'a>(
    name: &str,
    values: impl IntoIterator<Item = &'a [u8]>,
    required: bool,
) -> Result<Option<&'a str>, String> {
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return if required {
            Err(format!("the `{name}` header is required"))
        } else {
            Ok(None)
        };
    };
    if values.next().is_some() {
        return Err(format!("the `{name}` header must be given once"));
    }
    let visible = value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b));
    let text = std::str::from_utf8(value)
        .ok()
        .filter(|_| visible)
        .ok_or_else(|| format!("the `{name}` header must be visible ASCII"))?
        .trim();
    if text.is_empty() {
        return Err(format!("the `{name}` header is empty"));
    }
    Ok(Some(text))
}
