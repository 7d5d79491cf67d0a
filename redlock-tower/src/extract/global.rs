//! [`Global`]: one key for every request.

use http::Request;

use super::{Key, KeyExtractor};

/// One key for every request: the layer then lets one request at a time through,
/// cluster-wide (e.g. on an admin route that runs migrations). The key is `key` as a
/// value ([`redlock_http::lock_key`]: `%` and `:` escaped), as in `redlock-actix`.
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
        Key::from(redlock_http::lock_key(&self.key))
    }
}
