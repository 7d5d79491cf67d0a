//! [`IdempotencyLayer`]: the options, and the layer that wraps a service.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use redlock_core::Redlock;
use redlock_idempotency::{Idempotency, Store};
use tower_layer::Layer;

use super::service::IdempotencyService;

/// The scope hook: whose key the request's is.
pub(crate) type Scope = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// Runs each request with an `Idempotency-Key` once, cluster-wide, and replays its
/// response to retries (see the [module docs](super)).
///
/// The options are those of [`redlock_idempotency::Idempotency`] (same names, defaults
/// and meanings, and the same in `redlock-actix`); each method here sets the core's:
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | [`header`](Self::header) | `Idempotency-Key` | the request header with the key |
/// | [`required`](Self::required) | `true` | no key: `400`; `false`: the request passes through, unprotected |
/// | [`scope`](Self::scope), [`scope_header`](Self::scope_header) | none | whose key it is: the subject, the tenant; a configured scope that names none: `400` |
/// | [`resource_prefix`](Self::resource_prefix) | `idempotency:` | the locks' resource names |
/// | [`ttl`](Self::ttl) | the client's `default_ttl` | the lock's TTL, extended while the handler runs |
/// | [`fail_fast`](Self::fail_fast) | yes | a request while its key's first one runs: `409` at once |
/// | [`wait`](Self::wait) | | wait up to a deadline for the first to finish, then replay its response |
/// | [`max_hold`](Self::max_hold) | the client's | no extension past this |
/// | [`expire_after`](Self::expire_after) | 24 h | how long records live after their run |
/// | [`max_body`](Self::max_body) | 1 MiB | the largest response body stored; larger ones are answered, not stored |
/// | [`max_request_body`](Self::max_request_body) | 1 MiB | the largest request body taken; larger: `413` |
/// | [`max_key_len`](Self::max_key_len) | 255 | the longest key, in bytes; escaped and joined to its escaped scope, it must also fit the room the resource prefix leaves under the 512-byte resource-name bound (`room()`: 500 bytes by default), else `400` naming the bound |
/// | [`fingerprint_headers`](Self::fingerprint_headers) | none | request headers that are part of the fingerprint |
/// | [`store_if`](Self::store_if) | `2xx`, `4xx` | which statuses are stored |
/// | [`store_timeout`](Self::store_timeout) | 2 s | how long a store operation may take (then `503`) |
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(crate) core: Idempotency,
    pub(crate) scope: Option<Scope>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("core", &self.core)
            .field("scoped", &self.scope.is_some())
            .finish()
    }
}

impl IdempotencyLayer {
    /// Keys locked with `redlock`, records kept in `store`, default options.
    pub fn new(redlock: Redlock, store: impl Store) -> Self {
        Self::from_core(Idempotency::new(redlock, store))
    }

    /// A layer over a configured core (shared with other layers, or with an
    /// actix-web app through `redlock-actix`).
    pub fn from_core(idempotency: Idempotency) -> Self {
        Self {
            core: idempotency,
            scope: None,
        }
    }

    /// The core: its options, its store, its lock client.
    pub fn core(&self) -> &Idempotency {
        &self.core
    }

    fn core_option(mut self, set: impl FnOnce(Idempotency) -> Idempotency) -> Self {
        self.core = set(self.core);
        self
    }

    /// The request header with the key (default `Idempotency-Key`).
    #[must_use]
    pub fn header(self, name: impl Into<String>) -> Self {
        self.core_option(|c| c.header(name))
    }

    /// Whether requests must carry a key (default `true`: `400` without one). `false`:
    /// a request without a key passes through, unprotected.
    #[must_use]
    pub fn required(self, required: bool) -> Self {
        self.core_option(|c| c.required(required))
    }

    /// Whose key a request's is: `scope` reads it from the request (the authenticated
    /// subject from the extensions, a tenant header). Two scopes never share a record.
    /// A request for which it returns `None` is refused with `400`.
    ///
    /// ```
    /// use redlock_tower::Redlock;
    /// use redlock_tower::idempotency::IdempotencyLayer;
    /// use redlock_idempotency::store::RedisStore;
    ///
    /// #[derive(Clone)]
    /// struct Subject(String); // set by the authentication layer
    ///
    /// fn layer(redlock: Redlock, store: RedisStore) -> IdempotencyLayer {
    ///     IdempotencyLayer::new(redlock, store)
    ///         .scope(|parts| parts.extensions.get::<Subject>().map(|s| s.0.clone()))
    /// }
    /// ```
    #[must_use]
    pub fn scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// [`scope`](Self::scope) from a request header (a tenant id): its value, trimmed,
    /// when it is one header of visible ASCII; else the request has no scope (`400`).
    #[must_use]
    pub fn scope_header(self, name: impl Into<String>) -> Self {
        let name = name.into().to_ascii_lowercase();
        self.scope(move |parts| header_scope(parts, &name))
    }

    /// The locks' resource names: `prefix` and the record's id (default
    /// `idempotency:`).
    #[must_use]
    pub fn resource_prefix(self, prefix: impl Into<String>) -> Self {
        self.core_option(|c| c.resource_prefix(prefix))
    }

    /// The lock's TTL (default: the client's). It is extended while the handler runs;
    /// it is how long a replica that died mid-request blocks its key's retries.
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.core_option(|c| c.ttl(ttl))
    }

    /// A request whose key's first request still runs: `409` at once (the default).
    #[must_use]
    pub fn fail_fast(self) -> Self {
        self.core_option(Idempotency::fail_fast)
    }

    /// A request whose key's first request still runs: wait up to `deadline` for it to
    /// finish, then replay its response; `409` if it still runs at the deadline.
    #[must_use]
    pub fn wait(self, deadline: Duration) -> Self {
        self.core_option(|c| c.wait(deadline))
    }

    /// No lock extension past `max_hold` after the acquisition (default: the client's).
    #[must_use]
    pub fn max_hold(self, max_hold: Duration) -> Self {
        self.core_option(|c| c.max_hold(max_hold))
    }

    /// How long a record lives after its run finished (default 24 h).
    #[must_use]
    pub fn expire_after(self, expire_after: Duration) -> Self {
        self.core_option(|c| c.expire_after(expire_after))
    }

    /// The largest response body stored, in bytes (default 1 MiB). A larger response
    /// is answered whole but not stored: retries get `409`.
    #[must_use]
    pub fn max_body(self, bytes: usize) -> Self {
        self.core_option(|c| c.max_body(bytes))
    }

    /// The largest request body taken, in bytes (default 1 MiB): it is read whole to
    /// fingerprint it, then handed to the inner service. A larger one: `413`.
    #[must_use]
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.core_option(|c| c.max_request_body(bytes))
    }

    /// The longest key taken, in bytes (default 255); a longer one: `400`. Once
    /// escaped (`%` and `:` take three bytes) and joined to its escaped scope, a key
    /// must also fit the room the [`resource_prefix`](Self::resource_prefix) leaves
    /// under the resource-name bound ([`Idempotency::room`]: 500 bytes by default),
    /// else `400` naming that bound.
    #[must_use]
    pub fn max_key_len(self, bytes: usize) -> Self {
        self.core_option(|c| c.max_key_len(bytes))
    }

    /// Request headers that are part of the fingerprint (default none).
    #[must_use]
    pub fn fingerprint_headers<I, S>(self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.core_option(|c| c.fingerprint_headers(names))
    }

    /// Which responses are stored, by status (default `2xx` and `4xx`). A response not
    /// stored lets the next request with the key run again.
    #[must_use]
    pub fn store_if(self, store_if: impl Fn(u16) -> bool + Send + Sync + 'static) -> Self {
        self.core_option(|c| c.store_if(store_if))
    }

    /// How long one store operation may take (default 2 s); then `503`.
    #[must_use]
    pub fn store_timeout(self, timeout: Duration) -> Self {
        self.core_option(|c| c.store_timeout(timeout))
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        // Checked where the service is built, once every option is set.
        if let Err(error) = self.core.room() {
            tracing::error!(%error, "idempotency misconfigured: every request with a key will be answered 500");
        }
        IdempotencyService {
            inner,
            core: self.core.clone(),
            scope: self.scope.clone(),
        }
    }
}

/// The scope in header `name`, by the core's rule (`scope_from_header`).
fn header_scope(parts: &Parts, name: &str) -> Option<String> {
    redlock_idempotency::scope_from_header(
        parts
            .headers
            .get_all(name)
            .iter()
            .map(http::HeaderValue::as_bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(values: &[&str]) -> Parts {
        let mut builder = http::Request::builder();
        for value in values {
            builder = builder.header("x-tenant", *value);
        }
        builder
            .body(())
            .map(|r| r.into_parts().0)
            .unwrap_or_else(|_| http::Request::new(()).into_parts().0)
    }

    #[test]
    fn scope_header_takes_one_visible_value() {
        assert_eq!(
            header_scope(&parts(&[" acme "]), "x-tenant").as_deref(),
            Some("acme")
        );
        assert_eq!(header_scope(&parts(&[]), "x-tenant"), None);
        assert_eq!(header_scope(&parts(&["  "]), "x-tenant"), None);
        assert_eq!(header_scope(&parts(&["a b"]), "x-tenant"), None);
        assert_eq!(header_scope(&parts(&["a", "b"]), "x-tenant"), None);
    }
}
