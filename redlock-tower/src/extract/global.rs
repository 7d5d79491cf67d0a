//! [`Global`]: one key for every request.

use http::Request;

use super::{Key, KeyExtractor};

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
