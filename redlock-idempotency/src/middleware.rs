//! The middleware's flow, framework-free: what the web crates' idempotency middleware
//! does with one request, from its head to its stored response. `redlock-tower`'s
//! `IdempotencyLayer` and `redlock-actix`'s `IdempotencyMiddleware` only translate their
//! requests, responses and bodies to and from these types.
//!
//! 1. [`Idempotency::admit`] reads the request's head ([`RequestHead`]): it passes the
//!    request through (no key, keys optional), refuses it (no usable key or scope, a body
//!    announced too large), or has its body read ([`Admit::Read`]).
//! 2. [`Reading::push`] takes the body's chunks (at most
//!    [`max_request_body`](Idempotency::max_request_body) bytes, else `413`);
//!    [`Reading::finish`] gives back the body, for the handler, and the [`Decision`]:
//!    refuse, replay the stored response, or run the handler under the key's lock.
//! 3. [`Run::respond`] takes the handler's status and headers; [`Collect::push`] its
//!    body's chunks while [`Collect::wants`] them (up to
//!    [`max_body`](Idempotency::max_body)); [`Collect::finish`] gives back what was read
//!    and the run's final write (which stores the response when it can).
//!
//! Every refusal's problem carries the request's id (`x-request-id`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let cluster = redlock_testkit::Cluster::start(1).await;
//! # let data = redlock_testkit::Cluster::start(1).await;
//! use redlock_core::Redlock;
//! use redlock_idempotency::middleware::{Admit, Decision, RequestHead};
//! use redlock_idempotency::{Idempotency, store::RedisStore};
//!
//! let redlock = Redlock::builder()
//!     .nodes(cluster.urls())
//! #   .restart_quarantine(false) // the test node was started a moment ago
//!     .build()?;
//! let idempotency = Idempotency::new(redlock, RedisStore::open(&data.urls()[0]).await?);
//!
//! // A framework's request: its method, target, headers and body.
//! let headers = |name: &str| match name {
//!     "idempotency-key" => vec![&b"refund-7"[..]],
//!     _ => vec![],
//! };
//! let head = RequestHead::new("POST", "/refunds", headers);
//! let Admit::Read(mut reading) = idempotency.admit(&head, None::<fn() -> Option<String>>) else {
//!     unreachable!("a request with a key");
//! };
//! reading.push(b"{\"order\":7}")?;
//! let (body, decision) = reading.finish();
//! let Decision::Run(run) = decision.await else { unreachable!("the first request") };
//!
//! // The handler answers `201` with `body`; the middleware reads it and stores it.
//! let mut collect = run.respond(201, [("content-type", &b"application/json"[..])], None);
//! assert!(collect.wants() && collect.push(&body));
//! let (sent, write) = collect.finish();
//! write.await;
//! assert_eq!(sent, body);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::fingerprint::FingerprintBuilder;
use crate::run::{Begin, Finished, REPLAYED_HEADER, Run};
use crate::{Idempotency, IdempotencyKey, Refusal, StoredResponse};

/// A request's head, as the middleware reads it: its method, its target (the path and
/// the query as the client sent it, whatever router nesting or scope strips:
/// [`redlock_http::key::sent_target`]) and its headers, looked up by lower-case name
/// (`headers(name)` gives every value of `name`, in order).
pub struct RequestHead<'a, H> {
    method: &'a str,
    target: &'a str,
    headers: H,
}

impl<H> fmt::Debug for RequestHead<'_, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestHead")
            .field("method", &self.method)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl<'a, H> RequestHead<'a, H>
where
    H: Fn(&str) -> Vec<&'a [u8]>,
{
    /// The head of a request with this method, target and header lookup.
    pub fn new(method: &'a str, target: &'a str, headers: H) -> Self {
        Self {
            method,
            target,
            headers,
        }
    }

    /// The first value of header `name`, if it is text.
    fn first(&self, name: &str) -> Option<&'a str> {
        let value = *(self.headers)(name).first()?;
        std::str::from_utf8(value).ok()
    }

    /// The request's id, for its problems (`x-request-id`, `x-correlation-id`).
    fn request_id(&self) -> Option<String> {
        redlock_http::problem::request_id(|name| self.first(name))
    }
}

/// Whose key a request's is, read from a framework's request `R` (the web crates'
/// `scope` option): the authenticated subject, the tenant. `None` refuses the request
/// (`400`). See [Scopes](crate#scopes).
pub struct ScopeHook<R: ?Sized>(Arc<ScopeFn<R>>);

type ScopeFn<R> = dyn Fn(&R) -> Option<String> + Send + Sync;

impl<R: ?Sized> ScopeHook<R> {
    /// The hook `scope`.
    pub fn new(scope: impl Fn(&R) -> Option<String> + Send + Sync + 'static) -> Self {
        Self(Arc::new(scope))
    }

    /// The scope of `request`.
    pub fn scope(&self, request: &R) -> Option<String> {
        (self.0)(request)
    }
}

impl<R: ?Sized> Clone for ScopeHook<R> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<R: ?Sized> fmt::Debug for ScopeHook<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScopeHook")
    }
}

/// What a request's head decides ([`Idempotency::admit`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Admit {
    /// No key, and keys are optional: the request passes through, unprotected.
    PassThrough,
    /// Refused before its body is read (`400` no usable key or scope, `413` a body
    /// announced larger than `max_request_body`).
    Refuse(Refusal),
    /// Read its body into this, then decide.
    Read(Reading),
}

impl Idempotency {
    /// The first step of a request through the middleware (see [the
    /// flow](crate::middleware)): its key (header [`header`](Self::header)), its scope
    /// (`scope`, the web crates' hook: `None` where none is configured; a hook that
    /// names no scope refuses the request with `400`) and its announced body length.
    pub fn admit<'a, H, S>(&self, head: &RequestHead<'a, H>, scope: Option<S>) -> Admit
    where
        H: Fn(&str) -> Vec<&'a [u8]>,
        S: FnOnce() -> Option<String>,
    {
        let refuse = |refusal| Admit::Refuse(with_request_id(refusal, head.request_id()));
        let key = match self.key((head.headers)(self.header_name())) {
            Ok(Some(key)) => key,
            Ok(None) => return Admit::PassThrough,
            Err(refusal) => return refuse(refusal),
        };
        let scope = match scope.map(|scope| scope()) {
            Some(None) => return refuse(self.no_scope()),
            scope => scope.flatten(),
        };
        let announced = head.first("content-length").and_then(|v| v.parse().ok());
        if announced.is_some_and(|len: usize| len > self.request_body_limit()) {
            return refuse(self.body_too_large());
        }
        Admit::Read(Reading {
            idempotency: self.clone(),
            key,
            scope,
            fingerprint: self.fingerprint_head(head.method, head.target, &head.headers),
            body: BytesMut::new(),
            request_id: head.request_id(),
        })
    }
}

/// A request with a key whose body is being read ([`Admit::Read`]).
pub struct Reading {
    idempotency: Idempotency,
    key: IdempotencyKey,
    scope: Option<String>,
    fingerprint: FingerprintBuilder,
    body: BytesMut,
    request_id: Option<String>,
}

impl fmt::Debug for Reading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reading")
            .field("key", &self.key)
            .field("scope", &self.scope)
            .field("read", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl Reading {
    /// Adds a chunk of the request's body.
    ///
    /// # Errors
    ///
    /// `413` once the body is larger than
    /// [`max_request_body`](Idempotency::max_request_body).
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), Refusal> {
        let core = &self.idempotency;
        if self.body.len() + chunk.len() > core.request_body_limit() {
            return Err(with_request_id(
                core.body_too_large(),
                self.request_id.clone(),
            ));
        }
        self.body.extend_from_slice(chunk);
        Ok(())
    }

    /// The refusal of a request whose body could not be read (`400`), logged.
    pub fn unreadable(&self, error: &dyn fmt::Display) -> Refusal {
        let request_id = self.request_id.clone();
        tracing::debug!(request_id = request_id.as_deref(), %error, "request body unreadable: idempotent request refused");
        with_request_id(Refusal::unreadable_body(), request_id)
    }

    /// The body read, to hand to the handler, and the decision on the request: its
    /// fingerprint (method, target, the [`fingerprint_headers`](Idempotency::fingerprint_headers),
    /// body), then [`Idempotency::begin`]. The decision needs nothing of the request: it
    /// may run on another runtime.
    pub fn finish(self) -> (Bytes, impl Future<Output = Decision> + Send + 'static) {
        let body = self.body.freeze();
        let fingerprint = self.fingerprint.body(&body).finish();
        let Self {
            idempotency,
            key,
            scope,
            request_id,
            ..
        } = self;
        let decision = async move {
            match idempotency.begin(scope.as_deref(), &key, fingerprint).await {
                Ok(Begin::Run(mut run)) => {
                    run.request_id = request_id;
                    Decision::Run(run)
                }
                Ok(Begin::Replay(replay)) => {
                    let mut response = replay.into_response();
                    // Ours replaces any the handler set.
                    response.headers.retain(|(name, _)| name != REPLAYED_HEADER);
                    let marker = (REPLAYED_HEADER.to_owned(), Bytes::from_static(b"true"));
                    response.headers.push(marker);
                    Decision::Replay(response)
                }
                Err(refusal) => Decision::Refuse(with_request_id(refusal, request_id)),
            }
        };
        (body, decision)
    }
}

/// What to do with a request whose body was read ([`Reading::finish`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Decision {
    /// Answer with the refusal's problem (`409` in flight or not replayable, `422`
    /// another request under the key, `503` lock service or store unavailable, `500`
    /// misconfigured); the handler does not run.
    Refuse(Refusal),
    /// Answer with this response: the stored one, its headers followed by
    /// `Idempotent-Replayed: true` ([`REPLAYED_HEADER`]); the handler does not run.
    Replay(StoredResponse),
    /// Run the handler (it may find the lock's [`handle`](Run::handle) in the request),
    /// then hand its response to [`Run::respond`].
    Run(Run),
}

impl Run {
    /// The handler's response: its status, its headers (names and values, in order)
    /// and its body's length where known. Read its body into the returned [`Collect`]
    /// while it [`wants`](Collect::wants) it.
    pub fn respond<'a>(
        self,
        status: u16,
        headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
        len: Option<u64>,
    ) -> Collect {
        let wants = self.stores(status) && len.is_none_or(|len| len <= self.max_body() as u64);
        let headers = headers
            .into_iter()
            .map(|(name, value)| (name.to_owned(), Bytes::copy_from_slice(value)))
            .collect();
        Collect {
            run: self,
            status,
            headers,
            read: BytesMut::new(),
            wants,
        }
    }
}

/// A run's response whose body is being read, to be stored ([`Run::respond`]).
pub struct Collect {
    run: Run,
    status: u16,
    headers: Vec<(String, Bytes)>,
    read: BytesMut,
    wants: bool,
}

impl fmt::Debug for Collect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collect")
            .field("run", &self.run)
            .field("status", &self.status)
            .field("read", &self.read.len())
            .field("wants", &self.wants)
            .finish_non_exhaustive()
    }
}

impl Collect {
    /// Whether the body is read, to be stored: not when its status is not stored
    /// ([`store_if`](Idempotency::store_if)), nor once it is larger than
    /// [`max_body`](Idempotency::max_body). Read no more chunks once it is `false`.
    pub fn wants(&self) -> bool {
        self.wants
    }

    /// Adds a chunk of the body; returns [`wants`](Self::wants).
    pub fn push(&mut self, chunk: &[u8]) -> bool {
        self.read.extend_from_slice(chunk);
        self.wants &= self.read.len() <= self.run.max_body();
        self.wants
    }

    /// What was read of the body (all of it if it is still [wanted](Self::wants), else
    /// the part read before it was too large: send it, then the rest), and the run's
    /// final write ([`Run::finish`]): await it before answering.
    pub fn finish(self) -> (Bytes, impl Future<Output = Finished> + Send + 'static) {
        let read = self.read.freeze();
        let stored = self.wants.then(|| read.clone());
        (read, self.run.finish(self.status, self.headers, stored))
    }

    /// The body failed before it could be stored: the run ends (the key's next request
    /// runs again), logged; the answer is this `500`.
    pub fn failed(self, error: &dyn fmt::Display) -> Refusal {
        let request_id = self.run.request_id.clone();
        tracing::warn!(id = self.run.id(), request_id = request_id.as_deref(), %error, "the response body failed before it could be stored: answered 500, and the key's next request runs again");
        drop(self.run);
        with_request_id(Refusal::response_failed(), request_id)
    }
}

/// `refusal`, its problem naming the request's id.
fn with_request_id(mut refusal: Refusal, request_id: Option<String>) -> Refusal {
    refusal.problem = refusal.problem.with_request_id(request_id);
    refusal
}
