//! The memory store behind a [`History`](super::super::History): the tables under one
//! lock, each statement a call that a simulation's faults may slow down or fail.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::super::HistoryError as Error;
use super::Tables;

/// What one statement on a memory history does, as [`MemoryFaults`] decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatementFault {
    /// Answers at once.
    #[default]
    None,
    /// Answers after `delay`. A delay past the statement timeout is a
    /// [`HistoryError::Timeout`](Error::Timeout), the statement taking effect or not as
    /// `applied` says (a database that committed but whose answer came too late).
    Slow {
        /// How long the statement takes.
        delay: Duration,
        /// Whether a statement that times out took effect all the same.
        applied: bool,
    },
    /// Fails before it takes effect (the database refused it).
    FailBefore,
    /// Takes effect, and its answer is lost: the caller gets an error.
    FailAfter,
}

/// Decides, per statement, how a memory history answers: a simulation draws it from its
/// seed. `operation` names the statement as errors do ("write", "read runs", ...).
pub trait MemoryFaults: Send + Sync + 'static {
    /// How the statement `operation` about to run answers.
    fn statement(&self, operation: &'static str) -> StatementFault;
}

/// The tables (shared by every view of one memory history) and the faults of this view.
pub(crate) struct Store {
    tables: Arc<Mutex<Tables>>,
    faults: Option<Arc<dyn MemoryFaults>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("faults", &self.faults.is_some())
            .finish_non_exhaustive()
    }
}

impl Store {
    pub(in super::super) fn new(faults: Option<Arc<dyn MemoryFaults>>) -> Self {
        Self {
            tables: Arc::new(Mutex::new(Tables::default())),
            faults,
        }
    }

    /// A view of the same tables whose statements answer as `faults` decide.
    pub(in super::super) fn view(&self, faults: Arc<dyn MemoryFaults>) -> Self {
        Self {
            tables: Arc::clone(&self.tables),
            faults: Some(faults),
        }
    }

    /// The tables, for a look outside any statement (no fault applies).
    pub(in super::super) fn tables(&self) -> MutexGuard<'_, Tables> {
        // A statement cannot leave the tables half changed: each is one call that does
        // not panic on any input, so a poisoned lock's tables are whole.
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `statement` on the tables as `operation`, within `timeout`, with the fault
    /// [`MemoryFaults`] draws for it.
    pub(in super::super) async fn call<T>(
        &self,
        operation: &'static str,
        timeout: Duration,
        statement: impl FnOnce(&mut Tables) -> T,
    ) -> Result<T, Error> {
        let fault = self
            .faults
            .as_ref()
            .map_or(StatementFault::None, |faults| faults.statement(operation));
        match fault {
            StatementFault::None => Ok(statement(&mut self.tables())),
            StatementFault::Slow { delay, applied } => {
                if delay < timeout {
                    tokio::time::sleep(delay).await;
                    return Ok(statement(&mut self.tables()));
                }
                tokio::time::sleep(timeout).await;
                if applied {
                    statement(&mut self.tables());
                }
                Err(Error::Timeout {
                    operation,
                    after: timeout,
                })
            }
            StatementFault::FailBefore => Err(failed(operation, "refused")),
            StatementFault::FailAfter => {
                statement(&mut self.tables());
                Err(failed(operation, "answer lost"))
            }
        }
    }
}

/// A database error for `operation` of a memory history (a fault, or a refusal).
pub(in super::super) fn failed(operation: &'static str, what: &str) -> Error {
    Error::database(sqlx::Error::Io(std::io::Error::other(format!(
        "simulated fault: {operation}: {what}"
    ))))
}
