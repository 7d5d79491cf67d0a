//! Refusals: the responses a layer answers with instead of calling the service.
//!
//! Every refusal is a [`Refusal`] (from [`redlock_http`], so that `redlock-actix`
//! answers the same way: one [`RefusalKind`] vocabulary for the lock, the concurrency
//! limit and idempotency) and is rendered, by default, as an
//! `application/problem+json` body with the problem's status and, where the client may
//! retry, a `Retry-After` header in seconds. The table of kinds and statuses is
//! [`RefusalKind`]'s. [`LockLayer::on_refusal`](crate::LockLayer::on_refusal) replaces
//! the rendering.
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
use redlock_http::{Problem, problem};

/// What a refusal hook returns: a complete response with its body in one piece.
pub type RefusalResponse = Response<Bytes>;

/// The hook set with [`LockLayer::on_refusal`](crate::LockLayer::on_refusal).
pub(crate) type OnRefusal = Arc<dyn Fn(&Refusal) -> RefusalResponse + Send + Sync>;

pub use redlock_http::{Refusal, RefusalKind};

/// `problem` as an HTTP response: its status, `Content-Type: application/problem+json`,
/// `Retry-After` in whole seconds (rounded up) when it has one, and the JSON body.
pub fn problem_response(problem: &Problem) -> RefusalResponse {
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

/// The status of `problem` ([`Problem::http_status`]).
pub(crate) fn status_of(problem: &Problem) -> StatusCode {
    StatusCode::from_u16(problem.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
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
