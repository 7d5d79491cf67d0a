//! [`RwLock`]: many readers or one writer at once, cluster-wide.
//!
//! A read-write lock named `name` lives on each node under the resource `<name>/rw`:
//! the writer's key is an ordinary lock key (`<prefix>{<name>/rw}`); each reader sets a
//! key of its own next to it (`<writer's key>:reader:<value>`, with its own TTL) and
//! names it in a set (`<writer's key>:readers`). On each node a script grants:
//!
//! - a **read** lock unless the writer's key is held or a writer waits;
//! - the **write** lock unless the writer's key is held, a reader's key is alive, or an
//!   older writer waits; a refused writer takes a place in the writers' queue
//!   (`<writer's key>:writer-waiting`, ordered by when it began waiting, each place
//!   kept for a while after its last attempt; an attempt no retry follows takes none).
//!
//! Each side needs a majority, as a lock does; two majorities share a node, and no node
//! grants a write next to a live read or another write, so a writer never holds the
//! lock together with a reader or another writer (under the lock's own assumptions:
//! `docs/GUARANTEES.md`, "Read-write locks"). Readers share: any number hold it at
//! once.
//!
//! **No writer starvation**: a waiting writer stops new readers on every node where it
//! waits, so the readers drain and it gets its turn; writers take turns in the order
//! they began waiting. (The price, as in every writer-preferring lock: a steady stream
//! of writers keeps readers waiting.)
//!
//! **Wake-ups**: releasing the write lock wakes the waiting readers and writers at once;
//! releasing a read lock wakes the waiting writers (each then retries); nobody spins:
//! between wake-ups, waiters wait as the retry policy says.
//!
//! Both guards are [`Lock`]s (they dereference to one): the watchdog
//! ([`Lock::auto_extend`]), loss notification ([`Lock::lost`]), [`Lock::extend`] and
//! release on drop work as for a mutex. The write lock hands out a fencing token when
//! fencing is on (strictly greater for every new writer); a read lock has none.
//!
//! **Downgrade and upgrade.** A write lock can become a read lock without letting
//! another writer in between: [`WriteLock::downgrade`]. There is no upgrade: two readers
//! upgrading at once would each wait for the other to leave. Release the read lock, take
//! the write lock, and read again under it.
//!
//! ```no_run
//! # async fn run(redlock: redlock_core::Redlock) -> Result<(), redlock_core::Error> {
//! let index = redlock.rw_lock("search-index")?;
//!
//! // Many replicas read at once...
//! let reading = index.read().await?;
//! // ... query the index ...
//! reading.release().await?;
//!
//! // ... and a rebuild waits for them, then keeps new readers out until it is done.
//! let mut rebuild = index.write().await?;
//! rebuild.auto_extend();
//! // ... rebuild, passing rebuild.fencing_token() to the store if fencing is on ...
//! rebuild.release().await?;
//! # Ok(())
//! # }
//! ```

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use crate::attempt::{AttemptFailure, attempt, time_until_free};
use crate::client::Redlock;
use crate::clock::Instant;
use crate::error::{ArgumentError, Error};
use crate::lock::{Lock, Released};
use crate::protocol::{Command, MAX_TTL, Op, RwKeys, WaitingWriter};
use crate::quorum::{Mode, Target};
use crate::retry::RetryPolicy;
use crate::shared::Shared;
use crate::telemetry::{self, RwSide};
use crate::value::{lock_value, random_value};
use crate::wake::Subscription;

/// Many readers or one writer at once, across every client of the nodes: see the
/// [module docs](crate::rwlock). Made by [`Redlock::rw_lock`]; cheap to clone.
#[derive(Debug, Clone)]
pub struct RwLock {
    redlock: Redlock,
    name: String,
    keys: Arc<RwKeys>,
    ttl: Option<Duration>,
    retry: Option<RetryPolicy>,
    fencing: Option<bool>,
}

/// A held read lock of an [`RwLock`]: a [`Lock`] (it dereferences to one) on the
/// reader's own key. Dropped, it is released in the background.
#[derive(Debug)]
pub struct ReadLock {
    lock: Lock,
    _held: telemetry::Counted,
}

/// The held write lock of an [`RwLock`]: a [`Lock`] (it dereferences to one) on the
/// writer's key, with a fencing token if fencing is on. Dropped, it is released in the
/// background.
#[derive(Debug)]
pub struct WriteLock {
    lock: Lock,
    keys: Arc<RwKeys>,
    _held: telemetry::Counted,
}

impl Redlock {
    /// A read-write lock named `name`: many readers or one writer at once, cluster-wide.
    /// It lives under the resource `<name>/rw` (see the [module docs](crate::rwlock));
    /// lock no such resource directly.
    ///
    /// # Errors
    ///
    /// [`ArgumentError::EmptyResource`] for an empty name,
    /// [`ArgumentError::ResourceTooLong`] for a name past the client's
    /// [`max_resource_len`](crate::RedlockBuilder::max_resource_len) (with the `/rw`).
    pub fn rw_lock(&self, name: impl Into<String>) -> Result<RwLock, ArgumentError> {
        let name = name.into();
        if name.is_empty() {
            return Err(ArgumentError::EmptyResource);
        }
        let resource = rw_resource(&name);
        self.shared()
            .check_resources(std::slice::from_ref(&resource))?;
        Ok(RwLock {
            keys: Arc::new(RwKeys::new(self.shared().key(&resource))),
            redlock: self.clone(),
            name,
            ttl: None,
            retry: None,
            fencing: None,
        })
    }
}

/// The resource a read-write lock named `name` lives under.
fn rw_resource(name: &str) -> String {
    format!("{name}/rw")
}

/// Which side of the lock a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Read,
    Write,
}

impl From<Side> for RwSide {
    fn from(side: Side) -> Self {
        match side {
            Side::Read => RwSide::Read,
            Side::Write => RwSide::Write,
        }
    }
}

impl RwLock {
    /// The locks' TTL (default: the client's): how long a dead holder's lock stays taken.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long and how often [`read`](Self::read) and [`write`](Self::write) wait
    /// (default: the client's retry policy; `RetryPolicy::deadline(d)` waits up to `d`).
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Whether the write lock comes with a fencing token (default: the client's
    /// setting).
    #[must_use]
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = Some(on);
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The resource it lives under: `<name>/rw`.
    pub fn resource(&self) -> String {
        rw_resource(&self.name)
    }

    /// Takes a read lock, waiting by the retry policy while a writer holds the lock or
    /// waits for it.
    ///
    /// # Errors
    ///
    /// [`Error::Taken`] when a writer kept it for as long as the policy waits; the
    /// errors of [`Redlock::lock`] otherwise (no quorum, an invalid TTL).
    pub async fn read(&self) -> Result<ReadLock, Error> {
        let lock = self.acquire(Side::Read, self.policy()).await?;
        Ok(ReadLock {
            lock,
            _held: telemetry::Counted::held_rw(RwSide::Read),
        })
    }

    /// Takes a read lock if it can be had now: one attempt, no waiting.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    pub async fn try_read(&self) -> Result<ReadLock, Error> {
        let lock = self.acquire(Side::Read, RetryPolicy::once()).await?;
        Ok(ReadLock {
            lock,
            _held: telemetry::Counted::held_rw(RwSide::Read),
        })
    }

    /// Takes the write lock, waiting by the retry policy until no reader and no other
    /// writer holds it. While it waits, new readers are refused.
    ///
    /// # Errors
    ///
    /// [`Error::Taken`] when readers or writers kept it for as long as the policy
    /// waits; the errors of [`Redlock::lock`] otherwise.
    pub async fn write(&self) -> Result<WriteLock, Error> {
        self.write_with(self.policy()).await
    }

    /// Takes the write lock if it can be had now: one attempt, no waiting (and no place
    /// left in the writers' queue).
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    pub async fn try_write(&self) -> Result<WriteLock, Error> {
        self.write_with(RetryPolicy::once()).await
    }

    async fn write_with(&self, policy: RetryPolicy) -> Result<WriteLock, Error> {
        let lock = self.acquire(Side::Write, policy).await?;
        Ok(WriteLock {
            lock,
            keys: Arc::clone(&self.keys),
            _held: telemetry::Counted::held_rw(RwSide::Write),
        })
    }

    fn policy(&self) -> RetryPolicy {
        self.retry.unwrap_or(self.redlock.shared().retry)
    }

    /// One request, counted in the metrics.
    async fn acquire(&self, side: Side, retry: RetryPolicy) -> Result<Lock, Error> {
        let started = Instant::now();
        let mut attempts = 0;
        let result = self.run(side, retry, &mut attempts).await;
        telemetry::rw_acquisition(side.into(), result.as_ref().map(drop), started.elapsed());
        result
    }

    /// The request: attempts paced by `retry`, woken by releases; `made` counts them.
    async fn run(&self, side: Side, retry: RetryPolicy, made: &mut u32) -> Result<Lock, Error> {
        let shared = self.redlock.shared_arc();
        if let Some(clash) = shared.cluster.identities.clash() {
            return Err(Error::Config(clash.clone()));
        }
        let ttl_ms = shared.check_ttl(self.ttl.unwrap_or(shared.default_ttl))?;
        let ttl = Duration::from_millis(ttl_ms);
        retry.validate()?;
        let resource = self.resource();
        let fence_keys = if side == Side::Write && self.fencing.unwrap_or(shared.fencing) {
            vec![shared.fence_key(&resource)]
        } else {
            Vec::new()
        };
        let writer = match side {
            Side::Read => None,
            Side::Write => Some(WaitingWriter {
                id: random_value(),
                since_ms: shared.server_clock.now_ms(&shared.cluster).await,
                keep_ms: keep_ms(&retry, shared.cluster.node_timeout),
            }),
        };
        // Takes the writer out of the writers' queue when the request ends, however it
        // ends: a writer that gave up must not keep readers out.
        let mut queued = writer.as_ref().map(|writer| Queued {
            shared: Arc::clone(shared),
            keys: Arc::clone(&self.keys),
            writer: writer.clone(),
            armed: false,
        });
        let started = Instant::now();
        let mut subscription: Option<Subscription> = None;
        let mut waiting: Option<telemetry::Counted> = None;
        let mut attempts: u32 = 0;
        loop {
            attempts = attempts.saturating_add(1);
            *made = attempts;
            let value = lock_value(&shared.holder);
            // An attempt after which no retry can come takes no place in the queue: a
            // writer that will not wait must not keep readers or writers out.
            let last = retry.next_delay(attempts, started.elapsed()).is_none();
            let (key, mode) = match &writer {
                None => (self.keys.reader(&value), Mode::Read(Arc::clone(&self.keys))),
                Some(writer) => (
                    self.keys.write.clone(),
                    Mode::Write {
                        rw: Arc::clone(&self.keys),
                        writer: WaitingWriter {
                            keep_ms: if last { 0 } else { writer.keep_ms },
                            ..writer.clone()
                        },
                    },
                ),
            };
            let target = Arc::new(Target {
                keys: vec![key],
                fence_keys: fence_keys.clone(),
                value,
                handoff_ms: shared.handoff_ms,
                waiter: None,
                barge: false,
                fence_step_us: shared.fence_step_us,
                mode,
            });
            let failure = match attempt(&shared.cluster, target, ttl).await {
                Ok((granted, _)) => {
                    return Ok(Lock::new(
                        Arc::clone(shared),
                        vec![self.name.clone()],
                        ttl,
                        attempts,
                        granted,
                    ));
                }
                Err(failure) => failure,
            };
            if let Some(queued) = queued.as_mut().filter(|_| !last) {
                // Refused somewhere: it may hold a place in the writers' queue there.
                queued.armed = true;
            }
            if let Some(clash) = shared.cluster.identities.clash() {
                return Err(Error::Config(clash.clone()));
            }
            let delay = if failure.hopeless(&shared.cluster) {
                None
            } else {
                retry.next_delay(attempts, started.elapsed())
            };
            let Some(delay) = delay else {
                let retry_after = match failure {
                    AttemptFailure::Taken { .. } => {
                        time_until_free(&shared.cluster, std::slice::from_ref(&self.keys.write))
                            .await
                            .filter(|after| !after.is_zero())
                    }
                    _ => None,
                };
                return Err(failure.into_error(
                    self.name.clone(),
                    &shared.cluster,
                    attempts,
                    retry_after,
                ));
            };
            waiting.get_or_insert_with(|| telemetry::Counted::waiting_rw(side.into()));
            match (&subscription, &failure, &shared.wakeups) {
                (Some(subscription), _, _) => {
                    subscription
                        .wait(delay, retry.wake_jitter(), shared.cluster.quorum())
                        .await;
                }
                // Busy: listen for releases from now on, and try again at once (a
                // release may have come before we listened).
                (None, AttemptFailure::Taken { .. }, Some(wakeups)) => {
                    let listening = wakeups
                        .subscribe(
                            std::slice::from_ref(&self.keys.write),
                            None,
                            shared.cluster.node_timeout,
                        )
                        .await;
                    if !listening.listening() {
                        tokio::time::sleep(delay).await;
                    }
                    subscription = Some(listening);
                }
                _ => tokio::time::sleep(delay).await,
            }
        }
    }
}

/// How long a node keeps a waiting writer's place after its last attempt: past its
/// longest retry delay and a node timeout (so a live writer never loses it between two
/// attempts), within the longest TTL.
fn keep_ms(retry: &RetryPolicy, node_timeout: Duration) -> u64 {
    let keep = retry
        .max_delay()
        .saturating_mul(2)
        .saturating_add(node_timeout)
        .clamp(Duration::from_millis(100), MAX_TTL);
    u64::try_from(keep.as_millis()).unwrap_or(u64::MAX)
}

/// A writer's places in the writers' queues: taken out on every node when the request
/// ends (granted, failed or dropped), in the background.
struct Queued {
    shared: Arc<Shared>,
    keys: Arc<RwKeys>,
    writer: WaitingWriter,
    /// An attempt was refused: the writer may hold a place somewhere.
    armed: bool,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // the places expire by themselves
        };
        let (shared, keys, writer) = (
            Arc::clone(&self.shared),
            Arc::clone(&self.keys),
            self.writer.clone(),
        );
        handle.spawn(async move {
            let command = Command::new(Op::LeaveWriters {
                rw: &keys,
                writer: &writer,
            });
            let queued = crate::node::Queued::new();
            let leaves = shared
                .cluster
                .nodes
                .iter()
                .map(|node| node.run(&command, shared.cluster.node_timeout, &queued));
            futures_util::future::join_all(leaves).await;
        });
    }
}

impl Deref for ReadLock {
    type Target = Lock;

    fn deref(&self) -> &Lock {
        &self.lock
    }
}

impl DerefMut for ReadLock {
    fn deref_mut(&mut self) -> &mut Lock {
        &mut self.lock
    }
}

impl ReadLock {
    /// Releases the read lock (a writer waiting for it is woken).
    ///
    /// # Errors
    ///
    /// As [`Lock::release`].
    pub async fn release(self) -> Result<Released, Error> {
        self.lock.release().await
    }

    /// The lock itself, no longer counted as a held read lock in the metrics.
    pub fn into_lock(self) -> Lock {
        self.lock
    }
}

impl Deref for WriteLock {
    type Target = Lock;

    fn deref(&self) -> &Lock {
        &self.lock
    }
}

impl DerefMut for WriteLock {
    fn deref_mut(&mut self) -> &mut Lock {
        &mut self.lock
    }
}

impl WriteLock {
    /// Releases the write lock (waiting readers and writers are woken).
    ///
    /// # Errors
    ///
    /// As [`Lock::release`].
    pub async fn release(self) -> Result<Released, Error> {
        self.lock.release().await
    }

    /// Turns the write lock into a read lock, on each node in one step: no other writer
    /// can come in between, and readers can join from then on. The read lock keeps the
    /// write lock's validity and, if the watchdog kept the write lock, the watchdog
    /// (with the same maximum hold).
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] (or [`Error::Expired`]) when a majority no longer held the write
    /// lock, [`Error::NoQuorum`] when too many nodes failed; the lock is then released
    /// everywhere, in the background.
    pub async fn downgrade(self) -> Result<ReadLock, Error> {
        let WriteLock { lock, keys, _held } = self;
        let value = lock.value().to_owned();
        let reader = Arc::new(Target {
            keys: vec![keys.reader(&value)],
            fence_keys: Vec::new(),
            value,
            handoff_ms: lock.shared().handoff_ms,
            waiter: None,
            barge: false,
            fence_step_us: lock.shared().fence_step_us,
            mode: Mode::Read(keys),
        });
        let lock = lock.convert(reader).await?;
        Ok(ReadLock {
            lock,
            _held: telemetry::Counted::held_rw(RwSide::Read),
        })
    }

    /// The lock itself, no longer counted as a held write lock in the metrics.
    pub fn into_lock(self) -> Lock {
        self.lock
    }
}
