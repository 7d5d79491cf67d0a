//! [`Fingerprint`]: what makes two requests with the same key the same request.

use std::fmt;

use sha2::{Digest, Sha256};

/// A digest of what a request asks for: its method, its target (path and query), the
/// headers the options name ([`fingerprint_headers`](crate::Idempotency::fingerprint_headers)),
/// and its body. A retry must carry the same fingerprint as the request that ran to get
/// its response replayed; another request reusing the key gets `422`.
///
/// SHA-256 over the parts, each length-prefixed (so `("ab", "c")` and `("a", "bc")`
/// differ): no client can make two different requests share a fingerprint.
///
/// ```
/// use redlock_idempotency::Fingerprint;
///
/// let first = Fingerprint::builder("POST", "/refunds")
///     .header("content-type", b"application/json")
///     .body(br#"{"order":42}"#)
///     .finish();
/// let retry = Fingerprint::builder("POST", "/refunds")
///     .header("Content-Type", b"application/json") // names are case-insensitive
///     .body(br#"{"order":42}"#)
///     .finish();
/// let other = Fingerprint::builder("POST", "/refunds").body(br#"{"order":43}"#).finish();
/// assert_eq!(first, retry);
/// assert_ne!(first, other);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Starts a fingerprint of a request with this method and target (the path and the
    /// query, as sent).
    pub fn builder(method: &str, target: &str) -> FingerprintBuilder {
        let mut digest = Sha256::new();
        part(&mut digest, b"method", method.as_bytes());
        part(&mut digest, b"target", target.as_bytes());
        FingerprintBuilder { digest }
    }

    /// The digest's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint from its 32 bytes (as a store keeps it); `None` for another length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// The first 8 bytes in hex: enough to tell fingerprints apart in a log.
impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// Builds a [`Fingerprint`]: the method and target given, then headers and the body.
#[derive(Clone)]
pub struct FingerprintBuilder {
    digest: Sha256,
}

impl fmt::Debug for FingerprintBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FingerprintBuilder").finish_non_exhaustive()
    }
}

impl FingerprintBuilder {
    /// Adds a header's value (the name is lower-cased). Add the configured headers in
    /// the options' order, each value the request carries in its order.
    #[must_use]
    pub fn header(mut self, name: &str, value: &[u8]) -> Self {
        part(
            &mut self.digest,
            b"header",
            name.to_ascii_lowercase().as_bytes(),
        );
        part(&mut self.digest, b"value", value);
        self
    }

    /// Adds a configured header the request does not carry (so that "absent" and
    /// "empty" differ).
    #[must_use]
    pub fn absent_header(mut self, name: &str) -> Self {
        part(
            &mut self.digest,
            b"absent",
            name.to_ascii_lowercase().as_bytes(),
        );
        self
    }

    /// Adds the body.
    pub fn body(mut self, body: &[u8]) -> Self {
        part(&mut self.digest, b"body", body);
        self
    }

    /// The fingerprint.
    pub fn finish(self) -> Fingerprint {
        Fingerprint(self.digest.finalize().into())
    }
}

fn part(digest: &mut Sha256, tag: &[u8], value: &[u8]) {
    digest.update(tag);
    digest.update((value.len() as u64).to_be_bytes());
    digest.update(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_delimited() {
        let a = Fingerprint::builder("POST", "/ab").body(b"c").finish();
        let b = Fingerprint::builder("POST", "/a").body(b"bc").finish();
        assert_ne!(a, b);
        let absent = Fingerprint::builder("POST", "/")
            .absent_header("x")
            .body(b"")
            .finish();
        let empty = Fingerprint::builder("POST", "/")
            .header("x", b"")
            .body(b"")
            .finish();
        assert_ne!(absent, empty);
        assert_eq!(Fingerprint::from_bytes(a.as_bytes()), Some(a));
        assert_eq!(Fingerprint::from_bytes(&[0; 31]), None);
    }
}
