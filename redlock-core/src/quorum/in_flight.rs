//! Commands of a lock still on their way to some nodes, which later commands wait for.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Commands of one lock that are not yet in their node's connection queue (still
/// connecting, or waiting for an earlier command), completing in the background.
///
/// Commands to one node travel in one queue and run in its order, so a command queued
/// later runs later, except after one of these: a later command to those nodes must
/// wait for them ([`Fanout::start_after`]). That keeps, per node, the order in which a
/// lock's operations were issued: acquire, raise the fence, extend, release.
///
/// A held lock keeps this for its lifetime, so it is small: the task running the
/// commands is not kept (its memory goes when it completes), only a flag it sets on its
/// way out and a [`Notify`] for those waiting.
///
/// [`Fanout::start_after`]: super::Fanout::start_after
#[derive(Clone)]
pub(crate) struct InFlight(Arc<Inner>);

struct Inner {
    /// The nodes they are on.
    nodes: Box<[usize]>,
    finished: AtomicBool,
    done: Notify,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("nodes", &self.0.nodes)
            .field("done", &self.is_done())
            .finish()
    }
}

/// Marks the commands done when the task running them ends, completed or dropped (its
/// runtime shut down): waiters are never left waiting for a task that is gone.
struct Finish(Arc<Inner>);

impl Drop for Finish {
    fn drop(&mut self) {
        self.0.finished.store(true, Ordering::Release);
        self.0.done.notify_waiters();
    }
}

impl InFlight {
    /// Runs `work` (the commands on `nodes`) in a task of its own.
    pub(super) fn spawn(
        handle: &tokio::runtime::Handle,
        nodes: Vec<usize>,
        work: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        let inner = Arc::new(Inner {
            nodes: nodes.into_boxed_slice(),
            finished: AtomicBool::new(false),
            done: Notify::new(),
        });
        let finish = Finish(Arc::clone(&inner));
        // Not joined: done is told by `finish`.
        drop(handle.spawn(async move {
            let _finish = finish;
            work.await;
        }));
        Self(inner)
    }

    /// Both `a` and `b` (either may be absent).
    pub(crate) fn join(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => {
                let handle = tokio::runtime::Handle::try_current().ok()?;
                let mut nodes: Vec<usize> =
                    a.0.nodes.iter().chain(b.0.nodes.iter()).copied().collect();
                nodes.sort_unstable();
                nodes.dedup();
                Some(Self::spawn(&handle, nodes, async move {
                    futures_util::future::join(a.wait(), b.wait()).await;
                }))
            }
            (a, b) => a.or(b),
        }
    }

    /// Whether node `index` has one of them.
    pub(crate) fn covers(&self, index: usize) -> bool {
        self.0.nodes.contains(&index)
    }

    /// Whether all of them have completed.
    pub(crate) fn is_done(&self) -> bool {
        self.0.finished.load(Ordering::Acquire)
    }

    /// Waits until all of them have completed (each is bounded by the node timeout).
    pub(crate) async fn wait(&self) {
        loop {
            // Registered before the flag is read: the wake-up that follows setting it
            // cannot be missed.
            let done = self.0.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.is_done() {
                return;
            }
            done.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn waiters_wake_when_the_commands_complete() {
        let handle = tokio::runtime::Handle::current();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let in_flight = InFlight::spawn(&handle, vec![2, 0], async move {
            let _ = rx.await;
        });
        assert!(in_flight.covers(2) && in_flight.covers(0) && !in_flight.covers(1));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let in_flight = in_flight.clone();
                tokio::spawn(async move { in_flight.wait().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!in_flight.is_done());
        assert!(waiters.iter().all(|w| !w.is_finished()));
        let _ = tx.send(());
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("woken")
                .expect("not panicked");
        }
        assert!(in_flight.is_done());
        // Done: waiting returns at once.
        tokio::time::timeout(Duration::from_millis(100), in_flight.wait())
            .await
            .expect("done");
    }

    #[tokio::test]
    async fn joined_waits_for_both() {
        let handle = tokio::runtime::Handle::current();
        let (tx_a, rx_a) = tokio::sync::oneshot::channel::<()>();
        let (tx_b, rx_b) = tokio::sync::oneshot::channel::<()>();
        let a = InFlight::spawn(&handle, vec![1], async move {
            let _ = rx_a.await;
        });
        let b = InFlight::spawn(&handle, vec![3, 1], async move {
            let _ = rx_b.await;
        });
        let both = InFlight::join(Some(a), Some(b)).expect("joined");
        assert!(both.covers(1) && both.covers(3));
        let _ = tx_a.send(());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!both.is_done());
        let _ = tx_b.send(());
        tokio::time::timeout(Duration::from_secs(5), both.wait())
            .await
            .expect("done");
    }
}
