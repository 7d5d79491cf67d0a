//! The problem bodies both web crates answer with: [`Problem`] (status, `Retry-After`,
//! an RFC 9457 `application/problem+json` body), its content type, the request id it
//! echoes, and the detail of every `500`.

use std::fmt::Write as _;
use std::time::Duration;

use redlock_core::{ArgumentError, Error, ErrorClass};

/// The `Content-Type` of [`Problem::to_json`].
pub const CONTENT_TYPE: &str = "application/problem+json";

/// The `Retry-After` given when no node says how long to wait: a busy resource whose
/// holder's remaining time no node reported, and an unavailable lock service (503).
pub const FALLBACK_RETRY_AFTER: Duration = Duration::from_secs(1);

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
/// let id = redlock_http::problem::request_id(|name| (name == "x-request-id").then_some("req-7f3a"));
/// assert_eq!(id.as_deref(), Some("req-7f3a"));
/// assert_eq!(redlock_http::problem::request_id(|_| Some("<script>\n")), None);
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
