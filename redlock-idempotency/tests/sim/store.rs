//! A deterministic in-memory [`Store`] with faults drawn from the seed: latency, windows
//! in which every operation fails, and slow writes that outlast the engine's store
//! timeout (and still take effect, as a database's do once sent).
//!
//! It keeps the trait's contract as `RedisStore`'s scripts do: `start` and `finish`
//! compare the writer's token with the record's and write in one step (a lower token:
//! `Stale`, nothing written); `start` keeps and returns a completed or not-stored
//! record, or an in-flight one of another fingerprint; `load` never returns an expired
//! record. Every write it applies is reported to the observer (check 5 looks at the
//! tokens there, check 2 at completed records).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redlock_idempotency::store::StoreFuture;
use redlock_idempotency::{Record, RecordState, Started, Store, StoreError};
use tokio::time::Instant;

use super::observer::Observer;
use redlock_testkit::sim::Log;

struct StoreState {
    records: BTreeMap<String, (Record, Instant)>,
    rng: StdRng,
    /// Base latency of one way.
    latency: Duration,
    /// Windows in which every operation fails.
    failing: Vec<(Instant, Instant)>,
    /// Probability that a write is slow (outlasts the store timeout).
    slow: f64,
    /// Negative controls.
    broken: Broken,
}

/// How the store breaks its contract, for a negative control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Broken {
    /// It keeps it.
    Not,
    /// Writes ignore the fencing token.
    Unfenced,
    /// `start` overwrites a completed record.
    StartOverwrites,
    /// `finish` answers that it wrote, and writes nothing.
    FinishDropped,
}

/// The simulation's store; clones share it.
#[derive(Clone)]
pub(crate) struct SimStore {
    state: Arc<Mutex<StoreState>>,
    observer: Arc<Mutex<Observer>>,
    log: Log,
}

impl std::fmt::Debug for SimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimStore")
    }
}

/// What a write does.
#[derive(Clone, Copy, Debug)]
enum Write {
    Start,
    Finish,
}

enum Written {
    Started(Started),
    Finished,
}

impl SimStore {
    pub(crate) fn new(
        rng: &mut StdRng,
        observer: Arc<Mutex<Observer>>,
        log: Log,
        broken: Broken,
    ) -> Self {
        let origin = Instant::now();
        let mut failing = Vec::new();
        for _ in 0..rng.random_range(0..=2) {
            if rng.random_bool(0.5) {
                let from = origin + Duration::from_millis(rng.random_range(0..1500));
                failing.push((
                    from,
                    from + Duration::from_millis(rng.random_range(50..400)),
                ));
            }
        }
        let slow = if rng.random_bool(0.4) {
            rng.random_range(0.0..0.15)
        } else {
            0.0
        };
        Self {
            state: Arc::new(Mutex::new(StoreState {
                records: BTreeMap::new(),
                rng: StdRng::seed_from_u64(rng.random()),
                latency: Duration::from_micros(rng.random_range(100..3000)),
                failing,
                slow,
                broken,
            })),
            observer,
            log,
        }
    }

    fn state(&self) -> MutexGuard<'_, StoreState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One way's delay; a write's may be slow.
    fn delays(&self, write: bool) -> (Duration, Duration) {
        let mut state = self.state();
        let (base, slow) = (state.latency, state.slow);
        let slow = write && state.rng.random_bool(slow);
        let rng = &mut state.rng;
        let there = if slow {
            Duration::from_millis(rng.random_range(150..600))
        } else {
            base + Duration::from_micros(rng.random_range(0..=base.as_micros() as u64))
        };
        let back = base + Duration::from_micros(rng.random_range(0..=base.as_micros() as u64));
        (there, back)
    }

    fn failing(&self) -> bool {
        let now = Instant::now();
        self.state()
            .failing
            .iter()
            .any(|(from, until)| *from <= now && now < *until)
    }

    /// Applies a write now, in one step.
    fn apply(
        &self,
        write: Write,
        id: &str,
        record: &Record,
        ttl: Duration,
    ) -> Result<Written, StoreError> {
        if self.failing() {
            self.observer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .count("store writes failed");
            self.log.log(|| format!("store {write:?} {id}: fails"));
            return Err(StoreError::Backend("the store is failing".into()));
        }
        let now = Instant::now();
        let mut state = self.state();
        let broken = state.broken;
        let current = state
            .records
            .get(id)
            .filter(|(_, expires)| now < *expires)
            .map(|(r, _)| r.clone());
        if let Some(cur) = &current {
            if broken != Broken::Unfenced && record.token < cur.token {
                drop(state);
                self.observer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .count("stale writes refused");
                self.log.log(|| {
                    format!(
                        "store {write:?} {id}: token {} stale (record's {})",
                        record.token, cur.token
                    )
                });
                return Err(StoreError::Stale {
                    token: record.token,
                    highest: cur.token,
                });
            }
            if let Write::Start = write {
                let stays = matches!(cur.state, RecordState::Completed | RecordState::NotStored)
                    || (cur.state == RecordState::InFlight
                        && cur.fingerprint != record.fingerprint);
                if stays && broken != Broken::StartOverwrites {
                    drop(state);
                    self.log.log(|| {
                        format!(
                            "store start {id}: found {:?} of token {}",
                            cur.state, cur.token
                        )
                    });
                    return Ok(Written::Started(Started::Found(cur.clone())));
                }
            }
        }
        if let (Write::Finish, Broken::FinishDropped) = (write, broken) {
            return Ok(Written::Finished);
        }
        state
            .records
            .insert(id.to_owned(), (record.clone(), now + ttl));
        drop(state);
        let op = match write {
            Write::Start => "start",
            Write::Finish => "finish",
        };
        self.observer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .store_write(op, id, current.as_ref(), record);
        Ok(match write {
            Write::Start => Written::Started(Started::Started),
            Write::Finish => Written::Finished,
        })
    }

    /// A write: sent now, applied once it arrives whether or not its caller still
    /// waits (a task of its own), answered after the way back.
    fn write(
        &self,
        write: Write,
        id: &str,
        record: &Record,
        ttl: Duration,
    ) -> StoreFuture<'static, Written> {
        let (there, back) = self.delays(true);
        let (store, id, record) = (self.clone(), id.to_owned(), record.clone());
        let applied = tokio::spawn(async move {
            tokio::time::sleep(there).await;
            store.apply(write, &id, &record, ttl)
        });
        Box::pin(async move {
            let result = applied
                .await
                .unwrap_or_else(|e| Err(StoreError::Backend(e.to_string().into())));
            tokio::time::sleep(back).await;
            result
        })
    }
}

impl Store for SimStore {
    fn load<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            let (there, back) = self.delays(false);
            tokio::time::sleep(there).await;
            let result = if self.failing() {
                Err(StoreError::Backend("the store is failing".into()))
            } else {
                let now = Instant::now();
                Ok(self
                    .state()
                    .records
                    .get(id)
                    .filter(|(_, expires)| now < *expires)
                    .map(|(r, _)| r.clone()))
            };
            self.log.log(|| match &result {
                Ok(r) => format!(
                    "store load {id}: {:?}",
                    r.as_ref().map(|r| (r.state, r.token))
                ),
                Err(_) => format!("store load {id}: fails"),
            });
            tokio::time::sleep(back).await;
            result
        })
    }

    fn start<'a>(
        &'a self,
        id: &'a str,
        record: &'a Record,
        ttl: Duration,
    ) -> StoreFuture<'a, Started> {
        let written = self.write(Write::Start, id, record, ttl);
        Box::pin(async move {
            match written.await? {
                Written::Started(started) => Ok(started),
                Written::Finished => Ok(Started::Started),
            }
        })
    }

    fn finish<'a>(&'a self, id: &'a str, record: &'a Record, ttl: Duration) -> StoreFuture<'a, ()> {
        let written = self.write(Write::Finish, id, record, ttl);
        Box::pin(async move {
            written.await?;
            Ok(())
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        limit: usize,
    ) -> StoreFuture<'a, Vec<redlock_idempotency::RecordSummary>> {
        Box::pin(async move {
            let now = Instant::now();
            Ok(self
                .state()
                .records
                .iter()
                .filter(|(id, (_, expires))| id.starts_with(prefix) && now < *expires)
                .take(limit)
                .map(|(id, (record, expires))| {
                    redlock_idempotency::RecordSummary::new(
                        id.clone(),
                        record,
                        Some(expires.saturating_duration_since(now)),
                    )
                })
                .collect())
        })
    }
}
