//! The stores against real servers (a data Redis from the test kit, SQLite files,
//! PostgreSQL from `DATABASE_URL`): the start rule, fenced writes (a stale run refused),
//! expiry, listing; and the whole decision (`begin`, `finish`) over a real lock cluster.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redlock_idempotency::store::{RedisStore, SqlStore};
use redlock_idempotency::{
    Begin, Fingerprint, Finished, Idempotency, IdempotencyKey, Record, RecordState, RefusalKind,
    Started, Store, StoreError, StoredResponse,
};
use redlock_testkit::{Cluster, require, unique_name};

fn fp(body: &str) -> Fingerprint {
    Fingerprint::builder("POST", "/refunds")
        .body(body.as_bytes())
        .finish()
}

fn in_flight(token: u64, body: &str) -> Record {
    Record {
        state: RecordState::InFlight,
        token,
        fingerprint: fp(body),
        started_ms: 1,
        status: None,
        response: None,
    }
}

fn completed(token: u64, body: &str, answer: &'static str) -> Record {
    Record {
        state: RecordState::Completed,
        status: Some(201),
        response: Some(StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), Bytes::from_static(b"text/plain"))],
            body: Bytes::from_static(answer.as_bytes()),
        }),
        ..in_flight(token, body)
    }
}

const DAY: Duration = Duration::from_secs(86_400);

/// The rules every store keeps.
async fn store_rules(store: &dyn Store) {
    let id = unique_name("t%3A1:k");
    assert_eq!(store.load(&id).await.unwrap(), None);

    // First start writes; the same request's start under a higher token (its run died)
    // takes over; another request's start finds it.
    assert_eq!(
        store.start(&id, &in_flight(5, "a"), DAY).await.unwrap(),
        Started::Started
    );
    assert_eq!(
        store.start(&id, &in_flight(6, "a"), DAY).await.unwrap(),
        Started::Started
    );
    match store.start(&id, &in_flight(7, "b"), DAY).await.unwrap() {
        Started::Found(found) => assert_eq!(found, in_flight(6, "a")),
        other => panic!("{other:?}"),
    }
    // A stale run (token 5) can neither start nor finish.
    assert!(matches!(
        store.start(&id, &in_flight(5, "a"), DAY).await,
        Err(StoreError::Stale {
            token: 5,
            highest: 6
        })
    ));
    assert!(matches!(
        store.finish(&id, &completed(5, "a", "stale"), DAY).await,
        Err(StoreError::Stale {
            token: 5,
            highest: 6
        })
    ));
    // The run of token 6 finishes; its record is what a load gives, and it stays.
    store
        .finish(&id, &completed(6, "a", "refund 1"), DAY)
        .await
        .unwrap();
    assert_eq!(
        store.load(&id).await.unwrap(),
        Some(completed(6, "a", "refund 1"))
    );
    match store.start(&id, &in_flight(8, "a"), DAY).await.unwrap() {
        Started::Found(found) => assert_eq!(found, completed(6, "a", "refund 1")),
        other => panic!("{other:?}"),
    }
    // An abandoned record (a 5xx) is taken over by the next run, even another request's.
    let abandoned_id = unique_name("abandoned");
    let abandoned = Record {
        state: RecordState::Abandoned,
        status: Some(503),
        ..in_flight(3, "a")
    };
    store
        .start(&abandoned_id, &in_flight(3, "a"), DAY)
        .await
        .unwrap();
    store.finish(&abandoned_id, &abandoned, DAY).await.unwrap();
    assert_eq!(
        store
            .start(&abandoned_id, &in_flight(4, "b"), DAY)
            .await
            .unwrap(),
        Started::Started
    );

    // Expiry: a record is gone after its TTL, and its id can start again.
    let short = unique_name("short");
    store
        .start(&short, &in_flight(9, "a"), Duration::from_millis(300))
        .await
        .unwrap();
    store
        .finish(&short, &completed(9, "a", "x"), Duration::from_millis(300))
        .await
        .unwrap();
    assert!(store.load(&short).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(store.load(&short).await.unwrap(), None);
    assert_eq!(
        store.start(&short, &in_flight(1, "b"), DAY).await.unwrap(),
        Started::Started
    );

    // Listing by prefix, in id order, without other prefixes.
    let prefix = unique_name("list");
    for n in [3, 1, 2] {
        let id = format!("{prefix}:{n}");
        store.start(&id, &in_flight(n, "a"), DAY).await.unwrap();
    }
    store
        .finish(&format!("{prefix}:2"), &completed(2, "a", "body!"), DAY)
        .await
        .unwrap();
    store
        .start(&format!("{prefix}x:9"), &in_flight(1, "a"), DAY)
        .await
        .unwrap();
    let listed = store.list(&format!("{prefix}:"), 10).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            format!("{prefix}:1"),
            format!("{prefix}:2"),
            format!("{prefix}:3")
        ]
    );
    assert_eq!(listed[1].state, RecordState::Completed);
    assert_eq!(listed[1].body_len, Some(5));
    assert_eq!(listed[1].status, Some(201));
    assert!(listed[0].expires_in.unwrap() > Duration::from_secs(86_000));
    assert_eq!(store.list(&format!("{prefix}:"), 2).await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_rules() {
    let data = Cluster::start(1).await;
    let store = RedisStore::open(&data.urls()[0]).await.unwrap();
    store_rules(&store).await;
}

async fn sqlite_store() -> (SqlStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("records.db").display()
    );
    let store = SqlStore::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // again: nothing happens
    (store, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_rules() {
    let (store, _dir) = sqlite_store().await;
    store_rules(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_rules() {
    let Some(url) = require::database_url() else {
        return;
    };
    let store = SqlStore::connect(&url)
        .await
        .unwrap()
        .table(unique_name("idem"))
        .unwrap();
    store.migrate().await.unwrap();
    store_rules(&store).await;
}

/// The SQL sweep deletes expired rows, a bounded number at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sweep_is_bounded() {
    let (store, _dir) = sqlite_store().await;
    for n in 0..5 {
        let id = format!("gone:{n}");
        store
            .start(&id, &in_flight(1, "a"), Duration::from_millis(1))
            .await
            .unwrap();
    }
    store.start("kept", &in_flight(1, "a"), DAY).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.sweep(3).await.unwrap(), 3);
    assert_eq!(store.sweep(100).await.unwrap(), 2);
    assert_eq!(store.sweep(100).await.unwrap(), 0);
    assert!(store.load("kept").await.unwrap().is_some());
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::from_header("idempotency-key", [text.as_bytes()], true, 255)
        .unwrap()
        .unwrap()
}

/// The decision over a real lock cluster and a real store.
async fn decisions(store: Arc<dyn Store>) {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let idempotency = Idempotency::with_store(redlock, store).max_body(8);
    let k = key(&unique_name("k"));
    let scope = Some("tenant-1");

    // First: runs, holds the lock, the record says in flight; a concurrent request with
    // the key is refused 409 with Retry-After, one with another body 422.
    let Begin::Run(run) = idempotency.begin(scope, &k, fp("a")).await.unwrap() else {
        panic!("first request must run");
    };
    let token = run.token();
    let busy = idempotency.begin(scope, &k, fp("a")).await.unwrap_err();
    assert_eq!(
        (busy.kind, busy.problem.status),
        (RefusalKind::InFlight, 409)
    );
    assert!(busy.problem.retry_after.is_some());
    let other = idempotency.begin(scope, &k, fp("b")).await.unwrap_err();
    assert_eq!(
        (other.kind, other.problem.status),
        (RefusalKind::Mismatch, 422)
    );
    assert_eq!(
        run.finish(
            200,
            vec![("x-a".into(), Bytes::from_static(b"1"))],
            Some(Bytes::from_static(b"done"))
        )
        .await,
        Finished::Stored
    );
    // Replayed, without a lock; another body: 422; another scope: runs.
    let Begin::Replay(replay) = idempotency.begin(scope, &k, fp("a")).await.unwrap() else {
        panic!("a retry must replay");
    };
    assert_eq!((replay.status(), &replay.body()[..]), (200, &b"done"[..]));
    assert_eq!(
        replay.headers(),
        [("x-a".to_owned(), Bytes::from_static(b"1"))]
    );
    let other = idempotency.begin(scope, &k, fp("b")).await.unwrap_err();
    assert_eq!(other.kind, RefusalKind::Mismatch);
    let Begin::Run(elsewhere) = idempotency
        .begin(Some("tenant-2"), &k, fp("a"))
        .await
        .unwrap()
    else {
        panic!("another scope runs");
    };
    assert_ne!(elsewhere.id(), format!("tenant-1:{k}"));
    assert!(token > 0);

    // A 5xx is not stored: the next request runs again.
    let k5 = key(&unique_name("k5"));
    let Begin::Run(run) = idempotency.begin(scope, &k5, fp("a")).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        run.finish(503, vec![], None).await,
        Finished::StatusNotStored
    );
    assert!(matches!(
        idempotency.begin(scope, &k5, fp("a")).await,
        Ok(Begin::Run(_))
    ));

    // A body over max_body (8) is not stored: retries are refused, never truncated.
    let big = key(&unique_name("big"));
    let Begin::Run(run) = idempotency.begin(scope, &big, fp("a")).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        run.finish(200, vec![], Some(Bytes::from_static(b"123456789")))
            .await,
        Finished::TooLarge
    );
    let refused = idempotency.begin(scope, &big, fp("a")).await.unwrap_err();
    assert_eq!(
        (refused.kind, refused.problem.status),
        (RefusalKind::NotReplayable, 409)
    );

    // A run dropped without finishing (cancelled) leaves its record in flight and
    // releases its lock: the retry runs, under a higher token.
    let dropped = key(&unique_name("dropped"));
    let Begin::Run(run) = idempotency.begin(scope, &dropped, fp("a")).await.unwrap() else {
        panic!()
    };
    let first = run.token();
    drop(run);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let retry = loop {
        match idempotency.begin(scope, &dropped, fp("a")).await {
            Ok(Begin::Run(retry)) => break retry,
            Err(refusal) if refusal.kind == RefusalKind::InFlight => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the lock was never released"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{other:?}"),
        }
    };
    assert!(retry.token() > first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_with_redis() {
    let data = Cluster::start(1).await;
    decisions(Arc::new(RedisStore::open(&data.urls()[0]).await.unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_with_sqlite() {
    let (store, _dir) = sqlite_store().await;
    decisions(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_with_postgres() {
    let Some(url) = require::database_url() else {
        return;
    };
    let store = SqlStore::connect(&url)
        .await
        .unwrap()
        .table(unique_name("idem_decisions"))
        .unwrap();
    store.migrate().await.unwrap();
    decisions(Arc::new(store)).await;
}

/// A store that does not answer: the request is refused 503 within the store timeout,
/// not hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_store_is_a_503_not_a_hang() {
    let cluster = Cluster::start(1).await;
    let data = Cluster::start(1).await;
    let store = RedisStore::open(&data.urls()[0]).await.unwrap();
    let idempotency = Idempotency::new(redlock_testkit::builder(&cluster).build().unwrap(), store)
        .store_timeout(Duration::from_millis(300));
    data.node(0).pause();
    let started = std::time::Instant::now();
    let refused = idempotency
        .begin(None, &key("k"), fp("a"))
        .await
        .unwrap_err();
    data.node(0).resume();
    assert_eq!(
        (refused.kind, refused.problem.status),
        (RefusalKind::Unavailable, 503)
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Many first requests with one key at the same moment, from several replicas (each its
/// own lock client): exactly one runs; the others are told it is in flight. Simultaneous
/// attempts can split a lock's votes so that none wins; the default (fail fast) still
/// retries such a split briefly, so that a burst never ends with nobody running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_first_requests_runs_exactly_one() {
    let cluster = Cluster::start(3).await;
    let data = Cluster::start(1).await;
    let store: Arc<dyn Store> = Arc::new(RedisStore::open(&data.urls()[0]).await.unwrap());
    let replicas: Vec<Idempotency> = (0..4)
        .map(|_| {
            Idempotency::with_store(
                redlock_testkit::builder(&cluster).build().unwrap(),
                store.clone(),
            )
        })
        .collect();
    for round in 0..10 {
        let k = key(&format!("burst-{round}-{}", unique_name("k")));
        let attempts = (0..100).map(|i| {
            let idempotency = replicas[i % 4].clone();
            let k = k.clone();
            async move { idempotency.begin(None, &k, fp("a")).await }
        });
        let outcomes = futures_util::future::join_all(attempts).await;
        let mut runs = Vec::new();
        for outcome in outcomes {
            match outcome {
                Ok(Begin::Run(run)) => runs.push(run),
                Ok(_) => panic!("nothing was stored yet"),
                Err(refusal) => assert_eq!(refusal.kind, RefusalKind::InFlight, "{refusal}"),
            }
        }
        assert_eq!(runs.len(), 1, "round {round}: {} runs", runs.len());
        for run in runs {
            run.finish(200, vec![], Some(Bytes::from_static(b"ok")))
                .await;
        }
    }
}
