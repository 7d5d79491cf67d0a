//! Typed errors: what went wrong and what to do next.
//!
//! Every lock call returns [`Error`]; an invalid argument is [`Error::Argument`] with an
//! [`ArgumentError`]. Building a [`Redlock`](crate::Redlock) returns [`ConfigError`]
//! alone, since nothing but configuration can fail there (no node is contacted at build
//! time). A TTL is checked by the same rules in both: [`TtlError`].

use std::fmt;
use std::time::Duration;

/// A boxed error that can cross threads: what a user's closure returns where this
/// workspace accepts any error (a response body's error, a scheduled job's failure).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The error type of every lock operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The resource is locked by another holder: the listed nodes hold someone else's
    /// value. Retry later (the holder's lock ends at release or TTL), or use a retry
    /// policy with more attempts or a longer deadline.
    #[error(
        "`{resource}` is locked by another holder on {} of {total} nodes ({}) after {attempts} attempt(s); retry later or wait longer",
        nodes.len(), nodes.join(", ")
    )]
    Taken {
        /// The resource (the first one, for a multi-resource lock).
        resource: String,
        /// Nodes (address, no credentials) that answered "already locked" on the last attempt.
        nodes: Vec<String>,
        /// Number of nodes in the set.
        total: usize,
        /// Attempts made.
        attempts: u32,
        /// How long until the holder's lock ends on a majority, unless it is extended or
        /// released sooner, asked of the nodes when the call gave up: a fair
        /// `Retry-After`. With fewer than a majority answering, the longest remaining
        /// time any node reported; `None` only if no node answered.
        retry_after: Option<Duration>,
    },

    /// Too many nodes failed (unreachable, timed out, error reply) for a majority to
    /// answer. Nothing is held. Check the listed nodes; the call can be retried once a
    /// majority is reachable again.
    #[error(
        "no quorum for `{resource}`: {} of {total} nodes failed and {needed} are needed [{}]; {}",
        failures.len(), fmt_failures(failures), advice(failures)
    )]
    NoQuorum {
        /// The resource (the first one, for a multi-resource lock).
        resource: String,
        /// Nodes needed for a majority.
        needed: usize,
        /// Number of nodes in the set.
        total: usize,
        /// What went wrong on each failed node.
        failures: Vec<NodeFailure>,
    },

    /// [`Redlock::wait_ready`](crate::Redlock::wait_ready) gave up: fewer than a majority
    /// of nodes could vote when its time was up, or so many refused for good
    /// (credentials, permissions, TLS) that waiting could not help.
    #[error(
        "not ready after {waited:?}: {ready} of {total} nodes can vote and {needed} are needed [{}]; {}",
        fmt_failures(failures),
        advice(failures)
    )]
    NotReady {
        /// Nodes that can vote.
        ready: usize,
        /// Nodes needed for a majority.
        needed: usize,
        /// Number of nodes in the set.
        total: usize,
        /// Why each other node cannot vote.
        failures: Vec<NodeFailure>,
        /// How long it waited.
        waited: Duration,
    },

    /// The lock's validity ran out: a majority said yes, but too late (acquire took
    /// longer than the TTL minus the clock drift allowance), or the lock had already
    /// expired when it was to be extended. Use a longer TTL or a shorter per-node
    /// timeout; an expired lock must be acquired again, not extended.
    #[error("the lock on `{resource}` expired: {reason}")]
    Expired {
        /// The resource (the first one, for a multi-resource lock).
        resource: String,
        /// Why it is considered expired.
        reason: &'static str,
    },

    /// The lock is no longer ours on a majority of nodes (it expired there, or a node
    /// forgot it), so it cannot be extended. Stop the protected work; acquire again.
    #[error(
        "the lock on `{resource}` is lost: only {held} of {total} nodes still hold it ({needed} needed); stop the protected work and acquire again"
    )]
    Lost {
        /// The resource (the first one, for a multi-resource lock).
        resource: String,
        /// Nodes that confirmed they still hold our value.
        held: usize,
        /// Nodes needed for a majority.
        needed: usize,
        /// Number of nodes in the set.
        total: usize,
    },

    /// A call's argument is invalid; nothing was sent to any node. Fix the call.
    #[error(transparent)]
    Argument(#[from] ArgumentError),

    /// The client's configuration is unusable (two node names for one server, found
    /// once both answered); nothing was sent. Fix the configuration and restart.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl From<TtlError> for Error {
    fn from(error: TtlError) -> Self {
        Self::Argument(ArgumentError::Ttl(error))
    }
}

/// What a lock [`Error`] means for the caller, in the algorithm's terms (no transport
/// vocabulary): what an integration answers its own clients is decided from this (see
/// the `redlock-http` crate for HTTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Another holder has the lock. `retry_after`: how long until its lock ends (unless
    /// extended or released sooner), as [`Error::Taken`] tells it.
    Contended {
        /// The holder's remaining validity, read when the request was refused.
        retry_after: Option<Duration>,
    },
    /// The nodes could not decide in time (no majority reachable, or a grant that came
    /// after its validity): nothing is held; retry later.
    Unavailable,
    /// The call itself is invalid (a TTL, the configuration): nothing was sent; fix the
    /// call.
    InvalidInput,
    /// The resource name is unusable (empty, longer than the client's
    /// [`max_resource_len`](crate::RedlockBuilder::max_resource_len), named twice in one
    /// call): nothing was sent. Where the name comes from a request (an id in a URL),
    /// this is the request's fault, not the server's.
    InvalidResource,
    /// A lock that was held is no longer ours on a majority: stop the protected work.
    Lost,
}

impl Error {
    /// What this error means for the caller: see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Taken { retry_after, .. } => ErrorClass::Contended {
                retry_after: *retry_after,
            },
            Self::NoQuorum { .. } | Self::NotReady { .. } | Self::Expired { .. } => {
                ErrorClass::Unavailable
            }
            Self::Lost { .. } => ErrorClass::Lost,
            Self::Argument(argument) if argument.is_resource() => ErrorClass::InvalidResource,
            Self::Argument(_) | Self::Config(_) => ErrorClass::InvalidInput,
        }
    }
}

/// A configuration error, reported by
/// [`RedlockBuilder::build`](crate::RedlockBuilder::build) (nothing is contacted there),
/// or, as [`Error::Config`], by every lock call of a client whose configuration turned
/// out to be unusable once its nodes answered ([`SameServer`](Self::SameServer)).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No node was given: add at least one with `node(url)` or `pool(pool)`.
    #[error("no Redis node configured: add at least one with `.node(url)` or `.pool(pool)`")]
    NoNodes,

    /// A node URL could not be parsed.
    #[error(
        "node URL `{url}` is invalid ({reason}); expected redis://[user:password@]host:port[/db] or rediss://…"
    )]
    InvalidUrl {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// The parser's explanation.
        reason: String,
    },

    /// The same node was given twice; a duplicate would let one server count as two
    /// votes and break the majority rule.
    #[error("node `{node}` is listed twice: each Redis master may vote only once")]
    DuplicateNode {
        /// The node's address.
        node: String,
    },

    /// The per-node timeout is zero.
    #[error("the per-node timeout must be above zero")]
    ZeroTimeout,

    /// The drift factor is not a finite number in `[0, 0.25]`: the allowance must stay
    /// well below the TTL, or a lock's validity (and a watched lock's time between
    /// extensions) shrinks to nothing.
    #[error(
        "the drift factor must be a finite number from 0 to 0.25 (got {factor}); the usual value is 0.01"
    )]
    InvalidDriftFactor {
        /// The factor given.
        factor: f64,
    },

    /// A retry policy allows zero attempts.
    #[error("a retry policy needs at least one attempt")]
    ZeroAttempts,

    /// The longest resource name was set to zero.
    #[error("the longest resource name must be at least 1 byte")]
    ZeroMaxResourceLen,

    /// The holder name ([`RedlockBuilder::holder`](crate::RedlockBuilder::holder)) is
    /// empty, too long or has a character other than letters, digits and `.`, `_`,
    /// `-`, `:`, `@`.
    #[error(
        "the holder name `{holder}` is invalid: use 1 to 64 letters, digits and `.`, `_`, `-`, `:`, `@` (e.g. \"orders-api-7\")"
    )]
    InvalidHolder {
        /// The name given (its first 64 bytes at most).
        holder: String,
    },

    /// Two nodes of the configuration are one Redis server (the same `run_id`) under two
    /// names: it would vote twice. Found when both were connected; every lock call is
    /// refused from then on. List each server once.
    #[error(
        "nodes `{first}` and `{second}` are the same server (run_id {run_id}): one server may vote only once; list it once and restart the client"
    )]
    SameServer {
        /// The node connected first.
        first: String,
        /// The node found to be the same server.
        second: String,
        /// The server's `run_id`.
        run_id: String,
    },

    /// The default TTL or the maximum TTL is unusable.
    #[error(transparent)]
    Ttl(#[from] TtlError),
}

/// A lock call's argument is invalid (a resource name, a TTL, a permit count, a retry
/// policy): nothing was sent to any node. Fix the call. Reported as
/// [`Error::Argument`] by lock calls, and alone by the calls that only build a handle
/// ([`Redlock::semaphore`](crate::Redlock::semaphore),
/// [`Redlock::rw_lock`](crate::Redlock::rw_lock), [`check_resource_name`](crate::check_resource_name)).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentError {
    /// A lock call named no resource, or an empty one.
    #[error("a lock needs at least one non-empty resource name")]
    EmptyResource,

    /// A resource name is longer than the configured bound; nothing was sent.
    #[error(
        "the resource name `{start}` is {len} bytes long, above the limit of {max}: use a shorter name (e.g. a hash of it), or raise `max_resource_len`"
    )]
    ResourceTooLong {
        /// The name's first bytes (up to 32), not the whole name.
        start: String,
        /// The name's length in bytes.
        len: usize,
        /// The configured bound ([`RedlockBuilder::max_resource_len`](crate::RedlockBuilder::max_resource_len)).
        max: usize,
    },

    /// A multi-resource lock named the same resource twice.
    #[error("resource `{resource}` is named twice in one multi-resource lock")]
    DuplicateResource {
        /// The repeated resource.
        resource: String,
    },

    /// A semaphore was given zero permits.
    #[error("a semaphore needs at least one permit")]
    ZeroPermits,

    /// A semaphore was given more permits than
    /// [`MAX_PERMITS`](crate::semaphore::MAX_PERMITS).
    #[error(
        "a semaphore of {permits} permits is above the limit of {max} permits: use at most {max}"
    )]
    PermitsAboveMax {
        /// The permits given.
        permits: u32,
        /// The most permits a semaphore may have
        /// ([`MAX_PERMITS`](crate::semaphore::MAX_PERMITS)).
        max: u32,
    },

    /// A semaphore's name leaves its slot resources (`<name>/permit/<slot>`, up to the
    /// highest slot) longer than the client's longest resource name.
    #[error(
        "the semaphore name `{start}` is {len} bytes long; with {permits} permits it may be at most {max} bytes (the slot resources `<name>/permit/<slot>` are bounded by `max_resource_len`): use a shorter name, or raise `max_resource_len`"
    )]
    SemaphoreNameTooLong {
        /// The name's first bytes (up to 32), not the whole name.
        start: String,
        /// The name's length in bytes.
        len: usize,
        /// How long the name may be with this many permits: the client's
        /// [`max_resource_len`](crate::RedlockBuilder::max_resource_len) less the
        /// highest slot's suffix (`/permit/<permits - 1>`).
        max: usize,
        /// The permits asked for.
        permits: u32,
    },

    /// More permits (or zero) were asked of a semaphore at once than it has.
    #[error("{asked} permits asked at once of a semaphore of {permits}: ask for 1 to {permits}")]
    TooManyPermits {
        /// Permits asked for.
        asked: u32,
        /// Permits the semaphore has.
        permits: u32,
    },

    /// A retry policy allows zero attempts.
    #[error("a retry policy needs at least one attempt")]
    ZeroAttempts,

    /// The call's TTL is unusable.
    #[error(transparent)]
    Ttl(#[from] TtlError),
}

impl ArgumentError {
    /// Whether the resource name is what is wrong (empty, too long, named twice): where
    /// the name comes from a request, the request's fault.
    pub fn is_resource(&self) -> bool {
        matches!(
            self,
            Self::EmptyResource
                | Self::ResourceTooLong { .. }
                | Self::DuplicateResource { .. }
                | Self::SemaphoreNameTooLong { .. }
        )
    }
}

/// A TTL that the client cannot use: given to the builder
/// ([`ConfigError::Ttl`]) or to a call ([`ArgumentError::Ttl`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TtlError {
    /// A TTL of zero (or under one millisecond) was given.
    #[error("the TTL must be at least 1 ms (got {ttl:?})")]
    Zero {
        /// The TTL given.
        ttl: Duration,
    },

    /// The TTL is too long for Redis' millisecond expiry.
    #[error("the TTL {ttl:?} is too long (at most {max:?})")]
    TooLong {
        /// The TTL given.
        ttl: Duration,
        /// The largest TTL accepted.
        max: Duration,
    },

    /// A TTL (the default, the maximum, or a lock's) is above the configured limit.
    #[error(
        "the TTL {ttl:?} is above the TTL limit {limit:?}: a crashed holder would block the resource (and a restarted node would be quarantined) that long; use a shorter TTL with auto-extension, or raise `ttl_limit` if you mean it"
    )]
    AboveLimit {
        /// The TTL asked for.
        ttl: Duration,
        /// The configured limit ([`RedlockBuilder::ttl_limit`](crate::RedlockBuilder::ttl_limit)).
        limit: Duration,
    },

    /// A lock's TTL is longer than the maximum TTL, which the restart quarantine relies on.
    #[error(
        "the TTL {ttl:?} is above the maximum TTL {max:?}: raise `max_ttl` (the restart quarantine lasts that long)"
    )]
    AboveMax {
        /// The TTL asked for.
        ttl: Duration,
        /// The configured maximum.
        max: Duration,
    },

    /// The TTL leaves no validity once the clock-drift allowance is taken off.
    #[error(
        "the TTL {ttl:?} is not larger than the clock-drift allowance {drift:?}: use a longer TTL"
    )]
    NotAboveDrift {
        /// The TTL given.
        ttl: Duration,
        /// The drift allowance for that TTL (`ttl * drift_factor + 2 ms`).
        drift: Duration,
    },

    /// The per-node timeout is not smaller than the TTL, so one slow node could use up
    /// the whole validity.
    #[error(
        "the per-node timeout {timeout:?} must be smaller than the TTL {ttl:?} (ideally a small fraction of it)"
    )]
    TimeoutNotBelowTtl {
        /// The per-node timeout.
        timeout: Duration,
        /// The TTL.
        ttl: Duration,
    },

    /// A watched lock of this TTL could not be kept: its next extension (a third of
    /// the TTL, plus one per-node timeout for the round) would come after the moment the
    /// watchdog has to declare it lost (the validity end minus the drift allowance).
    #[error(
        "with a TTL of {ttl:?} a watched lock is extended after {period:?} (a third of the TTL plus the per-node timeout), but is declared lost after {loss:?} (the TTL minus twice the drift allowance): use a longer TTL, a smaller drift factor or a shorter node timeout"
    )]
    ExtensionAfterLoss {
        /// The TTL.
        ttl: Duration,
        /// When its first extension round ends at the latest.
        period: Duration,
        /// When the watchdog declares it lost without an extension.
        loss: Duration,
    },
}

/// What went wrong on one node.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeFailure {
    /// The node's address (no credentials).
    pub node: String,
    /// The cause.
    pub cause: NodeError,
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.cause)
    }
}

/// Why one node's answer did not count.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The node did not answer within the per-node timeout (down, paused, cut off, or
    /// overloaded).
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The connection failed or the node answered with an error.
    #[error("{0}")]
    Redis(std::sync::Arc<redis::RedisError>),
    /// The pool could not hand out a connection.
    #[error("pool: {0}")]
    Pool(String),
    /// The node restarted (or started) less than the longest lock TTL ago and may have
    /// forgotten live locks, so its vote does not count yet; the duration is the
    /// quarantine left. Nothing to do: it ends by itself.
    #[error("in restart quarantine for another {0:?}")]
    Quarantined(Duration),
    /// The node refused a command the lock needs (`NOPERM`: an ACL user without it).
    /// Not retried for a while: grant the permission named, then it recovers by itself.
    #[error("permission missing: {0}")]
    Permission(String),
    /// The node refused the credentials (wrong user or password, or none given where
    /// one is needed). Not retried for a while: fix the node's URL.
    #[error("authentication failed ({0}): check the user and password in the node's URL")]
    Authentication(String),
    /// A key the lock uses holds a value of another type (`WRONGTYPE`): something else
    /// wrote it. Not retried: delete the key, or choose another key prefix.
    #[error(
        "`{keys}` holds a value of another type (WRONGTYPE): it was not written by this library; delete it, or use another key prefix"
    )]
    WrongType {
        /// The keys of the refused command.
        keys: String,
    },
    /// The TLS connection could not be set up (the URL says `rediss://`): the handshake
    /// failed, or the port speaks plain Redis. Not retried for a while: fix the URL or
    /// the certificates.
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    /// This node is the same server (same `run_id`) as another node of the
    /// configuration, listed under another name (`localhost` and `127.0.0.1`): one server
    /// must not vote twice, so the client refuses the configuration.
    #[error(
        "the same server as node `{other}` (run_id {run_id}): each Redis server may be listed once; remove one of the two"
    )]
    SameServer {
        /// The other node's name.
        other: String,
        /// The server's `run_id`.
        run_id: String,
    },
}

impl NodeError {
    /// A misconfiguration that retrying cannot cure (a missing permission, bad
    /// credentials): an acquisition stops at once when such failures cost it the
    /// majority, instead of retrying until its deadline.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::Permission(_)
                | Self::Authentication(_)
                | Self::WrongType { .. }
                | Self::Tls(_)
                | Self::SameServer { .. }
        )
    }
}

/// What to do about these failures: how to wait out a restart quarantine, and when
/// switching it off is safe; else where to look.
fn advice(failures: &[NodeFailure]) -> &'static str {
    if failures
        .iter()
        .any(|f| matches!(f.cause, NodeError::Quarantined(_)))
    {
        "a node in restart quarantine (up for less than the max TTL: it may have forgotten locks in a restart) votes once that time is over: wait for it with `Redlock::wait_ready(timeout)`, or switch the quarantine off with `restart_quarantine(false)` only if every node persists each write (`appendonly yes` with `appendfsync always`)"
    } else {
        "check those nodes"
    }
}

fn fmt_failures(failures: &[NodeFailure]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Shorthand for `Result<T, redlock_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_class() {
        let taken = Error::Taken {
            resource: "r".into(),
            nodes: vec![],
            total: 3,
            attempts: 1,
            retry_after: Some(Duration::from_millis(700)),
        };
        assert_eq!(
            taken.class(),
            ErrorClass::Contended {
                retry_after: Some(Duration::from_millis(700))
            }
        );
        let no_quorum = Error::NoQuorum {
            resource: "r".into(),
            needed: 2,
            total: 3,
            failures: vec![],
        };
        assert_eq!(no_quorum.class(), ErrorClass::Unavailable);
        let expired = Error::Expired {
            resource: "r".into(),
            reason: "late",
        };
        assert_eq!(expired.class(), ErrorClass::Unavailable);
        let lost = Error::Lost {
            resource: "r".into(),
            held: 1,
            needed: 2,
            total: 3,
        };
        assert_eq!(lost.class(), ErrorClass::Lost);
        assert_eq!(
            Error::Argument(ArgumentError::EmptyResource).class(),
            ErrorClass::InvalidResource
        );
        assert_eq!(
            Error::Config(ConfigError::ZeroTimeout).class(),
            ErrorClass::InvalidInput
        );
    }
}
