//! What the tower integration tests share: axum servers on loopback ports, one lock
//! client per replica, the orders app, and the checks of a rejection.

#![allow(dead_code, unused_imports, unreachable_pub)] // each test file uses some of it

pub use std::sync::Arc;
pub use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
pub use std::time::{Duration, Instant};

pub use axum::body::Body;
pub use axum::extract::Request;
pub use axum::routing::{get, post};
pub use axum::{Extension, Router};
pub use bytes::Bytes;
pub use redlock_core::{LockHandle, Redlock};
pub use redlock_testkit::Cluster;
pub use redlock_testkit::Intervals;
pub use redlock_tower::LockOptions;
pub use redlock_tower::extract::{Header, PathParam};
pub use redlock_tower::{Hold, LockLayer};
pub use reqwest::StatusCode;

/// Serves `app` on a free loopback port until the test's runtime ends; its base URL.
pub async fn serve(app: Router) -> String {
    redlock_testkit::logs::capture("redlock_tower=debug,redlock_http=debug,redlock_core=warn");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// One replica's lock client: its own connections to the shared nodes.
pub fn replica(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    redlock_testkit::client(cluster, node_timeout)
}

/// Sets a flag when dropped (to see a handler or a body stream cancelled).
pub struct SetOnDrop(pub Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `POST /orders/{id}/pay`, locked per order: the handler works for `work` and records
/// its interval, tagged with the instance.
pub fn orders_app(
    redlock: Redlock,
    instance: usize,
    work: Duration,
    intervals: Arc<Intervals>,
    configure: impl FnOnce(LockOptions) -> LockOptions,
) -> Router {
    let options = configure(LockOptions::new().resource_prefix("order:"));
    let layer = LockLayer::new(redlock, PathParam::new("id")).options(options);
    Router::new()
        .route(
            "/orders/{id}/pay",
            post(move |Extension(lock): Extension<LockHandle>| async move {
                let start = Instant::now();
                assert!(lock.is_held());
                tokio::time::sleep(work).await;
                intervals.record(start, Instant::now(), instance);
                format!("paid under {}", lock.resource())
            }),
        )
        .route_layer(layer)
}

pub async fn pay(client: &reqwest::Client, base: &str, order: u32) -> reqwest::Response {
    client
        .post(format!("{base}/orders/{order}/pay"))
        .send()
        .await
        .unwrap()
}

/// A 409 or 503 as the layer renders it: problem+json with a `Retry-After` of 1 s or
/// more and at most `max_secs`; returns the body.
pub async fn assert_problem(
    response: reqwest::Response,
    status: StatusCode,
    max_secs: u64,
) -> String {
    assert_eq!(response.status(), status);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=max_secs).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body = response.text().await.unwrap();
    assert!(
        body.contains(&format!("\"status\":{}", status.as_u16())),
        "{body}"
    );
    body
}

/// GETs `url` until a 200 (whose body it does not wait for), up to `limit`; how long
/// it took.
pub async fn get_until_ok(client: &reqwest::Client, url: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let response = client.get(url).send().await.unwrap();
        if response.status() == StatusCode::OK {
            return started.elapsed();
        }
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert!(
            started.elapsed() < limit,
            "still locked after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
