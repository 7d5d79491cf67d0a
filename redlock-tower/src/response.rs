//! Refusals: the responses a layer answers with instead of calling the service.
//!
//! A [`Refusal`] (one vocabulary with `redlock-actix`: [`RefusalKind`] has the table of
//! kinds and statuses) is rendered by default by [`problem_response`]; a layer's
//! `on_refusal` hook replaces it.
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
//! ```

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use redlock_http::{Problem, problem};

pub use redlock_http::{Refusal, RefusalKind};

/// What a refusal hook returns: a complete response with its body in one piece.
pub type RefusalResponse = Response<Bytes>;

/// A layer's refusal hook (`on_refusal`).
pub(crate) type OnRefusal = Arc<dyn Fn(&Refusal) -> RefusalResponse + Send + Sync>;

/// `problem` as an HTTP response: its status ([`Problem::http_status`]),
/// `Content-Type: application/problem+json`, `Retry-After` in whole seconds (rounded
/// up) when it has one, and the JSON body.
pub fn problem_response(problem: &Problem) -> RefusalResponse {
    let mut response = Response::new(Bytes::from(problem.to_json()));
    *response.status_mut() =
        StatusCode::from_u16(problem.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
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
