//! [`IdempotencyLayer`]: the options, and the layer that wraps a service.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use redlock_idempotency::Idempotency;
use tower_layer::Layer;

use super::service::IdempotencyService;

/// The scope hook: whose key the request's is.
pub(crate) type Scope = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// Runs each request with an `Idempotency-Key` once, cluster-wide, and replays its
/// response to retries (see the [module docs](super)).
///
/// Its options are the engine's, [`redlock_idempotency::Idempotency`] (the same type
/// `redlock-actix`'s `IdempotencyMiddleware` takes; the table is there); the layer adds
/// only what reads a tower request: [`scope`](Self::scope) and
/// [`scope_header`](Self::scope_header) (whose key it is: the subject, the tenant; a
/// configured scope that names none: `400`).
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
    /// The middleware of `idempotency`: its options, its store, its lock client.
    pub fn new(idempotency: Idempotency) -> Self {
        Self {
            core: idempotency,
            scope: None,
        }
    }

    /// The engine: its options, its store, its lock client.
    pub fn core(&self) -> &Idempotency {
        &self.core
    }

    /// Whose key a request's is: `scope` reads it from the request (the authenticated
    /// subject from the extensions, a tenant header). Two scopes never share a record.
    /// A request for which it returns `None` is refused with `400`.
    ///
    /// ```
    /// use redlock_core::Redlock;
    /// use redlock_tower::idempotency::{Idempotency, IdempotencyLayer};
    /// use redlock_idempotency::store::RedisStore;
    ///
    /// #[derive(Clone)]
    /// struct Subject(String); // set by the authentication layer
    ///
    /// fn layer(redlock: Redlock, store: RedisStore) -> IdempotencyLayer {
    ///     IdempotencyLayer::new(Idempotency::new(redlock, store))
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
