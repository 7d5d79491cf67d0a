//! [`Redlock`]: the client, and [`Acquire`]: one acquisition request.

use std::collections::HashSet;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tracing::Instrument;

use crate::builder::RedlockBuilder;
use crate::error::{ConfigError, Error};
use crate::lock::{Granted, Lock, LockHandle};
use crate::node::{Command, Node, NodeStatus, ReleaseMode};
use crate::queue::{QueueGuard, Waiter};
use crate::quorum::{Fanout, InFlight, OpKind, Pending, Target, Until, majority};
use crate::retry::RetryPolicy;
use crate::server_clock::ServerClock;
use crate::value::random_value;
use crate::wake::{Subscription, Wakeups};
use crate::watchdog::Watchdog;

/// The longest TTL accepted: 30 days.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The fixed part of the clock-drift allowance (the reference algorithm's 2 ms).
const DRIFT_FIXED: Duration = Duration::from_millis(2);

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

/// Configuration and nodes, shared by the client, its locks and their background tasks.
pub(crate) struct Shared {
    pub(crate) nodes: Vec<Node>,
    pub(crate) node_timeout: Duration,
    pub(crate) key_prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) drift_factor: f64,
    pub(crate) fencing: bool,
    /// The longest TTL allowed, with the restart quarantine on (`None` when off).
    pub(crate) max_ttl: Option<Duration>,
    /// Wake-on-release subscribers (`None` when switched off).
    pub(crate) wakeups: Option<Arc<Wakeups>>,
    /// Keeps watched locks alive.
    pub(crate) watchdog: Watchdog,
    /// How long a watched lock is extended at most.
    pub(crate) max_hold: Duration,
    /// How long a release reserves the lock for the next queued waiter (ms).
    pub(crate) handoff_ms: u64,
    /// The nodes' clock, for the order of the wait queue.
    pub(crate) server_clock: ServerClock,
}

impl Shared {
    pub(crate) fn quorum(&self) -> usize {
        majority(self.nodes.len())
    }

    /// The clock-drift allowance for `ttl`: `ttl * factor + 2 ms`.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        // `ttl <= MAX_TTL` and `factor <= 0.25` are checked before, so this cannot overflow.
        ttl.mul_f64(self.drift_factor).saturating_add(DRIFT_FIXED)
    }

    /// Checks a TTL against the configuration; returns it in whole milliseconds (what
    /// Redis will apply).
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<u64, ConfigError> {
        if ttl > MAX_TTL {
            return Err(ConfigError::TtlTooLong { ttl, max: MAX_TTL });
        }
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return Err(ConfigError::ZeroTtl { ttl });
        }
        let effective = Duration::from_millis(ms);
        let drift = self.drift(effective);
        if effective <= drift {
            return Err(ConfigError::TtlNotAboveDrift { ttl, drift });
        }
        if let Some(max) = self.max_ttl
            && ttl > max
        {
            return Err(ConfigError::TtlAboveMax { ttl, max });
        }
        if self.node_timeout >= effective {
            return Err(ConfigError::TimeoutNotBelowTtl {
                timeout: self.node_timeout,
                ttl,
            });
        }
        Ok(ms)
    }

    /// Checks that the watchdog can keep a lock of `ttl`: its extension round (due a
    /// third of the TTL after the last one, taking at most one node timeout) ends
    /// before the lock's loss deadline (the TTL minus the drift allowance, twice: once
    /// for the validity, once for the deadline).
    pub(crate) fn check_watchable(&self, ttl: Duration) -> Result<(), ConfigError> {
        let period = (ttl / 3).saturating_add(self.node_timeout);
        let loss = ttl.saturating_sub(self.drift(ttl).saturating_mul(2));
        if period >= loss {
            return Err(ConfigError::ExtensionAfterLoss { ttl, period, loss });
        }
        Ok(())
    }

    /// `<prefix>{<resource>}`: the braces make a Redis Cluster hash tag, so the lock key
    /// and its fencing counter live in the same slot.
    pub(crate) fn key(&self, resource: &str) -> String {
        let mut key = String::with_capacity(self.key_prefix.len() + resource.len() + 2);
        key.push_str(&self.key_prefix);
        key.push('{');
        key.push_str(resource);
        key.push('}');
        key
    }

    /// `<prefix>{<resource>}:fence`: the resource's fencing counter.
    pub(crate) fn fence_key(&self, resource: &str) -> String {
        let mut key = self.key(resource);
        key.push_str(":fence");
        key
    }
}

impl Redlock {
    /// Starts building a client.
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::default()
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Locks `resource`, retrying by the configured policy; `.await` it, optionally after
    /// setting [`ttl`](Acquire::ttl) or [`retry`](Acquire::retry).
    ///
    /// The returned [`Lock`] is valid for [`Lock::validity`] (the TTL minus the time
    /// acquiring took and the drift allowance). Release it with [`Lock::release`];
    /// dropping it releases in the background.
    pub fn lock(&self, resource: impl Into<String>) -> Acquire<'_> {
        Acquire::new(self, vec![resource.into()])
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
        Acquire::new(self, resources.into_iter().map(Into::into).collect())
    }

    /// Runs `work` while holding `resource`: takes the lock (retrying by the client's
    /// policy), keeps it alive with the watchdog ([`Lock::auto_extend`]) for as long as
    /// `work` runs, then releases it and returns `work`'s output.
    ///
    /// If the lock is lost meanwhile, `work` is dropped (cancelled at its current
    /// `.await`) at once and [`Error::Lost`] returned: the protected work never goes on
    /// without the lock. `work` gets a [`LockHandle`] (fencing token, validity).
    ///
    /// ```no_run
    /// # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
    /// use std::time::Duration;
    ///
    /// let report = redlock
    ///     .with_lock("nightly-report", Duration::from_secs(10), |lock| async move {
    ///         // ... long work, far beyond the TTL: the watchdog extends the lock ...
    ///         format!("done under token {:?}", lock.fencing_token())
    ///     })
    ///     .await?;
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
    ) -> Result<T, Error>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut lock = self.lock(resource).ttl(ttl).await?;
        lock.auto_extend();
        let outcome = tokio::select! {
            biased;
            () = lock.lost() => None,
            output = work(lock.handle()) => Some(output),
        };
        match outcome {
            Some(output) => {
                let _ = lock.release().await;
                Ok(output)
            }
            None => Err(lock.lost_error()),
        }
    }

    /// Extension rounds the watchdog has sent so far: each is one pipeline per node,
    /// carrying every watched lock that was due (for monitoring and benchmarks).
    pub fn watchdog_rounds(&self) -> u64 {
        self.shared
            .watchdog
            .rounds
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.shared.nodes.len()
    }

    /// Nodes needed for a majority: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.shared.quorum()
    }

    /// The longest TTL a lock may ask for ([`RedlockBuilder::max_ttl`]); [`MAX_TTL`] when
    /// the restart quarantine is off.
    pub fn max_ttl(&self) -> Duration {
        self.shared.max_ttl.unwrap_or(MAX_TTL)
    }

    /// The nodes' addresses (no credentials), in configuration order.
    pub fn node_names(&self) -> Vec<&str> {
        self.shared.nodes.iter().map(Node::name).collect()
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
        let timeout = self.shared.node_timeout;
        futures_util::future::join_all(self.shared.nodes.iter().map(|n| n.status(timeout))).await
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

    /// The TTL used when a lock call gives none.
    pub fn default_ttl(&self) -> Duration {
        self.shared.default_ttl
    }

    /// The clock-drift allowance subtracted from a lock of this TTL.
    pub fn drift_for(&self, ttl: Duration) -> Duration {
        self.shared.drift(ttl)
    }
}

/// A lock request: set options, then `.await` it. Created by [`Redlock::lock`],
/// [`Redlock::try_lock`] and [`Redlock::lock_many`].
///
/// Dropping the future while it runs (a timeout, a `select!`, a client that went away)
/// leaves nothing behind: whatever the attempt in flight had set is released in the
/// background, after the in-flight commands.
#[must_use = "an Acquire does nothing until awaited"]
#[derive(Debug)]
pub struct Acquire<'a> {
    redlock: &'a Redlock,
    resources: Vec<String>,
    ttl: Option<Duration>,
    retry: Option<RetryPolicy>,
    fencing: Option<bool>,
}

impl<'a> Acquire<'a> {
    fn new(redlock: &'a Redlock, resources: Vec<String>) -> Self {
        Self {
            redlock,
            resources,
            ttl: None,
            retry: None,
            fencing: None,
        }
    }

    /// Hand out a fencing token with this lock (default: the client's setting); see
    /// [`Lock::fencing_token`].
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = Some(on);
        self
    }

    /// The lock's TTL (default: the client's).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The retry policy for this request (default: the client's).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    async fn run(self) -> Result<Lock, Error> {
        let shared = Arc::clone(&self.redlock.shared);
        let ttl = self.ttl.unwrap_or(shared.default_ttl);
        let retry = self.retry.unwrap_or(shared.retry);
        let ttl_ms = shared.check_ttl(ttl)?;
        retry.validate()?;
        check_resources(&self.resources)?;
        let keys: Vec<String> = self.resources.iter().map(|r| shared.key(r)).collect();
        let fence_keys: Vec<String> = if self.fencing.unwrap_or(shared.fencing) {
            self.resources.iter().map(|r| shared.fence_key(r)).collect()
        } else {
            Vec::new()
        };
        let ttl = Duration::from_millis(ttl_ms);

        let started = Instant::now();
        let mut attempts: u32 = 0;
        let mut subscription: Option<Subscription> = None;
        // This request's place in the wait queue, once it waits (one resource only).
        let mut queue: Option<QueueGuard> = None;
        // A request that will not wait (one attempt, as `try_lock`) does not queue, and
        // takes a lock that a release is handing over to a queued waiter.
        let one_shot = retry.max_attempts() == Some(1);
        // A key this client has just waited for is likely still contended: join the
        // queue with the first attempt rather than the second.
        if let (Some(wakeups), Some(key), false) = (&shared.wakeups, keys.first(), one_shot)
            && wakeups.recently_waited(key)
        {
            (subscription, queue) = join_queue(&shared, &keys, &retry).await;
        }
        loop {
            attempts = attempts.saturating_add(1);
            let target = Arc::new(Target {
                keys: keys.clone(),
                fence_keys: fence_keys.clone(),
                value: random_value(),
                handoff_ms: shared.handoff_ms,
                waiter: queue.as_ref().and_then(QueueGuard::waiter).cloned(),
                barge: one_shot,
            });
            let failure = match attempt(&shared, target, ttl).await {
                Ok((granted, refused)) => {
                    if let Some(queue) = &mut queue {
                        queue.granted(refused);
                    }
                    tracing::debug!(
                        attempts,
                        elapsed_us = started.elapsed().as_micros() as u64,
                        validity_ms = granted
                            .valid_until
                            .saturating_duration_since(Instant::now())
                            .as_millis() as u64,
                        token = granted.token,
                        "acquired"
                    );
                    return Ok(Lock::new(shared, self.resources, ttl, attempts, granted));
                }
                Err(failure) => failure,
            };
            tracing::debug!(attempts, ?failure, "attempt failed");
            // Nodes that refuse for good (missing permission, bad credentials) do not
            // come round by retrying: say so at once.
            let delay = if failure.hopeless(&shared) {
                None
            } else {
                retry.next_delay(attempts, started.elapsed())
            };
            match delay {
                Some(delay) => match (&subscription, &queue, &failure) {
                    (Some(subscription), _, _) => {
                        subscription
                            .wait(delay, retry.wake_jitter(), shared.quorum())
                            .await;
                    }
                    // Busy: from now on, wait in the queue. Listening, take a place in
                    // the queues (without an attempt) and look whether the key is still
                    // held on a majority: if not (released before we listened), retry at
                    // once; if so, the next release hands it over to us or wakes us. A
                    // lost attempt itself never makes anyone retry at once: on a bare
                    // majority, that would spin.
                    (None, None, AttemptFailure::Taken { .. }) => {
                        (subscription, queue) = join_queue(&shared, &keys, &retry).await;
                        if !join_and_look(&shared, &keys, queue.as_ref()).await {
                            match &subscription {
                                Some(subscription) => {
                                    subscription
                                        .wait(delay, retry.wake_jitter(), shared.quorum())
                                        .await;
                                }
                                None => tokio::time::sleep(delay).await,
                            }
                        }
                    }
                    _ => tokio::time::sleep(delay).await,
                },
                None => {
                    let retry_after = match failure {
                        AttemptFailure::Taken { .. } => time_until_free(&shared, &keys).await,
                        _ => None,
                    };
                    let resource = self.resources.into_iter().next().unwrap_or_default();
                    let err = failure.into_error(resource, &shared, attempts, retry_after);
                    tracing::debug!(attempts, error = %err, "giving up");
                    return Err(err);
                }
            }
        }
    }
}

impl<'a> IntoFuture for Acquire<'a> {
    type Output = Result<Lock, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<Lock, Error>> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        let span = tracing::debug_span!(
            "redlock.acquire",
            resource = %self.resources.first().map(String::as_str).unwrap_or(""),
            resources = self.resources.len(),
        );
        Box::pin(self.run().instrument(span))
    }
}

/// Takes a place in the wait queues of `keys` (see `queue.rs`), listening for releases
/// if this client can (wake on release on, a node's subscriber answering). A waiter that
/// cannot listen queues all the same, so that every client gets its turn in a bounded
/// time, but a hand-over to it is reserved until its next timed attempt (its longest
/// retry delay and a node timeout) instead of the short hand-over time: it will not hear
/// of it before.
async fn join_queue(
    shared: &Arc<Shared>,
    keys: &[String],
    retry: &RetryPolicy,
) -> (Option<Subscription>, Option<QueueGuard>) {
    let since_ms = shared.server_clock.now_ms(shared).await;
    if let Some(wakeups) = &shared.wakeups {
        let handoff = Duration::from_millis(shared.handoff_ms);
        let waiter = Waiter::new(
            wakeups.client(),
            retry.max_delay(),
            shared.node_timeout,
            handoff,
            since_ms,
        );
        // The keys' channels (deletions) and this client's (hand-overs to its waiters).
        let mut channels = keys.to_vec();
        channels.push(crate::wake::client_channel(wakeups.client()));
        let subscription = wakeups
            .subscribe(&channels, Some(waiter.id.clone()), shared.node_timeout)
            .await;
        if subscription.listening() {
            let queue = QueueGuard::new(shared, keys, waiter);
            return (Some(subscription), Some(queue));
        }
    }
    let until_next_attempt = retry.max_delay().saturating_add(shared.node_timeout);
    let waiter = Waiter::new(
        &crate::value::random_value(),
        retry.max_delay(),
        shared.node_timeout,
        until_next_attempt,
        since_ms,
    );
    (None, Some(QueueGuard::new(shared, keys, waiter)))
}

fn check_resources(resources: &[String]) -> Result<(), ConfigError> {
    if resources.is_empty() || resources.iter().any(String::is_empty) {
        return Err(ConfigError::EmptyResource);
    }
    if resources.len() > 1 {
        let mut seen = HashSet::with_capacity(resources.len());
        for resource in resources {
            if !seen.insert(resource.as_str()) {
                return Err(ConfigError::DuplicateResource {
                    resource: resource.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Why one attempt failed.
#[derive(Debug)]
enum AttemptFailure {
    /// A majority said yes, but after the validity had run out.
    TooSlow,
    /// Enough nodes hold someone else's value that no majority is possible.
    Taken { nodes: Vec<String> },
    /// Too many nodes failed.
    Unreachable { failures: Vec<crate::NodeFailure> },
}

impl AttemptFailure {
    /// So many nodes refused for good that no retry can reach a majority.
    fn hopeless(&self, shared: &Shared) -> bool {
        let Self::Unreachable { failures } = self else {
            return false;
        };
        let permanent = failures.iter().filter(|f| f.cause.is_permanent()).count();
        permanent > shared.nodes.len() - shared.quorum()
    }

    fn into_error(
        self,
        resource: String,
        shared: &Shared,
        attempts: u32,
        retry_after: Option<Duration>,
    ) -> Error {
        let total = shared.nodes.len();
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
                needed: shared.quorum(),
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
async fn join_and_look(shared: &Shared, keys: &[String], queue: Option<&QueueGuard>) -> bool {
    let Some(waiter) = queue.and_then(QueueGuard::waiter) else {
        return false;
    };
    let queued = std::sync::atomic::AtomicBool::new(false);
    let command = Command::new(crate::node::Op::JoinQueue { keys, waiter });
    let mut asks: FuturesUnordered<_> = shared
        .nodes
        .iter()
        .map(|node| node.run(&command, shared.node_timeout, &queued))
        .collect();
    let mut tally = crate::quorum::Tally::new(shared.nodes.len());
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
/// `None` when fewer than a majority answer within the node timeout.
async fn time_until_free(shared: &Shared, keys: &[String]) -> Option<Duration> {
    let queued = std::sync::atomic::AtomicBool::new(false);
    let command = Command::new(crate::node::Op::Remaining { keys });
    let asks = shared
        .nodes
        .iter()
        .map(|node| node.run(&command, shared.node_timeout, &queued));
    let replies = futures_util::future::join_all(asks).await;
    let mut remaining: Vec<u64> = replies.into_iter().filter_map(Result::ok).collect();
    remaining.sort_unstable();
    remaining
        .get(shared.quorum().checked_sub(1)?)
        .map(|ms| Duration::from_millis(*ms))
}

/// One attempt: fan out, count, and on failure release everywhere before returning.
///
/// On success, also returns the nodes that have not said yes (a queued waiter's attempt
/// joins or stays in their queues).
async fn attempt(
    shared: &Arc<Shared>,
    target: Arc<Target>,
    ttl: Duration,
) -> Result<(Granted, Vec<usize>), AttemptFailure> {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    // The Redlock rule: validity counts from the moment before the first command.
    let start = Instant::now();
    let valid_until = start
        .checked_add(ttl.saturating_sub(shared.drift(ttl)))
        .unwrap_or(start);
    let fanout = Fanout::start(shared, &target, OpKind::Acquire { ttl_ms }, None);
    let mut guard = AttemptGuard {
        shared: Arc::clone(shared),
        target,
        fanout: Some(fanout),
    };
    let tally = guard.fanout_mut().until_decided().await;
    let mut token = None;
    let mut fence_in_flight = None;
    if tally.won() && !guard.target.fence_keys.is_empty() {
        let target = Arc::clone(&guard.target);
        match raise_fence(shared, &target, guard.fanout_mut()).await {
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
    if tally.won() && Instant::now() < valid_until {
        let (target, fanout) = guard.disarm();
        // Where we have not said yes yet, our attempt may (re)join the queue: leave it
        // there (after the in-flight attempt, on the same connection).
        let granted_by = fanout.nodes_answering(true);
        let refused = (0..shared.nodes.len())
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
        if tally.won() {
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
    shared: &Arc<Shared>,
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
    let others: Vec<usize> = (0..shared.nodes.len())
        .filter(|i| !at_token.contains(i))
        .collect();
    if others.is_empty() {
        return Ok((token, None));
    }
    let mut raise = Fanout::start(shared, target, OpKind::RaiseFence { token }, Some(&others));
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
    shared: Arc<Shared>,
    target: Arc<Target>,
    /// `None` once disarmed or cleaned up.
    fanout: Option<Fanout>,
}

impl AttemptGuard {
    fn fanout_mut(&mut self) -> &mut Fanout {
        // Only `disarm` and `clean_up` take it, and both consume the attempt's result.
        self.fanout
            .get_or_insert_with(|| Fanout::empty(&self.shared))
    }

    /// The attempt succeeded: the lock now belongs to the caller.
    fn disarm(mut self) -> (Arc<Target>, Fanout) {
        let fanout = self
            .fanout
            .take()
            .unwrap_or_else(|| Fanout::empty(&self.shared));
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
            &self.shared,
            &self.target,
            fanout.take_pending(),
            fanout.nodes_failed(),
        );
        if !answered.is_empty() {
            Fanout::start(
                &self.shared,
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
        let answered: Vec<usize> = (0..self.shared.nodes.len())
            .filter(|&i| fanout.answers.get(i).is_some_and(Option::is_some))
            .collect();
        release_after(&self.shared, &self.target, pending, answered);
    }
}

/// In the background: release `target` on `nodes` now, and on each node of `pending`
/// right after its in-flight operation completes (so the release is not overtaken by it).
/// Without a runtime (dropped outside one) the keys expire by TTL.
fn release_after(shared: &Arc<Shared>, target: &Arc<Target>, pending: Pending, nodes: Vec<usize>) {
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
        let (shared, target) = (Arc::clone(shared), Arc::clone(target));
        releases.push(Box::pin(async move {
            release_one(&shared, &target, index).await;
        }));
    }
    for in_flight in pending {
        let (shared, target) = (Arc::clone(shared), Arc::clone(target));
        releases.push(Box::pin(async move {
            let (index, _) = in_flight.await;
            release_one(&shared, &target, index).await;
        }));
    }
    handle.spawn(releases.for_each(|()| async {}));
}

async fn release_one(shared: &Shared, target: &Target, index: usize) {
    if let Some(node) = shared.nodes.get(index) {
        let queued = std::sync::atomic::AtomicBool::new(false);
        let command = Command::new(target.op(OpKind::Release {
            mode: ReleaseMode::Quiet,
        }));
        let _ = node.run(&command, shared.node_timeout, &queued).await;
    }
}
