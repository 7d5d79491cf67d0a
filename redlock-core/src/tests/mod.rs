//! Unit tests of the layers above the node layer (quorum counting, validity, fencing,
//! cleanup, and the wait queue in `queue`) over in-memory servers (`node::fake`):
//! injected latency, error replies, replies lost after the command took effect, restarts
//! without persistence. Fast and deterministic; the same behaviour against real servers
//! and real faults is tested in `tests/`.

mod queue;
mod sim;

use std::time::Duration;

use crate::node::fake::FakeServer;
use crate::{Error, Redlock, RetryPolicy};

const NODE_TIMEOUT: Duration = Duration::from_millis(100);

fn servers(n: usize) -> Vec<FakeServer> {
    (0..n).map(|_| FakeServer::default()).collect()
}

fn client(servers: &[FakeServer], fencing: bool) -> Redlock {
    servers
        .iter()
        .fold(Redlock::builder(), |b, s| b.fake(s.clone()))
        .restart_quarantine(false)
        .wake_on_release(false)
        .fencing(fencing)
        .node_timeout(NODE_TIMEOUT)
        .retry(RetryPolicy::once())
        .build()
        .expect("valid configuration")
}

fn holders(servers: &[FakeServer], key: &str) -> Vec<Option<String>> {
    servers.iter().map(|s| s.get(key)).collect()
}

/// Waits (real time, at most 2 s) until `check` holds: commands to slower nodes finish
/// after a call returns at its quorum.
async fn eventually(mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached within 2 s");
}

#[tokio::test]
async fn a_majority_grants_despite_one_failing_node() {
    let servers = servers(3);
    servers[2].set_failing(true);
    let redlock = client(&servers, false);
    let lock = redlock.try_lock("r").await.expect("2 of 3 is a majority");
    let key = redlock.key_for("r");
    let held = holders(&servers, &key);
    assert!(held[0].is_some() && held[0] == held[1], "{held:?}");
    assert_eq!(held[2], None);
    assert!(lock.release().await.unwrap().was_held());
    assert_eq!(holders(&servers, &key), [None, None, None]);
}

#[tokio::test]
async fn two_failing_nodes_of_three_are_no_quorum_and_leave_nothing() {
    let servers = servers(3);
    servers[1].set_failing(true);
    servers[2].set_failing(true);
    let redlock = client(&servers, false);
    match redlock.try_lock("r").await {
        Err(Error::NoQuorum {
            needed: 2,
            total: 3,
            failures,
            ..
        }) => assert_eq!(failures.len(), 2, "{failures:?}"),
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // The one node that granted was released before the error came back.
    assert_eq!(servers[0].get(&redlock.key_for("r")), None);
}

#[tokio::test]
async fn held_elsewhere_on_a_majority_is_taken_and_cleaned_up() {
    let servers = servers(3);
    let redlock = client(&servers, false);
    let key = redlock.key_for("r");
    servers[0].set(&key, "someone-else");
    servers[1].set(&key, "someone-else");
    match redlock.try_lock("r").await {
        Err(Error::Taken {
            nodes, total: 3, ..
        }) => assert_eq!(nodes.len(), 2),
        other => panic!("expected Taken, got {other:?}"),
    }
    // Our SET on the free node was undone; the holder's values are untouched.
    eventually(|| servers[2].get(&key).is_none()).await;
    assert_eq!(servers[0].get(&key).as_deref(), Some("someone-else"));
}

#[tokio::test]
async fn lost_replies_count_as_failures_but_their_commands_are_undone() {
    let servers = servers(3);
    servers[1].set_losing_replies(true);
    servers[2].set_losing_replies(true);
    let redlock = client(&servers, false);
    let key = redlock.key_for("r");
    let err = redlock
        .try_lock("r")
        .await
        .expect_err("no reply from two nodes");
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    // The SETs took effect on the silent nodes; the cleanup's releases (sent after
    // them, also unanswered) take effect too.
    eventually(|| holders(&servers, &key) == [None, None, None]).await;
}

#[tokio::test]
async fn a_grant_that_comes_after_the_validity_is_expired() {
    let servers = servers(3);
    for s in &servers {
        s.set_latency(Duration::from_millis(850));
    }
    let redlock = servers
        .iter()
        .fold(Redlock::builder(), |b, s| b.fake(s.clone()))
        .restart_quarantine(false)
        .wake_on_release(false)
        .drift_factor(0.25)
        .node_timeout(Duration::from_millis(990))
        .retry(RetryPolicy::once())
        .build()
        .unwrap();
    // Validity: 1000 ms - 25% - 2 ms = 748 ms; every vote comes after 850 ms.
    let err = redlock
        .try_lock("r")
        .ttl(Duration::from_millis(1000))
        .await
        .expect_err("granted too late");
    assert!(matches!(err, Error::Expired { .. }), "{err}");
    let key = redlock.key_for("r");
    eventually(|| holders(&servers, &key) == [None, None, None]).await;
}

#[tokio::test]
async fn fencing_tokens_grow_across_a_restart_and_reach_every_node() {
    let servers = servers(3);
    let redlock = client(&servers, true);
    let fence = redlock.fence_key_for("r");
    let mut last = 0;
    for round in 0..3 {
        if round == 2 {
            // A node restarted without persistence forgets its counter.
            servers[0].restart();
        }
        let lock = redlock.try_lock("r").await.unwrap();
        let token = lock.fencing_token().expect("fencing on");
        assert!(token > last, "token {token} after {last}");
        last = token;
        // The token is written back to every node, the restarted one included.
        let expected = token.to_string();
        eventually(|| {
            holders(&servers, &fence)
                .iter()
                .all(|v| v.as_deref() == Some(expected.as_str()))
        })
        .await;
        lock.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_stale_high_counter_on_one_node_raises_every_later_token() {
    let servers = servers(3);
    let redlock = client(&servers, true);
    let fence = redlock.fence_key_for("r");
    // A counter far past the clock (tokens are not below the nodes' clocks in µs).
    servers[2].set(&fence, "8000000000000000");
    let first = redlock.try_lock("r").await.unwrap();
    let token = first.fencing_token().unwrap();
    // Node 2 granted too, so the token is past its counter, and the others follow.
    assert_eq!(token, 8_000_000_000_000_001);
    first.release().await.unwrap();
    servers[2].set_failing(true);
    let second = redlock.try_lock("r").await.unwrap();
    assert!(second.fencing_token().unwrap() > token);
}

/// A majority whose counters are all behind (one node restarted empty, one that missed
/// the write-backs) still hands out a token past every earlier one: tokens are floored
/// by the nodes' clocks, which have moved on since.
#[tokio::test]
async fn a_majority_without_the_last_counter_still_counts_past_it_by_the_clock() {
    let servers = servers(3);
    let ttl = Duration::from_millis(200);
    let redlock = servers
        .iter()
        .fold(Redlock::builder(), |b, s| b.fake(s.clone()))
        .restart_quarantine(false)
        .wake_on_release(false)
        .fencing(true)
        .ttl(ttl)
        .node_timeout(NODE_TIMEOUT)
        .retry(RetryPolicy::once())
        .build()
        .expect("valid configuration");
    // Node 2 is cut off while five locks are taken: counters (t, t, none).
    servers[2].set_failing(true);
    let mut last = 0;
    for _ in 0..5 {
        let lock = redlock.try_lock("r").await.unwrap();
        last = lock.fencing_token().unwrap();
        lock.release().await.unwrap();
    }
    servers[2].set_failing(false);
    // Node 0 restarts empty; node 1, the only one that kept the counter, answers late.
    servers[0].restart();
    // The restart quarantine (the maximum TTL, here the TTL), which fake servers do not
    // model: a restarted node votes only after it.
    tokio::time::sleep(ttl).await;
    servers[1].set_latency(NODE_TIMEOUT / 2);
    let lock = redlock.try_lock("r").await.unwrap();
    let token = lock.fencing_token().unwrap();
    assert!(token > last, "token {token} after {last}");
}

#[tokio::test]
async fn a_slow_minority_does_not_delay_the_grant() {
    let servers = servers(3);
    servers[2].set_latency(Duration::from_millis(80));
    let redlock = client(&servers, false);
    let started = std::time::Instant::now();
    let lock = redlock.try_lock("r").await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(60),
        "{:?}",
        started.elapsed()
    );
    // The slow node still gets its SET, and the release goes after it.
    lock.release().await.unwrap();
    // Its SET, then the release, both land on it.
    eventually(|| servers[2].commands() >= 2).await;
    assert_eq!(servers[2].get(&redlock.key_for("r")), None);
}

/// An extension to a shorter TTL that is cancelled half-way (a caller's timeout) has
/// reached the nodes already: the holder's validity ends by the shorter TTL all the
/// same, so that it never holds past the keys (which another client may then take).
#[tokio::test]
async fn a_cancelled_extension_to_a_shorter_ttl_still_shortens_the_validity() {
    let servers = servers(3);
    let redlock = client(&servers, false);
    let mut lock = redlock
        .try_lock("r")
        .ttl(Duration::from_secs(10))
        .await
        .unwrap();
    // Each node applies a command at once and answers 50 ms later: the caller gives up
    // after 10 ms, with the shorter TTL applied everywhere.
    for s in &servers {
        s.set_latency(Duration::from_millis(50));
    }
    let sent = tokio::time::Instant::now();
    let short = Duration::from_millis(200);
    let cancelled = tokio::time::timeout(Duration::from_millis(10), lock.extend(short)).await;
    assert!(
        cancelled.is_err(),
        "the extension was meant to be cut short"
    );
    assert!(
        lock.valid_until() <= sent + short,
        "validity {:?} past the keys' TTL {:?}",
        lock.valid_until() - sent,
        short
    );
    for s in &servers {
        s.set_latency(Duration::ZERO);
    }
    tokio::time::sleep(short + Duration::from_millis(20)).await;
    // The keys are gone, and the holder knows it.
    let other = client(&servers, false);
    let taken = other.try_lock("r").await.expect("the keys expired");
    assert!(
        !lock.is_held(),
        "two holders: the first still thinks it holds"
    );
    taken.release().await.unwrap();
}
