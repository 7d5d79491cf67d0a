//! The servers' clock: where a waiter's place in the wait queue comes from.
//!
//! Every node orders a resource's queue by the time each waiter began waiting, and every
//! node must order it the same way (or the hand-overs of one release would name different
//! waiters and split the votes), so that time is sent with the waiter, not read by each
//! node. It is not read from the client's own clock either: a client whose wall clock is
//! off would jump the queue or lose its place. It comes from the nodes' clocks: the
//! client asks every node for its time now and then (every [`REFRESH`]), takes the median
//! of the first majority to answer (a node whose clock is off does not move it, a slow
//! one does not hold the waiter up), corrected by half the round trip, and
//! counts on from there with its monotonic clock, which a wall-clock step cannot move.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::clock::Instant;
use crate::protocol::{Command, Op};
use crate::quorum::Cluster;

/// How long one reading of the nodes' clocks is counted on from.
const REFRESH: Duration = Duration::from_secs(10);

/// The last reading of the nodes' clocks.
#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    /// A local instant and the nodes' time (ms since the Unix epoch) at that instant.
    reading: Mutex<Option<(Instant, u64)>>,
}

impl ServerClock {
    /// The nodes' time now, in ms since the Unix epoch: from the last reading if it is
    /// recent, else from a new one (one round trip to every node, within the node
    /// timeout). Only if no node answers, this client's wall clock.
    pub(crate) async fn now_ms(&self, cluster: &Cluster) -> u64 {
        if let Some(ms) = self.counted_on(REFRESH) {
            return ms;
        }
        match read(cluster).await {
            Some(reading) => {
                *self.reading.lock().unwrap_or_else(PoisonError::into_inner) = Some(reading);
                self.counted_on(Duration::MAX).unwrap_or(reading.1)
            }
            None => {
                tracing::debug!("no node told its time: the wait queue uses this client's clock");
                self.counted_on(Duration::MAX).unwrap_or_else(wall_clock_ms)
            }
        }
    }

    /// The last reading counted on to now, if it is younger than `max_age`.
    fn counted_on(&self, max_age: Duration) -> Option<u64> {
        let reading = *self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, ms) = reading?;
        let age = at.elapsed();
        (age < max_age)
            .then(|| ms.saturating_add(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)))
    }
}

/// Asks every node for its time; the median of the first majority of answers, each
/// moved back by half its round trip, as of the moment the question was sent.
async fn read(cluster: &Cluster) -> Option<(Instant, u64)> {
    let queued = crate::node::Queued::new();
    let command = Command::new(Op::ServerTime);
    let asked = Instant::now();
    let mut answers: FuturesUnordered<_> = cluster
        .nodes
        .iter()
        .map(|node| node.run(&command, cluster.node_timeout, &queued))
        .collect();
    let mut times = Vec::with_capacity(cluster.nodes.len());
    // A majority's answers are enough (a slow node does not hold the waiter up).
    while let Some(answer) = answers.next().await {
        if let Ok(ms) = answer {
            let half_trip = u64::try_from(asked.elapsed().as_millis() / 2).unwrap_or(0);
            times.push(ms.saturating_sub(half_trip));
            if times.len() >= cluster.quorum() {
                break;
            }
        }
    }
    times.sort_unstable();
    let median = *times.get(times.len() / 2)?;
    Some((asked, median))
}

fn wall_clock_ms() -> u64 {
    #[cfg(any(test, feature = "sim"))]
    if let Some(ms) = crate::clock::simulated_wall_ms() {
        return ms;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
