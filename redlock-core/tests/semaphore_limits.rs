//! A semaphore's bounds, against real redis-server nodes: its number of permits (at
//! most `MAX_PERMITS`, and a call on the largest costs what it touches, not a key per
//! slot) and its name (its slot resources stay within the client's longest resource
//! name).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;
use redlock_core::semaphore::MAX_PERMITS;
use redlock_core::{ArgumentError, Error, ErrorClass};
use redlock_testkit::Cluster;

/// A semaphore of `u32::MAX` permits, or one past the bound, is refused at once with
/// the bound; one at the bound is made.
#[tokio::test]
async fn permits_above_the_bound_are_refused() {
    let cluster = Cluster::start(1).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    for permits in [u32::MAX, MAX_PERMITS + 1] {
        match redlock.semaphore("big", permits) {
            Err(ArgumentError::PermitsAboveMax { permits: p, max }) => {
                assert_eq!((p, max), (permits, MAX_PERMITS));
            }
            other => panic!("a semaphore of {permits} permits: {other:?}"),
        }
    }
    let error = redlock.semaphore("big", u32::MAX).unwrap_err().to_string();
    assert!(error.contains(&MAX_PERMITS.to_string()), "{error}");
    assert_eq!(
        redlock.semaphore("big", MAX_PERMITS).unwrap().permits(),
        MAX_PERMITS
    );
}

/// A semaphore at the bound works end to end, each call costing what it touches: two
/// permits of an idle one take one look at one chunk of slots (a `PTTL` each on a node,
/// far fewer than the permits) and come back quickly; the listing groups them under
/// the recorded size; a forced release frees them (every slot below the size, a batch
/// per round trip); and it takes permits again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_at_the_bound_costs_what_it_touches() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let semaphore = redlock.semaphore("wide", MAX_PERMITS).unwrap();
    // Connections and scripts, before counting.
    semaphore
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    cluster.settle_keys("redlock:{wide/permit/*}", 0).await;
    for i in 0..3 {
        assert!(cluster.node(i).reset_stats().await);
    }
    let started = Instant::now();
    let two = semaphore.acquire_many(2).await.unwrap();
    let took = started.elapsed();
    assert_eq!(two.len(), 2);
    assert_ne!(two[0].slot(), two[1].slot());
    let pttl = cluster
        .node(0)
        .command_calls()
        .await
        .get("pttl")
        .copied()
        .unwrap_or(0);
    println!("acquire_many(2) of {MAX_PERMITS} permits: {took:?}, {pttl} PTTL on node 0");
    assert!(pttl <= 256, "{pttl} slots looked at for 2 free permits");
    assert!(took < Duration::from_secs(2), "{took:?}");

    // The listing, with the size the semaphore recorded.
    let deadline = Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let listing = redlock.locks("wide").await.unwrap();
        if listing.semaphores.first().and_then(|s| s.permits) == Some(MAX_PERMITS) {
            break listing;
        }
        assert!(
            Instant::now() < deadline,
            "size never recorded: {listing:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let held = &listed.semaphores[0];
    assert_eq!(held.used, 2, "{held:?}");

    // A forced release: every slot below the size, the two held ones deleted.
    let started = Instant::now();
    let forced = redlock.force_release_semaphore("wide").await.unwrap();
    println!(
        "force release of {MAX_PERMITS} slots: {:?}",
        started.elapsed()
    );
    assert_eq!(forced.permits, Some(MAX_PERMITS));
    assert_eq!(forced.slots.len(), MAX_PERMITS as usize);
    assert_eq!(forced.released(), 2);
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(two);

    // Freed: a permit again, and another client's beside it.
    let others = redlock_testkit::builder(&cluster).build().unwrap();
    let first = others
        .semaphore("wide", MAX_PERMITS)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let permit = semaphore.acquire().await.unwrap();
    assert_ne!(permit.slot(), first.slot());
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// A size record no semaphore could have written (above the bound, as a record from a
/// release without the bound would be) does not make a forced release build a slot per
/// recorded permit: only the slots found held are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_ignores_a_size_record_past_the_bound() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    let permit = redlock
        .semaphore("forged", 3)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    // Overwrite the record on every node once the semaphore's own has landed.
    cluster.settle_keys("redlock:{forged/permit}:size", 3).await;
    for i in 0..3 {
        let _: () = cluster
            .node(i)
            .query(
                redis::cmd("SET")
                    .arg("redlock:{forged/permit}:size")
                    .arg(u32::MAX),
            )
            .await
            .unwrap();
    }
    let started = Instant::now();
    let forced = redlock.force_release_semaphore("forged").await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(forced.permits, None);
    assert_eq!(forced.slots.len(), 1, "{forced:?}");
    assert_eq!(forced.slots[0].slot, permit.slot());
    assert_eq!(forced.released(), 1);
}

/// The longest name a semaphore accepts leaves its highest slot's resource exactly at
/// the client's bound and works end to end; one byte more is refused at `semaphore()`,
/// with how long the name may be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_semaphore_name_works_and_one_byte_more_is_refused() {
    let cluster = Cluster::start(3).await;
    let redlock = redlock_testkit::builder(&cluster).build().unwrap();
    // 12 permits: the highest slot is `/permit/11`, 10 bytes.
    const PERMITS: u32 = 12;
    let longest = DEFAULT_MAX_RESOURCE_LEN - "/permit/11".len();
    let name = "n".repeat(longest);
    let semaphore = redlock.semaphore(name.as_str(), PERMITS).unwrap();
    assert_eq!(
        semaphore.slot_resource(PERMITS - 1).len(),
        DEFAULT_MAX_RESOURCE_LEN
    );
    let all = semaphore.acquire_many(PERMITS).await.unwrap();
    assert_eq!(all.len(), PERMITS as usize);
    assert!(matches!(
        semaphore.try_acquire().await,
        Err(Error::Taken { .. })
    ));
    for permit in all {
        permit.release().await.unwrap();
    }
    semaphore.acquire().await.unwrap().release().await.unwrap();
    let forced = redlock.force_release_semaphore(&name).await.unwrap();
    assert_eq!(forced.released(), 0);

    let long = "n".repeat(longest + 1);
    match redlock.semaphore(long.as_str(), PERMITS) {
        Err(error @ ArgumentError::SemaphoreNameTooLong { .. }) => {
            let ArgumentError::SemaphoreNameTooLong {
                len, max, permits, ..
            } = &error
            else {
                unreachable!()
            };
            assert_eq!((*len, *max, *permits), (longest + 1, longest, PERMITS));
            assert!(error.to_string().contains(&longest.to_string()), "{error}");
            assert_eq!(Error::Argument(error).class(), ErrorClass::InvalidResource);
        }
        other => panic!("a name of {} bytes: {other:?}", longest + 1),
    }
    // With fewer permits (a one-digit highest slot), that name fits.
    assert!(redlock.semaphore(long.as_str(), 10).is_ok());
}

/// The name's bound follows the client's `max_resource_len`.
#[tokio::test]
async fn the_name_bound_follows_max_resource_len() {
    let cluster = Cluster::start(1).await;
    let redlock = redlock_testkit::builder(&cluster)
        .max_resource_len(20)
        .build()
        .unwrap();
    // `/permit/99`: 10 bytes.
    assert!(redlock.semaphore("a".repeat(10), 100).is_ok());
    assert!(matches!(
        redlock.semaphore("a".repeat(11), 100),
        Err(ArgumentError::SemaphoreNameTooLong {
            len: 11,
            max: 10,
            ..
        })
    ));
    // `/permit/100`: 11 bytes.
    assert!(matches!(
        redlock.semaphore("a".repeat(10), 101),
        Err(ArgumentError::SemaphoreNameTooLong { max: 9, .. })
    ));
}
