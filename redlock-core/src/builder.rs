//! [`RedlockBuilder`]: nodes and options, validated in [`build`](RedlockBuilder::build),
//! and the options' defaults and bounds.
//!
//! Nodes given as ready pools ([`RedlockBuilder::pool`]) are `deadpool_redis::Pool`s of
//! the deadpool-redis version this crate depends on (0.23): depend on the same version
//! to build them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::client::Redlock;
use crate::error::{ConfigError, TtlError};
use crate::node::{Identities, Node};
use crate::quorum::Cluster;
use crate::retry::RetryPolicy;
use crate::shared::Shared;
use crate::wake::Wakeups;
use crate::watchdog::Watchdog;

pub use crate::node::CONNECT_TIMEOUT;
pub use crate::protocol::MAX_TTL;

/// The default TTL of a lock: 10 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The default per-node operation timeout: 100 ms.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);
/// The default clock-drift factor: the drift allowance is `ttl * 0.01 + 2 ms`.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// The default longest time a watched lock is kept alive: 10 minutes.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(600);
/// How long a channel stays subscribed after its last waiter left, by default.
pub const DEFAULT_SUBSCRIPTION_LINGER: Duration = Duration::from_secs(10);

/// The largest drift factor accepted: beyond it the allowance eats the validity that
/// a watched lock needs between two extensions.
const MAX_DRIFT_FACTOR: f64 = 0.25;

/// The default upper bound on every TTL (the default TTL, the maximum TTL, each lock's):
/// 10 minutes. The restart quarantine lasts the maximum TTL, so this bounds it too.
pub const DEFAULT_TTL_LIMIT: Duration = Duration::from_secs(600);
/// The default longest resource name, in bytes: 512.
pub const DEFAULT_MAX_RESOURCE_LEN: usize = 512;

/// The default key prefix.
pub const DEFAULT_KEY_PREFIX: &str = "redlock:";

enum NodeSpec {
    Url(String),
    Client(Box<redis::Client>),
    Pool(deadpool_redis::Pool),
    #[cfg(any(test, feature = "sim"))]
    Fake(crate::node::fake::FakeServer),
}

/// Builds a [`Redlock`]: add nodes, set options, then [`build`](Self::build), which
/// checks everything and contacts no node.
///
/// ```
/// use std::time::Duration;
/// use redlock_core::{ConfigError, Redlock, RetryPolicy};
///
/// let redlock = Redlock::builder()
///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .key_prefix("payments:lock:")
///     .ttl(Duration::from_secs(30))
///     .node_timeout(Duration::from_millis(50))
///     .retry(RetryPolicy::deadline(Duration::from_secs(5)))
///     .build()?;
/// # let _ = redlock;
///
/// // Mistakes are reported before anything is sent.
/// let err = Redlock::builder().node("redis://a:1").node("redis://a:1").build().unwrap_err();
/// assert!(matches!(err, ConfigError::DuplicateNode { .. }));
/// # Ok::<(), ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build()`"]
pub struct RedlockBuilder {
    nodes: Vec<NodeSpec>,
    key_prefix: String,
    ttl: Duration,
    retry: RetryPolicy,
    drift_factor: f64,
    node_timeout: Duration,
    fencing: bool,
    quarantine: bool,
    max_ttl: Option<Duration>,
    ttl_limit: Duration,
    max_resource_len: usize,
    wake_on_release: bool,
    subscription_linger: Duration,
    max_hold: Duration,
    holder: Option<String>,
}

impl std::fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBuilder")
            .field("nodes", &self.nodes.len())
            .field("key_prefix", &self.key_prefix)
            .field("ttl", &self.ttl)
            .field("retry", &self.retry)
            .field("drift_factor", &self.drift_factor)
            .field("node_timeout", &self.node_timeout)
            .field("fencing", &self.fencing)
            .field("quarantine", &self.quarantine)
            .field("max_ttl", &self.max_ttl)
            .field("ttl_limit", &self.ttl_limit)
            .field("max_resource_len", &self.max_resource_len)
            .field("wake_on_release", &self.wake_on_release)
            .field("subscription_linger", &self.subscription_linger)
            .field("max_hold", &self.max_hold)
            .field("holder", &self.holder)
            .finish()
    }
}

#[cfg(any(test, feature = "sim"))]
impl RedlockBuilder {
    /// Adds a node answered by an in-memory server (unit tests of the layers above the
    /// node layer, and simulations of crates built on this one: feature `sim`; not a
    /// stable API).
    #[doc(hidden)]
    pub fn fake(mut self, server: crate::sim::FakeServer) -> Self {
        self.nodes.push(NodeSpec::Fake(server));
        self
    }
}

impl Default for RedlockBuilder {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            ttl: DEFAULT_TTL,
            retry: RetryPolicy::default(),
            drift_factor: DEFAULT_DRIFT_FACTOR,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            fencing: false,
            quarantine: true,
            max_ttl: None,
            ttl_limit: DEFAULT_TTL_LIMIT,
            max_resource_len: DEFAULT_MAX_RESOURCE_LEN,
            wake_on_release: true,
            subscription_linger: DEFAULT_SUBSCRIPTION_LINGER,
            max_hold: DEFAULT_MAX_HOLD,
            holder: None,
        }
    }
}

impl Redlock {
    /// Starts building a client.
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::default()
    }
}

impl RedlockBuilder {
    /// Adds a node by URL: `redis://[user:password@]host:port[/db]`, or `rediss://…` for
    /// TLS (feature `tls`, on by default). Each node must be an independent master: not
    /// a replica of another node, not a Redis Cluster shard of the same data.
    pub fn node(mut self, url: impl Into<String>) -> Self {
        self.nodes.push(NodeSpec::Url(url.into()));
        self
    }

    /// Adds several nodes by URL.
    pub fn nodes<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nodes
            .extend(urls.into_iter().map(|url| NodeSpec::Url(url.into())));
        self
    }

    /// Adds a node through a ready `redis::Client`: for what a URL cannot say, such as
    /// TLS with your own root or client certificates (`redis::Client::build_with_tls`).
    pub fn client(mut self, client: redis::Client) -> Self {
        self.nodes.push(NodeSpec::Client(Box::new(client)));
        self
    }

    /// Adds a node reached through a ready connection pool. Pools cannot be checked for
    /// duplicates: give each node once.
    pub fn pool(mut self, pool: deadpool_redis::Pool) -> Self {
        self.nodes.push(NodeSpec::Pool(pool));
        self
    }

    /// The prefix put before every resource name to form its Redis key
    /// (default `"redlock:"`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The TTL of locks taken without an explicit one (default 10 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How [`Redlock::lock`] retries a busy or unreachable lock (default: 10 attempts,
    /// 50 ms + up to 50 ms of jitter apart).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The clock-drift factor (default 0.01): a lock's validity is
    /// `ttl - elapsed - (ttl * factor + 2 ms)`. From 0 to 0.25; `build()` also checks
    /// that a watched lock of the default and maximum TTL is extended well before the
    /// drift allowance would declare it lost.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// How long one node may take for one operation, connecting included (default
    /// 100 ms). Keep it small compared to the TTL: a dead node costs at most this much.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Hand out a fencing token with every lock (default off; per lock:
    /// [`Acquire::fencing`](crate::Acquire::fencing)). Costs one counter key per resource
    /// on each node, kept without expiry, and, when the nodes' counters disagree (a node
    /// missed a write-back, or their clocks straddle a step of the tokens' clock floor),
    /// one more round trip to align them. See
    /// [`Lock::fencing_token`](crate::Lock::fencing_token).
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Restart quarantine (default on): a node seen up for less than the maximum TTL
    /// (it restarted, and may have forgotten live locks if it does not persist every
    /// write) gets no vote until it has been up that long. This is the Redlock
    /// "delayed restart", enforced by the client so that operators cannot forget it.
    /// Switch it off only for nodes with `appendonly yes` + `appendfsync always`; the
    /// client then warns, on first contact, about each node that is not.
    pub fn restart_quarantine(mut self, on: bool) -> Self {
        self.quarantine = on;
        self
    }

    /// The longest TTL any lock may ask for (default: the default TTL): the restart
    /// quarantine lasts that long. Every client of the same resources should use the
    /// same (or a larger) value.
    pub fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = Some(max_ttl);
        self
    }

    /// The upper bound on every TTL (default [`DEFAULT_TTL_LIMIT`], 10 minutes; at most
    /// [`MAX_TTL`]): the default TTL, the maximum TTL, and each lock's.
    /// A TTL above it is refused with [`TtlError::AboveLimit`], so that a typo
    /// (days for seconds) cannot turn into a resource blocked for days after a crash, or
    /// a restart quarantine as long. Locks held longer than their TTL are what
    /// [`Lock::auto_extend`](crate::Lock::auto_extend) is for; raise the limit only for
    /// locks that must outlive a crashed holder that long.
    pub fn ttl_limit(mut self, limit: Duration) -> Self {
        self.ttl_limit = limit;
        self
    }

    /// The longest resource name accepted, in bytes (default
    /// [`DEFAULT_MAX_RESOURCE_LEN`], 512): a longer one is refused with
    /// [`ArgumentError::ResourceTooLong`](crate::error::ArgumentError::ResourceTooLong) before anything is sent. Resource names often
    /// come from requests (an order id in a URL); the bound keeps one request from
    /// sending megabytes to every node.
    pub fn max_resource_len(mut self, max: usize) -> Self {
        self.max_resource_len = max;
        self
    }

    /// The longest time [`Lock::auto_extend`](crate::Lock::auto_extend) keeps a lock
    /// alive (default 10 minutes), counted from its acquisition; then the lock is left
    /// to expire and reported lost. Every extension path is bounded: a stuck holder
    /// cannot keep a resource forever.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// Wake waiters on release (default on): a client retrying a busy lock subscribes
    /// to the lock key's channel on every node (one subscriber connection per node for
    /// the whole client) and retries as soon as the holder releases, instead of only
    /// after its random delay. Nodes given as pools get no wake-ups.
    pub fn wake_on_release(mut self, on: bool) -> Self {
        self.wake_on_release = on;
        self
    }

    /// How long a lock key's channel stays subscribed after its last waiter of this
    /// client left (default 10 s): steady contention then costs no subscription round
    /// trips, and a client that waited once for a key queues at once the next time.
    /// Shorter frees the subscriptions of keys waited for once sooner.
    pub fn subscription_linger(mut self, linger: Duration) -> Self {
        self.subscription_linger = linger;
        self
    }

    /// Names this client in the values of the locks it takes, so that an operator
    /// listing the held locks ([`Redlock::locks`]) sees who holds each: a service name
    /// and replica, say `"orders-api-7"`. Default: `<host name>:<process id>`. At most
    /// 64 bytes of letters, digits and `.`, `_`, `-`, `:`, `@`.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// Checks the configuration and builds the client. No node is contacted: nodes are
    /// connected on first use, so a node that is down now does not prevent start-up.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for: no nodes, an unparsable URL, the same node twice, a zero
    /// TTL, a TTL not above the drift allowance, a per-node timeout of zero or not below
    /// the TTL, a drift factor outside `[0, 0.25]`, a retry policy with zero attempts, a
    /// TTL (default or maximum) too short for the watchdog to extend a lock in time.
    pub fn build(self) -> Result<Redlock, ConfigError> {
        if self.nodes.is_empty() {
            return Err(ConfigError::NoNodes);
        }
        if !(self.drift_factor.is_finite() && (0.0..=MAX_DRIFT_FACTOR).contains(&self.drift_factor))
        {
            return Err(ConfigError::InvalidDriftFactor {
                factor: self.drift_factor,
            });
        }
        if self.node_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        if self.ttl_limit > MAX_TTL {
            return Err(ConfigError::Ttl(TtlError::TooLong {
                ttl: self.ttl_limit,
                max: MAX_TTL,
            }));
        }
        if self.max_resource_len == 0 {
            return Err(ConfigError::ZeroMaxResourceLen);
        }
        if self.retry.validate().is_err() {
            return Err(ConfigError::ZeroAttempts);
        }
        let holder = match self.holder {
            Some(holder) => crate::value::check_holder(holder)?,
            None => crate::value::default_holder(),
        };

        let mut nodes = Vec::with_capacity(self.nodes.len());
        let mut seen = HashSet::new();
        let mut wants_tls = false;
        for (index, spec) in self.nodes.into_iter().enumerate() {
            let client = match spec {
                NodeSpec::Url(url) => {
                    redis::Client::open(url.as_str()).map_err(|err| ConfigError::InvalidUrl {
                        url: redact(&url),
                        reason: err.to_string(),
                    })?
                }
                NodeSpec::Client(client) => *client,
                NodeSpec::Pool(pool) => {
                    nodes.push(Node::pool(format!("pool#{index}"), pool));
                    continue;
                }
                #[cfg(any(test, feature = "sim"))]
                NodeSpec::Fake(server) => {
                    nodes.push(Node::fake(format!("fake#{index}"), server));
                    continue;
                }
            };
            let info = client.get_connection_info();
            let addr = info.addr().to_string();
            // One server is one vote, whatever database a URL selects on it.
            if !seen.insert(addr.clone()) {
                return Err(ConfigError::DuplicateNode { node: addr });
            }
            let db = info.redis_settings().db();
            let name = if db == 0 {
                addr
            } else {
                format!("{addr}/{db}")
            };
            wants_tls |= matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
            nodes.push(Node::direct(name, client));
        }
        let max_ttl = self.max_ttl.unwrap_or(self.ttl);
        let quarantine = self.quarantine.then_some(max_ttl);
        let identities = Arc::new(Identities::new(
            nodes.iter().map(|node| node.name().to_owned()).collect(),
        ));
        let nodes: Vec<Node> = nodes
            .into_iter()
            .enumerate()
            .map(|(index, node)| {
                node.with_quarantine(quarantine)
                    .with_identity(index, &identities)
            })
            .collect();
        if wants_tls {
            install_tls_provider();
        }
        if nodes.len().is_multiple_of(2) {
            tracing::warn!(
                nodes = nodes.len(),
                "an even number of Redis nodes tolerates no more failures than one node fewer; prefer an odd count"
            );
        }

        let wakeups = self.wake_on_release.then(|| {
            Arc::new(Wakeups::new(
                nodes.iter().map(Node::client).collect(),
                self.subscription_linger,
            ))
        });
        let shared = Shared {
            wakeups,
            watchdog: Watchdog::default(),
            server_clock: crate::server_clock::ServerClock::default(),
            max_hold: self.max_hold,
            handoff_ms: u64::try_from(crate::queue::handoff_time(self.ttl).as_millis())
                .unwrap_or(u64::MAX),
            cluster: Arc::new(Cluster {
                nodes,
                node_timeout: self.node_timeout,
                drift_factor: self.drift_factor,
                identities,
            }),
            key_prefix: self.key_prefix,
            default_ttl: self.ttl,
            retry: self.retry,
            fencing: self.fencing,
            max_ttl: quarantine,
            fence_step_us: crate::quorum::fence_step_us(max_ttl),
            ttl_limit: self.ttl_limit,
            max_resource_len: self.max_resource_len,
            holder,
        };
        if let Some(max_ttl) = quarantine {
            shared.check_ttl(max_ttl)?;
            shared.check_watchable(max_ttl)?;
        }
        shared.check_ttl(self.ttl)?;
        shared.check_watchable(self.ttl)?;
        Ok(Redlock::from_shared(Arc::new(shared)))
    }
}

/// Replaces the password of a URL by `***`, for error messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_owned(),
    }
}

#[cfg(feature = "tls")]
fn install_tls_provider() {
    // Fails only if a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(not(feature = "tls"))]
fn install_tls_provider() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://u:secret@h:1/2"), "redis://u:***@h:1/2");
        assert_eq!(redact("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("nonsense"), "nonsense");
    }
}
