//! [`Global`]: one key for every request.

use http::Request;

use super::{Global, Key, KeyExtractor};

impl<B> KeyExtractor<B> for Global {
    fn extract(&self, _request: &Request<B>) -> Key {
        self.key()
    }
}
