//! [`PathParam`]: the key from a path parameter of an axum route (feature `axum`).

use axum::extract::MatchedPath;
use http::Request;
use redlock_http::Problem;

use super::{Key, KeyExtractor, PathParam};

/// [`PathParam`]'s key from a path parameter of the axum route, e.g. `id` in
/// `/orders/{id}/pay` (feature `axum`).
///
/// Use the layer with `Router::route_layer` (or `Router::layer`): axum has matched
/// the route by then and put [`MatchedPath`] into the request's extensions; the
/// value is read from the request path at the parameter's place in that template,
/// percent-decoded as axum's `Path` extractor does (a `{*wildcard}` takes the rest
/// of the path). Nested routers work: the original URI (axum's `OriginalUri`) is used
/// when present ([`redlock_http::key::sent_path`]).
///
/// Answers `500` when the layer sits where no route was matched (outside the
/// `Router`, or on a fallback), the route has no such parameter, or the router is not
/// axum 0.8: configuration mistakes, told in the server's log (the client gets a
/// generic body). A value that is not UTF-8 once decoded is refused with `400`.
///
/// Needs the crate's `axum` feature, and axum 0.8: the parameter is read from axum
/// 0.8's request extensions, which another axum version's `Router` does not set.
///
/// ```
/// use axum::{Extension, Router, body::Body, routing::post};
/// use http::{Request, StatusCode};
/// use redlock_core::LockHandle;
/// use redlock_tower::{LockLayer, LockOptions, extract::PathParam};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock_core::BoxError> {
/// # let cluster = redlock_testkit::Cluster::start(1).await;
/// # let redlock = redlock_core::Redlock::builder()
/// #     .nodes(cluster.urls())
/// #     .restart_quarantine(false) // the test node was started a moment ago
/// #     .build()?;
/// let app: Router = Router::new()
///     .route(
///         "/orders/{id}/pay",
///         post(|Extension(lock): Extension<LockHandle>| async move {
///             format!("paid under {}", lock.resource())
///         }),
///     )
///     .route_layer(
///         LockLayer::new(redlock, PathParam::new("id"))
///             .options(LockOptions::new().resource_prefix("order:")),
///     );
///
/// let pay = Request::post("/orders/42/pay").body(Body::empty())?;
/// let response = app.oneshot(pay).await?;
/// assert_eq!(response.status(), StatusCode::OK);
/// let body = axum::body::to_bytes(response.into_body(), 1024).await?;
/// assert_eq!(body, "paid under order:42");
/// # Ok(())
/// # }
/// ```
impl<B> KeyExtractor<B> for PathParam {
    fn extract(&self, request: &Request<B>) -> Key {
        let Some(template) = request.extensions().get::<MatchedPath>() else {
            return Key::Reject(Problem::misconfigured(format!(
                "no axum 0.8 `MatchedPath` in the request for path parameter `{}`: either the lock layer is not added with `Router::route_layer` (it then sees requests before routing), or the router is not axum 0.8, the version redlock-tower's `axum` feature supports (an axum 0.7 `Router` compiles with the layer, but its extensions are other types: upgrade to axum 0.8, or use `extract::from_fn` with your own extractor)",
                self.name()
            )));
        };
        let path = crate::target::sent_path(request.uri(), request.extensions());
        match param_value(template.as_str(), path, self.name()) {
            Some(raw) => self.key(Some(&raw)),
            None => Key::Reject(Problem::misconfigured(format!(
                "route `{}` has no path parameter `{}` (or the path does not fit it)",
                template.as_str(),
                self.name()
            ))),
        }
    }
}

/// The raw value (still percent-encoded) of parameter `name` of route `template`
/// (axum syntax: `{name}`, `{*name}`) in `path`: `None` if the template has no such
/// parameter or the path does not fit it.
fn param_value(template: &str, path: &str, name: &str) -> Option<String> {
    let plain = format!("{{{name}}}");
    let wildcard = format!("{{*{name}}}");
    let mut path_segments = path.split('/');
    for segment in template.split('/') {
        if segment == wildcard {
            let rest: Vec<&str> = path_segments.collect();
            return Some(rest.join("/"));
        }
        let value = path_segments.next()?;
        if let Some((before, after)) = segment.split_once(plain.as_str()) {
            // A parameter may share its segment with literal text (`{file}.json`).
            let inner = value.strip_prefix(before)?.strip_suffix(after)?;
            return Some(inner.to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_parameters_from_templates() {
        let v = |t: &str, p: &str, n: &str| {
            param_value(t, p, n).map(|raw| redlock_http::key::path_param_key(n, Some(&raw)))
        };
        let lock = |k: &str| Some(Key::Lock(k.into()));
        assert_eq!(v("/orders/{id}/pay", "/orders/42/pay", "id"), lock("42"));
        assert_eq!(
            v("/t/{tenant}/o/{id}", "/t/acme/o/7", "tenant"),
            lock("acme")
        );
        assert_eq!(v("/t/{tenant}/o/{id}", "/t/acme/o/7", "id"), lock("7"));
        assert_eq!(v("/files/{*path}", "/files/a/b%20c", "path"), lock("a/b c"));
        assert_eq!(v("/r/{name}.json", "/r/x.json", "name"), lock("x"));
        assert_eq!(v("/orders/{id}", "/orders/%E2%82%AC", "id"), lock("€"));
        assert_eq!(v("/orders/{id}", "/orders/a%3Ab", "id"), lock("a%3Ab"));
        assert_eq!(v("/orders/{id}", "/orders/a:b", "id"), lock("a%3Ab"));
        let bad = v("/orders/{id}", "/orders/%FF", "id");
        assert_eq!(bad.and_then(|k| k.rejection().map(|p| p.status)), Some(400));
        assert_eq!(v("/orders/{id}", "/orders/100%", "id"), lock("100%25"));
        assert_eq!(v("/orders/{id}", "/orders/42", "other"), None);
        assert_eq!(v("/orders/{id}", "/orders", "id"), None);
    }
}
