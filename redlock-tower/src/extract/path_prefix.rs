//! [`PathPrefix`]: the key from a path prefix and the segments after it.

use http::Request;

use super::{Key, KeyExtractor, checked};

/// The key is a path prefix plus the segments that follow it: with
/// `PathPrefix::new("/orders")`, `POST /orders/42/pay` and `GET /orders/42` share the
/// key `/orders/42`.
///
/// Requests outside the prefix, or with fewer segments after it than asked, pass
/// through unlocked. The prefix matches whole segments (`/orders` does not match
/// `/orders-archive/1`). Segments are taken as they appear in the URI
/// (percent-encoded), so equal paths give equal keys.
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
        let path = request.uri().path();
        let rest = if self.prefix == "/" {
            path
        } else {
            match path.strip_prefix(self.prefix.as_str()) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
                _ => return Key::Pass,
            }
        };
        let mut end = 0;
        for _ in 0..self.segments {
            let tail = &rest[end..];
            let Some(after_slash) = tail.strip_prefix('/') else {
                return Key::Pass;
            };
            let len = after_slash.find('/').unwrap_or(after_slash.len());
            if len == 0 {
                return Key::Pass;
            }
            end += 1 + len;
        }
        let mut key = String::with_capacity(self.prefix.len() + end);
        if self.prefix != "/" {
            key.push_str(&self.prefix);
        }
        key.push_str(&rest[..end]);
        if key.is_empty() {
            key.push('/');
        }
        checked(&key, || "the request path".to_owned())
    }
}
