//! The layer's `fencing` option: each request's lock carries a fencing token the handler
//! reads from the request's `LockHandle`, rising from one request to the next; without
//! the option the client's setting (off here) applies. Real axum server, real nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use redlock_core::LockHandle;
use redlock_testkit::Cluster;
use redlock_tower::LockLayer;
use redlock_tower::LockOptions;
use redlock_tower::extract::Global;

/// `POST /` under `layer`, answering the lock's fencing token (or
/// `none`).
async fn serve(layer: LockLayer<Global>) -> String {
    let app = Router::new()
        .route(
            "/",
            post(|Extension(lock): Extension<LockHandle>| async move {
                match lock.fencing_token() {
                    Some(token) => token.to_string(),
                    None => "none".to_owned(),
                }
            }),
        )
        .route_layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/")
}

async fn post_text(client: &reqwest::Client, url: &str) -> String {
    let response = client.post(url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_option_hands_rising_tokens_to_handlers() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::client(&cluster, Duration::from_millis(200));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    // Each request's lock is released once its response body is sent, so the next
    // request may come before that release: it waits for the lock.
    let wait = Duration::from_secs(2);
    let plain = serve(
        LockLayer::new(redlock.clone(), Global::new("report"))
            .options(LockOptions::new().wait(wait)),
    )
    .await;
    assert_eq!(post_text(&client, &plain).await, "none");

    let layer = LockLayer::new(redlock, Global::new("report"));
    let fenced = serve(layer.options(LockOptions::new().wait(wait).fencing(true))).await;
    let mut last = 0;
    for _ in 0..5 {
        let token: u64 = post_text(&client, &fenced).await.parse().unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
    }
}
