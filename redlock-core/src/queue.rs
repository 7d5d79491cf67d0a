//! The wait queue: a released lock goes to the client that has waited longest.
//!
//! Every waiter joins it, whatever it waits for (one resource or several), so every
//! client gets its turn in a bounded time. One that hears releases (wake on release, the
//! default) is handed the lock for a short hand-over time and retries at once. One that
//! cannot hear them (wake on release off, or pooled nodes, which have no subscriber) is
//! handed the lock until its next timed attempt (its longest retry delay and a node
//! timeout): the lock then lies idle until it comes, so such clients slow a contended
//! resource down to the pace of their retry delays; give all clients of a busy resource
//! wake on release. (Only a request allowed a single attempt, `try_lock`, does not
//! queue.)
//!
//! Without it, a release wakes every waiter at once: they race, split the nodes' votes
//! so that none reaches a majority, back off, and the releaser (which asks again at
//! once) wins most of the time. So each resource has, on each node, a queue of waiters
//! ordered by when they began waiting. A waiter joins it as soon as its first attempt
//! found the lock busy (a script that takes its place without trying the lock, and says
//! whether the lock is free by now); a queued attempt that finds the lock busy
//! refreshes its place, which is kept for a little longer than the waiter's retry delay.
//!
//! A release hands the lock over to the head of the queue instead of deleting it: the key
//! then holds `~<waiter id>` for a short hand-over time, during which only that waiter
//! can take it (everyone else's `SET NX` fails), and the waiter's id is published on the
//! key's channel, so that it, and only it, retries at once. Every node orders the queue
//! the same way (the same start time and id everywhere), so the hand-overs of one release
//! name the same waiter on every node and the votes do not split.
//!
//! A waiter that joins a queue while the key is held marks the key (a `+` after the
//! holder's value): a release of an unmarked key is then a bare compare-and-delete that
//! looks at no queue, and only a marked one hands over. A key taken while its queue had
//! waiters by someone who did not queue (`try_lock`, a first attempt) is unmarked until
//! the next queued attempt finds it held and marks it; a release before that deletes it,
//! and the waiters take it at their next attempt.
//!
//! This is about speed and fairness only: the lock is still taken by `SET`-if-free (or if
//! handed to us) on a majority, and a hand-over is never a grant. A waiter that dies
//! blocks the resource for at most the hand-over time; one that gives up leaves the
//! queues (and passes on a hand-over it did not take). Lock keys that expire are not
//! handed over: the waiters' retry timers pick them up.

use std::sync::Arc;
use std::time::Duration;

use crate::protocol::{ReleaseMode, Waiter, release_answer};
use crate::quorum::{Answers, Cluster, Fanout, Mode, OpKind, Target};

/// How long a released lock stays reserved for the waiter it was handed to: long
/// enough for the release message to reach it and its attempt to come back, short
/// enough that a waiter that died meanwhile costs little.
pub(crate) fn handoff_time(ttl: Duration) -> Duration {
    Duration::from_millis(25).min(ttl / 2)
}

/// A queued waiter; when dropped (the request got its lock, gave up, or was cancelled),
/// leaves the queues on the listed nodes in the background.
pub(crate) struct QueueGuard {
    cluster: Arc<Cluster>,
    target: Arc<Target>,
    /// Nodes to leave: all of them until the lock is granted.
    nodes: Option<Vec<usize>>,
}

impl QueueGuard {
    pub(crate) fn new(
        cluster: &Arc<Cluster>,
        handoff_ms: u64,
        keys: &[String],
        waiter: Waiter,
    ) -> Self {
        let target = Target {
            keys: keys.to_vec(),
            fence_keys: Vec::new(),
            value: waiter.placeholder.clone(),
            handoff_ms,
            waiter: Some(waiter),
            barge: false,
            // A waiter's place holds no fence keys.
            fence_step_us: 1,
            mode: Mode::Exclusive,
        };
        crate::telemetry::queue_waiters(1.0);
        Self {
            cluster: Arc::clone(cluster),
            target: Arc::new(target),
            nodes: None,
        }
    }

    pub(crate) fn waiter(&self) -> Option<&Waiter> {
        self.target.waiter.as_ref()
    }

    /// The lock was granted: the nodes that granted it removed us from their queues;
    /// only the `refused` ones (the others) may still hold our place.
    pub(crate) fn granted(&mut self, refused: Vec<usize>) {
        self.nodes = Some(refused);
    }
}

impl Drop for QueueGuard {
    fn drop(&mut self) {
        crate::telemetry::queue_waiters(-1.0);
        if self.nodes.as_ref().is_some_and(Vec::is_empty) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (cluster, target, nodes) = (
            Arc::clone(&self.cluster),
            Arc::clone(&self.target),
            self.nodes.take(),
        );
        handle.spawn(async move {
            let mut leave = Fanout::start(&cluster, &target, OpKind::Dequeue, nodes.as_deref());
            leave.until_done().await;
            // A hand-over passed on may go to a dead waiter too.
            let answers = std::mem::take(&mut leave.answers);
            follow_hand_overs(cluster, target, answers).await;
        });
    }
}

/// How many times a release follows its hand-overs up at most (each waits out the
/// pending hand-over): a run of dead heirs is skipped within a bounded time.
const FOLLOW_UPS: usize = 8;

/// After a release (or a waiter passing on a hand-over) answered `answers`: once each
/// hand-over's reservation is over, a key its heir did not take (the heir died, or its
/// process did) goes to the next live waiter at once, instead of lying free while the
/// live waiters sleep their retry delay. Follows the new hand-overs the same way, a
/// bounded number of times.
pub(crate) async fn follow_hand_overs(
    cluster: Arc<Cluster>,
    target: Arc<Target>,
    answers: Answers,
) {
    let mut pending = pending_hand_overs(&answers);
    crate::telemetry::handovers(pending.len());
    for _ in 0..FOLLOW_UPS {
        let Some(wait) = pending.iter().map(|(_, left)| *left).max() else {
            return;
        };
        // The reservation is counted from the node's script; this waits from its answer.
        tokio::time::sleep(wait.saturating_add(Duration::from_millis(1))).await;
        // One node first: in the usual case (the heir took the lock) it says so, and
        // that is all the follow-up costs. If it found the key gone (the heir did not
        // take it: passed on there, or, with nobody queued on that node, freed, while
        // the next waiter may be queued on the others), or did not answer, a majority of
        // nodes: the next heir takes the others, where the reservation has run out, as
        // free keys.
        let nodes: Vec<usize> = pending.iter().map(|(node, _)| *node).collect();
        let (first, rest) = nodes.split_at(1.min(nodes.len()));
        let mut answers = follow_up(&cluster, &target, first).await;
        let settled = answers
            .iter()
            .flatten()
            .all(|answer| matches!(answer, Ok(n) if release_answer(*n) == (0, Duration::ZERO)));
        if !settled || answers.iter().all(Option::is_none) {
            let more = cluster.quorum().saturating_sub(first.len());
            let others: Vec<usize> = rest.iter().copied().take(more).collect();
            for (node, answer) in follow_up(&cluster, &target, &others)
                .await
                .into_iter()
                .enumerate()
            {
                if answer.is_some()
                    && let Some(slot) = answers.get_mut(node)
                {
                    *slot = answer;
                }
            }
        } else {
            return;
        }
        pending = pending_hand_overs(&answers);
    }
}

/// Runs the follow-up release on `nodes`; every node's answer (`None` where not asked).
async fn follow_up(cluster: &Arc<Cluster>, target: &Arc<Target>, nodes: &[usize]) -> Answers {
    if nodes.is_empty() {
        return Answers::new();
    }
    let mut fanout = Fanout::start(
        cluster,
        target,
        OpKind::Release {
            mode: ReleaseMode::FollowUp,
        },
        Some(nodes),
    );
    fanout.until_done().await;
    std::mem::take(&mut fanout.answers)
}

/// The nodes whose answer left a hand-over pending, and for how long.
fn pending_hand_overs(answers: &Answers) -> Vec<(usize, Duration)> {
    answers
        .iter()
        .enumerate()
        .filter_map(|(node, answer)| match answer {
            Some(Ok(n)) => {
                let (_, left) = release_answer(*n);
                (!left.is_zero()).then_some((node, left))
            }
            _ => None,
        })
        .collect()
}
