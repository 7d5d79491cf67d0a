//! Rejections: the responses the layer answers with instead of calling the service.
//!
//! Every rejection is described by a [`Problem`] (from [`redlock_http`], so
//! that `redlock-actix` answers the same way) and rendered, by default, as an
//! `application/problem+json` body with the problem's status and, where the client may
//! retry, a `Retry-After` header in seconds:
//!
//! | situation | [`RejectionKind`] | status |
//! | --- | --- | --- |
//! | the extractor refused the request (missing required key) | `Key` | 400 (the extractor's [`Problem`]) |
//! | another request holds the key | `Busy` | 409, or [`busy_status`](crate::LockLayer::busy_status); `Retry-After` = the holder's remaining TTL |
//! | no quorum of Redis nodes (fail-closed) | `Unavailable` | 503, `Retry-After` |
//! | the lock was lost while the request ran, with [`abort_on_loss`](crate::LockLayer::abort_on_loss) | `Lost` | 503, `Retry-After` |
//! | invalid lock configuration (e.g. a TTL the client refuses) | `Misconfigured` | 500 |
//!
//! [`LockLayer::on_rejection`](crate::LockLayer::on_rejection) replaces the rendering.
//!
//! ```
//! use std::time::Duration;
//! use redlock_http::Problem;
//! use redlock_tower::response::problem_response;
//!
//! let busy = Problem::busy("order:42 is being paid".into(), Some(Duration::from_millis(2500)));
//! let response = problem_response(&busy);
//! assert_eq!(response.status(), 409);
//! assert_eq!(response.headers()["retry-after"], "3");
//! assert_eq!(response.headers()["content-type"], "application/problem+json");
//! assert!(response.body().starts_with(br#"{"type":"urn:redlock:busy""#));
//! ```

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use redlock_core::Error;
use redlock_http::{self as problem, Problem};

/// What a rejection hook returns: a complete response with its body in one piece.
pub type RejectionResponse = Response<Bytes>;

/// The hook set with [`LockLayer::on_rejection`](crate::LockLayer::on_rejection).
pub(crate) type OnRejection = Arc<dyn Fn(&Rejection<'_>) -> RejectionResponse + Send + Sync>;

pub use redlock_http::RejectionKind;

/// A rejection, handed to the [`on_rejection`](crate::LockLayer::on_rejection) hook.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejection<'a> {
    /// Why.
    pub kind: RejectionKind,
    /// The lock's resource name (the layer's resource prefix and the extracted key),
    /// when a key was extracted.
    pub key: Option<&'a str>,
    /// The standard description: status (already the layer's
    /// [`busy_status`](crate::LockLayer::busy_status) for [`RejectionKind::Busy`]),
    /// title, detail, `Retry-After`.
    pub problem: Problem,
    /// The lock error behind it, for `Busy`, `Unavailable` and `Misconfigured`.
    pub error: Option<&'a Error>,
}

impl Rejection<'_> {
    /// The HTTP status of [`problem`](Self::problem).
    pub fn status(&self) -> StatusCode {
        status_of(&self.problem)
    }

    /// The default rendering: [`problem_response`].
    pub fn to_response(&self) -> RejectionResponse {
        problem_response(&self.problem)
    }
}

/// `problem` as an HTTP response: its status, `Content-Type: application/problem+json`,
/// `Retry-After` in whole seconds (rounded up) when it has one, and the JSON body.
pub fn problem_response(problem: &Problem) -> RejectionResponse {
    let mut response = Response::new(Bytes::from(problem.to_json()));
    *response.status_mut() = status_of(problem);
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(problem::CONTENT_TYPE),
    );
    if let Some(secs) = problem.retry_after_secs() {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

fn status_of(problem: &Problem) -> StatusCode {
    StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn renders_status_headers_and_body() {
        let r = problem_response(&Problem::unavailable("down".into(), None));
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        assert!(String::from_utf8_lossy(r.body()).contains(r#""status":503"#));

        let r = problem_response(&Problem::bad_key("no key".into()));
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(r.headers().get(RETRY_AFTER).is_none());

        let mut odd = Problem::busy(String::new(), Some(Duration::from_secs(4)));
        odd.status = 1000; // not an HTTP status
        assert_eq!(problem_response(&odd).status(), 500);
    }
}
