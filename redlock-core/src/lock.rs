//! [`Lock`]: a held lock, its validity, extension and release.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::Instant;
use crate::error::Error;
use crate::protocol::ReleaseMode;
use crate::queue::follow_hand_overs;
use crate::quorum::{Cluster, Fanout, InFlight, OpKind, Target, Until};
use crate::shared::Shared;
use crate::watchdog::{LockState, Watched};

/// A held distributed lock.
///
/// It is yours until [`valid_until`](Self::valid_until): the TTL, minus the time
/// acquiring took, minus the clock-drift allowance. Past that, another client may hold
/// it; check [`is_valid`](Self::is_valid) before a protected write, or
/// [`extend`](Self::extend) in time.
///
/// Release it with [`release`](Self::release). A lock dropped without `release` is
/// released in the background on the current tokio runtime (`Drop` never blocks); with
/// no runtime, it expires at its TTL.
#[must_use = "a lock is released as soon as it is dropped"]
pub struct Lock {
    shared: Arc<Shared>,
    resources: Vec<String>,
    target: Arc<Target>,
    /// Validity, TTL and loss, shared with the watchdog.
    state: Arc<LockState>,
    acquired_at: Instant,
    attempts: u32,
    token: Option<u64>,
    /// Set once released (or handed to a background release).
    done: bool,
    /// The maximum hold the watchdog keeps it for, once watched.
    watched_for: Option<Duration>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("resources", &self.resources)
            .field("ttl", &self.ttl())
            .field("validity", &self.validity())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

/// A successful acquisition attempt, from which a [`Lock`] is made.
pub(crate) struct Granted {
    pub(crate) valid_until: Instant,
    pub(crate) acquired_at: Instant,
    pub(crate) target: Arc<Target>,
    pub(crate) token: Option<u64>,
    /// The acquisition's commands (SETs, fence write-backs) not yet queued on some
    /// nodes: later commands of this lock to those nodes wait for them.
    pub(crate) in_flight: Option<InFlight>,
}

/// What [`Acquire::with_lock`](crate::Acquire::with_lock) returns: the work's output,
/// and how the release after it went.
#[derive(Debug)]
#[non_exhaustive]
pub struct Finished<T> {
    /// What the work returned.
    pub output: T,
    /// The release after the work: [`Released::was_held`] tells whether the lock was
    /// still held to the end; an error when the release could not reach a majority (the
    /// keys then expire by their TTL).
    pub released: Result<Released, Error>,
}

/// What [`Lock::release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Released {
    /// Nodes that confirmed they still held our value and deleted it, by the time the
    /// call returned (it returns once a majority confirmed; the others are released in
    /// the background).
    pub released: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Nodes needed for a majority.
    pub quorum: usize,
    /// The validity had already run out when `release` was called: another client may
    /// have held the resource meanwhile.
    pub expired: bool,
}

impl Released {
    /// A majority still held the lock and released it: nobody else could have taken it
    /// before this release (given the validity had not run out either).
    pub fn was_held(&self) -> bool {
        self.released >= self.quorum && !self.expired
    }
}

impl Lock {
    pub(crate) fn new(
        shared: Arc<Shared>,
        resources: Vec<String>,
        ttl: Duration,
        attempts: u32,
        granted: Granted,
    ) -> Self {
        Self {
            shared,
            resources,
            target: granted.target,
            state: Arc::new(LockState::new(granted.valid_until, ttl, granted.in_flight)),
            acquired_at: granted.acquired_at,
            attempts,
            token: granted.token,
            done: false,
            watched_for: None,
        }
    }

    /// The lock's value on the nodes.
    pub(crate) fn value(&self) -> &str {
        &self.target.value
    }

    /// The client it was taken with.
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The locked resource (the first one, for a multi-resource lock).
    pub fn resource(&self) -> &str {
        self.resources.first().map_or("", String::as_str)
    }

    /// Every resource this lock holds.
    pub fn resources(&self) -> &[String] {
        &self.resources
    }

    /// The TTL last set on the nodes.
    pub fn ttl(&self) -> Duration {
        self.state.ttl()
    }

    /// The fencing token, if the lock was taken with fencing on
    /// ([`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing) or
    /// [`Acquire::fencing`](crate::Acquire::fencing)).
    ///
    /// It is strictly greater than every token handed out before for this resource (for a
    /// multi-resource lock: for each of its resources), by any of the lock calls. Pass it
    /// with every write to the protected resource, and have the resource reject a write
    /// whose token is lower than the highest it has seen: a holder that was paused past
    /// its validity is then refused instead of overwriting its successor's work.
    ///
    /// The token was stored on a majority of nodes before the lock was granted, and is
    /// written to every other node the client reaches. It is never below the granting
    /// nodes' clocks (in microseconds, rounded down to half the maximum TTL), so it is a
    /// large number (store it in a 64-bit column) and keeps increasing through any
    /// number of node restarts without persistence, as long as the restart quarantine is
    /// on and the nodes' clocks agree to within half the maximum TTL. The exact fault
    /// model: `docs/GUARANTEES.md`, "The fault model of fencing tokens".
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// How many attempts it took to acquire (1: the resource was free at once).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// When the successful attempt started (monotonic clock).
    pub fn acquired_at(&self) -> crate::clock::ApiInstant {
        crate::clock::to_api(self.acquired_at)
    }

    /// When the validity ends (monotonic clock). Moves forward with every extension,
    /// including the watchdog's.
    pub fn valid_until(&self) -> crate::clock::ApiInstant {
        crate::clock::to_api(self.state.valid_until())
    }

    /// The validity left; zero once it ran out.
    pub fn validity(&self) -> Duration {
        self.state
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// Whether the validity has not run out yet.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.state.valid_until()
    }

    /// Whether the lock is still ours: valid, and not declared lost by the watchdog.
    pub fn is_held(&self) -> bool {
        !self.state.lost.is_cancelled() && self.is_valid()
    }

    /// Keeps the lock alive in the background until it is released or dropped, for at
    /// most the client's [`max_hold`](crate::RedlockBuilder::max_hold) since it was
    /// acquired: the client's watchdog extends it about every `ttl / 3` (one pipeline
    /// per node for all the locks due together).
    ///
    /// If an extension cannot reach a majority in time, the lock is **lost**: the
    /// watchdog says so no later than the validity end minus the drift allowance, through
    /// [`lost`](Self::lost), [`is_held`](Self::is_held) and
    /// [`cancellation_token`](Self::cancellation_token). Stop the protected work then.
    pub fn auto_extend(&mut self) {
        let max_hold = self.shared.max_hold;
        self.auto_extend_for(max_hold);
    }

    /// [`auto_extend`](Self::auto_extend), with its own maximum hold time (counted from
    /// the acquisition).
    pub fn auto_extend_for(&mut self, max_hold: Duration) {
        self.watched_for = Some(max_hold);
        let stop_at = self
            .acquired_at
            .checked_add(max_hold)
            .unwrap_or_else(|| self.acquired_at + crate::protocol::MAX_TTL);
        let watched = Watched {
            state: Arc::clone(&self.state),
            target: Arc::clone(&self.target),
            prefix_len: self.shared.key_prefix.len(),
            stop_at,
        };
        if !self.shared.watchdog.watch(&self.shared.cluster, watched) {
            tracing::warn!(resource = %self.resource(), "no tokio runtime: the lock cannot be watched");
        }
    }

    /// Completes when the lock is lost: declared lost by the watchdog, or its validity
    /// ran out (without a watchdog, at its validity end).
    pub async fn lost(&self) {
        lost(&self.state).await;
    }

    /// A token cancelled when the lock is lost (see [`lost`](Self::lost)); hand it to
    /// the protected work. Cancelling it yourself does not affect the lock.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.state.lost.child_token()
    }

    /// The error for a lock that was lost.
    pub(crate) fn lost_error(&self) -> Error {
        Error::Lost {
            resource: self.resource().to_owned(),
            held: self.state.last_votes.load(Ordering::Relaxed),
            needed: self.shared.cluster.quorum(),
            total: self.shared.cluster.nodes.len(),
        }
    }

    /// A cheap, cloneable view of this lock for the protected work: resource, fencing
    /// token, validity, loss. It does not keep the lock.
    pub fn handle(&self) -> LockHandle {
        LockHandle {
            resource: self.resource().into(),
            token: self.token,
            state: Arc::clone(&self.state),
        }
    }

    /// Extends the lock to a new TTL, counted from now: longer or shorter than the
    /// current one.
    ///
    /// Strict: a node extends only a key that still holds this lock's value, and never
    /// re-creates an expired one. The extension counts only if a majority accepted it
    /// before the current validity ran out; then the new validity is
    /// `ttl - elapsed - drift` from the start of this call (earlier than before, for a
    /// shorter TTL). Commands still on their way to a node from the acquisition go
    /// first, and an extension by the watchdog ([`auto_extend`](Self::auto_extend))
    /// finishes before this one starts.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] if the validity ran out (before or during the call),
    /// [`Error::Lost`] if a majority no longer holds our value, [`Error::NoQuorum`] if
    /// too many nodes failed, [`Error::Argument`] for an invalid TTL. On error the lock
    /// keeps its previous validity, or ends sooner: a node that did apply a shorter TTL
    /// lets the key expire by it, so the validity ends no later than
    /// `ttl - drift` from the start of this call. The same holds when the call is
    /// cancelled (dropped before it returns): a shorter TTL may have reached the nodes.
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let span = tracing::debug_span!("redlock.extend", resource = %self.resource(), ttl_ms = ttl.as_millis() as u64);
        self.extend_inner(ttl).instrument(span).await
    }

    async fn extend_inner(&mut self, ttl: Duration) -> Result<(), Error> {
        let ttl_ms = self.shared.check_ttl(ttl)?;
        let ttl = Duration::from_millis(ttl_ms);
        // One extension at a time (the watchdog's included): held until this one is
        // over on every node.
        let guard = self.state.begin_extension().await;
        let start = Instant::now();
        if start >= self.state.valid_until() || self.state.lost.is_cancelled() {
            return Err(self.expired("its validity ran out before the extension"));
        }
        // The keys live at least `ttl` from `start` wherever the extension is applied,
        // and no longer than that where it is applied with a shorter TTL: the validity
        // ends by then from now on, also if this call is cancelled half-way (a node may
        // already have applied it).
        let bound = start + ttl.saturating_sub(self.shared.cluster.drift(ttl));
        let valid_until = self.state.valid_until();
        self.state.not_extended(bound);
        let mut fanout = Fanout::start_after(
            &self.shared.cluster,
            &self.target,
            OpKind::Extend { ttl_ms },
            None,
            self.state.barrier().as_ref(),
        );
        let tally = fanout.until_decided().await;
        let decision = crate::quorum::Decision {
            tally,
            failures: fanout.failures(),
        };
        // Where the extension is not yet in a node's connection queue (waiting for the
        // acquisition's commands there, for a connection, or on a pooled connection), a
        // later command of this lock, such as the release, waits for it: it must not
        // reach that node first. The guard is kept until it is over on every node.
        if let Some(in_flight) = fanout.finish_in_background_holding(guard) {
            self.state.set_barrier(in_flight);
        }
        let answered_at = Instant::now();
        if tally.won() && answered_at < valid_until {
            self.state.extended(bound, ttl);
            self.shared.watchdog.rescheduled(&self.state, start);
            tracing::debug!(
                votes = tally.yes,
                validity_ms = self.validity().as_millis() as u64,
                "extended"
            );
            return Ok(());
        }
        // Not extended; but nodes that did apply it let the key expire by it.
        self.state.not_extended(bound);
        if answered_at >= self.state.valid_until() {
            return Err(if tally.won() {
                self.expired("a majority extended it only after its validity had run out")
            } else {
                self.expired("its validity ran out during the extension")
            });
        }
        tracing::debug!(
            yes = tally.yes,
            no = tally.no,
            failed = tally.failed,
            "extension refused"
        );
        if tally.failed > tally.nodes - tally.quorum {
            Err(decision.no_quorum(self.resource()))
        } else {
            Err(Error::Lost {
                resource: self.resource().to_owned(),
                held: tally.yes,
                needed: tally.quorum,
                total: tally.nodes,
            })
        }
    }

    fn expired(&self, reason: &'static str) -> Error {
        Error::Expired {
            resource: self.resource().to_owned(),
            reason,
        }
    }

    /// Stops managing the lock without releasing it: the watchdog no longer extends it,
    /// dropping it no longer releases it, and it stays held on the nodes until its TTL
    /// runs out. For a lock that must outlive its holder's work, such as a claim that
    /// marks a piece of work as done (extend it to the time it should last first).
    /// Returns when it ends, at the latest, on the nodes.
    pub fn detach(mut self) -> crate::clock::ApiInstant {
        self.done = true;
        self.state.ended.store(true, Ordering::Release);
        crate::clock::to_api(self.state.valid_until())
    }

    /// Moves the lock to `target` (same value, other keys) on each node in one step,
    /// keeping its validity, TTL and watchdog: a write lock becoming a read lock (see
    /// `rwlock.rs`). It counts if a majority moved it before the validity ran out; the
    /// old keys are released where they were not moved, and on failure the new ones
    /// too (in the background).
    pub(crate) async fn convert(self, target: Arc<Target>) -> Result<Lock, Error> {
        // No extension meanwhile: it would look for the old keys.
        let guard = self.state.begin_extension().await;
        if !self.is_held() {
            drop(guard);
            return Err(self.expired("its validity ran out before the conversion"));
        }
        let mut fanout = Fanout::start_after(
            &self.shared.cluster,
            &target,
            OpKind::Convert,
            None,
            self.state.barrier().as_ref(),
        );
        let tally = fanout.until_decided().await;
        let failures = fanout.failures();
        let in_flight = fanout.finish_in_background();
        drop(guard);
        let mut converted = Lock {
            shared: Arc::clone(&self.shared),
            resources: self.resources.clone(),
            target,
            state: Arc::new(LockState::new(
                self.state.valid_until(),
                self.ttl(),
                in_flight,
            )),
            acquired_at: self.acquired_at,
            attempts: self.attempts,
            token: None,
            done: false,
            watched_for: None,
        };
        if tally.won() && converted.is_valid() {
            if let Some(max_hold) = self.watched_for {
                converted.auto_extend_for(max_hold);
            }
            // Dropping the old lock stops its watchdog and releases the old keys where
            // they were not moved.
            return Ok(converted);
        }
        tracing::debug!(
            yes = tally.yes,
            no = tally.no,
            failed = tally.failed,
            "conversion refused"
        );
        if !converted.is_valid() {
            return Err(self.expired("its validity ran out during the conversion"));
        }
        if tally.failed > tally.nodes - tally.quorum {
            return Err(crate::quorum::Decision { tally, failures }.no_quorum(self.resource()));
        }
        Err(Error::Lost {
            resource: self.resource().to_owned(),
            held: tally.yes,
            needed: tally.quorum,
            total: tally.nodes,
        })
    }

    /// Releases the lock on every node (compare-and-delete: only our own value is
    /// deleted). Returns once a majority confirmed, or every node answered; the remaining
    /// nodes are released in the background.
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] if too many nodes failed for a majority to answer; the lock
    /// then ends at its TTL on those nodes.
    pub async fn release(mut self) -> Result<Released, Error> {
        self.done = true;
        self.state.ended.store(true, Ordering::Release);
        let span = tracing::debug_span!("redlock.release", resource = %self.resource());
        let expired = !self.is_valid();
        async move {
            // Driven by a task of its own: dropping this future half-way cannot leave
            // the release unsent on some nodes.
            let (cluster, target) = (Arc::clone(&self.shared.cluster), Arc::clone(&self.target));
            let decision = start_release(
                &self.shared.cluster,
                &self.target,
                self.state.barrier().as_ref(),
            )
            .drive_then(Until::WonOrDone, move |answers| {
                follow_hand_overs(cluster, target, answers)
            })
            .await;
            let tally = decision.tally;
            tracing::debug!(released = tally.yes, expired, "released");
            let answered = tally.won() || tally.majority_answered();
            crate::telemetry::release(answered);
            if answered {
                Ok(Released {
                    released: tally.yes,
                    nodes: tally.nodes,
                    quorum: tally.quorum,
                    expired,
                })
            } else {
                Err(decision.no_quorum(self.resource()))
            }
        }
        .instrument(span)
        .await
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        self.state.ended.store(true, Ordering::Release);
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(resource = %self.resource(), "lock dropped outside a tokio runtime: it will expire at its TTL");
            return;
        };
        let mut release = start_release(
            &self.shared.cluster,
            &self.target,
            self.state.barrier().as_ref(),
        );
        let (cluster, target) = (Arc::clone(&self.shared.cluster), Arc::clone(&self.target));
        handle.spawn(async move {
            release.until_done().await;
            let answers = std::mem::take(&mut release.answers);
            follow_hand_overs(cluster, target, answers).await;
        });
    }
}

/// A view of a held lock for the protected work (see [`Lock::handle`]): cheap to clone,
/// `'static`, and it does not keep the lock.
#[derive(Debug, Clone)]
pub struct LockHandle {
    resource: Arc<str>,
    token: Option<u64>,
    state: Arc<LockState>,
}

impl LockHandle {
    /// The locked resource (the first one, for a multi-resource lock).
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The fencing token, if any (see [`Lock::fencing_token`]).
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// The validity left; zero once it ran out.
    pub fn validity(&self) -> Duration {
        self.state
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// When the validity ends (see [`Lock::valid_until`]): it moves with every extension.
    pub fn valid_until(&self) -> crate::clock::ApiInstant {
        crate::clock::to_api(self.state.valid_until())
    }

    /// Whether the lock is still held (see [`Lock::is_held`]).
    pub fn is_held(&self) -> bool {
        !self.state.lost.is_cancelled() && Instant::now() < self.state.valid_until()
    }

    /// Completes when the lock is lost (see [`Lock::lost`]).
    pub async fn lost(&self) {
        lost(&self.state).await;
    }

    /// A token cancelled when the lock is lost.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.state.lost.child_token()
    }
}

/// Completes when `state` is declared lost or its validity runs out (following the
/// validity as extensions move it, earlier or later).
async fn lost(state: &LockState) {
    state.lost_or_expired().await;
}

/// Starts releasing on every node; on a node where commands of this lock are still on
/// their way (`after`), right after them, so that the release cannot overtake the SET
/// (which would leave the key until its TTL) or the fence write-back.
fn start_release(cluster: &Arc<Cluster>, target: &Arc<Target>, after: Option<&InFlight>) -> Fanout {
    Fanout::start_after(
        cluster,
        target,
        OpKind::Release {
            mode: ReleaseMode::HandOver,
        },
        None,
        after,
    )
}
