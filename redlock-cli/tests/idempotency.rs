//! `redlock idempotency list`, run as a process against a real data Redis and a SQLite
//! file holding records written through the store's own API: the records matching the
//! prefix, in id order, with their states, as a table and as JSON; `--limit`; a bad
//! store URL and an unreachable store end with a message and exit code 1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use bytes::Bytes;
use redlock_idempotency::store::{RedisStore, SqlStore};
use redlock_idempotency::{Fingerprint, Record, RecordState, Store, StoredResponse};
use redlock_testkit::Cluster;

mod common;
use common::{Output, run_cli};

const DAY: Duration = Duration::from_secs(86_400);

fn in_flight(token: u64) -> Record {
    Record {
        state: RecordState::InFlight,
        token,
        fingerprint: Fingerprint::builder("POST", "/orders").body(b"{}").finish(),
        started_ms: 1_700_000_000_000 + token,
        status: None,
        response: None,
    }
}

fn completed(token: u64, body: &'static str) -> Record {
    Record {
        state: RecordState::Completed,
        status: Some(201),
        response: Some(StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), Bytes::from_static(b"text/plain"))],
            body: Bytes::from_static(body.as_bytes()),
        }),
        ..in_flight(token)
    }
}

/// `orders:a` completed, `orders:b` in flight, `orders:c` not stored, `refunds:x`
/// completed; written out of id order.
async fn write_records(store: &dyn Store) {
    for (id, token) in [
        ("orders:c", 3),
        ("refunds:x", 4),
        ("orders:a", 1),
        ("orders:b", 2),
    ] {
        store.start(id, &in_flight(token), DAY).await.unwrap();
    }
    store
        .finish("orders:a", &completed(1, "order 1"), DAY)
        .await
        .unwrap();
    let not_stored = Record {
        state: RecordState::NotStored,
        status: Some(200),
        ..in_flight(3)
    };
    store.finish("orders:c", &not_stored, DAY).await.unwrap();
    store
        .finish("refunds:x", &completed(4, "refund"), DAY)
        .await
        .unwrap();
}

/// Lists `orders:` from the store `args` name, as a table and as JSON, and checks both.
async fn lists_the_orders(args: &[&str]) {
    let table = run_cli(
        &[&["idempotency", "list", "--prefix", "orders:"], args].concat(),
        &[],
    )
    .await
    .expect(0);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("STATE"),
        "{table:?}"
    );
    assert_eq!(lines.len(), 4, "{table:?}");
    assert!(
        lines[1].starts_with("orders:a") && lines[1].contains("completed"),
        "{table:?}"
    );
    assert!(
        lines[1].contains("201") && lines[1].contains("7B"),
        "{table:?}"
    );
    assert!(
        lines[2].starts_with("orders:b") && lines[2].contains("in_flight"),
        "{table:?}"
    );
    assert!(
        lines[3].starts_with("orders:c") && lines[3].contains("not_stored"),
        "{table:?}"
    );
    assert!(!table.stdout.contains("refunds:x"));

    let json = run_cli(
        &[
            &["idempotency", "list", "--prefix", "orders:", "--json"],
            args,
        ]
        .concat(),
        &[],
    )
    .await
    .expect(0)
    .json();
    let records = json["records"].as_array().unwrap();
    let listed: Vec<(&str, &str, u64)> = records
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap(),
                r["state"].as_str().unwrap(),
                r["token"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("orders:a", "completed", 1),
            ("orders:b", "in_flight", 2),
            ("orders:c", "not_stored", 3)
        ]
    );
    assert_eq!(records[0]["status"], 201);
    assert_eq!(records[0]["body_len"], 7);
    assert_eq!(records[0]["started_ms"], 1_700_000_000_001_u64);
    assert_eq!(json["truncated"], false);

    // --limit: the first by id, and a warning that more are there.
    let cut = run_cli(
        &[&["idempotency", "list", "--limit", "2", "--json"], args].concat(),
        &[],
    )
    .await
    .expect(0);
    let ids: Vec<String> = cut.json()["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["orders:a", "orders:b"]);
    assert!(cut.stderr.contains("--limit"), "{cut:?}");

    let none = run_cli(
        &[&["idempotency", "list", "--prefix", "nope:"], args].concat(),
        &[],
    )
    .await
    .expect(0);
    assert!(none.stdout.contains("no idempotency records"), "{none:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_records_listed_from_redis() {
    let data = Cluster::start(1).await;
    let url = data.urls()[0].clone();
    write_records(&RedisStore::open(&url).await.unwrap()).await;
    lists_the_orders(&["--store", &url]).await;

    // Records under another key prefix are listed with --redis-prefix only.
    let other = RedisStore::open(&url).await.unwrap().prefix("idem:");
    other.start("orders:z", &in_flight(8), DAY).await.unwrap();
    let default = run_cli(&["idempotency", "list", "--store", &url, "--json"], &[])
        .await
        .expect(0)
        .json();
    assert_eq!(default["records"].as_array().unwrap().len(), 4);
    let prefixed = run_cli(
        &[
            "idempotency",
            "list",
            "--store",
            &url,
            "--redis-prefix",
            "idem:",
            "--json",
        ],
        &[],
    )
    .await
    .expect(0)
    .json();
    assert_eq!(prefixed["records"][0]["id"], "orders:z");
    assert_eq!(prefixed["records"].as_array().unwrap().len(), 1);
    // --key-prefix is the lock keys' prefix: refused here, pointing at --redis-prefix.
    let refused = run_cli(
        &[
            "idempotency",
            "list",
            "--store",
            &url,
            "--key-prefix",
            "idem:",
        ],
        &[],
    )
    .await
    .expect(2);
    assert!(refused.stderr.contains("--redis-prefix"), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_records_listed_from_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idempotency.db");
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let store = SqlStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    write_records(&store).await;
    let read_url = format!("sqlite://{}", path.display());
    lists_the_orders(&["--store", &read_url]).await;

    // Another table: its own records.
    let other = SqlStore::connect(&url)
        .await
        .unwrap()
        .table("idem_other")
        .unwrap();
    other.migrate().await.unwrap();
    other.start("orders:z", &in_flight(8), DAY).await.unwrap();
    let listed = run_cli(
        &[
            "idempotency",
            "list",
            "--store",
            &read_url,
            "--table",
            "idem_other",
            "--json",
        ],
        &[],
    )
    .await
    .expect(0)
    .json();
    assert_eq!(listed["records"][0]["id"], "orders:z");
    assert_eq!(listed["records"].as_array().unwrap().len(), 1);
    // A table that is not there: a message, exit code 1.
    let missing = run_cli(
        &[
            "idempotency",
            "list",
            "--store",
            &read_url,
            "--table",
            "nope",
        ],
        &[],
    )
    .await
    .expect(1);
    assert!(missing.stderr.starts_with("error: "), "{missing:?}");
    assert!(missing.stderr.contains("--table"), "{missing:?}");
}

fn fails_cleanly(out: &Output) {
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(out.stderr.starts_with("error: "), "{out:?}");
    assert!(!out.stderr.contains("panicked"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_store_errors_are_messages() {
    // A scheme that names no store.
    let bad = run_cli(
        &["idempotency", "list", "--store", "mysql://db/orders"],
        &[],
    )
    .await
    .expect(1);
    fails_cleanly(&bad);
    assert!(
        bad.stderr.contains("--store") && bad.stderr.contains("`mysql:`"),
        "{bad:?}"
    );
    let bare = run_cli(&["idempotency", "list", "--store", "localhost:6379"], &[])
        .await
        .expect(1);
    fails_cleanly(&bare);
    // Nothing listens there: a message within --timeout.
    let down = run_cli(
        &[
            "idempotency",
            "list",
            "--store",
            "redis://127.0.0.1:1",
            "--timeout",
            "2s",
        ],
        &[],
    )
    .await
    .expect(1);
    fails_cleanly(&down);
    assert!(down.stderr.contains("--store"), "{down:?}");
    // A SQLite file that is not there.
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("sqlite://{}", dir.path().join("none.db").display());
    let missing = run_cli(&["idempotency", "list", "--store", &missing], &[])
        .await
        .expect(1);
    fails_cleanly(&missing);
    // An option of the other kind of store.
    let mixed = run_cli(
        &[
            "idempotency",
            "list",
            "--store",
            "redis://127.0.0.1:1",
            "--table",
            "t",
        ],
        &[],
    )
    .await
    .expect(2);
    fails_cleanly(&mixed);
}
