//! Fencing tokens only go up: through every API, after a node restarts without
//! persistence (also when the first majority to answer kept no counter), and with the
//! write-back ordered before the release on every node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::Duration;

use redlock_core::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn fenced(urls: Vec<String>, node_timeout: Duration) -> Redlock {
    redlock_testkit::builder_for(urls)
        .fencing(true)
        .node_timeout(node_timeout)
        .ttl(Duration::from_secs(5))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(10))
                .with_delay(Duration::from_millis(5), Duration::from_millis(20)),
        )
        .build()
        .unwrap()
}

async fn token_of(redlock: &Redlock, resource: &str) -> u64 {
    let lock = redlock.lock(resource).await.unwrap();
    let token = lock.fencing_token().unwrap();
    lock.release().await.unwrap();
    token
}

/// A token issued through `lock_many` is below every later token of each of its
/// resources, whichever API issues them, and above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_many_tokens_order_with_single_locks() {
    let cluster = Cluster::start(3).await;
    let redlock = fenced(cluster.urls(), Duration::from_millis(100));
    let mut last_a = 0;
    for _ in 0..5 {
        let t = token_of(&redlock, "fence-a").await;
        assert!(t > last_a);
        last_a = t;
    }
    let last_b = token_of(&redlock, "fence-b").await;
    let many = redlock.lock_many(["fence-a", "fence-b"]).await.unwrap();
    let t_many = many.fencing_token().unwrap();
    many.release().await.unwrap();
    assert!(
        t_many > last_a && t_many > last_b,
        "{t_many} vs {last_a}, {last_b}"
    );
    let after_b = token_of(&redlock, "fence-b").await;
    assert!(
        after_b > t_many,
        "lock(b) after lock_many: {after_b} <= {t_many}"
    );
    let after_a = token_of(&redlock, "fence-a").await;
    assert!(after_a > after_b.max(t_many) || after_a > t_many);
    // And the other way round, resources in the other order.
    let many = redlock.lock_many(["fence-b", "fence-a"]).await.unwrap();
    let t_many2 = many.fencing_token().unwrap();
    many.release().await.unwrap();
    assert!(t_many2 > after_a && t_many2 > after_b);
    assert!(token_of(&redlock, "fence-a").await > t_many2);
    assert!(token_of(&redlock, "fence-b").await > t_many2);
}

/// One node restarts without persistence, and the next majority to answer leaves out
/// the node that issued the highest token: the token still goes up. The last token was
/// granted by nodes 0 and 1 while node 2 refused (its key was taken by a stray lock),
/// so node 2 learns it only through the write-back; then node 1 forgets everything and
/// node 0 is paused, so the next lock is granted by nodes 1 and 2 alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_go_up_after_one_node_restarts_empty() {
    let mut cluster = Cluster::start(3).await;
    let redlock = fenced(cluster.urls(), Duration::from_millis(100));
    let resource = "fence-restart";
    for _ in 0..3 {
        token_of(&redlock, resource).await;
    }
    let key = redlock.key_for(resource);
    // A stray lock on node 2 only: node 2 says no to the next acquisition.
    cluster.set_stray(2, &key).await;
    let issued = token_of(&redlock, resource).await;
    let _: () = cluster
        .node(2)
        .query(redis::cmd("DEL").arg(&key))
        .await
        .unwrap();
    // The background write-back (not awaited by the grant) lands on node 2.
    let fence = redlock.fence_key_for(resource);
    redlock_testkit::until(
        "node 2 learns the last token",
        Duration::from_secs(2),
        || async {
            let counter: Option<u64> = cluster
                .node(2)
                .query(redis::cmd("GET").arg(&fence))
                .await
                .flatten();
            counter
                .is_some_and(|counter| counter >= issued)
                .then_some(())
        },
    )
    .await;
    cluster.node_mut(1).restart().await;
    // Let the client notice the restart and reconnect to node 1 (on other resources),
    // so that the next lock is granted at its first attempt.
    for round in 0..3 {
        redlock_testkit::cycle(&redlock, &format!("elsewhere-{round}")).await;
    }
    cluster.node(0).pause();
    let next = token_of(&redlock, resource).await;
    cluster.node(0).resume();
    assert!(
        next > issued,
        "token {next} after {issued}: the restart of one node made it go backwards"
    );
}

/// Every node of `redlock` votes (connected, out of quarantine), within 15 s.
async fn all_vote(redlock: &Redlock) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let status = redlock.node_status().await;
        if status.iter().all(|s| s.votes()) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every node votes: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first majority to answer holds no counter at all: node 2 missed every
/// write-back while it was cut off, and node 0 restarted empty; node 1, the only node
/// that kept the counter, answers late. The token still goes up: the restarted node
/// votes only after its quarantine, and tokens are not below the nodes' clocks, which
/// have passed every earlier token by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_go_up_when_the_first_majority_to_answer_kept_no_counter() {
    let mut cluster = Cluster::start_proxied(3).await;
    let redlock = redlock_testkit::builder(&cluster)
        .restart_quarantine(true) // the node restarted empty must sit out its quarantine
        .fencing(true)
        .ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(600))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(10))
                .with_delay(Duration::from_millis(5), Duration::from_millis(20)),
        )
        .build()
        .unwrap();
    let resource = "fence-behind";
    all_vote(&redlock).await;
    cluster.proxy(2).cut();
    let mut issued = 0;
    for _ in 0..5 {
        issued = token_of(&redlock, resource).await;
    }
    cluster.proxy(2).restore();
    let fence = redlock.fence_key_for(resource);
    let on_node_2: Option<String> = cluster
        .node(2)
        .query(redis::cmd("GET").arg(&fence))
        .await
        .unwrap();
    assert_eq!(on_node_2, None, "node 2 was cut off: it holds no counter");
    cluster.node_mut(0).restart().await;
    all_vote(&redlock).await;
    cluster.proxy(1).delay(Duration::from_millis(200));
    let lock = redlock.lock(resource).await.unwrap();
    let next = lock.fencing_token().unwrap();
    lock.release().await.unwrap();
    cluster.proxy(1).restore();
    assert!(
        next > issued,
        "token {next} after {issued}: a majority without the counter made it go back"
    );
}

/// What node `i` executed of our scripts, in order: `raise` (fence write-back), `release`,
/// `acquire` (the fencing acquire), from its MONITOR stream.
fn classify(line: &str) -> Option<&'static str> {
    if !line.contains("\"EVALSHA\"") || line.contains("lua]") {
        return None;
    }
    if line.contains(":queue") {
        Some("release")
    } else if line.contains("\"1\" \"") && line.contains(":fence\"") {
        Some("raise")
    } else {
        Some("acquire")
    }
}

/// On every node the fence write-back comes before the release. Node 2's link is slow
/// and its connection was just closed, so the write-back and the release both wait for
/// a new connection to node 2: the release must still go second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_write_back_precedes_the_release_on_every_node() {
    let cluster = Cluster::start_proxied(3).await;
    let redlock = fenced(cluster.urls(), Duration::from_millis(1500));
    let mut rx = cluster.node(2).monitor().await;
    let rounds = 8;
    for round in 0..rounds {
        let resource = format!("fence-order-{round}");
        // Node 0 is ahead: the token comes from it and must be written back to 1 and 2.
        let fence = redlock.fence_key_for(&resource);
        let _: () = cluster
            .node(0)
            .query(redis::cmd("SET").arg(&fence).arg(100))
            .await
            .unwrap();
        // Warm the connections, then close node 2's: the next commands reconnect, slowly.
        redlock_testkit::cycle(&redlock, "warm").await;
        cluster.proxy(2).cut();
        tokio::time::sleep(Duration::from_millis(20)).await;
        cluster.proxy(2).delay(Duration::from_millis(30));
        let lock = redlock.lock(resource.as_str()).await.unwrap();
        assert!(lock.fencing_token().unwrap() > 100);
        lock.release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut seen: Vec<(String, &'static str)> = Vec::new();
    while let Ok(line) = rx.try_recv() {
        if let Some(kind) = classify(&line) {
            seen.push((line, kind));
        }
    }
    let mut checked = 0;
    for round in 0..rounds {
        let resource = format!("fence-order-{round}");
        let order: Vec<&str> = seen
            .iter()
            .filter(|(line, _)| line.contains(&format!("{{{resource}}}")))
            .map(|(_, kind)| *kind)
            .collect();
        let raise = order.iter().position(|k| *k == "raise");
        let release = order.iter().position(|k| *k == "release");
        if let (Some(raise), Some(release)) = (raise, release) {
            checked += 1;
            assert!(
                raise < release,
                "{resource}: node 2 ran the release before the fence write-back: {order:?}"
            );
        }
    }
    assert!(
        checked >= rounds / 2,
        "node 2 saw both a write-back and a release in only {checked} of {rounds} rounds"
    );
}
