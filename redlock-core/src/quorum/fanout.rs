//! One operation sent to every node at once, and its votes counted as they come.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;

use super::in_flight::InFlight;
use super::target::{OpKind, Target};
use super::{Cluster, Tally};
use crate::clock::Instant;
use crate::error::{Error, NodeError, NodeFailure};
use crate::node::{IDENTITY_WAIT, Queued};
use crate::protocol::Command;

/// Each node's answer to a fan-out, once it came.
pub(crate) type Answers = Vec<Option<Result<u64, NodeError>>>;

pub(crate) type NodeFuture = Pin<Box<dyn Future<Output = (usize, Result<u64, NodeError>)> + Send>>;

/// The node calls of a fan-out still in flight, answered in any order. At most one per
/// node, so each wake-up simply polls them all: no allocation per call beyond its own
/// future (a `FuturesUnordered` would add a task per call and one per set). Every call
/// is polled at each pass, also after one answered: every call has started (its command
/// queued, or its connection being opened) before the first answer is handed out, and so
/// before any majority is counted (see `Fanout::identity_pending`).
///
/// The calls share one timeout, the node timeout from the fan-out's start: one timer for
/// the whole fan-out rather than one per node (a timer's registration costs more than
/// the rest of a call's bookkeeping). When it fires, every call still in flight answers
/// a timeout at its next poll (see `Node::run_until`). A call that first waits for
/// earlier commands on its node has a timer of its own, started when it is sent.
#[derive(Default)]
pub(crate) struct Pending {
    /// Each call, and whether it keeps to the shared deadline.
    calls: Vec<(NodeFuture, bool)>,
    /// Answers in, not handed out yet.
    answered: Vec<(usize, Result<u64, NodeError>)>,
    deadline: Option<SharedDeadline>,
}

/// The end of a fan-out's calls: when it is, and, once passed, the flag the calls read.
struct SharedDeadline {
    at: Instant,
    timeout: Duration,
    expired: Arc<AtomicBool>,
    /// Started at the first poll that finds every call waiting.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.answered.is_empty()
    }
}

impl futures_util::Stream for Pending {
    type Item = (usize, Result<u64, NodeError>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(answer) = this.answered.pop() {
                return Poll::Ready(Some(answer));
            }
            if this.calls.is_empty() {
                return Poll::Ready(None);
            }
            let mut i = 0;
            while let Some((call, _)) = this.calls.get_mut(i) {
                match call.as_mut().poll(cx) {
                    Poll::Ready(answer) => {
                        // The last call takes its place: polled next.
                        drop(this.calls.swap_remove(i));
                        this.answered.push(answer);
                    }
                    Poll::Pending => i += 1,
                }
            }
            if let Some(answer) = this.answered.pop() {
                return Poll::Ready(Some(answer));
            }
            let Some(deadline) = this.deadline.as_mut() else {
                return Poll::Pending;
            };
            if deadline.expired.load(Ordering::Acquire) {
                return Poll::Pending;
            }
            let at = deadline.at;
            let timer = deadline
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at.into())));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Passed: the calls still waiting now answer their timeout.
            deadline.expired.store(true, Ordering::Release);
            deadline.timer = None;
        }
    }
}

impl IntoIterator for Pending {
    type Item = NodeFuture;
    type IntoIter = std::vec::IntoIter<NodeFuture>;

    /// The calls one by one, each bounded by the shared deadline on its own (and the
    /// answers in, not handed out yet, as calls answered at once).
    fn into_iter(self) -> Self::IntoIter {
        let deadline = self.deadline.map(|d| (d.at, d.timeout, d.expired));
        let answered = self
            .answered
            .into_iter()
            .map(|answer| Box::pin(std::future::ready(answer)) as NodeFuture);
        self.calls
            .into_iter()
            .map(|(call, shared)| match (&deadline, shared) {
                (Some((at, _, expired)), true) => {
                    let (at, expired) = (*at, Arc::clone(expired));
                    Box::pin(async move {
                        let mut call = call;
                        match tokio::time::timeout_at(at.into(), &mut call).await {
                            Ok(answer) => answer,
                            Err(_) => {
                                // Its next poll answers the timeout.
                                expired.store(true, Ordering::Release);
                                call.await
                            }
                        }
                    }) as NodeFuture
                }
                _ => call,
            })
            .chain(answered)
            .collect::<Vec<_>>()
            .into_iter()
    }
}

/// One operation in flight on a set of nodes.
pub(crate) struct Fanout {
    cluster: Arc<Cluster>,
    pending: Pending,
    /// Per node: the command is in the node's connection queue (see `Node::run`).
    queued: Arc<[Queued]>,
    /// Each node's answer, once it came.
    pub(crate) answers: Answers,
    pub(crate) tally: Tally,
    /// The nodes asked, where not all of them.
    asked: Option<Vec<bool>>,
    /// Once a majority said yes while a node still out was opening its connection: when
    /// the decision stops waiting for that node's identity.
    identity_wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The end of the last wait for identities that is over.
    waited_until: Option<Instant>,
}

impl Fanout {
    /// Sends `kind` to the nodes listed in `which` (all nodes if `None`).
    pub(crate) fn start(
        cluster: &Arc<Cluster>,
        target: &Arc<Target>,
        kind: OpKind,
        which: Option<&[usize]>,
    ) -> Self {
        Self::start_after(cluster, target, kind, which, None)
    }

    /// [`start`](Self::start), but on each node that `after` covers the command is sent
    /// only once the earlier commands there have completed, so it cannot overtake them
    /// (see [`InFlight`]). Waiting is bounded: those commands have timeouts of their own.
    pub(crate) fn start_after(
        cluster: &Arc<Cluster>,
        target: &Arc<Target>,
        kind: OpKind,
        which: Option<&[usize]>,
        after: Option<&InFlight>,
    ) -> Self {
        let n = cluster.nodes.len();
        let mut pending = Vec::with_capacity(which.map_or(n, <[usize]>::len));
        let queued: Arc<[Queued]> = (0..n).map(|_| Queued::new()).collect();
        let timeout = cluster.node_timeout;
        let expired = Arc::new(AtomicBool::new(false));
        // Built once, sent to every node.
        let command = Arc::new(Command::new(target.op(kind)));
        let mut push = |index: usize| {
            let cluster = Arc::clone(cluster);
            let command = Arc::clone(&command);
            let queued = Arc::clone(&queued);
            let after = after.filter(|a| a.covers(index)).cloned();
            let shared = after.is_none();
            let expired = Arc::clone(&expired);
            let fut: NodeFuture = Box::pin(async move {
                let result = match (cluster.nodes.get(index), queued.get(index), after) {
                    // Sent once the earlier commands there completed: its own timer.
                    (Some(node), Some(queued), Some(after)) => {
                        after.wait().await;
                        node.run(&command, timeout, queued).await
                    }
                    (Some(node), Some(queued), None) => {
                        node.run_until(&command, timeout, &expired, queued).await
                    }
                    _ => Ok(0),
                };
                (index, result)
            });
            pending.push((fut, shared));
        };
        match which {
            Some(indices) => indices.iter().copied().for_each(&mut push),
            None => (0..n).for_each(&mut push),
        }
        Self {
            cluster: Arc::clone(cluster),
            pending: Pending {
                calls: pending,
                answered: Vec::new(),
                deadline: Some(SharedDeadline {
                    at: Instant::now() + timeout,
                    timeout,
                    expired,
                    timer: None,
                }),
            },
            queued,
            answers: vec![None; n],
            tally: Tally::new(n),
            asked: which.map(|indices| {
                let mut asked = vec![false; n];
                for &i in indices {
                    if let Some(slot) = asked.get_mut(i) {
                        *slot = true;
                    }
                }
                asked
            }),
            identity_wait: None,
            waited_until: None,
        }
    }

    /// A fan-out to no node, for a guard that has already handed its own over.
    pub(crate) fn empty(cluster: &Arc<Cluster>) -> Self {
        Self {
            cluster: Arc::clone(cluster),
            pending: Pending::default(),
            queued: Arc::new([]),
            answers: vec![None; cluster.nodes.len()],
            tally: Tally::new(cluster.nodes.len()),
            asked: Some(Vec::new()),
            identity_wait: None,
            waited_until: None,
        }
    }

    /// Waits until the majority outcome is decided (or every node answered). A majority
    /// of yes is decided once the identities of the nodes still out are known too (see
    /// [`identity_pending`](Self::identity_pending)).
    pub(crate) async fn until_decided(&mut self) -> Tally {
        while !self.tally.lost() && !self.won_and_identified() {
            if !self.next(true).await {
                break;
            }
        }
        self.tally
    }

    /// Waits until a majority said yes (and the identities of the nodes still out are
    /// known), or every node answered.
    pub(crate) async fn until_won_or_done(&mut self) -> Tally {
        while !self.won_and_identified() {
            if !self.next(true).await {
                break;
            }
        }
        self.tally
    }

    fn won_and_identified(&self) -> bool {
        self.tally.won() && self.identity_pending().is_none()
    }

    /// Until when the decision waits for the identity of a node asked and still out:
    /// the latest end of the waits of those still opening a connection (see
    /// `Node::identifying`), `None` if there are none. Such a node may turn out to be the
    /// same server as one that said yes (one server under two names), and a majority
    /// would count that server twice. A connection's identity is claimed before anyone
    /// uses it, so a node that is the same server as another one answers
    /// [`NodeError::SameServer`], and the client's configuration is refused (see
    /// `Identities`).
    fn identity_pending(&self) -> Option<Instant> {
        let now = Instant::now();
        // A wait that is over, is over (whatever the clocks' rounding).
        let now = self.waited_until.map_or(now, |until| now.max(until));
        let long = self.cluster.node_timeout;
        let short = IDENTITY_WAIT.min(long);
        self.answers
            .iter()
            .enumerate()
            .filter(|(i, answer)| answer.is_none() && self.was_asked(*i))
            .filter_map(|(i, _)| self.cluster.nodes.get(i)?.identifying(short, long, now))
            .max()
    }

    fn was_asked(&self, index: usize) -> bool {
        self.asked
            .as_ref()
            .is_none_or(|asked| asked.get(index).copied().unwrap_or(false))
    }

    /// With a majority of yes in: ready once no node still out is opening a connection
    /// whose identity the decision waits for (see
    /// [`identity_pending`](Self::identity_pending)). A connection that opens wakes the
    /// fan-out through its node's call; one still opening when its wait is over counts
    /// as unreachable (the node does not vote).
    fn poll_identified(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let Some(until) = self.identity_pending() else {
                return Poll::Ready(());
            };
            let timer = self
                .identity_wait
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until.into())));
            if timer.deadline() != until.into() {
                timer.as_mut().reset(until.into());
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.waited_until = Some(until);
        }
    }

    /// Waits for every node.
    pub(crate) async fn until_done(&mut self) -> Tally {
        while self.next(false).await {}
        self.tally
    }

    /// Records the next answers (all those in); false when none is pending. With `settle`
    /// and a majority of yes in, also returns (true) once the identities of the nodes
    /// still out are known, or no longer waited for.
    async fn next(&mut self, settle: bool) -> bool {
        std::future::poll_fn(|cx| match self.pending.poll_next_unpin(cx) {
            Poll::Ready(Some((index, result))) => {
                self.record(index, result);
                // And every other answer that came in the same pass.
                while let Some((index, result)) = self.pending.answered.pop() {
                    self.record(index, result);
                }
                Poll::Ready(true)
            }
            Poll::Ready(None) => Poll::Ready(false),
            Poll::Pending if settle && self.tally.won() => self.poll_identified(cx).map(|()| true),
            Poll::Pending => Poll::Pending,
        })
        .await
    }

    /// Records the answers already in, without waiting for any.
    fn take_ready(&mut self) {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        while let Poll::Ready(Some((index, result))) = self.pending.poll_next_unpin(&mut cx) {
            self.record(index, result);
        }
    }

    fn record(&mut self, index: usize, result: Result<u64, NodeError>) {
        match &result {
            Ok(0) => self.tally.no += 1,
            Ok(_) => self.tally.yes += 1,
            Err(_) => self.tally.failed += 1,
        }
        if let Some(slot) = self.answers.get_mut(index) {
            *slot = Some(result);
        }
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
            .filter_map(|i| self.cluster.nodes.get(i).map(|n| n.name().to_owned()))
            .collect()
    }

    /// What went wrong on each failed node.
    pub(crate) fn failures(&self) -> Vec<NodeFailure> {
        self.answers
            .iter()
            .enumerate()
            .filter_map(|(i, answer)| match answer {
                Some(Err(cause)) => Some(NodeFailure {
                    node: self.cluster.nodes.get(i)?.name().to_owned(),
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
    pub(crate) fn finish_in_background(self) -> Option<InFlight> {
        self.finish_in_background_holding(())
    }

    /// [`finish_in_background`](Self::finish_in_background), keeping `guard` until
    /// every node answered or timed out.
    pub(crate) fn finish_in_background_holding<G: Send + 'static>(
        mut self,
        guard: G,
    ) -> Option<InFlight> {
        // Answers already in need no task.
        self.take_ready();
        let mut pending = self.take_pending();
        if pending.is_empty() {
            return None;
        }
        let nodes = self.unqueued();
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let rest = async move {
            while pending.next().await.is_some() {}
            drop(guard);
        };
        if nodes.is_empty() {
            handle.spawn(rest);
            return None;
        }
        Some(InFlight::spawn(&handle, nodes, rest))
    }

    /// Nodes whose command has not answered and is not in the connection queue.
    fn unqueued(&self) -> Vec<usize> {
        (0..self.answers.len())
            .filter(|&i| self.answers.get(i).is_some_and(Option::is_none))
            .filter(|&i| !self.queued.get(i).is_some_and(Queued::rely))
            .collect()
    }

    /// Drives the fan-out until every node answered or timed out, and reports the tally
    /// once `until` is reached. It is driven in place until then; whatever is left (the
    /// nodes still out) goes on in a task of its own, also when the caller is dropped
    /// half-way: a command whose future is dropped before the connection sends it is
    /// never sent. Without a runtime, driven in place to the end.
    pub(crate) async fn drive(self, until: Until) -> Decision {
        self.drive_then(until, |_| async {}).await
    }

    /// [`drive`](Self::drive), then, once every node answered or timed out, runs `then`
    /// on the answers (in place if they are all in by the decision and `then` completes
    /// at once, as it does when it has nothing to do; otherwise in the task that waits
    /// for the rest).
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
        let mut rest = Rest {
            fanout: None,
            then: Some(then),
            handle,
        };
        let fanout = rest.fanout.insert(self);
        let tally = fanout.run_until(until).await;
        fanout.take_ready();
        let decision = Decision {
            tally,
            failures: fanout.failures(),
        };
        rest.finish();
        decision
    }

    async fn run_until(&mut self, until: Until) -> Tally {
        match until {
            Until::WonOrDone => self.until_won_or_done().await,
            Until::Done => self.until_done().await,
        }
    }
}

/// What a driven fan-out has left to do once it reported: wait for the nodes still out,
/// then run its `then`. Done by [`finish`](Self::finish), or on drop (the caller was
/// cancelled half-way) all the same.
struct Rest<F, Fut>
where
    F: FnOnce(Answers) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    fanout: Option<Fanout>,
    then: Option<F>,
    handle: tokio::runtime::Handle,
}

impl<F, Fut> Rest<F, Fut>
where
    F: FnOnce(Answers) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    fn finish(&mut self) {
        let (Some(mut fanout), Some(then)) = (self.fanout.take(), self.then.take()) else {
            return;
        };
        if fanout.pending.is_empty() {
            let mut then = Box::pin(then(std::mem::take(&mut fanout.answers)));
            let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
            if then.as_mut().poll(&mut cx).is_pending() {
                self.handle.spawn(then);
            }
            return;
        }
        self.handle.spawn(async move {
            fanout.until_done().await;
            then(std::mem::take(&mut fanout.answers)).await;
        });
    }
}

impl<F, Fut> Drop for Rest<F, Fut>
where
    F: FnOnce(Answers) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    fn drop(&mut self) {
        self.finish();
    }
}

/// When [`Fanout::drive`] reports.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
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
