//! What a web integration's refused requests must look like, as one scenario both
//! `redlock-tower` and `redlock-actix` run through a real server: generic problem bodies
//! with the request's id and no internals (node addresses, error text, key prefix),
//! `Retry-After` from the holder's remaining validity or the 1 s fallback, the details in
//! the log with the same id, and a too-long key refused with 400.

use std::future::Future;
use std::time::Duration;

use redlock_core::Redlock;

use crate::Cluster;

/// The key prefix the server under test must use for its locks.
pub const PREFIX: &str = "pay-secret:";

/// Runs the scenario against a server that locks `PREFIX + key` through a client of
/// `cluster` (3 nodes) and logs its refusals where [`crate::logs`] captures them.
/// `redlock` is another client of the same nodes, for the holder; `send` makes one
/// request, `(key, request id)` to `(status, Retry-After in seconds, body)`.
pub async fn check<F, Fut>(cluster: &Cluster, redlock: &Redlock, send: F)
where
    F: Fn(String, String) -> Fut,
    Fut: Future<Output = (u16, Option<u64>, String)>,
{
    let no_internals = |body: &str| {
        assert!(
            !body.contains("127.0.0.1"),
            "node address in the body: {body}"
        );
        for i in 0..cluster.len() {
            let port = cluster.node(i).port().to_string();
            assert!(!body.contains(&port), "node port in the body: {body}");
        }
        assert!(!body.contains(PREFIX), "key prefix in the body: {body}");
    };

    // Busy: another holder, 4 s left.
    let held = redlock
        .try_lock(format!("{PREFIX}42"))
        .ttl(Duration::from_secs(4))
        .await
        .expect("the holder's lock");
    let (status, retry_after, body) = send("42".into(), "req-busy-1".into()).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        retry_after,
        Some(4),
        "the holder's remaining 4 s, rounded up"
    );
    no_internals(&body);
    assert!(body.contains(r#""request_id":"req-busy-1""#), "{body}");
    assert!(crate::logs::text().contains("req-busy-1"));

    // One node of three silent: the two others still tell the holder's time.
    cluster.node(2).pause();
    let (status, retry_after, body) = send("42".into(), "req-busy-2".into()).await;
    cluster.node(2).resume();
    assert_eq!(status, 409, "{body}");
    assert!(matches!(retry_after, Some(3 | 4)), "{retry_after:?}");
    no_internals(&body);
    drop(held);

    // No quorum: 503 with the fallback Retry-After; the log names the nodes.
    cluster.node(0).pause();
    cluster.node(1).pause();
    let (status, retry_after, body) = send("43".into(), "req-down-1".into()).await;
    cluster.node(0).resume();
    cluster.node(1).resume();
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry_after, Some(1));
    no_internals(&body);
    assert!(
        !body.contains("no answer"),
        "error text in the body: {body}"
    );
    assert!(body.contains(r#""request_id":"req-down-1""#), "{body}");
    let logs = crate::logs::text();
    let line = logs
        .lines()
        .find(|l| l.contains("req-down-1"))
        .expect("the refusal is logged with the request id");
    assert!(
        line.contains("127.0.0.1"),
        "the log names the nodes: {line}"
    );

    // A key longer than the client's bound: 400 before anything is sent.
    let long = "k".repeat(600);
    let (status, _, body) = send(long.clone(), "req-long".into()).await;
    assert_eq!(status, 400, "{body}");
    assert!(!body.contains(&long), "{body}");
}
