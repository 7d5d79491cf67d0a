//! Writing the history without letting the database hold scheduling up.
//!
//! A tick's row is inserted before its run starts, waiting at most one statement timeout,
//! and only while the database is known to answer: the row is a second guard, the Redis
//! claim is the first. Rows of ticks due together share one transaction (group commit:
//! a burst of a hundred ticks costs one commit, not a hundred). When the insert fails or
//! the database is already known to be failing, the run starts anyway (its Redis claim
//! still keeps it to one replica) and the row joins a queue. Every other write (a run's
//! end, a skipped tick) goes through the same queue. One writer task empties it in order,
//! many writes to a transaction, retrying with backoff (100 ms up to 5 s) until the
//! database answers; the history's health says how many writes wait. A row that finds
//! the tick already recorded by another replica when it is finally written is logged at
//! ERROR (the tick may have run twice while the database was away).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, oneshot};

use crate::history::{Change, History, HistoryError, NewRun, Outcome, RunEnd};
use crate::status::{HealthCell, LastRun};
use crate::time::Clock;

/// At most this many writes wait; beyond, the oldest are dropped (and counted).
const MAX_PENDING: usize = 10_000;

/// At most this many writes share one transaction.
const MAX_BATCH: usize = 256;

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

/// What a run's end that was not written found in its row.
enum Kept {
    /// Nothing to learn: no row, or not this replica's.
    Nothing,
    /// The run's own transaction committed: the row says `succeeded` (with this note).
    Succeeded(Option<String>),
    /// The row could not be read back.
    Unread,
}

/// Attempts at reading back a row that a run's end did not overwrite.
const READ_BACK_ATTEMPTS: u32 = 3;

/// The scheduler's history writer.
pub(crate) struct Recorder {
    history: History,
    scheduler: String,
    instance: Arc<str>,
    pub(crate) health: Arc<HealthCell>,
    queue: Mutex<VecDeque<Write>>,
    wake: Notify,
    /// Rows of ticks about to run, waiting for the next group commit.
    claims: Mutex<Vec<(Row, oneshot::Sender<Inserted>)>>,
    claims_wake: Notify,
    /// The wall clock a run's end is stamped with.
    clock: Arc<dyn Clock>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Recorder {
    pub(crate) fn new(
        history: History,
        scheduler: String,
        instance: Arc<str>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            clock,
            history,
            scheduler,
            instance,
            health: Arc::new(HealthCell::new("the history database", true)),
            queue: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            claims: Mutex::new(Vec::new()),
            claims_wake: Notify::new(),
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

    /// Inserts a tick's row with the next group commit if the database answers (within
    /// one statement timeout), else queues it.
    pub(crate) async fn insert(&self, row: Row) -> Inserted {
        if self.health.is_ok() {
            let (reply, inserted) = oneshot::channel();
            locked(&self.claims).push((row.clone(), reply));
            self.claims_wake.notify_one();
            if let Ok(inserted) = inserted.await {
                return inserted;
            }
        }
        self.queue_claim(row)
    }

    fn queue_claim(&self, row: Row) -> Inserted {
        tracing::warn!(job = %row.job, tick = %row.tick, "history unavailable: the Redis claim alone guards this tick; its row is written when the database answers");
        self.push(Write::Insert(row));
        Inserted::Queued
    }

    /// Writes the rows of ticks about to run, all waiting rows in one transaction, until
    /// `stop` fires and none wait. While the database fails, waiting rows are queued at
    /// once instead (their runs do not wait on it).
    pub(crate) async fn commit_claims(&self, stop: tokio_util::sync::CancellationToken) {
        loop {
            let batch: Vec<_> = {
                let mut claims = locked(&self.claims);
                let n = claims.len().min(MAX_BATCH);
                claims.drain(..n).collect()
            };
            if batch.is_empty() {
                if stop.is_cancelled() {
                    return;
                }
                tokio::select! {
                    biased;
                    () = stop.cancelled() => {}
                    () = self.claims_wake.notified() => {}
                }
                continue;
            }
            // While the database is known to fail, the rows are queued at once.
            let written = if self.health.is_ok() {
                let changes: Vec<Change<'_>> = batch
                    .iter()
                    .map(|(row, _)| Change::Claim(self.new_run(row)))
                    .collect();
                Some(self.history.apply(&changes).await)
            } else {
                None
            };
            match written {
                Some(Ok(applied)) => {
                    self.health.succeed();
                    for ((_, reply), applied) in batch.into_iter().zip(applied) {
                        let _ = reply.send(if applied {
                            Inserted::Yes
                        } else {
                            Inserted::Taken
                        });
                    }
                }
                failed => {
                    if let Some(Err(err)) = failed {
                        self.health.fail(&err);
                    }
                    let waiting: Vec<_> = locked(&self.claims).drain(..).collect();
                    for (row, reply) in batch.into_iter().chain(waiting) {
                        let _ = reply.send(self.queue_claim(row));
                    }
                }
            }
        }
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
            at: self.clock.now(),
            last,
        });
    }

    fn push(&self, write: Write) {
        let (pending, dropped) = {
            let mut queue = locked(&self.queue);
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
        locked(&self.queue).len()
    }

    /// Runs the writers: the group commit of rows for ticks about to run, and the queue.
    /// Ends once `stop` fires and nothing waits (or `give_up` fires too).
    pub(crate) async fn run(
        &self,
        stop: tokio_util::sync::CancellationToken,
        give_up: tokio_util::sync::CancellationToken,
    ) {
        tokio::join!(self.commit_claims(stop.clone()), self.drain(stop, give_up));
    }

    /// Empties the queue in order, many writes to a transaction, retrying until the
    /// database takes them, until `stop` fires and the queue is empty (or `stop` fires
    /// and `give_up` does too).
    async fn drain(
        &self,
        stop: tokio_util::sync::CancellationToken,
        give_up: tokio_util::sync::CancellationToken,
    ) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let batch: Vec<Write> = {
                let mut queue = locked(&self.queue);
                let n = queue.len().min(MAX_BATCH);
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                self.health.set_pending(0);
                if stop.is_cancelled() {
                    return;
                }
                tokio::select! {
                    biased;
                    () = stop.cancelled() => {}
                    () = self.wake.notified() => {}
                }
                continue;
            }
            match self.write(&batch).await {
                Ok(()) => {
                    self.health.succeed();
                    backoff = Duration::from_millis(100);
                    self.health.set_pending(self.pending());
                }
                Err(err) => {
                    self.health.fail(&err);
                    {
                        let mut queue = locked(&self.queue);
                        for write in batch.into_iter().rev() {
                            queue.push_front(write);
                        }
                    }
                    tokio::select! {
                        biased;
                        () = give_up.cancelled() => {
                            let left = self.pending();
                            tracing::error!(left, "shutdown deadline reached: history writes not done");
                            return;
                        }
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Reads back the row of a run whose end (`outcome`, not `succeeded`) was not
    /// written: a `succeeded` row of this replica is its own transaction's commit, kept.
    async fn kept_row(&self, job: &str, tick: DateTime<Utc>, outcome: Outcome) -> Kept {
        let mut pause = Duration::from_millis(100);
        for attempt in 1..=READ_BACK_ATTEMPTS {
            match self.history.run_at(&self.scheduler, job, tick).await {
                Ok(Some(row))
                    if *row.instance == *self.instance && row.outcome == Outcome::Succeeded =>
                {
                    tracing::warn!(%job, %tick, ended = outcome.as_str(), "the run's transaction committed: its history row stays succeeded");
                    return Kept::Succeeded(row.error);
                }
                Ok(_) => return Kept::Nothing,
                Err(err) if attempt == READ_BACK_ATTEMPTS => {
                    tracing::warn!(%job, %tick, error = %err, "the run's end was not written over its history row, which cannot be read back: the status shows this replica's account");
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
        Kept::Unread
    }

    /// Writes `batch` in one transaction.
    async fn write(&self, batch: &[Write]) -> Result<(), HistoryError> {
        let changes: Vec<Change<'_>> = batch
            .iter()
            .map(|write| match write {
                Write::Insert(row) => Change::Claim(self.new_run(row)),
                Write::Finish {
                    job,
                    tick,
                    outcome,
                    error,
                    at,
                    ..
                } => Change::Finish(RunEnd {
                    scheduler: &self.scheduler,
                    job,
                    tick: *tick,
                    instance: &self.instance,
                    outcome: *outcome,
                    error: error.as_deref(),
                    at: *at,
                }),
            })
            .collect();
        let applied = self.history.apply(&changes).await?;
        for (write, applied) in batch.iter().zip(applied) {
            match write {
                Write::Insert(row) if !applied && row.outcome == Outcome::Running => {
                    // The run's own transaction (`JobContext::transaction`) may have
                    // written it meanwhile: this replica, this leadership's token.
                    let own = self
                        .history
                        .claimant(&self.scheduler, &row.job, row.tick)
                        .await
                        .is_ok_and(|claimant| {
                            claimant.is_some_and(|(instance, token)| {
                                *instance == *self.instance && token == Some(row.token)
                            })
                        });
                    if own {
                        tracing::debug!(job = %row.job, tick = %row.tick, "the tick's row was written by its run's own transaction");
                    } else {
                        tracing::error!(job = %row.job, tick = %row.tick, "the tick's row was written by another replica while the database was unreachable: it may have run twice");
                    }
                }
                Write::Insert(_) => {}
                Write::Finish {
                    job,
                    tick,
                    outcome,
                    last,
                    ..
                } => {
                    let row = if applied || *outcome == Outcome::Succeeded {
                        Kept::Nothing
                    } else {
                        self.kept_row(job, *tick, *outcome).await
                    };
                    if let Some(last) = locked(last).as_mut().filter(|l| l.tick == *tick) {
                        match row {
                            Kept::Nothing => last.recorded = true,
                            Kept::Succeeded(error) => {
                                last.outcome = Outcome::Succeeded;
                                last.error = error;
                                last.recorded = true;
                            }
                            Kept::Unread => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
