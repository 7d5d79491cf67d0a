//! What is said to a node: the operations of the algorithm (`op`), how each becomes a
//! Redis command (`command`: `SET NX PX`, or a script by `EVALSHA`), a watchdog round's
//! extensions as a few commands (`extensions`), and the Lua scripts themselves
//! (`scripts`). The bottom layer: it knows nothing of nodes,
//! connections or quorums.

mod command;
mod extensions;
mod info;
mod op;
pub(crate) mod scripts;

#[cfg(any(test, feature = "sim"))]
pub(crate) use command::Send1;
pub(crate) use command::{
    Command, Step, breaks_connection, load_scripts, query_batch, redis_error,
};
pub(crate) use extensions::Extensions;
pub(crate) use info::info_field;
#[cfg(test)]
pub(crate) use op::with_queues;
pub use op::{MAX_PERMITS, MAX_TTL};
pub(crate) use op::{Op, ReleaseMode, RwKeys, Waiter, WaitingWriter, release_answer};
