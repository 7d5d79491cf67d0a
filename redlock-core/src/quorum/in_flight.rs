//! Commands of a lock still on their way to some nodes, which later commands wait for.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::{self, BoxFuture, FutureExt};

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
    pub(super) fn spawn(
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
