//! [`Parts`]: the shared context and the parts of the engine, each with its own state,
//! held together: by the [`Scheduler`](crate::Scheduler), and by the leader's loops,
//! which get them all at once.

use std::sync::Arc;

use super::changes::Changes;
use super::context::Context;
use super::handoff::Handoffs;
use super::requests::Requests;
use super::tenure::Tenure;
use super::tick::Ticks;

/// The context and the five parts. Cheap to clone: each is shared.
#[derive(Clone)]
pub(super) struct Parts {
    pub(super) ctx: Arc<Context>,
    /// Leadership: the election and the leader's record.
    pub(super) tenure: Arc<Tenure>,
    /// Claims and runs.
    pub(super) ticks: Arc<Ticks>,
    /// Runs spread over the replicas.
    pub(super) handoffs: Arc<Handoffs>,
    /// Jobs changed at run time.
    pub(super) changes: Arc<Changes>,
    /// Operators' requests.
    pub(super) requests: Arc<Requests>,
}
