//! One acquisition attempt: the acquire fanned out, the votes counted against the
//! validity (TTL minus elapsed time and drift), the fencing token raised, and on any
//! failure the attempt's keys released (before returning where nodes answered, in the
//! background behind the commands still in flight elsewhere). Also the questions a
//! waiting request asks the nodes: is the lock free now, and when will it be.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::clock::Instant;
use crate::error::Error;
use crate::lock::Granted;
use crate::protocol::{Command, Op, ReleaseMode};
use crate::queue::QueueGuard;
use crate::quorum::{Cluster, Fanout, InFlight, OpKind, Pending, Tally, Target, Until};

/// Why one attempt failed.
#[derive(Debug)]
pub(crate) enum AttemptFailure {
    /// A majority said yes, but after the validity had run out.
    TooSlow,
    /// Enough nodes hold someone else's value that no majority is possible.
    Taken { nodes: Vec<String> },
    /// Too many nodes failed.
    Unreachable {
        failures: Vec<crate::error::NodeFailure>,
    },
}

impl AttemptFailure {
    /// So many nodes refused for good that no retry can reach a majority.
    pub(crate) fn hopeless(&self, cluster: &Cluster) -> bool {
        let Self::Unreachable { failures } = self else {
            return false;
        };
        let permanent = failures.iter().filter(|f| f.cause.is_permanent()).count();
        permanent > cluster.nodes.len() - cluster.quorum()
    }

    pub(crate) fn into_error(
        self,
        resource: String,
        cluster: &Cluster,
        attempts: u32,
        retry_after: Option<Duration>,
    ) -> Error {
        let total = cluster.nodes.len();
        match self {
            Self::TooSlow => Error::Expired {
                resource,
                reason: "a majority granted it only after its validity (TTL minus drift) had run out; use a longer TTL or a shorter node timeout",
            },
            Self::Taken { nodes } => Error::Taken {
                resource,
                nodes,
                total,
                attempts,
                retry_after,
            },
            Self::Unreachable { failures } => Error::NoQuorum {
                resource,
                needed: cluster.quorum(),
                total,
                failures,
            },
        }
    }
}

/// Puts a new waiter in the keys' wait queues (so that the next release hands the lock
/// over to it) without trying to take them, and tells whether a majority of nodes hold
/// none of `keys` now (a release came before the waiter listened), decided as soon as
/// the answers so far settle it; false if they cannot.
pub(crate) async fn join_and_look(
    cluster: &Cluster,
    keys: &[String],
    queue: Option<&QueueGuard>,
) -> bool {
    let Some(waiter) = queue.and_then(QueueGuard::waiter) else {
        return false;
    };
    let queued = crate::node::Queued::new();
    let command = Command::new(Op::JoinQueue { keys, waiter });
    let mut asks: FuturesUnordered<_> = cluster
        .nodes
        .iter()
        .map(|node| node.run(&command, cluster.node_timeout, &queued))
        .collect();
    let mut tally = Tally::new(cluster.nodes.len());
    while let Some(answer) = asks.next().await {
        match answer {
            Ok(0) => tally.yes += 1,
            Ok(_) => tally.no += 1,
            Err(_) => tally.failed += 1,
        }
        if tally.decided() {
            break;
        }
    }
    tally.won()
}

/// How long until a majority of nodes no longer hold `keys` (the holder's lock ends
/// there at the latest, unless extended): asks every node for the keys' remaining TTL.
/// See [`holder_remaining`]; `None` when no node answered.
pub(crate) async fn time_until_free(cluster: &Cluster, keys: &[String]) -> Option<Duration> {
    let queued = crate::node::Queued::new();
    let command = Command::new(Op::Remaining { keys });
    let asks = cluster
        .nodes
        .iter()
        .map(|node| node.run(&command, cluster.node_timeout, &queued));
    let replies = futures_util::future::join_all(asks).await;
    let remaining: Vec<u64> = replies.into_iter().filter_map(Result::ok).collect();
    holder_remaining(remaining, cluster.quorum()).map(Duration::from_millis)
}

/// Which of `keys` are free, and when the held ones end: one pipeline of `PTTL`s per
/// node (one round trip), a hint for a request choosing among keys (a semaphore's
/// slots), not a vote. Per key: free if a majority of all nodes hold no such key (a
/// key being handed over counts as held), else the holder's remaining time as
/// [`holder_remaining`] reckons it. `None` when fewer than a majority answered.
pub(crate) async fn look_at(cluster: &Cluster, keys: &[String]) -> Option<Vec<KeyState>> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("PTTL").arg(key);
    }
    let asks = cluster
        .nodes
        .iter()
        .map(|node| node.pipeline(&pipe, false, "scan", cluster.node_timeout));
    let replies = futures_util::future::join_all(asks).await;
    let answers: Vec<Vec<i64>> = replies
        .into_iter()
        .filter_map(Result::ok)
        .filter(|replies| replies.len() == keys.len())
        .map(|replies| {
            replies
                .into_iter()
                .map(|reply| match reply {
                    Ok(redis::Value::Int(ttl)) => ttl,
                    // Unknown: count it as held (the attempt decides).
                    _ => 1,
                })
                .collect()
        })
        .collect();
    let quorum = cluster.quorum();
    if answers.len() < quorum {
        return None;
    }
    Some(
        (0..keys.len())
            .map(|i| {
                let ttls: Vec<i64> = answers
                    .iter()
                    .map(|a| a.get(i).copied().unwrap_or(1))
                    .collect();
                // `PTTL` answers -2 for a missing key (and -1 for one without a TTL,
                // which no lock key is: held).
                let free = ttls.iter().filter(|&&t| t == -2).count();
                if free >= quorum {
                    KeyState::Free
                } else {
                    let remaining = ttls
                        .iter()
                        .map(|&t| u64::try_from(t).unwrap_or(0))
                        .collect();
                    KeyState::Held(holder_remaining(remaining, quorum).map(Duration::from_millis))
                }
            })
            .collect(),
    )
}

/// Marks every held key of `keys` as waited for on every node (see `scripts::MARK`), so
/// that their releases publish on their channels; returns once every node answered or
/// failed.
pub(crate) async fn mark_waited(cluster: &Cluster, keys: &[String]) {
    let queued = crate::node::Queued::new();
    let command = Command::new(Op::Mark { keys });
    let marks = cluster
        .nodes
        .iter()
        .map(|node| node.run(&command, cluster.node_timeout, &queued));
    futures_util::future::join_all(marks).await;
}

/// What [`look_at`] saw of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyState {
    /// Free on a majority of the nodes.
    Free,
    /// Held, and how long until its holder's lock ends (unless extended).
    Held(Option<Duration>),
}

/// The holder's remaining validity (ms) from the remaining TTLs the nodes reported
/// (0 where the key is gone): with at least `quorum` answers, the `quorum`-th longest
/// (past it, fewer than a majority hold the key, so the lock is over); with fewer, the
/// longest reported (a holder sets its keys on every node at once, with one TTL, so any
/// node's figure is the holder's); `None` without answers.
pub(crate) fn holder_remaining(mut remaining: Vec<u64>, quorum: usize) -> Option<u64> {
    remaining.sort_unstable_by(|a, b| b.cmp(a));
    remaining
        .get(quorum.saturating_sub(1))
        .or_else(|| remaining.first())
        .copied()
}

/// One attempt: fan out, count, and on failure release everywhere before returning.
///
/// On success, also returns the nodes that have not said yes (a queued waiter's attempt
/// joins or stays in their queues).
pub(crate) async fn attempt(
    cluster: &Arc<Cluster>,
    target: Arc<Target>,
    ttl: Duration,
) -> Result<(Granted, Vec<usize>), AttemptFailure> {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    // The Redlock rule: validity counts from the moment before the first command.
    let start = Instant::now();
    let valid_until = start
        .checked_add(ttl.saturating_sub(cluster.drift(ttl)))
        .unwrap_or(start);
    let fanout = Fanout::start(cluster, &target, OpKind::Acquire { ttl_ms }, None);
    let mut guard = AttemptGuard {
        cluster: Arc::clone(cluster),
        target,
        fanout: Some(fanout),
    };
    let tally = guard.fanout_mut().until_decided().await;
    let mut token = None;
    let mut fence_in_flight = None;
    // Two nodes turned out to be one server (the second name's connection claimed the
    // same identity while the votes came in): this majority may count it twice. Nothing
    // is granted, and the caller reports the configuration refused.
    let same_server = || cluster.identities.clash().is_some();
    if tally.won() && !same_server() && !guard.target.fence_keys.is_empty() {
        let target = Arc::clone(&guard.target);
        match raise_fence(cluster, &target, guard.fanout_mut()).await {
            Ok((t, in_flight)) => {
                token = Some(t);
                fence_in_flight = in_flight;
            }
            Err(failure) => {
                guard.clean_up().await;
                return Err(failure);
            }
        }
    }
    if tally.won() && !same_server() && Instant::now() < valid_until {
        let (target, fanout) = guard.disarm();
        // Where we have not said yes yet, our attempt may (re)join the queue: leave it
        // there (after the in-flight attempt, on the same connection).
        let granted_by = fanout.nodes_answering(true);
        let refused = (0..cluster.nodes.len())
            .filter(|i| !granted_by.contains(i))
            .collect();
        // Slower nodes still get their SET: the lock is then held there too, and
        // every later command of the lock goes to them after those SETs (and after
        // the fence write-back).
        let in_flight = InFlight::join(fanout.finish_in_background(), fence_in_flight);
        let granted = Granted {
            valid_until,
            acquired_at: start,
            target,
            token,
            in_flight,
        };
        return Ok((granted, refused));
    }
    let failure = {
        let fanout = guard.fanout_mut();
        let spare = tally.nodes - tally.quorum;
        let mut tally = tally;
        if !tally.won() && tally.no <= spare && tally.failed <= spare {
            // Refusals and failures together lost it, neither alone: hear the nodes
            // still out before saying which it was.
            tally = fanout.until_done().await;
        }
        if same_server() {
            AttemptFailure::Unreachable {
                failures: fanout.failures(),
            }
        } else if tally.won() {
            AttemptFailure::TooSlow
        } else if tally.no > spare {
            // Held elsewhere on enough nodes that no majority is possible.
            AttemptFailure::Taken {
                nodes: fanout.names_answering(false),
            }
        } else {
            // Unreachable nodes, or a split vote that they keep from being decided.
            AttemptFailure::Unreachable {
                failures: fanout.failures(),
            }
        }
    };
    guard.clean_up().await;
    Err(failure)
}

/// The fencing token of a won acquisition, and the write-back still on its way.
///
/// The token is the highest counter among the nodes that granted so far. Every node
/// that has not reported exactly that value (those that said no, failed or have not
/// answered yet included) is raised to it (never lowered): the lock is granted once a
/// majority holds it, the rest follow in the background. Any later quorum shares a node
/// with that majority, so it counts past the token; and since every node the client
/// reaches gets it, one node that later restarts empty cannot hide it.
async fn raise_fence(
    cluster: &Arc<Cluster>,
    target: &Arc<Target>,
    acquire: &mut Fanout,
) -> Result<(u64, Option<InFlight>), AttemptFailure> {
    let token = acquire.yes_answers().max().unwrap_or(0);
    let at_token: Vec<usize> = acquire
        .answers
        .iter()
        .enumerate()
        .filter(|(_, a)| matches!(a, Some(Ok(t)) if *t == token))
        .map(|(i, _)| i)
        .collect();
    let others: Vec<usize> = (0..cluster.nodes.len())
        .filter(|i| !at_token.contains(i))
        .collect();
    if others.is_empty() {
        return Ok((token, None));
    }
    let mut raise = Fanout::start(cluster, target, OpKind::RaiseFence { token }, Some(&others));
    // The nodes that already hold the token count as raised.
    raise.tally.yes = at_token.len();
    let tally = raise.until_decided().await;
    let failures = raise.failures();
    let in_flight = raise.finish_in_background();
    if tally.won() {
        Ok((token, in_flight))
    } else {
        Err(AttemptFailure::Unreachable { failures })
    }
}

/// Owns an acquisition in flight; if dropped before it is disarmed or cleaned up, it
/// releases on every node in the background, after the in-flight commands.
struct AttemptGuard {
    cluster: Arc<Cluster>,
    target: Arc<Target>,
    /// `None` once disarmed or cleaned up.
    fanout: Option<Fanout>,
}

impl AttemptGuard {
    fn fanout_mut(&mut self) -> &mut Fanout {
        // Only `disarm` and `clean_up` take it, and both consume the attempt's result.
        self.fanout
            .get_or_insert_with(|| Fanout::empty(&self.cluster))
    }

    /// The attempt succeeded: the lock now belongs to the caller.
    fn disarm(mut self) -> (Arc<Target>, Fanout) {
        let fanout = self
            .fanout
            .take()
            .unwrap_or_else(|| Fanout::empty(&self.cluster));
        (Arc::clone(&self.target), fanout)
    }

    /// The attempt failed: release on every node, quietly (a lost attempt wakes
    /// nobody and hands nothing over: waiters that did would retry at once, and on a
    /// bare majority spin). Nodes that answered are released
    /// before returning (so that a retry, or a competitor, finds them clean); nodes that
    /// failed are released in the background, and nodes still in flight right after
    /// their SET completes (a paused node would otherwise hold every failed attempt up
    /// for the whole node timeout). The releases run in a task of their own: cancelling
    /// the acquisition meanwhile does not leave any of them unsent.
    async fn clean_up(&mut self) {
        let Some(mut fanout) = self.fanout.take() else {
            return;
        };
        let mut answered = fanout.nodes_answering(true);
        answered.append(&mut fanout.nodes_answering(false));
        release_after(
            &self.cluster,
            &self.target,
            fanout.take_pending(),
            fanout.nodes_failed(),
        );
        if !answered.is_empty() {
            Fanout::start(
                &self.cluster,
                &self.target,
                OpKind::Release {
                    mode: ReleaseMode::Quiet,
                },
                Some(&answered),
            )
            .drive(Until::Done)
            .await;
        }
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        let Some(mut fanout) = self.fanout.take() else {
            return;
        };
        tracing::debug!("acquire dropped mid-flight: releasing in the background");
        let pending = fanout.take_pending();
        let answered: Vec<usize> = (0..self.cluster.nodes.len())
            .filter(|&i| fanout.answers.get(i).is_some_and(Option::is_some))
            .collect();
        release_after(&self.cluster, &self.target, pending, answered);
    }
}

/// In the background: release `target` on `nodes` now, and on each node of `pending`
/// right after its in-flight operation completes (so the release is not overtaken by it).
/// Without a runtime (dropped outside one) the keys expire by TTL.
fn release_after(
    cluster: &Arc<Cluster>,
    target: &Arc<Target>,
    pending: Pending,
    nodes: Vec<usize>,
) {
    if nodes.is_empty() && pending.is_empty() {
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("no tokio runtime: partial locks will expire by TTL instead");
        return;
    };
    let releases: FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send>>> =
        FuturesUnordered::new();
    for index in nodes {
        let (cluster, target) = (Arc::clone(cluster), Arc::clone(target));
        releases.push(Box::pin(async move {
            release_one(&cluster, &target, index).await;
        }));
    }
    for in_flight in pending {
        let (cluster, target) = (Arc::clone(cluster), Arc::clone(target));
        releases.push(Box::pin(async move {
            let (index, _) = in_flight.await;
            release_one(&cluster, &target, index).await;
        }));
    }
    handle.spawn(releases.for_each(|()| async {}));
}

async fn release_one(cluster: &Cluster, target: &Target, index: usize) {
    if let Some(node) = cluster.nodes.get(index) {
        let queued = crate::node::Queued::new();
        let command = Command::new(target.op(OpKind::Release {
            mode: ReleaseMode::Quiet,
        }));
        let _ = node.run(&command, cluster.node_timeout, &queued).await;
    }
}

#[cfg(test)]
mod tests {
    use super::holder_remaining;

    #[test]
    fn holder_remaining_is_the_quorum_th_longest_or_the_longest_reported() {
        // (reported remaining TTLs, quorum, expected)
        let cases: &[(&[u64], usize, Option<u64>)] = &[
            (&[900, 900, 900], 2, Some(900)),
            // Held on two of three: free once the shorter of the two ends.
            (&[0, 700, 900], 2, Some(700)),
            // A stray long key on one node is not the holder's lock.
            (&[60_000, 800, 800, 0, 0], 3, Some(800)),
            // Fewer answers than a majority: the longest reported.
            (&[0, 650], 3, Some(650)),
            (&[650], 2, Some(650)),
            (&[], 2, None),
        ];
        for (remaining, quorum, expected) in cases {
            assert_eq!(
                holder_remaining(remaining.to_vec(), *quorum),
                *expected,
                "{remaining:?} with quorum {quorum}"
            );
        }
    }
}
