//! [`PathPrefix`]: the key from a path prefix and the segments after it.

use http::Request;

use super::{Key, KeyExtractor};

/// The key is a path prefix plus the segments that follow it: with
/// `PathPrefix::new("/orders")`, `POST /orders/42/pay` and `GET /orders/42` share the
/// key `/orders/42`.
///
/// Requests outside the prefix, or with fewer segments after it than asked, pass
/// through unlocked. The prefix matches whole segments (`/orders` does not match
/// `/orders-archive/1`). Segments are taken as they appear in the URI
/// (percent-encoded), each escaped as a value ([`redlock_http::path_prefix_key`]), as
/// `redlock-actix`'s `PathPrefix` does.
///
/// The path is the one the client sent ([`redlock_http::sent_path`]): under axum's
/// `Router::nest("/api", ..)` (feature `axum`), a layer inside the nested router sees
/// `/orders/42` but keys `/api/orders/42`, from axum's `OriginalUri`, as a layer outside
/// it and actix's `web::scope("/api")` do. Give the prefix with the nesting prefix:
/// `PathPrefix::new("/api/orders")`.
#[derive(Debug, Clone)]
pub struct PathPrefix {
    prefix: String,
    segments: usize,
}

impl PathPrefix {
    /// Requests under `prefix` lock the prefix plus the next segment.
    pub fn new(prefix: impl Into<String>) -> Self {
        let mut prefix: String = prefix.into();
        while prefix.ends_with('/') {
            prefix.pop();
        }
        if !prefix.starts_with('/') {
            prefix.insert(0, '/');
        }
        Self {
            prefix,
            segments: 1,
        }
    }

    /// How many segments after the prefix belong to the key (default 1; 0 makes the
    /// whole prefix one key).
    pub fn segments(mut self, n: usize) -> Self {
        self.segments = n;
        self
    }
}

impl<B> KeyExtractor<B> for PathPrefix {
    fn extract(&self, request: &Request<B>) -> Key {
        Key::from_option(redlock_http::path_prefix_key(
            &self.prefix,
            self.segments,
            crate::target::sent_path(request.uri(), request.extensions()),
        ))
    }
}
