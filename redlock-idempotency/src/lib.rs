//! Idempotent HTTP requests across service replicas: a request carrying an
//! `Idempotency-Key` runs once cluster-wide, and its retries get the first run's
//! response, replayed byte for byte.
//!
//! This crate is the framework-free engine: the options ([`Idempotency`], one type,
//! with its defaults and setters), the key rule, the fingerprint, the decision
//! ([`Idempotency::begin`]), a request's whole flow through the middleware (the
//! [`middleware`] module: [`Idempotency::admit`] to [`Collect::finish`](middleware::Collect::finish)), the records
//! and their stores; its refusals are `redlock-http`'s vocabulary ([`Refusal`],
//! [`RefusalKind`]). The middleware in the web crates takes an [`Idempotency`] and only
//! translates requests, responses and bodies:
//! `redlock_tower::IdempotencyLayer::new(idempotency)` (axum, hyper, tonic) and
//! `redlock_actix::IdempotencyMiddleware::new(idempotency)` (actix-web). It is a crate
//! of its own, above `redlock-http` (which it depends on for the problem bodies, the key
//! rule and the refusal vocabulary), because its stores (Redis, SQL) are weight that
//! `redlock-http` should not carry.
//!
//! # Semantics
//!
//! (Those of the IETF draft `draft-ietf-httpapi-idempotency-key-header`.)
//!
//! | the request | the answer |
//! | --- | --- |
//! | first with its key (in its scope) | the lock on `resource_prefix` + scope + key is taken with a fencing token, the record says "in flight" with the token and the request's [`Fingerprint`], the handler runs, its response is stored, the lock is released |
//! | same key, while the first runs | `409` with `Retry-After`; or, with [`wait`](Idempotency::wait), the replay once it finishes |
//! | same key after the first finished, same fingerprint | the stored response (status, headers, body), marked `Idempotent-Replayed: true` ([`REPLAYED_HEADER`]); the handler does not run |
//! | same key, different fingerprint | `422`; nothing runs |
//! | no key where one is [`required`](Idempotency::required) (the default) | `400`; where optional, the request passes through unprotected |
//! | same key, first one answered `5xx` (not stored by default, [`store_if`](Idempotency::store_if)) | runs again |
//! | same key, first one's body larger than [`max_body`](Idempotency::max_body) | `409`: it ran, its answer was not kept (never a truncated replay) |
//!
//! The fingerprint covers the method, the target (path and query, as the client sent
//! it: `redlock_http::key::sent_target`, the same under a nested router in both web crates),
//! the headers named by
//! [`fingerprint_headers`](Idempotency::fingerprint_headers) and the body (at most
//! [`max_request_body`](Idempotency::max_request_body), else `413`).
//!
//! # Scopes
//!
//! **Without a scope, any client that sends the same key gets the other client's
//! stored response.** Keys are chosen by clients; scope them by who is asking: the
//! authenticated subject, the tenant, the API key (the web crates' `scope` option). A
//! record's id is the scope and the key ([`record_id`]); two scopes never share one.
//!
//! # Guarantees, and what they assume
//!
//! - **The handler runs once per key** while the lock holds: the lock is Redlock's (see
//!   redlock-core's guarantees: a majority of nodes, bounded clock drift), extended
//!   while the handler runs. A run whose lock went stale (its replica paused past the
//!   lock's validity) cannot write the record: every record write is fenced by the
//!   lock's token.
//! - **A replica that dies mid-request** leaves an in-flight record whose lock expires
//!   (its TTL, not extended any more): the next retry runs the handler again.
//!   At-most-once is not promised for a crashed handler. Make the handler's own effect
//!   at-most-once with its fencing token: write through a fenced store (`redlock-fence`)
//!   with [`Run::token`] (the web crates' `FencingToken` extractor); the dead run's
//!   late write is then refused once the retry's run has written.
//! - **Records live [`expire_after`](Idempotency::expire_after)** (24 h by default)
//!   after the run finishes; a retry after that runs again. They are as durable as the
//!   store (a Redis without persistence forgets them when it restarts).
//! - **A store that fails while the response is written** does not take the response
//!   away: the client gets it, the failure is logged and counted, and the record stays
//!   in flight (a retry runs again).
//!
//! # Example
//!
//! The framework-free flow, as the web crates drive it:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(1).await;
//! # let data = redlock_testkit::Cluster::start(1).await;
//! use bytes::Bytes;
//! use redlock_core::Redlock;
//! use redlock_idempotency::{Begin, Fingerprint, Idempotency, IdempotencyKey, store::RedisStore};
//!
//! let redlock = Redlock::builder()
//!     .nodes(cluster.urls())
//! #   .restart_quarantine(false) // the test node was started a moment ago
//!     .build()?;
//! let store = RedisStore::open(&data.urls()[0]).await?;
//! let idempotency = Idempotency::new(redlock, store);
//!
//! let key = IdempotencyKey::from_header("idempotency-key", [&b"refund-7"[..]], true, 255)?
//!     .expect("required");
//! let request = || Fingerprint::builder("POST", "/refunds").body(b"{\"order\":7}").finish();
//!
//! // The first request runs, and its response is stored.
//! let Begin::Run(run) = idempotency.begin(Some("tenant-1"), &key, request()).await? else {
//!     unreachable!("first request");
//! };
//! let headers = vec![("content-type".to_owned(), Bytes::from_static(b"application/json"))];
//! run.finish(201, headers, Some(Bytes::from_static(b"{\"refund\":1}"))).await;
//!
//! // Its retry gets the stored response; another tenant's request with the same key runs.
//! let Begin::Replay(replay) = idempotency.begin(Some("tenant-1"), &key, request()).await? else {
//!     unreachable!("a retry");
//! };
//! assert_eq!((replay.status(), &replay.body()[..]), (201, &b"{\"refund\":1}"[..]));
//! assert!(matches!(idempotency.begin(Some("tenant-2"), &key, request()).await?, Begin::Run(_)));
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `redis` | off | [`store::RedisStore`]: records in a data Redis |
//! | `sql` | off | [`store::SqlStore`]: records in PostgreSQL or SQLite (sqlx) |
//!
//! # Metrics
//!
//! See the [`telemetry`] module's table: requests by outcome, stored bytes.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_core::{ErrorClass, Redlock, RetryPolicy};

mod fingerprint;
mod key;
pub mod middleware;
mod record;
mod refusal;
mod response;
mod run;
pub mod store;
pub mod telemetry;

pub use fingerprint::{Fingerprint, FingerprintBuilder};
pub use key::{DEFAULT_HEADER, DEFAULT_MAX_KEY_LEN, IdempotencyKey, record_id, scope_from_header};
pub use record::{Corrupt, Record, RecordState, StoredResponse};
use refusal::counted;
pub use refusal::{Refusal, RefusalKind};
pub use response::is_hop_by_hop;
pub use run::{Begin, Finished, REPLAYED_HEADER, Replay, Run};
pub use store::{RecordSummary, Started, Store, StoreError};

use crate::run::now_ms;
use crate::telemetry::{Outcome, record_outcome};

/// The resource prefix of the keys' locks unless told otherwise.
pub const DEFAULT_RESOURCE_PREFIX: &str = "idempotency:";
/// How long records live after their run finishes unless told otherwise: 24 hours.
pub const DEFAULT_EXPIRE_AFTER: Duration = Duration::from_secs(24 * 60 * 60);
/// The largest response body stored unless told otherwise: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// The largest request body taken (to fingerprint it) unless told otherwise: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1 << 20;
/// How long a store operation may take unless told otherwise.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// Which statuses are stored by default: `2xx` and `4xx` (a `5xx` is the server's
/// failure: a retry runs again).
pub fn default_store_if(status: u16) -> bool {
    (200..300).contains(&status) || (400..500).contains(&status)
}

type StoreIf = Arc<dyn Fn(u16) -> bool + Send + Sync>;

/// Fail fast, as a burst of first requests needs it: first requests that arrive together
/// can split the lock's votes so that none of them wins, and one attempt each would
/// answer them all `409` with nothing running. Two more attempts after 5 to 25 ms
/// (random) settle such a split; a key that another request really holds is still
/// answered within about 50 ms.
fn fail_fast_policy() -> RetryPolicy {
    RetryPolicy::attempts(3).with_delay(Duration::from_millis(5), Duration::from_millis(20))
}

/// The options, the same in both web crates.
#[derive(Clone)]
pub(crate) struct Options {
    header: String,
    required: bool,
    resource_prefix: String,
    ttl: Option<Duration>,
    retry: RetryPolicy,
    max_hold: Option<Duration>,
    pub(crate) expire_after: Duration,
    pub(crate) max_body: usize,
    max_request_body: usize,
    max_key_len: usize,
    fingerprint_headers: Vec<String>,
    pub(crate) store_if: StoreIf,
    store_timeout: Duration,
}

#[derive(Clone)]
pub(crate) struct Inner {
    redlock: Redlock,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) options: Options,
}

impl Inner {
    /// `operation`, bounded by the store timeout.
    pub(crate) async fn timed<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let limit = self.options.store_timeout;
        tokio::time::timeout(limit, operation)
            .await
            .unwrap_or(Err(StoreError::Timeout(limit)))
    }
}

/// Runs each request with an idempotency key once, cluster-wide, and replays its
/// response to retries (see the [crate] docs). Cheap to clone; built once, shared by
/// every request.
///
/// The options, one type for both web crates (`redlock-tower`'s `IdempotencyLayer` and
/// `redlock-actix`'s `IdempotencyMiddleware` take this value; they add only `scope` and
/// `scope_header`, and actix its `runtime`):
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | [`header`](Self::header) | `Idempotency-Key` | the request header with the key |
/// | [`required`](Self::required) | `true` | no key: `400`; `false`: the request passes through, unprotected |
/// | `scope` (web crates) | none | whose key it is: the subject, the tenant (see [Scopes](crate#scopes)) |
/// | [`resource_prefix`](Self::resource_prefix) | `idempotency:` | the locks' resource names: the prefix, then [`record_id`] |
/// | [`ttl`](Self::ttl) | the client's `default_ttl` | the lock's TTL, extended while the handler runs: how long a dead replica's request blocks its retries |
/// | [`fail_fast`](Self::fail_fast) | yes | a request while its key's first one runs: `409` at once |
/// | [`wait`](Self::wait) | | wait up to a deadline for the first to finish, then replay its response (else `409`) |
/// | [`max_hold`](Self::max_hold) | the client's | no extension past this: the lock is then lost |
/// | [`expire_after`](Self::expire_after) | 24 h | how long records live after their run |
/// | [`max_body`](Self::max_body) | 1 MiB | the largest response body stored; larger ones are answered, not stored |
/// | [`max_request_body`](Self::max_request_body) | 1 MiB | the largest request body taken; larger: `413` |
/// | [`max_key_len`](Self::max_key_len) | 255 | the longest key, in bytes; escaped and joined to its escaped scope, it must also fit the room the resource prefix leaves under the 512-byte resource-name bound (`room()`: 500 bytes by default), else `400` naming the bound |
/// | [`fingerprint_headers`](Self::fingerprint_headers) | none | request headers that are part of the fingerprint |
/// | [`store_if`](Self::store_if) | `2xx`, `4xx` | which statuses are stored (others: the next request runs again) |
/// | [`store_timeout`](Self::store_timeout) | 2 s | how long a store operation may take (then `503`) |
#[derive(Clone)]
pub struct Idempotency {
    inner: Arc<Inner>,
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.inner.options;
        f.debug_struct("Idempotency")
            .field("store", &self.inner.store)
            .field("header", &o.header)
            .field("required", &o.required)
            .field("resource_prefix", &o.resource_prefix)
            .field("expire_after", &o.expire_after)
            .field("max_body", &o.max_body)
            .finish_non_exhaustive()
    }
}

impl Idempotency {
    /// Keys locked with `redlock`, records kept in `store`, default options.
    pub fn new(redlock: Redlock, store: impl Store) -> Self {
        Self::with_store(redlock, Arc::new(store))
    }

    /// As [`new`](Self::new), with a store shared with others (e.g. an admin service).
    pub fn with_store(redlock: Redlock, store: Arc<dyn Store>) -> Self {
        Self {
            inner: Arc::new(Inner {
                redlock,
                store,
                options: Options {
                    header: DEFAULT_HEADER.to_owned(),
                    required: true,
                    resource_prefix: DEFAULT_RESOURCE_PREFIX.to_owned(),
                    ttl: None,
                    retry: fail_fast_policy(),
                    max_hold: None,
                    expire_after: DEFAULT_EXPIRE_AFTER,
                    max_body: DEFAULT_MAX_BODY,
                    max_request_body: DEFAULT_MAX_REQUEST_BODY,
                    max_key_len: DEFAULT_MAX_KEY_LEN,
                    fingerprint_headers: Vec::new(),
                    store_if: Arc::new(default_store_if),
                    store_timeout: DEFAULT_STORE_TIMEOUT,
                },
            }),
        }
    }

    fn option(mut self, set: impl FnOnce(&mut Options)) -> Self {
        // Cloned if shared: a configured handle never changes under another's feet.
        set(&mut Arc::make_mut(&mut self.inner).options);
        self
    }

    /// The request header with the key (default `Idempotency-Key`).
    #[must_use]
    pub fn header(self, name: impl Into<String>) -> Self {
        let name = name.into().to_ascii_lowercase();
        self.option(|o| o.header = name)
    }

    /// Whether requests must carry a key (default `true`: `400` without one). `false`:
    /// a request without a key passes through, unprotected.
    #[must_use]
    pub fn required(self, required: bool) -> Self {
        self.option(|o| o.required = required)
    }

    /// The locks' resource names: `prefix` and the [`record_id`] (default
    /// `idempotency:`).
    #[must_use]
    pub fn resource_prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.option(|o| o.resource_prefix = prefix)
    }

    /// The lock's TTL (default: the client's). It is extended while the handler runs;
    /// it is how long a replica that died mid-request blocks its key's retries.
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.option(|o| o.ttl = Some(ttl))
    }

    /// A request whose key's first request still runs: `409` at once (the default).
    /// "At once" is within about 50 ms: simultaneous first requests can split the lock's
    /// votes so that none wins, and two quick retries (5 to 25 ms apart) settle that, so
    /// a burst of first requests never ends with none of them running.
    #[must_use]
    pub fn fail_fast(self) -> Self {
        self.option(|o| o.retry = fail_fast_policy())
    }

    /// A request whose key's first request still runs: wait up to `deadline` for it
    /// to finish (woken when its lock is released), then replay its response; `409` if
    /// it still runs at the deadline.
    #[must_use]
    pub fn wait(self, deadline: Duration) -> Self {
        self.option(|o| o.retry = RetryPolicy::deadline(deadline))
    }

    /// No lock extension past `max_hold` after the acquisition (default: the client's
    /// `max_hold`): a handler running longer loses its lock.
    #[must_use]
    pub fn max_hold(self, max_hold: Duration) -> Self {
        self.option(|o| o.max_hold = Some(max_hold))
    }

    /// How long a record lives after its run finished (default 24 h): a retry later
    /// than that runs again.
    #[must_use]
    pub fn expire_after(self, expire_after: Duration) -> Self {
        self.option(|o| o.expire_after = expire_after)
    }

    /// The largest response body stored, in bytes (default 1 MiB). A larger response is
    /// answered but not stored: retries get `409` (never part of a body).
    #[must_use]
    pub fn max_body(self, bytes: usize) -> Self {
        self.option(|o| o.max_body = bytes)
    }

    /// The largest request body taken, in bytes (default 1 MiB): the body is read whole
    /// to fingerprint it, then handed to the handler. A larger one: `413`.
    #[must_use]
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.option(|o| o.max_request_body = bytes)
    }

    /// The longest key taken, in bytes (default 255); a longer one: `400`. Once
    /// escaped and joined to its escaped scope ([`record_id`]), a key must also fit the
    /// [`room`](Self::room) the resource prefix leaves under the resource-name bound,
    /// else `400` naming the bound; `room` refuses a `bytes` above that room.
    #[must_use]
    pub fn max_key_len(self, bytes: usize) -> Self {
        self.option(|o| o.max_key_len = bytes)
    }

    /// Request headers that are part of the fingerprint (default none), e.g. the
    /// `content-type`, an API version header.
    #[must_use]
    pub fn fingerprint_headers<I, S>(self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let names: Vec<String> = names
            .into_iter()
            .map(|n| n.into().to_ascii_lowercase())
            .collect();
        self.option(|o| o.fingerprint_headers = names)
    }

    /// Which responses are stored, by status (default [`default_store_if`]: `2xx` and
    /// `4xx`). A response not stored lets the next request with the key run again.
    #[must_use]
    pub fn store_if(self, store_if: impl Fn(u16) -> bool + Send + Sync + 'static) -> Self {
        let store_if: StoreIf = Arc::new(store_if);
        self.option(|o| o.store_if = store_if)
    }

    /// How long one store operation may take (default 2 s); then the request gets `503`
    /// (or, for the final write, its response unstored).
    #[must_use]
    pub fn store_timeout(self, timeout: Duration) -> Self {
        self.option(|o| o.store_timeout = timeout)
    }

    /// The longest record id (the scope and the key, escaped: [`record_id`]) taken: what
    /// the client's resource-name bound ([`Redlock::max_resource_len`](redlock_core::Redlock::max_resource_len), 512 bytes by default) leaves
    /// after the [`resource_prefix`](Self::resource_prefix). A request whose key and
    /// scope are longer once escaped is refused with `400`, naming this bound. The web
    /// crates check it where their middleware is built (a mistake is logged); check it
    /// yourself where the options are set.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let data = redlock_testkit::Cluster::start(1).await;
    /// use redlock_idempotency::{Idempotency, store::RedisStore};
    ///
    /// let redlock = redlock_core::Redlock::builder().node("redis://127.0.0.1:6379").build()?;
    /// let store = RedisStore::open(&data.urls()[0]).await?;
    /// let idempotency = Idempotency::new(redlock, store);
    /// assert_eq!(idempotency.room()?.bytes(), 512 - "idempotency:".len());
    /// // Keys of `max_key_len` bytes (255 by default) must fit under the prefix.
    /// assert!(idempotency.clone().resource_prefix("p".repeat(300)).room().is_err());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`KeyBoundError::NoRoom`](redlock_http::key::KeyBoundError::NoRoom) when the prefix
    /// leaves none, [`KeyBoundError::KeyLimitAboveRoom`](redlock_http::key::KeyBoundError::KeyLimitAboveRoom)
    /// when a key of [`max_key_len`](Self::max_key_len) bytes would not fit.
    pub fn room(&self) -> Result<redlock_http::key::KeyRoom, redlock_http::key::KeyBoundError> {
        let o = &self.inner.options;
        let room = redlock_http::key::KeyRoom::new(&self.inner.redlock, &o.resource_prefix, 0)?;
        if o.max_key_len > room.bytes() {
            return Err(redlock_http::key::KeyBoundError::KeyLimitAboveRoom {
                max_key_len: o.max_key_len,
                room: room.bytes(),
            });
        }
        Ok(room)
    }

    /// Logs a misconfiguration ([`room`](Self::room)) at `error` level: every request
    /// with a key would be answered `500`. The web crates call it where their middleware
    /// is built, once every option is set.
    pub fn check(&self) {
        if let Err(error) = self.room() {
            tracing::error!(%error, "idempotency misconfigured: every request with a key will be answered 500");
        }
    }

    /// The request header with the key, lower-cased.
    pub fn header_name(&self) -> &str {
        &self.inner.options.header
    }

    /// The largest request body taken.
    pub fn request_body_limit(&self) -> usize {
        self.inner.options.max_request_body
    }

    /// The largest response body stored.
    pub fn body_limit(&self) -> usize {
        self.inner.options.max_body
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The lock client.
    pub fn redlock(&self) -> &Redlock {
        &self.inner.redlock
    }

    /// The key of a request whose key header has these values: `Ok(None)` when it has
    /// none and keys are optional (counted as passed through).
    ///
    /// # Errors
    ///
    /// A `400` [`Refusal`] for a missing (required) or unusable key.
    pub fn key<'a>(
        &self,
        values: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Option<IdempotencyKey>, Refusal> {
        let o = &self.inner.options;
        match IdempotencyKey::from_header(&o.header, values, o.required, o.max_key_len) {
            Ok(None) => {
                record_outcome(Outcome::NoKey);
                Ok(None)
            }
            Ok(key) => Ok(key),
            Err(bad) => Err(counted(Refusal::bad_key(format!(
                "The request's idempotency key is unusable: {bad}."
            )))),
        }
    }

    /// The fingerprint of a request: its method, target (path and query as the client
    /// sent it, [`redlock_http::key::sent_target`]), the values of
    /// the configured headers (`header(name)` gives a header's values in order) and body.
    pub fn fingerprint<'a, H>(
        &self,
        method: &str,
        target: &str,
        header: H,
        body: &[u8],
    ) -> Fingerprint
    where
        H: Fn(&str) -> Vec<&'a [u8]>,
    {
        self.fingerprint_head(method, target, &header)
            .body(body)
            .finish()
    }

    /// The fingerprint of a request's head: all but the body.
    fn fingerprint_head<'a, H>(&self, method: &str, target: &str, header: &H) -> FingerprintBuilder
    where
        H: Fn(&str) -> Vec<&'a [u8]>,
    {
        let mut builder = Fingerprint::builder(method, target);
        for name in &self.inner.options.fingerprint_headers {
            let values = header(name);
            if values.is_empty() {
                builder = builder.absent_header(name);
            }
            for value in values {
                builder = builder.header(name, value);
            }
        }
        builder
    }

    /// Decides a request with `key` in `scope` whose fingerprint is `fingerprint`:
    /// replay a stored response, run it (holding the key's lock), or refuse it.
    ///
    /// One store read when the response is stored (a replay takes no lock). Otherwise:
    /// that read, the lock, one fenced store write; the run's end is one more write
    /// ([`Run::finish`]).
    ///
    /// # Errors
    ///
    /// A [`Refusal`]: `409` in flight (or finished without a stored response), `422`
    /// fingerprint mismatch, `503` lock service or store unavailable, `500`
    /// misconfigured (the cause is logged).
    pub async fn begin(
        &self,
        scope: Option<&str>,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Begin, Refusal> {
        self.decide(scope, key, fingerprint).await.map_err(counted)
    }

    /// The refusal of a request with a key but no scope, where a scope is configured
    /// (`400`), counted.
    fn no_scope(&self) -> Refusal {
        counted(Refusal::bad_key(
            "The request names no scope for its idempotency key (the client, tenant or subject it is made for)."
                .to_owned(),
        ))
    }

    /// The refusal of a request whose body is over
    /// [`max_request_body`](Self::max_request_body) (`413`), counted.
    fn body_too_large(&self) -> Refusal {
        counted(Refusal::body_too_large(self.inner.options.max_request_body))
    }

    /// [`begin`](Self::begin), uncounted.
    async fn decide(
        &self,
        scope: Option<&str>,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Begin, Refusal> {
        let inner = &self.inner;
        let o = &inner.options;
        let id = record_id(scope, key);
        // The lock's resource is the prefix and the id: both must fit the bound, checked
        // before anything is sent.
        match self.room() {
            Ok(room) => {
                if let Err(bound) = room.check("idempotency key with its scope", id.len()) {
                    tracing::debug!(%bound, "idempotency key too long: request refused");
                    return Err(Refusal::bad_key(bound.problem().detail));
                }
            }
            Err(error) => {
                tracing::error!(%error, "idempotency misconfigured: request refused");
                return Err(Refusal::misconfigured());
            }
        }
        let started = Instant::now();

        match inner.timed(inner.store.load(&id)).await {
            Ok(Some(record)) => {
                if let Some(answer) = existing(&id, &record, &fingerprint) {
                    return answer;
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%id, %error, "idempotency store unavailable: request refused");
                return Err(Refusal::unavailable(None));
            }
        }

        let resource = format!("{}{id}", o.resource_prefix);
        let mut acquire = inner
            .redlock
            .lock(resource.clone())
            .fencing(true)
            .retry(o.retry);
        if let Some(ttl) = o.ttl {
            acquire = acquire.ttl(ttl);
        }
        let mut lock = match acquire.await {
            Ok(lock) => lock,
            Err(error) => {
                return Err(match error.class() {
                    ErrorClass::Contended { retry_after } => {
                        tracing::debug!(%id, waited_ms = started.elapsed().as_millis() as u64, "idempotency key in flight: request refused");
                        Refusal::in_flight(retry_after)
                    }
                    ErrorClass::InvalidResource => {
                        tracing::debug!(%id, %error, "idempotency lock refused the key");
                        Refusal::bad_key(
                            "The request's idempotency key (with its scope) is too long."
                                .to_owned(),
                        )
                    }
                    ErrorClass::InvalidInput => {
                        tracing::error!(%id, %error, "idempotency lock misconfigured");
                        Refusal::misconfigured()
                    }
                    _ => {
                        tracing::warn!(%id, %error, "lock service unavailable: idempotent request refused");
                        Refusal::unavailable(None)
                    }
                });
            }
        };
        let Some(token) = lock.fencing_token() else {
            tracing::error!(%id, "the idempotency lock came without a fencing token");
            return Err(Refusal::misconfigured());
        };
        match o.max_hold {
            Some(max_hold) => lock.auto_extend_for(max_hold),
            None => lock.auto_extend(),
        }
        let run = Run {
            inner: inner.clone(),
            id,
            lock: Some(lock),
            token,
            fingerprint,
            started_ms: now_ms(),
            started,
            runtime: tokio::runtime::Handle::try_current().ok(),
            request_id: None,
        };
        let record = Record::in_flight(token, fingerprint, run.started_ms);
        // Dropping `run` on a refusal releases the lock.
        match inner
            .timed(inner.store.start(&run.id, &record, o.expire_after))
            .await
        {
            Ok(Started::Started) => Ok(Begin::Run(run)),
            Ok(Started::Found(found)) => existing(&run.id, &found, &fingerprint)
                .unwrap_or_else(|| Err(Refusal::in_flight(None))),
            Err(StoreError::Stale { highest, .. }) => {
                tracing::warn!(id = %run.id, token, highest, "a newer run of this idempotency key holds the record: request refused");
                Err(Refusal::in_flight(None))
            }
            Err(error) => {
                tracing::warn!(id = %run.id, %error, "idempotency store unavailable: request refused");
                Err(Refusal::unavailable(None))
            }
        }
    }
}

/// The answer a stored record gives, if it decides the request.
fn existing(
    id: &str,
    record: &Record,
    fingerprint: &Fingerprint,
) -> Option<Result<Begin, Refusal>> {
    let same = record.fingerprint == *fingerprint;
    match record.state {
        RecordState::Completed if same => {
            let response = record.response.clone()?;
            tracing::debug!(%id, status = response.status, "idempotent request replayed");
            record_outcome(Outcome::Replayed);
            Some(Ok(Begin::Replay(Replay { response })))
        }
        RecordState::NotStored if same => Some(Err(Refusal::not_replayable())),
        RecordState::Abandoned => None,
        RecordState::InFlight if same => None,
        _ => {
            tracing::debug!(%id, stored = %record.fingerprint, request = %fingerprint, "idempotency key reused for another request");
            Some(Err(Refusal::mismatch()))
        }
    }
}
