//! The safety checker under faults: many clients contend for one resource while nodes
//! are paused, killed and restarted, cut off and slowed; every hold is recorded on one
//! monotonic clock with its fencing token, and the run fails on any overlap or any token
//! that is not strictly increasing.
//!
//! `REDLOCK_SOAK=<factor>` scales the number of acquisitions (default 1: a CI run of
//! about a minute in all; 10 for a soak).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{Error, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, FaultKind, Hold, Persistence, SafetyLog, Violation, run_faults};

const RESOURCE: &str = "ledger";

/// The factor `REDLOCK_SOAK` scales acquisitions by (default 1).
fn soak() -> f64 {
    std::env::var("REDLOCK_SOAK")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0)
}

/// `n` acquisitions scaled by `REDLOCK_SOAK`.
fn scaled(n: usize) -> usize {
    ((n as f64) * soak()).max(1.0) as usize
}

/// Whether a scenario runs at least its full length, long enough for every fault kind
/// of its schedule to come up (a shortened run may see only some).
fn full_length() -> bool {
    soak() >= 1.0
}

struct Setup {
    ttl: Duration,
    node_timeout: Duration,
    fencing: bool,
    quarantine: bool,
}

fn client(urls: Vec<String>, setup: &Setup) -> Redlock {
    client_waking(urls, setup, true)
}

/// `wake`: wait for releases in the queue (hand-overs), or retry on a timer only.
fn client_waking(urls: Vec<String>, setup: &Setup, wake: bool) -> Redlock {
    redlock_testkit::builder_for(urls)
        .ttl(setup.ttl)
        .node_timeout(setup.node_timeout)
        .fencing(setup.fencing)
        .restart_quarantine(setup.quarantine)
        .wake_on_release(wake)
        .retry(
            RetryPolicy::deadline(Duration::from_secs(5))
                .with_delay(Duration::from_millis(1), Duration::from_millis(3)),
        )
        .build()
        .unwrap()
}

/// Takes and releases the resource once; records the hold.
async fn hold_once(redlock: &Redlock, client: usize, log: &SafetyLog) -> Result<(), Error> {
    let lock = redlock.lock(RESOURCE).await?;
    let start = Instant::now();
    tokio::task::yield_now().await;
    let end = Instant::now().min(lock.valid_until());
    log.record(Hold {
        client,
        start,
        end,
        token: lock.fencing_token(),
    });
    let _ = lock.release().await;
    Ok(())
}

/// `clients` clients with `tasks` tasks each take the resource until `target` holds are
/// recorded. Half the clients wait in the queue (woken by hand-overs), half retry on a
/// short timer, so both paths, and a queue that timer clients keep running into, are
/// checked. Returns how many lock calls failed (no quorum while faults ran).
async fn contend(
    urls: &[String],
    setup: &Setup,
    clients: usize,
    tasks: usize,
    target: usize,
    log: &Arc<SafetyLog>,
) -> usize {
    let failures = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for c in 0..clients {
        let redlock = client_waking(urls.to_vec(), setup, c % 2 == 0);
        while !redlock.ready().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..tasks {
            let (redlock, log, failures) = (redlock.clone(), log.clone(), failures.clone());
            handles.push(tokio::spawn(async move {
                while log.len() < target {
                    if hold_once(&redlock, c, &log).await.is_err() {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    failures.load(Ordering::Relaxed)
}

/// The mixed fault schedule (pauses, restarts without persistence, cut links and
/// delays; two at a time, one every 300 ms) on `cluster` until `stop`, restarted nodes
/// in quarantine for `quarantine`; seeded.
fn mixed_faults(
    cluster: Arc<tokio::sync::Mutex<Cluster>>,
    quarantine: Duration,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> impl std::future::Future<Output = redlock_testkit::FaultReport> {
    run_faults(
        cluster,
        &[
            FaultKind::Pause,
            FaultKind::Restart,
            FaultKind::Cut,
            FaultKind::Delay,
        ],
        2,
        Duration::from_millis(300),
        quarantine,
        stop,
        seed,
    )
}

fn assert_safe(log: &SafetyLog, what: &str) {
    let violations = log.violations();
    assert!(
        violations.is_empty(),
        "{what}: {} violations in {} holds, first: {:?}",
        violations.len(),
        log.len(),
        &violations[..violations.len().min(3)]
    );
}

/// (a) The mixed fault schedule, restart quarantine on: no double grant, tokens
/// strictly increasing, over at least 5,000 acquisitions (every fault kind comes up
/// several times). The deterministic simulator (`src/tests/sim`) explores ten thousand
/// fault schedules of this kind per run; this run is the ground truth on real servers,
/// real processes paused, killed and restarted, and real links (`REDLOCK_SOAK=10` for
/// a soak).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_faults_never_double_grant() {
    let target = scaled(5_000);
    let cluster = Arc::new(tokio::sync::Mutex::new(Cluster::start_proxied(5).await));
    let urls = cluster.lock().await.urls();
    let setup = Setup {
        ttl: Duration::from_millis(400),
        node_timeout: Duration::from_millis(40),
        fencing: true,
        quarantine: true,
    };
    let log = Arc::new(SafetyLog::new());
    let stop = Arc::new(AtomicBool::new(false));
    let faults = tokio::spawn(mixed_faults(
        cluster.clone(),
        // The quarantine: max TTL + 1 s of uptime rounding.
        setup.ttl + Duration::from_secs(1),
        stop.clone(),
        7,
    ));
    let started = Instant::now();
    let failed = contend(&urls, &setup, 4, 2, target, &log).await;
    stop.store(true, Ordering::SeqCst);
    let report = faults.await.unwrap();
    eprintln!(
        "mixed faults: {} holds in {:.1} s, {failed} lock calls failed, faults (pause, restart, cut, delay) = {:?}",
        log.len(),
        started.elapsed().as_secs_f64(),
        report.counts
    );
    assert!(log.len() >= target);
    // A shortened run (CI's Valkey phase runs a tenth) may see only some kinds.
    if full_length() {
        assert!(report.counts.iter().all(|&n| n > 0), "every fault kind ran");
    }
    assert_safe(&log, "mixed faults");
}

/// (b) The classic unsafe case: a node restarted without persistence while it holds
/// part of a live lock. Client A holds the lock on a bare majority (nodes 0 and 1 of 3:
/// its link to node 2 is cut); node 0 restarts empty; client B then finds nodes 0 and 2
/// free. With the quarantine off the checker catches the double grant; with it on,
/// node 0 gets no vote and B is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_needs_the_quarantine() {
    let with_quarantine_off = restart_scenario(false).await;
    assert!(
        with_quarantine_off
            .iter()
            .any(|v| matches!(v, Violation::Overlap(..))),
        "the checker must catch the double grant: {with_quarantine_off:?}"
    );
    let with_quarantine_on = restart_scenario(true).await;
    assert!(
        with_quarantine_on.is_empty(),
        "quarantine on: {with_quarantine_on:?}"
    );
}

async fn restart_scenario(quarantine: bool) -> Vec<Violation> {
    let mut cluster = Cluster::start_proxied(3).await;
    let setup = Setup {
        ttl: Duration::from_secs(10),
        node_timeout: Duration::from_millis(100),
        fencing: false,
        quarantine: false,
    };
    let log = SafetyLog::new();
    // A reaches the nodes through the proxies; its link to node 2 is down.
    let a = client(cluster.urls(), &setup);
    cluster.proxy(2).cut();
    let lock_a = a.try_lock(RESOURCE).await.expect("A gets nodes 0 and 1");
    let a_start = Instant::now();
    // Node 0 crashes and comes back empty.
    cluster.node_mut(0).restart().await;
    // B reaches the nodes directly.
    let b = client(
        cluster.direct_urls(),
        &Setup {
            quarantine,
            ..setup
        },
    );
    match b.try_lock(RESOURCE).await {
        Ok(lock_b) => {
            let b_start = Instant::now();
            log.record(Hold {
                client: 1,
                start: b_start,
                end: Instant::now().min(lock_b.valid_until()),
                token: None,
            });
            let _ = lock_b.release().await;
        }
        Err(err) => {
            assert!(quarantine, "B refused with the quarantine off: {err}");
            match err {
                Error::NoQuorum { failures, .. } => assert!(
                    failures
                        .iter()
                        .any(|f| matches!(f.cause, redlock_core::error::NodeError::Quarantined(_))),
                    "node 0 should be in quarantine: {failures:?}"
                ),
                other => panic!("expected NoQuorum, got {other}"),
            }
        }
    }
    log.record(Hold {
        client: 0,
        start: a_start,
        end: Instant::now().min(lock_a.valid_until()),
        token: None,
    });
    let _ = lock_a.release().await;
    log.violations()
}

/// (d) Fencing tokens from competing clients increase strictly, also while nodes are
/// killed and restarted with `appendfsync always` (their counters survive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_aof_restarts() {
    // Every write fsynced on five nodes: the slowest holds of all (the restarts, not the
    // count, are what this checks; a soak scales it up).
    let target = scaled(4_000);
    // Restarts and pauses need no proxy: the clients talk to the servers directly.
    let cluster = Arc::new(tokio::sync::Mutex::new(
        Cluster::start_with(5, Persistence::AofAlways).await,
    ));
    let urls = cluster.lock().await.urls();
    let setup = Setup {
        ttl: Duration::from_millis(500),
        node_timeout: Duration::from_millis(50),
        fencing: true,
        // Every write is fsynced: a restarted node forgets nothing.
        quarantine: false,
    };
    let log = Arc::new(SafetyLog::new());
    let stop = Arc::new(AtomicBool::new(false));
    let faults = tokio::spawn(run_faults(
        cluster.clone(),
        &[FaultKind::Restart, FaultKind::Pause],
        2,
        Duration::from_millis(200),
        Duration::ZERO,
        stop.clone(),
        11,
    ));
    let started = Instant::now();
    let failed = contend(&urls, &setup, 4, 2, target, &log).await;
    stop.store(true, Ordering::SeqCst);
    let report = faults.await.unwrap();
    eprintln!(
        "fencing with AOF restarts: {} holds in {:.1} s, {failed} lock calls failed, faults (pause, restart, cut, delay) = {:?}",
        log.len(),
        started.elapsed().as_secs_f64(),
        report.counts
    );
    assert!(report.counts[FaultKind::Restart as usize] > 0);
    assert_safe(&log, "fencing");
}

/// (d) A semaphore under the mixed fault schedule: 8 tasks on 4 clients share 2
/// permits. Per slot: no two holders at once and tokens strictly increasing (the slot's
/// own log); over all holds, counted by an observer that ignores slots: never more than
/// 2 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_under_faults_never_exceeds_its_permits() {
    const PERMITS: u32 = 2;
    let target = scaled(4_000);
    let cluster = Arc::new(tokio::sync::Mutex::new(Cluster::start_proxied(5).await));
    let urls = cluster.lock().await.urls();
    let setup = Setup {
        ttl: Duration::from_millis(400),
        node_timeout: Duration::from_millis(40),
        fencing: true,
        quarantine: true,
    };
    let slots: Arc<Vec<SafetyLog>> = Arc::new((0..PERMITS).map(|_| SafetyLog::new()).collect());
    let all: Arc<std::sync::Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let faults = tokio::spawn(mixed_faults(
        cluster.clone(),
        setup.ttl + Duration::from_secs(1),
        stop.clone(),
        11,
    ));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for c in 0..4 {
        let redlock = client_waking(urls.clone(), &setup, c % 2 == 0);
        while !redlock.ready().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..2 {
            let semaphore = redlock.semaphore("pool", PERMITS).unwrap();
            let (slots, all, failures) = (slots.clone(), all.clone(), failures.clone());
            handles.push(tokio::spawn(async move {
                while all.lock().unwrap().len() < target {
                    let Ok(permit) = semaphore.acquire().await else {
                        failures.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let start = Instant::now();
                    // Holders stay a little, so that both permits are held at once.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let end = Instant::now().min(permit.lock().valid_until());
                    slots[permit.slot() as usize].record(Hold {
                        client: c,
                        start,
                        end,
                        token: permit.fencing_token(),
                    });
                    all.lock().unwrap().push((start, end));
                    let _ = permit.release().await;
                }
            }));
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let report = faults.await.unwrap();
    let holds = all.lock().unwrap().clone();
    eprintln!(
        "semaphore under faults: {} holds, {} acquisitions failed, faults = {:?}",
        holds.len(),
        failures.load(Ordering::Relaxed),
        report.counts
    );
    for (slot, log) in slots.iter().enumerate() {
        assert_safe(log, &format!("slot {slot}"));
    }
    // The observer: at any instant, how many claims are open (an end at the same instant
    // as a start closes first).
    let mut events: Vec<(Instant, i32)> = holds
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    events.sort();
    let (mut open, mut most) = (0, 0);
    for (_, step) in events {
        open += step;
        most = most.max(open);
    }
    assert!(
        most <= PERMITS as i32,
        "{most} holders of {PERMITS} permits at once"
    );
    // The check had something to see: both permits held at once, every fault kind.
    assert_eq!(most, PERMITS as i32, "the permits were never both held");
    if full_length() {
        assert!(report.counts.iter().all(|&n| n > 0), "every fault kind ran");
    }
    assert!(holds.len() >= target);
}

/// (d, control) The same schedule must catch a semaphore that is not correct: `k`
/// holders counted on each node (a sorted set of holders by expiry, one script per
/// node) and a permit granted by a majority of nodes, as a plain majority-quorum
/// semaphore would be written. Nodes that saw the contenders in different orders (a
/// slowed link), missed grants (cut, paused) or forgot them (restarted empty) let a
/// third holder in beside two; the observer must see more than 2 holders at once. It
/// stops as soon as it has (well under a second, usually).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_counted_semaphore_under_the_same_faults_admits_too_many() {
    const PERMITS: usize = 2;
    // Bounds a loaded machine keeps (its scripts answered late, not refused): the
    // control's power comes from the faults, not from answers cut short.
    const TTL: Duration = Duration::from_secs(1);
    const NODE_TIMEOUT: Duration = Duration::from_millis(150);
    const ENOUGH: Duration = Duration::from_secs(90);
    let cluster = Arc::new(tokio::sync::Mutex::new(Cluster::start_proxied(5).await));
    let urls = cluster.lock().await.urls();
    let stop = Arc::new(AtomicBool::new(false));
    let faults = tokio::spawn(mixed_faults(
        cluster.clone(),
        TTL + Duration::from_secs(1),
        stop.clone(),
        11,
    ));
    let nodes: Arc<Vec<deadpool_redis::Pool>> = Arc::new(
        urls.iter()
            .map(|url| {
                deadpool_redis::Config::from_url(url)
                    .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                    .unwrap()
            })
            .collect(),
    );
    let grant = Arc::new(redis::Script::new(
        r"
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
        if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
            redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
            return 1
        end
        return 0",
    ));
    let holds: Arc<std::sync::Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let most_seen = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..8 {
        let (nodes, grant, holds, open, most_seen) = (
            nodes.clone(),
            grant.clone(),
            holds.clone(),
            open.clone(),
            most_seen.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut attempt = 0u64;
            while most_seen.load(Ordering::SeqCst) <= PERMITS && started.elapsed() < ENOUGH {
                attempt += 1;
                let holder = format!("{task}:{attempt}");
                let asked = Instant::now();
                let answers = futures_util::future::join_all(nodes.iter().map(|pool| {
                    let (grant, holder) = (grant.clone(), holder.clone());
                    async move {
                        let call = async {
                            let mut conn = pool.get().await.ok()?;
                            grant
                                .key("counted")
                                .arg(&holder)
                                .arg(PERMITS)
                                .arg(TTL.as_millis() as u64)
                                .invoke_async::<i64>(&mut *conn)
                                .await
                                .ok()
                        };
                        tokio::time::timeout(NODE_TIMEOUT, call)
                            .await
                            .ok()
                            .flatten()
                            == Some(1)
                    }
                }))
                .await;
                let granted = answers.iter().filter(|&&yes| yes).count();
                let valid_until = asked + TTL;
                if granted > nodes.len() / 2 && Instant::now() < valid_until {
                    let start = Instant::now();
                    let now_open = open.fetch_add(1, Ordering::SeqCst) + 1;
                    most_seen.fetch_max(now_open, Ordering::SeqCst);
                    // Held long enough for the others to try while it holds.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let end = Instant::now().min(valid_until);
                    open.fetch_sub(1, Ordering::SeqCst);
                    holds.lock().unwrap().push((start, end));
                }
                // Released (or given back when refused) on every node.
                futures_util::future::join_all(nodes.iter().map(|pool| {
                    let holder = holder.clone();
                    async move {
                        let call = async {
                            let mut conn = pool.get().await.ok()?;
                            redis::cmd("ZREM")
                                .arg("counted")
                                .arg(&holder)
                                .query_async::<i64>(&mut *conn)
                                .await
                                .ok()
                        };
                        tokio::time::timeout(NODE_TIMEOUT, call)
                            .await
                            .ok()
                            .flatten()
                    }
                }))
                .await;
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let report = faults.await.unwrap();
    // The observer over the recorded holds, as for the slot semaphore.
    let holds = holds.lock().unwrap().clone();
    let mut events: Vec<(Instant, i32)> = holds
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    events.sort();
    let (mut now_open, mut most) = (0, 0);
    for (_, step) in events {
        now_open += step;
        most = most.max(now_open);
    }
    eprintln!(
        "majority-counted semaphore under faults: {} holds in {:.1} s, at most {most} at once, faults = {:?}",
        holds.len(),
        started.elapsed().as_secs_f64(),
        report.counts
    );
    assert!(
        most > PERMITS as i32,
        "the observer must catch a majority-counted semaphore admitting more than {PERMITS}: it saw at most {most}"
    );
}

/// (e) A read-write lock under the mixed fault schedule: 8 tasks on 4 clients, each
/// taking a write lock one time in three and a read lock otherwise. The writers' log:
/// no two at once and tokens strictly increasing; an observer over every hold: no read
/// overlaps a write (reads together are fine, and must happen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_lock_under_faults_never_lets_a_writer_share() {
    let target = scaled(600);
    let cluster = Arc::new(tokio::sync::Mutex::new(Cluster::start_proxied(5).await));
    let urls = cluster.lock().await.urls();
    let setup = Setup {
        ttl: Duration::from_millis(400),
        node_timeout: Duration::from_millis(40),
        fencing: true,
        quarantine: true,
    };
    let writes = Arc::new(SafetyLog::new());
    // (start, end, is a write)
    let all: Arc<std::sync::Mutex<Vec<(Instant, Instant, bool)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let faults = tokio::spawn(mixed_faults(
        cluster.clone(),
        setup.ttl + Duration::from_secs(1),
        stop.clone(),
        13,
    ));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for c in 0..4 {
        let redlock = client_waking(urls.clone(), &setup, c % 2 == 0);
        while !redlock.ready().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for t in 0..2 {
            let rw = redlock.rw_lock("books").unwrap();
            let (writes, all, failures) = (writes.clone(), all.clone(), failures.clone());
            handles.push(tokio::spawn(async move {
                let mut round = c + t;
                while all.lock().unwrap().len() < target {
                    round += 1;
                    let write = round % 3 == 0;
                    let lock = if write {
                        rw.write()
                            .await
                            .map(redlock_core::rwlock::WriteLock::into_lock)
                    } else {
                        rw.read()
                            .await
                            .map(redlock_core::rwlock::ReadLock::into_lock)
                    };
                    let Ok(lock) = lock else {
                        failures.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let start = Instant::now();
                    tokio::task::yield_now().await;
                    if !write {
                        // Readers stay a little, so that they meet.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    let end = Instant::now().min(lock.valid_until());
                    if write {
                        writes.record(Hold {
                            client: c,
                            start,
                            end,
                            token: lock.fencing_token(),
                        });
                    }
                    all.lock().unwrap().push((start, end, write));
                    let _ = lock.release().await;
                }
            }));
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let report = faults.await.unwrap();
    let mut holds = all.lock().unwrap().clone();
    eprintln!(
        "read-write lock under faults: {} holds ({} writes), {} requests failed, faults = {:?}",
        holds.len(),
        writes.len(),
        failures.load(Ordering::Relaxed),
        report.counts
    );
    assert_safe(&writes, "writers");
    // The observer: sweep the holds by start; a write must not overlap any other hold.
    holds.sort_by_key(|&(start, _, _)| start);
    let (mut overlapping_writes, mut shared_reads) = (0, 0);
    for (i, &(start, end, write)) in holds.iter().enumerate() {
        for &(other_start, _, other_write) in holds[i + 1..].iter() {
            if other_start >= end {
                break;
            }
            if write || other_write {
                overlapping_writes += 1;
            } else {
                shared_reads += 1;
            }
        }
        let _ = start;
    }
    assert_eq!(overlapping_writes, 0, "a write overlapped another hold");
    assert!(shared_reads > 0, "readers never held it together");
    if full_length() {
        assert!(report.counts.iter().all(|&n| n > 0), "every fault kind ran");
    }
    assert!(holds.len() >= target);
}
