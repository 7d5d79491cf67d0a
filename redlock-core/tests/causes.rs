//! Errors that name their cause, at once: a TLS URL for a plain port, a missing
//! password, a lock key of another type, a key the ACL user may not touch, and one
//! server listed twice under two names. Real servers; each case must fail fast (well
//! before the retry deadline) and say what is wrong.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::error::NodeError;
use redlock_core::{ConfigError, Error, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, Persistence, RedisServer, ServerOptions};

/// A client retrying for 5 s: an error that comes much sooner was not retried.
fn patient(urls: impl IntoIterator<Item = String>) -> Redlock {
    redlock_testkit::builder_for(urls)
        .node_timeout(Duration::from_millis(200))
        .retry(RetryPolicy::deadline(Duration::from_secs(5)))
        .build()
        .unwrap()
}

/// Takes a lock expecting an error; the error and how long it took.
async fn refused(redlock: &Redlock, resource: &str) -> (Error, Duration) {
    let started = Instant::now();
    let err = redlock.lock(resource).await.unwrap_err();
    (err, started.elapsed())
}

fn causes(err: &Error) -> Vec<&NodeError> {
    match err {
        Error::NoQuorum { failures, .. } => failures.iter().map(|f| &f.cause).collect(),
        other => panic!("expected NoQuorum, got {other:?}"),
    }
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_url_for_a_plain_port_says_tls() {
    let cluster = Cluster::start(3).await;
    let urls = (0..3).map(|i| format!("rediss://127.0.0.1:{}/#insecure", cluster.node(i).port()));
    let (err, took) = refused(&patient(urls), "tls").await;
    let text = err.to_string();
    assert!(text.contains("TLS"), "{text}");
    assert!(!text.contains("no answer within"), "{text}");
    assert!(
        causes(&err).iter().all(|c| matches!(c, NodeError::Tls(_))),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_password_says_authentication_at_once() {
    let mut urls = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..3 {
        let server = RedisServer::start_with(ServerOptions {
            password: Some("s3cret".into()),
            ..ServerOptions::default()
        })
        .await;
        urls.push(format!("redis://{}", server.addr()));
        servers.push(server);
    }
    let (err, took) = refused(&patient(urls), "auth").await;
    let text = err.to_string();
    assert!(text.to_lowercase().contains("authentication"), "{text}");
    assert!(
        causes(&err)
            .iter()
            .all(|c| matches!(c, NodeError::Authentication(_))),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_key_of_another_type_is_named_and_not_retried() {
    let cluster = Cluster::start(3).await;
    let redlock = patient(cluster.urls());
    let key = redlock.key_for("typed");
    for i in 0..3 {
        let () = cluster
            .node(i)
            .query(redis::cmd("HSET").arg(&key).arg("field").arg("value"))
            .await
            .unwrap();
    }
    let (err, took) = refused(&redlock, "typed").await;
    let text = err.to_string();
    assert!(
        text.contains("WRONGTYPE") || text.contains("type"),
        "{text}"
    );
    assert!(text.contains(&key), "names the key: {text}");
    assert!(!text.contains("another holder"), "{text}");
    assert!(
        causes(&err)
            .iter()
            .all(|c| matches!(c, NodeError::WrongType { .. })),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_outside_the_users_acl_is_a_permission_error_not_retried() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        let server = RedisServer::start(Persistence::None).await;
        let () = server
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("locker")
                    .arg("on")
                    .arg(">secret")
                    .arg("~allowed:*")
                    .arg("&*")
                    .arg("+@all"),
            )
            .await
            .unwrap();
        servers.push(server);
    }
    let urls = servers
        .iter()
        .map(|s| format!("redis://locker:secret@127.0.0.1:{}", s.port()));
    let (err, took) = refused(&patient(urls), "outside").await;
    let text = err.to_string();
    assert!(
        text.contains("NOPERM") || text.contains("permission"),
        "{text}"
    );
    assert!(
        causes(&err)
            .iter()
            .all(|c| matches!(c, NodeError::Permission(_))),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_names_is_refused_and_never_grants() {
    let cluster = Cluster::start(2).await;
    let (a, b) = (cluster.node(0).port(), cluster.node(1).port());
    // Two of three "nodes" are one server: a majority of one real vote.
    let urls = [
        format!("redis://localhost:{a}"),
        format!("redis://127.0.0.1:{a}"),
        format!("redis://127.0.0.1:{b}"),
    ];
    let redlock = patient(urls);
    // Node b is cut off (paused): only the doubled server answers.
    cluster.node(1).pause();
    let (err, took) = refused(&redlock, "doubled").await;
    cluster.node(1).resume();
    let text = err.to_string();
    assert!(
        text.contains("same server") || text.contains("twice"),
        "{text}"
    );
    assert!(text.contains(&format!("localhost:{a}")), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{a}")), "{text}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {text}");
    let err = redlock
        .wait_ready(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("same server"), "{err}");
    // Still refused with every server up.
    let err = redlock.try_lock("doubled").await.unwrap_err();
    assert!(
        matches!(&err, Error::Config(ConfigError::SameServer { .. })),
        "{err:?}"
    );
}
