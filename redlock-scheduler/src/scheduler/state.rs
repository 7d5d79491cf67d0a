//! The jobs as this replica holds them (their definitions and the state of their runs)
//! and the count of its runs against its limit. Uses no other part of the scheduler.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::job::Job;
use crate::status::LastRun;
use crate::time::Schedule;

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

/// The runs going on this replica, and those about to start here, against its limit
/// ([`SchedulerBuilder::max_concurrent_runs`](crate::SchedulerBuilder::max_concurrent_runs)).
pub(super) struct Slots {
    /// How many runs this replica takes at once (`None`: no limit).
    capacity: Option<usize>,
    running: Arc<AtomicUsize>,
}

impl Slots {
    pub(super) fn new(capacity: Option<usize>) -> Self {
        Self {
            capacity,
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The limit (`None`: no limit).
    pub(super) fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// How many runs are counted now.
    pub(super) fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Counts one more run here, whatever the limit (runs only the leader may start).
    pub(super) fn take(&self) -> Slot {
        self.running.fetch_add(1, Ordering::AcqRel);
        Slot(Arc::clone(&self.running))
    }

    /// Counts one more run here if the limit leaves room for it.
    pub(super) fn try_take(&self) -> Option<Slot> {
        let limit = self.capacity.unwrap_or(usize::MAX);
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(Arc::clone(&self.running)))
    }
}

/// A run counted in [`Slots`] for as long as this lives.
pub(super) struct Slot(Arc<AtomicUsize>);

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
