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
//! ([`LockListing::semaphores`](crate::inspect::LockListing::semaphores)), with its size as its
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
//! uncontended permit costs one lock cycle). If it is taken, it looks at the slots (a
//! `PTTL` each, 256 slots per round trip to each node, from a random one) and
//! tries those that looked free as it goes, so that it stops at the first free slot it
//! takes; a full semaphore costs one attempt and one look at every slot.
//! [`acquire_many`](Semaphore::acquire_many) looks until it has seen enough free slots,
//! and no further. No call builds a key per slot beyond those it looks at: a call's
//! memory stays within a chunk of keys, whatever the size (at most [`MAX_PERMITS`]).
//!
//! # Waiting
//!
//! When every slot is busy, a request waits as long as the retry policy allows (the
//! client's, or [`retry`](Semaphore::retry)): until its deadline, or for as long as its
//! attempts would have taken at its longest delay (`max_attempts - 1` delays), each
//! scan counting as an attempt (for `acquire_many`, each try). It listens for the release of any slot (subscribed to
//! every slot's channel), marks every held slot as waited for (as a
//! queued waiter marks its key: its release then publishes), and queues on one slot,
//! picked at random (woken when that slot is released, and handed it in the slot's
//! queue order). The release of any slot wakes it to look again at once; a released
//! permit thus wakes the waiter queued on its slot, or else every waiter (each after a
//! small random delay, so that they do not all come at once).
//!
//! Between releases a waiter sends nothing: once every held slot is marked, nothing can
//! free a permit unheard but a holder's TTL running out, so it looks again only when
//! the first held slot's TTL ends, and at most 5 s after its last look (for a release
//! a subscriber missed). Each wake-up costs one look at every slot (a `PTTL` per slot
//! on each node), one mark (a script reading every slot on each node), and an attempt
//! or two on the slot it queues on. When the mark finds fewer slots held
//! than the look saw (a slot taken or released in between, which publishes nothing),
//! it looks again after the policy's delay instead, as it does without wake-ups (turned
//! off, or pooled nodes).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::RngExt;
use rand::seq::SliceRandom;

use std::future::IntoFuture;

use crate::attempt::{KeyState, look_at, mark_waited};
use crate::client::Redlock;
use crate::clock::Instant;
use crate::error::{ArgumentError, Error, ErrorClass};
use crate::lock::{Lock, LockHandle, Released};
use crate::protocol::{Command, Op};
use crate::retry::RetryPolicy;
use crate::wake::Subscription;

pub use crate::protocol::MAX_PERMITS;

/// Slots looked at, or marked, in one round trip per node.
const CHUNK: u32 = 256;

/// The longest a listening waiter goes without looking at the slots when no release
/// wakes it and no holder's TTL ends: it catches a release that published nothing
/// (its slot taken and released between two marks) or that a subscriber missed.
const RESCAN: Duration = Duration::from_secs(5);

/// How long after a held slot's TTL ends a waiter looks again, so that the key is
/// gone on a majority by then.
const EXPIRY_MARGIN: Duration = Duration::from_millis(10);

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
    /// `permits` is at most [`MAX_PERMITS`]. The slot resources are resource names
    /// like any other, bounded by the client's
    /// [`max_resource_len`](crate::RedlockBuilder::max_resource_len) (by default
    /// [`DEFAULT_MAX_RESOURCE_LEN`](crate::builder::DEFAULT_MAX_RESOURCE_LEN), 512 bytes): the
    /// name may be as long as that bound less the longest slot's suffix
    /// (`/permit/<permits - 1>`): 502 bytes for up to 10 permits at the default
    /// bound, 501 for up to 100, 500 for up to 1,000, 499 up to [`MAX_PERMITS`].
    ///
    /// # Errors
    ///
    /// [`ArgumentError::ZeroPermits`] for `permits == 0`, [`ArgumentError::PermitsAboveMax`]
    /// for `permits` above [`MAX_PERMITS`], [`ArgumentError::EmptyResource`] for an empty
    /// name, [`ArgumentError::SemaphoreNameTooLong`] (with how long the name may be) for a
    /// name whose slot resources would pass the client's bound.
    pub fn semaphore(
        &self,
        name: impl Into<String>,
        permits: u32,
    ) -> Result<Semaphore, ArgumentError> {
        let name = name.into();
        if permits == 0 {
            return Err(ArgumentError::ZeroPermits);
        }
        if permits > MAX_PERMITS {
            return Err(ArgumentError::PermitsAboveMax {
                permits,
                max: MAX_PERMITS,
            });
        }
        if name.is_empty() {
            return Err(ArgumentError::EmptyResource);
        }
        let max = max_name_len(self.shared().max_resource_len, permits);
        if name.len() > max {
            return Err(ArgumentError::SemaphoreNameTooLong {
                start: crate::shared::truncated(&name, 32),
                len: name.len(),
                max,
                permits,
            });
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

/// The longest name of a semaphore of `permits` permits whose slot resources
/// (`<name>/permit/<slot>`) stay within `max_resource_len` bytes.
fn max_name_len(max_resource_len: usize, permits: u32) -> usize {
    let highest = permits.saturating_sub(1);
    let digits = highest.checked_ilog10().unwrap_or(0) as usize + 1;
    max_resource_len.saturating_sub(PERMIT.len() + digits)
}

/// What a slot resource adds to the semaphore's name, before the slot's index.
const PERMIT: &str = "/permit/";

/// A round of an acquisition that found too few permits free: the error to answer if
/// it gives up, how many slots its look saw held, and when the first of them ends.
struct Busy {
    error: Error,
    held: u32,
    soonest: Option<Duration>,
}

/// Why a round got no permit.
enum Miss {
    /// Too few were free.
    Busy(Busy),
    /// Something else (no quorum, an invalid TTL): answered as is.
    Failed(Error),
}

impl From<Miss> for Error {
    fn from(miss: Miss) -> Self {
        match miss {
            Miss::Busy(busy) => busy.error,
            Miss::Failed(error) => error,
        }
    }
}

/// What a look found: free slots (in random order, at most the number asked for and
/// the rest of the chunk that completed it), how many it saw held, and when the first
/// held one ends.
struct Looked {
    free: Vec<u32>,
    held: u32,
    soonest: Option<Duration>,
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
        format!("{}{PERMIT}{slot}", self.name)
    }

    /// Takes a permit, waiting by the retry policy when all are taken (see the
    /// [module docs](crate::semaphore#waiting) for what waiting costs).
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
        let give_up = give_up_at(&policy, started);
        let mut attempts: u32 = 0;
        let mut waiting = None;
        let mut listening: Option<Option<Subscription>> = None;
        loop {
            attempts = attempts.saturating_add(1);
            let busy = match self.scan().await {
                Ok(permit) => return Ok(permit),
                Err(Miss::Busy(busy)) => busy,
                Err(Miss::Failed(error)) => return Err(error),
            };
            let Some(delay) = policy.next_delay(attempts, started.elapsed()) else {
                return Err(busy.error);
            };
            let left = give_up.map(|at| at.saturating_duration_since(Instant::now()));
            if left.is_some_and(|left| left.is_zero()) {
                return Err(busy.error);
            }
            waiting.get_or_insert_with(crate::telemetry::Counted::waiting_permit);
            let listening = match &listening {
                Some(listening) => listening.as_ref(),
                None => listening.insert(self.listen().await).as_ref(),
            };
            // Listening (every held slot marked, so that its release publishes), wait
            // until a release, or as long as nothing can free a permit unheard (see
            // `window`); without wake-ups, the policy's delay.
            let window = match listening {
                Some(_) => {
                    let marked = self.mark().await;
                    window(marked, busy.held, busy.soonest, delay)
                }
                None => delay,
            };
            let window = left.map_or(window, |left| window.min(left));
            // Queue on one slot for the window: woken (and handed the slot) when it is
            // released. The release of any other slot ends the wait too: then scan
            // again.
            // Listening, the queued request waits for its slot's release as long as the
            // window; without wake-ups, it tries at the policy's delays.
            let (base, jitter) = match listening {
                Some(_) => (window, Duration::ZERO),
                None => (policy.base_delay(), policy.jitter()),
            };
            let slot = crate::value::rng().random_range(0..self.permits);
            let queued = self
                .request(slot)
                .retry(RetryPolicy::deadline(window).with_delay(base, jitter))
                .into_future();
            let outcome = match listening {
                Some(listening) => {
                    let quorum = self.redlock.shared().cluster.quorum();
                    tokio::select! {
                        result = queued => Some(result),
                        () = listening.wait(window, policy.wake_jitter(), quorum) => None,
                    }
                }
                None => Some(queued.await),
            };
            match outcome {
                Some(Ok(lock)) => return Ok(Permit::new(lock, slot)),
                Some(Err(error)) if matches!(error.class(), ErrorClass::Contended { .. }) => {}
                Some(Err(error)) => return Err(error),
                // Another slot was released, or the window ended.
                None => {}
            }
        }
    }

    /// Takes `n` permits together, waiting by the retry policy until `n` are free at
    /// once. A scan that finds fewer gives back what it took before it waits (it never
    /// holds some while waiting for more, so two callers cannot block each other), so a
    /// caller asking for many permits can wait longer than callers asking for one.
    /// While it waits, a release of any slot makes it look at the slots again (no
    /// attempt), and it tries again at once when `n` look free: each try counts as an
    /// attempt of the policy, but a release that frees too few does not use one up.
    ///
    /// # Errors
    ///
    /// [`ArgumentError::TooManyPermits`] (as [`Error::Argument`]) for `n` above
    /// [`permits`](Self::permits) or `n == 0`; [`Error::Taken`] when `n` permits were
    /// never free at once for as long as the policy waits; the errors of
    /// [`Redlock::lock`].
    pub async fn acquire_many(&self, n: u32) -> Result<Vec<Permit>, Error> {
        measured(self.acquire_many_inner(n)).await
    }

    async fn acquire_many_inner(&self, n: u32) -> Result<Vec<Permit>, Error> {
        self.record_size();
        if n == 0 || n > self.permits {
            return Err(Error::Argument(ArgumentError::TooManyPermits {
                asked: n,
                permits: self.permits,
            }));
        }
        let policy = self.retry.unwrap_or(self.redlock.shared().retry);
        policy.validate()?;
        let started = Instant::now();
        let give_up = give_up_at(&policy, started);
        let mut attempts: u32 = 0;
        let mut waiting = None;
        let mut listening: Option<Option<Subscription>> = None;
        loop {
            attempts = attempts.saturating_add(1);
            let looked = self.look(n).await;
            let tried = looked.free.len() >= n as usize;
            let (held, soonest) = (looked.held, looked.soonest);
            let busy = if tried {
                match self.take_many(looked.free, soonest, n).await {
                    Ok(permits) => return Ok(permits),
                    Err(error) if matches!(error.class(), ErrorClass::Contended { .. }) => error,
                    Err(error) => return Err(error),
                }
            } else {
                self.busy(soonest)
            };
            let Some(delay) = policy.next_delay(attempts, started.elapsed()) else {
                return Err(busy);
            };
            if give_up.is_some_and(|at| Instant::now() >= at) {
                return Err(busy);
            }
            waiting.get_or_insert_with(crate::telemetry::Counted::waiting_permit);
            let listening = match &listening {
                Some(listening) => listening.as_ref(),
                None => listening.insert(self.listen().await).as_ref(),
            };
            let Some(listening) = listening else {
                let left = give_up.map(|at| at.saturating_duration_since(Instant::now()));
                tokio::time::sleep(left.map_or(delay, |left| delay.min(left))).await;
                continue;
            };
            let busy = Busy {
                error: busy,
                held,
                soonest,
            };
            self.wait_for_many(listening, n, busy, delay, give_up, &policy, tried)
                .await;
        }
    }

    /// Waits for `n` permits to be free at once, listening: it marks the held slots
    /// (so that their releases publish), waits for a release or the end of the window
    /// (see `window`; after a try that lost its race, `lost`, the policy's `delay`: a
    /// look would find the same free slots, and trying again at once would spin), and
    /// at a release looks at the slots again, without an attempt, and ends the wait
    /// once `n` look free, so that the caller's next attempt comes at once. A look
    /// costs a round trip per [`CHUNK`] slots and takes nothing, so waiters woken
    /// together do not collide, and the attempts stay paced by the releases and the
    /// policy. At the end of the window it returns: the caller tries again.
    #[allow(clippy::too_many_arguments)]
    async fn wait_for_many(
        &self,
        listening: &Subscription,
        n: u32,
        busy: Busy,
        delay: Duration,
        give_up: Option<Instant>,
        policy: &RetryPolicy,
        lost: bool,
    ) {
        let quorum = self.redlock.shared().cluster.quorum();
        let (mut held, mut soonest, mut lost) = (busy.held, busy.soonest, lost);
        loop {
            let window = if lost {
                // The count is not needed: the wait is the policy's delay.
                for chunk in chunks(self.permits, 0) {
                    mark_waited(&self.redlock.shared().cluster, &self.slot_keys(&chunk)).await;
                }
                delay
            } else {
                window(self.mark().await, held, soonest, delay)
            };
            let left = give_up.map(|at| at.saturating_duration_since(Instant::now()));
            let window = left.map_or(window, |left| window.min(left));
            if window.is_zero() {
                return;
            }
            let end = Instant::now() + window;
            listening
                .wait(window, policy.wake_jitter().min(window), quorum)
                .await;
            if Instant::now() >= end {
                return;
            }
            // A release: look again.
            let looked = self.look(n).await;
            if looked.free.len() >= n as usize {
                return;
            }
            (held, soonest, lost) = (looked.held, looked.soonest, false);
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

    /// Listens for the release of any slot: subscribed to every slot's channel (a
    /// key per slot, at most [`MAX_PERMITS`], kept while it waits). `None` without
    /// wake-ups (turned off, or no node's subscriber answering).
    async fn listen(&self) -> Option<Subscription> {
        let shared = self.redlock.shared();
        let wakeups = shared.wakeups.as_ref()?;
        let slots: Vec<u32> = (0..self.permits).collect();
        let subscription = wakeups
            .subscribe(&self.slot_keys(&slots), None, shared.cluster.node_timeout)
            .await;
        subscription.listening().then_some(subscription)
    }

    /// Marks every held slot as waited for on every node, so that its release
    /// publishes ([`CHUNK`] slots per round trip, the nodes at once); answers the most
    /// slots one node found held (0 when none answered).
    async fn mark(&self) -> u32 {
        let cluster = &self.redlock.shared().cluster;
        let mut held = vec![Some(0u32); cluster.nodes.len()];
        for chunk in chunks(self.permits, 0) {
            let keys = self.slot_keys(&chunk);
            let command = Command::new(Op::Mark { keys: &keys });
            let marks = cluster.nodes.iter().map(|node| async {
                let queued = crate::node::Queued::new();
                node.run(&command, cluster.node_timeout, &queued).await
            });
            let answers = futures_util::future::join_all(marks).await;
            for (count, answer) in held.iter_mut().zip(answers) {
                *count = match (*count, answer) {
                    (Some(count), Ok(more)) => {
                        Some(count.saturating_add(u32::try_from(more).unwrap_or(u32::MAX)))
                    }
                    _ => None,
                };
            }
        }
        held.into_iter().flatten().max().unwrap_or(0)
    }

    /// Looks at the slots ([`CHUNK`] per round trip: see `attempt::look_at`), from a
    /// random one, until `n` look free or every slot was looked at. A chunk too few
    /// nodes answered about counts as free (the attempts will say what is wrong).
    async fn look(&self, n: u32) -> Looked {
        let cluster = &self.redlock.shared().cluster;
        let start = crate::value::rng().random_range(0..self.permits);
        let mut looked = Looked {
            free: Vec::new(),
            held: 0,
            soonest: None,
        };
        for chunk in chunks(self.permits, start) {
            let mut free = Vec::new();
            match look_at(cluster, &self.slot_keys(&chunk)).await {
                Some(states) => {
                    for (slot, state) in chunk.into_iter().zip(states) {
                        match state {
                            KeyState::Free => free.push(slot),
                            KeyState::Held(ends) => {
                                looked.held += 1;
                                looked.soonest = earliest(looked.soonest, ends);
                            }
                        }
                    }
                }
                None => free = chunk,
            }
            free.shuffle(&mut crate::value::rng());
            looked.free.append(&mut free);
            if looked.free.len() >= n as usize {
                break;
            }
        }
        looked
    }

    /// The lock keys of `slots`.
    fn slot_keys(&self, slots: &[u32]) -> Vec<String> {
        let shared = self.redlock.shared();
        slots
            .iter()
            .map(|&slot| shared.key(&self.slot_resource(slot)))
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
        measured(async { self.scan().await.map_err(Error::from) }).await
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
    /// taken, a look at the slots ([`CHUNK`] per round trip, from a random one), and one
    /// attempt on each slot that looked free, chunk by chunk, until one is taken. A
    /// full semaphore costs one attempt and one look at every slot.
    async fn scan(&self) -> Result<Permit, Miss> {
        let first = crate::value::rng().random_range(0..self.permits);
        let taken = match self.request(first).retry(RetryPolicy::once()).await {
            Ok(lock) => return Ok(Permit::new(lock, first)),
            Err(error) if matches!(error.class(), ErrorClass::Contended { .. }) => error,
            Err(error) => return Err(Miss::Failed(error)),
        };
        let after = retry_after(&taken);
        if self.permits == 1 {
            return Err(Miss::Busy(Busy {
                error: taken,
                held: 1,
                soonest: after,
            }));
        }
        let cluster = &self.redlock.shared().cluster;
        let (mut held, mut soonest) = (0, None);
        let start = crate::value::rng().random_range(0..self.permits);
        for chunk in chunks(self.permits, start) {
            let mut free = Vec::new();
            match look_at(cluster, &self.slot_keys(&chunk)).await {
                Some(states) => {
                    for (slot, state) in chunk.into_iter().zip(states) {
                        match state {
                            KeyState::Free => free.push(slot),
                            KeyState::Held(ends) => {
                                held += 1;
                                soonest = earliest(soonest, ends);
                            }
                        }
                    }
                }
                None => free = chunk,
            }
            free.shuffle(&mut crate::value::rng());
            for slot in free.into_iter().filter(|&slot| slot != first) {
                match self.request(slot).retry(RetryPolicy::once()).await {
                    Ok(lock) => return Ok(Permit::new(lock, slot)),
                    Err(error) if matches!(error.class(), ErrorClass::Contended { .. }) => {}
                    Err(error) => return Err(Miss::Failed(error)),
                }
            }
        }
        let soonest = earliest(soonest, after);
        Err(Miss::Busy(Busy {
            error: self.busy(soonest),
            held,
            soonest,
        }))
    }
}

/// How long a waiter listening on the slots waits before it looks again without a
/// release, when the mark found as many slots held on some node (`marked`) as its
/// last look saw held (`held`): every held slot is marked, so that its release
/// publishes and wakes it, and nothing frees a permit unheard but a holder's TTL
/// running out: until the first held slot's end (`soonest`), at most [`RESCAN`]. With
/// fewer marked (a slot taken or released between the look and the mark, whose release
/// publishes nothing), the policy's `delay`.
fn window(marked: u32, held: u32, soonest: Option<Duration>, delay: Duration) -> Duration {
    if marked < held {
        return delay;
    }
    soonest.map_or(RESCAN, |end| end.saturating_add(EXPIRY_MARGIN).min(RESCAN))
}

/// When a waiter gives up: at the policy's deadline, or once the time its attempts
/// would have taken has passed (`max_attempts - 1` times its longest delay), whichever
/// comes first; `None`: never (no bound on either).
fn give_up_at(policy: &RetryPolicy, started: Instant) -> Option<Instant> {
    let by_attempts = policy
        .max_attempts()
        .map(|n| policy.max_delay().saturating_mul(n.saturating_sub(1)));
    let budget = match (by_attempts, policy.deadline_after()) {
        (Some(a), Some(d)) => Some(a.min(d)),
        (a, d) => a.or(d),
    };
    budget.and_then(|budget| started.checked_add(budget))
}

/// The slots `0..permits` from `start` (wrapping round), in runs of at most [`CHUNK`].
fn chunks(permits: u32, start: u32) -> impl Iterator<Item = Vec<u32>> {
    (0..permits).step_by(CHUNK as usize).map(move |offset| {
        (offset..permits.min(offset.saturating_add(CHUNK)))
            .map(|i| (start + i) % permits)
            .collect()
    })
}

/// The earlier of two ends, either unknown.
fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
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

fn retry_after(error: &Error) -> Option<Duration> {
    match error.class() {
        ErrorClass::Contended { retry_after } => retry_after,
        _ => None,
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
