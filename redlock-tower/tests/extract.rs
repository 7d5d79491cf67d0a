//! The built-in extractors and key closures, without a server: their keys, and which
//! requests they pass or refuse.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use http::Request;
use redlock_http::Problem;
use redlock_tower::extract::{BadKey, Global, Header, Key, KeyExtractor, PathPrefix, from_fn};

fn req(path: &str) -> Request<()> {
    Request::get(path).body(()).unwrap()
}

#[test]
fn header_optional_required_and_invalid() {
    let optional = Header::new("idempotency-key");
    let required = Header::new("idempotency-key").required();
    assert_eq!(optional.extract(&req("/")), Key::Pass);
    let missing = required.extract(&req("/"));
    assert_eq!(missing.rejection().map(|p| p.status), Some(400));
    assert!(
        missing
            .rejection()
            .unwrap()
            .detail
            .contains("idempotency-key")
    );

    let with = |v: &[u8]| {
        Request::get("/")
            .header("idempotency-key", http::HeaderValue::from_bytes(v).unwrap())
            .body(())
            .unwrap()
    };
    assert_eq!(required.extract(&with(b" abc ")), Key::Lock("abc".into()));
    for bad in [&b""[..], b"  ", "é".as_bytes()] {
        let got = optional.extract(&with(bad));
        assert_eq!(got.rejection().map(|p| p.status), Some(400), "{bad:?}");
    }
    let twice = Request::get("/")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(())
        .unwrap();
    assert_eq!(
        optional.extract(&twice).rejection().map(|p| p.status),
        Some(400)
    );
}

#[test]
fn path_prefix_takes_whole_segments() {
    let p = PathPrefix::new("/orders/");
    assert_eq!(
        p.extract(&req("/orders/42/pay")),
        Key::Lock("/orders/42".into())
    );
    assert_eq!(
        p.extract(&req("/orders/42")),
        Key::Lock("/orders/42".into())
    );
    assert_eq!(
        p.extract(&req("/orders/42?x=1")),
        Key::Lock("/orders/42".into())
    );
    assert_eq!(p.extract(&req("/orders")), Key::Pass);
    assert_eq!(p.extract(&req("/orders/")), Key::Pass);
    assert_eq!(p.extract(&req("/orders//pay")), Key::Pass);
    assert_eq!(p.extract(&req("/orders-archive/1")), Key::Pass);
    assert_eq!(p.extract(&req("/health")), Key::Pass);

    let two = PathPrefix::new("tenants").segments(3);
    assert_eq!(
        two.extract(&req("/tenants/acme/orders/7/pay")),
        Key::Lock("/tenants/acme/orders/7".into())
    );
    assert_eq!(two.extract(&req("/tenants/acme/orders")), Key::Pass);

    let whole = PathPrefix::new("/admin").segments(0);
    assert_eq!(
        whole.extract(&req("/admin/migrate")),
        Key::Lock("/admin".into())
    );
    let root = PathPrefix::new("/");
    assert_eq!(root.extract(&req("/a/b")), Key::Lock("/a".into()));
    assert_eq!(root.extract(&req("/")), Key::Pass);
}

#[test]
fn global_and_closures() {
    assert_eq!(Global::new("g").extract(&req("/x")), Key::Lock("g".into()));
    let f = |r: &Request<()>| Ok::<_, BadKey>((r.uri().path() == "/x").then(|| "k".to_owned()));
    assert_eq!(f.extract(&req("/x")), Key::Lock("k".into()));
    assert_eq!(f.extract(&req("/y")), Key::Pass);
    let refuse = |_: &Request<()>| Err::<Option<String>, _>(BadKey::new("no tenant"));
    assert_eq!(
        refuse.extract(&req("/")).rejection().map(|p| p.status),
        Some(400)
    );
    let reject = from_fn(|_: &Request<()>| Key::Reject(Problem::bad_key("no".into())));
    assert!(reject.extract(&req("/")).rejection().is_some());
}

#[test]
fn an_invalid_header_name_is_the_servers_mistake_not_a_panic() {
    let invalid = Header::new("not a header");
    assert!(invalid.name().is_none());
    let got = invalid.extract(&req("/"));
    assert_eq!(got.rejection().map(|p| p.status), Some(500));
}

#[test]
fn values_are_escaped_by_the_rule_of_both_web_crates() {
    let with = |v: &'static str| {
        Request::get("/")
            .header("idempotency-key", v)
            .body(())
            .unwrap()
    };
    let header = Header::new("Idempotency-Key");
    assert_eq!(header.extract(&with("a:b")), Key::Lock("a%3Ab".into()));
    assert_eq!(header.extract(&with("100%")), Key::Lock("100%25".into()));
    assert_eq!(
        Global::new("jobs:import").extract(&req("/")),
        Key::Lock("jobs%3Aimport".into())
    );
    let closure = |_: &Request<()>| Ok::<_, BadKey>(Some("a:b"));
    assert_eq!(closure.extract(&req("/")), Key::Lock("a%3Ab".into()));
    let empty = |_: &Request<()>| Ok::<_, BadKey>(Some(""));
    assert_eq!(
        empty.extract(&req("/")).rejection().map(|p| p.status),
        Some(400)
    );
    assert_eq!(
        PathPrefix::new("/o").extract(&req("/o/a:b/pay")),
        Key::Lock("/o/a%3Ab".into())
    );
}

/// `PathParam`'s key for `path` on an axum route `template`, as a handler on the route
/// sees it (axum puts the matched route into the request): the key, `pass`, or the
/// rejection's status.
async fn param_key(template: &str, name: &str, path: &str) -> String {
    use axum::Router;
    use axum::routing::get;
    use redlock_tower::extract::PathParam;
    use tower::ServiceExt;

    let param = PathParam::new(name);
    let app: Router = Router::new().route(
        template,
        get(move |request: axum::extract::Request| async move {
            match param.extract(&request) {
                Key::Lock(key) => key,
                Key::Pass => "pass".to_owned(),
                Key::Reject(problem) => format!("rejected {}", problem.status),
                _ => "other".to_owned(),
            }
        }),
    );
    let request = Request::get(path).body(axum::body::Body::empty()).unwrap();
    let response = app.oneshot(request).await.unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn path_parameters_are_read_from_the_matched_route() {
    for (template, name, path, key) in [
        ("/orders/{id}/pay", "id", "/orders/42/pay", "42"),
        ("/t/{tenant}/o/{id}", "tenant", "/t/acme/o/7", "acme"),
        ("/t/{tenant}/o/{id}", "id", "/t/acme/o/7", "7"),
        ("/files/{*path}", "path", "/files/a/b%20c", "a/b c"),
        ("/orders/{id}", "id", "/orders/%E2%82%AC", "€"),
        ("/orders/{id}", "id", "/orders/a%3Ab", "a%3Ab"),
        ("/orders/{id}", "id", "/orders/a:b", "a%3Ab"),
        ("/orders/{id}", "id", "/orders/100%", "100%25"),
        ("/orders/{id}", "id", "/orders/%FF", "rejected 400"),
        // The server's mistake: the route has no such parameter.
        ("/orders/{id}", "other", "/orders/42", "rejected 500"),
    ] {
        assert_eq!(
            param_key(template, name, path).await,
            key,
            "{template} {path}"
        );
    }
    // Outside a router (or before routing): no matched route, the server's mistake.
    let outside = redlock_tower::extract::PathParam::new("id").extract(&req("/orders/1"));
    assert_eq!(outside.rejection().map(|p| p.status), Some(500));
}
