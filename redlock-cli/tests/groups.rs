//! The built `redlock` binary with semaphores and read-write locks, against real
//! `redis-server` nodes: `locks` shows a semaphore's permits used of its size with each
//! slot's holder, and a read-write lock's readers and waiting writer (tables and
//! JSON); `release --semaphore` and `release --rw` free them by force, never without
//! `--force`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::time::{Duration, Instant};

use redlock_core::Redlock;
use redlock_testkit::Cluster;

mod common;
use common::{holder_client, nodes_of, run_cli};

fn worker(cluster: &Cluster) -> Redlock {
    redlock_testkit::builder(cluster)
        .holder("worker-2")
        .fencing(true)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_rw_locks_are_listed_and_released_by_force() {
    let cluster = Cluster::start(3).await;
    let nodes = nodes_of(&cluster);
    let billing = holder_client(&cluster);
    let worker = worker(&cluster);
    let semaphore = billing
        .semaphore("exports", 3)
        .unwrap()
        .ttl(Duration::from_secs(30));
    let a = semaphore.try_acquire().await.unwrap();
    let b = worker
        .semaphore("exports", 3)
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let mut reader = billing
        .rw_lock("feed")
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_read()
        .await
        .unwrap();
    // The size is recorded in the background by the first acquisition.
    let deadline = Instant::now() + Duration::from_secs(5);
    while billing.locks("exports").await.unwrap().semaphores[0].permits != Some(3) {
        assert!(Instant::now() < deadline, "no size recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Tables: the semaphore (2 of 3, a row per slot held), the read-write lock.
    let out = run_cli(&["locks", "--nodes", &nodes], &[]).await.expect(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.starts_with("SEMAPHORE"))
        .unwrap_or_else(|| panic!("no semaphore table: {out:?}"));
    assert!(lines[head + 1].starts_with("exports"), "{out:?}");
    assert!(lines[head + 1].contains("2/3"), "{out:?}");
    let slots = &lines[head + 1..head + 3];
    assert!(slots.iter().any(|l| l.contains("billing-1")), "{out:?}");
    assert!(slots.iter().any(|l| l.contains("worker-2")), "{out:?}");
    let rw = lines
        .iter()
        .find(|l| l.starts_with("feed"))
        .unwrap_or_else(|| panic!("no row for the read-write lock: {out:?}"));
    assert!(rw.contains("1: billing-1") && rw.contains(" no "), "{rw}");
    assert!(lines.iter().any(|l| l.starts_with("RW LOCK")), "{out:?}");
    assert!(
        out.stdout
            .contains("0 locks, 1 semaphore, 1 read-write lock"),
        "{out:?}"
    );
    assert!(!out.stdout.contains("exports/permit/"), "{out:?}");

    // JSON.
    let listing = run_cli(&["locks", "--json", "--nodes", &nodes], &[])
        .await
        .expect(0)
        .json();
    let sem = &listing["semaphores"][0];
    assert_eq!(sem["name"], "exports");
    assert_eq!(
        (sem["used"].as_u64(), sem["permits"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(sem["slots"].as_array().unwrap().len(), 2);
    assert_eq!(listing["rw_locks"][0]["name"], "feed");
    assert_eq!(listing["rw_locks"][0]["readers"][0]["holder"], "billing-1");
    assert!(listing["locks"].as_array().unwrap().is_empty());
    // A prefix that is not the semaphore's: nothing.
    let other = run_cli(&["locks", "orders", "--nodes", &nodes], &[])
        .await
        .expect(0);
    assert!(other.stdout.contains("no locks held"), "{other:?}");

    // Without --force, or with two things named: refused, nothing changed.
    for args in [
        &["release", "--semaphore", "exports"][..],
        &["release", "--rw", "feed"][..],
        &["release", "x", "--rw", "feed", "--force"][..],
        &["release", "--force"][..],
    ] {
        let mut args = args.to_vec();
        args.extend(["--nodes", &nodes]);
        let refused = run_cli(&args, &[]).await.expect(2);
        assert!(refused.stdout.is_empty(), "{refused:?}");
    }
    let refused = run_cli(
        &["release", "--semaphore", "exports", "--nodes", &nodes],
        &[],
    )
    .await
    .expect(2);
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    let still = billing.locks("").await.unwrap();
    assert_eq!(still.semaphores[0].used, 2);
    assert_eq!(still.rw_locks[0].readers.len(), 1);

    // The semaphore: every slot of its size released, the tokens stale.
    let released = run_cli(
        &[
            "release",
            "--semaphore",
            "exports",
            "--force",
            "--json",
            "--nodes",
            &nodes,
        ],
        &[],
    )
    .await
    .expect(0)
    .json();
    assert_eq!(released["name"], "exports");
    assert_eq!(released["permits"], 3);
    assert_eq!(released["nodes"], 3);
    assert_eq!(released["slots"].as_array().unwrap().len(), 3);
    assert!(billing.locks("").await.unwrap().semaphores.is_empty());
    let fresh = semaphore.try_acquire().await.unwrap();
    let old = if fresh.slot() == a.slot() {
        Some(&a)
    } else if fresh.slot() == b.slot() {
        Some(&b)
    } else {
        None
    };
    if let Some(old) = old {
        assert!(fresh.fencing_token().unwrap() > old.fencing_token().unwrap());
    }
    // Human output.
    let human = run_cli(
        &[
            "release",
            "--semaphore",
            "exports",
            "--force",
            "--nodes",
            &nodes,
        ],
        &[],
    )
    .await
    .expect(0);
    assert!(
        human
            .stdout
            .contains("released semaphore `exports` (3 permits) by force: 1 of 3 slots"),
        "{human:?}"
    );

    // The read-write lock: its reader goes.
    let human = run_cli(
        &["release", "--rw", "feed", "--force", "--nodes", &nodes],
        &[],
    )
    .await
    .expect(0);
    assert!(human.stdout.contains("1 reader deleted"), "{human:?}");
    assert!(human.stdout.contains("fencing token now"), "{human:?}");
    assert!(billing.locks("").await.unwrap().rw_locks.is_empty());
    assert!(reader.extend(Duration::from_secs(30)).await.is_err());
}
