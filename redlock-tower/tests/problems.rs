//! What a refused request's client sees, through a real axum server: a generic problem
//! body with the request's id and nothing of the server's insides (node addresses,
//! Redis error text, the resource prefix), `Retry-After` from the holder's remaining validity
//! or the documented fallback; the details go to the server's log, with the same id.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use axum::Router;
use axum::routing::post;
use redlock_core::Redlock;
use redlock_testkit::Cluster;
use redlock_tower::LockLayer;
use redlock_tower::LockOptions;
use redlock_tower::extract::Header;

async fn serve(redlock: Redlock) -> String {
    redlock_testkit::logs::capture("redlock_tower=debug,redlock_http=debug,redlock_core=warn");
    let layer = LockLayer::new(redlock, Header::new("x-order").required())
        .options(LockOptions::new().resource_prefix(redlock_testkit::refusals::PREFIX));
    let app = Router::new()
        .route("/pay", post(|| async { "paid" }))
        .route_layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/pay")
}

/// (status, Retry-After, body) of one `POST /pay` for `order` with request id `id`.
async fn pay(url: String, order: String, id: String) -> (u16, Option<u64>, String) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(url)
        .header("x-order", order)
        .header("x-request-id", id)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (status, retry_after, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_no_internals_and_the_holders_remaining_time() {
    let cluster = Cluster::start(3).await;
    // A node timeout that a loaded machine's live nodes answer well within: with one
    // node paused, the two others must both be heard for the answer to be "taken".
    let redlock = redlock_testkit::client(&cluster, Duration::from_millis(500));
    let url = serve(redlock.clone()).await;
    redlock_testkit::refusals::check(&cluster, &redlock, |order, id| pay(url.clone(), order, id))
        .await;
}

/// `problem_response`: the problem's status, `Content-Type`, `Retry-After` in whole
/// seconds when it has one, and the JSON body; a status that is none is a 500.
#[test]
fn problem_responses_carry_status_headers_and_body() {
    use redlock_http::Problem;
    use redlock_tower::response::problem_response;

    let r = problem_response(&Problem::unavailable("down".into(), None));
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(String::from_utf8_lossy(r.body()).contains(r#""status":503"#));

    let r = problem_response(&Problem::bad_key("no key".into()));
    assert_eq!(r.status(), 400);
    assert!(r.headers().get("retry-after").is_none());

    let busy = Problem::busy(
        "order:42 is being paid".into(),
        Some(Duration::from_millis(2500)),
    );
    let r = problem_response(&busy);
    assert_eq!(r.headers()["retry-after"], "3");
    assert!(r.body().starts_with(br#"{"type":"urn:redlock:busy""#));

    let mut odd = Problem::busy(String::new(), Some(Duration::from_secs(4)));
    odd.status = 1000; // not an HTTP status
    assert_eq!(problem_response(&odd).status(), 500);
}
