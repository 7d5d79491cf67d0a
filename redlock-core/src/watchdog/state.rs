//! [`LockState`]: what a lock guard and the watchdog share (validity, TTL, loss, the
//! order of extensions).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::quorum::InFlight;

/// What a lock guard and the watchdog share.
#[derive(Debug)]
pub(crate) struct LockState {
    /// When the validity ends. It moves with every extension, backwards too (an
    /// extension to a shorter TTL); watchers are told.
    valid_until: watch::Sender<Instant>,
    ttl: Mutex<Duration>,
    /// Cancelled when the lock is lost.
    pub(crate) lost: CancellationToken,
    /// Set when the guard released the lock or was dropped: the watchdog lets go.
    pub(crate) ended: AtomicBool,
    /// Nodes that accepted the last extension.
    pub(crate) last_votes: AtomicUsize,
    /// The acquisition's commands (and its fence write-back) not yet queued on some
    /// nodes: every later command of this lock to those nodes waits for them.
    barrier: Option<InFlight>,
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
            valid_until: watch::Sender::new(valid_until),
            ttl: Mutex::new(ttl),
            lost: CancellationToken::new(),
            ended: AtomicBool::new(false),
            last_votes: AtomicUsize::new(0),
            barrier,
            extending: Arc::new(tokio::sync::RwLock::new(())),
            watch_id: AtomicU64::new(0),
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.borrow()
    }

    /// A receiver that sees every change of the validity end.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Instant> {
        self.valid_until.subscribe()
    }

    pub(crate) fn ttl(&self) -> Duration {
        *self.ttl.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The commands a new command of this lock must not overtake, if any are left.
    pub(crate) fn barrier(&self) -> Option<&InFlight> {
        self.barrier.as_ref().filter(|b| !b.is_done())
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
        *self.ttl.lock().unwrap_or_else(PoisonError::into_inner) = ttl;
        self.valid_until.send_if_modified(|current| {
            let changed = *current != valid_until;
            *current = valid_until;
            changed
        });
    }

    /// Records an extension that did not reach a majority: nodes that did apply it now
    /// let the keys expire at `bound` (plus drift) at the earliest, so the validity
    /// ends there if that is sooner (a failed extension to a shorter TTL).
    pub(crate) fn not_extended(&self, bound: Instant) {
        self.valid_until.send_if_modified(|current| {
            let sooner = bound < *current;
            if sooner {
                *current = bound;
            }
            sooner
        });
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }
}
