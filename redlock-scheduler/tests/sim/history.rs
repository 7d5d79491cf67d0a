//! The history in the simulation: one memory history (the crate's feature `sim`) that
//! each replica reaches through a link of its own, whose statements the seed slows down
//! or fails: a few ms of latency on most, now and then a statement refused, one whose
//! answer is lost after it took effect, or one slower than the statement timeout (taking
//! effect or not), and outages in which every statement fails. A paused replica's
//! statements are held for its pause (one held past the statement timeout answers a
//! timeout, having taken effect); a crashed one's never arrive. The
//! operator's link (requests, and the reads at a seed's end) has no faults.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redlock_scheduler::History;
use redlock_scheduler::admin::{RequestAction, RequestState, SchedulerAdmin};
use redlock_scheduler::history::{MemoryFaults, Outcome, StatementFault};
use redlock_testkit::sim::Log;
use tokio::time::Instant;

use crate::Shared;

/// How long one statement may take.
pub(crate) const STATEMENT_TIMEOUT: Duration = Duration::from_millis(250);

/// The database's faults over a seed, drawn from it (times from the seed's start).
pub(crate) struct DbPlan {
    origin: Instant,
    /// Faults come until then (the seed's end is quiet, so that writes land).
    until: Duration,
    /// The share of statements that fail or time out.
    rate: f64,
    /// Stretches in which every statement fails.
    outages: Vec<(Duration, Duration)>,
}

impl std::fmt::Debug for DbPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbPlan")
            .field("until", &self.until)
            .field("rate", &self.rate)
            .field("outages", &self.outages)
            .finish()
    }
}

impl DbPlan {
    /// No fault at all.
    pub(crate) fn none() -> Self {
        Self {
            origin: Instant::now(),
            until: Duration::ZERO,
            rate: 0.0,
            outages: Vec::new(),
        }
    }

    /// Faults drawn from `rng`, from `origin` up to `within` after it.
    pub(crate) fn draw(rng: &mut StdRng, origin: Instant, within: u64) -> Self {
        let outages = (0..rng.random_range(0..=2))
            .map(|_| {
                let from = Duration::from_millis(rng.random_range(0..within));
                (
                    from,
                    from + Duration::from_millis(rng.random_range(100..2_000)),
                )
            })
            .collect();
        Self {
            origin,
            until: Duration::from_millis(within),
            rate: [0.0, 0.02, 0.08][rng.random_range(0..3)],
            outages,
        }
    }
}

/// The faults of all links, drawn in the order statements are made (one thread: the
/// same order on every replay).
pub(crate) struct Db {
    rng: Mutex<StdRng>,
    plan: DbPlan,
    log: Log,
}

impl Db {
    pub(crate) fn plan(&self) -> &DbPlan {
        &self.plan
    }

    pub(crate) fn new(seed: u64, plan: DbPlan, log: Log) -> Arc<Self> {
        Arc::new(Self {
            rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0xdb_5eed)),
            plan,
            log,
        })
    }
}

/// Replica `replica`'s link to the history.
pub(crate) struct Link {
    pub(crate) replica: usize,
    pub(crate) db: Arc<Db>,
    pub(crate) world: Arc<Shared>,
}

impl MemoryFaults for Link {
    fn statement(&self, operation: &'static str) -> StatementFault {
        let replica = self.replica;
        if self.world.crashed[replica].load(Ordering::SeqCst) {
            return StatementFault::FailBefore;
        }
        let now = Instant::now();
        let paused = self
            .world
            .paused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[replica];
        let plan = &self.db.plan;
        let at = now - plan.origin;
        let fault = if plan
            .outages
            .iter()
            .any(|(from, to)| *from <= at && at < *to)
        {
            StatementFault::FailBefore
        } else {
            let mut rng = self.db.rng.lock().unwrap_or_else(PoisonError::into_inner);
            let latency = Duration::from_millis(rng.random_range(0..4));
            if at < plan.until && rng.random_bool(plan.rate) {
                match rng.random_range(0..3) {
                    0 => StatementFault::FailBefore,
                    1 => StatementFault::FailAfter,
                    _ => StatementFault::Slow {
                        delay: STATEMENT_TIMEOUT + Duration::from_millis(rng.random_range(1..300)),
                        applied: rng.random_bool(0.5),
                    },
                }
            } else {
                StatementFault::Slow {
                    delay: latency,
                    applied: true,
                }
            }
        };
        // A paused process sends nothing until it wakes up.
        let fault = match fault {
            StatementFault::Slow { delay, applied } if paused > now => StatementFault::Slow {
                delay: delay + (paused - now),
                applied,
            },
            other => other,
        };
        if !matches!(fault, StatementFault::Slow { delay, .. } if delay < Duration::from_millis(4))
        {
            self.db
                .log
                .log(|| format!("r{replica} history: {operation}: {fault:?}"));
        }
        fault
    }
}

/// The operator asks `action` (of job `job`): the request's id, if recorded.
pub(crate) async fn ask(
    admin: &SchedulerAdmin,
    action: RequestAction,
    job: usize,
    log: &Log,
) -> Option<String> {
    let name = format!("job{job}");
    let asked = match action {
        RequestAction::Trigger => admin.trigger(&name).await,
        RequestAction::Cancel => admin.cancel(&name).await,
        _ => admin.step_down().await,
    };
    log.log(|| format!("operator asks {action:?} of {name}: {asked:?}"));
    asked.ok()?.request_id().map(str::to_owned)
}

/// What the history holds at a seed's end.
pub(crate) struct HistorySeen {
    pub(crate) effects: Vec<(String, DateTime<Utc>, String)>,
    /// (job, tick ms, instance, succeeded).
    pub(crate) rows: Vec<(usize, i64, String, bool)>,
    /// Triggers done as succeeded: (job, tick ms).
    pub(crate) triggered: Vec<(usize, i64)>,
}

/// Reads the history (through the operator's link, which has no faults); the requests
/// asked before `before` are followed up.
pub(crate) async fn history_seen(
    history: &History,
    admin: &SchedulerAdmin,
    asked: Vec<(Instant, String)>,
    before: Instant,
) -> HistorySeen {
    let job_index = |job: &str| {
        job.strip_prefix("job")
            .and_then(|n| n.parse::<usize>().ok())
    };
    let all = history
        .runs_between("sim", DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC)
        .await
        .expect("the operator's link has no faults");
    let rows = all
        .iter()
        .filter_map(|run| {
            Some((
                job_index(&run.job)?,
                run.tick.timestamp_millis(),
                run.instance.clone(),
                run.outcome == Outcome::Succeeded,
            ))
        })
        .collect();
    let mut triggered = Vec::new();
    for (at, id) in asked.into_iter().filter(|(at, _)| *at < before) {
        let request = admin.request(&id).await.expect("a recorded request");
        let tick = request
            .result
            .as_deref()
            .and_then(|result| result.strip_prefix("ok: tick "))
            .and_then(|tick| DateTime::parse_from_rfc3339(tick).ok());
        if request.action == RequestAction::Trigger
            && request.state == RequestState::Succeeded
            && let (Some(job), Some(tick)) = (request.job.as_deref().and_then(job_index), tick)
        {
            let _ = at;
            triggered.push((job, tick.timestamp_millis()));
        }
    }
    HistorySeen {
        effects: history.memory_effects("sim"),
        rows,
        triggered,
    }
}
