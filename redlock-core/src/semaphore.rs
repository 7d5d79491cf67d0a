//! [`Semaphore`]: at most `permits` holders at once, cluster-wide.
//!
//! A semaphore of `k` permits is `k` slots, each an ordinary Redlock lock on its own
//! resource (`<name>/permit/<i>`); a permit is one held slot. This is what makes it
//! correct over N nodes: a majority quorum does not bound a counter (with N nodes each
//! refusing past `k` grants, `k + 1` holders each granted by a majority fit whenever
//! `(k + 1) * q <= k * N`, e.g. three holders of a 2-permit semaphore on 3 nodes, each
//! granted by two), but each slot is a mutex, and `k` mutexes have at most `k` holders,
//! under the lock's own assumptions (docs/GUARANTEES.md). Every feature of a lock comes
//! with it: the watchdog, loss notification, a fencing token per slot (strictly greater
//! for every new holder of that slot), release on drop. The listing
//! ([`Redlock::locks`]) groups the slots under the semaphore
//! ([`LockListing::semaphores`](crate::LockListing::semaphores)), with its size as its
//! clients record it, and
//! [`Redlock::force_release_semaphore`] frees every permit.
//!
//! ```no_run
//! # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
//! // At most 3 calls to the partner's API at once, across every replica.
//! let partner = redlock.semaphore("partner-api", 3)?;
//! let mut permit = partner.acquire().await?;
//! permit.auto_extend(); // for a call that may outlast the TTL
//! // ... call the API, passing permit.fencing_token() to a fenced store if it writes ...
//! permit.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Acquiring
//!
//! An acquisition tries one slot, picked at random (a free slot is taken at once: an
//! uncontended permit costs one lock cycle). If it is taken, it looks at every slot in
//! one round trip per node (a `PTTL` each) and tries only those that looked free, so a
//! full semaphore costs one attempt and one look, whatever its size. When every slot is
//! busy, it waits as the retry policy says (the client's, or
//! [`retry`](Semaphore::retry)): instead of sleeping between two scans, it queues on one
//! slot, picked at random, and is woken when that slot is released (and handed it, in
//! the slot's queue order). It also listens on every other slot, marked as waited for
//! (as a queued waiter marks its key), so that the release of any of them wakes it to
//! scan again at once; at the end of the policy's delay it scans again in any case. A
//! released permit thus wakes the waiter queued on its slot, or else every waiter (each
//! after a small random delay, so that they do not all come at once), and a full
//! semaphore costs its waiters nothing between releases.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::RngExt;
use rand::seq::SliceRandom;

use std::future::IntoFuture;

use crate::attempt::{KeyState, look_at, mark_waited};
use crate::client::Redlock;
use crate::error::{ConfigError, Error, ErrorClass};
use crate::lock::{Lock, LockHandle, Released};
use crate::retry::RetryPolicy;
use crate::wake::Subscription;

/// At most [`permits`](Self::permits) holders at once, across every client of the
/// nodes: see the [module docs](crate::semaphore). Made by
/// [`Redlock::semaphore`]; cheap to clone.
#[derive(Debug, Clone)]
pub struct Semaphore {
    redlock: Redlock,
    name: String,
    permits: u32,
    ttl: Option<Duration>,
    retry: Option<RetryPolicy>,
    fencing: Option<bool>,
    /// When its size record was last written (shared by the clones).
    size_recorded: Arc<Mutex<Option<Instant>>>,
}

/// One held permit: a held slot of a [`Semaphore`], with every feature of a [`Lock`].
/// Dropped, it is released in the background (as a lock is).
#[derive(Debug)]
pub struct Permit {
    lock: Lock,
    slot: u32,
    _held: crate::telemetry::Counted,
}

impl Redlock {
    /// A semaphore of `permits` permits named `name`: at most `permits` holders at once,
    /// cluster-wide. Its slots are the resources `<name>/permit/0` to
    /// `<name>/permit/<permits - 1>`; lock no such resource directly.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroPermits`] for `permits == 0`, [`ConfigError::EmptyResource`]
    /// for an empty name.
    pub fn semaphore(
        &self,
        name: impl Into<String>,
        permits: u32,
    ) -> Result<Semaphore, ConfigError> {
        let name = name.into();
        if permits == 0 {
            return Err(ConfigError::ZeroPermits);
        }
        if name.is_empty() {
            return Err(ConfigError::EmptyResource);
        }
        Ok(Semaphore {
            redlock: self.clone(),
            name,
            permits,
            ttl: None,
            retry: None,
            fencing: None,
            size_recorded: Arc::new(Mutex::new(None)),
        })
    }
}

impl Semaphore {
    /// The permits' TTL (default: the client's): how long a dead holder's permit stays
    /// taken.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long and how often [`acquire`](Self::acquire) waits for a permit (default:
    /// the client's retry policy).
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Whether permits come with a fencing token (default: the client's setting).
    #[must_use]
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = Some(on);
        self
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The resource of slot `slot`: `<name>/permit/<slot>`.
    pub fn slot_resource(&self, slot: u32) -> String {
        format!("{}/permit/{slot}", self.name)
    }

    /// Takes a permit, waiting by the retry policy when all are taken.
    ///
    /// # Errors
    ///
    /// [`Error::Taken`] when every permit stayed taken for as long as the policy waits;
    /// the errors of [`Redlock::lock`] otherwise (no quorum, an invalid TTL).
    pub async fn acquire(&self) -> Result<Permit, Error> {
        measured(self.acquire_inner()).await
    }

    async fn acquire_inner(&self) -> Result<Permit, Error> {
        self.record_size();
        let policy = self.retry.unwrap_or(self.redlock.shared().retry);
        policy.validate()?;
        let started = Instant::now();
        let mut attempts: u32 = 0;
        let mut waiting = None;
        loop {
            attempts = attempts.saturating_add(1);
            let busy = match self.scan().await {
                Ok(permit) => return Ok(permit),
                Err(error) if matches!(error.class(), ErrorClass::Contended { .. }) => error,
                Err(error) => return Err(error),
            };
            let Some(wait) = policy.next_delay(attempts, started.elapsed()) else {
                return Err(busy);
            };
            waiting.get_or_insert_with(crate::telemetry::Counted::waiting_permit);
            // Queue on one slot for the delay: woken (and handed the slot) when it is
            // released. Listening on every slot (marked as waited for, so that their
            // releases publish), the release of any other slot ends the wait too: then
            // scan again. Without wake-ups, the next scan finds it.
            let slot = rand::rng().random_range(0..self.permits);
            let queued = self
                .request(slot)
                .retry(RetryPolicy::deadline(wait).with_delay(policy.base_delay(), policy.jitter()))
                .into_future();
            let outcome = match self.listen().await {
                Some(listening) => {
                    let quorum = self.redlock.shared().cluster.quorum();
                    tokio::select! {
                        result = queued => Some(result),
                        () = listening.wait(wait, policy.wake_jitter(), quorum) => None,
                    }
                }
                None => Some(queued.await),
            };
            match outcome {
                Some(Ok(lock)) => return Ok(Permit::new(lock, slot)),
                Some(Err(error)) if matches!(error.class(), ErrorClass::Contended { .. }) => {}
                Some(Err(error)) => return Err(error),
                // Another slot was released.
                None => {}
            }
        }
    }

    /// Takes `n` permits together, waiting by the retry policy until `n` are free at
    /// once. A scan that finds fewer gives back what it took before it waits (it never
    /// holds some while waiting for more, so two callers cannot block each other), so a
    /// caller asking for many permits can wait longer than callers asking for one.
    /// While it waits, a release of any slot makes it look at the slots again (one
    /// round trip, no attempt), and it tries again at once when `n` look free: each
    /// try counts as an attempt of the policy, but a release that frees too few does
    /// not use one up.
    ///
    /// # Errors
    ///
    /// [`ConfigError::TooManyPermits`] (as [`Error::Config`]) for `n` above
    /// [`permits`](Self::permits) or `n == 0`; [`Error::Taken`] when `n` permits were
    /// never free at once for as long as the policy waits; the errors of
    /// [`Redlock::lock`].
    pub async fn acquire_many(&self, n: u32) -> Result<Vec<Permit>, Error> {
        measured(self.acquire_many_inner(n)).await
    }

    async fn acquire_many_inner(&self, n: u32) -> Result<Vec<Permit>, Error> {
        self.record_size();
        if n == 0 || n > self.permits {
            return Err(Error::Config(ConfigError::TooManyPermits {
                asked: n,
                permits: self.permits,
            }));
        }
        let policy = self.retry.unwrap_or(self.redlock.shared().retry);
        policy.validate()?;
        let started = Instant::now();
        let mut attempts: u32 = 0;
        let mut waiting = None;
        loop {
            attempts = attempts.saturating_add(1);
            let (free, soonest) = self.look().await;
            let tried = free.len() >= n as usize;
            let busy = if tried {
                match self.take_many(free, soonest, n).await {
                    Ok(permits) => return Ok(permits),
                    Err(error) if matches!(error.class(), ErrorClass::Contended { .. }) => error,
                    Err(error) => return Err(error),
                }
            } else {
                self.busy(soonest)
            };
            let Some(wait) = policy.next_delay(attempts, started.elapsed()) else {
                return Err(busy);
            };
            waiting.get_or_insert_with(crate::telemetry::Counted::waiting_permit);
            // After a try that lost its race, only a release ends the wait early: a
            // look would find the same free slots, and trying again at once would spin.
            self.wait_for_many(n, wait, &policy, !tried).await;
        }
    }

    /// Waits `wait` for `n` permits to be free at once. Listening on every slot (marked
    /// as waited for), it looks at the slots again at each release, without an
    /// attempt, and ends the wait early once `n` look free, so that the caller's next
    /// attempt comes at once. A look costs one round trip and takes nothing, so
    /// waiters woken together do not collide, and the attempts stay paced by the
    /// releases and the policy. `look_first`: also look once the slots are marked (a
    /// slot released before its mark published nothing). Without wake-ups, it sleeps
    /// `wait`.
    async fn wait_for_many(&self, n: u32, wait: Duration, policy: &RetryPolicy, look_first: bool) {
        let since = Instant::now();
        let Some(listening) = self.listen().await else {
            tokio::time::sleep(wait).await;
            return;
        };
        let quorum = self.redlock.shared().cluster.quorum();
        let mut look = look_first;
        loop {
            if look && self.look().await.0.len() >= n as usize {
                return;
            }
            look = true;
            let left = wait.saturating_sub(since.elapsed());
            if left.is_zero() {
                return;
            }
            listening
                .wait(left, policy.wake_jitter().min(left), quorum)
                .await;
            if since.elapsed() >= wait {
                return;
            }
            // Slots taken since the last mark are not marked yet.
            self.mark().await;
        }
    }

    /// One attempt on each of the `free` slots, in their order, until `n` are taken; on
    /// fewer, gives them back (awaited) and answers the busy error (`soonest`: when the
    /// first held slot ends, as the look saw).
    async fn take_many(
        &self,
        free: Vec<u32>,
        soonest: Option<Duration>,
        n: u32,
    ) -> Result<Vec<Permit>, Error> {
        let mut held = Vec::with_capacity(n as usize);
        for slot in free {
            if held.len() == n as usize {
                break;
            }
            match self.request(slot).retry(RetryPolicy::once()).await {
                Ok(lock) => held.push(Permit::new(lock, slot)),
                Err(error) if matches!(error.class(), ErrorClass::Contended { .. }) => {}
                Err(error) => {
                    give_back(held).await;
                    return Err(error);
                }
            }
        }
        if held.len() == n as usize {
            return Ok(held);
        }
        give_back(held).await;
        Err(self.busy(soonest))
    }

    /// Listens for the release of any slot: subscribed to every slot's channel, then
    /// every held slot marked as waited for on every node. `None` without wake-ups
    /// (turned off, or no node's subscriber answering).
    async fn listen(&self) -> Option<Subscription> {
        let shared = self.redlock.shared();
        let wakeups = shared.wakeups.as_ref()?;
        let keys = self.slot_keys();
        let subscription = wakeups
            .subscribe(&keys, None, shared.cluster.node_timeout)
            .await;
        if !subscription.listening() {
            return None;
        }
        self.mark().await;
        Some(subscription)
    }

    /// Marks every held slot as waited for on every node, so that its release publishes.
    async fn mark(&self) {
        let shared = self.redlock.shared();
        let keys = self.slot_keys();
        mark_waited(&shared.cluster, &keys).await;
    }

    /// The slots that look free now (see `attempt::look_at`: one round trip), in random
    /// order, and the soonest end among the held ones. When too few nodes answer, every
    /// slot (the attempts will say what is wrong).
    async fn look(&self) -> (Vec<u32>, Option<Duration>) {
        let shared = self.redlock.shared();
        let keys = self.slot_keys();
        let (mut free, mut soonest) = (Vec::new(), None);
        match look_at(&shared.cluster, &keys).await {
            Some(states) => {
                for (slot, state) in (0..).zip(states) {
                    match state {
                        KeyState::Free => free.push(slot),
                        KeyState::Held(Some(after)) => {
                            soonest = Some(soonest.map_or(after, |s: Duration| s.min(after)));
                        }
                        KeyState::Held(None) => {}
                    }
                }
            }
            None => free = (0..self.permits).collect(),
        }
        free.shuffle(&mut rand::rng());
        (free, soonest)
    }

    /// Every slot's lock key, in slot order.
    fn slot_keys(&self) -> Vec<String> {
        let shared = self.redlock.shared();
        (0..self.permits)
            .map(|slot| shared.key(&self.slot_resource(slot)))
            .collect()
    }

    /// The error of a semaphore whose permits are all taken; `retry_after`: when the
    /// first of them ends, if known.
    fn busy(&self, retry_after: Option<Duration>) -> Error {
        Error::Taken {
            resource: self.name.clone(),
            nodes: Vec::new(),
            total: self.redlock.node_count(),
            attempts: 1,
            retry_after,
        }
    }

    /// Takes a permit if one is free now: one attempt per slot, no waiting.
    ///
    /// # Errors
    ///
    /// [`Error::Taken`] when every permit is taken; the errors of [`Redlock::lock`].
    pub async fn try_acquire(&self) -> Result<Permit, Error> {
        self.record_size();
        measured(self.scan()).await
    }

    /// Records the number of permits on the nodes for operators
    /// (`<prefix>{<name>/permit}:size`, read by [`Redlock::locks`]), on the first
    /// acquisition and at most once a day after that per semaphore (its clones
    /// included): in a background task, best effort, never delaying or failing an
    /// acquisition (without a tokio runtime, not at all).
    fn record_size(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut last = self
                .size_recorded
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < crate::inspect::SIZE_REFRESH) {
                return;
            }
            *last = Some(Instant::now());
        }
        runtime.spawn(crate::inspect::record_size(
            self.redlock.clone(),
            self.name.clone(),
            self.permits,
        ));
    }

    /// The acquisition of slot `slot`, with this semaphore's options.
    fn request(&self, slot: u32) -> crate::Acquire<'_> {
        let mut acquire = self.redlock.lock(self.slot_resource(slot));
        if let Some(ttl) = self.ttl {
            acquire = acquire.ttl(ttl);
        }
        if let Some(on) = self.fencing {
            acquire = acquire.fencing(on);
        }
        acquire
    }

    /// One attempt on a random slot (an uncontended permit: one lock cycle); if it is
    /// taken, a look at every slot (one round trip), then one attempt on each slot that
    /// looked free, until one is taken. A full semaphore costs one attempt and one look,
    /// whatever its size.
    async fn scan(&self) -> Result<Permit, Error> {
        let first = rand::rng().random_range(0..self.permits);
        let taken = match self.request(first).retry(RetryPolicy::once()).await {
            Ok(lock) => return Ok(Permit::new(lock, first)),
            Err(error) if matches!(error.class(), ErrorClass::Contended { .. }) => error,
            Err(error) => return Err(error),
        };
        if self.permits == 1 {
            return Err(taken);
        }
        let (free, soonest) = self.look().await;
        for slot in free.into_iter().filter(|&slot| slot != first) {
            match self.request(slot).retry(RetryPolicy::once()).await {
                Ok(lock) => return Ok(Permit::new(lock, slot)),
                Err(error) if matches!(error.class(), ErrorClass::Contended { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        let soonest = match (soonest, retry_after(&taken)) {
            (Some(a), b) => Some(a.min(b)),
            (None, Duration::MAX) => None,
            (None, b) => Some(b),
        };
        Err(self.busy(soonest))
    }
}

/// Releases `permits`, each in turn (a failed release ends at the permit's TTL).
async fn give_back(permits: Vec<Permit>) {
    for permit in permits {
        let slot = permit.slot;
        if let Err(error) = permit.release().await {
            tracing::debug!(slot, %error, "a permit given back after a partial acquisition failed to release: it ends at its TTL");
        }
    }
}

fn retry_after(error: &Error) -> Duration {
    match error.class() {
        ErrorClass::Contended {
            retry_after: Some(after),
        } => after,
        _ => Duration::MAX,
    }
}

/// A permit request, counted in the metrics.
async fn measured<T>(
    request: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let started = Instant::now();
    let result = request.await;
    crate::telemetry::permit_acquisition(result.as_ref().map(drop), started.elapsed());
    result
}

impl Permit {
    fn new(lock: Lock, slot: u32) -> Self {
        Self {
            lock,
            slot,
            _held: crate::telemetry::Counted::held_permit(),
        }
    }

    /// Which slot it holds (0 to `permits - 1`).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's lock.
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The slot's fencing token, if taken with one: strictly greater for every new
    /// holder of this slot (tokens of different slots are unrelated).
    pub fn fencing_token(&self) -> Option<u64> {
        self.lock.fencing_token()
    }

    /// How long it is still valid for.
    pub fn validity(&self) -> Duration {
        self.lock.validity()
    }

    /// A handle for the protected work: validity, loss, fencing token.
    pub fn handle(&self) -> LockHandle {
        self.lock.handle()
    }

    /// Completes when the permit is lost (the watchdog could not extend it in time).
    pub async fn lost(&self) {
        self.lock.lost().await;
    }

    /// Lets the watchdog extend the permit while it is held (see [`Lock::auto_extend`]).
    pub fn auto_extend(&mut self) {
        self.lock.auto_extend();
    }

    /// As [`auto_extend`](Self::auto_extend), for at most `max_hold` after the
    /// acquisition.
    pub fn auto_extend_for(&mut self, max_hold: Duration) {
        self.lock.auto_extend_for(max_hold);
    }

    /// Extends it to `ttl` from now (see [`Lock::extend`]).
    ///
    /// # Errors
    ///
    /// As [`Lock::extend`].
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        self.lock.extend(ttl).await
    }

    /// Gives the permit back (and hands it to a waiter queued on its slot).
    ///
    /// # Errors
    ///
    /// As [`Lock::release`].
    pub async fn release(self) -> Result<Released, Error> {
        self.lock.release().await
    }
}
