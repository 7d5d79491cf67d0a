//! The watchdog: one task per `Redlock` keeps its watched locks alive.
//!
//! Each watched lock is extended about every `ttl / 3`. Extensions that fall due
//! together are sent as one batch: one round trip per node, whatever the number of locks
//! (the batch's commands, built once for every node and each extending up to 128 locks,
//! go out back to back, 16 at a time; see `protocol::Extensions`). An extension counts for a lock if a
//! majority of nodes accepted it before the lock's validity ran out; its validity then
//! restarts from the moment the batch was sent. A round's outcome is taken as soon as a
//! majority decided it: a slow or dead node never delays it (its commands go on in
//! the background, and the next round skips that node until it is done). A lock that
//! could not be extended is retried shortly, and declared **lost** once its loss
//! deadline passes: its validity end minus the drift allowance, never later. A watched
//! lock also stops being extended at its maximum hold time, and is then declared lost
//! when its validity runs out.
//!
//! Cost: the watchdog visits every watched lock once per round to schedule it and once
//! to apply the outcome; per round it allocates per lock only its part of the commands
//! (its key, value and TTL) and a few bytes of answers and votes, never a map, and it
//! keeps no copy of a lock's resource or keys. With 10,000 watched locks of a 3 s TTL it
//! takes about 2 % of a core and 1 KiB per lock (`BENCH_ONLY=watchdog`, see
//! docs/BENCHMARKS.md).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;

mod state;

pub(crate) use self::state::LockState;
use crate::clock::Instant;
use crate::protocol::Extensions;
use crate::quorum::{Cluster, Target};

/// A lock handed to the watchdog.
pub(crate) struct Watched {
    pub(crate) state: Arc<LockState>,
    pub(crate) target: Arc<Target>,
    /// The length of the key prefix: the first key is `<prefix>{<resource>}`, from
    /// which the resource is read for the logs (rather than keeping a copy per lock).
    pub(crate) prefix_len: usize,
    /// No extension after this (the maximum hold time).
    pub(crate) stop_at: Instant,
}

impl Watched {
    /// The (first) resource, for the logs.
    fn resource(&self) -> &str {
        let key = self.target.keys.first().map_or("", String::as_str);
        key.len()
            .checked_sub(1)
            .and_then(|end| key.get(self.prefix_len + 1..end))
            .unwrap_or(key)
    }
}

/// The handle to a `Redlock`'s watchdog task, started on first use.
#[derive(Default)]
pub(crate) struct Watchdog {
    sender: Mutex<Option<mpsc::UnboundedSender<Message>>>,
    /// Extension rounds sent (each: one round trip per node).
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
    /// The acquisition's commands were seen queued on every node (it stays so).
    cleared: bool,
}

/// The outcome of one batch: per lock (in the batch's order), its id and the TTL it was
/// extended to, how many nodes extended it, and how many answered that they no longer
/// hold it.
struct Outcome {
    sent_at: Instant,
    locks: Vec<(u64, Duration)>,
    votes: Vec<u32>,
    refused: Vec<u32>,
}

/// The watched locks, by id: in the order they were watched, so that a round's batch
/// has one order (a simulation replays it bit for bit). If the task holding them is
/// dropped (its runtime shut down), the locks are no longer extended: each is declared
/// lost at once, not left to look held.
#[derive(Default)]
struct Entries(BTreeMap<u64, Entry>);

impl std::ops::Deref for Entries {
    type Target = BTreeMap<u64, Entry>;
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
    // When to tick next (`None`: to be recomputed over all entries). A tick computes it
    // while it visits every entry anyway; after an outcome it is recomputed (one pass);
    // a new entry, or one its holder extended, just lowers it. Recomputing it for every
    // such message would cost O(locks) per lock taken, which dominates when many
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
        // Biased: a message (an extension done, a new lock) is taken in before a tick
        // due at the same instant, so that the tick sees it; and the order does not
        // hang on tokio's random pick (the simulator replays a seed bit for bit).
        tokio::select! {
            biased;
            received = incoming.recv(), if open => match received {
                Some(Message::Watch(id, watched)) => {
                    let ttl = watched.state.ttl();
                    let entry = Entry {
                        next_extend: Instant::now() + ttl / 3,
                        watched,
                        extending: false,
                        cleared: false,
                    };
                    lower(&client, &mut wake_at, &entry);
                    entries.insert(id, entry);
                }
                Some(Message::Extended(id, at)) => {
                    if let Some(entry) = entries.get_mut(&id) {
                        entry.next_extend = at + entry.watched.state.ttl() / 3;
                        lower(&client, &mut wake_at, entry);
                    }
                }
                None => open = false,
            },
            () = sleep_until(wake) => {
                wake_at = None;
                if let Some(cluster) = client.upgrade() {
                    let (batch, wake) = tick(&cluster, &mut entries, &busy, &rounds);
                    in_flight.extend(batch);
                    wake_at = Some(wake);
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

/// Lowers the next wake-up to `entry`'s, if it is known and later.
fn lower(client: &Weak<Cluster>, wake_at: &mut Option<Option<Instant>>, entry: &Entry) {
    if let (Some(wake), Some(cluster)) = (wake_at.as_mut(), client.upgrade()) {
        let deadline = loss_deadline(&cluster, &entry.watched.state);
        *wake = [*wake, Some(entry_wake(entry, deadline))]
            .into_iter()
            .flatten()
            .min();
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
    let (valid_until, ttl) = state.valid_until_and_ttl();
    deadline_of(cluster, valid_until, ttl)
}

/// `valid_until` minus the drift allowance for `ttl`.
fn deadline_of(cluster: &Cluster, valid_until: Instant, ttl: Duration) -> Instant {
    valid_until
        .checked_sub(cluster.drift(ttl))
        .unwrap_or(valid_until)
}

fn next_wake(cluster: &Cluster, entries: &BTreeMap<u64, Entry>) -> Option<Instant> {
    entries
        .values()
        .map(|entry| entry_wake(entry, loss_deadline(cluster, &entry.watched.state)))
        .min()
}

/// When `entry` needs the watchdog next: its loss deadline (`deadline`), or its next
/// extension.
fn entry_wake(entry: &Entry, deadline: Instant) -> Instant {
    if !entry.extending && entry.next_extend < entry.watched.stop_at {
        deadline.min(entry.next_extend)
    } else {
        deadline
    }
}

/// In one pass over the entries: drops ended locks, declares lost ones, starts a batch
/// for those due, and returns it with the next wake-up.
fn tick(
    cluster: &Arc<Cluster>,
    entries: &mut BTreeMap<u64, Entry>,
    busy: &Arc<[AtomicBool]>,
    rounds: &AtomicU64,
) -> (Option<BoxFuture<'static, Outcome>>, Option<Instant>) {
    let now = Instant::now();
    let mut wake: Option<Instant> = None;
    let mut batch: Vec<(u64, Arc<Target>, Duration)> = Vec::new();
    let mut guards = Vec::new();
    entries.retain(|id, entry| {
        let state = &entry.watched.state;
        if state.is_ended() {
            return false;
        }
        let (valid_until, ttl) = state.valid_until_and_ttl();
        let deadline = deadline_of(cluster, valid_until, ttl);
        if now >= deadline {
            tracing::warn!(resource = %entry.watched.resource(), "lock lost: not extended on a majority in time");
            crate::telemetry::lock_lost();
            state.lost.cancel();
            return false;
        }
        // Extend what is due now, and what would fall due within the next half of its
        // period: locks taken at different times thus converge on the same rounds, and
        // share their round trips.
        if !entry.extending && now < entry.watched.stop_at && entry.next_extend <= now + ttl / 6
        {
            // Not before the acquisition's own commands are queued on every node (an
            // extension that overtook a SET would leave that node at the SET's TTL),
            // nor while the holder extends it: look again shortly.
            entry.cleared = entry.cleared || state.barrier().is_none();
            let guard = if entry.cleared {
                state.try_begin_round()
            } else {
                None
            };
            match guard {
                Some(guard) => {
                    guards.push(guard);
                    entry.extending = true;
                    batch.push((*id, Arc::clone(&entry.watched.target), ttl));
                }
                None => entry.next_extend = now + Duration::from_millis(2),
            }
        }
        let at = entry_wake(entry, deadline);
        wake = Some(wake.map_or(at, |wake| wake.min(at)));
        true
    });
    if batch.is_empty() {
        return (None, wake);
    }
    rounds.fetch_add(1, Ordering::Relaxed);
    let round = extend_batch(Arc::clone(cluster), batch, guards, Arc::clone(busy));
    (Some(round), wake)
}

/// Extends every lock of `batch` on every node not still busy with the previous round
/// (a node that is counts as a failure for this one): one round trip per node. The outcome
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
    // A round may take until the next one is due: with thousands of locks a pipeline
    // takes longer than the per-node timeout (meant for single commands), and a round
    // cut short would fail every lock in it.
    let shortest = batch
        .iter()
        .map(|(_, _, ttl)| *ttl)
        .min()
        .unwrap_or_default();
    let locks: Vec<(u64, Duration)> = batch.iter().map(|(id, _, ttl)| (*id, *ttl)).collect();
    let count = locks.len();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let round = async move {
        // Built once, sent to every node.
        let extensions = Extensions::new(batch.iter().map(|(_, target, ttl)| {
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            (target.keys.as_slice(), target.value.as_str(), ttl_ms)
        }));
        drop(batch);
        let timeout = cluster.node_timeout.max(shortest / 3);
        let quorum = u32::try_from(cluster.quorum()).unwrap_or(u32::MAX);
        let free: Vec<usize> = (0..cluster.nodes.len())
            .filter(|&i| busy.get(i).is_some_and(|b| !b.swap(true, Ordering::AcqRel)))
            .collect();
        let mut calls: FuturesUnordered<_> = free
            .iter()
            .map(|&i| {
                let (node, extensions, busy) = (&cluster.nodes[i], &extensions, &busy);
                async move {
                    let answer = node.extend_all(extensions, timeout).await;
                    if let Some(flag) = busy.get(i) {
                        flag.store(false, Ordering::Release);
                    }
                    (node.name(), answer)
                }
            })
            .collect();
        // Per lock, in the batch's order: the nodes that extended it, and those that
        // no longer hold it.
        let mut votes = vec![0u32; count];
        let mut refused = vec![0u32; count];
        let mut pending = u32::try_from(calls.len()).unwrap_or(u32::MAX);
        let mut tx = Some(tx);
        while let Some((node, answer)) = calls.next().await {
            pending = pending.saturating_sub(1);
            match answer {
                Ok(answer) => {
                    for ((yes, no), answer) in votes.iter_mut().zip(&mut refused).zip(answer) {
                        match answer {
                            Some(false) => *no += 1,
                            Some(true) => *yes += 1,
                            None => {}
                        }
                    }
                }
                Err(err) => {
                    tracing::debug!(node, locks = count, error = %err, "extension round failed on a node");
                }
            }
            if tx.is_some()
                && votes
                    .iter()
                    .all(|&yes| yes >= quorum || yes + pending < quorum)
                && let Some(tx) = tx.take()
            {
                let _ = tx.send((votes.clone(), refused.clone()));
            }
        }
        if let Some(tx) = tx {
            let _ = tx.send((votes, refused));
        }
        // Done on every node: the holder may extend again.
        drop(guards);
    };
    let outcome = move |answer: Option<(Vec<u32>, Vec<u32>)>| {
        let (votes, refused) = answer.unwrap_or_else(|| (vec![0; count], vec![0; count]));
        Outcome {
            sent_at,
            locks,
            votes,
            refused,
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(round);
            Box::pin(async move { outcome(rx.await.ok()) })
        }
        Err(_) => Box::pin(async move {
            round.await;
            outcome(rx.await.ok())
        }),
    }
}

fn apply(cluster: &Cluster, entries: &mut BTreeMap<u64, Entry>, outcome: Outcome) {
    let now = Instant::now();
    let quorum = cluster.quorum();
    let answers = outcome.votes.iter().zip(&outcome.refused);
    for (&(id, ttl), (&yes, &refused)) in outcome.locks.iter().zip(answers) {
        let (yes, refused) = (yes as usize, refused as usize);
        if refused > cluster.nodes.len() - quorum {
            // So many nodes answered that they no longer hold our value (it expired
            // there, a node forgot it, or an operator released it by force) that no
            // extension can ever reach a majority again: lost now, not at its deadline.
            if let Some(entry) = entries.remove(&id) {
                let state = &entry.watched.state;
                // Released (or lost) meanwhile: the refusals were its own release's.
                if state.is_ended() {
                    continue;
                }
                state.not_extended(now);
                tracing::warn!(resource = %entry.watched.resource(), refused, "lock lost: a majority of nodes no longer hold it");
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
        state.last_votes.store(yes, Ordering::Relaxed);
        let validity = ttl.saturating_sub(cluster.drift(ttl));
        let bound = outcome.sent_at + validity;
        if yes >= quorum && now < state.valid_until() {
            state.extended(bound, ttl);
            entry.next_extend = outcome.sent_at + ttl / 3;
            crate::telemetry::extension(true);
            tracing::trace!(resource = %entry.watched.resource(), votes = yes, "extended");
        } else {
            state.not_extended(bound);
            crate::telemetry::extension(false);
            // Try again soon; the loss deadline decides when to give up.
            entry.next_extend = now + (ttl / 20).max(Duration::from_millis(5));
            tracing::debug!(
                resource = %entry.watched.resource(),
                votes = yes,
                quorum,
                round_ms = (now - outcome.sent_at).as_millis() as u64,
                validity_left_ms = state.valid_until().saturating_duration_since(now).as_millis() as u64,
                "extension failed, retrying"
            );
        }
    }
}
