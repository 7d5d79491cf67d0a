//! The wait queue over in-memory servers: first come, first served; a hand-over is
//! reserved for its heir; a waiter that gives up leaves; a dead heir's turn passes on.
//! The servers model the queue's sorted sets and deadlines; waiters pick hand-overs up
//! with their timed attempts (no publishing), as clients without wake on release do.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{client, eventually, servers};
use crate::node::fake::FakeServer;
use crate::{Error, Redlock, RetryPolicy};

/// Waiters retry every `delay`, for at most `deadline`.
fn patient(deadline: Duration, delay: Duration) -> RetryPolicy {
    RetryPolicy::deadline(deadline).with_delay(delay, Duration::ZERO)
}

const DELAY: Duration = Duration::from_millis(40);

fn queue_of(servers: &[FakeServer], key: &str) -> Vec<Vec<String>> {
    servers
        .iter()
        .map(|s| s.queue(&format!("{key}:queue")))
        .collect()
}

/// Starts a waiter for "r" (retrying every 40 ms) that records its name in `order` once
/// granted, holds the lock for `hold`, then releases it.
fn waiter(
    redlock: &Redlock,
    name: &'static str,
    order: &Arc<Mutex<Vec<&'static str>>>,
    hold: Duration,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    waiter_every(redlock, name, order, hold, DELAY)
}

/// [`waiter`] retrying every `delay`.
fn waiter_every(
    redlock: &Redlock,
    name: &'static str,
    order: &Arc<Mutex<Vec<&'static str>>>,
    hold: Duration,
    delay: Duration,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let (redlock, order) = (redlock.clone(), Arc::clone(order));
    tokio::spawn(async move {
        let lock = redlock
            .lock("r")
            .retry(patient(Duration::from_secs(5), delay))
            .await?;
        order.lock().unwrap().push(name);
        tokio::time::sleep(hold).await;
        lock.release().await?;
        Ok(())
    })
}

#[tokio::test]
async fn waiters_are_granted_in_the_order_they_began_waiting() {
    let servers = servers(3);
    let redlock = client(&servers, false);
    let key = redlock.key_for("r");
    let holder = redlock.try_lock("r").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, name) in ["first", "second", "third"].into_iter().enumerate() {
        tasks.push(waiter(&redlock, name, &order, Duration::from_millis(20)));
        // Each joins every node's queue before the next begins waiting.
        eventually(|| queue_of(&servers, &key).iter().all(|q| q.len() == i + 1)).await;
    }
    let queues = queue_of(&servers, &key);
    assert!(
        queues.iter().all(|q| *q == queues[0]),
        "one order everywhere: {queues:?}"
    );
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["first", "second", "third"]);
    // Each left the queues when granted.
    assert!(queue_of(&servers, &key).iter().all(Vec::is_empty));
}

#[tokio::test]
async fn a_hand_over_is_reserved_for_its_heir() {
    let servers = servers(3);
    let redlock = client(&servers, false);
    let key = redlock.key_for("r");
    let holder = redlock.try_lock("r").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let heir = waiter(&redlock, "heir", &order, Duration::from_millis(200));
    eventually(|| queue_of(&servers, &key).iter().all(|q| q.len() == 1)).await;
    let id = queue_of(&servers, &key)[0][0].clone();
    holder.release().await.unwrap();
    // Every node reserves the key for the heir, and nobody else can take it meanwhile.
    let placeholder = format!("~{id}");
    for s in &servers {
        let held = s.get(&key);
        assert!(
            held.as_deref() == Some(placeholder.as_str()) || order.lock().unwrap().len() == 1,
            "{held:?}"
        );
    }
    // A newcomer that waits (not a one-shot `try_lock`, which may barge) finds it
    // reserved and queues behind the heir.
    let other = client(&servers, false);
    let newcomer = waiter(&other, "newcomer", &order, Duration::ZERO);
    heir.await.unwrap().unwrap();
    newcomer.await.unwrap().unwrap();
    assert_eq!(*order.lock().unwrap(), ["heir", "newcomer"]);
}

#[tokio::test]
async fn a_waiter_that_gives_up_leaves_every_queue() {
    let servers = servers(3);
    let redlock = client(&servers, false);
    let key = redlock.key_for("r");
    let _holder = redlock.try_lock("r").await.unwrap();
    let err = redlock
        .lock("r")
        .retry(patient(Duration::from_millis(300), DELAY))
        .await
        .expect_err("held all along");
    assert!(matches!(err, Error::Taken { .. }), "{err}");
    eventually(|| queue_of(&servers, &key).iter().all(Vec::is_empty)).await;
    // Its places' deadlines went with them.
    let deadlines: Vec<_> = servers
        .iter()
        .map(|s| s.queue(&format!("{key}:queue:until")))
        .collect();
    assert!(deadlines.iter().all(Vec::is_empty), "{deadlines:?}");
}

#[tokio::test]
async fn a_dead_heirs_turn_passes_to_the_next_waiter() {
    let servers = servers(3);
    let redlock = client(&servers, false);
    let key = redlock.key_for("r");
    let holder = redlock.try_lock("r").await.unwrap();
    // A waiter at the head of every queue whose process died: its place is still
    // kept, its hand-over reserved for 60 ms, and it never comes to take it.
    for s in &servers {
        s.enqueue(&key, "dead.0:60", 1, Duration::from_secs(30));
    }
    // A live waiter whose timed attempts come only every 500 ms.
    let order = Arc::new(Mutex::new(Vec::new()));
    let slow = Duration::from_millis(500);
    let live = waiter_every(&redlock, "live", &order, Duration::from_millis(50), slow);
    eventually(|| queue_of(&servers, &key).iter().all(|q| q.len() == 2)).await;
    holder.release().await.unwrap();
    assert!(
        servers
            .iter()
            .all(|s| s.get(&key).as_deref() == Some("~dead.0:60"))
    );
    // Once the dead heir's reservation is over, the release's follow-up hands the key
    // to the live waiter rather than leaving it free until the waiter's next attempt: a
    // newcomer finds it taken and queues behind.
    eventually(|| {
        servers
            .iter()
            .filter(|s| s.get(&key).as_deref() != Some("~dead.0:60"))
            .count()
            >= 2
    })
    .await;
    let other = client(&servers, false);
    let newcomer = waiter(&other, "newcomer", &order, Duration::ZERO);
    live.await.unwrap().unwrap();
    newcomer.await.unwrap().unwrap();
    assert_eq!(*order.lock().unwrap(), ["live", "newcomer"]);
}

/// The live waiter's join never reached the first node (an acquisition returns at a
/// majority): there, the dead heir's key is freed with nobody to hand it to. The
/// follow-up does not stop at that node: it hands the key over to the live waiter on
/// another, long before its next timed attempt (a hand-over publishes the waiter's
/// wake-up; it then takes that key and the free ones).
#[tokio::test]
async fn a_dead_heirs_turn_passes_on_where_the_next_waiter_queued() {
    let servers = servers(3);
    let redlock = client(&servers, false);
    let key = redlock.key_for("r");
    let holder = redlock.try_lock("r").await.unwrap();
    for s in &servers {
        s.enqueue(&key, "dead.0:60", 1, Duration::from_secs(30));
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let slow = Duration::from_secs(3);
    let live = waiter_every(&redlock, "live", &order, Duration::ZERO, slow);
    eventually(|| queue_of(&servers, &key).iter().all(|q| q.len() == 2)).await;
    let queue = format!("{key}:queue");
    let id = servers[0]
        .queue(&queue)
        .into_iter()
        .find(|member| member != "dead.0:60")
        .unwrap();
    servers[0].dequeue(&key, &id);
    holder.release().await.unwrap();
    let handed = format!("~{id}");
    eventually(|| {
        servers
            .iter()
            .any(|s| s.get(&key).as_deref() == Some(handed.as_str()))
    })
    .await;
    live.await.unwrap().unwrap();
    assert_eq!(*order.lock().unwrap(), ["live"]);
}

#[tokio::test]
async fn a_restart_forgets_one_queue_and_the_waiter_keeps_its_turn() {
    let servers = servers(3);
    let redlock = client(&servers, false);
    let key = redlock.key_for("r");
    let holder = redlock.try_lock("r").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let live = waiter(&redlock, "live", &order, Duration::ZERO);
    eventually(|| queue_of(&servers, &key).iter().all(|q| q.len() == 1)).await;
    servers[0].restart();
    assert!(servers[0].queue(&format!("{key}:queue")).is_empty());
    // The holder's release hands the lock over on the two nodes that remember the
    // queue: the waiter still goes before a newcomer.
    holder.release().await.unwrap();
    let other = client(&servers, false);
    let newcomer = waiter(&other, "newcomer", &order, Duration::ZERO);
    live.await.unwrap().unwrap();
    newcomer.await.unwrap().unwrap();
    assert_eq!(*order.lock().unwrap(), ["live", "newcomer"]);
}
