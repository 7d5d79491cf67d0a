//! How a lock error is told to an HTTP client: status, `Retry-After`, and an
//! [RFC 9457](https://www.rfc-editor.org/rfc/rfc9457) `application/problem+json` body.
//!
//! The one place where lock errors get HTTP statuses: core classifies an error
//! ([`Error::class`](redlock_core::Error::class)) without HTTP vocabulary, and this
//! crate decides the status, the `Retry-After` and the body. Framework-neutral (no HTTP
//! crate): the web integrations (`redlock-tower`, `redlock-actix`) turn a [`Problem`]
//! into their own response type, so both answer the same way.
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

use std::fmt::Write as _;
use std::time::Duration;

use redlock_core::{Error, ErrorClass};

/// The `Content-Type` of [`Problem::to_json`].
pub const CONTENT_TYPE: &str = "application/problem+json";

/// The `Retry-After` given with a 503 when no node says how long to wait.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

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
        }
    }

    /// Sets the `Retry-After`.
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// The resource is busy: 409 Conflict.
    pub fn busy(detail: String, retry_after: Option<Duration>) -> Self {
        Self::new(409, "urn:redlock:busy", "Resource is locked", detail)
            .with_retry_after(retry_after)
    }

    /// The lock service cannot decide (no quorum, lost lock): 503.
    pub fn unavailable(detail: String, retry_after: Option<Duration>) -> Self {
        Self::new(
            503,
            "urn:redlock:unavailable",
            "Lock service unavailable",
            detail,
        )
        .with_retry_after(Some(retry_after.unwrap_or(UNAVAILABLE_RETRY_AFTER)))
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

    /// The server is misconfigured (invalid TTL, missing configuration): 500.
    pub fn misconfigured(detail: String) -> Self {
        Self::new(
            500,
            "urn:redlock:misconfigured",
            "Lock misconfigured",
            detail,
        )
    }

    /// The answer to a lock error, by its [`ErrorClass`]: contended → 409 with the
    /// holder's remaining time; unavailable and lost → 503; invalid input (the server's
    /// own call or configuration) → 500.
    pub fn from_error(error: &Error) -> Self {
        match error.class() {
            ErrorClass::Contended { retry_after } => Self::busy(error.to_string(), retry_after),
            ErrorClass::InvalidInput => Self::misconfigured(error.to_string()),
            _ => Self::unavailable(error.to_string(), None),
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
        assert_eq!(p.retry_after, Some(UNAVAILABLE_RETRY_AFTER));
    }
}
