//! Wake on release: a client waiting for a busy lock retries as soon as it is released.
//!
//! The release script publishes on the lock key's channel when it deletes a lock's key
//! (a release, or the cleanup of a failed attempt that had set keys). Each `Redlock` keeps at most one
//! subscriber connection per node, shared by all its waiters. A key's channel is
//! subscribed on every node when its first waiter comes, and stays subscribed for a
//! while after its last waiter leaves (so steady contention costs no subscription round
//! trips). Every release publishes on every node, so a waiter needs just one node to
//! listen: it waits only until the first node confirms, and slow or dead nodes never
//! hold it up. A release that hands the lock over to a queued waiter (see `queue.rs`)
//! publishes that waiter's id on its client's own channel (so no other process even
//! receives it): it alone is woken and retries at once. A release that
//! deletes the lock publishes an empty message, which wakes every waiter of the key;
//! each then retries after a small random jitter, so that one of them usually reaches a
//! majority first instead of all splitting the votes. A message that comes during a
//! waiter's own attempt is kept for it, not lost. The random retry delay stays as the
//! fallback.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::aio::PubSubSink;
use tokio::sync::Notify;

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(10);

/// How long a (un)subscription or a connection may take before the subscriber
/// connection is given up as broken.
const SUBSCRIBER_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `fut` within [`SUBSCRIBER_TIMEOUT`]; true if it completed with `Ok`.
async fn within<T, E>(fut: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    tokio::time::timeout(SUBSCRIBER_TIMEOUT, fut)
        .await
        .ok()?
        .ok()
}

/// Waiters by key.
type Channels = HashMap<String, HashMap<u64, Arc<Signal>>>;

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

/// The subscribers of one `Redlock` and the keys being waited for.
pub(crate) struct Wakeups {
    nodes: Vec<Arc<Subscriber>>,
    channels: Arc<Mutex<Channels>>,
    next_id: AtomicU64,
    /// This client's id: hand-overs to its waiters are published on its own channel.
    client: String,
}

/// The channel hand-overs to the waiters of client `client` are published on.
pub(crate) fn client_channel(client: &str) -> String {
    format!("redlock-wake:{client}")
}

/// One node's subscriber connection, opened on first need and re-opened after it broke.
struct Subscriber {
    client: Option<redis::Client>,
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
    /// The connection is up and subscribed to every channel in the map.
    healthy: Arc<AtomicBool>,
}

/// A waiter's registration on some keys; unregisters when dropped.
pub(crate) struct Subscription {
    wakeups: Arc<Wakeups>,
    id: u64,
    keys: Vec<String>,
    signal: Arc<Signal>,
    /// At least one node confirmed it listens.
    listening: bool,
}

fn lock(channels: &Mutex<Channels>) -> MutexGuard<'_, Channels> {
    channels.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Wakeups {
    /// `clients[i]` is node i's client (`None` for a pooled node: no wake-ups there).
    pub(crate) fn new(clients: Vec<Option<redis::Client>>) -> Self {
        Self {
            nodes: clients
                .into_iter()
                .map(|client| {
                    Arc::new(Subscriber {
                        client,
                        sink: tokio::sync::Mutex::new(None),
                        healthy: Arc::new(AtomicBool::new(false)),
                    })
                })
                .collect(),
            channels: Arc::new(Mutex::new(HashMap::new())),
            next_id: AtomicU64::new(0),
            client: format!("{:016x}", rand::RngExt::random::<u64>(&mut rand::rng())),
        }
    }

    /// This client's id (hex).
    pub(crate) fn client(&self) -> &str {
        &self.client
    }

    /// Someone of this client waits, or waited in the last few seconds, for `key`: a new
    /// request for it will likely have to wait too.
    pub(crate) fn recently_waited(&self, key: &str) -> bool {
        lock(&self.channels).contains_key(key)
    }

    /// Registers a waiter for `keys` (`waiter`: its id in the wait queue, if queued);
    /// subscribes where needed and waits (at most `timeout`) until one node listens.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
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
        let mut new_keys = Vec::new();
        {
            let mut channels = lock(&self.channels);
            for key in keys {
                let waiters = channels.entry(key.clone()).or_insert_with(|| {
                    new_keys.push(key.clone());
                    HashMap::new()
                });
                waiters.insert(id, Arc::clone(&signal));
            }
        }
        let mut subscription = Subscription {
            wakeups: Arc::clone(self),
            id,
            keys: keys.to_vec(),
            signal,
            listening: false,
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return subscription;
        };
        let mut listening = 0;
        let mut started = FuturesUnordered::new();
        for node in self.nodes.iter().filter(|n| n.client.is_some()) {
            let healthy = node.healthy.load(Ordering::Acquire);
            if healthy && new_keys.is_empty() {
                listening += 1;
                continue;
            }
            let (node, channels, keys) = (
                Arc::clone(node),
                Arc::clone(&self.channels),
                new_keys.clone(),
            );
            started.push(handle.spawn(async move { listen(&node, &channels, &keys).await }));
        }
        subscription.listening = listening > 0
            || tokio::time::timeout(timeout, async {
                // Wait for the first node to listen; the others go on in the background.
                while let Some(done) = started.next().await {
                    if matches!(done, Ok(true)) {
                        return true;
                    }
                }
                false
            })
            .await
            .unwrap_or(false);
        subscription
    }
}

/// Makes `node` listen on `keys`: subscribes them on its connection, or opens a new
/// connection and subscribes every channel waited for. True once it listens.
async fn listen(node: &Subscriber, channels: &Arc<Mutex<Channels>>, keys: &[String]) -> bool {
    let Some(client) = &node.client else {
        return false;
    };
    let mut sink = node.sink.lock().await;
    if node.healthy.load(Ordering::Acquire)
        && let Some(s) = sink.as_mut()
    {
        if keys.is_empty() || within(s.subscribe(keys)).await.is_some() {
            return true;
        }
        node.healthy.store(false, Ordering::Release);
    }
    *sink = None;
    let Some(pubsub) = within(client.get_async_pubsub()).await else {
        return false;
    };
    let (mut new_sink, mut stream) = pubsub.split();
    let (readers, healthy) = (Arc::clone(channels), Arc::clone(&node.healthy));
    tokio::spawn(async move {
        // However the reader ends (connection gone, or its runtime shut down), the next
        // waiter must open a new connection.
        let _reset = Unhealthy(healthy);
        while let Some(message) = stream.next().await {
            let channels = lock(&readers);
            if let Some(waiters) = channels.get(message.get_channel_name()) {
                // A stored permit if the waiter is not waiting right now.
                let payload = message.get_payload_bytes();
                waiters
                    .values()
                    .for_each(|signal| signal.on_message(payload));
            }
        }
    });
    let all: Vec<String> = lock(channels).keys().cloned().collect();
    if !all.is_empty() && within(new_sink.subscribe(&all)).await.is_none() {
        return false;
    }
    *sink = Some(new_sink);
    node.healthy.store(true, Ordering::Release);
    true
}

/// Marks a subscriber connection broken when dropped.
struct Unhealthy(Arc<AtomicBool>);

impl Drop for Unhealthy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
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
        let mut idle = Vec::new();
        {
            let mut channels = lock(&self.wakeups.channels);
            for key in &self.keys {
                if let Some(waiters) = channels.get_mut(key) {
                    waiters.remove(&self.id);
                    if waiters.is_empty() {
                        idle.push(key.clone());
                    }
                }
            }
        }
        if idle.is_empty() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let wakeups = Arc::clone(&self.wakeups);
        handle.spawn(async move {
            tokio::time::sleep(LINGER).await;
            // Unsubscribe what is still idle (a new waiter may have come meanwhile).
            let gone: Vec<String> = {
                let mut channels = lock(&wakeups.channels);
                idle.into_iter()
                    .filter(|key| {
                        let empty = channels.get(key).is_some_and(HashMap::is_empty);
                        if empty {
                            channels.remove(key);
                        }
                        empty
                    })
                    .collect()
            };
            if gone.is_empty() {
                return;
            }
            for node in &wakeups.nodes {
                let mut sink = node.sink.lock().await;
                if let Some(s) = sink.as_mut()
                    && within(s.unsubscribe(&gone)).await.is_none()
                {
                    node.healthy.store(false, Ordering::Release);
                }
            }
        });
    }
}
