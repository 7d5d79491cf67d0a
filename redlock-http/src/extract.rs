//! The key extractors that need no framework to decide: [`Global`], [`PathPrefix`],
//! [`PathParam`]. Written once here; `redlock_tower::extract` and
//! `redlock_actix::extract` re-export them and read the request for them (the path the
//! client sent, the matched route's parameter).

use crate::key::{Key, lock_key, path_param_key, path_prefix_key};

/// One key for every request: one request at a time through the middleware,
/// cluster-wide (e.g. on an admin route that runs migrations). The key is `key` as a
/// value ([`lock_key`]: `%` and `:` escaped).
#[derive(Debug, Clone)]
pub struct Global {
    key: String,
}

impl Global {
    /// Every request locks `key`.
    pub fn new(key: impl Into<String>) -> Self {
        Self { key: key.into() }
    }

    /// The decision, the same for every request.
    pub fn key(&self) -> Key {
        Key::from(lock_key(&self.key))
    }
}

/// The key is a path prefix plus the segments that follow it: with
/// `PathPrefix::new("/orders")`, `POST /orders/42/pay` and `GET /orders/42` share the
/// key `/orders/42`.
///
/// Requests outside the prefix, or with fewer segments after it than asked, pass
/// through unlocked. The prefix matches whole segments (`/orders` does not match
/// `/orders-archive/1`). Segments are taken as they appear in the URI
/// (percent-encoded), each escaped as a value ([`path_prefix_key`]).
///
/// The path is the one the client sent ([`sent_path`](crate::key::sent_path)): under axum's
/// `Router::nest("/api", ..)` (redlock-tower's feature `axum`) and actix's
/// `web::scope("/api")`, a request for `/api/orders/42` keys `/api/orders/42`. Give the
/// prefix with the nesting prefix: `PathPrefix::new("/api/orders")`.
#[derive(Debug, Clone)]
pub struct PathPrefix {
    prefix: String,
    segments: usize,
}

impl PathPrefix {
    /// Requests under `prefix` lock the prefix plus the next segment.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            segments: 1,
        }
    }

    /// How many segments after the prefix belong to the key (default 1; 0 makes the
    /// whole prefix one key).
    #[must_use]
    pub fn segments(mut self, n: usize) -> Self {
        self.segments = n;
        self
    }

    /// The decision for a request whose path, as the client sent it, is `path`.
    pub fn key(&self, path: &str) -> Key {
        Key::from_option(path_prefix_key(&self.prefix, self.segments, path))
    }
}

/// The key is a path parameter of the matched route, e.g. `id` in `/orders/{id}/pay`
/// (an axum route with redlock-tower's feature `axum`; a scope or resource in actix):
/// percent-decoded (UTF-8, else `400`), then escaped ([`path_param_key`]). A route
/// without the parameter is the server's mistake: `500`, its detail in the log.
#[derive(Debug, Clone)]
pub struct PathParam {
    name: String,
}

impl PathParam {
    /// The key from the route's parameter `name` (without braces).
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }

    /// The parameter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The decision for the parameter's raw (still percent-encoded) value, `None`
    /// when the route has none.
    pub fn key(&self, raw: Option<&str>) -> Key {
        path_param_key(&self.name, raw)
    }
}
