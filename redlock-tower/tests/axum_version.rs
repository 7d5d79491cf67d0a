//! An axum 0.7 `Router` accepts the layer (the types line up), but its requests carry
//! axum 0.7's extensions, not the axum 0.8 ones `PathParam` reads: every request is a
//! 500 whose cause, the version mismatch, is named in the server's log (the client gets
//! a generic body).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redlock_testkit::Cluster;
use redlock_tower::LockLayer;
use redlock_tower::extract::PathParam;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_0_7_router_is_named_as_the_cause() {
    redlock_testkit::logs::capture("redlock_tower=debug,redlock_http=debug");
    let cluster = Cluster::start(1).await;
    let redlock = redlock_testkit::client(&cluster, Duration::from_millis(100));
    let app = axum07::Router::new()
        .route("/orders/:id", axum07::routing::post(|| async { "paid" }))
        .route_layer(LockLayer::new(redlock, PathParam::new("id")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum07::serve(listener, app).await.unwrap() });

    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{addr}/orders/42"))
        .header("x-request-id", "req-axum07")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let body = response.text().await.unwrap();
    assert!(
        !body.contains("MatchedPath"),
        "internals in the body: {body}"
    );
    assert!(body.contains("req-axum07"), "{body}");
    let logs = redlock_testkit::logs::text();
    let line = logs.lines().find(|l| l.contains("req-axum07")).unwrap();
    assert!(line.contains("axum 0.8"), "{line}");
    assert!(line.contains("axum 0.7"), "{line}");
}
