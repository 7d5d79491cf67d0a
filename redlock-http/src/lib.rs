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
//! | contended: `Taken` | 409 | the holder's remaining validity, in whole seconds rounded up; [`FALLBACK_RETRY_AFTER`] when no node said |
//! | unavailable: `NoQuorum`, `NotReady`, `Expired`; and `Lost` | 503 | [`FALLBACK_RETRY_AFTER`] (1 s) |
//! | invalid resource: an empty or too long resource name (the request's key) | 400 | |
//! | invalid input: `Config` (the server's own call or configuration) | 500 | |
//!
//! [`Problem::bad_key`] (400) is for a request that carries no usable key; what a key
//! header must look like is decided once, in [`header_key`].
//!
//! Bodies say what the client can act on and nothing of the server's insides: no node
//! addresses, no Redis error text, no resource prefix. The full error goes to the server's
//! log, with the request's id ([`REQUEST_ID_HEADERS`]) when it has one; the body then
//! carries the same id (`request_id`), so a client's report can be matched to the log.
//!
//! # The web crates' contract
//!
//! `redlock-tower` (a tower layer: axum, hyper, tonic) and `redlock-actix` (an
//! extractor and a middleware for actix-web) follow one contract, decided here, so that
//! a tower service and an actix service locking the same resource exclude each other
//! and answer alike:
//!
//! - **Keys**: one rule ([`lock_key`] and the functions beside it; see [`Key`] and the
//!   table in [`key`]): `Idempotency-Key: a:b` locks `a%3Ab` in both.
//! - **Resources**: the lock's resource name is the `resource_prefix` and the key
//!   ([`resource_name`]). It is not Redis's key namespace: that is the client's
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
//! [`Key`], `extract::{Header, PathParam, PathPrefix, Global, from_fn}`, [`BadKey`],
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

use std::fmt::Write as _;
use std::time::Duration;

use redlock_core::{ArgumentError, Error, ErrorClass};
/// The `Content-Type` of [`Problem::to_json`].
pub const CONTENT_TYPE: &str = "application/problem+json";

/// The `Retry-After` given when no node says how long to wait: a busy resource whose
/// holder's remaining time no node reported, and an unavailable lock service (503).
pub const FALLBACK_RETRY_AFTER: Duration = Duration::from_secs(1);

pub mod extract;
pub mod key;
mod lock;
mod refusal;
pub use key::{
    BadKey, KEY_SEPARATOR, Key, KeyBoundError, KeyRoom, MAX_RESOURCE_LEN, decode_path_segment,
    header_key, header_lock_key, lock_key, path_param_key, path_param_not_utf8, path_prefix_key,
    permit_suffix_len, resource_name, sent_path, sent_target, single_header_value,
};
pub use lock::{Guard, LimitOptions, LockOptions, Route};
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

/// The detail of every `500` answer: the server's mistakes are told in its log only.
pub const MISCONFIGURED_DETAIL: &str =
    "The server's lock configuration is invalid; the details are in the server's log.";

/// Request headers read for a request or correlation id, in this order (the first
/// present and well-formed one is used): `x-request-id` (what tower-http's and
/// actix-web's request-id middlewares set) and `x-correlation-id`.
pub const REQUEST_ID_HEADERS: [&str; 2] = ["x-request-id", "x-correlation-id"];

/// The longest request id echoed in a body.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The request's id, from the first of [`REQUEST_ID_HEADERS`] that `header` finds with a
/// well-formed value (visible ASCII, at most 128 bytes); anything else is ignored rather
/// than echoed.
///
/// ```
/// let id = redlock_http::request_id(|name| (name == "x-request-id").then_some("req-7f3a"));
/// assert_eq!(id.as_deref(), Some("req-7f3a"));
/// assert_eq!(redlock_http::request_id(|_| Some("<script>\n")), None);
/// ```
pub fn request_id<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Option<String> {
    REQUEST_ID_HEADERS.iter().find_map(|name| {
        let value = header(name)?.trim();
        let well_formed = !value.is_empty()
            && value.len() <= MAX_REQUEST_ID_LEN
            && value
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'<' | b'>' | b'"' | b'\\'));
        well_formed.then(|| value.to_owned())
    })
}

/// An HTTP-shaped description of why a request could not get its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Problem {
    /// The HTTP status: 409 busy, 503 no quorum / lost / expired, 400 bad key, 500
    /// misconfiguration.
    pub status: u16,
    /// A URI naming the problem type (the RFC's `type`).
    pub kind: &'static str,
    /// A short, fixed summary (the RFC's `title`).
    pub title: &'static str,
    /// This occurrence, in words (the RFC's `detail`).
    pub detail: String,
    /// How long the client should wait before retrying, if it may retry.
    pub retry_after: Option<Duration>,
    /// The request's id (see [`request_id`]), echoed in the body so that the client's
    /// report can be matched with the server's log.
    pub request_id: Option<String>,
}

impl Problem {
    /// Builds a problem from its parts.
    pub fn new(status: u16, kind: &'static str, title: &'static str, detail: String) -> Self {
        Self {
            status,
            kind,
            title,
            detail,
            retry_after: None,
            request_id: None,
        }
    }

    /// Sets the request's id.
    #[must_use]
    pub fn with_request_id(mut self, request_id: Option<String>) -> Self {
        self.request_id = request_id;
        self
    }

    /// Sets the `Retry-After`.
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// The resource is busy: 409 Conflict, `Retry-After` the holder's remaining time
    /// or [`FALLBACK_RETRY_AFTER`].
    pub fn busy(detail: String, retry_after: Option<Duration>) -> Self {
        Self::new(409, "urn:redlock:busy", "Resource is locked", detail)
            .with_retry_after(Some(retry_after.unwrap_or(FALLBACK_RETRY_AFTER)))
    }

    /// The lock service cannot decide (no quorum, lost lock): 503, `Retry-After`
    /// `retry_after` or [`FALLBACK_RETRY_AFTER`].
    pub fn unavailable(detail: String, retry_after: Option<Duration>) -> Self {
        Self::new(
            503,
            "urn:redlock:unavailable",
            "Lock service unavailable",
            detail,
        )
        .with_retry_after(Some(retry_after.unwrap_or(FALLBACK_RETRY_AFTER)))
    }

    /// The request carries no usable key (a missing required header, a bad segment): 400.
    pub fn bad_key(detail: String) -> Self {
        Self::new(
            400,
            "urn:redlock:bad-key",
            "Missing or invalid lock key",
            detail,
        )
    }

    /// The lock was lost while the request ran, and the integration stopped the request
    /// (`abort_on_loss`): 503, `Retry-After` [`FALLBACK_RETRY_AFTER`].
    pub fn lost_while_running() -> Self {
        Self::unavailable(
            "The lock was lost while the request ran; the request was stopped. Retry it after the delay in Retry-After.".to_owned(),
            None,
        )
    }

    /// The server is misconfigured (invalid TTL, missing configuration): 500.
    pub fn misconfigured(detail: String) -> Self {
        Self::new(
            500,
            "urn:redlock:misconfigured",
            "Lock misconfigured",
            detail,
        )
    }

    /// The answer to a lock error, by its [`ErrorClass`], with a detail that tells the
    /// client what to do and nothing of the server's insides (log the error itself):
    ///
    /// | class | status | `Retry-After` |
    /// | --- | --- | --- |
    /// | contended | 409 | the holder's remaining validity, else [`FALLBACK_RETRY_AFTER`] |
    /// | unavailable, lost | 503 | [`FALLBACK_RETRY_AFTER`] |
    /// | invalid resource (the request's key: empty, too long) | 400 | none |
    /// | invalid input (the server's own call or configuration) | 500 | none |
    ///
    /// ```
    /// use redlock_core::Error;
    /// let down = Error::NoQuorum { resource: "order:42".into(), needed: 2, total: 3, failures: vec![] };
    /// let problem = redlock_http::Problem::from_error(&down);
    /// assert_eq!(problem.status, 503);
    /// assert!(!problem.detail.contains("order:42"));
    /// ```
    pub fn from_error(error: &Error) -> Self {
        match error.class() {
            ErrorClass::Contended { retry_after } => Self::busy(
                "Another request holds the lock on this resource; retry after the delay in Retry-After.".to_owned(),
                retry_after,
            ),
            ErrorClass::InvalidResource => Self::bad_key(match error {
                Error::Argument(ArgumentError::ResourceTooLong { max, .. }) => format!(
                    "The request's lock key is too long: lock names may be at most {max} bytes."
                ),
                Error::Argument(ArgumentError::DuplicateResource { .. }) => {
                    "The request names the same lock key twice.".to_owned()
                }
                _ => "The request's lock key is empty.".to_owned(),
            }),
            ErrorClass::InvalidInput => Self::misconfigured(MISCONFIGURED_DETAIL.to_owned()),
            ErrorClass::Lost => Self::unavailable(
                "The lock was lost while the request ran; retry after the delay in Retry-After."
                    .to_owned(),
                None,
            ),
            _ => Self::unavailable(
                "The lock service is temporarily unavailable; retry after the delay in Retry-After."
                    .to_owned(),
                None,
            ),
        }
    }

    /// The status to answer with: [`status`](Self::status) when it is an HTTP status
    /// (100 to 999), else `500`. The one mapping both web crates use.
    pub fn http_status(&self) -> u16 {
        if (100..=999).contains(&self.status) {
            self.status
        } else {
            500
        }
    }

    /// The `Retry-After` in whole seconds, rounded up (at least 1), as the header wants.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(|wait| {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            secs.max(1)
        })
    }

    /// The `application/problem+json` body.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(96 + self.detail.len());
        out.push_str("{\"type\":");
        push_json_string(&mut out, self.kind);
        out.push_str(",\"title\":");
        push_json_string(&mut out, self.title);
        let _ = write!(out, ",\"status\":{}", self.status);
        out.push_str(",\"detail\":");
        push_json_string(&mut out, &self.detail);
        if let Some(secs) = self.retry_after_secs() {
            let _ = write!(out, ",\"retry_after\":{secs}");
        }
        if let Some(id) = &self.request_id {
            out.push_str(",\"request_id\":");
            push_json_string(&mut out, id);
        }
        out.push('}');
        out
    }
}

/// Appends `s` as a JSON string literal.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_json() {
        let p = Problem::bad_key("a \"b\"\\\n\u{1}é".into());
        assert_eq!(
            p.to_json(),
            r#"{"type":"urn:redlock:bad-key","title":"Missing or invalid lock key","status":400,"detail":"a \"b\"\\\n\u0001é"}"#
        );
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let p = |ms| Problem::busy(String::new(), Some(Duration::from_millis(ms)));
        assert_eq!(p(0).retry_after_secs(), Some(1));
        assert_eq!(p(1000).retry_after_secs(), Some(1));
        assert_eq!(p(1001).retry_after_secs(), Some(2));
        assert_eq!(Problem::bad_key(String::new()).retry_after_secs(), None);
    }

    #[test]
    fn unavailable_always_says_when_to_retry() {
        let p = Problem::unavailable("x".into(), None);
        assert_eq!(p.status, 503);
        assert_eq!(p.retry_after, Some(FALLBACK_RETRY_AFTER));
    }

    #[test]
    fn a_busy_resource_whose_holder_no_node_reported_gets_the_fallback() {
        let p = Problem::busy(String::new(), None);
        assert_eq!(p.retry_after, Some(FALLBACK_RETRY_AFTER));
    }

    #[test]
    fn bodies_hold_no_internals_but_the_request_id() {
        let errors = [
            Error::Taken {
                resource: "pay:order-42".into(),
                nodes: vec!["10.1.2.3:6379".into()],
                total: 3,
                attempts: 1,
                retry_after: None,
            },
            Error::NoQuorum {
                resource: "pay:order-42".into(),
                needed: 2,
                total: 3,
                failures: vec![],
            },
            Error::Config(redlock_core::ConfigError::ZeroTimeout),
        ];
        for error in &errors {
            let json = Problem::from_error(error)
                .with_request_id(Some("req-1".into()))
                .to_json();
            assert!(!json.contains("pay:"), "{json}");
            assert!(!json.contains("10.1.2.3"), "{json}");
            assert!(json.contains(r#""request_id":"req-1""#), "{json}");
        }
    }

    #[test]
    fn only_well_formed_request_ids_are_echoed() {
        let one = |value: &'static str| {
            request_id(move |name| (name == "x-correlation-id").then_some(value))
        };
        assert_eq!(one("abc-123").as_deref(), Some("abc-123"));
        assert_eq!(one(""), None);
        assert_eq!(one("has space"), None);
        assert_eq!(one("\"quoted\""), None);
        let long: &'static str = Box::leak("x".repeat(129).into_boxed_str());
        assert_eq!(one(long), None);
    }
}

// The README's examples, compiled (and run unless `no_run`) as doctests so that they
// stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
