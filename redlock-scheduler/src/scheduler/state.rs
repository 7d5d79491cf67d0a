//! What a scheduler holds: its options, its jobs' state, its background tasks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redlock_core::{CancellationToken, Redlock};
use tokio_util::task::TaskTracker;

use super::placement::Placement;
use crate::error::Error;
use crate::job::Job;
use crate::leader::{LeaderElector, Leadership};
use crate::record::Recorder;
use crate::request::RequestError;
use crate::status::HealthCell;
use crate::status::LastRun;
use crate::time::Clock;
use crate::time::Schedule;

/// What a tick's claim is kept for beyond the misfire grace window (clock skew between
/// replicas).
pub(super) const CLAIM_MARGIN: Duration = Duration::from_secs(5);

pub(super) struct Inner {
    pub(super) redlock: Redlock,
    pub(super) name: String,
    /// The longest resource name `redlock` takes: the job names' bound follows from it
    /// (see [`crate::keys`]).
    pub(super) max_resource_len: usize,
    pub(super) instance: Arc<str>,
    pub(super) jobs: JobTable,
    pub(super) recorder: Option<Arc<Recorder>>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) leader_ttl: Option<Duration>,
    pub(super) term: Duration,
    pub(super) retry_interval: Duration,
    /// TTL of a job's run lock while its run goes on (auto-extended).
    pub(super) run_lock_ttl: Duration,
    /// How many runs this replica takes at once (`None`: no limit).
    pub(super) capacity: Option<usize>,
    /// The runs going on this replica, and those about to start here.
    pub(super) running_here: Arc<AtomicUsize>,
    /// A digest of the names of the jobs declared in code: runs are handed only to
    /// replicas with the same (jobs changed at run time are the same on every replica
    /// once applied; one that lacks a job or its handler yet declines its runs).
    pub(super) jobs_digest: String,
    /// The handlers jobs added at run time may name (those of the jobs declared in
    /// code under their names, and those registered by name).
    pub(super) handlers: HashMap<String, crate::job::Handler>,
    /// Their names, sorted, as a JSON array (for the replica's beats).
    pub(super) handler_names: String,
    /// The number of the last job change applied here.
    pub(super) applied_change: super::changes::Applied,
    /// The jobs whose definition changed here and is not yet published.
    pub(super) unpublished: Mutex<std::collections::HashSet<String>>,
    /// The leader's view of where runs go.
    pub(super) placement: Mutex<Placement>,
    pub(super) elector: OnceLock<LeaderElector>,
    /// Background tasks started (Redis probe, history writer).
    pub(super) background: OnceLock<()>,
    pub(super) redis_health: Arc<HealthCell>,
    pub(super) ready: tokio::sync::watch::Sender<bool>,
    /// Shutdown began: fire no more ticks.
    pub(super) stop_firing: CancellationToken,
    /// Shutdown's deadline passed: cancel the runs still going.
    pub(super) hard_stop: CancellationToken,
    /// The runs (and ticks being claimed) are done: background tasks may end.
    pub(super) stop_background: CancellationToken,
    pub(super) runs: TaskTracker,
    pub(super) background_tasks: TaskTracker,
}

/// A job's definition as this replica runs it now: replaced whole when the job is
/// rescheduled at run time.
pub(super) struct JobDef {
    pub(super) job: Job,
    pub(super) schedule: Schedule,
    /// When this definition took effect, for one set at run time (`None`: declared in
    /// code): ticks before it belong to the one it replaced.
    pub(super) since: Option<DateTime<Utc>>,
    /// Counts the definitions this job had on this replica (a new one restarts its
    /// firing loop).
    pub(super) version: u64,
    /// Its handler is registered on this replica.
    pub(super) runnable: bool,
}

/// How many replaced definitions a job keeps (see [`JobState::replaced`]).
const REPLACED_KEPT: usize = 8;

/// A definition replaced at run time, and when the one that replaced it took effect:
/// its ticks up to then are its own.
#[derive(Clone)]
pub(super) struct Replaced {
    pub(super) def: Arc<JobDef>,
    pub(super) until: DateTime<Utc>,
}

pub(super) struct JobState {
    pub(super) name: Arc<str>,
    def: RwLock<Arc<JobDef>>,
    /// The definitions the job had before the one in force, oldest first (at most
    /// [`REPLACED_KEPT`]): a leader elected after a change fires the ticks each of them
    /// had while nobody led.
    replaced: Mutex<VecDeque<Replaced>>,
    /// Removed at run time: no tick fires, nothing new starts (a run going on finishes).
    removed: AtomicBool,
    pub(super) paused: AtomicBool,
    /// A run of this job is going on this replica.
    pub(super) running: AtomicBool,
    /// That run is for a missed tick (catch-up).
    pub(super) catching_up: AtomicBool,
    /// The tick of that run.
    pub(super) running_tick: Mutex<Option<DateTime<Utc>>>,
    /// That run's lock on the job, until it lets it go.
    pub(super) run_lock: Mutex<Option<redlock_core::LockHandle>>,
    /// Cancels that run on an operator's request.
    pub(super) operator_cancel: Mutex<Option<CancellationToken>>,
    /// The last run this replica saw end.
    pub(super) last: Arc<Mutex<Option<LastRun>>>,
    /// The last tick this replica recorded as skipped.
    pub(super) last_skipped: Mutex<Option<LastRun>>,
    pub(super) skipped: AtomicU64,
    pub(super) abandoned: AtomicU64,
    /// Notified when a run ends.
    pub(super) idle: tokio::sync::Notify,
}

impl JobState {
    pub(super) fn new(def: JobDef) -> Self {
        Self {
            name: def.job.spec.name().into(),
            def: RwLock::new(Arc::new(def)),
            replaced: Mutex::new(VecDeque::new()),
            removed: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            running: AtomicBool::new(false),
            catching_up: AtomicBool::new(false),
            running_tick: Mutex::new(None),
            run_lock: Mutex::new(None),
            operator_cancel: Mutex::new(None),
            last: Arc::new(Mutex::new(None)),
            last_skipped: Mutex::new(None),
            skipped: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            idle: tokio::sync::Notify::new(),
        }
    }

    /// The definition in force.
    pub(super) fn def(&self) -> Arc<JobDef> {
        Arc::clone(
            &self
                .def
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Puts `def` in force (its version set past the one it replaces), bringing the
    /// job back if it was removed. The definition it replaces is kept with the time
    /// `def` took effect, unless the job was removed (its ticks ended then).
    pub(super) fn redefine(&self, mut def: JobDef) {
        let mut current = self
            .def
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        def.version = current.version + 1;
        let was_removed = self.removed.swap(false, Ordering::AcqRel);
        if let (false, Some(until)) = (was_removed, def.since) {
            let mut replaced = lock(&self.replaced);
            if replaced.len() == REPLACED_KEPT {
                replaced.pop_front();
            }
            replaced.push_back(Replaced {
                def: Arc::clone(&current),
                until,
            });
        }
        *current = Arc::new(def);
    }

    /// The definitions replaced at run time, oldest first, each with when the next one
    /// took effect.
    pub(super) fn replaced(&self) -> Vec<Replaced> {
        lock(&self.replaced).iter().cloned().collect()
    }

    /// Removes the job: nothing of it fires or starts from now on (nor do the ticks of
    /// its replaced definitions: a job added again later starts afresh).
    pub(super) fn remove(&self) {
        self.removed.store(true, Ordering::Release);
        lock(&self.replaced).clear();
    }

    /// Whether the job was removed at run time (and not added again).
    pub(super) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Waits until no run of this job is going on this replica.
    pub(super) async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            if !self.running.load(Ordering::Acquire) {
                return;
            }
            idle.await;
        }
    }

    pub(super) fn running_tick(&self) -> Option<DateTime<Utc>> {
        *lock(&self.running_tick)
    }

    /// Whether `tick` was planned under a definition since replaced: it comes after
    /// the definition in force took effect, and that definition has no such tick.
    pub(super) fn superseded(&self, tick: DateTime<Utc>) -> bool {
        let def = self.def();
        def.since.is_some_and(|since| tick > since)
            && !def
                .schedule
                .ticks_between(tick - chrono::Duration::milliseconds(1), tick)
                .contains(&tick)
    }

    /// Whether a run on this replica holds the job's run lock now.
    pub(super) fn holds_run_lock(&self) -> bool {
        lock(&self.run_lock)
            .as_ref()
            .is_some_and(redlock_core::LockHandle::is_held)
    }
}

/// The jobs of a replica: those declared in code, then those added at run time, in
/// the order they came. Never shrinks (a removed job stays, marked so), so an index
/// names one job for the scheduler's life.
pub(super) struct JobTable {
    states: RwLock<Vec<Arc<JobState>>>,
    /// Bumped whenever a job is added, redefined or removed.
    changed: tokio::sync::watch::Sender<u64>,
}

impl JobTable {
    pub(super) fn new(states: Vec<JobState>) -> Self {
        Self {
            states: RwLock::new(states.into_iter().map(Arc::new).collect()),
            changed: tokio::sync::watch::channel(0).0,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<JobState>>> {
        self.states
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The job at `index`, removed or not.
    pub(super) fn get(&self, index: usize) -> Option<Arc<JobState>> {
        self.read().get(index).cloned()
    }

    /// Every job ever declared here, removed ones included, with its index.
    pub(super) fn all(&self) -> Vec<(usize, Arc<JobState>)> {
        self.read().iter().cloned().enumerate().collect()
    }

    /// The jobs in force (not removed).
    pub(super) fn live(&self) -> Vec<Arc<JobState>> {
        self.read()
            .iter()
            .filter(|state| !state.is_removed())
            .cloned()
            .collect()
    }

    /// The job named `name`, removed or not, with its index.
    pub(super) fn find(&self, name: &str) -> Option<(usize, Arc<JobState>)> {
        self.read()
            .iter()
            .enumerate()
            .find(|(_, state)| *state.name == *name)
            .map(|(index, state)| (index, Arc::clone(state)))
    }

    /// Appends a job added at run time; its index.
    pub(super) fn push(&self, state: JobState) -> usize {
        let mut states = self
            .states
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        states.push(Arc::new(state));
        states.len() - 1
    }

    /// Tells the firing loops that a job changed.
    pub(super) fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Fires on every [`notify`](Self::notify).
    pub(super) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// A digest of a set of job names (FNV-1a over the sorted names: the same in every
/// process and build).
pub(super) fn jobs_digest<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for name in names {
        for byte in name.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// A run counted in [`Inner::running_here`] for as long as this lives.
pub(super) struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Counts one more run here, whatever the limit (runs only the leader may start).
    pub(super) fn take(inner: &Inner) -> Self {
        inner.running_here.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(&inner.running_here))
    }

    /// Counts one more run here if the limit leaves room for it.
    pub(super) fn try_take(inner: &Inner) -> Option<Self> {
        let limit = inner.capacity.unwrap_or(usize::MAX);
        inner
            .running_here
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(Arc::clone(&inner.running_here)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Locks a std mutex, ignoring poisoning (the data are plain values).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Inner {
    /// The job named `name`, if it is in force here.
    pub(super) fn job(&self, name: &str) -> Result<(usize, Arc<JobState>), Error> {
        self.jobs
            .find(name)
            .filter(|(_, state)| !state.is_removed())
            .ok_or_else(|| {
                RequestError::UnknownJob {
                    name: name.to_owned(),
                }
                .into()
            })
    }

    pub(super) fn history(&self) -> Option<&crate::History> {
        self.recorder.as_deref().map(Recorder::history)
    }

    /// The current leadership, if this replica leads.
    pub(super) fn leadership(&self) -> Option<Leadership> {
        self.elector.get().and_then(LeaderElector::leadership)
    }

    /// The leader as recorded in the history, for a replica that does not lead (`None`
    /// without a history, or before the leader recorded itself). A record naming this
    /// replica is its own leadership, ended before the record says so: no leader is
    /// known then, rather than this replica.
    pub(super) async fn recorded_leader(&self) -> Option<String> {
        let leader = self.history()?.leader(&self.name).await.ok().flatten()?;
        (*leader != *self.instance).then_some(leader)
    }

    /// How long a leader that stepped down keeps out of the election: the leadership
    /// TTL, at least 2 s, so that another replica takes over.
    pub(super) fn step_down_back_off(&self) -> Duration {
        self.leader_ttl
            .unwrap_or_else(|| self.redlock.default_ttl())
            .max(Duration::from_secs(2))
    }

    /// Cancels the run of `job` going on this replica, as an operator asked: its tick,
    /// or `None` if no run of it goes here.
    pub(super) fn cancel_local(&self, job: &str) -> Option<DateTime<Utc>> {
        // A job removed while its run goes on can still have that run cancelled.
        let (_, state) = self.jobs.find(job)?;
        let token = lock(&state.operator_cancel).clone()?;
        let tick = state.running_tick()?;
        token.cancel();
        Some(tick)
    }

    /// How old a missed tick may be: the job's grace, capped (without a history) by
    /// how long a claim can be kept, since the claims are then the only record.
    pub(super) fn grace(&self, state: &JobState) -> Duration {
        match self.recorder {
            Some(_) => state.def().job.spec.grace(),
            None => state
                .def()
                .job
                .spec
                .grace()
                .min(self.redlock.max_ttl().saturating_sub(CLAIM_MARGIN)),
        }
    }

    /// How long a tick's claim is kept: until its tick leaves the grace window (and a
    /// margin), as far as the Redis nodes allow.
    pub(super) fn claim_ttl(&self, state: &JobState) -> Duration {
        // A tick handed over is claimed ahead of its time.
        let ahead = if self.spreads(state) {
            super::handoff::AHEAD
        } else {
            Duration::ZERO
        };
        self.grace(state)
            .saturating_add(CLAIM_MARGIN)
            .saturating_add(ahead)
            .min(self.redlock.max_ttl())
    }

    pub(super) fn claim_resource(&self, state: &JobState, tick: DateTime<Utc>) -> String {
        crate::keys::claim(&self.name, &state.name, tick.timestamp_millis())
    }

    /// The lock a run of the job holds while it goes on, on whichever replica: no run
    /// starts while another holds it (no overlap, cluster-wide).
    pub(super) fn run_resource(&self, job: &str) -> String {
        crate::keys::run(&self.name, job)
    }

    /// Whether the leader may hand `state`'s runs to other replicas (it has a history
    /// to hand them over through, and the job does not opt out).
    pub(super) fn spreads(&self, state: &JobState) -> bool {
        self.recorder.is_some() && !state.def().job.spec.on_leader()
    }

    /// The latest moment `tick` may still be acted on.
    pub(super) fn deadline(&self, state: &JobState, tick: DateTime<Utc>) -> DateTime<Utc> {
        crate::time::later(tick, self.grace(state))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use chrono::TimeZone;

    use super::*;
    use crate::spec::JobSpec;

    fn at(second: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, second).unwrap()
    }

    /// The definition `expression` of one job, in force from `since`.
    fn def(expression: &str, since: Option<DateTime<Utc>>) -> JobDef {
        let spec = JobSpec::new("job", expression).handler("h");
        JobDef {
            schedule: crate::job::check_spec(&spec, "scheduler", 512).unwrap(),
            job: Job {
                spec,
                handler: super::super::changes::missing_handler("h", "test"),
            },
            since,
            version: 0,
            runnable: false,
        }
    }

    fn replaced(state: &JobState) -> Vec<(String, DateTime<Utc>)> {
        state
            .replaced()
            .into_iter()
            .map(|r| (r.def.schedule.expression().to_owned(), r.until))
            .collect()
    }

    #[test]
    fn replaced_definitions_are_kept_bounded_and_dropped_with_a_removal() {
        let state = JobState::new(def("*/2 * * * * *", None));
        state.redefine(def("1/2 * * * * *", Some(at(10))));
        state.redefine(def("*/5 * * * * *", Some(at(20))));
        assert_eq!(
            replaced(&state),
            vec![
                ("*/2 * * * * *".to_owned(), at(10)),
                ("1/2 * * * * *".to_owned(), at(20)),
            ]
        );
        assert_eq!(state.def().version, 2);
        // Bounded: the oldest go first.
        for second in 21..40 {
            state.redefine(def("* * * * * *", Some(at(second))));
        }
        let kept = replaced(&state);
        assert_eq!(kept.len(), REPLACED_KEPT);
        assert_eq!(kept.last().unwrap().1, at(39));
        // A removal drops them, and the definition it ended is not kept when the job
        // comes back: its ticks ended with the removal.
        state.remove();
        assert!(replaced(&state).is_empty());
        state.redefine(def("*/3 * * * * *", Some(at(50))));
        assert!(!state.is_removed());
        assert!(replaced(&state).is_empty());
    }
}
