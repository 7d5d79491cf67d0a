//! The request target as the client sent it ([`redlock_http::key::sent_target`]): under
//! axum's `Router::nest`, the `OriginalUri` axum keeps (feature `axum`), else the URI.

use http::{Extensions, Uri};

/// The target a router kept before it stripped a nesting prefix, if any.
fn original(extensions: &Extensions) -> Option<&str> {
    #[cfg(feature = "axum")]
    let original = extensions.get::<axum::extract::OriginalUri>().map(|o| &o.0);
    #[cfg(not(feature = "axum"))]
    let original: Option<&Uri> = {
        let _ = extensions;
        None
    };
    original.map(path_and_query)
}

fn path_and_query(uri: &Uri) -> &str {
    uri.path_and_query()
        .map_or_else(|| uri.path(), |pq| pq.as_str())
}

/// The path and query the client sent.
#[cfg(feature = "idempotency")]
pub(crate) fn sent_target<'a>(uri: &'a Uri, extensions: &'a Extensions) -> &'a str {
    redlock_http::key::sent_target(path_and_query(uri), original(extensions))
}

/// The path the client sent.
pub(crate) fn sent_path<'a>(uri: &'a Uri, extensions: &'a Extensions) -> &'a str {
    redlock_http::key::sent_path(uri.path(), original(extensions))
}
