//! [`Header`]: the key from a request header.

use super::{Key, KeyExtractor};
use http::Request;
use http::header::HeaderName;

/// The key is a request header's value, e.g. `Idempotency-Key` or a tenant id.
///
/// Without the header the request passes through unlocked, or, once
/// [`required`](Self::required), is refused with `400`. A value that is empty or not
/// visible ASCII, or given twice, is always refused with `400`, and so is one longer
/// than the client's [`max_resource_len`](redlock_core::RedlockBuilder::max_resource_len)
/// with the prefix. The key is the trimmed value with `%` and `:` escaped
/// ([`redlock_http::header_lock_key`]): `Idempotency-Key: a:b` locks `a%3Ab`, as in
/// `redlock-actix`.
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
        let values = request
            .headers()
            .get_all(&self.name)
            .iter()
            .map(http::HeaderValue::as_bytes);
        redlock_http::header_lock_key(self.name.as_str(), values, self.required)
    }
}
