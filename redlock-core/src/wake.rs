//! Wake on release: a client waiting for a busy lock retries as soon as it is released.
//!
//! The release script publishes on the lock key's channel when a lock's release deletes
//! a key that had waiters (every waiter queues, and marks the key when it does: see
//! `queue.rs`; a key without waiters is released without a word). Each `Redlock` keeps
//! at most one subscriber connection per node, owned by one listener task per node
//! (started with the first waiter), and shared by all its waiters: a waiter only
//! registers its channels and waits for a node to confirm; it spawns nothing, and a dead
//! or black-holed node costs one task and one connection attempt at a time (each bounded
//! by a timeout, with backoff), however many waiters come. A key's channel is subscribed
//! on every node when its first waiter comes, and stays subscribed for a while after its
//! last waiter leaves (so steady contention costs no subscription round trips). A node's
//! task alone decides what its connection subscribes, from the registry of channels
//! waited for: a channel wanted again while it was being unsubscribed is subscribed
//! again, and a waiter counts as listening only once a node confirmed every channel
//! registered before it. Such a release publishes on every node where the key had
//! waiters, so a waiter needs just one node to
//! listen: it waits only until the first node confirms, and slow or dead nodes never
//! hold it up. A release that hands the lock over to a queued waiter (see `queue.rs`)
//! publishes that waiter's id on its client's own channel (so no other process even
//! receives it): it alone is woken and retries at once. A release that
//! deletes the lock publishes an empty message, which wakes every waiter of the key;
//! each then retries after a small random jitter, so that one of them usually reaches a
//! majority first instead of all splitting the votes. A message that comes during a
//! waiter's own attempt is kept for it, not lost. The random retry delay stays as the
//! fallback.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::clock::Instant;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How long connecting, or one (un)subscription, may take before the subscriber
/// connection is given up as broken.
const SUBSCRIBER_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a node's task looks for idle channels at most, when none is idle.
const MIN_RECHECK: Duration = Duration::from_secs(1);

/// The pause before connecting again after a failure: doubles up to the maximum.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Runs `fut` within [`SUBSCRIBER_TIMEOUT`]; `Some` if it completed with `Ok`.
async fn within<T, E>(fut: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    tokio::time::timeout(SUBSCRIBER_TIMEOUT, fut)
        .await
        .ok()?
        .ok()
}

/// How one waiter is woken.
struct Signal {
    notify: Notify,
    /// The waiter's id in the resource's wait queue, if it is queued.
    waiter: Option<String>,
    /// How many nodes handed the lock over to this waiter since its last wait.
    handovers: AtomicUsize,
}

impl Signal {
    /// Reacts to a message on one of the waiter's keys: an empty one (a lock deleted)
    /// wakes every waiter, a waiter's id (a hand-over) wakes that waiter only.
    fn on_message(&self, payload: &[u8]) {
        if payload.is_empty() {
            self.notify.notify_one();
        } else if self.waiter.as_deref().map(str::as_bytes) == Some(payload) {
            self.handovers.fetch_add(1, Ordering::AcqRel);
            self.notify.notify_one();
        }
    }
}

/// One channel waited for.
#[derive(Default)]
struct Channel {
    waiters: HashMap<u64, Arc<Signal>>,
    /// Since when it has had no waiter.
    idle_since: Option<Instant>,
}

/// The channels waited for, and a generation that moves whenever the set changes.
struct Channels {
    map: HashMap<String, Channel>,
    generation: u64,
}

/// What the waiters and the node tasks share.
struct Registry {
    channels: Mutex<Channels>,
    /// How long a channel stays subscribed after its last waiter left.
    linger: Duration,
    /// Per node: the generation whose channels it has all subscribed (0: not listening).
    synced: Vec<AtomicU64>,
    /// Per node: tells its task that the set of channels changed.
    changed: Vec<Notify>,
    /// Told whenever a node's `synced` moves.
    progress: Notify,
}

impl Registry {
    fn channels(&self) -> MutexGuard<'_, Channels> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Some node listens on every channel registered up to `generation`.
    fn listening(&self, generation: u64) -> bool {
        self.synced
            .iter()
            .any(|s| s.load(Ordering::Acquire) >= generation)
    }

    /// Forgets channels idle for longer than the linger time (telling every node) and returns
    /// the generation and channels to subscribe, and when to look for idle ones again.
    fn snapshot(&self, now: Instant) -> (u64, HashSet<String>, Instant) {
        let mut channels = self.channels();
        let before = channels.map.len();
        let linger = self.linger;
        channels
            .map
            .retain(|_, c| c.idle_since.is_none_or(|t| now.duration_since(t) < linger));
        if channels.map.len() != before {
            channels.generation += 1;
            self.changed.iter().for_each(Notify::notify_one);
        }
        let next = channels
            .map
            .values()
            .filter_map(|c| c.idle_since)
            .min()
            .map_or(now + linger.max(MIN_RECHECK), |t| t + linger);
        let wanted = channels.map.keys().cloned().collect();
        (channels.generation, wanted, next)
    }

    /// Wakes the waiters of `channel` with `payload`.
    fn deliver(&self, channel: &str, payload: &[u8]) {
        let channels = self.channels();
        if let Some(c) = channels.map.get(channel) {
            // A stored permit if the waiter is not waiting right now.
            c.waiters
                .values()
                .for_each(|signal| signal.on_message(payload));
        }
    }

    fn set_synced(&self, node: usize, generation: u64) {
        if let Some(s) = self.synced.get(node) {
            s.store(generation, Ordering::Release);
        }
        self.progress.notify_waiters();
    }
}

/// The subscribers of one `Redlock` and the keys being waited for.
pub(crate) struct Wakeups {
    /// Node i's client (`None` for a pooled node: no wake-ups there).
    clients: Vec<Option<redis::Client>>,
    /// Node i's task is running.
    running: Vec<Arc<AtomicBool>>,
    registry: Arc<Registry>,
    next_id: AtomicU64,
    /// This client's id: hand-overs to its waiters are published on its own channel.
    client: String,
    /// Stops the node tasks when the client goes away.
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
}

/// The channel hand-overs to the waiters of client `client` are published on.
pub(crate) fn client_channel(client: &str) -> String {
    format!("redlock-wake:{client}")
}

/// A waiter's registration on some keys; unregisters when dropped.
pub(crate) struct Subscription {
    registry: Arc<Registry>,
    id: u64,
    keys: Vec<String>,
    signal: Arc<Signal>,
    /// At least one node confirmed it listens.
    listening: bool,
}

impl Wakeups {
    /// `clients[i]` is node i's client (`None` for a pooled node: no wake-ups there).
    pub(crate) fn new(clients: Vec<Option<redis::Client>>, linger: Duration) -> Self {
        let n = clients.len();
        let stop = CancellationToken::new();
        Self {
            running: (0..n).map(|_| Arc::new(AtomicBool::new(false))).collect(),
            registry: Arc::new(Registry {
                channels: Mutex::new(Channels {
                    map: HashMap::new(),
                    generation: 1,
                }),
                linger,
                synced: (0..n).map(|_| AtomicU64::new(0)).collect(),
                changed: (0..n).map(|_| Notify::new()).collect(),
                progress: Notify::new(),
            }),
            clients,
            next_id: AtomicU64::new(0),
            client: format!(
                "{:016x}",
                rand::RngExt::random::<u64>(&mut crate::value::rng())
            ),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
        }
    }

    /// This client's id (hex).
    pub(crate) fn client(&self) -> &str {
        &self.client
    }

    /// Someone of this client waits, or waited in the last few seconds, for `key`: a new
    /// request for it will likely have to wait too.
    pub(crate) fn recently_waited(&self, key: &str) -> bool {
        self.registry.channels().map.contains_key(key)
    }

    /// Registers a waiter for `keys` (`waiter`: its id in the wait queue, if queued) and
    /// waits (at most `timeout`) until one node listens on them. Spawns nothing per
    /// waiter: each node's task (started here if not running) does the subscribing.
    pub(crate) async fn subscribe(
        &self,
        keys: &[String],
        waiter: Option<String>,
        timeout: Duration,
    ) -> Subscription {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let signal = Arc::new(Signal {
            notify: Notify::new(),
            waiter,
            handovers: AtomicUsize::new(0),
        });
        let (generation, added) = {
            let mut channels = self.registry.channels();
            let mut added = false;
            for key in keys {
                let channel = channels.map.entry(key.clone()).or_insert_with(|| {
                    added = true;
                    Channel::default()
                });
                channel.waiters.insert(id, Arc::clone(&signal));
                channel.idle_since = None;
            }
            if added {
                channels.generation += 1;
            }
            (channels.generation, added)
        };
        let mut subscription = Subscription {
            registry: Arc::clone(&self.registry),
            id,
            keys: keys.to_vec(),
            signal,
            listening: false,
        };
        if self.clients.iter().all(Option::is_none) || !self.start_tasks() {
            return subscription;
        }
        if added {
            self.registry.changed.iter().for_each(Notify::notify_one);
        }
        let registry = &self.registry;
        subscription.listening = tokio::time::timeout(timeout, async {
            loop {
                let progress = registry.progress.notified();
                tokio::pin!(progress);
                progress.as_mut().enable();
                if registry.listening(generation) {
                    return;
                }
                progress.await;
            }
        })
        .await
        .is_ok();
        tracing::trace!(
            generation,
            added,
            listening = subscription.listening,
            "subscribed"
        );
        subscription
    }

    /// Starts the task of every node that has a client and none running; false without
    /// a runtime (nothing can listen then).
    fn start_tasks(&self) -> bool {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        for (node, client) in self.clients.iter().enumerate() {
            let Some(client) = client else { continue };
            let running = &self.running[node];
            if running
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            let task = NodeTask {
                node,
                client: client.clone(),
                registry: Arc::clone(&self.registry),
                _running: Running(Arc::clone(running), Arc::clone(&self.registry), node),
            };
            handle.spawn(task.run(self.stop.clone()));
        }
        true
    }
}

/// Marks a node's task stopped, and the node not listening, however the task ends
/// (the client dropped, or its runtime shut down): the next waiter starts a new one.
struct Running(Arc<AtomicBool>, Arc<Registry>, usize);

impl Drop for Running {
    fn drop(&mut self) {
        self.1.set_synced(self.2, 0);
        self.0.store(false, Ordering::Release);
    }
}

/// The one task that owns a node's subscriber connection.
struct NodeTask {
    node: usize,
    client: redis::Client,
    registry: Arc<Registry>,
    _running: Running,
}

impl NodeTask {
    async fn run(self, stop: CancellationToken) {
        let mut backoff = BACKOFF_MIN;
        loop {
            // Nothing to listen for: wait until something is.
            if self.registry.channels().map.is_empty() {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = self.registry.changed[self.node].notified() => continue,
                }
            }
            let connected = tokio::select! {
                () = stop.cancelled() => return,
                connected = self.connected() => connected,
            };
            if connected {
                backoff = BACKOFF_MIN;
            }
            self.registry.set_synced(self.node, 0);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = backoff.saturating_mul(2).min(BACKOFF_MAX);
        }
    }

    /// Opens a connection and keeps it subscribed to the registry's channels until it
    /// breaks; true if it got as far as listening.
    async fn connected(&self) -> bool {
        let Some(pubsub) = within(self.client.get_async_pubsub()).await else {
            return false;
        };
        let (mut sink, mut stream) = pubsub.split();
        let mut subscribed: HashSet<String> = HashSet::new();
        let mut listened = false;
        loop {
            let (generation, wanted, recheck) = self.registry.snapshot(Instant::now());
            let add: Vec<&String> = wanted.difference(&subscribed).collect();
            if !add.is_empty() && within(sink.subscribe(&add)).await.is_none() {
                return listened;
            }
            let remove: Vec<&String> = subscribed.difference(&wanted).collect();
            if !remove.is_empty() && within(sink.unsubscribe(&remove)).await.is_none() {
                return listened;
            }
            tracing::trace!(
                node = self.node,
                generation,
                added = add.len(),
                removed = remove.len(),
                "subscriber in sync"
            );
            subscribed = wanted;
            listened = true;
            self.registry.set_synced(self.node, generation);
            // Until the channels change, a message comes, or idle ones may expire.
            loop {
                tokio::select! {
                    () = self.registry.changed[self.node].notified() => break,
                    () = tokio::time::sleep_until(recheck.into()) => break,
                    message = stream.next() => match message {
                        Some(message) => self
                            .registry
                            .deliver(message.get_channel_name(), message.get_payload_bytes()),
                        None => return listened,
                    },
                }
            }
        }
    }
}

impl Subscription {
    /// At least one node listens for this waiter's releases.
    pub(crate) fn listening(&self) -> bool {
        self.listening
    }

    /// Waits for a release of one of the keys, or `fallback`, whichever comes first. A
    /// release since the last wait counts. After a release that deleted the lock, waits
    /// a random `0..=jitter` more, so that the woken waiters do not all come at once.
    /// After a hand-over to this waiter, waits until `quorum` nodes have handed it over
    /// (every node publishes its own), at most `jitter`: an attempt sent before the
    /// slower nodes have run the release would find the lock still held there.
    pub(crate) async fn wait(&self, fallback: Duration, jitter: Duration, quorum: usize) {
        tokio::select! {
            () = self.signal.notify.notified() => {}
            () = tokio::time::sleep(fallback) => return,
        }
        let handed = || self.signal.handovers.load(Ordering::Acquire);
        let window = if handed() > 0 {
            jitter
        } else {
            crate::retry::random_up_to(jitter)
        };
        let window = tokio::time::sleep(window);
        tokio::pin!(window);
        while handed() < quorum {
            tokio::select! {
                () = &mut window => break,
                () = self.signal.notify.notified() => {}
            }
        }
        self.signal.handovers.store(0, Ordering::Release);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The node tasks unsubscribe channels idle for a while (see `Registry::snapshot`).
        let now = Instant::now();
        let mut channels = self.registry.channels();
        for key in &self.keys {
            if let Some(channel) = channels.map.get_mut(key) {
                channel.waiters.remove(&self.id);
                if channel.waiters.is_empty() {
                    channel.idle_since = Some(now);
                }
            }
        }
    }
}
