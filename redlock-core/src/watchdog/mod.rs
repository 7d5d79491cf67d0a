//! The watchdog: one task per `Redlock` keeps its watched locks alive.
//!
//! Each watched lock is extended about every `ttl / 3`. Extensions that fall due
//! together are sent as one batch: one pipeline per node, whatever the number of locks
//! (a round costs one round trip per node). An extension counts for a lock if a
//! majority of nodes accepted it before the lock's validity ran out; its validity then
//! restarts from the moment the batch was sent. A round's outcome is taken as soon as a
//! majority decided it: a slow or dead node never delays it (its pipeline goes on in
//! the background, and the next round skips that node until it is done). A lock that could not be extended is
//! retried shortly, and declared **lost** once its loss deadline passes: its validity
//! end minus the drift allowance, never later. A watched lock also stops being extended
//! at its maximum hold time, and is then declared lost when its validity runs out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;

mod state;

pub(crate) use self::state::LockState;
use crate::protocol::Op;
use crate::quorum::{Cluster, OpKind, Target};

/// A lock handed to the watchdog.
pub(crate) struct Watched {
    pub(crate) state: Arc<LockState>,
    pub(crate) target: Arc<Target>,
    pub(crate) resource: String,
    /// No extension after this (the maximum hold time).
    pub(crate) stop_at: Instant,
}

/// The handle to a `Redlock`'s watchdog task, started on first use.
#[derive(Default)]
pub(crate) struct Watchdog {
    sender: Mutex<Option<mpsc::UnboundedSender<Message>>>,
    /// Extension rounds sent (each: one pipeline per node).
    pub(crate) rounds: Arc<AtomicU64>,
    /// Ids of watched locks.
    next_id: AtomicU64,
}

impl Watchdog {
    /// Hands `watched` to the watchdog task, starting it (on the current runtime) if it
    /// is not running. Without a runtime, the lock is not watched and `false` returned.
    pub(crate) fn watch(&self, cluster: &Arc<Cluster>, watched: Watched) -> bool {
        let mut sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        watched.state.watch_id.store(id, Ordering::Release);
        let message = match sender.as_ref() {
            Some(tx) => match tx.send(Message::Watch(id, watched)) {
                Ok(()) => return true,
                Err(mpsc::error::SendError(message)) => message,
            },
            None => Message::Watch(id, watched),
        };
        // Not running (or its runtime has gone): start it.
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(message);
        handle.spawn(run(Arc::downgrade(cluster), Arc::clone(&self.rounds), rx));
        *sender = Some(tx);
        true
    }

    /// Tells the watchdog that the holder extended the lock `state` itself: its next
    /// extension and loss deadline follow from that extension's TTL and validity.
    pub(crate) fn rescheduled(&self, state: &LockState, extended_at: Instant) {
        let id = state.watch_id.load(Ordering::Acquire);
        if id == 0 {
            return;
        }
        let sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = sender.as_ref() {
            let _ = tx.send(Message::Extended(id, extended_at));
        }
    }
}

/// What the watchdog task is told.
enum Message {
    /// Watch this lock under this id.
    Watch(u64, Watched),
    /// The holder extended lock `id` itself, starting at this instant.
    Extended(u64, Instant),
}

struct Entry {
    watched: Watched,
    next_extend: Instant,
    extending: bool,
}

/// The outcome of one batch: per lock, how many nodes extended it, and how many
/// answered that they no longer hold it.
struct Outcome {
    sent_at: Instant,
    ttl: HashMap<u64, Duration>,
    votes: HashMap<u64, usize>,
    refused: HashMap<u64, usize>,
}

/// The watched locks. If the task holding them is dropped (its runtime shut down), the
/// locks are no longer extended: each is declared lost at once, not left to look held.
#[derive(Default)]
struct Entries(HashMap<u64, Entry>);

impl std::ops::Deref for Entries {
    type Target = HashMap<u64, Entry>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Entries {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Entries {
    fn drop(&mut self) {
        for entry in self.0.values() {
            if !entry.watched.state.is_ended() {
                crate::telemetry::lock_lost();
                entry.watched.state.lost.cancel();
            }
        }
    }
}

/// The watchdog task. Ends when the client is gone and no lock is watched.
async fn run(
    client: Weak<Cluster>,
    rounds: Arc<AtomicU64>,
    mut incoming: mpsc::UnboundedReceiver<Message>,
) {
    let mut entries = Entries::default();
    // Per node: a round's pipeline is still in flight there.
    let busy: Arc<[AtomicBool]> = match client.upgrade() {
        Some(cluster) => cluster
            .nodes
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect(),
        None => return,
    };
    let mut in_flight: FuturesUnordered<BoxFuture<'static, Outcome>> = FuturesUnordered::new();
    let mut open = true;
    // When to tick next: recomputed over all entries only after a tick or an outcome
    // (both visit every entry anyway); a new entry just lowers it. Recomputing it for
    // every new entry would cost O(locks) per lock taken, which dominates when many
    // short-lived locks are watched (one per HTTP request, say).
    let mut wake_at: Option<Option<Instant>> = None;
    loop {
        let Some(cluster) = client.upgrade() else {
            // The client is gone: nobody can release these locks; let them expire.
            for entry in entries.values() {
                crate::telemetry::lock_lost();
                entry.watched.state.lost.cancel();
            }
            return;
        };
        if !open && entries.is_empty() && in_flight.is_empty() {
            return;
        }
        let wake = *wake_at.get_or_insert_with(|| next_wake(&cluster, &entries));
        drop(cluster);
        tokio::select! {
            received = incoming.recv(), if open => match received {
                Some(Message::Watch(id, watched)) => {
                    let ttl = watched.state.ttl();
                    let entry = Entry {
                        next_extend: Instant::now() + ttl / 3,
                        watched,
                        extending: false,
                    };
                    if let (Some(wake), Some(cluster)) = (wake_at.as_mut(), client.upgrade()) {
                        *wake = [*wake, entry_wake(&cluster, &entry)].into_iter().flatten().min();
                    }
                    entries.insert(id, entry);
                }
                Some(Message::Extended(id, at)) => {
                    if let Some(entry) = entries.get_mut(&id) {
                        entry.next_extend = at + entry.watched.state.ttl() / 3;
                    }
                    wake_at = None;
                }
                None => open = false,
            },
            () = sleep_until(wake) => {
                wake_at = None;
                if let Some(cluster) = client.upgrade()
                    && let Some(batch) = tick(&cluster, &mut entries, &busy, &rounds)
                {
                    in_flight.push(batch);
                }
            }
            Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                wake_at = None;
                if let Some(cluster) = client.upgrade() {
                    apply(&cluster, &mut entries, outcome);
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// When the lock is to be declared lost: its validity end minus the drift allowance.
fn loss_deadline(cluster: &Cluster, state: &LockState) -> Instant {
    let valid_until = state.valid_until();
    valid_until
        .checked_sub(cluster.drift(state.ttl()))
        .unwrap_or(valid_until)
}

fn next_wake(cluster: &Cluster, entries: &HashMap<u64, Entry>) -> Option<Instant> {
    entries
        .values()
        .filter_map(|entry| entry_wake(cluster, entry))
        .min()
}

/// When `entry` needs the watchdog next: its loss deadline, or its next extension.
fn entry_wake(cluster: &Cluster, entry: &Entry) -> Option<Instant> {
    let extend = (!entry.extending && entry.next_extend < entry.watched.stop_at)
        .then_some(entry.next_extend);
    [Some(loss_deadline(cluster, &entry.watched.state)), extend]
        .into_iter()
        .flatten()
        .min()
}

/// Drops ended locks, declares lost ones, and starts a batch for those due.
fn tick(
    cluster: &Arc<Cluster>,
    entries: &mut HashMap<u64, Entry>,
    busy: &Arc<[AtomicBool]>,
    rounds: &AtomicU64,
) -> Option<BoxFuture<'static, Outcome>> {
    let now = Instant::now();
    entries.retain(|_, entry| {
        let state = &entry.watched.state;
        if state.is_ended() {
            return false;
        }
        if now >= loss_deadline(cluster, state) {
            tracing::warn!(resource = %entry.watched.resource, "lock lost: not extended on a majority in time");
            crate::telemetry::lock_lost();
            state.lost.cancel();
            return false;
        }
        true
    });
    // Extend what is due now, and what would fall due within the next half of its
    // period: locks taken at different times thus converge on the same rounds, and
    // share their round trips.
    let mut batch: Vec<(u64, Arc<Target>, Duration)> = Vec::new();
    let mut guards = Vec::new();
    for (id, entry) in entries.iter_mut() {
        let ttl = entry.watched.state.ttl();
        if entry.extending || now >= entry.watched.stop_at {
            continue;
        }
        if entry.next_extend <= now + ttl / 6 {
            let state = &entry.watched.state;
            // Not before the acquisition's own commands are queued on every node (an
            // extension that overtook a SET would leave that node at the SET's TTL),
            // nor while the holder extends it: look again shortly.
            let guard = match state.barrier() {
                None => state.try_begin_round(),
                Some(_) => None,
            };
            let Some(guard) = guard else {
                entry.next_extend = now + Duration::from_millis(2);
                continue;
            };
            guards.push(guard);
            entry.extending = true;
            batch.push((*id, Arc::clone(&entry.watched.target), ttl));
        }
    }
    if batch.is_empty() {
        return None;
    }
    rounds.fetch_add(1, Ordering::Relaxed);
    Some(extend_batch(
        Arc::clone(cluster),
        batch,
        guards,
        Arc::clone(busy),
    ))
}

/// Extends every lock of `batch` on every node not still busy with the previous round
/// (a node that is counts as a failure for this one): one pipeline per node. The outcome
/// comes as soon as every lock's is decided (a majority said yes, or can no longer), so
/// a slow or dead node never delays it; the pipelines go on in a task of their own,
/// which keeps the rounds' guards (`guards`) and the nodes' busy flags until each is done.
fn extend_batch<G: Send + 'static>(
    cluster: Arc<Cluster>,
    batch: Vec<(u64, Arc<Target>, Duration)>,
    guards: Vec<G>,
    busy: Arc<[AtomicBool]>,
) -> BoxFuture<'static, Outcome> {
    let sent_at = Instant::now();
    let ttl: HashMap<u64, Duration> = batch.iter().map(|(id, _, ttl)| (*id, *ttl)).collect();
    let no_votes: HashMap<u64, usize> = batch.iter().map(|(id, _, _)| (*id, 0)).collect();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let outcome = Outcome {
        sent_at,
        ttl: ttl.clone(),
        votes: no_votes.clone(),
        refused: HashMap::new(),
    };
    let round = async move {
        let ops: Vec<Op<'_>> = batch
            .iter()
            .map(|(_, target, ttl)| {
                let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
                target.op(OpKind::Extend { ttl_ms })
            })
            .collect();
        // A round may take until the next one is due: with thousands of locks a pipeline
        // takes longer than the per-node timeout (meant for single commands), and a round
        // cut short would fail every lock in it.
        let shortest = batch
            .iter()
            .map(|(_, _, ttl)| *ttl)
            .min()
            .unwrap_or_default();
        let timeout = cluster.node_timeout.max(shortest / 3);
        let quorum = cluster.quorum();
        let free: Vec<usize> = (0..cluster.nodes.len())
            .filter(|&i| busy.get(i).is_some_and(|b| !b.swap(true, Ordering::AcqRel)))
            .collect();
        let mut calls: FuturesUnordered<_> = free
            .iter()
            .map(|&i| {
                let (node, ops, busy) = (&cluster.nodes[i], &ops, &busy);
                async move {
                    let answer = node.run_batch(ops, timeout).await;
                    if let Some(flag) = busy.get(i) {
                        flag.store(false, Ordering::Release);
                    }
                    (node.name(), answer)
                }
            })
            .collect();
        let mut votes = no_votes;
        let mut refused: HashMap<u64, usize> = HashMap::new();
        let mut pending = calls.len();
        let mut tx = Some(tx);
        while let Some((node, answer)) = calls.next().await {
            pending -= 1;
            match answer {
                Ok(answer) => {
                    for ((id, _, _), answer) in batch.iter().zip(answer) {
                        match answer {
                            Some(0) => *refused.entry(*id).or_default() += 1,
                            Some(_) => *votes.entry(*id).or_default() += 1,
                            None => {}
                        }
                    }
                }
                Err(err) => {
                    tracing::debug!(node, locks = batch.len(), error = %err, "extension round failed on a node");
                }
            }
            let decided = votes
                .values()
                .all(|&yes| yes >= quorum || yes + pending < quorum);
            if decided && let Some(tx) = tx.take() {
                let _ = tx.send(Outcome {
                    sent_at,
                    ttl: ttl.clone(),
                    votes: votes.clone(),
                    refused: refused.clone(),
                });
            }
        }
        if let Some(tx) = tx {
            let _ = tx.send(Outcome {
                sent_at,
                ttl,
                votes,
                refused,
            });
        }
        // Done on every node: the holder may extend again.
        drop(guards);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(round);
            Box::pin(async move { rx.await.unwrap_or(outcome) })
        }
        Err(_) => Box::pin(async move {
            round.await;
            rx.await.unwrap_or(outcome)
        }),
    }
}

fn apply(cluster: &Cluster, entries: &mut HashMap<u64, Entry>, outcome: Outcome) {
    let now = Instant::now();
    let quorum = cluster.quorum();
    for (id, yes) in outcome.votes {
        let refused = outcome.refused.get(&id).copied().unwrap_or(0);
        if refused > cluster.nodes.len() - quorum {
            // So many nodes answered that they no longer hold our value (it expired
            // there, a node forgot it, or an operator released it by force) that no
            // extension can ever reach a majority again: lost now, not at its deadline.
            if let Some(entry) = entries.remove(&id) {
                let state = &entry.watched.state;
                state.not_extended(now);
                tracing::warn!(resource = %entry.watched.resource, refused, "lock lost: a majority of nodes no longer hold it");
                crate::telemetry::extension(false);
                crate::telemetry::lock_lost();
                state.lost.cancel();
            }
            continue;
        }
        let Some(entry) = entries.get_mut(&id) else {
            continue;
        };
        entry.extending = false;
        let state = &entry.watched.state;
        let ttl = outcome.ttl.get(&id).copied().unwrap_or_else(|| state.ttl());
        state.last_votes.store(yes, Ordering::Relaxed);
        let validity = ttl.saturating_sub(cluster.drift(ttl));
        let bound = outcome.sent_at + validity;
        if yes >= quorum && now < state.valid_until() {
            state.extended(bound, ttl);
            entry.next_extend = outcome.sent_at + ttl / 3;
            crate::telemetry::extension(true);
            tracing::trace!(resource = %entry.watched.resource, votes = yes, "extended");
        } else {
            state.not_extended(bound);
            crate::telemetry::extension(false);
            // Try again soon; the loss deadline decides when to give up.
            entry.next_extend = now + (ttl / 20).max(Duration::from_millis(5));
            tracing::debug!(
                resource = %entry.watched.resource,
                votes = yes,
                quorum,
                round_ms = (now - outcome.sent_at).as_millis() as u64,
                validity_left_ms = state.valid_until().saturating_duration_since(now).as_millis() as u64,
                "extension failed, retrying"
            );
        }
    }
}
