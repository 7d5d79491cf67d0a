//! A random fault schedule over a proxied cluster: pauses, kills and restarts (without
//! persistence, or with it if the servers have it), cut and slowed links, on a minority
//! of nodes at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::{Rng, RngExt, SeedableRng};

use crate::Cluster;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `SIGSTOP` for a while, then `SIGCONT`.
    Pause,
    /// `SIGKILL`, then start again on the same port.
    Restart,
    /// Close the node's link and refuse connections for a while.
    Cut,
    /// Add latency to the node's link for a while.
    Delay,
}

/// What the schedule did, for the test's report.
#[derive(Debug, Default, Clone)]
pub struct FaultReport {
    /// Faults applied, by kind: pause, restart, cut, delay.
    pub counts: [usize; 4],
}

/// Runs faults of the given kinds on random nodes until `stop` is set, at most
/// `max_faulty` nodes at once (keep it a minority), each lasting up to `max_duration`.
/// A restarted node keeps counting as faulty for `recovery` after it is back (the
/// client's restart quarantine), so that a majority stays able to vote.
pub async fn run_faults(
    cluster: Arc<tokio::sync::Mutex<Cluster>>,
    kinds: &[FaultKind],
    max_faulty: usize,
    max_duration: Duration,
    recovery: Duration,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> FaultReport {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut report = FaultReport::default();
    let n = cluster.lock().await.len();
    let mut recovering: Vec<(usize, tokio::time::Instant)> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let now = tokio::time::Instant::now();
        recovering.retain(|(_, until)| *until > now);
        let room = max_faulty.saturating_sub(recovering.len());
        if room == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let faulty = rng.random_range(1..=room);
        let mut nodes: Vec<usize> = (0..n)
            .filter(|i| recovering.iter().all(|(r, _)| r != i))
            .collect();
        for i in (1..nodes.len()).rev() {
            nodes.swap(i, rng.random_range(0..=i));
        }
        nodes.truncate(faulty);
        let chosen: Vec<(usize, FaultKind, Duration)> = nodes
            .into_iter()
            .map(|node| {
                let kind = kinds[rng.random_range(0..kinds.len())];
                let ms = rng.random_range(20..=max_duration.as_millis().max(21) as u64);
                (node, kind, Duration::from_millis(ms))
            })
            .collect();
        {
            let mut cluster = cluster.lock().await;
            for &(node, kind, _) in &chosen {
                report.counts[kind as usize] += 1;
                match kind {
                    FaultKind::Pause => cluster.node(node).pause(),
                    FaultKind::Restart => cluster.node_mut(node).kill(),
                    FaultKind::Cut => cluster.proxy(node).cut(),
                    FaultKind::Delay => {
                        let ms = rng.random_range(5..=40);
                        cluster.proxy(node).delay(Duration::from_millis(ms));
                    }
                }
            }
        }
        let longest = chosen.iter().map(|c| c.2).max().unwrap_or_default();
        tokio::time::sleep(longest).await;
        {
            let mut cluster = cluster.lock().await;
            for &(node, kind, _) in &chosen {
                match kind {
                    FaultKind::Pause => cluster.node(node).resume(),
                    FaultKind::Restart => {
                        cluster.node_mut(node).restart().await;
                        recovering.push((node, tokio::time::Instant::now() + recovery));
                    }
                    FaultKind::Cut | FaultKind::Delay => cluster.proxy(node).restore(),
                }
            }
        }
        // Healthy spells between faults.
        let pause = 50 + rng.next_u64() % 250;
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    report
}
