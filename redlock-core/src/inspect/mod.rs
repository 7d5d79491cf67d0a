//! What an operator asks of the nodes: the locks held under a prefix
//! ([`Redlock::locks`](crate::Redlock::locks)), semaphores and read-write locks grouped
//! ([`HeldSemaphore`], [`HeldRwLock`]), each node's health
//! ([`Redlock::node_health`](crate::Redlock::node_health)), and a forced release that
//! raises the resource's fence ([`Redlock::force_release`](crate::Redlock::force_release),
//! [`force_release_semaphore`](crate::Redlock::force_release_semaphore),
//! [`force_release_rw`](crate::Redlock::force_release_rw)).
//!
//! None of these take part in the algorithm: they read what the nodes hold (`SCAN`,
//! then one pipeline per node for the keys found), or, for a forced release, overrule
//! it on purpose. With the `serde` feature, every report serializes (durations as
//! milliseconds, errors as their message).
//!
//! ```
//! use std::time::Duration;
//! use redlock_core::Redlock;
//! use redlock_core::inspect::Agreement;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(3).await;
//! let redlock = Redlock::builder()
//!     .nodes(cluster.urls())
//!     .holder("billing-1")
//!     .fencing(true)
//! #   .restart_quarantine(false) // the test nodes were started a moment ago
//!     .build()?;
//! let lock = redlock.lock("invoice:7").ttl(Duration::from_secs(30)).await?;
//!
//! let listing = redlock.locks("invoice:").await?;
//! let held = &listing.locks[0];
//! assert_eq!(held.resource, "invoice:7");
//! assert_eq!(held.holder.as_deref(), Some("billing-1"));
//! assert_eq!(held.agreement, Agreement::Majority);
//! assert!(held.fencing_token >= lock.fencing_token());
//!
//! // The holder is stuck: free the resource, and make its token stale.
//! let forced = redlock.force_release("invoice:7").await?;
//! assert!(forced.fencing_token > lock.fencing_token().unwrap_or(0));
//! assert!(redlock.locks("invoice:").await?.locks.is_empty());
//! # Ok(())
//! # }
//! ```

mod force;
mod groups;
mod health;
mod held;
mod listing;

pub use self::force::{ForceReleased, RwReleased, SemaphoreReleased, SlotReleased};
pub use self::groups::{HeldReader, HeldRwLock, HeldSemaphore, HeldSlot, SIZE_TTL};
pub(crate) use self::groups::{SIZE_REFRESH, record_size};
pub use self::health::NodeHealth;
pub use self::held::{Agreement, HeldLock, NodeLock};
pub use self::listing::{DEFAULT_LIST_LIMIT, ListLocks, LockListing};

use std::time::Duration;

/// How long one inspection round trip to a node may take by default (a `SCAN` page, or
/// a pipeline of up to 1,000 keys): longer than a lock operation's
/// timeout, since an inspection reads much more.
pub const INSPECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Keys asked about in one pipeline (four commands each).
const DETAIL_BATCH: usize = 1000;

/// The only reply of a one-command pipeline.
fn only_reply(
    replies: Vec<redis::RedisResult<redis::Value>>,
) -> Result<redis::Value, crate::error::NodeError> {
    use crate::protocol::redis_error;
    match replies.into_iter().next() {
        Some(reply) => reply.map_err(redis_error),
        None => Err(redis_error(redis::RedisError::from((
            redis::ErrorKind::Client,
            "no reply",
        )))),
    }
}

/// `s` with Redis glob's special characters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Serializers for the reports (`serde` feature): durations in milliseconds, errors as
/// their message.
#[cfg(feature = "serde")]
mod json {
    use std::time::Duration;

    use serde::Serializer;

    pub(super) fn ms<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    #[allow(clippy::ref_option)] // serde's `serialize_with` passes a reference
    pub(super) fn opt_ms<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => ms(d, s),
            None => s.serialize_none(),
        }
    }

    #[allow(clippy::ref_option)]
    pub(super) fn opt_error<S: Serializer, E: std::fmt::Display>(
        e: &Option<E>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match e {
            Some(e) => s.collect_str(e),
            None => s.serialize_none(),
        }
    }

    pub(super) fn failures<S: Serializer>(
        failures: &[crate::error::NodeFailure],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(failures.len()))?;
        for failure in failures {
            seq.serialize_element(&Failure {
                node: &failure.node,
                error: failure.cause.to_string(),
            })?;
        }
        seq.end()
    }

    #[derive(serde::Serialize)]
    struct Failure<'a> {
        node: &'a str,
        error: String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_escaping() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("orders:{x}"), "orders:{x}");
    }
}
