//! Leader election over a lock: one replica leads, the others wait to take over.
//!
//! Each replica campaigns for one lock. The winner keeps it auto-extended (a leadership
//! *term*, then it steps down and campaigns again) and gets a [`Leadership`] with a
//! fencing *epoch*: strictly greater than every earlier leader's. The others wait in the
//! lock's queue: a leader that steps down (or shuts down) hands the lock over to the
//! longest waiter at once; one that dies is replaced once its lock expires, within the
//! TTL plus one retry interval. [`LeaderElector::step_down`] gives leadership up on
//! demand and keeps out of the campaign for a while, so that another replica takes over.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! use std::time::Duration;
//! use redlock_core::Redlock;
//! use redlock_scheduler::leader::LeaderElector;
//!
//! let redlock = Redlock::builder()
//!     .nodes(cluster.urls())
//! #   .restart_quarantine(false) // the kit's nodes are seconds old
//!     .build()?;
//! let elector = LeaderElector::builder(redlock, "reports")
//!     .instance("replica-a")
//!     .ttl(Duration::from_secs(2))
//!     .on_elected(|l| println!("{} leads with epoch {}", l.instance(), l.epoch()))
//!     .start()?;
//! let leadership = elector.elected().await;
//! assert!(leadership.epoch() >= 1);
//! elector.shutdown().await; // hands leadership over at once
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::RngExt;
use redlock_core::{Error as LockError, Redlock, RetryPolicy};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{TaskTracker, task_tracker::TaskTrackerToken};

use crate::error::BuildError;
use crate::time::{Clock, SystemClock};

/// How long a leadership that ends of its own accord (term, step-down, shutdown) waits
/// for its work in hand to be settled before its lock goes to the next leader.
const SETTLE_BOUND: Duration = Duration::from_secs(1);

type Callback = Arc<dyn Fn(&Leadership) + Send + Sync>;

/// This replica leads: what it needs to know.
#[derive(Debug, Clone)]
pub struct Leadership {
    instance: Arc<str>,
    epoch: u64,
    since: DateTime<Utc>,
    lost: CancellationToken,
    ended: CancellationToken,
    /// Work that must be settled before the lock is handed over (see
    /// [`Leadership::settling`]).
    settling: TaskTracker,
}

impl Leadership {
    /// This replica's id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The fencing epoch: strictly greater than every earlier leadership's.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// When it was won (wall clock).
    pub fn since(&self) -> DateTime<Utc> {
        self.since
    }

    /// Fires when leadership is lost against our will (the lock could not be extended
    /// on a majority: Redis unreachable, or this process stalled). Work done as leader
    /// must stop.
    pub fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }

    /// Fires when leadership ends for any reason: lost, or given up (term over,
    /// shutdown).
    pub fn ended_token(&self) -> &CancellationToken {
        &self.ended
    }

    /// Still leading.
    pub fn is_current(&self) -> bool {
        !self.ended.is_cancelled()
    }

    /// Keeps the lock from going to the next leader, once this leadership ended of its
    /// own accord, until the token is dropped (or [`SETTLE_BOUND`] passed): work that
    /// must be given back to the next leader (a tick claimed but not started) is given
    /// back before that leader can look for it.
    pub(crate) fn settling(&self) -> TaskTrackerToken {
        self.settling.token()
    }
}

/// What changed, as seen by [`LeaderElector::subscribe`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LeaderEvent {
    /// Not leading (at start, or after leadership ended).
    Follower,
    /// This replica leads.
    Elected(Leadership),
}

/// Builds a [`LeaderElector`].
#[must_use = "a builder does nothing until `start()`"]
pub struct LeaderElectorBuilder {
    redlock: Redlock,
    name: String,
    instance: Option<String>,
    ttl: Option<Duration>,
    term: Duration,
    retry_interval: Duration,
    on_elected: Vec<Callback>,
    on_lost: Vec<Callback>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for LeaderElectorBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElectorBuilder")
            .field("name", &self.name)
            .field("instance", &self.instance)
            .field("ttl", &self.ttl)
            .field("term", &self.term)
            .finish_non_exhaustive()
    }
}

/// The default leadership term: then the leader steps down and campaigns again.
pub const DEFAULT_TERM: Duration = Duration::from_secs(600);

/// The default interval between campaign attempts while the leader's lock stands.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// Checks an election's options, for [`LeaderElectorBuilder::start`] and
/// [`SchedulerBuilder::build`](crate::SchedulerBuilder::build) alike: a zero retry
/// interval would have followers retry without pause, a zero term would have the leader
/// step down as soon as it is elected, and a zero TTL is no lock.
pub(crate) fn check_election(
    ttl: Option<Duration>,
    term: Duration,
    retry_interval: Duration,
) -> Result<(), BuildError> {
    let zero = |what: &str| {
        Err(BuildError::InvalidOption {
            what: what.to_owned(),
            reason: "must be more than zero".to_owned(),
        })
    };
    if retry_interval.is_zero() {
        return zero("leader election: retry interval");
    }
    if term.is_zero() {
        return zero("leader election: leadership term");
    }
    if ttl.is_some_and(|ttl| ttl.is_zero()) {
        return zero("leader election: leadership TTL");
    }
    Ok(())
}

impl LeaderElectorBuilder {
    /// This replica's id (default: a random one).
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// The leadership lock's TTL (default: the `Redlock`'s): how long a dead leader
    /// blocks the others at most.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long one leadership lasts before the leader steps down, handing over to the
    /// longest waiting replica, and campaigns again (default 10 minutes). Bounds how
    /// long any one process holds the lock.
    pub fn term(mut self, term: Duration) -> Self {
        self.term = term;
        self
    }

    /// How often followers retry while the leader's lock stands (default 100 ms: every 50
    /// to 100 ms). A graceful hand-over wakes them at once anyway.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// Called (on the election task) when this replica becomes leader.
    pub fn on_elected(mut self, f: impl Fn(&Leadership) + Send + Sync + 'static) -> Self {
        self.on_elected.push(Arc::new(f));
        self
    }

    /// Called when this replica's leadership ends (lost or given up); see
    /// [`Leadership::lost_token`] to tell which.
    pub fn on_lost(mut self, f: impl Fn(&Leadership) + Send + Sync + 'static) -> Self {
        self.on_lost.push(Arc::new(f));
        self
    }

    /// Checks the options, then starts campaigning on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidOption`] for a zero term, retry interval or TTL (the same
    /// checks as [`SchedulerBuilder::build`](crate::SchedulerBuilder::build)'s), or an
    /// empty lock name; [`BuildError::NameTooLong`] for a lock name longer than the
    /// client's `max_resource_len` (512 bytes by default); nothing is started then.
    pub fn start(self) -> Result<LeaderElector, BuildError> {
        check_election(self.ttl, self.term, self.retry_interval)?;
        if self.name.is_empty() {
            return Err(BuildError::InvalidOption {
                what: "leader election: lock name".to_owned(),
                reason: "must not be empty".to_owned(),
            });
        }
        crate::keys::check_len(
            crate::keys::NameKind::Election,
            &self.name,
            self.redlock.max_resource_len(),
        )?;
        Ok(self.spawn())
    }

    /// The wall clock a leadership's [`since`](Leadership::since) is read from
    /// (default: the system's). Lock timing never uses it.
    pub fn clock(self, clock: impl Clock) -> Self {
        self.shared_clock(Arc::new(clock))
    }

    pub(crate) fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Starts campaigning with options checked already.
    pub(crate) fn spawn(self) -> LeaderElector {
        let instance: Arc<str> = self.instance.unwrap_or_else(random_instance).into();
        let (events, _) = watch::channel(LeaderEvent::Follower);
        let events = Arc::new(events);
        let stop = CancellationToken::new();
        let step_downs = Arc::new(StepDowns::default());
        let campaign = Campaign {
            redlock: self.redlock,
            resource: self.name,
            instance: Arc::clone(&instance),
            ttl: self.ttl,
            term: self.term,
            retry_interval: self.retry_interval,
            on_elected: self.on_elected,
            on_lost: self.on_lost,
            clock: self.clock,
            events: Arc::clone(&events),
            stop: stop.clone(),
            step_downs: Arc::clone(&step_downs),
        };
        let task = tokio::spawn(campaign.run());
        LeaderElector {
            instance,
            events,
            stop,
            step_downs,
            task: tokio::sync::Mutex::new(Some(task)),
        }
    }
}

/// A running election: this replica campaigns until [`shutdown`](Self::shutdown).
#[derive(Debug)]
pub struct LeaderElector {
    instance: Arc<str>,
    events: Arc<watch::Sender<LeaderEvent>>,
    stop: CancellationToken,
    step_downs: Arc<StepDowns>,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl LeaderElector {
    /// An elector for the lock `name` (every replica of one service must use the same).
    pub fn builder(redlock: Redlock, name: impl Into<String>) -> LeaderElectorBuilder {
        LeaderElectorBuilder {
            redlock,
            name: name.into(),
            instance: None,
            ttl: None,
            term: DEFAULT_TERM,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            on_elected: Vec::new(),
            on_lost: Vec::new(),
            clock: Arc::new(SystemClock),
        }
    }

    /// This replica's id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The current leadership, if this replica leads.
    pub fn leadership(&self) -> Option<Leadership> {
        match &*self.events.borrow() {
            LeaderEvent::Elected(l) if l.is_current() => Some(l.clone()),
            _ => None,
        }
    }

    /// The events, as a `watch` receiver: the current state, then every change.
    pub fn subscribe(&self) -> watch::Receiver<LeaderEvent> {
        self.events.subscribe()
    }

    /// Waits until this replica leads.
    pub async fn elected(&self) -> Leadership {
        let mut rx = self.events.subscribe();
        loop {
            if let LeaderEvent::Elected(l) = &*rx.borrow_and_update()
                && l.is_current()
            {
                return l.clone();
            }
            if rx.changed().await.is_err() {
                // The campaign ended: wait forever, like a follower.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Gives leadership up now, if this replica leads: the leadership ends (its
    /// [`ended_token`](Leadership::ended_token) fires, the `on_lost` callbacks run, the
    /// events say [`LeaderEvent::Follower`]), the lock is released, which hands it to the
    /// longest waiting replica at once, and this replica campaigns again only after
    /// `back_off` (give it at least the lock's TTL for the others to take over). A
    /// voluntary end, like the end of a term: [`lost_token`](Leadership::lost_token) does
    /// not fire, so work that may outlive leadership (holding locks of its own) goes on.
    ///
    /// Returns `true` once the leadership has ended and the lock is released (should
    /// the leadership end otherwise meanwhile, lost or at the end of its term, the
    /// back-off holds all the same); `false` at once if this replica does not lead.
    pub async fn step_down(&self, back_off: Duration) -> bool {
        let Some(leadership) = self.leadership() else {
            return false;
        };
        let (reply, replied) = tokio::sync::oneshot::channel();
        {
            let mut state = locked(&self.step_downs.state);
            if state.closed.is_some_and(|epoch| epoch >= leadership.epoch) {
                // That leadership is over already.
                return false;
            }
            state.pending.push(StepDown {
                epoch: leadership.epoch,
                back_off,
                reply,
            });
        }
        self.step_downs.wake.notify_one();
        replied.await.unwrap_or(false)
    }

    /// Stops campaigning; a leader hands the lock over to the longest waiting replica
    /// at once. Returns when done.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LeaderElector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Locks a std mutex, ignoring poisoning (the data are plain values).
fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A request to give up the leadership of `epoch`.
#[derive(Debug)]
struct StepDown {
    epoch: u64,
    back_off: Duration,
    /// Told once the leadership has ended and the lock is released.
    reply: tokio::sync::oneshot::Sender<bool>,
}

/// Step-down requests, between [`LeaderElector::step_down`] and the campaign.
#[derive(Debug, Default)]
struct StepDowns {
    state: Mutex<StepDownState>,
    /// A request is waiting.
    wake: Notify,
}

#[derive(Debug, Default)]
struct StepDownState {
    /// Requests waiting for the campaign.
    pending: Vec<StepDown>,
    /// The latest epoch whose leadership ended: requests for it (or older) are refused.
    closed: Option<u64>,
}

impl StepDowns {
    /// Whether a step-down of the leadership of `epoch` is asked for.
    fn requested(&self, epoch: u64) -> bool {
        locked(&self.state).pending.iter().any(|s| s.epoch == epoch)
    }

    /// The leadership of `epoch` ends: no more requests for it; the ones there are.
    fn close(&self, epoch: u64) -> Vec<StepDown> {
        let mut state = locked(&self.state);
        state.closed = Some(epoch);
        // Requests for older epochs cannot be there (they are refused once closed);
        // their replies would say `false` when dropped.
        std::mem::take(&mut state.pending)
            .into_iter()
            .filter(|s| s.epoch == epoch)
            .collect()
    }
}

struct Campaign {
    redlock: Redlock,
    resource: String,
    instance: Arc<str>,
    ttl: Option<Duration>,
    term: Duration,
    retry_interval: Duration,
    on_elected: Vec<Callback>,
    on_lost: Vec<Callback>,
    clock: Arc<dyn Clock>,
    events: Arc<watch::Sender<LeaderEvent>>,
    stop: CancellationToken,
    step_downs: Arc<StepDowns>,
}

/// Why a leadership ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Lost,
    Term,
    Stop,
    StepDown,
}

impl Campaign {
    async fn run(self) {
        let ttl = self.ttl.unwrap_or_else(|| self.redlock.default_ttl());
        // Retries come at most one interval apart.
        let half = self.retry_interval / 2;
        let retry = RetryPolicy::deadline(ttl.max(Duration::from_secs(1))).with_delay(half, half);
        while !self.stop.is_cancelled() {
            let acquire = self
                .redlock
                .lock(&self.resource)
                .ttl(ttl)
                .fencing(true)
                .retry(retry);
            let mut lock = tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                result = acquire => match result {
                    Ok(lock) => lock,
                    Err(LockError::Taken { .. }) => continue,
                    Err(err) => {
                        tracing::warn!(election = %self.resource, error = %err, "campaign failed; retrying");
                        tokio::select! {
                            biased;
                            () = self.stop.cancelled() => break,
                            () = tokio::time::sleep(self.retry_interval) => continue,
                        }
                    }
                },
            };
            lock.auto_extend_for(self.term.saturating_add(ttl));
            let leadership = Leadership {
                instance: Arc::clone(&self.instance),
                epoch: lock.fencing_token().unwrap_or(0),
                since: self.clock.now(),
                lost: CancellationToken::new(),
                ended: CancellationToken::new(),
                settling: TaskTracker::new(),
            };
            tracing::info!(election = %self.resource, instance = %self.instance, epoch = leadership.epoch, "elected leader");
            crate::telemetry::leading(true);
            self.events
                .send_replace(LeaderEvent::Elected(leadership.clone()));
            self.on_elected.iter().for_each(|f| f(&leadership));

            let mut term = std::pin::pin!(tokio::time::sleep(self.term));
            let end = loop {
                // A loss is told as one whatever else came at the same instant.
                tokio::select! {
                    biased;
                    () = lock.lost() => break End::Lost,
                    () = self.stop.cancelled() => break End::Stop,
                    () = &mut term => break End::Term,
                    () = self.step_downs.wake.notified() => {
                        if self.step_downs.requested(leadership.epoch) {
                            break End::StepDown;
                        }
                    }
                }
            };
            let step_downs = self.step_downs.close(leadership.epoch);
            match end {
                End::Lost => {
                    tracing::warn!(election = %self.resource, instance = %self.instance, epoch = leadership.epoch, "leadership lost");
                    leadership.lost.cancel();
                }
                End::StepDown => {
                    tracing::info!(election = %self.resource, instance = %self.instance, epoch = leadership.epoch, "stepping down on request");
                }
                End::Term | End::Stop => {
                    tracing::info!(election = %self.resource, instance = %self.instance, epoch = leadership.epoch, "stepping down");
                }
            }
            leadership.ended.cancel();
            crate::telemetry::leading(false);
            self.events.send_replace(LeaderEvent::Follower);
            self.on_lost.iter().for_each(|f| f(&leadership));
            leadership.settling.close();
            if end != End::Lost {
                // What the leader gives back reaches the nodes before the next leader
                // can be elected and look for it (a lost lock has gone already).
                let _ = tokio::time::timeout(SETTLE_BOUND, leadership.settling.wait()).await;
            }
            // A release hands the lock to the longest waiting replica.
            let _ = lock.release().await;
            let back_off = step_downs.iter().map(|s| s.back_off).max();
            for step_down in step_downs {
                let _ = step_down.reply.send(true);
            }
            if let Some(back_off) = back_off {
                // Out of the campaign for a while: another replica takes over.
                tokio::select! {
                    biased;
                    () = self.stop.cancelled() => break,
                    () = tokio::time::sleep(back_off) => {}
                }
            }
        }
    }
}

/// A random replica id: process id and random bits.
pub(crate) fn random_instance() -> String {
    format!(
        "{}-{:06x}",
        std::process::id(),
        rand::rng().random::<u32>() & 0xff_ffff
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

    use super::*;

    fn builder() -> LeaderElectorBuilder {
        // Nothing is contacted before a lock is asked for.
        let redlock = Redlock::builder()
            .nodes(["redis://127.0.0.1:1"])
            .build()
            .unwrap();
        LeaderElector::builder(redlock, "election")
    }

    #[tokio::test]
    async fn zero_election_options_are_refused_at_start() {
        for (what, builder) in [
            ("retry interval", builder().retry_interval(Duration::ZERO)),
            ("leadership term", builder().term(Duration::ZERO)),
            ("leadership TTL", builder().ttl(Duration::ZERO)),
        ] {
            match builder.start() {
                Err(BuildError::InvalidOption { what: option, .. }) => {
                    assert!(option.ends_with(what), "{option}");
                }
                Ok(elector) => {
                    elector.shutdown().await;
                    panic!("{what}: a zero value was accepted");
                }
                Err(other) => panic!("{what}: {other:?}"),
            }
        }
        builder().start().unwrap().shutdown().await;
    }

    #[tokio::test]
    async fn a_lock_name_the_client_would_refuse_is_refused_at_start() {
        let redlock = || {
            Redlock::builder()
                .nodes(["redis://127.0.0.1:1"])
                .build()
                .unwrap()
        };
        match LeaderElector::builder(redlock(), "e".repeat(513)).start() {
            Err(BuildError::NameTooLong(crate::error::NameTooLong {
                kind: crate::keys::NameKind::Election,
                len: 513,
                max: 512,
                ..
            })) => {}
            Ok(elector) => {
                elector.shutdown().await;
                panic!("a 513-byte lock name was accepted");
            }
            Err(other) => panic!("{other:?}"),
        }
        assert!(matches!(
            LeaderElector::builder(redlock(), "").start(),
            Err(BuildError::InvalidOption { .. })
        ));
        LeaderElector::builder(redlock(), "e".repeat(512))
            .start()
            .unwrap()
            .shutdown()
            .await;
    }
}
