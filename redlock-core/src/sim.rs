//! What a deterministic simulation of a crate built on this one needs (feature `sim`;
//! not a stable API): in-memory Redis nodes that answer the library's own commands and
//! expire keys on tokio's clock, the network between them and the clients (each
//! request's [`Fate`], decided by a [`Network`]), and the two sources of core's
//! nondeterminism made settable per thread: its random values ([`seed_rng`]) and the
//! wall clock it reads when no node tells its time ([`set_wall_clock`]).
//!
//! A simulation runs on a current-thread tokio runtime with paused time
//! (`start_paused(true)`): with this feature core measures validity, deadlines and the
//! watchdog's schedule on tokio's clock. Each client is built with
//! [`RedlockBuilder::fake`](crate::RedlockBuilder::fake), one
//! [`FakeServer::for_client`] handle per node.

pub use crate::node::fake::{FakeServer, Fate, Network};

/// Seeds the random source of every choice core makes on this thread (lock values,
/// retry jitter, semaphore slots): one history per seed. `None`: the thread's CSPRNG
/// again.
pub fn seed_rng(seed: Option<u64>) {
    crate::value::seed_rng(seed);
}

/// A number from the random source core draws from on this thread (seeded by
/// [`seed_rng`]): for the random choices of a crate built on this one (ids, say), so
/// that a simulation replays them too.
pub fn random_u128() -> u128 {
    use rand::RngExt;
    crate::value::rng().random()
}

/// Makes this thread's wall clock read `ms` (ms since the Unix epoch) now and move on
/// with tokio's clock; core reads it only when no node tells its time. `None`: the
/// host's clock again.
pub fn set_wall_clock(ms: Option<u64>) {
    crate::clock::set_wall_clock(ms);
}
