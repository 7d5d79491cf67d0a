//! [`PathPrefix`]: the key from a path prefix and the segments after it.

use http::Request;

use super::{Key, KeyExtractor, PathPrefix};

/// The path the client sent ([`redlock_http::key::sent_path`]): under axum's
/// `Router::nest("/api", ..)` (feature `axum`), a layer inside the nested router sees
/// `/orders/42` but keys `/api/orders/42`, from axum's `OriginalUri`.
impl<B> KeyExtractor<B> for PathPrefix {
    fn extract(&self, request: &Request<B>) -> Key {
        self.key(crate::target::sent_path(
            request.uri(),
            request.extensions(),
        ))
    }
}
