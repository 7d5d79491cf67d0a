//! Semaphores and read-write locks in the operator's tools, against real nodes: the
//! listing groups a semaphore's slots (permits used of the size its clients recorded,
//! and who holds them) and a read-write lock's keys (writer, live readers, a waiting
//! writer); a forced release frees them and makes the old holders' tokens stale.
//!
//! The read-write locks' keys are written here with plain commands, per their layout
//! (`W = <prefix>{<name>/rw}`, `W:reader:<value>`, `W:readers`, `W:writer-waiting`,
//! `W:fence`), on every node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redlock_core::inspect::Agreement;
use redlock_core::{Redlock, RetryPolicy};
use redlock_testkit::Cluster;

fn client(cluster: &Cluster, holder: &str) -> Redlock {
    redlock_testkit::builder(cluster)
        .holder(holder)
        .fencing(true)
        // Generous: these tests check what is listed and released, not node timeouts.
        .node_timeout(Duration::from_secs(1))
        .ttl(Duration::from_secs(30))
        .retry(
            RetryPolicy::deadline(Duration::from_secs(5))
                .with_delay(Duration::from_millis(5), Duration::from_millis(20)),
        )
        .build()
        .unwrap()
}

/// Runs `cmd` on every node of `cluster`.
async fn everywhere(cluster: &Cluster, cmd: &redis::Cmd) {
    for i in 0..3 {
        let done: Option<redis::Value> = cluster.node(i).query(cmd).await;
        assert!(done.is_some(), "node {i} refused {cmd:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_is_listed_with_its_permits_and_released_by_force() {
    let cluster = Cluster::start(3).await;
    let api = client(&cluster, "api-1");
    let worker = client(&cluster, "worker-2");
    let semaphore = api.semaphore("exports", 3).unwrap();
    let a = semaphore.try_acquire().await.unwrap();
    let b = worker
        .semaphore("exports", 3)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let _plain = api.lock("exports-report").await.unwrap();

    // The size record is written in the background by the first acquisition.
    let deadline = Instant::now() + Duration::from_secs(5);
    let listing = loop {
        let listing = api.locks("").await.unwrap();
        if listing.semaphores.first().and_then(|s| s.permits) == Some(3) {
            break listing;
        }
        assert!(
            Instant::now() < deadline,
            "no size recorded: {:?}",
            listing.semaphores
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(listing.semaphores.len(), 1, "{listing:?}");
    let held = &listing.semaphores[0];
    assert_eq!(held.name, "exports");
    assert_eq!((held.used, held.permits), (2, Some(3)));
    let holders: BTreeSet<_> = held
        .slots
        .iter()
        .map(|s| s.lock.holder.clone().unwrap())
        .collect();
    assert_eq!(holders, BTreeSet::from(["api-1".into(), "worker-2".into()]));
    let slots: BTreeSet<u32> = held.slots.iter().map(|s| s.slot).collect();
    assert_eq!(slots, BTreeSet::from([a.slot(), b.slot()]));
    for slot in &held.slots {
        assert!(slot.is_held(listing.quorum));
        assert_eq!(slot.lock.agreement, Agreement::Majority);
        assert!(slot.lock.validity.unwrap() > Duration::from_secs(20));
        let token = if slot.slot == a.slot() {
            a.fencing_token()
        } else {
            b.fencing_token()
        };
        assert!(slot.lock.fencing_token >= token);
    }
    // The slots are not also plain locks; the plain lock still is.
    let plain: Vec<&str> = listing.locks.iter().map(|l| l.resource.as_str()).collect();
    assert_eq!(plain, ["exports-report"]);
    // The size record lives 30 days.
    let key = "redlock:{exports/permit}:size";
    let ttl: i64 = cluster
        .node(1)
        .query(redis::cmd("PTTL").arg(key))
        .await
        .unwrap();
    assert!(ttl > 29 * 24 * 3600 * 1000, "{ttl}");

    // Prefixes: a semaphore is listed when its name starts with the prefix.
    let under = api.locks("exp").await.unwrap();
    assert_eq!(under.semaphores.len(), 1);
    assert!(api.locks("other").await.unwrap().semaphores.is_empty());
    let slots_only = api.locks("exports/permit/").await.unwrap();
    assert!(slots_only.semaphores.is_empty());
    assert_eq!(slots_only.locks.len(), 2, "the slots, as locks");

    // Forced release: every slot of the recorded size, fences raised. Each node's
    // slot keys are there first (b's permit returned at a majority).
    cluster.settle_keys("redlock:{exports/permit/*}", 6).await;
    let forced = api.force_release_semaphore("exports").await.unwrap();
    assert_eq!(forced.permits, Some(3));
    assert_eq!(forced.slots.len(), 3);
    assert_eq!(forced.released(), 2);
    assert!(forced.failures.is_empty());
    let after = api.locks("").await.unwrap();
    assert!(after.semaphores.is_empty(), "{after:?}");
    // Every slot's counter was raised on every node, to the token reported.
    for slot in &forced.slots {
        let key = format!("redlock:{{exports/permit/{}}}:fence", slot.slot);
        for i in 0..3 {
            let fence: Option<u64> = cluster
                .node(i)
                .query(redis::cmd("GET").arg(&key))
                .await
                .unwrap();
            assert_eq!(fence, Some(slot.fencing_token), "{key} on node {i}");
        }
    }

    // Three permits at once, each slot's token above its old holder's.
    let started = Instant::now();
    let mut fresh = Vec::new();
    for _ in 0..3 {
        fresh.push(semaphore.try_acquire().await.unwrap());
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    for old in [&a, &b] {
        let new = fresh.iter().find(|p| p.slot() == old.slot()).unwrap();
        assert!(new.fencing_token().unwrap() > old.fencing_token().unwrap());
        let slot = forced.slots.iter().find(|s| s.slot == old.slot()).unwrap();
        assert_eq!(slot.deleted, 3);
        assert!(slot.fencing_token > old.fencing_token().unwrap());
    }
    // The old holders learn it at their next extension.
    let mut a = a;
    assert!(a.extend(Duration::from_secs(30)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_without_a_size_record_is_released_by_scan() {
    let cluster = Cluster::start(3).await;
    let api = client(&cluster, "api-1");
    let held = api.lock("batch/permit/4").await.unwrap();
    let listing = api.locks("batch").await.unwrap();
    assert_eq!(listing.semaphores.len(), 1);
    assert_eq!(listing.semaphores[0].permits, None);
    assert_eq!(listing.semaphores[0].used, 1);
    assert_eq!(listing.semaphores[0].slots[0].slot, 4);

    let forced = api.force_release_semaphore("batch").await.unwrap();
    assert_eq!(forced.permits, None);
    assert_eq!(forced.slots.len(), 1);
    assert_eq!(forced.slots[0].slot, 4);
    assert!(forced.slots[0].fencing_token > held.fencing_token().unwrap());
    assert!(api.try_lock("batch/permit/4").await.is_ok());
    assert!(matches!(
        api.force_release_semaphore("").await,
        Err(redlock_core::Error::Argument(_))
    ));
    assert!(matches!(
        api.force_release_rw("").await,
        Err(redlock_core::Error::Argument(_))
    ));
}

const HEX: &str = "0123456789abcdef0123456789abcdef01234567";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_is_listed_and_released_by_force() {
    let cluster = Cluster::start(3).await;
    let api = client(&cluster, "api-1");

    // `doc`: two readers on every node, one on a single node (not live on a majority),
    // a dead name in the set, a reader the set lost, and a writer waiting.
    let w = "redlock:{doc/rw}";
    let readers = [
        format!("reader-1/{HEX}"),
        format!("reader-2/{HEX}"),
        format!("reader-3/{HEX}"),
    ];
    for (i, value) in readers.iter().enumerate() {
        let key = format!("{w}:reader:{value}");
        let set = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("PX")
            .arg(30_000)
            .clone();
        if i < 2 {
            everywhere(&cluster, &set).await;
        } else {
            let _: Option<redis::Value> = cluster.node(0).query(&set).await;
        }
        everywhere(
            &cluster,
            redis::cmd("SADD").arg(format!("{w}:readers")).arg(&key),
        )
        .await;
    }
    everywhere(
        &cluster,
        redis::cmd("SADD")
            .arg(format!("{w}:readers"))
            .arg(format!("{w}:reader:gone/{HEX}")),
    )
    .await;
    let lost = format!("{w}:reader:reader-4/{HEX}");
    everywhere(
        &cluster,
        redis::cmd("SET").arg(&lost).arg("x").arg("PX").arg(30_000),
    )
    .await;
    everywhere(
        &cluster,
        redis::cmd("SET")
            .arg(format!("{w}:writer-waiting"))
            .arg(format!("writer-9/{HEX}"))
            .arg("PX")
            .arg(30_000),
    )
    .await;
    // `page`: a writer (its key is an ordinary lock key), with a fence.
    let writer = api.lock("page/rw").await.unwrap();
    let token = writer.fencing_token().unwrap();
    // `old`: nothing live left (an empty set's leftover name only).
    everywhere(
        &cluster,
        redis::cmd("SADD")
            .arg("redlock:{old/rw}:readers")
            .arg(format!("redlock:{{old/rw}}:reader:gone/{HEX}")),
    )
    .await;

    let listing = api.locks("").await.unwrap();
    assert!(listing.locks.is_empty(), "{:?}", listing.locks);
    let names: Vec<&str> = listing.rw_locks.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["doc", "page"]);
    let doc = &listing.rw_locks[0];
    assert!(doc.writer.is_none());
    assert!(doc.writer_waiting);
    let holders: Vec<_> = doc.readers.iter().map(|r| r.holder.as_deref()).collect();
    assert_eq!(holders, [Some("reader-1"), Some("reader-2")]);
    for reader in &doc.readers {
        assert_eq!(reader.holding, 3);
        let validity = reader.validity.unwrap();
        assert!(validity > Duration::from_secs(20) && validity <= Duration::from_secs(30));
    }
    let page = &listing.rw_locks[1];
    assert!(page.readers.is_empty() && !page.writer_waiting);
    let held = page.writer.as_ref().unwrap();
    assert_eq!(held.holder.as_deref(), Some("api-1"));
    assert_eq!(held.agreement, Agreement::Majority);
    assert!(held.validity.unwrap() > Duration::from_secs(20));
    assert!(page.fencing_token >= Some(token));
    // Prefixes.
    let only = api.locks("pa").await.unwrap();
    assert_eq!(only.rw_locks.len(), 1);
    assert_eq!(only.rw_locks[0].name, "page");
    assert!(api.locks("x").await.unwrap().rw_locks.is_empty());

    // Forced release of `doc`: every reader (the set's and the lost one), the set, the
    // waiting writer's mark.
    let forced = api.force_release_rw("doc").await.unwrap();
    assert_eq!(forced.writer_deleted, 0);
    assert_eq!(forced.readers_deleted, 4);
    assert_eq!(forced.writer_waiting_deleted, 3);
    assert!(forced.failures.is_empty());
    for i in 0..3 {
        let left: Vec<String> = cluster
            .node(i)
            .query(redis::cmd("KEYS").arg("redlock:{doc/rw}*"))
            .await
            .unwrap();
        assert_eq!(left, ["redlock:{doc/rw}:fence"], "node {i}");
    }

    // Forced release of `page`: the writer goes, its token is stale. Its key is on
    // every node first (its acquisition returned at a majority).
    cluster.settle_keys("redlock:{page/rw}", 3).await;
    let forced = api.force_release_rw("page").await.unwrap();
    assert_eq!(forced.writer_deleted, 3);
    assert!(forced.fencing_token > token);
    for i in 0..3 {
        let fence: Option<u64> = cluster
            .node(i)
            .query(redis::cmd("GET").arg("redlock:{page/rw}:fence"))
            .await
            .unwrap();
        assert_eq!(fence, Some(forced.fencing_token));
    }
    let next = api.try_lock("page/rw").await.unwrap();
    assert!(next.fencing_token().unwrap() > forced.fencing_token);
    drop(next);
    let mut writer = writer;
    assert!(writer.extend(Duration::from_secs(30)).await.is_err());
    let after = api.locks("").await.unwrap();
    assert!(after.rw_locks.iter().all(|l| l.name != "doc"), "{after:?}");
}

/// The same through [`RwLock`](redlock_core::rwlock::RwLock) itself: two readers and a writer
/// waiting for them are listed; the forced release frees the readers and wakes the
/// writer at once (its retry delay is 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_in_use_is_listed_and_its_waiting_writer_woken() {
    let cluster = Cluster::start(3).await;
    let (a, b) = (client(&cluster, "reader-a"), client(&cluster, "writer-b"));
    let r1 = a.rw_lock("feed").unwrap().try_read().await.unwrap();
    let r2 = b.rw_lock("feed").unwrap().try_read().await.unwrap();
    let rw_b = b.rw_lock("feed").unwrap().retry(
        RetryPolicy::deadline(Duration::from_secs(20))
            .with_delay(Duration::from_secs(3), Duration::ZERO),
    );
    let writer = tokio::spawn(async move {
        let w = rw_b.write().await.unwrap();
        (Instant::now(), w)
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let listing = loop {
        let listing = a.locks("feed").await.unwrap();
        if listing.rw_locks.first().is_some_and(|l| l.writer_waiting) {
            break listing;
        }
        assert!(Instant::now() < deadline, "no waiting writer: {listing:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let feed = &listing.rw_locks[0];
    assert_eq!(feed.name, "feed");
    assert!(feed.writer.is_none());
    let holders: BTreeSet<_> = feed.readers.iter().map(|r| r.holder.clone()).collect();
    assert_eq!(
        holders,
        BTreeSet::from([Some("reader-a".into()), Some("writer-b".into())])
    );
    assert!(listing.locks.is_empty());

    // The writer's mark is on every node first (its client waited for a majority).
    cluster
        .settle_keys("redlock:{feed/rw}:writer-waiting", 3)
        .await;
    let forced = a.force_release_rw("feed").await.unwrap();
    assert_eq!(forced.readers_deleted, 2);
    assert_eq!(forced.writer_waiting_deleted, 3);
    let released = Instant::now();
    let (got, w) = writer.await.unwrap();
    let waited = got.duration_since(released);
    assert!(
        waited < Duration::from_secs(2),
        "the writer came {waited:?} after"
    );
    assert!(w.fencing_token().unwrap() > forced.fencing_token);
    let listing = a.locks("feed").await.unwrap();
    let feed = &listing.rw_locks[0];
    assert_eq!(
        feed.writer.as_ref().unwrap().holder.as_deref(),
        Some("writer-b")
    );
    assert!(feed.readers.is_empty() && !feed.writer_waiting);
    let (mut r1, mut r2) = (r1, r2);
    assert!(r1.extend(Duration::from_secs(30)).await.is_err());
    assert!(r2.extend(Duration::from_secs(30)).await.is_err());
    w.release().await.unwrap();
}
