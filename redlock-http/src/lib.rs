//! How a lock error is told to an HTTP client: status, `Retry-After`, and an
//! [RFC 9457](https://www.rfc-editor.org/rfc/rfc9457) `application/problem+json` body.
//!
//! ```
//! use std::time::Duration;
//! use redlock_core::Error;
//! use redlock_http::Problem;
//!
//! let busy = Error::Taken {
//!     resource: "order:42".into(),
//!     nodes: vec!["127.0.0.1:7001".into()],
//!     total: 1,
//!     attempts: 1,
//!     retry_after: Some(Duration::from_millis(1200)),
//! };
//! let problem = Problem::from_error(&busy);
//! assert_eq!(problem.status, 409);
//! assert_eq!(problem.retry_after_secs(), Some(2)); // rounded up
//! assert!(problem.to_json().contains(r#""status":409"#));
//! ```
//!
//! # Feature flags
//!
//! None: the crate has no Cargo features.
//!
//! # Where it sits
//!
//! The one place where lock errors get HTTP statuses: core classifies an error
//! ([`Error::class`](redlock_core::Error::class)) without HTTP vocabulary, and this
//! crate decides the status, the `Retry-After` and the body. Framework-neutral (no HTTP
//! crate): the web integrations (`redlock-tower`, `redlock-actix`) convert a [`Problem`]
//! into their own response type, so both answer the same way.
//!
//! | [`Problem::from_error`], by the error's class | status | `Retry-After` |
//! | --- | --- | --- |
//! | contended: `Taken` | 409 | the holder's remaining validity, in whole seconds rounded up; [`FALLBACK_RETRY_AFTER`](problem::FALLBACK_RETRY_AFTER) when no node said |
//! | unavailable: `NoQuorum`, `NotReady`, `Expired`; and `Lost` | 503 | [`FALLBACK_RETRY_AFTER`](problem::FALLBACK_RETRY_AFTER) (1 s) |
//! | invalid resource: an empty or too long resource name (the request's key) | 400 | |
//! | invalid input: `Config` (the server's own call or configuration) | 500 | |
//!
//! [`Problem::bad_key`] (400) is for a request that carries no usable key; what a key
//! header must look like is decided once, in [`header_key`](key::header_key).
//!
//! Bodies say what the client can act on and nothing of the server's insides: no node
//! addresses, no Redis error text, no resource prefix. The full error goes to the server's
//! log, with the request's id ([`REQUEST_ID_HEADERS`](problem::REQUEST_ID_HEADERS)) when it has one; the body then
//! carries the same id (`request_id`), so a client's report can be matched to the log.
//!
//! # The web crates' contract
//!
//! `redlock-tower` (a tower layer: axum, hyper, tonic) and `redlock-actix` (an
//! extractor and a middleware for actix-web) follow one contract, decided here, so that
//! a tower service and an actix service locking the same resource exclude each other
//! and answer alike:
//!
//! - **Keys**: one rule ([`lock_key`](key::lock_key) and the functions beside it; see [`Key`](key::Key) and the
//!   table in [`key`]): `Idempotency-Key: a:b` locks `a%3Ab` in both.
//! - **Resources**: the lock's resource name is the `resource_prefix` and the key
//!   ([`resource_name`](key::resource_name)). It is not Redis's key namespace: that is the client's
//!   `key_prefix` (`RedlockBuilder::key_prefix`, `redlock:` by default), put in front
//!   of every resource on the nodes: `redlock:{order:42}`.
//! - **Answers**: [`Problem`] (status, `Retry-After`, `application/problem+json`
//!   body), by the table above; [`MissingToken`] for a fencing token the handler cannot
//!   have.
//! - **Refusals**: one vocabulary for the three capabilities ([`Refusal`],
//!   [`RefusalKind`]: the kinds and their statuses), handed to the middleware's
//!   `on_refusal` hook of both crates.
//! - **Options and decision**: one engine per capability, written here (or, for
//!   idempotency, in `redlock-idempotency`, which sits above this crate: it depends on
//!   it for the problems, the key rule and the refusals, and carries the stores), that
//!   both crates' middleware take as a value and drive: [`LockOptions`] (the lock),
//!   [`LimitOptions`] (the cluster-wide concurrency limit),
//!   `redlock_idempotency::Idempotency` (idempotency). The web crates only read the
//!   request (method, target as the client sent it, headers, body), build the response
//!   and wrap the body.
//!
//! # Options: one table for both web crates
//!
//! [`LockOptions`] (tower: `LockLayer::new(redlock, extractor).options(o)`; actix:
//! `DistributedLockConfig::new(redlock).options(o)`, taken by `LockMiddleware::new` and
//! found in `app_data` by the extractors) and [`LimitOptions`] (tower:
//! `ClusterLimitLayer::new(redlock, extractor, o)`; actix:
//! `ClusterLimitMiddleware::new(redlock, extractor, o)`):
//!
//! | option | default | meaning |
//! | --- | --- | --- |
//! | `resource_prefix(p)` | empty | the resource is `p` followed by the request's key |
//! | `ttl(d)` | the client's `default_ttl` | the lock's (a permit's) TTL; auto-extended about every `ttl / 3` while held, so it bounds how long a crashed replica keeps the key, not the request |
//! | `fail_fast()` | yes | one attempt: taken → the busy status at once |
//! | `wait(deadline)` | | retry until `deadline` (woken when a holder releases), then the busy status |
//! | `retry(policy)` | `RetryPolicy::once()` | any retry policy; `fail_fast` and `wait` are shorthands |
//! | `hold(Hold)` | [`Hold::UntilBodyEnd`] | keep it until the body ends or is dropped, or only until the response head ([`Hold::UntilHead`]); actix's `DistributedLock` extractor holds its lock as long as the handler keeps it (`into_parts` + `hold_during` for the body) |
//! | `max_hold(d)` | the client's `max_hold` | no extension past `d` after the acquisition: it is then lost |
//! | `fail_open(on)` | off | no quorum (503) → serve the request unguarded, logged as a warning; a taken key is still refused; actix's extractor, whose value is the held lock, still answers 503 |
//! | `busy_status(s)` | `409 Conflict` (lock), `429 Too Many Requests` (limit) | the status of a busy answer (e.g. `423`) |
//! | `abort_on_loss(on)` | off | lost while the request runs: drop the handler and answer 503 (or cut the streaming body off); off: logged (a lock: signalled through its `LockHandle`, `lost()`); actix's extractor leaves it to the handler (`guard().lost()`) |
//! | `fencing(on)` (lock only) | the client's `fencing` | take each lock with a fencing token (the `FencingToken` extractor) |
//! | `LimitOptions::new(k)` (limit only) | | at most `k` requests per key at once |
//!
//! What reads or builds a framework's own types stays on its middleware, once:
//! `on_refusal(hook)` (`Fn(&Refusal) -> Response`: `http::Response<Bytes>` in tower,
//! `HttpResponse` in actix; default: the problem+json answer) and, in actix only,
//! `runtime(handle)` (where the client's calls run: actix workers' runtimes stop with
//! them). Idempotency's options are `redlock_idempotency::Idempotency`'s (its table is
//! there); its middleware adds `scope` and `scope_header` (and actix's `runtime`).
//!
//! Types of the same meaning have the same names in both crates: `KeyExtractor`,
//! [`Key`](key::Key), `extract::{Header, PathParam, PathPrefix, Global, from_fn}`, [`BadKey`](key::BadKey),
//! [`Hold`], [`Refusal`] and [`RefusalKind`], `LockBody`, `FencingToken` and
//! [`MissingToken`], `LockHandle`; the middleware are `LockLayer` / `LockMiddleware`,
//! `ClusterLimitLayer` / `ClusterLimitMiddleware`, `IdempotencyLayer` /
//! `IdempotencyMiddleware`. A key closure means the same in both:
//! `Ok(Some(value))` locks by the value's key, `Ok(None)` passes the request through,
//! `Err(BadKey)` refuses it with `400`.

#![cfg_attr(docsrs, feature(doc_cfg))]
// Examples in the docs compile without warnings, as the code does (a snippet may define
// what it does not call).
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

pub mod body;
pub mod extract;
pub mod guard;
pub mod key;
pub mod problem;
mod refusal;
pub use guard::{Guard, GuardOptions, LimitOptions, LockOptions};
pub use problem::Problem;
pub use refusal::{Refusal, RefusalKind};

/// How long a request keeps its lock (the `hold` option of both web crates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Hold {
    /// Until the handler's response is ready (its head); the body is sent without the
    /// lock. For handlers that do all their work before answering.
    UntilHead,
    /// Until the response body has been fully produced, or dropped (the client went
    /// away). For streaming responses whose production is the protected work. The
    /// default.
    #[default]
    UntilBodyEnd,
}

/// The error a response body ends with (both web crates' `LockBody`) when its lock (or
/// permit) is lost while the body streams and the middleware aborts on loss: the server
/// then cuts the response off, so the client sees an incomplete body rather than a
/// complete one produced without the lock.
#[derive(Debug, Clone)]
pub struct LockLost {
    key: String,
}

impl LockLost {
    /// The loss of the lock (or permit slot) named `key`.
    pub fn new(key: impl Into<String>) -> Self {
        Self { key: key.into() }
    }

    /// The lock's resource name.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl std::fmt::Display for LockLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the lock on `{}` was lost while the response body was being sent",
            self.key
        )
    }
}

impl std::error::Error for LockLost {}

/// Why a handler asking for the lock's fencing token gets none (both web crates'
/// `FencingToken` extractors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingToken {
    /// The request holds no lock: none is configured for the route, or the key
    /// extractor let the request through unlocked.
    NoLock,
    /// The request's lock was taken without a fencing token (fencing is off).
    FencingOff,
    /// The request was let through without a lock because the lock service was
    /// unavailable (`fail_open`).
    FailedOpen,
}

impl MissingToken {
    /// The answer: `500` for the two configuration mistakes (the body says which, and
    /// nothing of the server's settings), `503` with `Retry-After` for a request let
    /// through unlocked by `fail_open`.
    pub fn problem(self) -> Problem {
        match self {
            Self::NoLock => Problem::misconfigured(
                "The handler needs the lock's fencing token, but no lock was taken for this request: the lock is not configured for this route. The details are in the server's log."
                    .to_owned(),
            ),
            Self::FencingOff => Problem::misconfigured(
                "The handler needs the lock's fencing token, but this route's lock is configured without fencing tokens. The details are in the server's log."
                    .to_owned(),
            ),
            Self::FailedOpen => Problem::unavailable(
                "The lock service is temporarily unavailable; retry after the delay in Retry-After."
                    .to_owned(),
                None,
            ),
        }
    }
}
