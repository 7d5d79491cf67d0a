//! [`Acquire`]: one lock request, from its options to a granted [`Lock`] or an error:
//! attempts (see `attempt.rs`) paced by the retry policy, wake on release and the wait
//! queue.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::attempt::{AttemptFailure, attempt, join_and_look, time_until_free};
use crate::clock::Instant;
use crate::error::Error;
use crate::lock::{Finished, Lock, LockHandle};
use crate::protocol::Waiter;
use crate::queue::QueueGuard;
use crate::quorum::{Mode, Target};
use crate::retry::RetryPolicy;
use crate::shared::Shared;
use crate::value::lock_value;
use crate::wake::Subscription;

/// A lock request: set options, then `.await` it. Created by
/// [`Redlock::lock`](crate::Redlock::lock), [`Redlock::try_lock`](crate::Redlock::try_lock)
/// and [`Redlock::lock_many`](crate::Redlock::lock_many).
///
/// Dropping the future while it runs (a timeout, a `select!`, a client that went away)
/// leaves nothing behind: whatever the attempt in flight had set is released in the
/// background, after the in-flight commands. A request goes straight into
/// `tokio::select!` (it is [`IntoFuture`]):
///
/// ```no_run
/// # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// tokio::select! {
///     lock = redlock.lock("import") => {
///         let lock = lock?;
///         // ... work under the lock ...
///         lock.release().await?;
///     }
///     () = shutdown.cancelled() => {} // the request is dropped: nothing left behind
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "an Acquire does nothing until awaited"]
pub struct Acquire<'a> {
    shared: &'a Arc<Shared>,
    resources: Vec<String>,
    ttl: Option<Duration>,
    retry: Option<RetryPolicy>,
    fencing: Option<bool>,
}

impl std::fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("resources", &self.resources)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("fencing", &self.fencing)
            .finish_non_exhaustive()
    }
}

impl<'a> Acquire<'a> {
    pub(crate) fn new(shared: &'a Arc<Shared>, resources: Vec<String>) -> Self {
        Self {
            shared,
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

    /// Takes the lock, keeps it alive with the watchdog ([`Lock::auto_extend`]) while
    /// `work` runs, then releases it; [`Finished`] holds `work`'s output and how the
    /// release went. Every option set on this request applies (TTL, retry, fencing).
    ///
    /// If the lock is lost meanwhile, `work` is dropped (cancelled at its current
    /// `.await`) at once and [`Error::Lost`] returned: the protected work never goes on
    /// without the lock. `work` gets a [`LockHandle`] (fencing token, validity).
    ///
    /// ```no_run
    /// # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
    /// use std::time::Duration;
    /// use redlock_core::RetryPolicy;
    ///
    /// let done = redlock
    ///     .lock("ledger:42")
    ///     .ttl(Duration::from_secs(5))
    ///     .retry(RetryPolicy::deadline(Duration::from_secs(2)))
    ///     .fencing(true)
    ///     .with_lock(|lock| async move { lock.fencing_token() })
    ///     .await?;
    /// assert!(done.output.is_some());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Whatever awaiting the request returns, and [`Error::Lost`].
    pub async fn with_lock<F, Fut, T>(self, work: F) -> Result<Finished<T>, Error>
    where
        F: FnOnce(LockHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut lock = self.await?;
        lock.auto_extend();
        let outcome = tokio::select! {
            biased;
            () = lock.lost() => None,
            output = work(lock.handle()) => Some(output),
        };
        match outcome {
            Some(output) => Ok(Finished {
                output,
                released: lock.release().await,
            }),
            None => Err(lock.lost_error()),
        }
    }

    /// [`run`](Self::run), counted in the metrics (see `telemetry`).
    async fn run_measured(self) -> Result<Lock, Error> {
        let started = Instant::now();
        let mut attempts = 0;
        let result = self.run(&mut attempts).await;
        crate::telemetry::acquisition(result.as_ref().map(drop), attempts, started.elapsed());
        result
    }

    /// The request itself; `made` counts its attempts as they are made.
    async fn run(self, made: &mut u32) -> Result<Lock, Error> {
        let shared = Arc::clone(self.shared);
        let ttl = self.ttl.unwrap_or(shared.default_ttl);
        let retry = self.retry.unwrap_or(shared.retry);
        if let Some(clash) = shared.cluster.identities.clash() {
            return Err(Error::Config(clash.clone()));
        }
        let ttl_ms = shared.check_ttl(ttl)?;
        retry.validate()?;
        shared.check_resources(&self.resources)?;
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
            *made = attempts;
            let target = Arc::new(Target {
                keys: keys.clone(),
                fence_keys: fence_keys.clone(),
                value: lock_value(&shared.holder),
                handoff_ms: shared.handoff_ms,
                waiter: queue.as_ref().and_then(QueueGuard::waiter).cloned(),
                barge: one_shot,
                fence_step_us: shared.fence_step_us,
                mode: Mode::Exclusive,
            });
            let failure = match attempt(&shared.cluster, target, ttl).await {
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
            // Two nodes turned out to be one server: the configuration is refused.
            if let Some(clash) = shared.cluster.identities.clash() {
                return Err(Error::Config(clash.clone()));
            }
            // Nodes that refuse for good (missing permission, bad credentials) do not
            // come round by retrying: say so at once.
            let delay = if failure.hopeless(&shared.cluster) {
                None
            } else {
                retry.next_delay(attempts, started.elapsed())
            };
            match delay {
                Some(delay) => match (&subscription, &queue, &failure) {
                    (Some(subscription), _, _) => {
                        subscription
                            .wait(delay, retry.wake_jitter(), shared.cluster.quorum())
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
                        if !join_and_look(&shared.cluster, &keys, queue.as_ref()).await {
                            match &subscription {
                                Some(subscription) => {
                                    subscription
                                        .wait(delay, retry.wake_jitter(), shared.cluster.quorum())
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
                        AttemptFailure::Taken { .. } => {
                            time_until_free(&shared.cluster, &keys).await
                        }
                        _ => None,
                    };
                    let resource = self.resources.into_iter().next().unwrap_or_default();
                    let err = failure.into_error(resource, &shared.cluster, attempts, retry_after);
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
        Box::pin(self.run_measured().instrument(span))
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
    let since_ms = shared.server_clock.now_ms(&shared.cluster).await;
    if let Some(wakeups) = &shared.wakeups {
        let handoff = Duration::from_millis(shared.handoff_ms);
        let waiter = Waiter::new(
            wakeups.client(),
            retry.max_delay(),
            shared.cluster.node_timeout,
            handoff,
            since_ms,
        );
        // The keys' channels (deletions) and this client's (hand-overs to its waiters).
        let mut channels = keys.to_vec();
        channels.push(crate::wake::client_channel(wakeups.client()));
        let subscription = wakeups
            .subscribe(
                &channels,
                Some(waiter.id.clone()),
                shared.cluster.node_timeout,
            )
            .await;
        if subscription.listening() {
            let queue = QueueGuard::new(&shared.cluster, shared.handoff_ms, keys, waiter);
            return (Some(subscription), Some(queue));
        }
    }
    let until_next_attempt = retry
        .max_delay()
        .saturating_add(shared.cluster.node_timeout);
    let waiter = Waiter::new(
        &crate::value::random_value(),
        retry.max_delay(),
        shared.cluster.node_timeout,
        until_next_attempt,
        since_ms,
    );
    (
        None,
        Some(QueueGuard::new(
            &shared.cluster,
            shared.handoff_ms,
            keys,
            waiter,
        )),
    )
}
