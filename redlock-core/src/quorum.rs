//! Fanning one operation out to every node and counting the votes.
//!
//! Each node answers yes, no, or fails (error or timeout). A [`Fanout`] sends the
//! operation to all nodes at once and can stop listening as soon as the majority outcome
//! is decided: either a majority said yes, or so many said no or failed that a majority
//! can no longer be reached. The node operations still in flight at that point are not
//! abandoned: [`Fanout::finish_in_background`] lets them complete on the runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures_util::StreamExt;
use futures_util::future::{self, BoxFuture, FutureExt};

use crate::client::Shared;
use crate::error::{Error, NodeError, NodeFailure};
use crate::node::{Command, Op, ReleaseMode};
use crate::queue::Waiter;

/// The majority of `n` nodes: `n / 2 + 1`.
pub(crate) fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// Counts of votes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) nodes: usize,
    pub(crate) quorum: usize,
    pub(crate) yes: usize,
    pub(crate) no: usize,
    pub(crate) failed: usize,
}

impl Tally {
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            nodes,
            quorum: majority(nodes),
            yes: 0,
            no: 0,
            failed: 0,
        }
    }

    /// A majority said yes.
    pub(crate) fn won(&self) -> bool {
        self.yes >= self.quorum
    }

    /// A majority of yes can no longer be reached.
    pub(crate) fn lost(&self) -> bool {
        self.no + self.failed > self.nodes - self.quorum
    }

    /// Either way, the outcome is known.
    pub(crate) fn decided(&self) -> bool {
        self.won() || self.lost()
    }

    /// A majority of nodes answered (yes or no): the outcome is not a matter of
    /// unreachable nodes.
    pub(crate) fn majority_answered(&self) -> bool {
        self.yes + self.no >= self.quorum
    }
}

/// Which operation to send, with owned data so node futures can outlive the caller.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OpKind {
    Acquire {
        ttl_ms: u64,
    },
    RaiseFence {
        token: u64,
    },
    /// See [`ReleaseMode`].
    Release {
        mode: ReleaseMode,
    },
    Extend {
        ttl_ms: u64,
    },
    /// Leave the keys' wait queues, passing on a hand-over not taken (see `queue.rs`).
    Dequeue,
}

/// The keys and the random value of one lock.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) keys: Vec<String>,
    /// The fencing counters, one per key; empty without fencing.
    pub(crate) fence_keys: Vec<String>,
    pub(crate) value: String,
    /// How long a release reserves the lock for the next queued waiter (ms).
    pub(crate) handoff_ms: u64,
    /// Set for the attempts of a queued waiter (one resource only).
    pub(crate) waiter: Option<Waiter>,
    /// A request that will not wait (one attempt): a lock being handed over to a queued
    /// waiter counts as free for it (see `Redlock::try_lock`).
    pub(crate) barge: bool,
}

impl Target {
    pub(crate) fn op(&self, kind: OpKind) -> Op<'_> {
        match kind {
            OpKind::Acquire { ttl_ms } => Op::Acquire {
                keys: &self.keys,
                fence_keys: &self.fence_keys,
                value: &self.value,
                ttl_ms,
                waiter: self.waiter.as_ref(),
                barge: self.barge,
            },
            OpKind::RaiseFence { token } => Op::RaiseFence {
                fence_keys: &self.fence_keys,
                token,
            },
            OpKind::Release { mode } => Op::Release {
                keys: &self.keys,
                value: &self.value,
                mode,
                handoff_ms: self.handoff_ms,
                dequeue: None,
            },
            OpKind::Dequeue => Op::Release {
                keys: &self.keys,
                value: &self.value,
                mode: ReleaseMode::HandOver,
                handoff_ms: self.handoff_ms,
                dequeue: self.waiter.as_ref().map(|w| w.id.as_str()),
            },
            OpKind::Extend { ttl_ms } => Op::Extend {
                keys: &self.keys,
                value: &self.value,
                ttl_ms,
            },
        }
    }
}

/// Each node's answer to a fan-out, once it came.
pub(crate) type Answers = Vec<Option<Result<u64, NodeError>>>;

pub(crate) type NodeFuture = Pin<Box<dyn Future<Output = (usize, Result<u64, NodeError>)> + Send>>;

/// The node calls of a fan-out still in flight, answered in any order. At most one per
/// node, so each wake-up simply polls them all: no allocation per call beyond its own
/// future (a `FuturesUnordered` would add a task per call and one per set).
#[derive(Default)]
pub(crate) struct Pending(Vec<NodeFuture>);

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl futures_util::Stream for Pending {
    type Item = (usize, Result<u64, NodeError>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.0.is_empty() {
            return Poll::Ready(None);
        }
        let answered =
            self.0
                .iter_mut()
                .enumerate()
                .find_map(|(i, call)| match call.as_mut().poll(cx) {
                    Poll::Ready(answer) => Some((i, answer)),
                    Poll::Pending => None,
                });
        match answered {
            Some((i, answer)) => {
                drop(self.0.swap_remove(i));
                Poll::Ready(Some(answer))
            }
            None => Poll::Pending,
        }
    }
}

impl IntoIterator for Pending {
    type Item = NodeFuture;
    type IntoIter = std::vec::IntoIter<NodeFuture>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// One operation in flight on a set of nodes.
pub(crate) struct Fanout {
    shared: Arc<Shared>,
    pending: Pending,
    /// Per node: the command is in the node's connection queue (see `Node::run`).
    queued: Arc<[AtomicBool]>,
    /// Each node's answer, once it came.
    pub(crate) answers: Answers,
    pub(crate) tally: Tally,
}

impl Fanout {
    /// Sends `kind` to the nodes listed in `which` (all nodes if `None`).
    pub(crate) fn start(
        shared: &Arc<Shared>,
        target: &Arc<Target>,
        kind: OpKind,
        which: Option<&[usize]>,
    ) -> Self {
        Self::start_after(shared, target, kind, which, None)
    }

    /// [`start`](Self::start), but on each node that `after` covers the command is sent
    /// only once the earlier commands there have completed, so it cannot overtake them
    /// (see [`InFlight`]). Waiting is bounded: those commands have timeouts of their own.
    pub(crate) fn start_after(
        shared: &Arc<Shared>,
        target: &Arc<Target>,
        kind: OpKind,
        which: Option<&[usize]>,
        after: Option<&InFlight>,
    ) -> Self {
        let n = shared.nodes.len();
        let mut pending = Vec::with_capacity(which.map_or(n, <[usize]>::len));
        let queued: Arc<[AtomicBool]> = (0..n).map(|_| AtomicBool::new(false)).collect();
        // Built once, sent to every node.
        let command = Arc::new(Command::new(target.op(kind)));
        let mut push = |index: usize| {
            let shared = Arc::clone(shared);
            let command = Arc::clone(&command);
            let queued = Arc::clone(&queued);
            let after = after.filter(|a| a.covers(index)).cloned();
            let fut: NodeFuture = Box::pin(async move {
                if let Some(after) = after {
                    after.wait().await;
                }
                let result = match (shared.nodes.get(index), queued.get(index)) {
                    (Some(node), Some(queued)) => {
                        node.run(&command, shared.node_timeout, queued).await
                    }
                    _ => Ok(0),
                };
                (index, result)
            });
            pending.push(fut);
        };
        match which {
            Some(indices) => indices.iter().copied().for_each(&mut push),
            None => (0..n).for_each(&mut push),
        }
        Self {
            shared: Arc::clone(shared),
            pending: Pending(pending),
            queued,
            answers: vec![None; n],
            tally: Tally::new(n),
        }
    }

    /// A fan-out to no node, for a guard that has already handed its own over.
    pub(crate) fn empty(shared: &Arc<Shared>) -> Self {
        Self {
            shared: Arc::clone(shared),
            pending: Pending::default(),
            queued: Arc::new([]),
            answers: vec![None; shared.nodes.len()],
            tally: Tally::new(shared.nodes.len()),
        }
    }

    /// Waits until the majority outcome is decided (or every node answered).
    pub(crate) async fn until_decided(&mut self) -> Tally {
        while !self.tally.decided() {
            if !self.next().await {
                break;
            }
        }
        self.tally
    }

    /// Waits until a majority said yes, or every node answered.
    pub(crate) async fn until_won_or_done(&mut self) -> Tally {
        while !self.tally.won() {
            if !self.next().await {
                break;
            }
        }
        self.tally
    }

    /// Waits for every node.
    pub(crate) async fn until_done(&mut self) -> Tally {
        while self.next().await {}
        self.tally
    }

    /// Records the next answer; false when none is pending.
    async fn next(&mut self) -> bool {
        let Some((index, result)) = self.pending.next().await else {
            return false;
        };
        match &result {
            Ok(0) => self.tally.no += 1,
            Ok(_) => self.tally.yes += 1,
            Err(_) => self.tally.failed += 1,
        }
        if let Some(slot) = self.answers.get_mut(index) {
            *slot = Some(result);
        }
        true
    }

    /// Nodes that answered yes (`true`) or no (`false`).
    pub(crate) fn nodes_answering(&self, yes: bool) -> Vec<usize> {
        self.answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Some(Ok(x)) if (*x > 0) == yes))
            .map(|(i, _)| i)
            .collect()
    }

    /// The yes answers so far (for a fencing acquire: the nodes' tokens).
    pub(crate) fn yes_answers(&self) -> impl Iterator<Item = u64> + '_ {
        self.answers.iter().filter_map(|a| match a {
            Some(Ok(x)) if *x > 0 => Some(*x),
            _ => None,
        })
    }

    /// Nodes that failed (error or timeout).
    pub(crate) fn nodes_failed(&self) -> Vec<usize> {
        self.answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Some(Err(_))))
            .map(|(i, _)| i)
            .collect()
    }

    /// Names of the nodes that answered yes (`true`) or no (`false`).
    pub(crate) fn names_answering(&self, yes: bool) -> Vec<String> {
        self.nodes_answering(yes)
            .into_iter()
            .filter_map(|i| self.shared.nodes.get(i).map(|n| n.name().to_owned()))
            .collect()
    }

    /// What went wrong on each failed node.
    pub(crate) fn failures(&self) -> Vec<NodeFailure> {
        self.answers
            .iter()
            .enumerate()
            .filter_map(|(i, answer)| match answer {
                Some(Err(cause)) => Some(NodeFailure {
                    node: self.shared.nodes.get(i)?.name().to_owned(),
                    cause: cause.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Waits for the node operations still in flight and hands back the nodes they were
    /// on, for a cleanup that must come after them.
    pub(crate) fn take_pending(&mut self) -> Pending {
        std::mem::take(&mut self.pending)
    }

    /// Lets the node operations still in flight complete on the runtime instead of
    /// dropping them half-way (a dropped request may never be sent).
    ///
    /// Returns what a later command to the same nodes must wait for: the operations
    /// not yet in their node's connection queue (still connecting, waiting for an
    /// earlier command, or pooled), which a later command could otherwise overtake.
    pub(crate) fn finish_in_background(mut self) -> Option<InFlight> {
        let mut pending = self.take_pending();
        if pending.is_empty() {
            return None;
        }
        let nodes = self.unqueued();
        let handle = tokio::runtime::Handle::try_current().ok()?;
        if nodes.is_empty() {
            handle.spawn(async move { while pending.next().await.is_some() {} });
            return None;
        }
        Some(InFlight::spawn(&handle, nodes, async move {
            while pending.next().await.is_some() {}
        }))
    }

    /// Nodes whose command has not answered and is not in the connection queue.
    fn unqueued(&self) -> Vec<usize> {
        (0..self.answers.len())
            .filter(|&i| self.answers.get(i).is_some_and(Option::is_none))
            .filter(|&i| {
                !self
                    .queued
                    .get(i)
                    .is_some_and(|q| q.load(Ordering::Acquire))
            })
            .collect()
    }

    /// Drives the fan-out in a task of its own until every node answered or timed out,
    /// and reports the tally once `until` is reached. Dropping the receiver (the caller
    /// was cancelled) does not stop the commands: a command whose future is dropped
    /// before the connection sends it is never sent, so awaiting one in place is not
    /// cancel-safe. Without a runtime, drives it in place instead.
    pub(crate) async fn drive(self, until: Until) -> Decision {
        self.drive_holding(until, ()).await
    }

    /// [`drive`](Self::drive), keeping `guard` until every node answered or timed out.
    pub(crate) async fn drive_holding<G: Send + 'static>(self, until: Until, guard: G) -> Decision {
        self.drive_then(until, move |_| async move { drop(guard) })
            .await
    }

    /// [`drive`](Self::drive), then, once every node answered or timed out, runs `then`
    /// on the answers (in the same task).
    pub(crate) async fn drive_then<F, Fut>(mut self, until: Until, then: F) -> Decision
    where
        F: FnOnce(Answers) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            let tally = self.run_until(until).await;
            return Decision {
                tally,
                failures: self.failures(),
            };
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        handle.spawn(async move {
            let tally = self.run_until(until).await;
            let _ = tx.send(Decision {
                tally,
                failures: self.failures(),
            });
            self.until_done().await;
            then(std::mem::take(&mut self.answers)).await;
        });
        rx.await.unwrap_or(Decision {
            tally: Tally::new(0),
            failures: Vec::new(),
        })
    }

    async fn run_until(&mut self, until: Until) -> Tally {
        match until {
            Until::Decided => self.until_decided().await,
            Until::WonOrDone => self.until_won_or_done().await,
            Until::Done => self.until_done().await,
        }
    }
}

/// When [`Fanout::drive`] reports.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    /// The majority outcome is known.
    Decided,
    /// A majority said yes, or every node answered.
    WonOrDone,
    /// Every node answered or timed out.
    Done,
}

/// What a driven fan-out reports: the votes, and what failed on which node.
#[derive(Debug)]
pub(crate) struct Decision {
    pub(crate) tally: Tally,
    pub(crate) failures: Vec<NodeFailure>,
}

impl Decision {
    /// The error for an outcome decided by failed nodes.
    pub(crate) fn no_quorum(self, resource: &str) -> Error {
        Error::NoQuorum {
            resource: resource.to_owned(),
            needed: self.tally.quorum,
            total: self.tally.nodes,
            failures: self.failures,
        }
    }
}

/// Commands of one lock that are not yet in their node's connection queue (still
/// connecting, or waiting for an earlier command), completing in the background.
///
/// Commands to one node travel in one queue and run in its order, so a command queued
/// later runs later, except after one of these: a later command to those nodes must
/// wait for them ([`Fanout::start_after`]). That keeps, per node, the order in which a
/// lock's operations were issued: acquire, raise the fence, extend, release.
#[derive(Clone)]
pub(crate) struct InFlight {
    /// The nodes they are on.
    pub(crate) nodes: Arc<[usize]>,
    done: future::Shared<BoxFuture<'static, ()>>,
    finished: Arc<AtomicBool>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("nodes", &self.nodes)
            .field("done", &self.is_done())
            .finish()
    }
}

impl InFlight {
    /// Runs `work` (the commands on `nodes`) in a task of its own.
    fn spawn(
        handle: &tokio::runtime::Handle,
        nodes: Vec<usize>,
        work: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&finished);
        let task = handle.spawn(async move {
            work.await;
            flag.store(true, Ordering::Release);
        });
        let done: BoxFuture<'static, ()> = Box::pin(async move {
            let _ = task.await;
        });
        Self {
            nodes: nodes.into(),
            done: done.shared(),
            finished,
        }
    }

    /// Both `a` and `b` (either may be absent).
    pub(crate) fn join(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => {
                let handle = tokio::runtime::Handle::try_current().ok()?;
                let mut nodes: Vec<usize> = a.nodes.iter().chain(b.nodes.iter()).copied().collect();
                nodes.sort_unstable();
                nodes.dedup();
                Some(Self::spawn(&handle, nodes, async move {
                    futures_util::future::join(a.done, b.done).await;
                }))
            }
            (a, b) => a.or(b),
        }
    }

    /// Whether node `index` has one of them.
    pub(crate) fn covers(&self, index: usize) -> bool {
        self.nodes.contains(&index)
    }

    /// Whether all of them have completed.
    pub(crate) fn is_done(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Waits until all of them have completed (each is bounded by the node timeout).
    pub(crate) async fn wait(&self) {
        self.done.clone().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_of_n() {
        assert_eq!(majority(1), 1);
        assert_eq!(majority(2), 2);
        assert_eq!(majority(3), 2);
        assert_eq!(majority(4), 3);
        assert_eq!(majority(5), 3);
    }

    #[test]
    fn decided_by_yes_majority_or_when_unreachable() {
        let mut t = Tally::new(5);
        t.yes = 2;
        t.no = 2;
        assert!(!t.decided());
        t.yes = 3;
        assert!(t.won() && t.decided());
        let mut t = Tally::new(5);
        t.no = 1;
        t.failed = 1;
        assert!(!t.lost());
        t.failed = 2;
        assert!(t.lost() && !t.won());
        let mut single = Tally::new(1);
        single.failed = 1;
        assert!(single.lost());
    }

    #[test]
    fn majority_answered_ignores_failures() {
        let mut t = Tally::new(5);
        t.no = 2;
        t.failed = 3;
        assert!(!t.majority_answered());
        t.no = 3;
        t.failed = 2;
        assert!(t.majority_answered());
    }
}
