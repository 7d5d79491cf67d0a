//! The safety checker on two races: nodes restarted empty while they hold the current
//! holder's key, with the other clients contending at once; and single- and
//! multi-resource locks of one resource mixed under faults, with fencing. Each scenario
//! has a negative control that must make the checker fire, so that a checker that sees
//! nothing cannot pass for a safe lock.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlock_core::{Lock, Redlock, RetryPolicy};
use redlock_testkit::{Cluster, FaultKind, Hold, SafetyLog, Violation, run_faults};

const RESOURCE: &str = "ledger";

/// The client number under which the negative control's own holds are recorded.
const CONTROL_CLIENT: usize = 99;

fn client(
    urls: Vec<String>,
    ttl: Duration,
    quarantine: bool,
    fencing: bool,
    wake: bool,
) -> Redlock {
    redlock_testkit::builder_for(urls)
        .ttl(ttl)
        .node_timeout(Duration::from_millis(50))
        .fencing(fencing)
        .restart_quarantine(quarantine)
        .wake_on_release(wake)
        .retry(
            RetryPolicy::deadline(Duration::from_secs(3))
                .with_delay(Duration::from_millis(1), Duration::from_millis(5)),
        )
        .build()
        .unwrap()
}

/// Four clients, half of them queued (woken by hand-overs), half on timers, once a
/// majority of nodes votes for each (fresh nodes are in quarantine themselves).
async fn ready_clients(
    urls: &[String],
    ttl: Duration,
    quarantine: bool,
    fencing: bool,
) -> Vec<Redlock> {
    let redlocks: Vec<Redlock> = (0..4)
        .map(|c| client(urls.to_vec(), ttl, quarantine, fencing, c % 2 == 0))
        .collect();
    for redlock in &redlocks {
        while !redlock.ready().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    redlocks
}

/// Records one hold of `lock` lasting about `hold`, then releases it.
async fn hold(lock: Lock, client: usize, hold: Duration, log: &SafetyLog) {
    let start = Instant::now();
    tokio::time::sleep(hold).await;
    log.record(Hold {
        client,
        start,
        end: Instant::now().min(lock.valid_until()),
        token: lock.fencing_token(),
    });
    let _ = lock.release().await;
}

/// `clients` clients (half queued, half on timers) contend for [`RESOURCE`], each hold
/// lasting `hold_for`, until `stop`. With `many`, every other request locks the
/// resource together with a second one (`lock_many`).
fn contenders(
    redlocks: &[Redlock],
    hold_for: Duration,
    many: bool,
    log: &Arc<SafetyLog>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for (c, redlock) in redlocks.iter().enumerate() {
        for t in 0..2 {
            let (redlock, log, stop) = (redlock.clone(), log.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let acquired = if many && (n + t).is_multiple_of(2) {
                        redlock
                            .lock_many([RESOURCE.to_owned(), format!("side-{c}-{t}")])
                            .await
                    } else {
                        redlock.lock(RESOURCE).await
                    };
                    if let Ok(lock) = acquired {
                        hold(lock, c, hold_for, &log).await;
                    }
                }
            }));
        }
    }
    tasks
}

/// Restarts, empty, two of the three nodes that hold the current holder's key, as soon
/// as there is a holder, `rounds` times; the clients keep contending meanwhile. Each
/// round then waits out the quarantine. Returns the violations.
async fn restart_race(quarantine: bool, rounds: usize) -> Vec<Violation> {
    let mut cluster = Cluster::start(3).await;
    let ttl = Duration::from_millis(1000);
    let period = ttl + Duration::from_secs(1);
    // No fencing here: a majority restarted empty forgets its counters (the documented
    // limit), this scenario is about double grants.
    let redlocks = ready_clients(&cluster.urls(), ttl, quarantine, false).await;
    let log = Arc::new(SafetyLog::new());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = contenders(&redlocks, Duration::from_millis(150), false, &log, &stop);
    let key = redlocks[0].key_for(RESOURCE);
    let mut restarted = 0;
    while restarted < rounds {
        let mut holding = Vec::new();
        for i in 0..cluster.len() {
            let exists: i64 = cluster
                .node(i)
                .query(redis::cmd("EXISTS").arg(&key))
                .await
                .unwrap_or(0);
            if exists == 1 {
                holding.push(i);
            }
        }
        if holding.len() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        for &i in &holding[..2] {
            cluster.node_mut(i).kill();
        }
        for &i in &holding[..2] {
            cluster.node_mut(i).restart().await;
        }
        restarted += 1;
        tokio::time::sleep(period + Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    eprintln!(
        "restart race (quarantine {}): {} holds over {rounds} restarts of a majority of the holder's nodes",
        if quarantine { "on" } else { "off" },
        log.len()
    );
    log.violations()
}

/// Nodes that held the holder's key are restarted empty while the others contend at
/// once: with the restart quarantine, no restarted node votes before its identity was
/// checked on the new connection, so nobody gets the lock while the holder holds it.
/// Without it (the negative control), the checker catches the double grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_race_never_double_grants() {
    let violations = restart_race(true, 5).await;
    assert!(violations.is_empty(), "quarantine on: {violations:?}");
    // The double grant needs a restart to land inside a hold: a few tries at most.
    let mut control = Vec::new();
    for _ in 0..3 {
        control = restart_race(false, 3).await;
        if control.iter().any(|v| matches!(v, Violation::Overlap(..))) {
            break;
        }
    }
    assert!(
        control.iter().any(|v| matches!(v, Violation::Overlap(..))),
        "negative control: with the quarantine off the checker must catch a double grant: {control:?}"
    );
}

/// `lock` and `lock_many` of the same resource, mixed, under pauses, restarts without
/// persistence, cut and delayed links, with fencing: no overlap, and every token above
/// the one before, whichever API issued it.
///
/// The negative control: the counters of every resource pushed far past the nodes'
/// clocks, then wiped on every node (what restarts without persistence do to the
/// counters when the nodes' clocks also step back by more than the quarantine): the
/// checker must catch the tokens going back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_lock_and_lock_many_keep_fencing_order() {
    let (violations, holds) = mixed_fencing(false).await;
    assert!(holds >= 20, "only {holds} holds");
    assert!(
        violations.is_empty(),
        "{} violations: {:?}",
        violations.len(),
        &violations[..violations.len().min(3)]
    );
    let (control, holds) = mixed_fencing(true).await;
    assert!(holds >= 20, "negative control: only {holds} holds");
    assert!(
        control
            .iter()
            .any(|v| matches!(v, Violation::TokenNotIncreasing(..))),
        "negative control: with the counters wiped after running ahead of the clocks, the checker must catch a token going back"
    );
}

/// Every fencing counter that [`contenders`] with `many` uses, on every node of
/// `cluster`, set to `value` (`None`: deleted), while holding [`RESOURCE`] (every
/// acquisition that touches these counters locks it): otherwise the contenders' fence
/// write-backs would carry the old values back to the nodes already done. The hold is
/// recorded in `log` like any other: it is one more holder of the resource, and it
/// makes sure a token from before each change is in the log however few holds the
/// contenders get on a loaded machine.
async fn set_counters(cluster: &Cluster, redlock: &Redlock, value: Option<u64>, log: &SafetyLog) {
    let held = redlock.lock(RESOURCE).await.unwrap();
    let start = Instant::now();
    let mut resources = vec![RESOURCE.to_owned()];
    resources.extend((0..4).flat_map(|c| (0..2).map(move |t| format!("side-{c}-{t}"))));
    let fences: Vec<String> = resources.iter().map(|r| redlock.fence_key_for(r)).collect();
    let command = match value {
        Some(value) => {
            let mut mset = redis::cmd("MSET");
            for fence in &fences {
                mset.arg(fence).arg(value);
            }
            mset
        }
        None => redis::cmd("DEL").arg(&fences).clone(),
    };
    // A fence write-back still in flight from a hold before this one may land after the
    // change and carry the old value back: set again until no node reads an old value
    // (attempts refused meanwhile may still raise a counter on a node: set ones only go
    // up, wiped ones only to the nodes' clocks, far below a year ahead).
    let day_ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .saturating_add(Duration::from_secs(24 * 3600))
        .as_micros();
    let day_ahead = u64::try_from(day_ahead).unwrap();
    let changed = |read: &Option<u64>| match value {
        Some(set) => read.is_some_and(|read| read >= set),
        None => read.is_none_or(|read| read < day_ahead),
    };
    for _ in 0..5 {
        let done: Vec<Option<redis::Value>> = futures_util::future::join_all(
            (0..cluster.len()).map(|i| cluster.node(i).query(&command)),
        )
        .await;
        assert!(done.iter().all(Option::is_some), "{command:?}: {done:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mget = redis::cmd("MGET").arg(&fences).clone();
        let read: Vec<Option<Vec<Option<u64>>>> = futures_util::future::join_all(
            (0..cluster.len()).map(|i| cluster.node(i).query(&mget)),
        )
        .await;
        let settled = read.iter().all(|values| {
            values
                .as_ref()
                .is_some_and(|values| values.iter().all(&changed))
        });
        if settled {
            break;
        }
    }
    assert!(
        held.is_valid(),
        "the counters were set within the lock's validity"
    );
    log.record(Hold {
        client: CONTROL_CLIENT,
        start,
        end: Instant::now().min(held.valid_until()),
        token: held.fencing_token(),
    });
    let _ = held.release().await;
}

/// With `wipe_counters`, the negative control: no faults; the counters set about a year
/// past the nodes' clocks a third of the way, then wiped two thirds of the way.
async fn mixed_fencing(wipe_counters: bool) -> (Vec<Violation>, usize) {
    let cluster = Arc::new(tokio::sync::Mutex::new(Cluster::start_proxied(5).await));
    let urls = cluster.lock().await.urls();
    let ttl = Duration::from_millis(400);
    let redlocks = ready_clients(&urls, ttl, true, true).await;
    let log = Arc::new(SafetyLog::new());
    let stop = Arc::new(AtomicBool::new(false));
    let faults_stop = Arc::new(AtomicBool::new(false));
    let faults = tokio::spawn(run_faults(
        cluster.clone(),
        &[
            FaultKind::Pause,
            FaultKind::Restart,
            FaultKind::Cut,
            FaultKind::Delay,
        ],
        if wipe_counters { 0 } else { 2 },
        Duration::from_millis(200),
        // The quarantine: max TTL + 1 s of uptime rounding.
        ttl + Duration::from_secs(1),
        faults_stop.clone(),
        23,
    ));
    let tasks = contenders(&redlocks, Duration::from_micros(200), true, &log, &stop);
    let run_for = Duration::from_secs(8);
    if wipe_counters {
        let year_ahead = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .saturating_add(Duration::from_secs(365 * 24 * 3600))
            .as_micros();
        tokio::time::sleep(run_for / 3).await;
        set_counters(
            &*cluster.lock().await,
            &redlocks[0],
            Some(u64::try_from(year_ahead).unwrap()),
            &log,
        )
        .await;
        tokio::time::sleep(run_for / 3).await;
        set_counters(&*cluster.lock().await, &redlocks[0], None, &log).await;
        tokio::time::sleep(run_for / 3).await;
        // One more hold of the control's own after the wipe: its token must be caught
        // going back even if the contenders got none in the last third.
        let held = redlocks[0].lock(RESOURCE).await.unwrap();
        hold(held, CONTROL_CLIENT, Duration::from_micros(200), &log).await;
    } else {
        tokio::time::sleep(run_for).await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    faults_stop.store(true, Ordering::SeqCst);
    let report = faults.await.unwrap();
    eprintln!(
        "lock + lock_many with fencing{}: {} holds, faults (pause, restart, cut, delay) = {:?}",
        if wipe_counters {
            ", counters wiped"
        } else {
            ""
        },
        log.len(),
        report.counts
    );
    (log.violations(), log.len())
}
