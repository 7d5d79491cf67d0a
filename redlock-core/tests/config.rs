//! Every configuration error is a clear `ConfigError` and every bad argument a clear
//! `ArgumentError`, never a panic, and
//! nothing is sent to any node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redlock_core::error::TtlError;
use redlock_core::{ArgumentError, ConfigError, Error, Lock, Redlock, RetryPolicy};

type Case = (Result<Lock, Error>, fn(&ArgumentError) -> bool);

fn three() -> [&'static str; 3] {
    [
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ]
}

#[test]
fn no_nodes() {
    assert_eq!(
        Redlock::builder().build().unwrap_err(),
        ConfigError::NoNodes
    );
}

#[test]
fn duplicate_nodes_in_any_spelling() {
    let err = Redlock::builder()
        .nodes(["redis://127.0.0.1:7000", "redis://127.0.0.1:7000/0"])
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::DuplicateNode {
            node: "127.0.0.1:7000".into()
        }
    );
    // Another database on the same server is still the same server: one failure would
    // take both votes.
    let err = Redlock::builder()
        .nodes(["redis://127.0.0.1:7000/1", "redis://127.0.0.1:7000/2"])
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::DuplicateNode { .. }), "{err}");
}

#[test]
fn unparsable_urls_are_reported_without_the_password() {
    for url in [
        "not a url",
        "http://127.0.0.1:6379",
        "redis://:hunter2@[::1",
    ] {
        let err = Redlock::builder().node(url).build().unwrap_err();
        match &err {
            ConfigError::InvalidUrl { url: shown, .. } => {
                assert!(!shown.contains("hunter2"), "{shown}");
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
        assert!(!err.to_string().contains("hunter2"));
    }
}

#[test]
fn credentials_and_tls_urls_are_accepted() {
    let redlock = Redlock::builder()
        .nodes([
            "redis://user:secret@127.0.0.1:7001/2",
            "rediss://127.0.0.1:7002",
            "redis://:secret@127.0.0.1:7003",
        ])
        .build()
        .unwrap();
    assert_eq!(redlock.node_count(), 3);
    assert_eq!(redlock.quorum(), 2);
    assert!(redlock.node_names().iter().all(|n| !n.contains("secret")));
}

#[test]
fn zero_ttl() {
    let err = Redlock::builder()
        .nodes(three())
        .ttl(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::Ttl(TtlError::Zero { .. })),
        "{err}"
    );
    let err = Redlock::builder()
        .nodes(three())
        .ttl(Duration::from_micros(900))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::Ttl(TtlError::Zero { .. })),
        "{err}"
    );
}

#[test]
fn ttl_not_above_drift() {
    // drift = 2 ms + 1% of the TTL: a 2 ms TTL leaves nothing.
    let err = Redlock::builder()
        .nodes(three())
        .node_timeout(Duration::from_millis(1))
        .ttl(Duration::from_millis(2))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::Ttl(TtlError::NotAboveDrift { .. })),
        "{err}"
    );
}

#[test]
fn ttl_too_long() {
    let err = Redlock::builder()
        .nodes(three())
        .ttl(Duration::from_secs(u64::MAX))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::Ttl(TtlError::TooLong { .. })),
        "{err}"
    );
}

#[test]
fn timeout_not_below_ttl() {
    let err = Redlock::builder()
        .nodes(three())
        .ttl(Duration::from_millis(100))
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::Ttl(TtlError::TimeoutNotBelowTtl { .. })),
        "{err}"
    );
    let err = Redlock::builder()
        .nodes(three())
        .node_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err, ConfigError::ZeroTimeout);
}

#[test]
fn drift_factor_out_of_range() {
    // Above a quarter (0.34: a third and more made every watched lock lost at once).
    for factor in [-0.1, 0.26, 0.34, 0.6, f64::NAN, f64::INFINITY] {
        let err = Redlock::builder()
            .nodes(three())
            .drift_factor(factor)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidDriftFactor { .. }),
            "{factor}: {err}"
        );
    }
}

/// Options that are each valid but contradict each other: a watched lock would be
/// declared lost before its first extension round could end.
#[test]
fn extension_period_must_end_before_the_loss_deadline() {
    // 0.2 of a 1 s TTL, twice: loss after 596 ms; extension round by 333 + 300 ms.
    let err = Redlock::builder()
        .nodes(three())
        .ttl(Duration::from_secs(1))
        .drift_factor(0.2)
        .node_timeout(Duration::from_millis(300))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::Ttl(TtlError::ExtensionAfterLoss { .. })),
        "{err}"
    );
    // The maximum TTL is checked too.
    let err = Redlock::builder()
        .nodes(three())
        .ttl(Duration::from_secs(10))
        .max_ttl(Duration::from_millis(400))
        .node_timeout(Duration::from_millis(300))
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Ttl(TtlError::ExtensionAfterLoss { .. } | TtlError::AboveMax { .. })
        ),
        "{err}"
    );
    // A shorter node timeout makes the same TTL and drift fine.
    Redlock::builder()
        .nodes(three())
        .ttl(Duration::from_secs(1))
        .drift_factor(0.2)
        .node_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
}

#[test]
fn zero_attempts() {
    let err = Redlock::builder()
        .nodes(three())
        .retry(RetryPolicy::attempts(0))
        .build()
        .unwrap_err();
    assert_eq!(err, ConfigError::ZeroAttempts);
}

#[test]
fn even_node_count_is_allowed() {
    let redlock = Redlock::builder()
        .nodes(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
        .build()
        .unwrap();
    assert_eq!(redlock.quorum(), 2);
}

/// Bad arguments to a lock call are `Error::Argument` before anything is sent (the nodes
/// here do not exist: a network attempt would give `NoQuorum` instead).
#[tokio::test]
async fn bad_lock_arguments() {
    let redlock = Redlock::builder()
        .nodes(three())
        .node_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let cases: Vec<Case> = vec![
        (redlock.try_lock("").await, |e| {
            matches!(e, ArgumentError::EmptyResource)
        }),
        (redlock.lock_many(Vec::<String>::new()).await, |e| {
            matches!(e, ArgumentError::EmptyResource)
        }),
        (
            redlock.lock_many(["a", "b", "a"]).await,
            |e| matches!(e, ArgumentError::DuplicateResource { resource } if resource == "a"),
        ),
        (redlock.try_lock("x").ttl(Duration::ZERO).await, |e| {
            matches!(e, ArgumentError::Ttl(TtlError::Zero { .. }))
        }),
        (
            redlock.try_lock("x").ttl(Duration::from_millis(40)).await,
            |e| matches!(e, ArgumentError::Ttl(TtlError::TimeoutNotBelowTtl { .. })),
        ),
        (
            redlock.lock("x").retry(RetryPolicy::attempts(0)).await,
            |e| matches!(e, ArgumentError::ZeroAttempts),
        ),
    ];
    for (i, (result, expected)) in cases.into_iter().enumerate() {
        match result {
            Err(Error::Argument(err)) => assert!(expected(&err), "case {i}: {err}"),
            other => panic!("case {i}: expected an argument error, got {other:?}"),
        }
    }
    // And a valid call against unreachable nodes is a clear NoQuorum, not a hang.
    let err = redlock.try_lock("x").await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
}

/// Durations at the edge of their type, in every public option and lock argument:
/// each is saturated or rejected with a `ConfigError`, never a panic (the wait queue used
/// to overflow on a retry delay near `Duration::MAX`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_durations_never_panic() {
    let cluster = redlock_testkit::Cluster::start(1).await;
    let huge = Duration::MAX;
    for build in [
        Redlock::builder().ttl(huge),
        Redlock::builder().max_ttl(huge),
        Redlock::builder().node_timeout(huge),
        Redlock::builder().ttl(Duration::from_nanos(1)),
    ] {
        let err = build.nodes(cluster.urls()).build().unwrap_err();
        let _ = err.to_string();
    }
    let redlock = redlock_testkit::builder(&cluster)
        .max_hold(huge)
        .retry(
            RetryPolicy::deadline(huge)
                .with_delay(huge, huge)
                .with_wake_jitter(huge),
        )
        .build()
        .unwrap();
    let mut lock = redlock.lock("edge").await.unwrap();
    lock.auto_extend_for(huge);
    // Busy: the waiter queues with a retry delay of `Duration::MAX` (it waits forever,
    // so stop it), then a lock call with every extreme argument.
    let waiter = tokio::time::timeout(
        Duration::from_millis(300),
        redlock
            .lock("edge")
            .retry(RetryPolicy::deadline(huge).with_delay(huge, huge)),
    )
    .await;
    assert!(waiter.is_err(), "still waiting");
    let err = redlock.try_lock("other").ttl(huge).await.unwrap_err();
    assert!(matches!(err, Error::Argument(_)), "{err}");
    let err = lock.extend(huge).await.unwrap_err();
    assert!(matches!(err, Error::Argument(_)), "{err}");
    lock.release().await.unwrap();
    // And the client still works.
    redlock
        .try_lock("edge")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A TTL of days (seconds meant, days typed) is refused wherever it is given: the
/// default TTL, the maximum TTL (the restart quarantine lasts that long) and a lock's;
/// the limit can be raised, up to `MAX_TTL`.
#[tokio::test]
async fn absurd_ttls_are_refused_below_a_configurable_limit() {
    let month = Duration::from_secs(30 * 24 * 3600);
    let above_limit = |err: &TtlError| {
        matches!(err, TtlError::AboveLimit { limit, .. } if *limit == redlock_core::builder::DEFAULT_TTL_LIMIT)
            && err.to_string().contains("ttl_limit")
    };
    let build_above_limit =
        |err: &ConfigError| matches!(err, ConfigError::Ttl(ttl) if above_limit(ttl));
    let err = Redlock::builder()
        .nodes(three())
        .ttl(month)
        .build()
        .unwrap_err();
    assert!(build_above_limit(&err), "{err}");
    let err = Redlock::builder()
        .nodes(three())
        .max_ttl(month)
        .build()
        .unwrap_err();
    assert!(build_above_limit(&err), "{err}");
    // Quarantine off: no maximum TTL, the limit still bounds each lock.
    let redlock = redlock_testkit::builder_for(three()).build().unwrap();
    assert_eq!(redlock.max_ttl(), redlock_core::builder::DEFAULT_TTL_LIMIT);
    match redlock.try_lock("x").ttl(month).await {
        Err(Error::Argument(ArgumentError::Ttl(err))) => assert!(above_limit(&err), "{err}"),
        other => panic!("expected TtlAboveLimit, got {other:?}"),
    }
    // Raised on purpose: an hour-long TTL, and the quarantine as long.
    let hour = Duration::from_secs(3600);
    let redlock = Redlock::builder()
        .nodes(three())
        .ttl_limit(hour)
        .ttl(hour)
        .build()
        .unwrap();
    assert_eq!(redlock.max_ttl(), hour);
    // Not above what the protocol accepts.
    let err = Redlock::builder()
        .nodes(three())
        .ttl_limit(month * 2)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::Ttl(TtlError::TooLong { .. })),
        "{err}"
    );
}

/// A 10 MB resource name is refused before any I/O, with an error that does not carry
/// the name; the bound is configurable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_resource_names_are_refused_before_any_io() {
    let cluster = redlock_testkit::Cluster::start(1).await;
    let input_bytes = || async {
        let info: String = cluster
            .node(0)
            .query(redis::cmd("INFO").arg("stats"))
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_net_input_bytes:"))
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let redlock = redlock_testkit::client(&cluster, Duration::from_millis(100));
    let huge = "r".repeat(10 << 20);
    let before = input_bytes().await;
    let started = std::time::Instant::now();
    let err = redlock.lock(huge.as_str()).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(100));
    assert!(
        matches!(&err, Error::Argument(ArgumentError::ResourceTooLong { len, max, .. }) if *len == huge.len() && *max == redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN),
        "{err:?}"
    );
    assert!(err.to_string().len() < 400, "{err}");
    assert!(input_bytes().await - before < 64 << 10, "the name was sent");
    let err = redlock.lock_many(["ok", huge.as_str()]).await.unwrap_err();
    assert!(matches!(
        err,
        Error::Argument(ArgumentError::ResourceTooLong { .. })
    ));

    // At the bound it is fine; the bound can be set.
    let at_bound = "r".repeat(redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN);
    redlock
        .try_lock(at_bound)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let small = redlock_testkit::builder(&cluster)
        .max_resource_len(8)
        .build()
        .unwrap();
    assert!(small.try_lock("123456789").await.is_err());
    small
        .try_lock("12345678")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
