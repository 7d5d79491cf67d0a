//! Start-up: fresh nodes sit in restart quarantine for the max TTL. `wait_ready` waits
//! that out (and says why it waits), and the errors met meanwhile say how to wait and
//! when switching the quarantine off is safe.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::error::NodeError;
use redlock_core::{Error, Redlock};
use redlock_testkit::Cluster;

fn quarantined_client(cluster: &Cluster, max_ttl: Duration) -> Redlock {
    redlock_testkit::builder(cluster)
        .restart_quarantine(true)
        .ttl(max_ttl)
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_nodes_refuse_with_advice_then_wait_ready_waits_them_out() {
    let cluster = Cluster::start(3).await;
    let redlock = quarantined_client(&cluster, Duration::from_secs(3));

    // Refused at first, and the error says what to do.
    let err = redlock.try_lock("start").await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err:?}");
    assert!(text.contains("wait_ready"), "{text}");
    assert!(text.contains("restart_quarantine(false)"), "{text}");
    assert!(text.contains("appendfsync always"), "{text}");

    // Too short a wait: NotReady, naming the quarantine.
    let err = redlock
        .wait_ready(Duration::from_millis(300))
        .await
        .unwrap_err();
    match &err {
        Error::NotReady { failures, .. } => assert!(
            failures
                .iter()
                .any(|f| matches!(f.cause, NodeError::Quarantined(_))),
            "{err}"
        ),
        other => panic!("expected NotReady, got {other:?}"),
    }
    assert!(err.to_string().contains("restart quarantine"), "{err}");

    // Long enough: ready once the quarantine ends (3 s + 1 s margin after start).
    let started = Instant::now();
    redlock.wait_ready(Duration::from_secs(10)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(6));
    redlock
        .try_lock("start")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_nodes_are_named_within_the_timeout() {
    let cluster = Cluster::start(1).await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let redlock = redlock_testkit::builder_for([
        cluster.urls()[0].clone(),
        format!("redis://127.0.0.1:{closed}"),
        format!("redis://localhost:{closed}"),
    ])
    .build()
    .unwrap();
    let started = Instant::now();
    let err = redlock
        .wait_ready(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    let text = err.to_string();
    assert!(
        matches!(
            err,
            Error::NotReady {
                ready: 1,
                needed: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(text.contains(&format!("127.0.0.1:{closed}")), "{text}");
    assert!(text.contains(&format!("localhost:{closed}")), "{text}");
}
