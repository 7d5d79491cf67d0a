//! [`LockState`]: what a lock guard and the watchdog share (validity, TTL, loss, the
//! order of extensions).
//!
//! One allocation per lock holds all of it but the loss token and the extension lock:
//! the watchdog visits every watched lock each round, so the state is kept small and in
//! one place (the validity and TTL under one plain mutex, a single [`Notify`] for those
//! who wait on the validity).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::Instant;
use crate::quorum::InFlight;

/// The validity end and the TTL last set, changed together.
#[derive(Debug, Clone, Copy)]
struct Validity {
    valid_until: Instant,
    ttl: Duration,
}

/// What a lock guard and the watchdog share.
#[derive(Debug)]
pub(crate) struct LockState {
    /// When the validity ends, and the TTL last set. The validity end moves with every
    /// extension, backwards too (an extension to a shorter TTL).
    validity: Mutex<Validity>,
    /// Woken when the validity end moves earlier: a waiter sleeping until the old end
    /// must wake sooner. (A later end needs no wake-up: the waiter wakes at the old end,
    /// reads the new one and sleeps again.)
    sooner: Notify,
    /// Cancelled when the lock is lost.
    pub(crate) lost: CancellationToken,
    /// Set when the guard released the lock or was dropped: the watchdog lets go.
    pub(crate) ended: AtomicBool,
    /// Nodes that accepted the last extension.
    pub(crate) last_votes: AtomicUsize,
    /// The commands of this lock not yet queued on some nodes: the acquisition's (and
    /// its fence write-back), then an extension's that wait for those. Every later
    /// command of this lock to those nodes waits for them.
    barrier: Mutex<Option<InFlight>>,
    /// Held by an extension until its commands have completed on every node: the
    /// holder's extension exclusively (it never overlaps another, so the one that set a
    /// TTL last on a node is the one whose validity the holder counts), the watchdog's
    /// rounds shared (they may overlap a slow node's straggler, but a round skips a node
    /// where the previous one is still in flight, so they keep their order per node).
    extending: Arc<tokio::sync::RwLock<()>>,
    /// The watchdog's id for this lock (0 while not watched).
    pub(crate) watch_id: AtomicU64,
}

impl LockState {
    pub(crate) fn new(valid_until: Instant, ttl: Duration, barrier: Option<InFlight>) -> Self {
        Self {
            validity: Mutex::new(Validity { valid_until, ttl }),
            sooner: Notify::new(),
            lost: CancellationToken::new(),
            ended: AtomicBool::new(false),
            last_votes: AtomicUsize::new(0),
            barrier: Mutex::new(barrier),
            extending: Arc::new(tokio::sync::RwLock::new(())),
            watch_id: AtomicU64::new(0),
        }
    }

    fn validity(&self) -> MutexGuard<'_, Validity> {
        self.validity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.validity().valid_until
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.validity().ttl
    }

    /// The validity end and the TTL, read together.
    pub(crate) fn valid_until_and_ttl(&self) -> (Instant, Duration) {
        let validity = *self.validity();
        (validity.valid_until, validity.ttl)
    }

    /// Completes when the lock is declared lost or its validity runs out, following the
    /// validity end as extensions move it, earlier or later.
    pub(crate) async fn lost_or_expired(&self) {
        loop {
            // Registered before the validity end is read: a move to an earlier end
            // after the read wakes this waiter.
            let sooner = self.sooner.notified();
            tokio::pin!(sooner);
            sooner.as_mut().enable();
            let until = self.valid_until();
            if Instant::now() >= until {
                return;
            }
            // Biased: a loss first, and no random pick (the simulator replays a seed
            // bit for bit).
            tokio::select! {
                biased;
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep_until(until.into()) => {}
                () = &mut sooner => {}
            }
        }
    }

    /// The commands a new command of this lock must not overtake, if any are left.
    pub(crate) fn barrier(&self) -> Option<InFlight> {
        let mut barrier = self.barrier.lock().unwrap_or_else(PoisonError::into_inner);
        if barrier.as_ref().is_some_and(InFlight::is_done) {
            *barrier = None;
        }
        barrier.clone()
    }

    /// An extension's commands not yet in their nodes' connection queues: later
    /// commands of this lock to those nodes wait for them (they ran after the earlier
    /// barrier's there, so it is over when they are).
    pub(crate) fn set_barrier(&self, in_flight: InFlight) {
        *self.barrier.lock().unwrap_or_else(PoisonError::into_inner) = Some(in_flight);
    }

    /// Waits until no other extension of this lock is under way (the watchdog's rounds
    /// included, stragglers too); the guard keeps it so until dropped.
    pub(crate) async fn begin_extension(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        Arc::clone(&self.extending).write_owned().await
    }

    /// A watchdog round's guard, if the holder is not extending the lock (nor waiting to).
    pub(crate) fn try_begin_round(&self) -> Option<tokio::sync::OwnedRwLockReadGuard<()>> {
        Arc::clone(&self.extending).try_read_owned().ok()
    }

    /// Records an extension a majority accepted: the keys now live at least `ttl` from
    /// `sent_at` on a majority, so the validity is `sent_at + ttl - drift`, whatever it
    /// was before (earlier or later).
    pub(crate) fn extended(&self, valid_until: Instant, ttl: Duration) {
        let sooner = {
            let mut validity = self.validity();
            let sooner = valid_until < validity.valid_until;
            *validity = Validity { valid_until, ttl };
            sooner
        };
        if sooner {
            self.sooner.notify_waiters();
        }
    }

    /// Records an extension that did not reach a majority: nodes that did apply it now
    /// let the keys expire at `bound` (plus drift) at the earliest, so the validity
    /// ends there if that is sooner (a failed extension to a shorter TTL).
    pub(crate) fn not_extended(&self, bound: Instant) {
        let sooner = {
            let mut validity = self.validity();
            let sooner = bound < validity.valid_until;
            if sooner {
                validity.valid_until = bound;
            }
            sooner
        };
        if sooner {
            self.sooner.notify_waiters();
        }
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(state: &Arc<LockState>) -> tokio::task::JoinHandle<Instant> {
        let state = Arc::clone(state);
        tokio::spawn(async move {
            state.lost_or_expired().await;
            Instant::now()
        })
    }

    #[tokio::test]
    async fn a_waiter_follows_the_validity_end_both_ways() {
        let ms = Duration::from_millis;
        let start = Instant::now();
        let state = Arc::new(LockState::new(start + ms(300), ms(300), None));
        let waiter = waiting(&state);
        tokio::time::sleep(ms(50)).await;
        // Later: the waiter wakes at the old end and keeps waiting.
        state.extended(start + ms(900), ms(300));
        tokio::time::sleep(ms(350)).await;
        assert!(!waiter.is_finished());
        // Sooner: the waiter wakes at the new, earlier end, not at the later one.
        state.not_extended(start + ms(500));
        let woke = waiter.await.map_or(start, |at| at).duration_since(start);
        assert!(woke >= ms(500) && woke < ms(850), "woke after {woke:?}");
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_the_lock_is_lost() {
        let ms = Duration::from_millis;
        let start = Instant::now();
        let state = Arc::new(LockState::new(start + ms(5_000), ms(5_000), None));
        let waiter = waiting(&state);
        tokio::time::sleep(ms(100)).await;
        state.lost.cancel();
        let woke = waiter.await.map_or(start, |at| at).duration_since(start);
        assert!(woke >= ms(100) && woke < ms(2_000), "woke after {woke:?}");
    }
}
