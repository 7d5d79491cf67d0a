//! Fenced writes to a real data Redis: equal tokens are admitted, higher ones raise the
//! fence, lower ones are refused with both tokens and write nothing; `del` and TTLs are
//! fenced the same way; tokens above 2^53 are told apart exactly; a value that is not a
//! token, a rejected TTL and a flushed script cache are handled; a restart forgets the
//! fence without persistence and keeps it with AOF; and a real lock's holder, paused
//! past its validity, is refused after a newer holder wrote (the negative control, an
//! unfenced SET, goes through).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redlock_core::RetryPolicy;
use redlock_fence::{DEFAULT_FENCE_PREFIX, FenceError, RedisFence};
use redlock_testkit::{Cluster, Persistence, RedisServer};

async fn connect(server: &RedisServer) -> MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

#[track_caller]
fn assert_stale(result: Result<impl std::fmt::Debug, FenceError>, token: u64, highest: u64) {
    match result {
        Err(FenceError::Stale {
            token: t,
            highest: h,
            ..
        }) if t == token && h == highest => {}
        other => panic!("expected Stale {{ token: {token}, highest: {highest} }}, got {other:?}"),
    }
}

/// First, equal and higher tokens write; a lower one is refused with both tokens and
/// writes nothing; the fence key holds the highest token, without expiry; each resource
/// has its own fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_only_go_up() {
    let server = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&server).await;
    let fence = RedisFence::new();
    assert_eq!(fence.prefix(), DEFAULT_FENCE_PREFIX);
    assert_eq!(fence.highest(&mut conn, "account:1").await.unwrap(), None);

    fence
        .set(&mut conn, "account:1", 5, "balance:1", "a", None)
        .await
        .unwrap();
    fence
        .set(&mut conn, "account:1", 5, "balance:1", "b", None)
        .await
        .expect("the same token again");
    fence
        .set(&mut conn, "account:1", 7, "balance:1", "c", None)
        .await
        .unwrap();
    match fence
        .set(&mut conn, "account:1", 6, "balance:1", "d", None)
        .await
    {
        Err(FenceError::Stale {
            resource,
            token: 6,
            highest: 7,
        }) => assert_eq!(resource, "account:1"),
        other => panic!("{other:?}"),
    }
    assert_eq!(get(&mut conn, "balance:1").await.as_deref(), Some("c"));
    assert_eq!(
        get(&mut conn, "fence:account:1").await.as_deref(),
        Some("7")
    );
    assert_eq!(pttl(&mut conn, "fence:account:1").await, -1, "no expiry");
    assert_eq!(
        fence.highest(&mut conn, "account:1").await.unwrap(),
        Some(7)
    );

    // `check` raises without writing data.
    assert_stale(fence.check(&mut conn, "account:1", 6).await, 6, 7);
    fence.check(&mut conn, "account:1", 7).await.unwrap();
    fence.check(&mut conn, "account:1", 9).await.unwrap();
    assert_eq!(
        fence.highest(&mut conn, "account:1").await.unwrap(),
        Some(9)
    );
    assert_stale(
        fence
            .set(&mut conn, "account:1", 8, "balance:1", "e", None)
            .await,
        8,
        9,
    );
    assert_eq!(get(&mut conn, "balance:1").await.as_deref(), Some("c"));

    // Another resource has its own fence; another prefix, its own keys.
    fence
        .set(&mut conn, "account:2", 1, "balance:2", 10_i64, None)
        .await
        .unwrap();
    assert_eq!(get(&mut conn, "balance:2").await.as_deref(), Some("10"));
    let other = RedisFence::with_prefix("other-fence/");
    other.check(&mut conn, "account:1", 1).await.unwrap();
    assert_eq!(
        get(&mut conn, "other-fence/account:1").await.as_deref(),
        Some("1")
    );
}

/// `del` is fenced like `set`, and says whether the key existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_is_fenced() {
    let server = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&server).await;
    let fence = RedisFence::new();
    fence.set(&mut conn, "r", 3, "k", "v", None).await.unwrap();
    assert_stale(fence.del(&mut conn, "r", 2, "k").await, 2, 3);
    assert_eq!(get(&mut conn, "k").await.as_deref(), Some("v"), "kept");
    assert!(fence.del(&mut conn, "r", 3, "k").await.unwrap());
    assert_eq!(get(&mut conn, "k").await, None);
    assert!(!fence.del(&mut conn, "r", 4, "k").await.unwrap(), "gone");
    assert_eq!(fence.highest(&mut conn, "r").await.unwrap(), Some(4));
    assert_stale(fence.set(&mut conn, "r", 3, "k", "v", None).await, 3, 4);
    assert_eq!(get(&mut conn, "k").await, None);
}

/// Resource names follow the locks' rule: a 10 KB name and an empty one are refused
/// with `InvalidResource` by every call, before anything is sent; the longest name a
/// lock takes is fenced; a raised bound takes longer names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_names_are_bounded() {
    use redlock_core::ArgumentError;
    use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;

    #[track_caller]
    fn assert_refused<T: std::fmt::Debug>(result: Result<T, FenceError>, len: usize) {
        match result {
            Err(FenceError::InvalidResource(ArgumentError::ResourceTooLong {
                len: l,
                max,
                ..
            })) if l == len && max == DEFAULT_MAX_RESOURCE_LEN => {}
            Err(FenceError::InvalidResource(ArgumentError::EmptyResource)) if len == 0 => {}
            other => panic!("expected InvalidResource for {len} bytes, got {other:?}"),
        }
    }

    let server = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&server).await;
    let fence = RedisFence::new();
    for name in ["r".repeat(10 * 1024), String::new()] {
        let len = name.len();
        assert_refused(fence.check(&mut conn, &name, 1).await, len);
        assert_refused(fence.set(&mut conn, &name, 1, "k", "v", None).await, len);
        assert_refused(fence.del(&mut conn, &name, 1, "k").await, len);
        assert_refused(fence.highest(&mut conn, &name).await, len);
    }
    let size: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, 0, "nothing was written");

    let longest = "r".repeat(DEFAULT_MAX_RESOURCE_LEN);
    fence
        .set(&mut conn, &longest, 1, "k", "v", None)
        .await
        .unwrap();
    assert_eq!(fence.highest(&mut conn, &longest).await.unwrap(), Some(1));
    let longer = "r".repeat(2048);
    let raised = fence.clone().max_resource_len(2048);
    raised.check(&mut conn, &longer, 2).await.unwrap();
    assert_eq!(raised.highest(&mut conn, &longer).await.unwrap(), Some(2));
}

/// A TTL becomes `PX`, rounded up to whole milliseconds; without one, the key keeps no
/// expiry (also one it had). A zero TTL is rejected by Redis before anything is written:
/// neither the data nor the fence changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls() {
    let server = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&server).await;
    let fence = RedisFence::new();
    fence
        .set(
            &mut conn,
            "r",
            1,
            "k",
            "v",
            Some(Duration::from_millis(250)),
        )
        .await
        .unwrap();
    let left = pttl(&mut conn, "k").await;
    assert!((1..=250).contains(&left), "{left}");
    fence.set(&mut conn, "r", 1, "k", "w", None).await.unwrap();
    assert_eq!(pttl(&mut conn, "k").await, -1);
    fence
        .set(&mut conn, "r", 1, "k", "x", Some(Duration::from_micros(1)))
        .await
        .expect("rounded up to 1 ms");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(get(&mut conn, "k").await, None, "expired");
    fence
        .set(
            &mut conn,
            "r",
            2,
            "k",
            "y",
            Some(Duration::from_millis(100)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(get(&mut conn, "k").await, None, "expired");
    assert_eq!(
        pttl(&mut conn, "fence:r").await,
        -1,
        "the fence never expires"
    );

    match fence
        .set(&mut conn, "r", 3, "k", "z", Some(Duration::ZERO))
        .await
    {
        Err(FenceError::Redis(err)) => assert!(err.to_string().contains("expire"), "{err}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(get(&mut conn, "k").await, None, "not written");
    assert_eq!(
        fence.highest(&mut conn, "r").await.unwrap(),
        Some(2),
        "not raised"
    );
}

/// Tokens are compared as numbers over the whole `u64` range, not as Lua doubles (which
/// make 2^53 and 2^53 + 1 equal) nor as plain strings (which put "9" after "10").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tokens_compare_exactly() {
    let server = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&server).await;
    let fence = RedisFence::new();
    let cases: [(u64, u64); 5] = [
        (1 << 53, (1 << 53) + 1),
        (1 << 60, (1 << 60) + 1),
        (u64::MAX - 1, u64::MAX),
        (9, 10),
        (999_999_999_999_999_999, 1_000_000_000_000_000_000),
    ];
    for (i, (lower, higher)) in cases.into_iter().enumerate() {
        let (resource, key) = (format!("up:{i}"), format!("data:up:{i}"));
        fence
            .set(&mut conn, &resource, lower, &key, "lower", None)
            .await
            .unwrap();
        fence
            .set(&mut conn, &resource, higher, &key, "higher", None)
            .await
            .unwrap_or_else(|err| panic!("{higher} after {lower}: {err}"));
        assert_eq!(
            fence.highest(&mut conn, &resource).await.unwrap(),
            Some(higher)
        );

        let (resource, key) = (format!("down:{i}"), format!("data:down:{i}"));
        fence
            .set(&mut conn, &resource, higher, &key, "higher", None)
            .await
            .unwrap();
        assert_stale(
            fence
                .set(&mut conn, &resource, lower, &key, "lower", None)
                .await,
            lower,
            higher,
        );
        assert_eq!(get(&mut conn, &key).await.as_deref(), Some("higher"));
        fence
            .set(&mut conn, &resource, higher, &key, "again", None)
            .await
            .expect("the same large token again");
    }
    fence.check(&mut conn, "zero", 0).await.unwrap();
    assert_eq!(fence.highest(&mut conn, "zero").await.unwrap(), Some(0));
}

/// A fence key another program wrote: a value that is not a token is reported as such,
/// one of another type as Redis' error; either way nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_key_that_holds_no_token() {
    let server = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&server).await;
    let fence = RedisFence::new();
    for (i, foreign) in ["abc", "007", "-1", "18446744073709551616", ""]
        .into_iter()
        .enumerate()
    {
        let resource = format!("r{i}");
        let _: () = redis::cmd("SET")
            .arg(fence.fence_key(&resource))
            .arg(foreign)
            .query_async(&mut conn)
            .await
            .unwrap();
        match fence.set(&mut conn, &resource, 1, "k", "v", None).await {
            Err(FenceError::NotAToken { key, value }) => {
                assert_eq!(
                    (key.as_str(), value.as_str()),
                    (&*fence.fence_key(&resource), foreign)
                );
            }
            other => panic!("{foreign:?}: {other:?}"),
        }
        assert!(matches!(
            fence.highest(&mut conn, &resource).await,
            Err(FenceError::NotAToken { .. })
        ));
    }
    let _: () = redis::cmd("RPUSH")
        .arg("fence:list")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    match fence.set(&mut conn, "list", 1, "k", "v", None).await {
        Err(FenceError::Redis(err)) => assert!(err.to_string().contains("WRONGTYPE"), "{err}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(get(&mut conn, "k").await, None, "nothing was written");
}

/// The script is sent by hash; a server that lost its script cache gets it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_is_refilled() {
    let server = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&server).await;
    let fence = RedisFence::new();
    fence.set(&mut conn, "r", 1, "k", "a", None).await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    fence.set(&mut conn, "r", 2, "k", "b", None).await.unwrap();
    assert_stale(fence.set(&mut conn, "r", 1, "k", "c", None).await, 1, 2);
    assert_eq!(get(&mut conn, "k").await.as_deref(), Some("b"));
}

/// Without persistence a restart forgets the fence (as documented: a lower token is
/// admitted afterwards, and refuses still lower ones); with AOF it keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_fence_only_with_persistence() {
    let fence = RedisFence::new();

    let mut bare = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&bare).await;
    fence
        .set(&mut conn, "r", 7, "k", "seven", None)
        .await
        .unwrap();
    bare.restart().await;
    let mut conn = connect(&bare).await;
    assert_eq!(
        fence.highest(&mut conn, "r").await.unwrap(),
        None,
        "forgotten"
    );
    fence
        .set(&mut conn, "r", 5, "k", "five", None)
        .await
        .expect("a forgotten fence admits any token");
    assert_stale(fence.set(&mut conn, "r", 4, "k", "four", None).await, 4, 5);

    let mut durable = RedisServer::start(Persistence::AofAlways).await;
    let mut conn = connect(&durable).await;
    fence
        .set(&mut conn, "r", 7, "k", "seven", None)
        .await
        .unwrap();
    durable.restart().await;
    let mut conn = connect(&durable).await;
    assert_eq!(
        fence.highest(&mut conn, "r").await.unwrap(),
        Some(7),
        "kept"
    );
    assert_stale(fence.set(&mut conn, "r", 5, "k", "five", None).await, 5, 7);
    assert_eq!(get(&mut conn, "k").await.as_deref(), Some("seven"));
}

/// Real locks: a holder paused past its lock's validity; another client takes the lock
/// and writes; the first resumes and writes: refused by the fence, accepted by a plain
/// SET (the negative control). A newer holder that only claims the resource with
/// `check` refuses the stale holder before writing anything itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_write_is_refused_after_a_newer_holder_wrote() {
    let cluster = Cluster::start(3).await;
    let client = || {
        redlock_testkit::builder(&cluster)
            .fencing(true)
            .ttl(Duration::from_millis(300))
            .retry(RetryPolicy::deadline(Duration::from_secs(5)))
            .build()
            .unwrap()
    };
    let (first, second) = (client(), client());
    let data = RedisServer::start(Persistence::None).await;
    let mut conn = connect(&data).await;
    let fence = RedisFence::new();

    let paused = first.lock("account:1").await.unwrap();
    let stale_token = paused.fencing_token().unwrap();
    // "Paused": it does nothing while its lock expires.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!paused.is_valid());
    let newer = second.lock("account:1").await.unwrap();
    let token = newer.fencing_token().unwrap();
    assert!(token > stale_token);
    fence
        .set(&mut conn, "account:1", token, "balance:1", "newer", None)
        .await
        .unwrap();
    // It resumes, still holding its old token.
    assert_stale(
        fence
            .set(
                &mut conn,
                "account:1",
                stale_token,
                "balance:1",
                "stale",
                None,
            )
            .await,
        stale_token,
        token,
    );
    assert_eq!(get(&mut conn, "balance:1").await.as_deref(), Some("newer"));
    // Without the fence the stale write would have gone through.
    let _: () = redis::cmd("SET")
        .arg("balance:1")
        .arg("stale")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(get(&mut conn, "balance:1").await.as_deref(), Some("stale"));
    drop((paused, newer));

    // Claiming: the next holder raises the fence at once, before any write of its own.
    let paused = first.lock("account:2").await.unwrap();
    let stale_token = paused.fencing_token().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let newer = second.lock("account:2").await.unwrap();
    let token = newer.fencing_token().unwrap();
    fence.check(&mut conn, "account:2", token).await.unwrap();
    assert_stale(
        fence
            .del(&mut conn, "account:2", stale_token, "balance:2")
            .await,
        stale_token,
        token,
    );
    drop((paused, newer));
}
