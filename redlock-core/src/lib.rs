//! A distributed lock over N independent Redis masters: the Redlock algorithm (N = 1 is
//! the plain single-instance lock), for what a `Mutex` does within one process when a
//! service runs as many replicas.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_core::Redlock;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let redlock = Redlock::builder()
//!         .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!         .ttl(Duration::from_secs(10))
//!         .build()?; // checks the options; contacts no node
//!
//!     let lock = redlock.lock("account:42").await?; // retries while busy
//!     // ... move the money, well within `lock.validity()` ...
//!     lock.release().await?;
//!     Ok(())
//! }
//! ```
//!
//! Freshly started nodes get no vote for the maximum TTL (the restart quarantine, below),
//! so a fresh cluster refuses locks for that long: call
//! [`redlock.wait_ready(timeout)`](Redlock::wait_ready) at
//! start-up to wait until a quorum is usable. Turning the quarantine off
//! ([`RedlockBuilder::restart_quarantine`]`(false)`) is safe only when every node persists
//! every write (`appendonly yes` + `appendfsync always`).
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `tls` | on | `rediss://` node URLs, through rustls with the platform's root certificates |
//! | `serde` | off | `Serialize` for the inspection reports ([`inspect`]), for admin endpoints and tools |
//!
//! # How it works
//!
//! - **Acquire**: a random 160-bit value is set with `SET key value NX PX ttl` on every
//!   node at once, each with its own timeout. The lock is held if a majority
//!   (`n / 2 + 1`) said yes and `validity = ttl - elapsed - drift` is still positive
//!   (monotonic clock; `drift = ttl * 0.01 + 2 ms` by default). The call returns as soon
//!   as that is decided; slower nodes still get their command.
//! - **On failure** the value is released on *all* nodes (including those that said no
//!   or did not answer) and the attempt is retried after a random delay, so competing
//!   clients drift apart.
//! - **Release** and **extend** are Lua scripts that act only if the key still holds our
//!   value, so nobody can release or extend someone else's lock, and an expired lock is
//!   never re-created.
//!
//! # Against real nodes
//!
//! ```
//! use std::time::Duration;
//! use redlock_core::{Error, Redlock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! # let urls = cluster.urls();
//! // `urls`: three independent Redis masters, e.g. "redis://10.0.0.1:6379".
//! let redlock = Redlock::builder()
//!     .nodes(urls)
//! #   .restart_quarantine(false) // the test nodes were started a moment ago
//!     .build()?;
//!
//! let lock = redlock.lock("order:42").ttl(Duration::from_secs(5)).await?;
//! assert!(lock.is_valid());
//!
//! // Someone else (or we) cannot take it while it is held.
//! match redlock.try_lock("order:42").await {
//!     Err(Error::Taken { .. }) => {}
//!     other => panic!("expected Taken, got {other:?}"),
//! }
//!
//! // ... the protected work, finished well within `lock.validity()` ...
//! let released = lock.release().await?;
//! assert!(released.was_held());
//! # Ok(())
//! # }
//! ```
//!
//! # Long work, loss, fencing, restarts, waiting
//!
//! - [`Lock::auto_extend`] hands the lock to the client's watchdog (one task for all
//!   locks; locks due together are extended in one round trip per node). If it cannot be
//!   extended on a majority in time, the lock is lost and the holder learns it at once:
//!   [`Lock::lost`], [`Lock::is_held`], [`Lock::cancellation_token`].
//!   [`Redlock::with_lock`] runs a future under a watched lock and drops it the moment
//!   the lock is lost.
//! - [`RedlockBuilder::fencing`]: every lock carries a token strictly greater than all
//!   earlier ones for the resource ([`Lock::fencing_token`]); the protected resource
//!   rejects writes with an older token.
//! - Restart quarantine (on by default): a node up for less than the maximum TTL
//!   ([`RedlockBuilder::max_ttl`]) gets no vote, so a node restarted without persistence
//!   cannot grant a lock it forgot. [`Redlock::ready`] and [`Redlock::node_status`] tell
//!   which nodes vote.
//! - Wake on release (on by default) and a fair wait queue: a release hands the lock to
//!   the client that has waited longest, which is woken at once; nobody starves (clients
//!   that only retry on a timer, and multi-resource waiters, are served in order too).
//!
//! # What it guarantees, and what it does not
//!
//! While [`Lock::is_valid`] is true, no other client holds the resource, provided a
//! majority of nodes keeps the key for its TTL (the restart quarantine covers nodes that
//! restart without persistence) and the processes' clocks run at about the same rate.
//! A process pause (GC, swap, a stopped VM) longer than the validity can leave a holder
//! believing it still holds a lock that expired: check `is_valid()` right before a
//! protected write, keep the work short compared to the TTL, and use fencing tokens so
//! that the protected resource rejects stale writers. The repository's
//! `docs/GUARANTEES.md` and `docs/OPERATIONS.md` give the details.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]
// Under unit tests `clock::Instant` is tokio's own, so its conversions to tokio's are no-ops.
#![cfg_attr(any(test, feature = "sim"), allow(clippy::useless_conversion))]

// The `mod` lines are alphabetical (as `cargo fmt` keeps them); docs/ARCHITECTURE.md
// gives the layers bottom up, each module using only those of its layer or below.
mod acquire;
mod attempt;
pub mod builder;
mod client;
mod clock;
pub mod error;
pub mod inspect;
mod lock;
mod node;
mod protocol;
mod queue;
mod quorum;
mod retry;
pub mod rwlock;
pub mod semaphore;
mod server_clock;
mod shared;
#[cfg(any(test, feature = "sim"))]
#[doc(hidden)]
pub mod sim;
pub mod telemetry;
mod value;
mod wake;
mod watchdog;

#[cfg(test)]
mod tests;

pub use acquire::Acquire;
pub use builder::RedlockBuilder;
pub use client::Redlock;
pub use error::{ArgumentError, BoxError, ConfigError, Error, ErrorClass, Result};
pub use lock::{Finished, Lock, LockHandle, Released};
pub use node::NodeStatus;
pub use retry::RetryPolicy;
pub use shared::check_resource_name;

#[doc = include_str!("../guides/CORE.md")]
pub mod _guide {}
#[doc = include_str!("../guides/GUARANTEES.md")]
pub mod _guarantees {}
#[doc = include_str!("../guides/BENCHMARKS.md")]
pub mod _benchmarks {}

// The README's examples, compiled (and run unless `no_run`) as doctests so that they
// stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
