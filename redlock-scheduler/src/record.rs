//! Writing the history without letting the database hold scheduling up.
//!
//! A tick's row is inserted before its run starts, waiting at most one statement timeout,
//! and only while the database is known to answer: the row is a second guard, the Redis
//! claim is the first. When the insert fails or the database is already known to be
//! failing, the run starts anyway (its Redis claim still keeps it to one replica) and the
//! row joins a queue. Every other write (a run's end, a skipped tick) goes through the
//! same queue. One writer task empties it in order, retrying with backoff (100 ms up to
//! 5 s) until the database answers; the history's health says how many writes wait. A row
//! that finds the tick already recorded by another replica when it is finally written is
//! logged at ERROR (the tick may have run twice while the database was away).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::health::HealthCell;
use crate::status::LastRun;
use crate::store::{History, NewRun, Outcome, RunEnd};

/// At most this many writes wait; beyond, the oldest are dropped (and counted).
const MAX_PENDING: usize = 10_000;

/// A row to insert, owned.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) job: Arc<str>,
    pub(crate) tick: DateTime<Utc>,
    pub(crate) token: u64,
    pub(crate) outcome: Outcome,
    pub(crate) note: Option<String>,
    pub(crate) manual: bool,
    pub(crate) at: DateTime<Utc>,
}

/// A write waiting for the database.
#[derive(Debug)]
enum Write {
    Insert(Row),
    Finish {
        job: Arc<str>,
        tick: DateTime<Utc>,
        outcome: Outcome,
        error: Option<String>,
        at: DateTime<Utc>,
        /// Marked recorded once written.
        last: Arc<Mutex<Option<LastRun>>>,
    },
}

/// How a tick's row insert went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// Written: the tick is ours.
    Yes,
    /// Another replica's row is there: the tick is not ours.
    Taken,
    /// Not written yet (queued): the Redis claim alone guards the tick.
    Queued,
}

/// The scheduler's history writer.
pub(crate) struct Recorder {
    history: History,
    scheduler: String,
    instance: Arc<str>,
    pub(crate) health: Arc<HealthCell>,
    queue: Mutex<VecDeque<Write>>,
    wake: Notify,
}

impl Recorder {
    pub(crate) fn new(history: History, scheduler: String, instance: Arc<str>) -> Self {
        Self {
            history,
            scheduler,
            instance,
            health: Arc::new(HealthCell::new("the history database", true)),
            queue: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
        }
    }

    pub(crate) fn history(&self) -> &History {
        &self.history
    }

    fn new_run<'a>(&'a self, row: &'a Row) -> NewRun<'a> {
        NewRun {
            scheduler: &self.scheduler,
            job: &row.job,
            tick: row.tick,
            instance: &self.instance,
            token: row.token,
            outcome: row.outcome,
            note: row.note.as_deref(),
            manual: row.manual,
            at: row.at,
        }
    }

    /// Inserts a tick's row now if the database answers (within one statement timeout),
    /// else queues it.
    pub(crate) async fn insert(&self, row: Row) -> Inserted {
        if self.health.is_ok() && self.pending() == 0 {
            match self.history.claim(&self.new_run(&row)).await {
                Ok(true) => {
                    self.health.succeed();
                    return Inserted::Yes;
                }
                Ok(false) => {
                    self.health.succeed();
                    return Inserted::Taken;
                }
                Err(err) => self.health.fail(&err),
            }
        }
        tracing::warn!(job = %row.job, tick = %row.tick, "history unavailable: the Redis claim alone guards this tick; its row is written when the database answers");
        self.push(Write::Insert(row));
        Inserted::Queued
    }

    /// Queues a skipped tick's row.
    pub(crate) fn insert_later(&self, row: Row) {
        self.push(Write::Insert(row));
    }

    /// Queues a run's end.
    pub(crate) fn finish(
        &self,
        job: Arc<str>,
        tick: DateTime<Utc>,
        outcome: Outcome,
        error: Option<String>,
        last: Arc<Mutex<Option<LastRun>>>,
    ) {
        self.push(Write::Finish {
            job,
            tick,
            outcome,
            error,
            at: Utc::now(),
            last,
        });
    }

    fn push(&self, write: Write) {
        let (pending, dropped) = {
            let mut queue = self
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            queue.push_back(write);
            let dropped = queue.len().saturating_sub(MAX_PENDING);
            queue.drain(..dropped);
            (queue.len(), dropped)
        };
        if dropped > 0 {
            tracing::error!(
                dropped,
                "history writes dropped: {MAX_PENDING} were already waiting for the database"
            );
            self.health.count_dropped(dropped as u64);
        }
        self.health.set_pending(pending);
        self.wake.notify_one();
    }

    /// Writes waiting.
    pub(crate) fn pending(&self) -> usize {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Empties the queue in order, retrying each write until the database takes it, until
    /// `stop` fires and the queue is empty (or `stop` fires and `give_up` does too).
    pub(crate) async fn drain(
        &self,
        stop: redlock_core::CancellationToken,
        give_up: redlock_core::CancellationToken,
    ) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let next = self
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop_front();
            let Some(write) = next else {
                self.health.set_pending(0);
                if stop.is_cancelled() {
                    return;
                }
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = stop.cancelled() => {}
                }
                continue;
            };
            match self.write(&write).await {
                Ok(()) => {
                    self.health.succeed();
                    backoff = Duration::from_millis(100);
                    self.health.set_pending(self.pending());
                }
                Err(err) => {
                    self.health.fail(&err);
                    self.queue
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push_front(write);
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = give_up.cancelled() => {
                            let left = self.pending();
                            tracing::error!(left, "shutdown deadline reached: history writes not done");
                            return;
                        }
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn write(&self, write: &Write) -> Result<(), crate::Error> {
        match write {
            Write::Insert(row) => {
                if !self.history.claim(&self.new_run(row)).await? && row.outcome == Outcome::Running
                {
                    tracing::error!(job = %row.job, tick = %row.tick, "the tick's row was written by another replica while the database was unreachable: it may have run twice");
                }
                Ok(())
            }
            Write::Finish {
                job,
                tick,
                outcome,
                error,
                at,
                last,
            } => {
                self.history
                    .finish(&RunEnd {
                        scheduler: &self.scheduler,
                        job,
                        tick: *tick,
                        instance: &self.instance,
                        outcome: *outcome,
                        error: error.as_deref(),
                        at: *at,
                    })
                    .await?;
                if let Some(last) = last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_mut()
                    .filter(|l| l.tick == *tick)
                {
                    last.recorded = true;
                }
                Ok(())
            }
        }
    }
}
