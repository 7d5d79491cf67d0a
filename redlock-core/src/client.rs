//! [`Redlock`]: the client.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::Acquire;
use crate::clock::Instant;
use crate::error::{Error, NodeError, NodeFailure};
use crate::lock::{Finished, LockHandle};
use crate::node::{Node, NodeStatus};
use crate::retry::RetryPolicy;
use crate::shared::Shared;

/// How often [`Redlock::wait_ready`] asks the nodes again.
const READY_POLL: Duration = Duration::from_millis(100);

/// A distributed lock client over N independent Redis masters (the Redlock algorithm;
/// N = 1 is the plain single-instance lock).
///
/// Cheap to clone (an `Arc` inside): build one per process and share it. See the
/// [crate documentation](crate) for an example.
#[derive(Clone)]
pub struct Redlock {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.node_names())
            .field("quorum", &self.quorum())
            .field("key_prefix", &self.shared.key_prefix)
            .finish()
    }
}

impl Redlock {
    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// What the client shares with its locks (for the modules that extend `Redlock`).
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    pub(crate) fn shared_arc(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Locks `resource`, retrying by the configured policy; `.await` it, optionally after
    /// setting [`ttl`](Acquire::ttl) or [`retry`](Acquire::retry).
    ///
    /// The returned [`Lock`](crate::Lock) is valid for [`Lock::validity`](crate::Lock::validity) (the TTL minus the time
    /// acquiring took and the drift allowance). Release it with [`Lock::release`](crate::Lock::release);
    /// dropping it releases in the background.
    pub fn lock(&self, resource: impl Into<String>) -> Acquire<'_> {
        Acquire::new(&self.shared, vec![resource.into()])
    }

    /// Makes exactly one attempt to lock `resource`: `Err(Error::Taken)` at once if busy.
    ///
    /// A free resource can always be try-locked, whatever the wait queue holds: `try_lock`
    /// (like any request allowed a single attempt) does not queue, and takes the lock
    /// also while a release is handing it over to a queued waiter (a hand-over reserves
    /// the lock against waiters, which would otherwise race it; a dead waiter's stale
    /// place must not make a free resource look busy). The waiter keeps its place at the
    /// head of the queue and is handed the next release. So `try_lock` can overtake the
    /// queue: to wait your turn, use [`lock`](Self::lock); a loop of `try_lock` calls is
    /// polling, and can starve queued waiters.
    pub fn try_lock(&self, resource: impl Into<String>) -> Acquire<'_> {
        self.lock(resource).retry(RetryPolicy::once())
    }

    /// Locks several resources as one lock: on each node either all of them are set or
    /// none (one script call per node), and the usual majority rule applies to that
    /// all-or-nothing vote. Release and extension cover all of them.
    pub fn lock_many<I, S>(&self, resources: I) -> Acquire<'_>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Acquire::new(
            &self.shared,
            resources.into_iter().map(Into::into).collect(),
        )
    }

    /// Runs `work` while holding `resource` with a TTL of `ttl`: a shorthand for
    /// `self.lock(resource).ttl(ttl).with_lock(work)` (see
    /// [`Acquire::with_lock`], which takes every option of a request).
    ///
    /// ```no_run
    /// # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
    /// use std::time::Duration;
    ///
    /// let done = redlock
    ///     .with_lock("nightly-report", Duration::from_secs(10), |lock| async move {
    ///         // ... long work, far beyond the TTL: the watchdog extends the lock ...
    ///         format!("done under token {:?}", lock.fencing_token())
    ///     })
    ///     .await?;
    /// println!("{}", done.output);
    /// assert!(done.released?.was_held());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Whatever [`lock`](Self::lock) returns, and [`Error::Lost`].
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: impl Into<String>,
        ttl: Duration,
        work: F,
    ) -> Result<Finished<T>, Error>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock(resource).ttl(ttl).with_lock(work).await
    }

    /// Extension rounds the watchdog has sent so far: each is one round trip per node,
    /// carrying every watched lock that was due (for monitoring and benchmarks).
    pub fn watchdog_rounds(&self) -> u64 {
        self.shared
            .watchdog
            .rounds
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.shared.cluster.nodes.len()
    }

    /// Nodes needed for a majority: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.shared.cluster.quorum()
    }

    /// The longest TTL a lock may ask for ([`RedlockBuilder::max_ttl`](crate::RedlockBuilder::max_ttl));
    /// the [`ttl_limit`](crate::RedlockBuilder::ttl_limit) when the restart quarantine
    /// is off.
    pub fn max_ttl(&self) -> Duration {
        self.shared.max_ttl.unwrap_or(self.shared.ttl_limit)
    }

    /// The nodes' addresses (no credentials), in configuration order.
    pub fn node_names(&self) -> Vec<&str> {
        self.shared.cluster.nodes.iter().map(Node::name).collect()
    }

    /// The longest resource name this client accepts, in bytes
    /// ([`RedlockBuilder::max_resource_len`](crate::RedlockBuilder::max_resource_len),
    /// by default [`DEFAULT_MAX_RESOURCE_LEN`](crate::builder::DEFAULT_MAX_RESOURCE_LEN)). Code
    /// that derives resource names from a user's string (a name plus suffixes) checks
    /// that string against the room this leaves, where the string enters.
    pub fn max_resource_len(&self) -> usize {
        self.shared.max_resource_len
    }

    /// The Redis key of `resource`'s lock: `<prefix>{<resource>}`.
    pub fn key_for(&self, resource: &str) -> String {
        self.shared.key(resource)
    }

    /// The Redis key of `resource`'s fencing counter: `<prefix>{<resource>}:fence`.
    pub fn fence_key_for(&self, resource: &str) -> String {
        self.shared.fence_key(resource)
    }

    /// Contacts every node (connecting where needed, within the per-node timeout) and
    /// reports whether it answers and whether it is in restart quarantine. Useful at
    /// start-up, in health checks, and to wait out the quarantine of fresh nodes.
    pub async fn node_status(&self) -> Vec<NodeStatus> {
        let timeout = self.shared.cluster.node_timeout;
        futures_util::future::join_all(self.shared.cluster.nodes.iter().map(|n| n.status(timeout)))
            .await
    }

    /// Whether a majority of nodes can vote right now (per [`node_status`](Self::node_status)).
    pub async fn ready(&self) -> bool {
        self.node_status()
            .await
            .iter()
            .filter(|s| s.votes())
            .count()
            >= self.quorum()
    }

    /// Waits until a majority of nodes can vote (connected, answering, out of restart
    /// quarantine), checking about every 100 ms, for at most `timeout` (plus one per-node
    /// timeout for the check under way).
    ///
    /// Call it at start-up: nodes that started less than the max TTL ago are in restart
    /// quarantine (they may have forgotten locks in a restart), so a fresh cluster
    /// refuses every lock for that long; and a node that is unreachable or misconfigured
    /// is reported here, by name, before the first request.
    ///
    /// # Errors
    ///
    /// [`Error::NotReady`], naming each node that cannot vote and why, when `timeout`
    /// passes first, or at once when so many nodes refuse for good (credentials,
    /// permissions, TLS) that no majority can form; [`Error::Config`] when two nodes
    /// turned out to be the same server.
    ///
    /// ```no_run
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let redlock = redlock_core::Redlock::builder()
    ///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
    ///     .build()?;
    /// // Up to the max TTL (10 s by default) for fresh nodes, and a little more.
    /// redlock.wait_ready(redlock.max_ttl() + Duration::from_secs(5)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let started = Instant::now();
        let cluster = &self.shared.cluster;
        loop {
            let statuses = self.node_status().await;
            if let Some(clash) = cluster.identities.clash() {
                return Err(Error::Config(clash.clone()));
            }
            let ready = statuses.iter().filter(|s| s.votes()).count();
            if ready >= self.quorum() {
                return Ok(());
            }
            let failures: Vec<NodeFailure> = statuses
                .into_iter()
                .filter(|s| !s.votes())
                .map(|s| NodeFailure {
                    node: s.node,
                    cause: match s.reachable {
                        Err(cause) => cause,
                        Ok(()) => NodeError::Quarantined(s.quarantined.unwrap_or_default()),
                    },
                })
                .collect();
            let permanent = failures.iter().filter(|f| f.cause.is_permanent()).count();
            let waited = started.elapsed();
            if waited >= timeout || permanent > cluster.nodes.len() - self.quorum() {
                return Err(Error::NotReady {
                    ready,
                    needed: self.quorum(),
                    total: cluster.nodes.len(),
                    failures,
                    waited,
                });
            }
            tokio::time::sleep((timeout - waited).min(READY_POLL)).await;
        }
    }

    /// The TTL used when a lock call gives none.
    pub fn default_ttl(&self) -> Duration {
        self.shared.default_ttl
    }

    /// The clock-drift allowance subtracted from a lock of this TTL.
    pub fn drift_for(&self, ttl: Duration) -> Duration {
        self.shared.cluster.drift(ttl)
    }
}
