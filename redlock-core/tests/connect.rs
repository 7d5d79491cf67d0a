//! Node URLs with credentials and TLS, against real servers that require them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::error::NodeError;
use redlock_core::{Error, Redlock};
use redlock_testkit::{RedisServer, ServerOptions, require};

const TIMEOUT: Duration = Duration::from_millis(500);

fn redlock(urls: impl IntoIterator<Item = String>) -> Redlock {
    redlock_testkit::builder_for(urls)
        .node_timeout(TIMEOUT)
        .build()
        .unwrap()
}

async fn lock_cycle(redlock: &Redlock) {
    let lock = redlock.try_lock("secured").await.expect("lock");
    assert!(redlock.try_lock("secured").await.is_err());
    assert!(lock.release().await.unwrap().was_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_and_acl_user() {
    let with_password = RedisServer::start_with(ServerOptions {
        password: Some("s3cret".into()),
        ..ServerOptions::default()
    })
    .await;
    let with_user = RedisServer::start_with(ServerOptions {
        acl_user: Some(("locker".into(), "pw-locker".into())),
        ..ServerOptions::default()
    })
    .await;
    assert!(with_password.url().contains(":s3cret@"));
    assert!(with_user.url().contains("locker:pw-locker@"));
    let both = redlock([with_password.url(), with_user.url()]);
    assert!(both.node_names().iter().all(|n| !n.contains("s3cret")));
    lock_cycle(&both).await;

    // A wrong password is a clear per-node error, returned at once, not retried (the
    // default policy would retry 10 times).
    let wrong = redlock([format!("redis://:wrong@{}", with_password.addr())]);
    let started = Instant::now();
    let err = wrong.lock("secured").await.unwrap_err();
    assert!(started.elapsed() < TIMEOUT);
    match &err {
        Error::NoQuorum { failures, .. } => {
            assert!(
                matches!(failures[0].cause, NodeError::Authentication(_)),
                "{err}"
            );
            let text = err.to_string().to_lowercase();
            assert!(text.contains("auth") || text.contains("password"), "{text}");
            assert!(!text.contains("wrong@"), "credentials leaked: {text}");
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_nodes() {
    // The servers' certificates are made with it.
    let Some(_) = require::program("openssl", "openssl") else {
        return;
    };
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(
            RedisServer::start_with(ServerOptions {
                tls: true,
                ..ServerOptions::default()
            })
            .await,
        );
    }
    assert!(servers.iter().all(|s| s.url().starts_with("rediss://")));

    // Verified against the servers' own CA, through ready clients.
    let mut builder = Redlock::builder()
        .restart_quarantine(false)
        .node_timeout(TIMEOUT);
    for server in &servers {
        let client = redis::Client::build_with_tls(
            server.url(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: server.tls_ca_pem(),
            },
        )
        .unwrap();
        builder = builder.client(client);
    }
    let verified = builder.build().unwrap();
    lock_cycle(&verified).await;

    // Verification is on: the platform's roots do not know this CA, so no node counts.
    let unverified = redlock(servers.iter().map(RedisServer::url));
    let err = unverified.try_lock("secured").await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");

    // Unless the URL explicitly opts out (`#insecure`), e.g. for a test environment.
    let insecure = redlock(servers.iter().map(|s| format!("{}/#insecure", s.url())));
    lock_cycle(&insecure).await;
}
