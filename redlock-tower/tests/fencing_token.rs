//! `FencingToken` as an axum handler's argument, through a real axum server and real
//! nodes: under the layer with fencing on, the handler gets the lock's token, rising
//! from one request to the next; a route the layer does not cover, a layer without
//! fencing, and a layer that failed open are refused before the handler runs, with a
//! problem body that names no settings and a log line that does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

mod common;

use common::*;
use redlock_tower::LockOptions;
use redlock_tower::extract::Global;
use redlock_tower::{FencingToken, fencing::MissingToken};

/// Answers the token, and counts its calls.
fn handler(calls: &Arc<AtomicUsize>) -> axum::routing::MethodRouter<(), std::convert::Infallible> {
    let calls = Arc::clone(calls);
    post(move |FencingToken(token): FencingToken| async move {
        calls.fetch_add(1, Ordering::SeqCst);
        token.to_string()
    })
}

/// `POST` with a request id; (status, content type, Retry-After, body).
async fn call(url: &str, id: &str) -> (StatusCode, String, Option<String>, String) {
    let response = http()
        .post(url)
        .header("x-request-id", id)
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (content_type, retry_after) = (header("content-type"), header("retry-after"));
    (
        response.status(),
        content_type.unwrap_or_default(),
        retry_after,
        response.text().await.unwrap(),
    )
}

/// The captured log line of the refusal of request `id`.
fn log_line(id: &str) -> String {
    let logs = redlock_testkit::logs::text();
    logs.lines()
        .find(|line| line.contains(id) && line.contains("no fencing token"))
        .unwrap_or_else(|| panic!("no log line for {id} in:\n{logs}"))
        .to_owned()
}

/// A 500 problem for request `id` whose body says `says` and names none of the
/// settings, with the log line naming `hint`.
fn assert_misconfigured(
    (status, content_type, retry_after, body): (StatusCode, String, Option<String>, String),
    id: &str,
    says: &str,
    hint: &str,
) {
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(retry_after, None);
    assert!(
        body.contains(r#""type":"urn:redlock:misconfigured""#),
        "{body}"
    );
    assert!(body.contains(says), "{body}");
    assert!(body.contains(&format!(r#""request_id":"{id}""#)), "{body}");
    for internal in [
        "LockLayer",
        "route_layer",
        "RedlockBuilder",
        "order:",
        "127.0.0.1",
    ] {
        assert!(!body.contains(internal), "{internal} in the body: {body}");
    }
    let line = log_line(id);
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(hint), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_under_a_fencing_layer_get_rising_tokens() {
    let cluster = Cluster::start(3).await;
    let layer = LockLayer::new(
        replica(&cluster, Duration::from_millis(200)),
        PathParam::new("id"),
    )
    .options(
        LockOptions::new()
            .resource_prefix("order:")
            .fencing(true)
            .wait(Duration::from_secs(2)),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let base =
        serve(Router::new().route("/orders/{id}/pay", handler(&calls).route_layer(layer))).await;

    let mut last = 0;
    for i in 0..2 {
        let (status, _, _, body) =
            call(&format!("{base}/orders/42/pay"), &format!("rise-{i}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let token: u64 = body.parse().unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A route added after `Router::layer` is not covered by it: no lock, no token, a 500
/// before the handler runs; the covered route works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_without_the_layer_is_a_500_naming_the_layer_in_the_log() {
    let cluster = Cluster::start(1).await;
    let layer = LockLayer::new(
        replica(&cluster, Duration::from_millis(200)),
        Global::new("g"),
    )
    .options(LockOptions::new().fencing(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/covered", handler(&calls))
        .layer(layer)
        .route("/uncovered", handler(&calls));
    let base = serve(app).await;

    let (status, _, _, body) = call(&format!("{base}/covered"), "covered-1").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let id = "no-lock-1";
    let reply = call(&format!("{base}/uncovered"), id).await;
    assert_misconfigured(
        reply,
        id,
        "no lock was taken for this request",
        "route_layer",
    );
    assert!(log_line(id).contains("/uncovered"), "{}", log_line(id));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_without_fencing_is_a_500_naming_the_fencing_switch_in_the_log() {
    let cluster = Cluster::start(1).await;
    // The test kit's client has fencing off; so does the layer, explicitly.
    let layer = LockLayer::new(
        replica(&cluster, Duration::from_millis(200)),
        Global::new("g"),
    )
    .options(LockOptions::new().fencing(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let base = serve(Router::new().route("/pay", handler(&calls).route_layer(layer))).await;

    let id = "fencing-off-1";
    let reply = call(&format!("{base}/pay"), id).await;
    assert_misconfigured(
        reply,
        id,
        "configured without fencing tokens",
        "LockOptions::fencing(true)",
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler ran");
}

/// No node reachable, the layer failing open: the request would run unlocked, so a
/// handler that needs a token is not called; the client gets the 503 of a fail-closed
/// layer, with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_that_failed_open_answers_503_to_a_fenced_handler() {
    // Nothing listens on port 1.
    let redlock = redlock_testkit::client_for(
        vec!["redis://127.0.0.1:1".to_owned()],
        Duration::from_millis(100),
    );
    let layer = LockLayer::new(redlock, Global::new("g"))
        .options(LockOptions::new().fencing(true).fail_open(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let base = serve(Router::new().route("/pay", handler(&calls).route_layer(layer))).await;

    let id = "failed-open-1";
    let (status, content_type, retry_after, body) = call(&format!("{base}/pay"), id).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(body.contains(&format!(r#""request_id":"{id}""#)), "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler ran");
    let line = log_line(id);
    assert!(line.contains("fail_open"), "{line}");
}

/// The plain function, for services that are not axum handlers.
#[test]
fn from_request_tells_a_request_without_a_lock() {
    let request = http::Request::post("/pay")
        .header("x-request-id", "plain-1")
        .body(())
        .unwrap();
    let rejection = FencingToken::from_request(&request).unwrap_err();
    assert_eq!(rejection.reason(), MissingToken::NoLock);
    assert_eq!(rejection.request_id(), Some("plain-1"));
    assert_eq!(rejection.to_response().status(), 500);
    // The client's answer names none of the settings; the log's (`Display`) does.
    let json = rejection.problem().to_json();
    assert!(json.contains(r#""status":500"#), "{json}");
    assert!(json.contains(r#""request_id":"plain-1""#), "{json}");
    assert!(
        !json.contains("LockLayer") && !json.contains("route_layer"),
        "{json}"
    );
    assert!(rejection.to_string().contains("route_layer"));
}
