//! What a client, its locks and their background tasks share: the cluster, the
//! configuration, and the client's services (watchdog, wake on release, the nodes'
//! clock). Only the layers above the services use it; each layer below gets just what
//! it needs (the cluster, a number).

use std::sync::Arc;
use std::time::Duration;

use crate::error::{ArgumentError, TtlError};
use crate::protocol::MAX_TTL;
use crate::quorum::Cluster;
use crate::retry::RetryPolicy;
use crate::server_clock::ServerClock;
use crate::wake::Wakeups;
use crate::watchdog::Watchdog;

/// Configuration and nodes, shared by the client, its locks and their background tasks.
pub(crate) struct Shared {
    /// The nodes, their timeout and the drift allowance.
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) key_prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) fencing: bool,
    /// The longest TTL allowed, with the restart quarantine on (`None` when off).
    pub(crate) max_ttl: Option<Duration>,
    /// The step of the clock floor of fencing tokens, in µs: half the maximum TTL, the
    /// restart quarantine's length (see [`crate::quorum::fence_step_us`]).
    pub(crate) fence_step_us: u64,
    /// The upper bound on every TTL (at most [`MAX_TTL`]).
    pub(crate) ttl_limit: Duration,
    /// The longest resource name accepted, in bytes.
    pub(crate) max_resource_len: usize,
    /// Wake-on-release subscribers (`None` when switched off).
    pub(crate) wakeups: Option<Arc<Wakeups>>,
    /// Keeps watched locks alive.
    pub(crate) watchdog: Watchdog,
    /// How long a watched lock is extended at most.
    pub(crate) max_hold: Duration,
    /// How long a release reserves the lock for the next queued waiter (ms).
    pub(crate) handoff_ms: u64,
    /// The nodes' clock, for the order of the wait queue.
    pub(crate) server_clock: ServerClock,
    /// Who this client is, in its locks' values (see [`crate::value`]).
    pub(crate) holder: String,
}

impl Shared {
    /// Checks a TTL against the configuration; returns it in whole milliseconds (what
    /// Redis will apply).
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<u64, TtlError> {
        if ttl > MAX_TTL {
            return Err(TtlError::TooLong { ttl, max: MAX_TTL });
        }
        if ttl > self.ttl_limit {
            return Err(TtlError::AboveLimit {
                ttl,
                limit: self.ttl_limit,
            });
        }
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return Err(TtlError::Zero { ttl });
        }
        let effective = Duration::from_millis(ms);
        let drift = self.cluster.drift(effective);
        if effective <= drift {
            return Err(TtlError::NotAboveDrift { ttl, drift });
        }
        if let Some(max) = self.max_ttl
            && ttl > max
        {
            return Err(TtlError::AboveMax { ttl, max });
        }
        if self.cluster.node_timeout >= effective {
            return Err(TtlError::TimeoutNotBelowTtl {
                timeout: self.cluster.node_timeout,
                ttl,
            });
        }
        Ok(ms)
    }

    /// Checks the resource names of one lock call: at least one, none empty, none
    /// longer than the bound, no name twice.
    pub(crate) fn check_resources(&self, resources: &[String]) -> Result<(), ArgumentError> {
        if resources.is_empty() || resources.iter().any(String::is_empty) {
            return Err(ArgumentError::EmptyResource);
        }
        for resource in resources {
            check_resource_name(resource, self.max_resource_len)?;
        }
        if resources.len() > 1 {
            let mut seen = std::collections::HashSet::with_capacity(resources.len());
            for resource in resources {
                if !seen.insert(resource.as_str()) {
                    return Err(ArgumentError::DuplicateResource {
                        resource: resource.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks that the watchdog can keep a lock of `ttl`: its extension round (due a
    /// third of the TTL after the last one, taking at most one node timeout) ends
    /// before the lock's loss deadline (the TTL minus the drift allowance, twice: once
    /// for the validity, once for the deadline).
    pub(crate) fn check_watchable(&self, ttl: Duration) -> Result<(), TtlError> {
        let period = (ttl / 3).saturating_add(self.cluster.node_timeout);
        let loss = ttl.saturating_sub(self.cluster.drift(ttl).saturating_mul(2));
        if period >= loss {
            return Err(TtlError::ExtensionAfterLoss { ttl, period, loss });
        }
        Ok(())
    }

    /// `<prefix>{<resource>}`: the braces make a Redis Cluster hash tag, so the lock key
    /// and its fencing counter live in the same slot.
    pub(crate) fn key(&self, resource: &str) -> String {
        let mut key = String::with_capacity(self.key_prefix.len() + resource.len() + 2);
        key.push_str(&self.key_prefix);
        key.push('{');
        key.push_str(resource);
        key.push('}');
        key
    }

    /// `<prefix>{<resource>}:fence`: the resource's fencing counter.
    pub(crate) fn fence_key(&self, resource: &str) -> String {
        let mut key = self.key(resource);
        key.push_str(":fence");
        key
    }
}

/// Checks one resource name against the rule every lock call applies: not empty, and
/// at most `max_len` bytes (the client's
/// [`max_resource_len`](crate::RedlockBuilder::max_resource_len), by default
/// [`DEFAULT_MAX_RESOURCE_LEN`](crate::builder::DEFAULT_MAX_RESOURCE_LEN)). For stores keyed by
/// the same names (fencing tables, say), so that they take exactly the names a lock
/// can be taken for.
///
/// ```
/// use redlock_core::builder::DEFAULT_MAX_RESOURCE_LEN;
/// use redlock_core::check_resource_name;
/// use redlock_core::error::ArgumentError;
///
/// assert!(check_resource_name("order:42", DEFAULT_MAX_RESOURCE_LEN).is_ok());
/// assert!(matches!(
///     check_resource_name(&"x".repeat(513), DEFAULT_MAX_RESOURCE_LEN),
///     Err(ArgumentError::ResourceTooLong { len: 513, max: 512, .. })
/// ));
/// assert!(matches!(check_resource_name("", 512), Err(ArgumentError::EmptyResource)));
/// ```
///
/// # Errors
///
/// [`ArgumentError::EmptyResource`], or [`ArgumentError::ResourceTooLong`] with the name's
/// first bytes.
pub fn check_resource_name(resource: &str, max_len: usize) -> Result<(), ArgumentError> {
    if resource.is_empty() {
        return Err(ArgumentError::EmptyResource);
    }
    if resource.len() > max_len {
        return Err(ArgumentError::ResourceTooLong {
            start: truncated(resource, 32),
            len: resource.len(),
            max: max_len,
        });
    }
    Ok(())
}

/// The first `max` bytes of `s` (cut at a character boundary), with `…` if cut.
pub(crate) fn truncated(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
