//! `/api/idempotency` against a real data Redis: records written through the store's
//! own API are listed by id prefix, in id order, with their states; `limit` cuts the
//! listing; an admin without a store answers 404, and a failing store 503 without its
//! internals.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redlock_admin::Admin;
use redlock_idempotency::store::{RedisStore, StoreFuture};
use redlock_idempotency::{
    Fingerprint, Record, RecordState, RecordSummary, Store, StoreError, StoredResponse,
};
use redlock_testkit::Cluster;
use serde_json::Value;

mod common;
use common::{redlock, serve_axum};

const DAY: Duration = Duration::from_secs(86_400);

fn in_flight(token: u64, started_ms: u64) -> Record {
    Record {
        state: RecordState::InFlight,
        token,
        fingerprint: Fingerprint::builder("POST", "/orders").body(b"{}").finish(),
        started_ms,
        status: None,
        response: None,
    }
}

fn ended(token: u64, started_ms: u64, state: RecordState, status: u16, body: &str) -> Record {
    Record {
        state,
        status: Some(status),
        response: (state == RecordState::Completed).then(|| StoredResponse {
            status,
            headers: vec![(
                "content-type".into(),
                Bytes::from_static(b"application/json"),
            )],
            body: Bytes::copy_from_slice(body.as_bytes()),
        }),
        ..in_flight(token, started_ms)
    }
}

/// Writes the records the listing tests read: three under `orders:`, one under
/// `refunds:`, written out of id order.
async fn write_records(store: &dyn Store) {
    store
        .start("orders:c", &in_flight(7, 1_700_000_000_300), DAY)
        .await
        .unwrap();
    store
        .finish(
            "orders:c",
            &ended(7, 1_700_000_000_300, RecordState::Abandoned, 503, ""),
            DAY,
        )
        .await
        .unwrap();
    store
        .start("orders:a", &in_flight(5, 1_700_000_000_100), DAY)
        .await
        .unwrap();
    store
        .finish(
            "orders:a",
            &ended(
                5,
                1_700_000_000_100,
                RecordState::Completed,
                201,
                "{\"id\":1}",
            ),
            DAY,
        )
        .await
        .unwrap();
    store
        .start("orders:b", &in_flight(6, 1_700_000_000_200), DAY)
        .await
        .unwrap();
    store
        .start("refunds:x", &in_flight(9, 1_700_000_000_400), DAY)
        .await
        .unwrap();
}

async fn get(url: &str) -> (u16, String, Value) {
    let response = reqwest::get(url).await.unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    (status, content_type, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_records_are_listed_by_prefix() {
    let data = Cluster::start(1).await;
    let store = Arc::new(RedisStore::open(&data.urls()[0]).await.unwrap());
    write_records(store.as_ref()).await;
    let base = serve_axum(Admin::builder().idempotency(store).build().unwrap()).await;

    let (status, content_type, listing) =
        get(&format!("{base}/api/idempotency?prefix=orders:")).await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    let records = listing["records"].as_array().unwrap();
    let ids: Vec<&str> = records.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["orders:a", "orders:b", "orders:c"], "{listing}");
    let states: Vec<&str> = records
        .iter()
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["completed", "in_flight", "abandoned"]);
    assert_eq!(listing["truncated"], false);
    let completed = &records[0];
    assert_eq!(completed["token"], 5);
    assert_eq!(completed["started_ms"], 1_700_000_000_100_u64);
    assert_eq!(completed["status"], 201);
    assert_eq!(completed["body_len"], 8);
    let expires = completed["expires_in_ms"].as_u64().unwrap();
    assert!(expires > 86_000_000 && expires <= 86_400_000, "{expires}");
    assert_eq!(records[1]["status"], Value::Null);
    assert_eq!(records[1]["body_len"], Value::Null);
    assert_eq!(records[2]["status"], 503);

    // `limit` cuts the listing (the first by id) and says so.
    let (status, _, cut) = get(&format!("{base}/api/idempotency?prefix=orders:&limit=2")).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = cut["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["orders:a", "orders:b"]);
    assert_eq!(cut["truncated"], true);

    // No prefix: all four; another prefix: only its own; none matching: empty.
    let (_, _, all) = get(&format!("{base}/api/idempotency")).await;
    assert_eq!(all["records"].as_array().unwrap().len(), 4);
    let (_, _, refunds) = get(&format!("{base}/api/idempotency?prefix=refunds:")).await;
    assert_eq!(refunds["records"][0]["id"], "refunds:x");
    assert_eq!(refunds["records"][0]["state"], "in_flight");
    assert_eq!(refunds["records"].as_array().unwrap().len(), 1);
    let (_, _, none) = get(&format!("{base}/api/idempotency?prefix=nope:")).await;
    assert_eq!(none["records"].as_array().unwrap().len(), 0);

    let (status, content_type, _) = get(&format!("{base}/api/idempotency?limit=many")).await;
    assert_eq!(
        (status, content_type.as_str()),
        (400, "application/problem+json")
    );
    let posted = reqwest::Client::new()
        .post(format!("{base}/api/idempotency"))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_without_a_store_is_not_found() {
    let cluster = Cluster::start(1).await;
    let admin = Admin::builder()
        .redlock(redlock(&cluster, "svc"))
        .build()
        .unwrap();
    let base = serve_axum(admin).await;
    let (status, content_type, problem) = get(&format!("{base}/api/idempotency?prefix=a")).await;
    assert_eq!(status, 404);
    assert_eq!(content_type, "application/problem+json");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("idempotency store"),
        "{problem}"
    );
}

/// A store whose every call fails with an error carrying what must not leave the
/// server.
#[derive(Debug)]
struct Failing;

fn failure<'a, T: Send + 'a>() -> StoreFuture<'a, T> {
    Box::pin(async {
        Err(StoreError::Backend(
            "connection to redis://:hunter2@10.1.2.3:6379 refused".into(),
        ))
    })
}

impl Store for Failing {
    fn load<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Option<Record>> {
        failure()
    }

    fn start<'a>(
        &'a self,
        _: &'a str,
        _: &'a Record,
        _: Duration,
    ) -> StoreFuture<'a, redlock_idempotency::Started> {
        failure()
    }

    fn finish<'a>(&'a self, _: &'a str, _: &'a Record, _: Duration) -> StoreFuture<'a, ()> {
        failure()
    }

    fn list<'a>(&'a self, _: &'a str, _: usize) -> StoreFuture<'a, Vec<RecordSummary>> {
        failure()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_idempotency_store_answers_503_without_internals() {
    let admin = Admin::builder()
        .idempotency(Arc::new(Failing))
        .build()
        .unwrap();
    let base = serve_axum(admin).await;
    let response = reqwest::get(format!("{base}/api/idempotency"))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body = response.text().await.unwrap();
    assert!(
        !body.contains("hunter2") && !body.contains("10.1.2.3"),
        "{body}"
    );
    assert!(body.contains("server's log"), "{body}");
}
