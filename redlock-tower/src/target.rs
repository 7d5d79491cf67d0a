//! The request target as the client sent it, by the rule both web crates follow
//! ([`redlock_http::key::sent_target`]): under axum's `Router::nest`, the original URI that
//! axum keeps in the `OriginalUri` extension (feature `axum`), else the request's URI.

use http::{Extensions, Uri};

/// The URI a router kept before it stripped a nesting prefix, if any.
fn original(extensions: &Extensions) -> Option<&Uri> {
    #[cfg(feature = "axum")]
    {
        extensions
            .get::<axum::extract::OriginalUri>()
            .map(|original| &original.0)
    }
    #[cfg(not(feature = "axum"))]
    {
        let _ = extensions;
        None
    }
}

fn path_and_query(uri: &Uri) -> &str {
    uri.path_and_query()
        .map_or_else(|| uri.path(), |pq| pq.as_str())
}

/// The path and query the client sent.
#[cfg(feature = "idempotency")]
pub(crate) fn sent_target<'a>(uri: &'a Uri, extensions: &'a Extensions) -> &'a str {
    redlock_http::key::sent_target(
        path_and_query(uri),
        original(extensions).map(path_and_query),
    )
}

/// The path the client sent.
pub(crate) fn sent_path<'a>(uri: &'a Uri, extensions: &'a Extensions) -> &'a str {
    redlock_http::key::sent_path(uri.path(), original(extensions).map(path_and_query))
}
