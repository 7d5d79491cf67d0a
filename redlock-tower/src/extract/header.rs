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
/// ([`redlock_http::key::header_lock_key`]): `Idempotency-Key: a:b` locks `a%3Ab`, as in
/// `redlock-actix`.
#[derive(Debug, Clone)]
pub struct Header {
    /// The name, or the literal that is not a valid one.
    name: Result<HeaderName, &'static str>,
    required: bool,
}

impl Header {
    /// The key from header `name` (any case: `"Idempotency-Key"`).
    ///
    /// `name` is a literal; one that is not a valid header name (a programming error,
    /// like an invalid literal route in a router) makes every request answered `500`,
    /// the name in the server's log. Use [`from_name`](Self::from_name) for a name
    /// checked where it is made.
    pub fn new(name: &'static str) -> Self {
        Self {
            name: HeaderName::from_bytes(name.as_bytes()).map_err(|_| name),
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

    /// The header's name (`None` for a literal given to [`new`](Self::new) that is not
    /// a valid one).
    pub fn name(&self) -> Option<&HeaderName> {
        self.name.as_ref().ok()
    }
}

impl<B> KeyExtractor<B> for Header {
    fn extract(&self, request: &Request<B>) -> Key {
        let name = match &self.name {
            Ok(name) => name,
            Err(literal) => {
                return Key::Reject(redlock_http::Problem::misconfigured(format!(
                    "`{literal}` given to `redlock_tower::extract::Header::new` is not a valid header name"
                )));
            }
        };
        let values = request
            .headers()
            .get_all(name)
            .iter()
            .map(http::HeaderValue::as_bytes);
        redlock_http::key::header_lock_key(name.as_str(), values, self.required)
    }
}
